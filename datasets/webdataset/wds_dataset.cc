#include "datasets/webdataset/wds_dataset.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <list>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/internal/format_util.h"
#include "datasets/lerobot/lerobot_dataset.h"
#include "datasets/webdataset/internal/wds_member.h"
#include "datasets/webdataset/tar.h"
#include "datasets/webdataset/wds_index.h"
#include "format/format.h"
#include "format/npy.h"
#include "media/video_decoder.h"

namespace conveyor::webdataset {
using datasets_internal::LocalRoot;
using datasets_internal::NaturalLess;

namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using json = nlohmann::json;

constexpr std::string_view kShardList = "shards.txt";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsCompressedTarName(std::string_view n) {
  for (std::string_view e : {".tar.gz", ".tgz", ".tar.zst", ".tar.bz2", ".tar.xz"}) {
    if (EndsWith(n, e)) return true;
  }
  return false;
}

// Tar files (and compressed tars) under `dir`, at most `depth` folders down, relative to it.
std::vector<std::string> ListLocalTars(const std::string& dir, int depth) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (it.depth() >= depth) it.disable_recursion_pending();
    const std::string n = it->path().filename().string();
    if (!n.empty() && n[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if ((EndsWith(n, ".tar") || IsCompressedTarName(n)) && it->is_regular_file(ec)) {
      out.push_back(fs::relative(it->path(), dir, ec).generic_string());
    }
  }
  std::sort(out.begin(), out.end(), NaturalLess);
  return out;
}

// One member of an episode, as the dataset keeps it after opening.
struct MemberLoc {
  uint32_t column = 0;
  uint64_t offset = 0, size = 0;
  // VIDEO: where its facts (the packet table) lie in the index cache file, or the facts
  // themselves when there is no cache file.
  uint64_t facts_at = 0, facts_size = 0, facts_xxh3 = 0;
  std::string facts_inline;
  uint64_t image_xxh3 = 0;  // IMAGE: the member's XXH3-64
  // NPY: the member's stored shape (its header, from the member index): samples may differ in
  // shape, not in dtype or rank (docs/webdataset.md "Tensors").
  std::vector<int64_t> npy_shape;
};

struct Episode {
  uint32_t set = 0;
  std::string key;
  std::string error;
  std::vector<MemberLoc> members;  // per WebDataset::members_
  uint64_t frames = 1;             // the clip's video frames (1 without a video)
  double duration_s = 0;
  uint64_t bytes = 0;  // its members' bytes
};

// An episode's loaded index and its per-clip values.
struct Loaded {
  std::shared_ptr<const pb::EpisodeIndex> index;
  std::vector<std::vector<float>> rows;  // per manifest stream: LOWDIM's one row
  uint64_t bytes = 0;
};

// The clip's clock: its video's shown frames, or one instant.
struct ClipClock {
  std::vector<int64_t> pts = {0};
  std::vector<double> time_s = {0.0};
  int tb_num = 1, tb_den = 1;
  int64_t origin = 0;
};

// An image member's stream: the one image at every instant of the clock.
void FillImageStream(const std::string& name, const std::string& facts, const MemberLoc& loc,
                     const ClipClock& clock, pb::StreamIndex* out_s) {
  out_s->set_name(name);
  out_s->set_kind(pb::IMAGE);
  pb::CodecParams p;
  p.ParseFromArray(facts.data() + 8, static_cast<int>(facts.size() - 8));
  *out_s->mutable_codec() = p;
  out_s->set_time_base_num(clock.tb_num);
  out_s->set_time_base_den(clock.tb_den);
  out_s->set_pts_origin(clock.origin);
  pb::PacketTable* t = out_s->mutable_packets();
  for (int64_t pts : clock.pts) {
    t->add_pts(pts);
    t->add_dts(pts);
    t->add_duration(0);
    t->add_offset(loc.offset);
    t->add_size(static_cast<uint32_t>(loc.size));
    t->add_flags(format::kPacketKey);
    t->add_xxh3(loc.image_xxh3);
  }
  out_s->set_num_frames(clock.pts.size());
}

class WebDataset final : public Dataset {
 public:
  std::string format() const override { return "webdataset"; }
  absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> LoadEpisode(
      size_t episode) const override;
  absl::Status ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                          std::string* out) const override;
  absl::Status ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first, size_t count,
                          std::vector<float>* out) const override;
  absl::Status VerifyShard(uint32_t shard) const override;
  absl::StatusOr<std::vector<int64_t>> StoredShape(size_t episode, int stream) const override;

  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri, LocationOptions& options);

 private:
  struct Member {  // a member extension every sample has
    std::string ext;
    MemberKind kind;
    std::string facts;  // the first sample's (the reference the others are checked against)
  };
  absl::Status Init(LocationOptions& options);
  absl::Status FindShards(std::optional<std::string> columns);
  absl::Status IndexAll(std::vector<ShardSetIndex>* out);
  absl::Status BuildStreams(const SampleEntry& first);
  std::string CheckSample(const SampleEntry& s, Episode* ep) const;
  std::string CheckJsonFields(const nlohmann::json& b, size_t mi, const std::string& w) const;
  std::string CheckDuration(const SampleEntry& s, const Episode& ep,
                            const nlohmann::json& json_nums) const;
  absl::Status BuildTable(const std::string& options_text);
  absl::StatusOr<std::shared_ptr<const Loaded>> Get(size_t episode) const;
  absl::StatusOr<std::unique_ptr<Loaded>> Load(size_t episode) const;
  absl::StatusOr<VideoFacts> Video(size_t episode, size_t member) const;
  const RandomAccessFile& File(size_t episode, size_t member) const {
    const Episode& e = episodes_list_[episode];
    return *files_[e.set][e.members[member].column];
  }
  std::string Where(size_t episode) const;

  std::vector<std::string> columns_;  // "" for one column at the root
  std::vector<std::string> sets_;     // shard paths within each column
  std::vector<std::vector<std::unique_ptr<RandomAccessFile>>> files_;  // [set][column]
  std::vector<Member> members_;
  std::vector<StreamSource> sources_;  // per manifest stream
  int clock_member_ = -1;              // the video member whose frames time the clip
  std::vector<Episode> episodes_list_;
  std::string duration_field_ = "duration";
  std::optional<double> duration_tolerance_s_;
  std::vector<std::string> cache_paths_;  // per set: its index cache file ("": none)

  mutable absl::Mutex mu_;
  uint64_t cache_capacity_ = 64ull << 20;
  mutable std::list<std::pair<size_t, std::shared_ptr<const Loaded>>> lru_ ABSL_GUARDED_BY(mu_);
  mutable std::unordered_map<size_t, decltype(lru_)::iterator> pos_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t cached_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

std::string WebDataset::Where(size_t episode) const {
  const Episode& e = episodes_list_[episode];
  return StrCat(files_[e.set][0]->name(), ", sample '", e.key, "' (episode ", episode, ")");
}

absl::StatusOr<std::unique_ptr<Dataset>> WebDataset::Open(std::unique_ptr<Storage> storage,
                                                          std::string uri,
                                                          LocationOptions& options) {
  std::unique_ptr<WebDataset> ds(new WebDataset());
  ds->uri_ = RedactUri(uri);
  ds->storage_ = std::move(storage);
  RETURN_IF_ERROR(ds->Init(options));
  return std::unique_ptr<Dataset>(std::move(ds));
}

absl::Status WebDataset::Init(LocationOptions& options) {
  const std::optional<std::string> columns = options.Take("columns");
  if (std::optional<std::string> f = options.Take("duration_field"))
    duration_field_ = *f == "none" ? "" : *f;
  ASSIGN_OR_RETURN(duration_tolerance_s_, options.TakePositive("duration_tolerance_s"));
  ASSIGN_OR_RETURN(std::optional<double> cache_mb, options.TakePositive("cache_mb"));
  if (cache_mb) cache_capacity_ = static_cast<uint64_t>(*cache_mb * (1 << 20));
  RETURN_IF_ERROR(FindShards(columns));
  std::vector<ShardSetIndex> indexes;
  RETURN_IF_ERROR(IndexAll(&indexes));
  // The stream set comes from the first sample that probed cleanly and has a member Conveyor reads.
  const SampleEntry* first = nullptr;
  for (const ShardSetIndex& ix : indexes) {
    for (const SampleEntry& s : ix.samples) {
      if (first == nullptr && s.error.empty() &&
          std::any_of(s.members.begin(), s.members.end(),
                      [](const MemberRef& r) { return KindOf(r.ext) != MemberKind::kUnknown; })) {
        first = &s;
      }
    }
  }
  if (first == nullptr) {
    for (const ShardSetIndex& ix : indexes) {
      if (!ix.samples.empty() && !ix.samples[0].error.empty()) {
        return absl::DataLossError(
            StrCat(uri_, ": no readable sample; the first: ", ix.samples[0].error));
      }
    }
    return absl::InvalidArgumentError(
        StrCat(uri_,
               ": the shards hold no sample with a member Conveyor reads "
               "(video, image, text, json, npy, cls; docs/webdataset.md)"));
  }
  RETURN_IF_ERROR(BuildStreams(*first));
  std::set<std::string> unread;
  for (uint32_t set = 0; set < indexes.size(); ++set) {
    ShardSetIndex& ix = indexes[set];
    for (const std::string& s : ix.skipped)
      spdlog::warn("webdataset: {} is not a regular file and is not read", s);
    for (SampleEntry& s : ix.samples) {
      Episode ep;
      ep.set = set;
      ep.key = s.key;
      ep.error = s.error.empty() ? CheckSample(s, &ep) : s.error;
      if (!ep.error.empty()) {
        spdlog::warn(
            "webdataset: {} (the sample is broken; `conveyor check` lists it and writes a "
            "quarantine)",
            ep.error);
      }
      for (const MemberRef& r : s.members) {
        if (std::none_of(members_.begin(), members_.end(),
                         [&](const Member& m) { return m.ext == r.ext; }))
          unread.insert(r.ext);
      }
      if (!ep.error.empty()) ep.members.clear();
      episodes_list_.push_back(std::move(ep));
    }
  }
  cache_paths_.clear();
  for (const ShardSetIndex& ix : indexes) cache_paths_.push_back(ix.cache_path);
  if (!unread.empty()) {
    std::string list;
    for (const std::string& e : unread) StrAppend(&list, list.empty() ? "" : ", ", ".", e);
    spdlog::warn(
        "webdataset: {}: members {} are not read (not every sample has them, or no reader knows "
        "the extension; docs/webdataset.md)",
        uri_, list);
  }
  if (episodes_list_.empty())
    return absl::InvalidArgumentError(StrCat(uri_, ": the shards hold no samples"));
  RETURN_IF_ERROR(BuildTable(options.text()));
  manifest_.name =
      fs::path(LocalRoot(*storage_).empty() ? std::string("webdataset") : LocalRoot(*storage_))
          .filename()
          .string();
  if (manifest_.name.empty()) manifest_.name = "webdataset";
  manifest_.created_by = "WebDataset shards (read in place)";
  return absl::OkStatus();
}

absl::Status WebDataset::FindShards(std::optional<std::string> columns_option) {
  std::vector<std::string> paths;
  const std::string local = LocalRoot(*storage_);
  if (!local.empty()) {
    paths = ListLocalTars(local, 4);
  } else {
    ASSIGN_OR_RETURN(std::string list, ReadWholeFile(*storage_, kShardList, 64ull << 20));
    std::istringstream lines(list);
    for (std::string line; std::getline(lines, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      while (line.rfind("./", 0) == 0) line.erase(0, 2);
      if (!line.empty() && line[0] != '#') paths.push_back(line);
    }
  }
  for (const std::string& p : paths) {
    if (IsCompressedTarName(p)) {
      return absl::FailedPreconditionError(StrCat(
          storage_->Describe(p),
          " is a compressed tar: a compressed stream has no byte offsets for its members, so "
          "a sample cannot be range-read from it. Decompress the shards once (`gzip -d`, `zstd "
          "-d`; video and image "
          "members are compressed already, so the shards grow little) and point Conveyor at the "
          ".tar files"));
    }
  }
  if (paths.empty()) {
    return absl::NotFoundError(
        StrCat(uri_, ": no *.tar shards",
               local.empty() ? StrCat(" listed in ", kShardList) : " within four folder levels"));
  }
  std::map<std::string, std::set<std::string>> by_column;  // column -> paths inside it
  bool all_nested = true;
  for (const std::string& p : paths) {
    const size_t slash = p.find('/');
    if (slash == std::string::npos)
      all_nested = false;
    else
      by_column[p.substr(0, slash)].insert(p.substr(slash + 1));
  }
  if (columns_option.has_value()) {
    std::stringstream ss(*columns_option);
    for (std::string c; std::getline(ss, c, ',');) {
      if (!c.empty()) columns_.push_back(c);
    }
    for (const std::string& c : columns_) {
      if (!by_column.count(c)) {
        return absl::InvalidArgumentError(
            StrCat(uri_, ": column '", c, "' (location option columns) holds no *.tar"));
      }
    }
  } else if (all_nested && by_column.size() > 1) {
    for (const auto& [c, _] : by_column) columns_.push_back(c);
  }
  if (columns_.empty()) {
    columns_ = {""};
    sets_ = paths;
  } else {
    const std::set<std::string>& ref = by_column[columns_[0]];
    for (const std::string& c : columns_) {
      for (const std::string& p : by_column[c]) {
        if (!ref.count(p)) {
          return absl::InvalidArgumentError(StrCat(
              uri_, ": column '", c, "' has ", c, "/", p, " but column '", columns_[0], "' has no ",
              columns_[0], "/", p, "; every column holds the same shard names"));
        }
      }
      for (const std::string& p : ref) {
        if (!by_column[c].count(p)) {
          return absl::InvalidArgumentError(StrCat(
              uri_, ": column '", columns_[0], "' has ", columns_[0], "/", p, " but column '", c,
              "' has no ", c, "/", p, "; every column holds the same shard names"));
        }
      }
    }
    sets_.assign(ref.begin(), ref.end());
    std::sort(sets_.begin(), sets_.end(), NaturalLess);
  }
  return absl::OkStatus();
}

absl::Status WebDataset::IndexAll(std::vector<ShardSetIndex>* out) {
  const size_t n = sets_.size();
  files_.resize(n);
  out->resize(n);
  const std::string cache_dir = lerobot::IndexCacheDir({});
  std::atomic<size_t> built{0};
  RETURN_IF_ERROR(ParallelFor(
      "wds-index", static_cast<int>(std::min<size_t>(n, 4)), n, [&](size_t i) -> absl::Status {
        std::vector<const RandomAccessFile*> tars;
        for (const std::string& c : columns_) {
          const std::string path = c.empty() ? sets_[i] : StrCat(c, "/", sets_[i]);
          absl::StatusOr<std::unique_ptr<RandomAccessFile>> f = storage_->Open(path);
          if (absl::IsNotFound(f.status())) {
            return absl::NotFoundError(
                StrCat(storage_->Describe(path), " is missing (shard ", i, " of ", n, ")"));
          }
          RETURN_IF_ERROR(f.status());
          files_[i].push_back(*std::move(f));
          tars.push_back(files_[i].back().get());
        }
        ASSIGN_OR_RETURN((*out)[i], IndexShardSet(tars, cache_dir, ProbeMember));
        for (SampleEntry& s : (*out)[i].samples) {
          for (MemberRef& r : s.members) {
            r.facts_size = r.facts.size();
            r.facts_xxh3 = format::Checksum(r.facts);
            // The packet table stays in the index file (read back by position when the sample
            // loads).
            if (KindOf(r.ext) == MemberKind::kVideo && r.facts_at != 0 &&
                r.facts.size() > kVideoFactsHead) {
              r.facts.resize(kVideoFactsHead);
            }
          }
        }
        if (!(*out)[i].from_cache) {
          spdlog::info("webdataset: indexed {} ({} samples); {} of {} shard sets indexed",
                       tars[0]->name(), (*out)[i].samples.size(), ++built, n);
        }
        return absl::OkStatus();
      }));
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c < columns_.size(); ++c) {
      manifest_.shards.push_back(
          {columns_[c].empty() ? sets_[i] : StrCat(columns_[c], "/", sets_[i]),
           files_[i][c]->size(), 0});
    }
    manifest_.shards[i * columns_.size()].episodes = (*out)[i].samples.size();
  }
  return absl::OkStatus();
}

absl::Status WebDataset::BuildStreams(const SampleEntry& first) {
  std::vector<MemberRef> refs = first.members;
  std::sort(refs.begin(), refs.end(),
            [](const MemberRef& a, const MemberRef& b) { return a.ext < b.ext; });
  const std::string where = StrCat("sample '", first.key, "'");
  std::vector<std::pair<StreamInfo, StreamSource>> streams;
  double clip_rate = 0;
  for (const MemberRef& r : refs) {
    const MemberKind kind = KindOf(r.ext);
    if (kind == MemberKind::kVideo && clip_rate == 0) {
      ASSIGN_OR_RETURN(VideoFacts v, DecodeVideoFacts(r.facts, false, where));
      clip_rate = v.rate;
    }
  }
  for (const MemberRef& r : refs) {
    const MemberKind kind = KindOf(r.ext);
    if (kind == MemberKind::kUnknown) continue;
    members_.push_back({r.ext, kind, r.facts});
    RETURN_IF_ERROR(
        AppendMemberStreams(r, kind, members_.size() - 1, clip_rate, where, uri_, &streams));
  }
  std::stable_sort(streams.begin(), streams.end(), [](const auto& a, const auto& b) {
    const int ka = datasets_internal::StreamKindOrder(a.first.kind),
              kb = datasets_internal::StreamKindOrder(b.first.kind);
    return ka != kb ? ka < kb : a.first.name < b.first.name;
  });
  for (size_t i = 1; i < streams.size(); ++i) {
    if (streams[i].first.name == streams[i - 1].first.name) {
      return absl::InvalidArgumentError(
          StrCat(uri_, ": two streams named '", streams[i].first.name, "'"));
    }
  }
  if (streams.empty())
    return absl::InvalidArgumentError(StrCat(uri_, ": ", where, " has no member Conveyor reads"));
  for (auto& [info, src] : streams) {
    manifest_.streams.push_back(std::move(info));
    sources_.push_back(std::move(src));
  }
  // The clock: the first video stream in manifest order.
  for (size_t s = 0; s < manifest_.streams.size(); ++s) {
    if (manifest_.streams[s].kind == pb::VIDEO) {
      clock_member_ = static_cast<int>(sources_[s].member);
      break;
    }
  }
  return absl::OkStatus();
}

// Checks one sample against the stream set; fills its member locations. Returns why it is broken
// ("" when it is not).
std::string WebDataset::CheckSample(const SampleEntry& s, Episode* ep) const {
  const std::string& shard = files_[ep->set][0]->name();
  auto where = [&](const Member& m, const MemberRef* r) {
    return StrCat(r != nullptr ? files_[ep->set][r->column]->name() : shard, ", sample '", s.key,
                  "', member '", s.key, ".", m.ext, "'");
  };
  ep->members.resize(members_.size());
  json json_nums;  // the JSON's numbers, for the duration check
  for (size_t mi = 0; mi < members_.size(); ++mi) {
    const Member& m = members_[mi];
    const MemberRef* r = nullptr;
    for (const MemberRef& x : s.members) {
      if (x.ext == m.ext) r = &x;
    }
    if (r == nullptr) {
      std::string has;
      for (const MemberRef& x : s.members) StrAppend(&has, has.empty() ? "" : ", ", ".", x.ext);
      return StrCat(where(m, nullptr), " is missing (the sample has ",
                    has.empty() ? "no members" : has,
                    "; every sample needs the members of the first one)");
    }
    MemberLoc& loc = ep->members[mi];
    ep->bytes += r->size;
    loc.column = r->column;
    loc.offset = r->offset;
    loc.size = r->size;
    const std::string w = where(m, r);
    switch (m.kind) {
      case MemberKind::kVideo: {
        absl::StatusOr<VideoFacts> ref = DecodeVideoFacts(m.facts, false, w);
        absl::StatusOr<VideoFacts> got = DecodeVideoFacts(r->facts, false, w);
        if (!got.ok()) return std::string(got.status().message());
        // Sizes may differ (video2dataset keeps each video's own): a spec's `size:` or buckets
        // bring them to one shape (docs/webdataset.md "One stream set").
        if (ref->codec != got->codec) {
          return StrCat(w, ": ", got->codec, " ", got->width, "x", got->height,
                        ", the dataset's stream is ", ref->codec,
                        " (its first sample's); every sample must have its codec");
        }
        loc.facts_at = r->facts_at;
        loc.facts_size = r->facts_size;
        loc.facts_xxh3 = r->facts_xxh3;
        if (r->facts_at == 0) loc.facts_inline = r->facts;  // no index file: kept in memory
        if (static_cast<int>(mi) == clock_member_) {
          ep->frames = got->frames;
          ep->duration_s = got->duration_s;
        }
        break;
      }
      case MemberKind::kImage: {
        pb::CodecParams a, b;
        a.ParseFromArray(m.facts.data() + 8, static_cast<int>(m.facts.size() - 8));
        if (r->facts.size() < 8 ||
            !b.ParseFromArray(r->facts.data() + 8, static_cast<int>(r->facts.size() - 8))) {
          return StrCat(w, ": malformed image index");
        }
        if (a.codec() != b.codec()) {  // sizes may differ, as for video
          return StrCat(w, ": ", b.codec(), " ", b.width(), "x", b.height(),
                        ", the dataset's stream is ", a.codec(),
                        " (its first sample's); every sample must have its codec");
        }
        std::memcpy(&loc.image_xxh3, r->facts.data(), 8);
        break;
      }
      case MemberKind::kNpy: {
        // Shapes may differ, the dtype and the rank may not.
        if (std::string e = CheckNpySample(m.facts, r->facts, w, &loc.npy_shape); !e.empty()) return e;
        break;
      }
      case MemberKind::kJson: {
        const json b = json::parse(r->facts, nullptr, false);
        if (b.is_discarded()) return StrCat(w, ": malformed JSON index");
        if (std::string e = CheckJsonFields(b, mi, w); !e.empty()) return e;
        json_nums = b["nums"];
        break;
      }
      default:
        break;
    }
  }
  return CheckDuration(s, *ep, json_nums);
}

// The fields a JSON member of the sample (`b`, its description) must have for the streams of
// member `mi`; "" when it has them.
std::string WebDataset::CheckJsonFields(const json& b, size_t mi, const std::string& w) const {
  for (size_t st = 0; st < sources_.size(); ++st) {
    if (sources_[st].member != mi) continue;
    const std::string& field = sources_[st].field;
    const json& kinds = b["kinds"];
    const std::string want = manifest_.streams[st].kind == pb::TEXT ? "a string"
                             : sources_[st].elements == 1 && manifest_.streams[st].codec == "json"
                                 ? "a number (or an array of 1)"
                                 : StrCat("an array of ", sources_[st].elements, " numbers");
    if (!kinds.contains(field))
      return StrCat(w, ": no field '", field, "' (the first sample's JSON has it as ", want, ")");
    const json& k = kinds[field];
    const bool ok = manifest_.streams[st].kind == pb::TEXT
                        ? k == "s"
                        : (k == "n" && sources_[st].elements == 1) ||
                              (k.is_number() && k.get<int64_t>() == sources_[st].elements);
    if (!ok) return StrCat(w, ": field '", field, "' is not ", want, " as in the first sample");
  }
  return "";
}

// A JSON duration that disagrees with the video: a clip cut or re-encoded after its metadata
// was written, or a member of another sample.
std::string WebDataset::CheckDuration(const SampleEntry& s, const Episode& ep,
                                      const json& json_nums) const {
  if (clock_member_ >= 0 && !duration_field_.empty() && json_nums.is_object() &&
      json_nums.contains(duration_field_)) {
    const double said = json_nums[duration_field_].get<double>();
    const double rate = manifest_.streams[0].rate > 0 ? manifest_.streams[0].rate : 30;
    const double tol = duration_tolerance_s_.value_or(std::max(2.0 / rate, 0.02 * ep.duration_s));
    if (!(std::fabs(said - ep.duration_s) <= tol)) {
      return StrCat(files_[ep.set][0]->name(), ", sample '", s.key, "': its JSON says ",
                    duration_field_, " ", said, " s, its video ('.",
                    members_[static_cast<size_t>(clock_member_)].ext, "') lasts ", ep.duration_s,
                    " s (", ep.frames, " frames), over the tolerance of ", tol,
                    " s (location options duration_field, duration_tolerance_s)");
    }
  }
  return "";
}

absl::Status WebDataset::BuildTable(const std::string& options_text) {
  std::vector<EpisodeRecord> records;
  records.reserve(episodes_list_.size());
  std::string files;
  for (const ShardInfo& s : manifest_.shards) StrAppend(&files, s.path, " ", s.bytes, "\n");
  for (size_t e = 0; e < episodes_list_.size(); ++e) {
    const Episode& ep = episodes_list_[e];
    EpisodeRecord r;
    r.episode_id = e;
    r.shard = static_cast<uint32_t>(ep.set * columns_.size());
    r.duration_s = ep.duration_s;
    if (!ep.members.empty()) r.data_offset = ep.members[0].offset;
    r.data_size = ep.bytes;
    const uint32_t frames =
        ep.error.empty() ? static_cast<uint32_t>(std::min<uint64_t>(ep.frames, UINT32_MAX)) : 1u;
    for (const StreamInfo& s : manifest_.streams)
      r.lengths.push_back(s.kind == pb::TEXT ? 1u : frames);
    manifest_.total_duration_s += r.duration_s;
    records.push_back(std::move(r));
  }
  std::string table = EpisodeTable::Encode(records, manifest_.streams.size());
  manifest_.fingerprint = format::ChecksumHex(
      format::Checksum(StrCat(StreamsFingerprintText(manifest_.streams), "\nwebdataset #",
                              options_text, "\n", files, table)));
  manifest_.episode_table_bytes = table.size();
  manifest_.episode_table_xxh3 = format::ChecksumHex(format::Checksum(table));
  for (const ShardInfo& s : manifest_.shards) manifest_.total_bytes += s.bytes;
  ASSIGN_OR_RETURN(episodes_, EpisodeTable::Parse(std::move(table), manifest_.streams.size(),
                                                  manifest_.shards.size(), uri_));
  manifest_.num_episodes = episodes_.size();
  return absl::OkStatus();
}

absl::StatusOr<VideoFacts> WebDataset::Video(size_t episode, size_t member) const {
  const MemberLoc& m = episodes_list_[episode].members[member];
  const std::string where = StrCat(Where(episode), ", member '.", members_[member].ext, "'");
  std::string bytes = m.facts_inline;
  if (bytes.empty()) {
    const std::string& path = cache_paths_[episodes_list_[episode].set];
    bytes.resize(static_cast<size_t>(m.facts_size));
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    const ssize_t got =
        fd < 0 ? -1 : ::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(m.facts_at));
    if (fd >= 0) ::close(fd);
    if (got != static_cast<ssize_t>(bytes.size()) || format::Checksum(bytes) != m.facts_xxh3) {
      return absl::DataLossError(
          StrCat(where, ": its packet index in ", path,
                 " is gone or changed since the dataset was opened; open it again"));
    }
  }
  return DecodeVideoFacts(bytes, true, where);
}

absl::StatusOr<std::unique_ptr<Loaded>> WebDataset::Load(size_t episode) const {
  const Episode& ep = episodes_list_[episode];
  if (!ep.error.empty()) return absl::DataLossError(StrCat(ep.error, " (episode ", episode, ")"));
  auto out = std::make_unique<Loaded>();
  auto index = std::make_shared<pb::EpisodeIndex>();
  index->set_format_version(format::kFormatVersion);
  index->set_episode_id(episode);
  index->set_source(Where(episode));
  index->set_duration_s(ep.duration_s);
  ClipClock clock;
  std::map<size_t, VideoFacts> videos;
  if (clock_member_ >= 0) {
    ASSIGN_OR_RETURN(VideoFacts v, Video(episode, static_cast<size_t>(clock_member_)));
    ASSIGN_OR_RETURN(FrameTable t, FrameTable::Build(v.index));
    clock.pts = t.pts;
    clock.time_s = t.time_s;
    clock.tb_num = v.index.time_base_num();
    clock.tb_den = v.index.time_base_den();
    clock.origin = v.index.pts_origin();
    videos[static_cast<size_t>(clock_member_)] = std::move(v);
  }
  std::map<size_t, json> jsons;
  out->rows.resize(manifest_.streams.size());
  for (size_t s = 0; s < manifest_.streams.size(); ++s) {
    const StreamInfo& info = manifest_.streams[s];
    const StreamSource& src = sources_[s];
    const MemberLoc& loc = ep.members[src.member];
    const Member& member = members_[src.member];
    const RandomAccessFile& tar = File(episode, src.member);
    const std::string where =
        StrCat(tar.name(), ", sample '", ep.key, "', member '", ep.key, ".", member.ext, "'");
    pb::StreamIndex* out_s = index->add_streams();
    if (info.kind == pb::VIDEO) {
      if (!videos.count(src.member)) {
        ASSIGN_OR_RETURN(videos[src.member], Video(episode, src.member));
      }
      *out_s = videos[src.member].index;
      out_s->set_name(info.name);
    } else if (info.kind == pb::IMAGE) {
      FillImageStream(info.name, member.facts, loc, clock, out_s);
    } else if (info.kind == pb::TEXT) {
      out_s->set_name(info.name);
      out_s->set_kind(pb::TEXT);
      out_s->mutable_codec()->set_codec("utf-8");
      out_s->set_time_base_num(1);
      out_s->set_time_base_den(1);
      out_s->set_num_frames(1);
      if (member.kind == MemberKind::kJson) {
        if (!jsons.count(src.member)) {
          ASSIGN_OR_RETURN(std::string bytes, ReadMember(tar, loc.offset, loc.size, where));
          ASSIGN_OR_RETURN(jsons[src.member], ParseJsonMember(bytes, where));
        }
        const json& v = jsons[src.member][src.field];
        if (!v.is_string())
          return absl::DataLossError(
              StrCat(where, ": field '", src.field, "' is not a string (the shard changed?)"));
        out_s->set_text(v.get<std::string>());
      } else {
        ASSIGN_OR_RETURN(std::string text, ReadMember(tar, loc.offset, loc.size, where));
        out_s->set_text(std::move(text));
      }
      out->bytes += out_s->text().size();
    } else {
      out_s->set_name(info.name);
      out_s->set_kind(pb::LOWDIM);
      out_s->mutable_codec()->set_codec(info.codec);
      out_s->set_time_base_num(1);
      out_s->set_time_base_den(1);
      for (double t : clock.time_s) out_s->add_timestamps_s(t);
      // A `.npy` member in this sample's own shape: its codec says it to the spec's `shape: stored`.
      const StreamSource sample_src =
          member.kind == MemberKind::kNpy ? NpySampleSource(member.facts, loc.npy_shape, src, out_s) : src;
      out_s->mutable_blocks()->set_dim(static_cast<int32_t>(sample_src.elements));
      out_s->set_num_frames(clock.time_s.size());
      std::vector<float>& row = out->rows[s];
      json* parsed = nullptr;
      if (member.kind == MemberKind::kJson) {
        if (!jsons.count(src.member)) {
          ASSIGN_OR_RETURN(std::string bytes, ReadMember(tar, loc.offset, loc.size, where));
          ASSIGN_OR_RETURN(jsons[src.member], ParseJsonMember(bytes, where));
        }
        parsed = &jsons[src.member];
      }
      ASSIGN_OR_RETURN(row, ReadMemberRow(tar, member.kind, loc.offset, loc.size, sample_src,
                                          parsed, where));
      out->bytes += row.size() * sizeof(float);
    }
    if (out_s->num_frames() != episodes_.length(episode, s)) {
      return absl::DataLossError(StrCat(Where(episode), ", stream '", info.name,
                                        "': ", out_s->num_frames(), " frames, the index says ",
                                        episodes_.length(episode, s)));
    }
  }
  out->bytes += static_cast<uint64_t>(index->ByteSizeLong());
  out->index = std::move(index);
  return out;
}

absl::StatusOr<std::shared_ptr<const Loaded>> WebDataset::Get(size_t episode) const {
  if (episode >= episodes_list_.size()) {
    return absl::OutOfRangeError(
        StrCat("episode ", episode, " does not exist (", episodes_list_.size(), " samples)"));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = pos_.find(episode);
    if (it != pos_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Loaded> made, Load(episode));
  std::shared_ptr<const Loaded> loaded(std::move(made));
  absl::MutexLock lock(&mu_);
  if (pos_.count(episode)) return loaded;  // another thread loaded it meanwhile
  lru_.emplace_front(episode, loaded);
  pos_[episode] = lru_.begin();
  cached_bytes_ += loaded->bytes;
  while (cached_bytes_ > cache_capacity_ && lru_.size() > 1) {
    cached_bytes_ -= lru_.back().second->bytes;
    pos_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return loaded;
}

absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> WebDataset::LoadEpisode(
    size_t episode) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const Loaded> l, Get(episode));
  return std::shared_ptr<const pb::EpisodeIndex>(l, l->index.get());
}

absl::Status WebDataset::ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                                    std::string* out) const {
  if (stream < 0 || static_cast<size_t>(stream) >= manifest_.streams.size() ||
      (manifest_.streams[static_cast<size_t>(stream)].kind != pb::VIDEO &&
       manifest_.streams[static_cast<size_t>(stream)].kind != pb::IMAGE)) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not a video or image stream"));
  }
  const size_t episode = index.episode_id();
  if (episode >= episodes_list_.size() || !episodes_list_[episode].error.empty()) {
    return absl::InvalidArgumentError(StrCat("episode ", episode, " is not a readable sample"));
  }
  const pb::PacketTable& t = index.streams(stream).packets();
  if (packet >= static_cast<size_t>(t.offset_size())) {
    return absl::OutOfRangeError(StrCat(Where(episode), ", stream '",
                                        manifest_.streams[stream].name, "': no packet ", packet,
                                        " (", t.offset_size(), " packets)"));
  }
  const int p = static_cast<int>(packet);
  const RandomAccessFile& tar = File(episode, sources_[static_cast<size_t>(stream)].member);
  out->resize(t.size(p));
  RETURN_IF_ERROR(tar.Read(t.offset(p), out->size(), out->data()));
  if (format::Checksum(*out) != t.xxh3(p)) {
    return absl::DataLossError(StrCat("checksum mismatch in ", tar.name(), " at byte ", t.offset(p),
                                      " (", Where(episode), ", stream '",
                                      manifest_.streams[stream].name, "', packet ", packet,
                                      "): the shard changed after it was indexed"));
  }
  return absl::OkStatus();
}

absl::Status WebDataset::ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first,
                                    size_t count, std::vector<float>* out) const {
  if (stream < 0 || static_cast<size_t>(stream) >= manifest_.streams.size() ||
      manifest_.streams[static_cast<size_t>(stream)].kind != pb::LOWDIM) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not a lowdim stream"));
  }
  const size_t episode = index.episode_id();
  ASSIGN_OR_RETURN(std::shared_ptr<const Loaded> l, Get(episode));
  const uint64_t steps = episodes_.length(episode, static_cast<size_t>(stream));
  if (first > steps || count > steps - first) {
    return absl::OutOfRangeError(StrCat(Where(episode), ", stream '",
                                        manifest_.streams[stream].name, "' has ", steps,
                                        " steps; asked for [", first, ", ", first + count, ")"));
  }
  // One value per clip: every step holds it.
  const std::vector<float>& row = l->rows[static_cast<size_t>(stream)];
  out->resize(count * row.size());
  for (size_t i = 0; i < count; ++i)
    std::copy(row.begin(), row.end(), out->begin() + static_cast<std::ptrdiff_t>(i * row.size()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> WebDataset::StoredShape(size_t episode, int stream) const {
  if (episode >= episodes_list_.size() || stream < 0 ||
      static_cast<size_t>(stream) >= manifest_.streams.size() ||
      members_[sources_[static_cast<size_t>(stream)].member].kind != MemberKind::kNpy) {
    return Dataset::StoredShape(episode, stream);  // its error
  }
  const Episode& ep = episodes_list_[episode];
  if (!ep.error.empty()) return absl::DataLossError(StrCat(ep.error, " (episode ", episode, ")"));
  return ep.members[sources_[static_cast<size_t>(stream)].member].npy_shape;
}

absl::Status WebDataset::VerifyShard(uint32_t shard) const {
  if (shard >= manifest_.shards.size())
    return absl::OutOfRangeError(StrCat("shard ", shard, " does not exist in ", uri_));
  const size_t set = shard / columns_.size();
  const RandomAccessFile& tar = *files_[set][shard % columns_.size()];
  ASSIGN_OR_RETURN(TarListing l, ListTar(tar));
  if (!l.error.empty()) return absl::DataLossError(l.error);
  for (size_t e = 0; e < episodes_list_.size(); ++e) {
    if (episodes_list_[e].set != set) continue;
    if (!episodes_list_[e].error.empty()) return absl::DataLossError(episodes_list_[e].error);
    RETURN_IF_ERROR(VerifyEpisode(e));
  }
  return absl::OkStatus();
}

}  // namespace

bool LooksLikeWebDataset(Storage& storage) {
  const std::string local = LocalRoot(storage);
  if (!local.empty()) {
    struct stat st;
    return ::stat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
           !ListLocalTars(local, 4).empty();
  }
  return storage.Open(kShardList).ok();
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri, LocationOptions& options) {
  return WebDataset::Open(std::move(storage), std::move(uri), options);
}

}  // namespace conveyor::webdataset
