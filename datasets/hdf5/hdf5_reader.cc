#include "datasets/hdf5/hdf5_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::hdf5 {
namespace {

constexpr int kDeflate = 1;  // H5Z_FILTER_DEFLATE
constexpr int kShuffle = 2;  // H5Z_FILTER_SHUFFLE

std::string FilterName(const Filter& f) {
  const std::string known = f.id == 3 ? "fletcher32" : f.id == 4 ? "szip" : f.id == 5 ? "nbit" :
                            f.id == 6 ? "scaleoffset" : f.id == 32000 ? "lzf" :
                            f.id == 32001 ? "blosc" : f.id == 32004 ? "lz4" :
                            f.id == 32015 ? "zstd" : f.id == 307 ? "bzip2" : "";
  std::string name = f.name.empty() ? known : f.name;
  if (name.empty()) name = "unknown";
  return StrCat(name, " (filter id ", f.id, ")");
}

// zlib inflate of `in` into exactly `out_size` bytes.
absl::Status Inflate(const std::string& in, size_t out_size, std::string* out) {
  out->resize(out_size);
  z_stream z;
  std::memset(&z, 0, sizeof(z));
  if (inflateInit(&z) != Z_OK) return absl::ResourceExhaustedError("inflateInit failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out->data());
  z.avail_out = static_cast<uInt>(out_size);
  const int rc = inflate(&z, Z_FINISH);
  const uint64_t produced = z.total_out;
  const std::string msg = z.msg != nullptr ? z.msg : "";
  inflateEnd(&z);
  if (rc != Z_STREAM_END || produced != out_size) {
    return absl::DataLossError(StrCat("deflate data is corrupt or of the wrong size (zlib ", rc,
                                      msg.empty() ? "" : ": ", msg, "; ", produced, " of ",
                                      out_size, " bytes)"));
  }
  return absl::OkStatus();
}

// HDF5's shuffle filter undone: byte j of element i was stored at j * n + i.
void Unshuffle(size_t elem, const std::string& in, std::string* out) {
  out->resize(in.size());
  const size_t n = elem == 0 ? 0 : in.size() / elem;
  for (size_t j = 0; j < elem; ++j) {
    const char* src = in.data() + j * n;
    for (size_t i = 0; i < n; ++i) (*out)[i * elem + j] = src[i];
  }
  const size_t done = n * elem;  // the leftover bytes are stored as they are
  std::memcpy(out->data() + done, in.data() + done, in.size() - done);
}

// One chunk's stored bytes, unfiltered into `out` (the chunk's full size).
absl::Status ReadChunk(const RandomAccessFile& file, const Array& a, const Chunk& c,
                       size_t chunk_bytes, std::string* out) {
  std::string stored(static_cast<size_t>(c.size), '\0');
  RETURN_IF_ERROR(file.Read(c.offset, stored.size(), stored.data()));
  std::string scratch;
  for (size_t i = a.filters.size(); i-- > 0;) {
    if ((c.filter_mask >> i) & 1) continue;
    const Filter& f = a.filters[i];
    if (f.id == kDeflate) {
      RETURN_IF_ERROR(Inflate(stored, chunk_bytes, &scratch));
    } else if (f.id == kShuffle) {
      Unshuffle(f.cd.empty() ? a.dtype.size : f.cd[0], stored, &scratch);
    } else {
      return absl::UnimplementedError(StrCat("filter ", FilterName(f), " is not implemented"));
    }
    stored.swap(scratch);
  }
  if (stored.size() != chunk_bytes) {
    return absl::DataLossError(StrCat("chunk holds ", stored.size(), " bytes after its filters, ",
                                      "expected ", chunk_bytes));
  }
  out->swap(stored);
  return absl::OkStatus();
}

absl::Status ReadChunked(const RandomAccessFile& file, const Array& a, uint64_t first,
                         uint64_t count, char* dst, ChunkCache* cache) {
  const size_t rank = a.dims.size();
  const size_t es = a.dtype.size;
  std::vector<uint64_t> grid(rank), cstride(rank), ostride(rank);
  uint64_t chunk_elems = 1;
  for (size_t i = 0; i < rank; ++i) {
    grid[i] = (a.dims[i] + a.chunk_dims[i] - 1) / a.chunk_dims[i];
    chunk_elems *= a.chunk_dims[i];
  }
  for (size_t i = rank; i-- > 0;) {
    cstride[i] = i + 1 == rank ? 1 : cstride[i + 1] * a.chunk_dims[i + 1];
    ostride[i] = i + 1 == rank ? 1 : ostride[i + 1] * a.dims[i + 1];
  }
  // Chunk-grid coordinates to visit: dim 0 over the rows asked for, the others over all.
  std::vector<uint64_t> lo(rank, 0), hi(grid);
  lo[0] = first / a.chunk_dims[0];
  hi[0] = (first + count - 1) / a.chunk_dims[0] + 1;
  std::vector<uint64_t> c(lo);
  std::string scratch;
  if (a.chunk_dims[0] == 1) cache = nullptr;  // a chunk per row is read once per row anyway
  while (true) {
    uint64_t index = 0;
    for (size_t i = 0; i < rank; ++i) index = index * grid[i] + c[i];
    const Chunk& ch = a.chunks[static_cast<size_t>(index)];
    if (ch.offset == kUndefined) {
      return absl::DataLossError(StrCat("chunk ", index, " was never written (no data stored)"));
    }
    std::shared_ptr<const std::string> cached;
    if (cache != nullptr) cached = cache->Get({&file, ch.offset});
    if (cached == nullptr) {
      absl::Status s = ReadChunk(file, a, ch, static_cast<size_t>(chunk_elems * es), &scratch);
      if (!s.ok()) {
        return absl::Status(s.code(), StrCat("chunk ", index, " (", ch.size, " bytes at offset ",
                                             ch.offset, "): ", s.message()));
      }
      if (cache != nullptr) {
        cached = std::make_shared<const std::string>(std::move(scratch));
        cache->Put({&file, ch.offset}, cached);
      }
    }
    const std::string& chunk = cached != nullptr ? *cached : scratch;
    // The part of the chunk inside the rows asked for and the dataset: element ranges per dim.
    std::vector<uint64_t> b(rank), e(rank);
    for (size_t i = 0; i < rank; ++i) {
      b[i] = c[i] * a.chunk_dims[i];
      e[i] = std::min(b[i] + a.chunk_dims[i], a.dims[i]);
    }
    b[0] = std::max(b[0], first);
    e[0] = std::min(e[0], first + count);
    // Copy runs: dimension j and every dimension after it, which the chunk spans whole (so
    // they are laid out alike in the chunk and the output: per-frame chunks are one run).
    size_t j = rank - 1;
    while (j > 0 && a.chunk_dims[j] == a.dims[j]) --j;
    uint64_t inner = 1;
    for (size_t i = j + 1; i < rank; ++i) inner *= a.dims[i];
    const uint64_t run = (e[j] - b[j]) * inner * es;
    std::vector<uint64_t> p(b);
    while (true) {
      uint64_t src = 0, out = 0;
      for (size_t i = 0; i <= j; ++i) {
        src += (p[i] - c[i] * a.chunk_dims[i]) * cstride[i];
        out += (i == 0 ? p[i] - first : p[i]) * ostride[i];
      }
      std::memcpy(dst + out * es, chunk.data() + src * es, static_cast<size_t>(run));
      size_t i = j;
      while (i-- > 0) {
        if (++p[i] < e[i]) break;
        p[i] = b[i];
      }
      if (i == static_cast<size_t>(-1)) break;
    }
    size_t k = rank;
    while (k-- > 0) {
      if (++c[k] < hi[k]) break;
      c[k] = lo[k];
    }
    if (k == static_cast<size_t>(-1)) break;
  }
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<const std::string> ChunkCache::Get(const Key& key) {
  absl::MutexLock lock(&mu_);
  auto it = map_.find(key);
  if (it == map_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

void ChunkCache::Put(const Key& key, std::shared_ptr<const std::string> chunk) {
  if (chunk->size() > max_bytes_) return;
  absl::MutexLock lock(&mu_);
  if (map_.count(key) != 0) return;
  bytes_ += chunk->size();
  lru_.push_front(key);
  map_.emplace(key, std::make_pair(std::move(chunk), lru_.begin()));
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    auto it = map_.find(lru_.back());
    bytes_ -= it->second.first->size();
    map_.erase(it);
    lru_.pop_back();
  }
}

uint64_t ChunkCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

uint64_t ChunkCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

absl::Status CheckFilters(const Array& a, const std::string& file_name) {
  for (const Filter& f : a.filters) {
    if (f.id != kDeflate && f.id != kShuffle) {
      return absl::UnimplementedError(StrCat(
          file_name, ": dataset ", a.path, " is compressed with filter ", FilterName(f),
          ", which Conveyor does not read (gzip/deflate and shuffle only; rewrite it with ",
          "h5repack -f GZIP=4, see docs/hdf5.md)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadRows(const RandomAccessFile& file, const Array& a, uint64_t first, uint64_t count,
                      char* dst, ChunkCache* cache) {
  const std::string where = StrCat(file.name(), ": dataset ", a.path, " rows [", first, ", ",
                                   first + count, ")");
  if (a.dims.empty() || first > a.dims[0] || count > a.dims[0] - first) {
    return absl::OutOfRangeError(StrCat(where, ": the dataset is ", a.ShapeText()));
  }
  if (count == 0) return absl::OkStatus();
  const uint64_t row = a.row_bytes();
  switch (a.layout) {
    case Array::Layout::kContiguous: {
      if (a.offset == kUndefined) {
        return absl::DataLossError(StrCat(where, ": the dataset was never written (no data stored)"));
      }
      absl::Status s = file.Read(a.offset + first * row, static_cast<size_t>(count * row), dst);
      if (!s.ok()) return absl::Status(s.code(), StrCat(where, ": ", s.message()));
      return absl::OkStatus();
    }
    case Array::Layout::kCompact:
      if (a.compact.size() < (first + count) * row) {
        return absl::DataLossError(StrCat(where, ": compact data too short"));
      }
      std::memcpy(dst, a.compact.data() + first * row, static_cast<size_t>(count * row));
      return absl::OkStatus();
    case Array::Layout::kChunked: {
      absl::Status s = ReadChunked(file, a, first, count, dst, cache);
      if (!s.ok()) return absl::Status(s.code(), StrCat(where, ": ", s.message()));
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown layout");
}

}  // namespace conveyor::hdf5
