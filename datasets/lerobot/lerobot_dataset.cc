#include "datasets/lerobot/lerobot_dataset.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/cache_dir.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/media_demux.h"
#include "format/format.h"
#include "datasets/internal/format_util.h"
#include "datasets/lerobot/internal/data_file.h"
#include "datasets/lerobot/internal/video_index.h"
#include "datasets/lerobot/lerobot_meta.h"
#include "datasets/parquet/parquet_file.h"

namespace conveyor::lerobot {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using datasets_internal::Once;

constexpr std::string_view kInstructionStream = "instruction";
// Episode indexes kept in memory (about 60 bytes per frame and camera): 256 MiB holds ~1.5 M
// camera-frames; beyond it episodes are re-cut when loaded, so memory stays bounded.
constexpr uint64_t kMaxCachedIndexBytes = 256ull << 20;

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) StrAppend(&s, s.empty() ? "" : ", ", "\"", x, "\"");
  return s;
}

// The end of a stream's last frame or step, as the writer computes an episode's duration (0 for a
// stream without times).
double StreamEnd(pb::StreamKind kind, const pb::StreamIndex& s, const std::vector<double>& ts) {
  double end = 0;
  if (kind == pb::VIDEO || kind == pb::IMAGE) {
    const double tb = static_cast<double>(s.time_base_num()) / s.time_base_den();
    const pb::PacketTable& t = s.packets();
    for (int p = 0; p < t.pts_size(); ++p) {
      end = std::max(end, static_cast<double>(t.pts(p) + std::max<int64_t>(t.duration(p), 0)) * tb);
    }
  } else if (kind == pb::LOWDIM && !ts.empty()) {
    const double step = ts.size() > 1 ? ts[ts.size() - 1] - ts[ts.size() - 2] : 0;
    end = ts.back() + step;
  }
  return end;
}

// ---------------------------------------------------------------------------------------------

class LeRobotDataset final : public Dataset {
 public:
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri,
                                                       const DatasetOptions& options);

  std::string format() const override { return StrCat("lerobot ", meta_.codebase_version); }

  absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> LoadEpisode(size_t episode) const override;
  absl::Status ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                          std::string* out) const override;
  absl::Status ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first, size_t count,
                          std::vector<float>* out) const override;
  absl::Status VerifyShard(uint32_t shard) const override;

 private:
  // What each manifest stream is made of.
  struct Source {
    pb::StreamKind kind = pb::STREAM_KIND_UNSPECIFIED;
    const Feature* feature = nullptr;  // null for the instruction
  };

  LeRobotDataset(DatasetOptions options) : options_(std::move(options)), sidecars_(IndexCacheDir(options_)) {}
  absl::Status Init();
  absl::StatusOr<StreamInfo> VideoStreamInfo(const Feature& f);
  absl::StatusOr<StreamInfo> ImageStreamInfo(const Feature& f);
  absl::StatusOr<std::shared_ptr<const DataFile>> Data(uint32_t file, int64_t episode) const;
  absl::StatusOr<std::shared_ptr<const VideoFile>> Video(const std::string& path,
                                                         const std::string& key,
                                                         int64_t episode) const;
  absl::StatusOr<std::unique_ptr<VideoFile>> IndexVideo(const std::string& path,
                                                        const std::string& key,
                                                        int64_t episode) const;
  absl::StatusOr<std::unique_ptr<pb::EpisodeIndex>> BuildEpisode(size_t episode) const;
  // BuildEpisode's parts: the episode's row timestamps, its rows' bookkeeping checked (frame_index,
  // index, timestamp against fps); its instruction (the first frame's task, checked against the
  // episode metadata); a camera's and an image feature's stream index.
  absl::StatusOr<std::vector<double>> RowTimestamps(const Episode& ep, const DataFile& d,
                                                    int64_t first, const std::string& where) const;
  absl::StatusOr<std::string> EpisodeTask(const Episode& ep, const DataFile& d, int64_t first,
                                          const std::string& where) const;
  absl::Status VideoStreamIndex(const Episode& ep, const StreamInfo& info, const Source& src,
                                const std::vector<double>& ts, pb::StreamIndex* out) const;
  absl::Status ImageStreamIndex(const DataFile& d, const StreamInfo& info, int64_t first,
                                int64_t rows, const std::string& where,
                                pb::StreamIndex* out) const;
  absl::Status CutVideo(const VideoFile& video, const Episode& ep, const VideoSegment& seg,
                        const std::string& key, const std::vector<double>& row_ts,
                        pb::StreamIndex* out) const;
  // The episode's rows in its data file: (file, first row).
  absl::StatusOr<std::pair<std::shared_ptr<const DataFile>, int64_t>> Rows(int64_t episode) const;

  const DatasetOptions options_;
  const SidecarCache sidecars_;
  Meta meta_;
  std::string info_name_;
  std::vector<const Feature*> videos_, images_, lowdim_;
  std::vector<Source> sources_;                  // per manifest stream
  std::map<std::string, int> data_file_of_path_;  // data parquet -> manifest shard
  std::vector<uint32_t> episode_file_;          // episode -> manifest shard

  mutable std::vector<std::unique_ptr<Once<DataFile>>> data_files_;  // by shard; fixed size
  mutable absl::Mutex mu_;
  mutable std::map<std::string, std::unique_ptr<Once<VideoFile>>> videos_cache_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::unique_ptr<Once<pb::EpisodeIndex>>> episode_cache_;  // fixed size
  mutable std::atomic<uint64_t> cached_index_bytes_{0};
  mutable std::map<std::string, int64_t> inexact_ ABSL_GUARDED_BY(mu_);  // warned features
  mutable std::set<int64_t> task_changes_ ABSL_GUARDED_BY(mu_);          // warned episodes
};

absl::StatusOr<std::unique_ptr<Dataset>> LeRobotDataset::Open(std::unique_ptr<Storage> storage,
                                                              std::string uri,
                                                              const DatasetOptions& options) {
  if (!(options.tolerance_s > 0)) {
    return absl::InvalidArgumentError("the LeRobot timestamp tolerance must be positive");
  }
  std::unique_ptr<LeRobotDataset> ds(new LeRobotDataset(options));
  ds->uri_ = RedactUri(uri);
  ds->storage_ = std::move(storage);
  RETURN_IF_ERROR(ds->Init());
  return std::unique_ptr<Dataset>(std::move(ds));
}

absl::Status LeRobotDataset::Init() {
  ASSIGN_OR_RETURN(meta_, ReadMeta(*storage_, uri_));
  info_name_ = storage_->Describe(kInfoPath);
  if (!(meta_.fps > 0)) {
    return absl::InvalidArgumentError(StrCat(info_name_, ": fps must be positive"));
  }
  std::vector<std::string> skipped;
  for (const Feature& f : meta_.features) {
    if (f.is_video()) {
      videos_.push_back(&f);
    } else if (f.is_image()) {
      images_.push_back(&f);
    } else if (IsIndexColumn(f.key)) {
      continue;
    } else if (IsNumericDtype(f.dtype)) {
      lowdim_.push_back(&f);
    } else {
      skipped.push_back(StrCat(f.key, " (", f.dtype, ")"));
    }
  }
  for (const std::string& s : skipped) {
    spdlog::warn("lerobot: {}: feature {} is not read (only numeric, image and video features "
                 "are; see docs/lerobot.md)", uri_, s);
  }

  // The data files, in the order episodes first name them.
  for (const Episode& ep : meta_.episodes) {
    auto [it, inserted] =
        data_file_of_path_.emplace(ep.data_path, static_cast<int>(manifest_.shards.size()));
    if (inserted) manifest_.shards.push_back({ep.data_path, 0, 0});
    ++manifest_.shards[static_cast<size_t>(it->second)].episodes;
    episode_file_.push_back(static_cast<uint32_t>(it->second));
  }
  data_files_.resize(manifest_.shards.size());
  for (auto& d : data_files_) d = std::make_unique<Once<DataFile>>();
  episode_cache_.resize(meta_.episodes.size());
  for (auto& e : episode_cache_) e = std::make_unique<Once<pb::EpisodeIndex>>();

  // Streams: kind, then name, as `conveyor import` orders them.
  std::vector<std::pair<StreamInfo, Source>> streams;
  for (const Feature* f : videos_) {
    ASSIGN_OR_RETURN(StreamInfo info, VideoStreamInfo(*f));
    streams.push_back({std::move(info), {pb::VIDEO, f}});
  }
  for (const Feature* f : images_) {
    ASSIGN_OR_RETURN(StreamInfo info, ImageStreamInfo(*f));
    streams.push_back({std::move(info), {pb::IMAGE, f}});
  }
  for (const Feature* f : lowdim_) {
    StreamInfo info;
    info.name = f->key;
    info.kind = pb::LOWDIM;
    info.codec = "parquet";
    info.rate = meta_.fps;
    info.shape = {f->elements()};
    info.names = f->names;
    if (info.names.empty()) {
      for (int64_t i = 0; i < f->elements(); ++i) info.names.push_back(StrCat(f->key, "_", i));
    }
    streams.push_back({std::move(info), {pb::LOWDIM, f}});
  }
  {
    StreamInfo info;
    info.name = std::string(kInstructionStream);
    info.kind = pb::TEXT;
    info.codec = "utf-8";
    streams.push_back({std::move(info), {pb::TEXT, nullptr}});
  }
  std::stable_sort(streams.begin(), streams.end(), [](const auto& a, const auto& b) {
    const int ka = datasets_internal::StreamKindOrder(a.first.kind), kb = datasets_internal::StreamKindOrder(b.first.kind);
    return ka != kb ? ka < kb : a.first.name < b.first.name;
  });
  for (auto& [info, source] : streams) {
    manifest_.streams.push_back(std::move(info));
    sources_.push_back(source);
  }

  // Statistics: the dataset's own (meta/stats.json, or v2.1's per-episode ones aggregated).
  for (const Feature* f : lowdim_) {
    auto it = meta_.stats.find(f->key);
    if (it == meta_.stats.end()) continue;
    const FeatureStats& st = it->second;
    const size_t dim = static_cast<size_t>(f->elements());
    if (st.mean.size() != dim || st.std.size() != dim || st.min.size() != dim ||
        st.max.size() != dim) {
      return absl::InvalidArgumentError(
          StrCat(storage_->Describe(meta_.stats_source), ": statistics of '", f->key,
                 "' do not have its dimension ", dim, " (info.json's shape)"));
    }
    StreamStats& out = manifest_.stats[f->key];
    out.mean = st.mean;
    out.std = st.std;
    out.min = st.min;
    out.max = st.max;
    out.count = st.count;
    for (const auto& [q, v] : st.quantiles) {
      if (v.size() == dim) out.quantiles[q] = v;
    }
  }

  // The episode table: one frame per row in every camera and lowdim stream.
  std::vector<EpisodeRecord> records;
  records.reserve(meta_.episodes.size());
  for (size_t e = 0; e < meta_.episodes.size(); ++e) {
    const Episode& ep = meta_.episodes[e];
    if (ep.length <= 0 || ep.length > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(StrCat(ep.source, ": episode ", ep.index, " has length ",
                                               ep.length));
    }
    EpisodeRecord r;
    r.episode_id = e;
    r.shard = episode_file_[e];
    r.duration_s = static_cast<double>(ep.length) / meta_.fps;
    for (const StreamInfo& s : manifest_.streams) {
      r.lengths.push_back(s.kind == pb::TEXT ? 1u : static_cast<uint32_t>(ep.length));
    }
    manifest_.total_duration_s += r.duration_s;
    records.push_back(std::move(r));
  }
  std::string table = EpisodeTable::Encode(records, manifest_.streams.size());
  manifest_.fingerprint = format::ChecksumHex(format::Checksum(
      StrCat(StreamsFingerprintText(manifest_.streams), "\nlerobot ", meta_.codebase_version, "\n",
             table)));
  manifest_.episode_table_bytes = table.size();
  manifest_.episode_table_xxh3 = format::ChecksumHex(format::Checksum(table));
  ASSIGN_OR_RETURN(episodes_, EpisodeTable::Parse(std::move(table), manifest_.streams.size(),
                                                  manifest_.shards.size(), info_name_));
  manifest_.num_episodes = episodes_.size();
  std::error_code ec;
  fs::path p(uri_);
  if (uri_.find("://") == std::string::npos) p = fs::absolute(p, ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  manifest_.name = p.filename().string();
  if (manifest_.name.empty()) manifest_.name = "lerobot";
  manifest_.created_by = StrCat("LeRobot ", meta_.codebase_version, " (read in place)");
  return absl::OkStatus();
}

absl::StatusOr<StreamInfo> LeRobotDataset::VideoStreamInfo(const Feature& f) {
  StreamInfo info;
  info.name = f.key;
  info.kind = pb::VIDEO;
  info.rate = meta_.fps;
  info.codec = f.video_codec;
  info.pix_fmt = f.video_pix_fmt;
  int64_t h = f.video_height, w = f.video_width;
  if (info.codec.empty() || info.pix_fmt.empty() || h <= 0 || w <= 0) {
    // info.json does not say it all: the first episode's file does.
    if (meta_.episodes.empty()) {
      return absl::InvalidArgumentError(StrCat(info_name_, ": no episodes"));
    }
    const Episode& ep = meta_.episodes.front();
    ASSIGN_OR_RETURN(std::shared_ptr<const VideoFile> v, Video(ep.videos.at(f.key).path, f.key, 0));
    info.codec = v->index.codec().codec();
    info.pix_fmt = v->index.codec().pix_fmt();
    h = v->index.codec().height();
    w = v->index.codec().width();
  }
  info.shape = {h, w, 3};
  return info;
}

absl::StatusOr<StreamInfo> LeRobotDataset::ImageStreamInfo(const Feature& f) {
  // The image codec and size are in the rows only: the first episode's first row.
  if (meta_.episodes.empty()) return absl::InvalidArgumentError(StrCat(info_name_, ": no episodes"));
  ASSIGN_OR_RETURN(auto rows, Rows(0));
  const parquet::Column& c = rows.first->columns.at(f.key);
  const auto* bytes = std::get_if<parquet::BinaryValues>(&c.values);
  const size_t row = static_cast<size_t>(rows.second);
  const std::string at = StrCat(rows.first->name, " row ", row, " ('", f.key, "')");
  if (bytes == nullptr || !c.lists.empty() || row >= bytes->size() || !c.valid[row]) {
    return absl::InvalidArgumentError(StrCat(at, ": not embedded image bytes"));
  }
  ASSIGN_OR_RETURN(pb::CodecParams params, ProbeImageBytes((*bytes)[row], at));
  StreamInfo info;
  info.name = f.key;
  info.kind = pb::IMAGE;
  info.rate = meta_.fps;
  info.codec = params.codec();
  info.pix_fmt = params.pix_fmt();
  info.shape = {params.height(), params.width(), 3};
  return info;
}

absl::StatusOr<std::shared_ptr<const DataFile>> LeRobotDataset::Data(uint32_t file,
                                                                     int64_t episode) const {
  return data_files_[file]->Get([&]() {
    return LoadDataFile(*storage_, manifest_.shards[file].path, episode, lowdim_, images_);
  });
}

absl::StatusOr<std::pair<std::shared_ptr<const DataFile>, int64_t>> LeRobotDataset::Rows(
    int64_t episode) const {
  const Episode& ep = meta_.episodes[static_cast<size_t>(episode)];
  ASSIGN_OR_RETURN(std::shared_ptr<const DataFile> d,
                   Data(episode_file_[static_cast<size_t>(episode)], episode));
  auto it = d->episode_rows.find(ep.index);
  const int64_t rows = it == d->episode_rows.end() ? 0 : it->second.second;
  if (rows != ep.length) {
    return absl::InvalidArgumentError(StrCat(d->name, ", episode ", ep.index, ": ", rows,
                                             " rows, but the episode metadata (", ep.source,
                                             ") says length ", ep.length));
  }
  return std::make_pair(std::move(d), it->second.first);
}

absl::StatusOr<std::unique_ptr<VideoFile>> LeRobotDataset::IndexVideo(const std::string& path,
                                                                      const std::string& key,
                                                                      int64_t episode) const {
  auto out = std::make_unique<VideoFile>();
  out->path = path;
  out->name = storage_->Describe(path);
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = storage_->Open(path);
  if (absl::IsNotFound(file.status())) {
    return absl::NotFoundError(StrCat(out->name, " is missing (episode ", episode, ", camera '", key,
                                      "', named by the episode metadata and info.json's ",
                                      "video_path)"));
  }
  if (!file.ok()) return file.status();
  out->file = *std::move(file);
  // The sidecar key: the file's full name, size and version (mtime, ETag).
  const std::string cache_key =
      StrCat(out->name, "\n", out->file->size(), "\n", out->file->version());
  if (std::optional<pb::StreamIndex> cached = sidecars_.Get(cache_key)) {
    out->index = *std::move(cached);
  } else {
    ASSIGN_OR_RETURN(DemuxedStream d,
                     DemuxBestStream(*out->file, MediaKind::kVideo, key, /*keep_bytes=*/false));
    out->index = IndexOf(d);
    if (out->file->version().empty()) {
      spdlog::debug("lerobot: {} has no version (mtime or ETag); its index is not cached",
                    out->name);
    } else {
      sidecars_.Put(cache_key, out->index);
    }
  }
  out->index.set_name(key);
  const pb::PacketTable& t = out->index.packets();
  for (int i = 0; i < t.pts_size(); ++i) {
    // Frames before the stream's start (an edit list's hidden lead-in) are references only.
    if (t.pts(i) >= out->index.pts_origin()) out->shown.push_back(i);
  }
  std::stable_sort(out->shown.begin(), out->shown.end(),
                   [&](int a, int b) { return t.pts(a) < t.pts(b); });
  return out;
}

absl::StatusOr<std::shared_ptr<const VideoFile>> LeRobotDataset::Video(const std::string& path,
                                                                       const std::string& key,
                                                                       int64_t episode) const {
  Once<VideoFile>* slot = nullptr;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Once<VideoFile>>& s = videos_cache_[path];
    if (s == nullptr) s = std::make_unique<Once<VideoFile>>();
    slot = s.get();
  }
  return slot->Get([&]() { return IndexVideo(path, key, episode); });
}

// Cuts episode `ep` out of `video`: the frames whose presentation time lies in [from, to) (each
// rounded to the nearest frame; LeRobot's from_timestamp is a float sum of durations and the
// concat demuxer shifts later files by a few ticks), with their packets, which must be one
// contiguous run in decode order starting with a keyframe. Timestamps are rebased so that the
// episode's first frame is t = 0. `row_ts` are the episode's data timestamps, which every frame
// must match within the tolerance (relative to the first).
absl::Status LeRobotDataset::CutVideo(const VideoFile& video, const Episode& ep,
                                      const VideoSegment& seg, const std::string& key,
                                      const std::vector<double>& row_ts,
                                      pb::StreamIndex* out) const {
  const pb::PacketTable& t = video.index.packets();
  const double tb =
      static_cast<double>(video.index.time_base_num()) / video.index.time_base_den();
  const double half = 0.5 / meta_.fps;
  const std::string where = StrCat("episode ", ep.index, ", camera '", key, "', ", video.name);
  auto time_of = [&](size_t shown) {
    return static_cast<double>(t.pts(video.shown[shown])) * tb;
  };
  const size_t n_shown = video.shown.size();

  // The first frame: the one nearest from_timestamp.
  size_t first = static_cast<size_t>(
      std::lower_bound(video.shown.begin(), video.shown.end(), seg.from_s - half,
                       [&](int p, double x) { return static_cast<double>(t.pts(p)) * tb < x; }) -
      video.shown.begin());
  if (first == n_shown || std::fabs(time_of(first) - seg.from_s) > half) {
    return absl::InvalidArgumentError(StrCat(
        where, ": no frame at from_timestamp ", seg.from_s, " s (",
        first == n_shown ? "past the last frame" : StrCat("nearest frame at ", time_of(first), " s"),
        "); check the episode metadata (", ep.source, ") against the file"));
  }
  size_t end = first;
  if (seg.to_s.has_value()) {
    while (end < n_shown && time_of(end) < *seg.to_s - half) ++end;
  } else {
    end = n_shown;
  }
  const int64_t frames = static_cast<int64_t>(end - first);
  if (frames != ep.length) {
    return absl::InvalidArgumentError(StrCat(
        where, ": ", frames, " frames",
        seg.to_s.has_value() ? StrCat(" between from_timestamp ", seg.from_s,
                                      " s and to_timestamp ", *seg.to_s, " s")
                             : std::string(" in the file"),
        ", but the episode has ", ep.length, " rows (", ep.source,
        "); the video and the data disagree"));
  }

  // Every frame where the data says it is, on the episode's clock.
  const int64_t origin = t.pts(video.shown[first]);
  for (int64_t k = 0; k < frames; ++k) {
    const double at = static_cast<double>(t.pts(video.shown[first + static_cast<size_t>(k)]) - origin) * tb;
    const double want = row_ts[static_cast<size_t>(k)] - row_ts[0];
    if (std::fabs(at - want) > options_.tolerance_s) {
      return absl::InvalidArgumentError(
          StrCat(where, ": frame ", k, " of the episode is at ", at,
                 " s from its first frame, the data row says ", want, " s (off by ",
                 std::fabs(at - want), " s, over the tolerance of ", options_.tolerance_s,
                 " s); check info.json's fps (", meta_.fps, ") and the video's frame rate"));
    }
  }

  // Its packets: one contiguous run in decode order, starting with a keyframe.
  int lo = t.pts_size(), hi = 0;
  for (size_t k = first; k < end; ++k) {
    lo = std::min(lo, video.shown[k]);
    hi = std::max(hi, video.shown[k]);
  }
  for (int p = lo; p <= hi; ++p) {
    const bool in_episode =
        t.pts(p) >= origin && (end == n_shown || t.pts(p) < t.pts(video.shown[end]));
    if (!in_episode) {
      return absl::InvalidArgumentError(StrCat(
          where, ": packet ", p, " (pts ", t.pts(p), ") lies inside the episode's run of ",
          "packets in decode order but belongs to another episode; episodes must be cut at ",
          "closed GOP boundaries"));
    }
  }
  if ((t.flags(lo) & format::kPacketKey) == 0) {
    return absl::InvalidArgumentError(StrCat(
        where, ": the episode does not start on a keyframe (its first packet in decode order, ",
        "packet ", lo, " at pts ", t.pts(lo),
        ", is not a keyframe), so it cannot be cut out without re-encoding; LeRobot's writer ",
        "starts every episode with one: check how this file was made"));
  }

  out->set_name(key);
  out->set_kind(pb::VIDEO);
  *out->mutable_codec() = video.index.codec();
  out->set_time_base_num(video.index.time_base_num());
  out->set_time_base_den(video.index.time_base_den());
  out->set_pts_origin(0);
  pb::PacketTable* o = out->mutable_packets();
  for (int p = lo; p <= hi; ++p) {
    o->add_pts(t.pts(p) - origin);
    o->add_dts(t.dts(p) - origin);
    o->add_duration(t.duration(p));
    o->add_offset(t.offset(p));
    o->add_size(t.size(p));
    o->add_flags(t.flags(p));
    o->add_xxh3(t.xxh3(p));
  }
  out->set_num_frames(static_cast<uint64_t>(hi - lo + 1));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> LeRobotDataset::LoadEpisode(
    size_t episode) const {
  if (episode >= episodes_.size()) {
    return absl::OutOfRangeError(StrCat("episode ", episode, " does not exist (", uri_, " has ",
                                        episodes_.size(), " episodes)"));
  }
  Once<pb::EpisodeIndex>& slot = *episode_cache_[episode];
  {
    absl::MutexLock lock(&slot.mu);
    if (slot.value != nullptr) return slot.value;
  }
  // Built outside the lock (two threads may build the same episode; the results are equal), and
  // kept while the kept indexes stay under kMaxCachedIndexBytes: beyond that, an episode is cut
  // again from the (kept) packet index and rows each time it is loaded.
  ASSIGN_OR_RETURN(std::unique_ptr<pb::EpisodeIndex> built, BuildEpisode(episode));
  std::shared_ptr<const pb::EpisodeIndex> index(std::move(built));
  const uint64_t bytes = index->SpaceUsedLong();
  if (cached_index_bytes_.fetch_add(bytes, std::memory_order_relaxed) + bytes <= kMaxCachedIndexBytes) {
    absl::MutexLock lock(&slot.mu);
    if (slot.value == nullptr) return slot.value = index;
  }
  cached_index_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  return index;
}

absl::StatusOr<std::vector<double>> LeRobotDataset::RowTimestamps(const Episode& ep,
                                                                   const DataFile& d,
                                                                   int64_t first,
                                                                   const std::string& where) const {
  const int64_t rows = ep.length;
  if (meta_.version == Version::kV21 && d.rows != rows) {
    return absl::InvalidArgumentError(StrCat(where, ": the file holds ", d.rows - rows,
                                             " rows of other episodes"));
  }
  std::vector<double> ts(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const size_t r = static_cast<size_t>(first + i);
    if (d.frame_index[r] != i) {
      return absl::InvalidArgumentError(StrCat(where, " row ", first + i, ": frame_index ",
                                               d.frame_index[r], ", expected ", i));
    }
    if (d.index[r] != ep.dataset_from_index + i) {
      return absl::InvalidArgumentError(
          StrCat(where, " row ", first + i, ": index ", d.index[r], ", expected ",
                 ep.dataset_from_index + i, " (the episode's dataset_from_index + frame_index)"));
    }
    ts[static_cast<size_t>(i)] = d.timestamp[r];
    const double want = static_cast<double>(i) / meta_.fps;
    if (!std::isfinite(d.timestamp[r]) || std::fabs(d.timestamp[r] - want) > options_.tolerance_s) {
      return absl::InvalidArgumentError(StrCat(
          where, " row ", first + i, " (frame_index ", i, "): timestamp ", d.timestamp[r],
          " s, but frame_index / fps = ", want, " s with fps ", meta_.fps, " from ", info_name_,
          " (off by more than ", options_.tolerance_s, " s); check fps in info.json"));
    }
  }
  return ts;
}

absl::StatusOr<std::string> LeRobotDataset::EpisodeTask(const Episode& ep, const DataFile& d,
                                                        int64_t first,
                                                        const std::string& where) const {
  const int64_t task_index = d.task_index[static_cast<size_t>(first)];
  auto task = meta_.tasks.find(task_index);
  if (task == meta_.tasks.end()) {
    return absl::InvalidArgumentError(StrCat(where, ": task_index ", task_index,
                                             " is not in the tasks table"));
  }
  if (!ep.tasks.empty() &&
      std::find(ep.tasks.begin(), ep.tasks.end(), task->second) == ep.tasks.end()) {
    return absl::InvalidArgumentError(
        StrCat(where, ": its first frame's task is \"", task->second,
               "\", but the episode metadata (", ep.source, ") lists ", Join(ep.tasks)));
  }
  for (int64_t i = 1; i < ep.length; ++i) {
    if (d.task_index[static_cast<size_t>(first + i)] != task_index) {
      absl::MutexLock lock(&mu_);
      if (task_changes_.insert(ep.index).second) {
        spdlog::warn("lerobot: {} changes task at frame {}; the instruction is the first task, "
                     "\"{}\"", where, i, task->second);
      }
      break;
    }
  }
  return task->second;
}

absl::Status LeRobotDataset::VideoStreamIndex(const Episode& ep, const StreamInfo& info,
                                              const Source& src, const std::vector<double>& ts,
                                              pb::StreamIndex* out) const {
  const VideoSegment& seg = ep.videos.at(info.name);
  ASSIGN_OR_RETURN(std::shared_ptr<const VideoFile> video, Video(seg.path, info.name, ep.index));
  RETURN_IF_ERROR(CheckVideoFeature(*src.feature, video->index.codec(), info_name_, video->name));
  const pb::CodecParams& c = video->index.codec();
  if (c.codec() != info.codec || c.pix_fmt() != info.pix_fmt ||
      c.height() != info.shape[0] || c.width() != info.shape[1]) {
    return absl::DataLossError(StrCat(
        "episode ", ep.index, ", camera '", info.name, "': ", video->name, " is ", c.codec(),
        " ", c.pix_fmt(), " ", c.width(), "x", c.height(), ", the dataset's camera is ",
        info.codec, " ", info.pix_fmt, " ", info.shape[1], "x", info.shape[0],
        " (info.json or the first episode's file); every episode of a camera must match"));
  }
  return CutVideo(*video, ep, seg, info.name, ts, out);
}

absl::Status LeRobotDataset::ImageStreamIndex(const DataFile& d, const StreamInfo& info,
                                              int64_t first, int64_t rows,
                                              const std::string& where,
                                              pb::StreamIndex* out) const {
  const parquet::Column& c = d.columns.at(info.name);
  const auto* bytes = std::get_if<parquet::BinaryValues>(&c.values);
  if (bytes == nullptr || !c.lists.empty()) {
    return absl::InvalidArgumentError(
        StrCat(where, ": '", info.name, ".bytes' is not a binary column"));
  }
  out->set_name(info.name);
  out->set_kind(pb::IMAGE);
  const std::string at = StrCat(where, " row ", first, " ('", info.name, "')");
  if (!c.valid[static_cast<size_t>(first)]) {
    return absl::InvalidArgumentError(StrCat(at, ": no image bytes"));
  }
  ASSIGN_OR_RETURN(*out->mutable_codec(), ProbeImageBytes((*bytes)[static_cast<size_t>(first)], at));
  const TimeBase tb = FrameTimeBase(meta_.fps);
  out->set_time_base_num(tb.num);
  out->set_time_base_den(tb.den);
  out->set_pts_origin(0);
  pb::PacketTable* t = out->mutable_packets();
  for (int64_t r = 0; r < rows; ++r) {
    const size_t row = static_cast<size_t>(first + r);
    if (!c.valid[row] || (*bytes)[row].empty()) {
      return absl::InvalidArgumentError(StrCat(
          where, " row ", first + r, " ('", info.name, "'): no image bytes (only images ",
          "embedded in the parquet are read; a dataset still pointing at image files must ",
          "be pushed or re-saved with embedded images)"));
    }
    t->add_pts(r);
    t->add_dts(r);
    t->add_duration(1);
    t->add_offset(row);  // the row in the data file
    t->add_size(static_cast<uint32_t>((*bytes)[row].size()));
    t->add_flags(format::kPacketKey);
    t->add_xxh3(format::Checksum((*bytes)[row]));
  }
  out->set_num_frames(static_cast<uint64_t>(rows));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<pb::EpisodeIndex>> LeRobotDataset::BuildEpisode(
    size_t episode) const {
  const Episode& ep = meta_.episodes[episode];
  ASSIGN_OR_RETURN(auto rows_at, Rows(static_cast<int64_t>(episode)));
  const DataFile& d = *rows_at.first;
  const int64_t first = rows_at.second;
  const int64_t rows = ep.length;
  const std::string where = StrCat(d.name, ", episode ", ep.index);
  ASSIGN_OR_RETURN(const std::vector<double> ts, RowTimestamps(ep, d, first, where));
  // The instruction: the task of the episode's first frame.
  ASSIGN_OR_RETURN(const std::string task, EpisodeTask(ep, d, first, where));

  auto index = std::make_unique<pb::EpisodeIndex>();
  index->set_format_version(format::kFormatVersion);
  index->set_episode_id(episode);
  index->set_source(where);
  double duration = 0;
  for (size_t s = 0; s < manifest_.streams.size(); ++s) {
    const StreamInfo& info = manifest_.streams[s];
    const Source& src = sources_[s];
    pb::StreamIndex* out = index->add_streams();
    switch (src.kind) {
      case pb::VIDEO:
        RETURN_IF_ERROR(VideoStreamIndex(ep, info, src, ts, out));
        break;
      case pb::IMAGE:
        RETURN_IF_ERROR(ImageStreamIndex(d, info, first, rows, where, out));
        break;
      case pb::LOWDIM: {
        out->set_name(info.name);
        out->set_kind(pb::LOWDIM);
        out->mutable_codec()->set_codec(info.codec);
        out->set_time_base_num(1);
        out->set_time_base_den(1);
        for (double t : ts) out->add_timestamps_s(t);
        out->mutable_blocks()->set_dim(static_cast<int32_t>(info.shape[0]));
        out->set_num_frames(static_cast<uint64_t>(rows));
        break;
      }
      case pb::TEXT:
        out->set_name(info.name);
        out->set_kind(pb::TEXT);
        out->mutable_codec()->set_codec(info.codec);
        out->set_time_base_num(1);
        out->set_time_base_den(1);
        out->set_text(task);
        out->set_num_frames(1);
        break;
      default:
        return absl::InternalError("unknown stream kind");
    }
    duration = std::max(duration, StreamEnd(src.kind, *out, ts));
    if (out->num_frames() != episodes_.length(episode, s)) {
      return absl::DataLossError(StrCat(where, ", stream '", info.name, "': ", out->num_frames(),
                                        " frames, the episode metadata says ",
                                        episodes_.length(episode, s)));
    }
  }
  index->set_duration_s(duration);
  return index;
}

absl::Status LeRobotDataset::ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                                        std::string* out) const {
  if (stream < 0 || stream >= index.streams_size() ||
      static_cast<size_t>(stream) >= sources_.size() || index.episode_id() >= meta_.episodes.size()) {
    return absl::OutOfRangeError(StrCat("stream ", stream, " does not exist"));
  }
  const pb::StreamIndex& s = index.streams(stream);
  const pb::PacketTable& t = s.packets();
  if (packet >= static_cast<size_t>(t.offset_size())) {
    return absl::OutOfRangeError(StrCat("episode ", index.episode_id(), " stream '", s.name(),
                                        "' has ", t.offset_size(), " packets; asked for ", packet));
  }
  const int p = static_cast<int>(packet);
  const Episode& ep = meta_.episodes[index.episode_id()];
  std::string file_name;
  if (sources_[static_cast<size_t>(stream)].kind == pb::IMAGE) {
    ASSIGN_OR_RETURN(std::shared_ptr<const DataFile> d,
                     Data(episode_file_[index.episode_id()], ep.index));
    const parquet::Column& c = d->columns.at(s.name());
    const auto* bytes = std::get_if<parquet::BinaryValues>(&c.values);
    if (bytes == nullptr || t.offset(p) >= bytes->size()) {
      return absl::DataLossError(StrCat(d->name, ": no row ", t.offset(p), " of '", s.name(), "'"));
    }
    out->assign((*bytes)[t.offset(p)]);
    file_name = StrCat(d->name, " row ", t.offset(p));
  } else {
    ASSIGN_OR_RETURN(std::shared_ptr<const VideoFile> video,
                     Video(ep.videos.at(s.name()).path, s.name(), ep.index));
    out->resize(t.size(p));
    RETURN_IF_ERROR(video->file->Read(t.offset(p), t.size(p), out->data()));
    file_name = video->name;
  }
  if (format::Checksum(*out) != t.xxh3(p)) {
    return absl::DataLossError(StrCat(
        "checksum mismatch in ", file_name, ", episode ", index.episode_id(), ", stream '",
        s.name(), "', packet ", packet, " at byte offset ", t.offset(p), " (", t.size(p),
        " bytes): the file changed after it was indexed (delete its entry in the index cache, ",
        IndexCacheDir(options_), ", if it was rewritten in place)"));
  }
  return absl::OkStatus();
}

absl::Status LeRobotDataset::ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first,
                                        size_t count, std::vector<float>* out) const {
  if (stream < 0 || stream >= index.streams_size() ||
      static_cast<size_t>(stream) >= sources_.size() ||
      sources_[static_cast<size_t>(stream)].kind != pb::LOWDIM ||
      index.episode_id() >= meta_.episodes.size()) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not a lowdim stream"));
  }
  const pb::StreamIndex& s = index.streams(stream);
  if (first > s.num_frames() || count > s.num_frames() - first) {
    return absl::OutOfRangeError(StrCat("episode ", index.episode_id(), " stream '", s.name(),
                                        "' has ", s.num_frames(), " steps; asked for [", first,
                                        ", ", first + count, ")"));
  }
  const Feature& f = *sources_[static_cast<size_t>(stream)].feature;
  out->resize(count * static_cast<size_t>(f.elements()));
  if (count == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto rows_at, Rows(static_cast<int64_t>(index.episode_id())));
  const DataFile& d = *rows_at.first;
  int64_t inexact = 0;
  RETURN_IF_ERROR(LowdimRows(d.columns.at(f.key), f, rows_at.second + static_cast<int64_t>(first),
                             static_cast<int64_t>(count),
                             StrCat(d.name, ", episode ", index.episode_id()), out->data(),
                             &inexact));
  if (inexact > 0) {
    absl::MutexLock lock(&mu_);
    if (inexact_[f.key]++ == 0) {
      spdlog::warn("lerobot: values of '{}' ({}) are not exactly representable as float32 and "
                   "are rounded", f.key, f.dtype);
    }
  }
  return absl::OkStatus();
}

absl::Status LeRobotDataset::VerifyShard(uint32_t shard) const {
  if (shard >= manifest_.shards.size()) {
    return absl::OutOfRangeError(StrCat("file ", shard, " does not exist in ", uri_));
  }
  for (size_t e = 0; e < episode_file_.size(); ++e) {
    if (episode_file_[e] == shard) RETURN_IF_ERROR(VerifyEpisode(e));
  }
  return absl::OkStatus();
}

}  // namespace

std::string IndexCacheDir(const DatasetOptions& options) {
  std::string dir = options.index_cache_dir;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? v : "";
  };
  if (dir.empty()) dir = env("CONVEYOR_INDEX_CACHE_DIR");
  if (dir.empty() && !env("CONVEYOR_CACHE_DIR").empty()) dir = env("CONVEYOR_CACHE_DIR") + "/index";
  if (dir.empty() && !env("XDG_CACHE_HOME").empty()) {
    dir = env("XDG_CACHE_HOME") + "/conveyor/index";
  }
  if (dir.empty() && !env("HOME").empty()) dir = env("HOME") + "/.cache/conveyor/index";
  if (dir == "none") dir.clear();
  return dir;
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri,
                                                     const DatasetOptions& options) {
  return LeRobotDataset::Open(std::move(storage), std::move(uri), options);
}

}  // namespace conveyor::lerobot
