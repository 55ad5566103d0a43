// HDF5 files, metadata only, through libhdf5 (docs/hdf5.md): groups, each dataset's type and
// shape, and where its bytes are in the file (a contiguous run, or one entry per chunk with the
// filter pipeline to undo), so that frames and rows are read by byte offset without libhdf5
// (hdf5_reader.h).
//
// libhdf5 reads the metadata through a small virtual file driver over Storage's RandomAccessFile
// (local, HTTP and S3 alike), with 64 KiB blocks kept per open file so libhdf5's many small
// metadata reads become a few range reads. libhdf5 here is built thread-safe: every H5 call holds
// one process-wide lock, so this layer is used only to open a file and index it once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace conveyor::hdf5 {

enum class TypeClass { kInt, kUInt, kFloat, kString, kOther };

struct DType {
  TypeClass cls = TypeClass::kOther;
  size_t size = 0;  // bytes per element
  bool big_endian = false;
  std::string text;  // for messages: "uint8", "float64", "string", "compound"...
};

// One step of a chunk's filter pipeline, in the order the writer applied them.
struct Filter {
  int id = 0;         // H5Z filter id: 1 deflate, 2 shuffle, 3 fletcher32, 32000 lzf, ...
  std::string name;   // as the file or libhdf5 names it
  std::vector<unsigned> cd;  // client data (shuffle: the element size)
};

struct Chunk {
  uint64_t offset = 0;  // byte offset in the file; kUndefined: never written
  uint64_t size = 0;    // stored (filtered) bytes
  uint32_t filter_mask = 0;  // bit i set: filter i was not applied to this chunk
};

inline constexpr uint64_t kUndefined = ~uint64_t{0};

// A dataset's type, shape and raw storage: enough to read any element by byte offset.
struct Array {
  std::string path;  // absolute HDF5 path, "/observations/qpos"
  DType dtype;
  std::vector<uint64_t> dims;
  enum class Layout { kContiguous, kChunked, kCompact } layout = Layout::kContiguous;
  uint64_t offset = kUndefined;  // contiguous: where the data starts
  std::string compact;           // compact: the data itself (held in the object header)
  std::vector<uint64_t> chunk_dims;
  std::vector<Chunk> chunks;  // chunked: row-major over the grid of chunks
  std::vector<Filter> filters;
  bool has_storage = false;   // offset / chunks / compact filled in (Describe with storage)

  uint64_t elements_per_row() const;  // product of dims[1..]
  uint64_t row_bytes() const { return elements_per_row() * dtype.size; }
  std::string ShapeText() const;      // "[T, H, W, 3]" with the numbers
};

// A child of a group.
struct Child {
  std::string name;
  bool is_group = false;
  bool is_dataset = false;
};

// An HDF5 file open for metadata. Not copyable; closing it closes libhdf5's handle. Every method
// may be called from any thread (libhdf5 serialises them); errors name the file and the path.
class File {
 public:
  // Opens `file` read-only (it must outlive this object). A truncated or non-HDF5 file is an
  // error naming it.
  static absl::StatusOr<std::unique_ptr<File>> Open(const RandomAccessFile& file);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& name() const { return name_; }
  // libhdf5's id of the open file (a hid_t), for measurements against H5Dread.
  int64_t id() const { return id_; }

  bool Exists(const std::string& path) const;
  // The children of group `path` in HDF5's name order (byte-wise).
  absl::StatusOr<std::vector<Child>> List(const std::string& path) const;
  // Type and shape; with `storage`, also where its bytes are (offsets, chunks, filters).
  absl::StatusOr<Array> Describe(const std::string& path, bool storage) const;
  // Attribute `attr` of the object at `path`: a string (fixed or variable length) or a number
  // (scalar). nullopt when absent.
  absl::StatusOr<std::optional<std::string>> StringAttribute(const std::string& path,
                                                             const std::string& attr) const;
  absl::StatusOr<std::optional<double>> NumberAttribute(const std::string& path,
                                                        const std::string& attr) const;
  // A whole (small) numeric dataset converted to double by libhdf5 (compress_len).
  absl::StatusOr<std::vector<double>> ReadNumbers(const std::string& path) const;
  // A whole 1-D dataset of strings (robomimic's mask/ lists).
  absl::StatusOr<std::vector<std::string>> ReadStrings(const std::string& path) const;

 private:
  File(std::string name, int64_t id) : name_(std::move(name)), id_(id) {}
  std::string name_;
  int64_t id_;  // hid_t
};

// "a.hdf5 < b.hdf5 < episode_2 < episode_10": digit runs compare as numbers.
bool NaturalLess(const std::string& a, const std::string& b);

}  // namespace conveyor::hdf5
