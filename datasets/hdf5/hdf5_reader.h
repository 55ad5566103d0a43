// Rows of an HDF5 dataset read by byte offset, without libhdf5 (docs/hdf5.md "How reads work"):
// the Array (hdf5_file.h) says where the bytes are; a contiguous dataset is one range read, a
// chunked one a range read per chunk it touches, each chunk's filters undone here (deflate with
// zlib, shuffle). Any other filter is refused with an error naming the file, the dataset and the
// filter. Thread-safe (pure functions of their arguments and RandomAccessFile::Read).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "datasets/hdf5/hdf5_file.h"
#include "storage/storage.h"

namespace conveyor::hdf5 {

// Unfiltered chunks that hold more than one row, kept least recently used first out up to a byte
// bound: h5py's automatic chunking of a robomimic [T, 84, 84, 3] image puts ~50 frames in each
// of ~48 chunks, so without it every frame read would inflate the whole episode's images.
// Thread-safe.
class ChunkCache {
 public:
  explicit ChunkCache(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // Keyed by the file and the chunk's offset in it.
  using Key = std::pair<const RandomAccessFile*, uint64_t>;
  std::shared_ptr<const std::string> Get(const Key& key);
  void Put(const Key& key, std::shared_ptr<const std::string> chunk);
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  const uint64_t max_bytes_;
  mutable absl::Mutex mu_;
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  std::map<Key, std::pair<std::shared_ptr<const std::string>, std::list<Key>::iterator>> map_
      ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

// OK when every chunk's filter pipeline of `a` is one this reader undoes; else UNIMPLEMENTED
// naming `file_name`, the dataset and the filter.
absl::Status CheckFilters(const Array& a, const std::string& file_name);

// Reads rows [first, first + count) along the first dimension of `a` (each row all of the other
// dimensions, row-major, in the file's byte order) into `dst`, which holds count * a.row_bytes()
// bytes. Errors name the file, the dataset, the rows and the chunk.
// Chunks holding more than one row go through `cache` when one is given.
absl::Status ReadRows(const RandomAccessFile& file, const Array& a, uint64_t first, uint64_t count,
                      char* dst, ChunkCache* cache = nullptr);

}  // namespace conveyor::hdf5
