#include "datasets/rlds/rlds_index.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>

#include "base/cache_dir.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "format/format.h"

namespace conveyor::rlds {
namespace {

constexpr std::string_view kMagic = "CVYRLDX3";
constexpr size_t kScanChunk = 8u << 20;

std::string NameOf(const std::string& key) { return StrCat(format::ChecksumHex(format::Checksum(key)), ".rlidx"); }

// The index cache directory, private to this uid (base/cache_dir.h); null, warned about once,
// when it is refused (another user's, or writable by others): the records are then scanned.
std::unique_ptr<CacheDir> OpenIndexDir(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CacheDir>> d = CacheDir::Open({dir, "index cache directory", ""});
  if (d.ok()) return std::move(*d);
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) spdlog::warn("rlds: {} (continuing without it)", std::string(d.status().message()));
  return nullptr;
}

void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void PutF64s(std::string* s, const std::vector<double>& v) {
  s->append(reinterpret_cast<const char*>(v.data()), v.size() * 8);
}

// Reads the moments section at bytes [at, end); false when it is malformed.
bool ParseMoments(const std::string& bytes, size_t at, size_t end, std::map<std::string, Moments>* out) {
  auto need = [&](size_t n) { return at <= end && end - at >= n; };
  if (!need(8)) return false;
  const uint64_t n = GetU64(bytes.data() + at);
  at += 8;
  for (uint64_t i = 0; i < n; ++i) {
    if (!need(8)) return false;
    const uint64_t key_size = GetU64(bytes.data() + at);
    at += 8;
    if (!need(key_size) || key_size > 4096) return false;
    const std::string key = bytes.substr(at, key_size);
    at += key_size;
    if (!need(16)) return false;
    Moments m;
    m.count = GetU64(bytes.data() + at);
    const uint64_t dim = GetU64(bytes.data() + at + 8);
    at += 16;
    if (dim > (1u << 20) || !need(dim * 32)) return false;
    for (std::vector<double>* v : {&m.mean, &m.m2, &m.min, &m.max}) {
      v->resize(dim);
      std::memcpy(v->data(), bytes.data() + at, dim * 8);
      at += dim * 8;
    }
    (*out)[key] = std::move(m);
  }
  return at == end;
}

// Entry: magic | u64 key size | key | u64 count | count x (offset, length, steps) | u64 XXH3 of
// everything before it. A torn, foreign or stale entry fails its checks and is rebuilt.
std::optional<ShardIndex> ReadEntry(const CacheDir& dir, const std::string& key) {
  std::optional<std::string> read = dir.ReadEntry(NameOf(key), (1ull << 32) - 1);
  if (!read) return std::nullopt;
  const std::string& bytes = *read;
  const size_t head = kMagic.size() + 8;
  if (bytes.size() < head + 16 || bytes.compare(0, kMagic.size(), kMagic) != 0) return std::nullopt;
  const uint64_t sum = GetU64(bytes.data() + bytes.size() - 8);
  if (format::Checksum(std::string_view(bytes).substr(0, bytes.size() - 8)) != sum) return std::nullopt;
  const uint64_t key_size = GetU64(bytes.data() + kMagic.size());
  if (key_size > bytes.size() || bytes.compare(head, key_size, key) != 0) return std::nullopt;
  const size_t at = head + key_size;
  if (bytes.size() < at + 16) return std::nullopt;
  const uint64_t count = GetU64(bytes.data() + at);
  if (count > (bytes.size() - at - 16) / 32) return std::nullopt;
  ShardIndex index;
  index.from_cache = true;
  index.records.resize(count);
  size_t p = at + 8;
  const size_t end = bytes.size() - 8;
  for (uint64_t i = 0; i < count; ++i) {
    if (end - p < 32) return std::nullopt;
    const char* q = bytes.data() + p;
    const uint64_t error_size = GetU64(q + 24);
    if (error_size > end - p - 32) return std::nullopt;
    index.records[i] = {{GetU64(q), GetU64(q + 8)}, GetU64(q + 16), bytes.substr(p + 32, error_size)};
    p += 32 + error_size;
  }
  if (!ParseMoments(bytes, p, end, &index.moments)) return std::nullopt;
  return index;
}

void WriteEntry(const CacheDir& dir, const std::string& key, const ShardIndex& index) {
  std::string bytes(kMagic);
  PutU64(&bytes, key.size());
  bytes += key;
  PutU64(&bytes, index.records.size());
  for (const RecordEntry& r : index.records) {
    PutU64(&bytes, r.ref.offset);
    PutU64(&bytes, r.ref.length);
    PutU64(&bytes, r.steps);
    PutU64(&bytes, r.error.size());
    bytes += r.error;
  }
  PutU64(&bytes, index.moments.size());
  for (const auto& [key, m] : index.moments) {
    PutU64(&bytes, key.size());
    bytes += key;
    PutU64(&bytes, m.count);
    PutU64(&bytes, m.mean.size());
    for (const std::vector<double>* v : {&m.mean, &m.m2, &m.min, &m.max}) PutF64s(&bytes, *v);
  }
  PutU64(&bytes, format::Checksum(bytes));
  if (!dir.WriteEntry(NameOf(key), bytes)) {
    spdlog::warn("rlds: cannot write the record index cache entry {}/{}: {} (continuing without it)", dir.path(),
                 NameOf(key), std::strerror(errno));
  }
}

}  // namespace

void Moments::Add(const float* row, size_t dim) {
  if (count == 0) {
    mean.assign(dim, 0);
    m2.assign(dim, 0);
    min.assign(dim, std::numeric_limits<double>::infinity());
    max.assign(dim, -std::numeric_limits<double>::infinity());
  }
  ++count;
  for (size_t d = 0; d < dim; ++d) {
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
  for (size_t d = 0; d < mean.size() && d < o.mean.size(); ++d) {
    const double delta = o.mean[d] - mean[d];
    mean[d] += delta * static_cast<double>(o.count) / n;
    m2[d] += o.m2[d] + delta * delta * static_cast<double>(count) * static_cast<double>(o.count) / n;
    min[d] = std::min(min[d], o.min[d]);
    max[d] = std::max(max[d], o.max[d]);
  }
  count += o.count;
}

absl::StatusOr<ShardIndex> IndexShard(const RandomAccessFile& file, const std::string& cache_dir,
                                      const RecordVisitor& visit_record) {
  const std::string key = StrCat("rlds-records-v2\n", file.name(), "\n", file.size(), "\n", file.version());
  const bool cacheable = !cache_dir.empty() && !file.version().empty();
  const std::unique_ptr<CacheDir> dir = cacheable ? OpenIndexDir(cache_dir) : nullptr;
  if (dir) {
    if (std::optional<ShardIndex> hit = ReadEntry(*dir, key)) return *std::move(hit);
  }
  ShardIndex index;
  RETURN_IF_ERROR(ScanRecords(file, kScanChunk, [&](const RecordRef& ref, absl::StatusOr<std::string_view> data) -> absl::Status {
    const std::string where = StrCat(file.name(), ", record ", index.records.size(), " at byte ", ref.offset);
    absl::StatusOr<uint64_t> steps = data.ok() ? visit_record(*data, where, &index.moments) : data.status();
    if (steps.ok()) {
      index.records.push_back({ref, *steps, {}});
    } else {
      // Kept as a broken episode of one step: named by `conveyor check`, left out by its quarantine.
      spdlog::warn("rlds: {} (the episode is broken; `conveyor check` lists it and writes a quarantine)",
                   std::string(steps.status().message()));
      index.records.push_back({ref, 1, std::string(steps.status().message())});
    }
    return absl::OkStatus();
  }));
  if (dir) WriteEntry(*dir, key, index);
  return index;
}

}  // namespace conveyor::rlds
