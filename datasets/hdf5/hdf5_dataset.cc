#include "datasets/internal/format_util.h"
#include "datasets/hdf5/hdf5_dataset.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/hdf5/hdf5_file.h"
#include "datasets/hdf5/hdf5_layout.h"
#include "datasets/hdf5/hdf5_location.h"
#include "datasets/hdf5/hdf5_reader.h"
#include "datasets/hdf5/hdf5_sidecar.h"
#include "datasets/lerobot/lerobot_dataset.h"
#include "format/format.h"
#include "media/media_demux.h"

namespace conveyor::hdf5 {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;

// Lowdim streams are read whole per episode and kept, converted, up to this many bytes in all.
constexpr uint64_t kMaxLowdimBytes = 256ull << 20;

using datasets_internal::Once;

struct EpisodeRef {
  uint32_t file = 0;
  std::string group;  // "" : the file's root; else "/data/demo_3"
  uint64_t length = 0;
};

// An episode's datasets indexed: their raw storage, the encoded frames' sizes, its index.
struct EpisodeState {
  std::vector<Array> arrays;                 // per manifest stream (TEXT: empty)
  std::vector<std::vector<uint32_t>> sizes;  // encoded IMAGE: bytes of each frame
  std::shared_ptr<const pb::EpisodeIndex> index;
};


std::string PpmHeader(uint64_t w, uint64_t h, bool grey) {
  return StrCat(grey ? "P5" : "P6", "\n", w, " ", h, "\n255\n");
}

// Element `i` of `src` (type `t`) as float32; counts values float32 does not hold exactly.
void ToFloat(const char* src, const DType& t, size_t n, float* dst, int64_t* inexact) {
  if (t.cls == TypeClass::kFloat && t.size == 4 && !t.big_endian) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  unsigned char e[8];
  for (size_t i = 0; i < n; ++i) {
    const char* p = src + i * t.size;
    for (size_t b = 0; b < t.size; ++b) e[b] = static_cast<unsigned char>(p[t.big_endian ? t.size - 1 - b : b]);
    double v = 0;
    if (t.cls == TypeClass::kFloat) {
      if (t.size == 8) { double d; std::memcpy(&d, e, 8); v = d; }
      else if (t.size == 4) { float f; std::memcpy(&f, e, 4); dst[i] = f; continue; }
    } else {
      uint64_t u = 0;
      for (size_t b = 0; b < t.size; ++b) u |= uint64_t{e[b]} << (8 * b);
      if (t.cls == TypeClass::kInt && t.size < 8 && (u >> (8 * t.size - 1)) & 1) {
        u |= ~uint64_t{0} << (8 * t.size);  // sign-extend
      }
      v = t.cls == TypeClass::kInt ? static_cast<double>(static_cast<int64_t>(u))
                                   : static_cast<double>(u);
    }
    dst[i] = static_cast<float>(v);
    if (std::isfinite(v) && static_cast<double>(dst[i]) != v) ++*inexact;
  }
}

class Hdf5Dataset final : public Dataset {
 public:
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri, LocationOptions& options);

  std::string format() const override { return "hdf5 " + layout_.kind; }
  absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> LoadEpisode(size_t episode) const override;
  absl::Status ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                          std::string* out) const override;
  absl::Status ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first, size_t count,
                          std::vector<float>* out) const override;
  absl::Status VerifyShard(uint32_t shard) const override;

 private:
  absl::Status ReadLayout(LocationOptions& options);
  absl::Status Episodes(const std::string& filter);
  absl::Status CheckEpisode(const File& f, EpisodeRef* ep, std::vector<Array>* first);
  absl::Status Init(LocationOptions& options);
  absl::Status MakeManifest();
  absl::Status Statistics();
  absl::Status EpisodeMoments(size_t episode, std::unique_ptr<File>* open, uint32_t* open_file,
                              std::vector<Moments>* out) const;
  std::shared_ptr<const std::vector<float>> ToValues(size_t episode, size_t stream, const Array& a,
                                                     const std::string& raw) const;
  std::shared_ptr<const std::vector<float>> KeepLowdim(
      size_t episode, int stream, std::shared_ptr<const std::vector<float>> values) const;
  absl::StatusOr<std::unique_ptr<File>> OpenH5(uint32_t file) const;
  absl::StatusOr<std::shared_ptr<const EpisodeState>> State(size_t episode) const;
  absl::StatusOr<std::unique_ptr<EpisodeState>> BuildState(size_t episode) const;
  absl::StatusOr<std::unique_ptr<EpisodeState>> IndexEpisode(size_t episode) const;
  absl::Status IndexImage(const EpisodeState& st, const File& f, const EpisodeRef& ep, size_t s,
                          const std::vector<uint32_t>& sizes, pb::StreamIndex* out) const;
  absl::StatusOr<std::string> Text(const File& f, const EpisodeRef& ep, const StreamSpec& s) const;
  std::string Where(size_t episode) const;
  std::string SidecarKey(size_t episode) const;
  std::unique_ptr<EpisodeState> FromSidecar(size_t episode, const std::string& key) const;

  Layout layout_;
  std::vector<std::string> files_;  // relative to the root
  std::vector<std::unique_ptr<RandomAccessFile>> handles_;  // per file, opened once
  std::vector<EpisodeRef> refs_;
  std::vector<const StreamSpec*> specs_;  // per manifest stream
  std::vector<bool> grey_;                // per manifest stream: a PGM image
  std::vector<Array> first_;              // the first episode's datasets, per stream
  mutable std::vector<std::unique_ptr<Once<EpisodeState>>> states_;  // fixed size
  std::unique_ptr<ChunkCache> chunk_cache_;  // multi-frame chunks, inflated once
  std::unique_ptr<Sidecars> sidecars_;       // indexed episodes between opens
  std::vector<std::string> versions_;        // per file: mtime or ETag ("": no sidecar)
  std::string layout_text_;                  // the streams' mapping, for sidecar keys
  mutable absl::Mutex mu_;
  mutable std::map<std::pair<size_t, int>, std::shared_ptr<const std::vector<float>>> lowdim_
      ABSL_GUARDED_BY(mu_);
  mutable std::set<std::string> inexact_warned_ ABSL_GUARDED_BY(mu_);
  // Lowdim streams read whole, oldest first out beyond kMaxLowdimBytes.
  mutable std::deque<std::pair<size_t, int>> lowdim_order_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t lowdim_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

absl::Status Hdf5Dataset::ReadLayout(LocationOptions& options) {
  if (std::optional<std::string> mapping = options.Take("mapping"); mapping.has_value()) {
    absl::StatusOr<std::string> text = absl::NotFoundError("");
    if (!mapping->empty() && mapping->front() != '/') text = ReadWholeFile(*storage_, *mapping, 1 << 20);
    if (!text.ok()) text = ReadLocalFile(*mapping, "the HDF5 mapping file");
    if (!text.ok()) return text.status();
    ASSIGN_OR_RETURN(layout_, ParseMapping(*text, *mapping));
  }
  return absl::OkStatus();
}

std::string Hdf5Dataset::Where(size_t episode) const {
  const EpisodeRef& ep = refs_[episode];
  return StrCat(storage_->Describe(files_[ep.file]), ep.group.empty() ? "" : " group ", ep.group);
}

absl::StatusOr<std::unique_ptr<File>> Hdf5Dataset::OpenH5(uint32_t file) const {
  return File::Open(*handles_[file]);
}

// The episodes of every file (one per file, or one per matching group), their lengths checked.
absl::Status Hdf5Dataset::Episodes(const std::string& filter) {
  for (uint32_t i = 0; i < files_.size(); ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<File> f, OpenH5(i));
    std::vector<std::string> groups;
    if (layout_.episode_group.empty()) {
      groups.push_back("");
    } else {
      ASSIGN_OR_RETURN(std::vector<Child> children, f->List(layout_.episode_group));
      for (const Child& c : children) {
        if (c.is_group && c.name.rfind(layout_.group_prefix, 0) == 0) {
          groups.push_back(PathIn(layout_.episode_group, c.name));
        }
      }
      std::sort(groups.begin(), groups.end(), NaturalLess);
      if (!filter.empty()) {
        const std::string mask = "/mask/" + filter;
        if (!f->Exists(mask)) {
          return absl::NotFoundError(StrCat(f->name(), ": no ", mask, " (the #filter= option)"));
        }
        ASSIGN_OR_RETURN(std::vector<std::string> keep, f->ReadStrings(mask));
        std::set<std::string> k(keep.begin(), keep.end());
        std::erase_if(groups, [&](const std::string& g) {
          return k.count(g.substr(g.rfind('/') + 1)) == 0;
        });
      }
    }
    for (const std::string& g : groups) {
      EpisodeRef ep{i, g, 0};
      RETURN_IF_ERROR(CheckEpisode(*f, &ep, &first_));
      refs_.push_back(std::move(ep));
    }
  }
  if (refs_.empty()) return absl::NotFoundError(StrCat(uri_, ": no episodes"));
  return absl::OkStatus();
}

absl::Status Hdf5Dataset::CheckEpisode(const File& f, EpisodeRef* ep, std::vector<Array>* first) {
  const std::string at = StrCat(f.name(), ep->group.empty() ? "" : StrCat(" (episode ", ep->group, ")"));
  const bool is_first = first->empty();
  std::string length_from;
  for (size_t i = 0; i < layout_.streams.size(); ++i) {
    const StreamSpec& s = layout_.streams[i];
    if (s.kind == pb::TEXT) {
      if (is_first) first->emplace_back();
      continue;
    }
    const std::string path = PathIn(ep->group, s.path);
    absl::StatusOr<Array> a = f.Describe(path, false);
    if (absl::IsNotFound(a.status())) {
      return absl::NotFoundError(StrCat(at, ": no dataset ", path, " (stream '", s.name, "')"));
    }
    if (!a.ok()) return a.status();
    const std::string what = StrCat(at, ": dataset ", path, " (stream '", s.name, "') is ",
                                    a->dtype.text, " ", a->ShapeText());
    const bool u8 = a->dtype.cls == TypeClass::kUInt && a->dtype.size == 1;
    if (s.kind == pb::IMAGE && s.encoded && (!u8 || a->dims.size() != 2)) {
      return absl::InvalidArgumentError(StrCat(what, ", expected uint8 [T, maxlen] (one encoded ",
                                               "image per row)"));
    }
    if (s.kind == pb::IMAGE && !s.encoded &&
        (!u8 || !(a->dims.size() == 3 || (a->dims.size() == 4 && (a->dims[3] == 3 || a->dims[3] == 1))))) {
      return absl::InvalidArgumentError(StrCat(what, ", expected uint8 [T, H, W, 3] (or grey ",
                                               "[T, H, W])"));
    }
    if (s.kind == pb::LOWDIM &&
        (a->dims.empty() || a->dtype.cls == TypeClass::kString || a->dtype.cls == TypeClass::kOther ||
         (a->dtype.cls == TypeClass::kFloat && a->dtype.size != 4 && a->dtype.size != 8))) {
      return absl::InvalidArgumentError(StrCat(what, ", expected numbers [T] or [T, D] (integers, float32 or float64)"));
    }
    if (a->dims.empty() || a->dims[0] == 0) return absl::InvalidArgumentError(StrCat(what, ": no steps"));
    // Bounds before anything is sized from the file's numbers: a frame or row of at most 1 GiB.
    uint64_t row = a->dtype.size;
    for (size_t d = 1; d < a->dims.size(); ++d) {
      row = a->dims[d] == 0 || row <= (1ull << 30) / a->dims[d] ? row * a->dims[d] : (1ull << 31);
    }
    if (row > (1ull << 30) || a->dims[0] > (1ull << 31)) {
      return absl::InvalidArgumentError(StrCat(what, ": too large (over 1 GiB a step, or over 2^31 steps)"));
    }
    if (length_from.empty()) {
      ep->length = a->dims[0];
      length_from = StrCat(path, " (stream '", s.name, "')");
    } else if (a->dims[0] != ep->length) {
      return absl::InvalidArgumentError(StrCat(what, ": its first dimension (T = ", a->dims[0],
                                               ") disagrees with ", length_from, ", T = ",
                                               ep->length));
    }
    if (is_first) {
      first->push_back(*a);
    } else if (!s.encoded && std::vector<uint64_t>(a->dims.begin() + 1, a->dims.end()) !=
                                 std::vector<uint64_t>((*first)[i].dims.begin() + 1, (*first)[i].dims.end())) {
      return absl::InvalidArgumentError(StrCat(what, ", but the first episode's is ",
                                               (*first)[i].ShapeText(),
                                               " (every episode of a stream must have one shape)"));
    }
  }
  if (layout_.kind == "robomimic") {
    ASSIGN_OR_RETURN(std::optional<double> n, f.NumberAttribute(ep->group, "num_samples"));
    if (n.has_value() && *n != static_cast<double>(ep->length)) {
      return absl::InvalidArgumentError(StrCat(at, ": attribute num_samples is ", *n,
                                               ", but ", length_from, " has T = ", ep->length));
    }
  }
  return absl::OkStatus();
}

absl::Status Hdf5Dataset::Init(LocationOptions& options) {
  RETURN_IF_ERROR(ReadLayout(options));
  ASSIGN_OR_RETURN(LocationFiles location, ResolveFiles(std::move(storage_), layout_.files, uri_));
  storage_ = std::move(location.storage);
  files_ = std::move(location.names);
  handles_ = std::move(location.handles);
  versions_ = std::move(location.versions);
  if (layout_.kind.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<File> f, OpenH5(0));
    ASSIGN_OR_RETURN(layout_, DetectLayout(*f));
  }
  ASSIGN_OR_RETURN(std::optional<double> rate, options.TakePositive("rate"));
  if (rate.has_value()) layout_.rate = *rate;
  if (!(layout_.rate > 0)) {
    return absl::InvalidArgumentError(StrCat(uri_, ": no step rate (give rate: in the mapping ",
                                             "or #rate=HZ in the location)"));
  }
  ASSIGN_OR_RETURN(std::optional<double> cache_mb, options.TakePositive("chunk_cache_mb"));
  chunk_cache_ = std::make_unique<ChunkCache>(static_cast<uint64_t>(cache_mb.value_or(256) * (1 << 20)));
  lerobot::DatasetOptions cache_options;
  cache_options.index_cache_dir = options.Take("index_cache").value_or("");
  sidecars_ = std::make_unique<Sidecars>(lerobot::IndexCacheDir(cache_options));
  const std::string filter = options.Take("filter").value_or("");
  if (!filter.empty() && layout_.episode_group.empty()) {
    return absl::InvalidArgumentError(StrCat(uri_, ": #filter= needs episodes that are groups ",
                                             "(robomimic's data/demo_N)"));
  }
  // Streams: kind, then name.
  std::vector<const StreamSpec*> order;
  for (const StreamSpec& s : layout_.streams) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const StreamSpec* a, const StreamSpec* b) {
    const int ka = datasets_internal::StreamKindOrder(a->kind), kb = datasets_internal::StreamKindOrder(b->kind);
    return ka != kb ? ka < kb : a->name < b->name;
  });
  std::vector<StreamSpec> sorted;
  for (const StreamSpec* s : order) sorted.push_back(*s);
  layout_.streams = std::move(sorted);
  for (size_t i = 1; i < layout_.streams.size(); ++i) {
    if (layout_.streams[i].name == layout_.streams[i - 1].name) {
      return absl::InvalidArgumentError(StrCat(uri_, ": two streams named '", layout_.streams[i].name, "'"));
    }
  }
  StrAppend(&layout_text_, layout_.kind, " ", layout_.rate, "\n");
  for (const StreamSpec& s : layout_.streams) {
    StrAppend(&layout_text_, s.name, "|", s.kind, "|", s.path, "|", s.encoded, "|", s.codec, "|",
              s.lengths_path, "|", s.lengths_row, "|", s.text, "|", s.attribute_path, "|",
              s.attribute, "|", s.json_key, "\n");
  }
  RETURN_IF_ERROR(Episodes(filter));
  RETURN_IF_ERROR(MakeManifest());
  return Statistics();
}

// The lowdim streams' statistics over every episode (docs/hdf5.md "Statistics"): each episode's
// moments from its entry in the index cache, else from its lowdim datasets read once here (and
// kept for ReadLowdim), merged pairwise. An episode that cannot be read is left out and warned
// about (conveyor check lists it).
absl::Status Hdf5Dataset::Statistics() {
  bool any = false;
  for (const StreamSpec* s : specs_) any = any || s->kind == pb::LOWDIM;
  if (!any) return absl::OkStatus();
  std::vector<Moments> total(specs_.size());
  std::unique_ptr<File> open;
  uint32_t open_file = std::numeric_limits<uint32_t>::max();
  size_t left_out = 0, cached = 0;
  for (size_t e = 0; e < refs_.size(); ++e) {
    const std::string key = SidecarKey(e).empty() ? "" : StrCat("moments v1\n", SidecarKey(e));
    std::vector<Moments> m;
    bool hit = false;
    if (!key.empty()) {
      std::optional<std::string> bytes = sidecars_->Get(key, "h5s-");
      hit = bytes.has_value() && DecodeMoments(*bytes, &m) && m.size() == specs_.size();
      for (size_t s = 0; hit && s < specs_.size(); ++s) {
        hit = specs_[s]->kind == pb::LOWDIM
                  ? m[s].count == refs_[e].length &&
                        m[s].mean.size() == static_cast<size_t>(manifest_.streams[s].shape[0])
                  : m[s].count == 0;
      }
    }
    if (hit) {
      ++cached;
    } else {
      m.clear();
      if (absl::Status st = EpisodeMoments(e, &open, &open_file, &m); !st.ok()) {
        spdlog::warn("hdf5: episode {} ({}) is left out of the statistics: {}", e, Where(e),
                     std::string(st.message()));
        ++left_out;
        continue;
      }
      if (!key.empty()) sidecars_->Put(key, EncodeMoments(m), "h5s-");
    }
    for (size_t s = 0; s < specs_.size(); ++s) total[s].Merge(m[s]);
  }
  for (size_t s = 0; s < specs_.size(); ++s) {
    const Moments& m = total[s];
    if (specs_[s]->kind != pb::LOWDIM || m.count == 0) continue;
    StreamStats& st = manifest_.stats[specs_[s]->name];
    st.mean = m.mean;
    st.min = m.min;
    st.max = m.max;
    st.count = m.count;
    for (double m2 : m.m2) st.std.push_back(std::sqrt(m2 / static_cast<double>(m.count)));
  }
  spdlog::debug("hdf5: statistics of {} episodes ({} from the index cache, {} left out)",
                refs_.size(), cached, left_out);
  return absl::OkStatus();
}

// One episode's lowdim moments: each lowdim dataset read whole by offset (one read per dataset,
// or per chunk), converted as ReadLowdim serves it, and kept in the lowdim cache so the first
// epoch does not read it again. `open` is the libhdf5 file last opened (episodes of one file
// share it).
absl::Status Hdf5Dataset::EpisodeMoments(size_t episode, std::unique_ptr<File>* open,
                                         uint32_t* open_file, std::vector<Moments>* out) const {
  const EpisodeRef& ep = refs_[episode];
  if (*open == nullptr || *open_file != ep.file) {
    open->reset();
    ASSIGN_OR_RETURN(*open, OpenH5(ep.file));
    *open_file = ep.file;
  }
  const File& f = **open;
  out->assign(specs_.size(), Moments());
  for (size_t s = 0; s < specs_.size(); ++s) {
    if (specs_[s]->kind != pb::LOWDIM) continue;
    ASSIGN_OR_RETURN(Array a, f.Describe(PathIn(ep.group, specs_[s]->path), true));
    RETURN_IF_ERROR(CheckFilters(a, f.name()));
    if (a.dims.empty() || a.dims[0] != ep.length) {
      return absl::DataLossError(StrCat(f.name(), ": dataset ", a.path, " changed since the ",
                                        "dataset was opened (now ", a.ShapeText(), ")"));
    }
    std::string raw(static_cast<size_t>(ep.length * a.row_bytes()), '\0');
    RETURN_IF_ERROR(ReadRows(*handles_[ep.file], a, 0, ep.length, raw.data()));
    std::shared_ptr<const std::vector<float>> v = ToValues(episode, s, a, raw);
    const size_t dim = static_cast<size_t>(manifest_.streams[s].shape[0]);
    for (uint64_t i = 0; i < ep.length; ++i) (*out)[s].Add(v->data() + i * dim, dim);
    KeepLowdim(episode, static_cast<int>(s), std::move(v));
  }
  return absl::OkStatus();
}

// A lowdim dataset's bytes `raw` (all of the episode's steps) as float32; values float32 does not
// hold exactly are warned about once per stream.
std::shared_ptr<const std::vector<float>> Hdf5Dataset::ToValues(size_t episode, size_t stream,
                                                                const Array& a,
                                                                const std::string& raw) const {
  const size_t dim = static_cast<size_t>(manifest_.streams[stream].shape[0]);
  auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(refs_[episode].length) * dim);
  int64_t inexact = 0;
  ToFloat(raw.data(), a.dtype, v->size(), v->data(), &inexact);
  absl::MutexLock lock(&mu_);
  if (inexact > 0 && inexact_warned_.insert(specs_[stream]->name).second) {
    spdlog::warn("hdf5: values of '{}' ({}, {}) are not exactly representable as float32 and "
                 "are rounded ({} in episode {})", specs_[stream]->name, a.path, a.dtype.text,
                 inexact, episode);
  }
  return v;
}

// Keeps an episode's lowdim stream (the values already kept when another thread was first).
std::shared_ptr<const std::vector<float>> Hdf5Dataset::KeepLowdim(
    size_t episode, int stream, std::shared_ptr<const std::vector<float>> values) const {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = lowdim_.emplace(std::make_pair(episode, stream), std::move(values));
  std::shared_ptr<const std::vector<float>> kept = it->second;
  if (inserted) {
    lowdim_order_.push_back(it->first);
    lowdim_bytes_ += kept->size() * sizeof(float);
    while (lowdim_bytes_ > kMaxLowdimBytes && lowdim_order_.size() > 1) {
      auto old = lowdim_.find(lowdim_order_.front());
      lowdim_bytes_ -= old->second->size() * sizeof(float);
      lowdim_.erase(old);
      lowdim_order_.pop_front();
    }
  }
  return kept;
}

absl::Status Hdf5Dataset::MakeManifest() {
  for (size_t i = 0; i < layout_.streams.size(); ++i) {
    const StreamSpec& s = layout_.streams[i];
    const Array& a = first_[i];
    StreamInfo info;
    info.name = s.name;
    info.kind = static_cast<pb::StreamKind>(s.kind);
    info.rate = layout_.rate;
    bool grey = false;
    if (s.kind == pb::IMAGE && !s.encoded) {
      grey = a.dims.size() == 3 || a.dims[3] == 1;
      info.codec = grey ? "pgm" : "ppm";
      info.pix_fmt = grey ? "gray" : "rgb24";
      info.shape = {static_cast<int64_t>(a.dims[1]), static_cast<int64_t>(a.dims[2]), 3};
    } else if (s.kind == pb::IMAGE) {
      info.codec = s.codec;  // pix_fmt and size: the first episode's first frame, below
    } else if (s.kind == pb::LOWDIM) {
      info.codec = "hdf5";
      info.shape = {static_cast<int64_t>(a.elements_per_row())};
      for (uint64_t d = 0; d < a.elements_per_row(); ++d) info.names.push_back(StrCat(s.name, "_", d));
    } else {
      info.codec = "utf-8";
      info.rate = 0;
    }
    manifest_.streams.push_back(std::move(info));
    specs_.push_back(&layout_.streams[i]);
    grey_.push_back(grey);
  }
  std::vector<EpisodeRecord> records;
  for (size_t e = 0; e < refs_.size(); ++e) {
    const EpisodeRef& ep = refs_[e];
    if (ep.length > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(StrCat(Where(e), ": ", ep.length, " steps"));
    }
    EpisodeRecord r;
    r.episode_id = e;
    r.shard = ep.file;
    r.duration_s = static_cast<double>(ep.length) / layout_.rate;
    for (const StreamInfo& s : manifest_.streams) {
      r.lengths.push_back(s.kind == pb::TEXT ? 1u : static_cast<uint32_t>(ep.length));
    }
    manifest_.total_duration_s += r.duration_s;
    records.push_back(std::move(r));
  }
  std::string files_text;
  for (size_t i = 0; i < files_.size(); ++i) {
    manifest_.shards.push_back({files_[i], handles_[i]->size(), 0});
    StrAppend(&files_text, files_[i], "\t", handles_[i]->size(), "\n");
  }
  for (const EpisodeRef& ep : refs_) ++manifest_.shards[ep.file].episodes;
  std::string table = EpisodeTable::Encode(records, manifest_.streams.size());
  manifest_.episode_table_bytes = table.size();
  manifest_.episode_table_xxh3 = format::ChecksumHex(format::Checksum(table));
  ASSIGN_OR_RETURN(episodes_, EpisodeTable::Parse(table, manifest_.streams.size(),
                                                  manifest_.shards.size(), uri_));
  manifest_.num_episodes = episodes_.size();
  states_.resize(refs_.size());
  for (auto& s : states_) s = std::make_unique<Once<EpisodeState>>();
  // Encoded images: codec parameters from the first episode's first frame.
  ASSIGN_OR_RETURN(std::shared_ptr<const EpisodeState> first, State(0));
  for (size_t i = 0; i < manifest_.streams.size(); ++i) {
    StreamInfo& info = manifest_.streams[i];
    if (info.kind != pb::IMAGE || !specs_[i]->encoded) continue;
    const pb::CodecParams& c = first->index->streams(static_cast<int>(i)).codec();
    info.codec = c.codec();
    info.pix_fmt = c.pix_fmt();
    info.shape = {c.height(), c.width(), 3};
  }
  manifest_.fingerprint = format::ChecksumHex(format::Checksum(
      StrCat(StreamsFingerprintText(manifest_.streams), "\nhdf5 ", layout_.kind, "\n", files_text,
             table)));
  std::error_code ec;
  fs::path p(uri_);
  if (uri_.find("://") == std::string::npos) p = fs::absolute(p, ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  manifest_.name = p.stem().string();
  if (manifest_.name.empty()) manifest_.name = "hdf5";
  manifest_.created_by = StrCat("HDF5 ", layout_.kind, " (read in place)");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const EpisodeState>> Hdf5Dataset::State(size_t episode) const {
  return states_[episode]->Get([&]() { return BuildState(episode); });
}

absl::StatusOr<std::string> Hdf5Dataset::Text(const File& f, const EpisodeRef& ep,
                                              const StreamSpec& s) const {
  if (s.attribute.empty()) return s.text;
  const std::string path = PathIn(ep.group, s.attribute_path);
  ASSIGN_OR_RETURN(std::optional<std::string> v, f.StringAttribute(path, s.attribute));
  if (!v.has_value()) {
    return absl::NotFoundError(StrCat(f.name(), ": no string attribute '", s.attribute, "' on ",
                                      path, " (stream '", s.name, "')"));
  }
  if (s.json_key.empty()) return *v;
  const nlohmann::json j = nlohmann::json::parse(*v, nullptr, false);
  if (!j.is_object() || !j.contains(s.json_key) || !j[s.json_key].is_string()) {
    return absl::InvalidArgumentError(StrCat(f.name(), ": attribute '", s.attribute, "' of ", path,
                                             " has no string \"", s.json_key, "\" (stream '",
                                             s.name, "')"));
  }
  return j[s.json_key].get<std::string>();
}

std::string Hdf5Dataset::SidecarKey(size_t episode) const {
  const EpisodeRef& ep = refs_[episode];
  if (versions_[ep.file].empty()) return "";
  return StrCat("hdf5 episode v1\n", storage_->Describe(files_[ep.file]), "\n",
                handles_[ep.file]->size(), "\n", versions_[ep.file], "\n", ep.group, "\n",
                layout_text_);
}

// The episode from its sidecar, when there is one that agrees with the episode table.
std::unique_ptr<EpisodeState> Hdf5Dataset::FromSidecar(size_t episode, const std::string& key) const {
  std::optional<std::string> bytes = sidecars_->Get(key);
  IndexedEpisode e;
  if (!bytes.has_value() || !DecodeEpisode(*bytes, &e)) return nullptr;
  auto index = std::make_shared<pb::EpisodeIndex>();
  const uint64_t t = refs_[episode].length;
  if (!index->ParseFromString(e.index) || index->streams_size() != static_cast<int>(specs_.size()) || e.arrays.size() != specs_.size() ||
      e.sizes.size() != specs_.size()) {
    return nullptr;
  }
  for (size_t s = 0; s < specs_.size(); ++s) {
    const pb::StreamIndex& si = index->streams(static_cast<int>(s));
    const StreamInfo& info = manifest_.streams[s];
    const bool text = specs_[s]->kind == pb::TEXT;
    if (si.name() != info.name || si.num_frames() != (text ? 1 : t) ||
        (!text && (e.arrays[s].dims.empty() || e.arrays[s].dims[0] != t || !e.arrays[s].has_storage)) ||
        (specs_[s]->encoded && e.sizes[s].size() != t)) {
      return nullptr;
    }
    if (specs_[s]->encoded && !info.pix_fmt.empty() &&
        (si.codec().codec() != info.codec || si.codec().pix_fmt() != info.pix_fmt ||
         si.codec().height() != info.shape[0] || si.codec().width() != info.shape[1])) {
      return nullptr;  // indexed again, and the mismatch reported
    }
  }
  index->set_episode_id(episode);  // the same group is another episode under another #filter=
  auto st = std::make_unique<EpisodeState>();
  st->arrays = std::move(e.arrays);
  st->sizes = std::move(e.sizes);
  st->index = std::move(index);
  return st;
}

absl::StatusOr<std::unique_ptr<EpisodeState>> Hdf5Dataset::BuildState(size_t episode) const {
  const std::string key = SidecarKey(episode);
  if (!key.empty()) {
    if (std::unique_ptr<EpisodeState> st = FromSidecar(episode, key); st != nullptr) return st;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<EpisodeState> st, IndexEpisode(episode));
  if (!key.empty()) {
    IndexedEpisode e;
    e.arrays = st->arrays;
    e.sizes = st->sizes;
    e.index = st->index->SerializeAsString();
    sidecars_->Put(key, EncodeEpisode(e));
  }
  return st;
}

// What libhdf5 says of the episode's datasets: their storage, the encoded frames' sizes.
absl::StatusOr<std::unique_ptr<EpisodeState>> Hdf5Dataset::IndexEpisode(size_t episode) const {
  const EpisodeRef& ep = refs_[episode];
  ASSIGN_OR_RETURN(std::unique_ptr<File> f, OpenH5(ep.file));
  auto st = std::make_unique<EpisodeState>();
  st->arrays.resize(specs_.size());
  st->sizes.resize(specs_.size());
  auto index = std::make_shared<pb::EpisodeIndex>();
  index->set_format_version(format::kFormatVersion);
  index->set_episode_id(episode);
  index->set_source(Where(episode));
  const TimeBase tb = FrameTimeBase(layout_.rate);
  for (size_t s = 0; s < specs_.size(); ++s) {
    const StreamSpec& spec = *specs_[s];
    pb::StreamIndex* out = index->add_streams();
    out->set_name(spec.name);
    out->set_kind(static_cast<pb::StreamKind>(spec.kind));
    out->mutable_codec()->set_codec(manifest_.streams[s].codec);
    if (spec.kind == pb::TEXT) {
      ASSIGN_OR_RETURN(std::string text, Text(*f, ep, spec));
      out->set_time_base_num(1);
      out->set_time_base_den(1);
      out->set_text(std::move(text));
      out->set_num_frames(1);
      continue;
    }
    ASSIGN_OR_RETURN(Array a, f->Describe(PathIn(ep.group, spec.path), true));
    RETURN_IF_ERROR(CheckFilters(a, f->name()));
    if (a.dims.empty() || a.dims[0] != ep.length) {
      return absl::DataLossError(StrCat(f->name(), ": dataset ", a.path, " changed since the ",
                                        "dataset was opened (now ", a.ShapeText(), ")"));
    }
    st->arrays[s] = std::move(a);
    if (spec.kind == pb::LOWDIM) {
      out->set_time_base_num(1);
      out->set_time_base_den(1);
      for (uint64_t i = 0; i < ep.length; ++i) {
        out->add_timestamps_s(static_cast<double>(i) / layout_.rate);
      }
      out->mutable_blocks()->set_dim(static_cast<int32_t>(manifest_.streams[s].shape[0]));
      out->set_num_frames(ep.length);
      continue;
    }
    out->set_time_base_num(tb.num);
    out->set_time_base_den(tb.den);
    out->set_pts_origin(0);
    if (spec.encoded) {
      ASSIGN_OR_RETURN(st->sizes[s], EncodedSizes(*f, *handles_[ep.file], ep.group, spec, st->arrays[s]));
    }
    RETURN_IF_ERROR(IndexImage(*st, *f, ep, s, st->sizes[s], out));
  }
  index->set_duration_s(static_cast<double>(ep.length) / layout_.rate);
  st->index = std::move(index);
  return st;
}

absl::Status Hdf5Dataset::IndexImage(const EpisodeState& st, const File& f, const EpisodeRef& ep,
                                     size_t s, const std::vector<uint32_t>& sizes,
                                     pb::StreamIndex* out) const {
  const Array& a = st.arrays[s];
  const StreamSpec& spec = *specs_[s];
  const StreamInfo& info = manifest_.streams[s];
  pb::CodecParams* c = out->mutable_codec();
  uint32_t raw_size = 0;
  if (spec.encoded) {
    std::string first(sizes[0], '\0');
    std::string row(static_cast<size_t>(a.row_bytes()), '\0');
    RETURN_IF_ERROR(ReadRows(*handles_[ep.file], a, 0, 1, row.data()));
    first.assign(row, 0, sizes[0]);
    const std::string at = StrCat(f.name(), ": ", a.path, " frame 0 (stream '", spec.name, "')");
    ASSIGN_OR_RETURN(*c, ProbeImageBytes(first, at));
    if (!info.pix_fmt.empty() && (c->codec() != info.codec || c->pix_fmt() != info.pix_fmt ||
                                  c->height() != info.shape[0] || c->width() != info.shape[1])) {
      return absl::InvalidArgumentError(StrCat(
          at, " is ", c->codec(), " ", c->pix_fmt(), " ", c->width(), "x", c->height(),
          ", the first episode's is ", info.codec, " ", info.pix_fmt, " ", info.shape[1], "x",
          info.shape[0], "; every episode of a stream must match"));
    }
  } else {
    c->set_width(static_cast<int32_t>(a.dims[2]));
    c->set_height(static_cast<int32_t>(a.dims[1]));
    c->set_pix_fmt(info.pix_fmt);
    raw_size = static_cast<uint32_t>(PpmHeader(a.dims[2], a.dims[1], grey_[s]).size() + a.row_bytes());
  }
  pb::PacketTable* t = out->mutable_packets();
  const uint64_t rows_per_chunk = a.layout == Array::Layout::kChunked ? a.chunk_dims[0] : 1;
  uint64_t chunks_per_row = 1;
  for (size_t i = 1; i < a.chunk_dims.size(); ++i) {
    chunks_per_row *= (a.dims[i] + a.chunk_dims[i] - 1) / a.chunk_dims[i];
  }
  for (uint64_t p = 0; p < ep.length; ++p) {
    t->add_pts(static_cast<int64_t>(p));
    t->add_dts(static_cast<int64_t>(p));
    t->add_duration(1);
    // Where the frame's bytes start (for messages; reads go through the dataset's layout).
    uint64_t offset = a.offset;
    if (a.layout == Array::Layout::kContiguous) offset = a.offset + p * a.row_bytes();
    if (a.layout == Array::Layout::kChunked) offset = a.chunks[p / rows_per_chunk * chunks_per_row].offset;
    t->add_offset(offset == kUndefined ? 0 : offset);
    t->add_size(spec.encoded ? sizes[p] : raw_size);
    t->add_flags(format::kPacketKey);
    t->add_xxh3(0);  // HDF5 keeps no checksums of raw data (deflate's adler32 is checked)
  }
  out->set_num_frames(ep.length);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> Hdf5Dataset::LoadEpisode(
    size_t episode) const {
  if (episode >= refs_.size()) {
    return absl::OutOfRangeError(StrCat("episode ", episode, " does not exist (", uri_, " has ",
                                        refs_.size(), " episodes)"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const EpisodeState> st, State(episode));
  return st->index;
}

absl::Status Hdf5Dataset::ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                                     std::string* out) const {
  const size_t e = index.episode_id();
  if (e >= refs_.size() || stream < 0 || static_cast<size_t>(stream) >= specs_.size() ||
      specs_[static_cast<size_t>(stream)]->kind != pb::IMAGE) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not an image stream"));
  }
  const size_t s = static_cast<size_t>(stream);
  if (packet >= refs_[e].length) {
    return absl::OutOfRangeError(StrCat("episode ", e, " stream '", specs_[s]->name, "' has ",
                                        refs_[e].length, " frames; asked for ", packet));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const EpisodeState> st, State(e));
  const Array& a = st->arrays[s];
  const RandomAccessFile& file = *handles_[refs_[e].file];
  absl::Status status;
  if (specs_[s]->encoded) {
    out->resize(static_cast<size_t>(a.row_bytes()));
    status = ReadRows(file, a, packet, 1, out->data(), chunk_cache_.get());
    out->resize(st->sizes[s][packet]);
    if (status.ok() && specs_[s]->codec == "mjpeg" && !specs_[s]->lengths_path.empty() &&
        !(out->size() >= 2 && static_cast<uint8_t>((*out)[out->size() - 2]) == 0xFF &&
          static_cast<uint8_t>(out->back()) == 0xD9)) {
      status = absl::DataLossError(StrCat(
          "dataset ", a.path, " in ", file.name(), ": the row's JPEG does not end at the ",
          out->size(), " bytes that ", specs_[s]->lengths_path, " gives (not this camera's length?)"));
    }
  } else {
    *out = PpmHeader(a.dims[2], a.dims[1], grey_[s]);
    const size_t head = out->size();
    out->resize(head + static_cast<size_t>(a.row_bytes()));
    status = ReadRows(file, a, packet, 1, out->data() + head, chunk_cache_.get());
  }
  if (!status.ok()) {
    return absl::Status(status.code(), StrCat("episode ", e, ", stream '", specs_[s]->name,
                                              "', frame ", packet, ": ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status Hdf5Dataset::ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first,
                                     size_t count, std::vector<float>* out) const {
  const size_t e = index.episode_id();
  if (e >= refs_.size() || stream < 0 || static_cast<size_t>(stream) >= specs_.size() ||
      specs_[static_cast<size_t>(stream)]->kind != pb::LOWDIM) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not a lowdim stream"));
  }
  const size_t s = static_cast<size_t>(stream);
  const uint64_t t = refs_[e].length;
  if (first > t || count > t - first) {
    return absl::OutOfRangeError(StrCat("episode ", e, " stream '", specs_[s]->name, "' has ", t,
                                        " steps; asked for [", first, ", ", first + count, ")"));
  }
  const size_t dim = static_cast<size_t>(manifest_.streams[s].shape[0]);
  std::shared_ptr<const std::vector<float>> values;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = lowdim_.find({e, stream}); it != lowdim_.end()) values = it->second;
  }
  if (values == nullptr) {
    // The whole stream of the episode, read once (lowdim is small) and kept.
    ASSIGN_OR_RETURN(std::shared_ptr<const EpisodeState> st, State(e));
    const Array& a = st->arrays[s];
    std::string raw(static_cast<size_t>(t * a.row_bytes()), '\0');
    RETURN_IF_ERROR(ReadRows(*handles_[refs_[e].file], a, 0, t, raw.data()));
    values = KeepLowdim(e, stream, ToValues(e, s, a, raw));
  }
  out->assign(values->begin() + static_cast<ptrdiff_t>(first * dim),
              values->begin() + static_cast<ptrdiff_t>((first + count) * dim));
  return absl::OkStatus();
}

absl::Status Hdf5Dataset::VerifyShard(uint32_t shard) const {
  if (shard >= files_.size()) {
    return absl::OutOfRangeError(StrCat("file ", shard, " does not exist in ", uri_));
  }
  for (size_t e = 0; e < refs_.size(); ++e) {
    if (refs_[e].file == shard) RETURN_IF_ERROR(VerifyEpisode(e));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> Hdf5Dataset::Open(std::unique_ptr<Storage> storage,
                                                           std::string uri,
                                                           LocationOptions& options) {
  std::unique_ptr<Hdf5Dataset> ds(new Hdf5Dataset());
  ds->uri_ = RedactUri(uri);
  ds->storage_ = std::move(storage);
  RETURN_IF_ERROR(ds->Init(options));
  return std::unique_ptr<Dataset>(std::move(ds));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri, LocationOptions& options) {
  return Hdf5Dataset::Open(std::move(storage), std::move(uri), options);
}

}  // namespace conveyor::hdf5
