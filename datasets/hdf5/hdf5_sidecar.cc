#include "datasets/hdf5/hdf5_sidecar.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "base/cache_dir.h"
#include "base/strings.h"
#include "format/format.h"

namespace conveyor::hdf5 {
namespace {

constexpr std::string_view kMagic = "CVYH5IX1";
constexpr uint64_t kMaxCount = 1ull << 28;  // any count read back: a bound before allocating

class Writer {
 public:
  void U64(uint64_t v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void F64(double v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  void Str(const std::string& s) {
    U64(s.size());
    out_ += s;
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  bool U64(uint64_t* v) {
    if (in_.size() - pos_ < 8) return false;
    std::memcpy(v, in_.data() + pos_, 8);
    pos_ += 8;
    return true;
  }
  bool F64(double* v) {
    if (in_.size() - pos_ < 8) return false;
    std::memcpy(v, in_.data() + pos_, 8);
    pos_ += 8;
    return true;
  }
  bool Count(uint64_t* v) { return U64(v) && *v <= kMaxCount; }
  bool Str(std::string* s) {
    uint64_t n = 0;
    if (!U64(&n) || n > in_.size() - pos_) return false;
    s->assign(in_, pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

void PutArray(Writer& w, const Array& a) {
  w.Str(a.path);
  w.U64(static_cast<uint64_t>(a.dtype.cls));
  w.U64(a.dtype.size);
  w.U64(a.dtype.big_endian);
  w.Str(a.dtype.text);
  w.U64(a.dims.size());
  for (uint64_t d : a.dims) w.U64(d);
  w.U64(static_cast<uint64_t>(a.layout));
  w.U64(a.offset);
  w.Str(a.compact);
  w.U64(a.chunk_dims.size());
  for (uint64_t d : a.chunk_dims) w.U64(d);
  w.U64(a.chunks.size());
  for (const Chunk& c : a.chunks) {
    w.U64(c.offset);
    w.U64(c.size);
    w.U64(c.filter_mask);
  }
  w.U64(a.filters.size());
  for (const Filter& f : a.filters) {
    w.U64(static_cast<uint64_t>(static_cast<int64_t>(f.id)));
    w.Str(f.name);
    w.U64(f.cd.size());
    for (unsigned v : f.cd) w.U64(v);
  }
  w.U64(a.has_storage);
}

bool GetArray(Reader& r, Array* a) {
  uint64_t cls = 0, size = 0, be = 0, n = 0, layout = 0, has = 0;
  if (!r.Str(&a->path) || !r.U64(&cls) || cls > 4 || !r.U64(&size) || !r.U64(&be) ||
      !r.Str(&a->dtype.text) || !r.Count(&n)) {
    return false;
  }
  a->dtype.cls = static_cast<TypeClass>(cls);
  a->dtype.size = size;
  a->dtype.big_endian = be != 0;
  a->dims.resize(n);
  for (uint64_t& d : a->dims) {
    if (!r.U64(&d)) return false;
  }
  if (!r.U64(&layout) || layout > 2 || !r.U64(&a->offset) || !r.Str(&a->compact) || !r.Count(&n)) {
    return false;
  }
  a->layout = static_cast<Array::Layout>(layout);
  a->chunk_dims.resize(n);
  for (uint64_t& d : a->chunk_dims) {
    if (!r.U64(&d) || d == 0) return false;
  }
  if (!r.Count(&n)) return false;
  a->chunks.resize(n);
  for (Chunk& c : a->chunks) {
    uint64_t mask = 0;
    if (!r.U64(&c.offset) || !r.U64(&c.size) || !r.U64(&mask)) return false;
    c.filter_mask = static_cast<uint32_t>(mask);
  }
  if (!r.Count(&n)) return false;
  a->filters.resize(n);
  for (Filter& f : a->filters) {
    uint64_t id = 0, m = 0;
    if (!r.U64(&id) || !r.Str(&f.name) || !r.Count(&m)) return false;
    f.id = static_cast<int>(static_cast<int64_t>(id));
    f.cd.resize(m);
    for (unsigned& v : f.cd) {
      uint64_t x = 0;
      if (!r.U64(&x)) return false;
      v = static_cast<unsigned>(x);
    }
  }
  if (!r.U64(&has)) return false;
  a->has_storage = has != 0;
  // The chunk table must cover the grid ReadRows walks.
  if (a->layout == Array::Layout::kChunked) {
    if (a->chunk_dims.size() != a->dims.size()) return false;
    uint64_t total = 1;
    for (size_t i = 0; i < a->dims.size(); ++i) {
      total *= (a->dims[i] + a->chunk_dims[i] - 1) / a->chunk_dims[i];
      if (total > kMaxCount) return false;
    }
    if (total != a->chunks.size()) return false;
  }
  return true;
}

}  // namespace

std::string EncodeEpisode(const IndexedEpisode& e) {
  Writer w;
  w.U64(e.arrays.size());
  for (const Array& a : e.arrays) PutArray(w, a);
  w.U64(e.sizes.size());
  for (const auto& s : e.sizes) {
    w.U64(s.size());
    for (uint32_t v : s) w.U64(v);
  }
  w.Str(e.index);
  return std::move(w.out());
}

bool DecodeEpisode(const std::string& bytes, IndexedEpisode* out) {
  Reader r(bytes);
  uint64_t n = 0;
  if (!r.Count(&n)) return false;
  out->arrays.resize(n);
  for (Array& a : out->arrays) {
    if (!GetArray(r, &a)) return false;
  }
  if (!r.Count(&n)) return false;
  out->sizes.resize(n);
  for (auto& s : out->sizes) {
    uint64_t m = 0;
    if (!r.Count(&m)) return false;
    s.resize(m);
    for (uint32_t& v : s) {
      uint64_t x = 0;
      if (!r.U64(&x) || x > UINT32_MAX) return false;
      v = static_cast<uint32_t>(x);
    }
  }
  return r.Str(&out->index) && r.done();
}

void Moments::Add(const float* row, size_t dim) {
  if (count == 0) {
    mean.assign(dim, 0);
    m2.assign(dim, 0);
    min.assign(dim, std::numeric_limits<double>::infinity());
    max.assign(dim, -std::numeric_limits<double>::infinity());
  }
  ++count;
  for (size_t d = 0; d < dim && d < mean.size(); ++d) {
    const double x = row[d];
    const double delta = x - mean[d];
    mean[d] += delta / static_cast<double>(count);
    m2[d] += delta * (x - mean[d]);
    min[d] = std::min(min[d], x);
    max[d] = std::max(max[d], x);
  }
}

void Moments::Merge(const Moments& o) {
  if (o.count == 0) return;
  if (count == 0) {
    *this = o;
    return;
  }
  const double n = static_cast<double>(count + o.count);
  const double a = static_cast<double>(count), b = static_cast<double>(o.count);
  for (size_t d = 0; d < mean.size() && d < o.mean.size(); ++d) {
    const double delta = o.mean[d] - mean[d];
    mean[d] += delta * b / n;
    m2[d] += o.m2[d] + delta * delta * a * b / n;
    min[d] = std::min(min[d], o.min[d]);
    max[d] = std::max(max[d], o.max[d]);
  }
  count += o.count;
}

std::string EncodeMoments(const std::vector<Moments>& m) {
  Writer w;
  w.U64(m.size());
  for (const Moments& x : m) {
    w.U64(x.count);
    w.U64(x.mean.size());
    for (const auto* v : {&x.mean, &x.m2, &x.min, &x.max}) {
      for (double d : *v) w.F64(d);
    }
  }
  return std::move(w.out());
}

bool DecodeMoments(const std::string& bytes, std::vector<Moments>* out) {
  Reader r(bytes);
  uint64_t n = 0;
  if (!r.Count(&n)) return false;
  out->assign(n, Moments());
  for (Moments& x : *out) {
    uint64_t dim = 0;
    if (!r.U64(&x.count) || !r.Count(&dim) || (x.count > 0) != (dim > 0)) return false;
    for (auto* v : {&x.mean, &x.m2, &x.min, &x.max}) {
      v->resize(dim);
      for (double& d : *v) {
        if (!r.F64(&d)) return false;
      }
    }
  }
  return r.done();
}

// The entry's file name in dir_ (opened through base/cache_dir.h, never as a path).
std::string Sidecars::PathOf(const std::string& key, const std::string& prefix) const {
  return StrCat(prefix, format::ChecksumHex(format::Checksum(key)), ".idx");
}

namespace {
// The sidecar directory, private to this uid (base/cache_dir.h); null, warned about once, when it
// is refused (another user's, or writable by others): episodes are then indexed from the file.
std::unique_ptr<CacheDir> OpenSidecarDir(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CacheDir>> d = CacheDir::Open({dir, "index cache directory", ""});
  if (d.ok()) return std::move(*d);
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) spdlog::warn("hdf5: {} (continuing without it)", std::string(d.status().message()));
  return nullptr;
}
}  // namespace

std::optional<std::string> Sidecars::Get(const std::string& key, const std::string& prefix) const {
  if (dir_.empty()) return std::nullopt;
  const std::unique_ptr<CacheDir> dir = OpenSidecarDir(dir_);
  std::optional<std::string> read = dir ? dir->ReadEntry(PathOf(key, prefix), 1ull << 32) : std::nullopt;
  if (!read) return std::nullopt;
  const std::string& bytes = *read;
  const size_t head = kMagic.size() + 8;
  if (bytes.size() < head || bytes.compare(0, kMagic.size(), kMagic) != 0) return std::nullopt;
  uint64_t key_size = 0;
  std::memcpy(&key_size, bytes.data() + kMagic.size(), 8);
  if (key_size > bytes.size() - head || bytes.size() - head - key_size < 8 ||
      bytes.compare(head, key_size, key) != 0) {
    return std::nullopt;
  }
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + head + key_size, 8);
  std::string payload = bytes.substr(head + key_size + 8);
  if (format::Checksum(payload) != sum) return std::nullopt;
  return payload;
}

void Sidecars::Put(const std::string& key, const std::string& payload,
                   const std::string& prefix) const {
  if (dir_.empty()) return;
  const std::unique_ptr<CacheDir> dir = OpenSidecarDir(dir_);
  if (!dir) return;
  std::string bytes(kMagic);
  const uint64_t key_size = key.size(), sum = format::Checksum(payload);
  bytes.append(reinterpret_cast<const char*>(&key_size), 8);
  bytes += key;
  bytes.append(reinterpret_cast<const char*>(&sum), 8);
  bytes += payload;
  if (!dir->WriteEntry(PathOf(key, prefix), bytes)) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      spdlog::warn("hdf5: cannot write the index cache entry {}/{}: {} (continuing without it)", dir_,
                   PathOf(key, prefix), std::strerror(errno));
    }
  }
}

}  // namespace conveyor::hdf5
