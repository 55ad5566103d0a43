// Indexed HDF5 episodes kept as sidecar files in the index cache (lerobot::IndexCacheDir, shared
// with LeRobot's packet indexes): what loading an episode learnt from libhdf5 (each dataset's
// type, shape, chunk table and filters, the encoded frames' sizes, the episode index), so the
// next open of the same file skips libhdf5 for it. Over HTTP or S3 that is dozens of small range
// reads per episode (chunk B-tree nodes lie between the data), each under libhdf5's global lock.
//
// An entry is keyed by the file's full name, size and mtime (local) or ETag (remote), the
// episode's group and the dataset's stream layout; it holds the magic, the key, an XXH3-64 of the
// payload and the payload, written to a temporary name and renamed. A torn, foreign or stale
// entry fails its checks and the episode is indexed again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "datasets/hdf5/hdf5_file.h"

namespace conveyor::hdf5 {

struct IndexedEpisode {
  std::vector<Array> arrays;                 // per stream (TEXT: empty)
  std::vector<std::vector<uint32_t>> sizes;  // encoded IMAGE streams: bytes per frame
  std::string index;                         // a serialized format::v1::EpisodeIndex
};

// Per-dimension moments of a lowdim stream's float32 values (as served): Welford's update row by
// row, and Chan et al.'s pairwise update to merge episodes (as datasets/rlds/ does). std is
// sqrt(m2 / count), the population std (numpy's default).
struct Moments {
  uint64_t count = 0;  // rows (steps)
  std::vector<double> mean, m2, min, max;
  void Add(const float* row, size_t dim);
  void Merge(const Moments& other);
};

std::string EncodeEpisode(const IndexedEpisode& e);
// False when `bytes` is not a whole, well-formed encoding.
bool DecodeEpisode(const std::string& bytes, IndexedEpisode* out);
// An episode's moments, per stream (streams that are not lowdim: count 0).
std::string EncodeMoments(const std::vector<Moments>& m);
bool DecodeMoments(const std::string& bytes, std::vector<Moments>* out);

class Sidecars {
 public:
  // `dir` empty: no sidecars (Get finds nothing, Put does nothing).
  explicit Sidecars(std::string dir) : dir_(std::move(dir)) {}
  // `prefix` starts the entry's file name: "h5-" indexed episodes, "h5s-" their lowdim moments.
  std::optional<std::string> Get(const std::string& key, const std::string& prefix = "h5-") const;
  // Best effort: a directory that cannot be written is warned about once and ignored.
  void Put(const std::string& key, const std::string& payload,
           const std::string& prefix = "h5-") const;
  const std::string& dir() const { return dir_; }

 private:
  std::string PathOf(const std::string& key, const std::string& prefix) const;
  std::string dir_;
};

}  // namespace conveyor::hdf5
