// The dataset doctor: see dataset_check.h. The readers fail closed at the first disagreement;
// this file walks the same files and keeps going, so one run lists every broken episode.
#include "datasets/dataset_check.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/media_demux.h"
#include "media/video_decoder.h"
#include "format/format.h"
#include "datasets/lerobot/lerobot_meta.h"

namespace conveyor {
namespace {

namespace pb = format::v1;

std::string Num(double v) { return absl::StrFormat("%.6g", v); }

class Doctor {
 public:
  Doctor(const Dataset& dataset, const CheckOptions& options)
      : ds_(dataset), options_(options) {}

  CheckReport Run() {
    report_.uri = ds_.uri();
    report_.format = ds_.format();
    report_.fingerprint = ds_.manifest().fingerprint;
    report_.episodes = ds_.num_episodes();
    uint64_t n = report_.episodes;
    if (options_.max_episodes > 0) n = std::min<uint64_t>(n, static_cast<uint64_t>(options_.max_episodes));
    report_.episodes_checked = n;
    if (report_.format.rfind("lerobot", 0) == 0) CheckLeRobot(n);
    for (uint64_t e = 0; e < n; ++e) CheckEpisode(static_cast<int64_t>(e));
    // Dataset-wide findings first, then by episode, each episode's in the order found.
    std::stable_sort(report_.findings.begin(), report_.findings.end(),
                     [](const CheckFinding& a, const CheckFinding& b) { return a.episode < b.episode; });
    return std::move(report_);
  }

 private:
  void Add(CheckSeverity severity, int64_t episode, std::string stream, std::string file,
           std::string what, std::string detail) {
    // A reader's error names its file first ("F: not a Parquet file ..."); the finding already
    // has F in its own column, so the report would print it twice ("F: F: ...").
    if (!file.empty() && absl::StartsWith(detail, file + ": ")) detail.erase(0, file.size() + 2);
    report_.findings.push_back(CheckFinding{severity, "", episode, std::move(stream),
                                            std::move(file), std::move(what), std::move(detail)});
    if (severity == CheckSeverity::kError && episode >= 0) with_errors_.insert(episode);
  }
  void Error(int64_t episode, std::string stream, std::string file, std::string what,
             std::string detail) {
    Add(CheckSeverity::kError, episode, std::move(stream), std::move(file), std::move(what),
        std::move(detail));
  }
  void Warning(int64_t episode, std::string stream, std::string file, std::string what,
               std::string detail) {
    Add(CheckSeverity::kWarning, episode, std::move(stream), std::move(file), std::move(what),
        std::move(detail));
  }

  // ---- Every format, through the Dataset interface. -------------------------------------------

  void CheckEpisode(int64_t e) {
    const EpisodeRecord record = ds_.episodes().record(static_cast<size_t>(e));
    const std::string file = ds_.ShardName(record.shard);
    absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> index =
        ds_.LoadEpisode(static_cast<size_t>(e));
    if (!index.ok()) {
      // The LeRobot pass has already named what is wrong (a missing video, a lying length) with
      // its numbers; the reader's first complaint would repeat one of them.
      if (with_errors_.count(e) == 0) {
        Error(e, "", file,
              absl::IsNotFound(index.status()) ? "file_missing" : "episode_unreadable",
              std::string(index.status().message()));
      }
      return;
    }
    const Manifest& m = ds_.manifest();
    for (int s = 0; s < (*index)->streams_size(); ++s) {
      const pb::StreamIndex& si = (*index)->streams(s);
      const StreamInfo& info = m.streams[static_cast<size_t>(s)];
      if (si.kind() == pb::VIDEO) CheckVideoStream(e, file, **index, s, info);
      CheckEnds(e, file, **index, s);
    }
  }

  void CheckVideoStream(int64_t e, const std::string& file, const pb::EpisodeIndex& index,
                        int s, const StreamInfo& info) {
    const pb::StreamIndex& si = index.streams(s);
    absl::StatusOr<FrameTable> table = FrameTable::Build(si);
    if (!table.ok()) {
      Error(e, info.name, file, "timestamps", std::string(table.status().message()));
      return;
    }
    const size_t n = table->size();
    const EpisodeRecord record = ds_.episodes().record(static_cast<size_t>(e));
    if (static_cast<size_t>(s) < record.lengths.size() && record.lengths[static_cast<size_t>(s)] != n) {
      Error(e, info.name, file, "frame_count",
            StrCat(n, " frames in the video, the episode table says ",
                   record.lengths[static_cast<size_t>(s)]));
    }
    if (n < 2 || info.rate <= 0) return;
    const double period = 1.0 / info.rate;
    // Jumps: a gap of more than one and a half frame periods means frames are missing there.
    size_t jumps = 0, first_jump = 0;
    double widest = 0;
    for (size_t k = 1; k < n; ++k) {
      const double gap = table->time_s[k] - table->time_s[k - 1];
      if (gap > 1.5 * period) {
        if (jumps++ == 0) first_jump = k;
        widest = std::max(widest, gap);
      }
    }
    if (jumps > 0) {
      Warning(e, info.name, file, "timestamp_jump",
              StrCat(jumps, " jump", jumps > 1 ? "s" : "", " in the frame times; the first at frame ",
                     first_jump, " (", Num(table->time_s[first_jump - 1]), " s -> ",
                     Num(table->time_s[first_jump]), " s), the widest ", Num(widest), " s = ",
                     Num(widest * info.rate), " frame periods at ", Num(info.rate), " fps"));
    }
    const double span = table->time_s[n - 1] - table->time_s[0];
    const double measured = span > 0 ? static_cast<double>(n - 1) / span : 0;
    if (jumps == 0 && measured > 0 && std::fabs(measured - info.rate) > 0.01 * info.rate) {
      Warning(e, info.name, file, "fps_mismatch",
              StrCat("frames are ", Num(1.0 / measured), " s apart (", Num(measured),
                     " fps), the manifest says ", Num(info.rate), " fps"));
    }
    // The video covers its frames' span plus one frame; the episode's duration is its longest
    // stream's, so only a video shorter by more than a frame and a half is reported.
    const double covers = span + period;
    const double duration = index.duration_s();
    if (duration > 0 && duration - covers > 1.5 * period) {
      Warning(e, info.name, file, "duration_mismatch",
              StrCat("the video covers ", Num(covers), " s (", n, " frames), the episode lasts ",
                     Num(duration), " s: ", Num((duration - covers) * info.rate),
                     " frames short"));
    }
    if (options_.decode_ends) DecodeEnds(e, file, index, s, info, *table);
  }

  // The first and last packet (or lowdim step) of a stream: a truncated or overwritten file shows
  // here without reading every byte.
  void CheckEnds(int64_t e, const std::string& file, const pb::EpisodeIndex& index, int s) {
    const pb::StreamIndex& si = index.streams(s);
    const std::string& name = ds_.manifest().streams[static_cast<size_t>(s)].name;
    if (si.kind() == pb::LOWDIM) {
      if (si.num_frames() == 0) return;
      std::vector<float> values;
      for (uint64_t step : {uint64_t{0}, si.num_frames() - 1}) {
        absl::Status st = ds_.ReadLowdim(index, s, step, 1, &values);
        if (!st.ok()) {
          Error(e, name, file, "unreadable", std::string(st.message()));
          return;
        }
      }
      return;
    }
    const int packets = si.packets().pts_size();
    if (packets == 0) return;
    std::string bytes;
    for (int p : {0, packets - 1}) {
      absl::Status st = ds_.ReadPacket(index, s, static_cast<size_t>(p), &bytes);
      if (!st.ok()) {
        Error(e, name, file, "unreadable", std::string(st.message()));
        return;
      }
    }
  }

  void DecodeEnds(int64_t e, const std::string& file, const pb::EpisodeIndex& index, int s,
                  const StreamInfo& info, const FrameTable& table) {
    const int64_t frames[] = {0, static_cast<int64_t>(table.size()) - 1};
    std::vector<RgbImage> out(1);
    for (int64_t k : frames) {
      auto read = [&](size_t packet, std::string* bytes) {
        return ds_.ReadPacket(index, s, packet, bytes);
      };
      // Each end decoded on its own (a fresh key), at the stream's own size.
      absl::Status st = decoder_.Decode(next_key_++, index.streams(s), table, read,
                                        std::span<const int64_t>(&k, 1), VideoOutput{},
                                        DecodeLimits{}, &out);
      if (!st.ok()) {
        Error(e, info.name, file, "decode_failed",
              StrCat(k == 0 ? "the first" : "the last", " frame (", k, ") does not decode: ",
                     st.message()));
        return;
      }
    }
  }

  // ---- LeRobot read in place: the metadata, the data rows and the mp4s themselves. -----------

  struct DataRows {
    std::vector<int64_t> episode_index, index, frame_index;
    std::vector<double> timestamp;
  };

  static absl::StatusOr<std::vector<double>> ReadTimestamps(const parquet::ParquetFile& file) {
    ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn("timestamp"));
    if (c.lists.empty() && c.null_count == 0) {
      if (const auto* f = std::get_if<std::vector<float>>(&c.values)) {
        return std::vector<double>(f->begin(), f->end());
      }
      if (const auto* d = std::get_if<std::vector<double>>(&c.values)) return *d;
    }
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column 'timestamp' is not a flat non-null FLOAT or DOUBLE column"));
  }

  absl::StatusOr<DataRows> ReadRows(const std::string& path) {
    ASSIGN_OR_RETURN(parquet::ParquetFile pf, lerobot::OpenParquet(ds_.storage(), path));
    DataRows r;
    ASSIGN_OR_RETURN(r.episode_index, lerobot::ReadIntColumn(pf, "episode_index"));
    ASSIGN_OR_RETURN(r.index, lerobot::ReadIntColumn(pf, "index"));
    ASSIGN_OR_RETURN(r.frame_index, lerobot::ReadIntColumn(pf, "frame_index"));
    ASSIGN_OR_RETURN(r.timestamp, ReadTimestamps(pf));
    return r;
  }

  void CheckLeRobot(uint64_t n) {
    absl::StatusOr<lerobot::Meta> meta = lerobot::ReadMeta(ds_.storage(), ds_.uri());
    if (!meta.ok()) {
      Error(-1, "", ds_.storage().Describe(lerobot::kInfoPath), "metadata",
            std::string(meta.status().message()));
      return;
    }
    meta_ = &*meta;
    std::map<int64_t, size_t> position;  // episode_index -> position in the table
    for (size_t i = 0; i < meta->episodes.size(); ++i) position[meta->episodes[i].index] = i;
    // The data files of the checked episodes, in order of first use.
    std::vector<std::string> files;
    std::map<std::string, std::vector<size_t>> episodes_of;
    for (size_t i = 0; i < n && i < meta->episodes.size(); ++i) {
      const std::string& path = meta->episodes[i].data_path;
      if (episodes_of.count(path) == 0) files.push_back(path);
      episodes_of[path].push_back(i);
    }
    for (const std::string& path : files) CheckDataFile(path, episodes_of[path], position);
    for (size_t i = 0; i < n && i < meta->episodes.size(); ++i) CheckCameras(i);
    meta_ = nullptr;
  }

  void CheckDataFile(const std::string& path, const std::vector<size_t>& episodes,
                     const std::map<int64_t, size_t>& position) {
    const lerobot::Meta& meta = *meta_;
    const std::string name = ds_.storage().Describe(path);
    absl::StatusOr<DataRows> rows = ReadRows(path);
    if (!rows.ok()) {
      const bool missing = absl::IsNotFound(rows.status());
      for (size_t i : episodes) {
        Error(static_cast<int64_t>(i), "", name, missing ? "data_missing" : "data_unreadable",
              std::string(rows.status().message()));
      }
      return;
    }
    const size_t total = rows->episode_index.size();
    // Rows per episode: where its run starts, how many, and whether they are one run.
    struct Run {
      size_t first = 0, count = 0;
      bool contiguous = true;
    };
    std::map<int64_t, Run> runs;
    size_t orphaned = 0, first_orphan = 0;
    std::set<int64_t> orphan_ids;
    for (size_t r = 0; r < total; ++r) {
      const int64_t ep = rows->episode_index[r];
      auto at = position.find(ep);
      // A row is orphaned when its episode is not in the table, or the table puts that episode's
      // rows in another file.
      if (at == position.end() || meta.episodes[at->second].data_path != path) {
        if (orphaned++ == 0) first_orphan = r;
        if (orphan_ids.size() < 8) orphan_ids.insert(ep);
        continue;
      }
      auto [it, fresh] = runs.try_emplace(ep, Run{r, 0, true});
      if (!fresh && it->second.first + it->second.count != r) it->second.contiguous = false;
      ++it->second.count;
    }
    if (orphaned > 0) {
      std::string ids;
      for (int64_t id : orphan_ids) StrAppend(&ids, ids.empty() ? "" : ", ", id);
      Warning(-1, "", name, "orphaned_rows",
              StrCat(orphaned, " of ", total, " rows (",
                     absl::StrFormat("%.1f", 100.0 * static_cast<double>(orphaned) / static_cast<double>(total)),
                     "%) belong to no episode of the episode table (episode_index ", ids,
                     orphan_ids.size() < 8 ? "" : ", ...", "; the first at row ", first_orphan, ")"));
    }
    for (size_t i : episodes) {
      const lerobot::Episode& ep = meta.episodes[i];
      const int64_t e = static_cast<int64_t>(i);
      auto it = runs.find(ep.index);
      const size_t count = it == runs.end() ? 0 : it->second.count;
      if (static_cast<int64_t>(count) != ep.length) {
        Error(e, "", name, "rows_vs_length",
              StrCat(count, " rows of episode_index ", ep.index, ", the episode metadata (",
                     ep.source, ") says length ", ep.length));
      }
      if (it == runs.end()) continue;
      if (!it->second.contiguous) {
        Error(e, "", name, "rows_not_contiguous",
              StrCat("the rows of episode_index ", ep.index, " are not one run (the first at row ",
                     it->second.first, ")"));
        continue;
      }
      CheckRowIndexes(e, ep, name, *rows, it->second.first, count);
    }
  }

  // frame_index, index and timestamp of one episode's run of rows; one finding per kind, with
  // the first offending row and how many rows are off.
  void CheckRowIndexes(int64_t e, const lerobot::Episode& ep, const std::string& name,
                       const DataRows& rows, size_t first, size_t count) {
    const double fps = meta_->fps;
    size_t bad_frame = 0, bad_index = 0, bad_ts = 0;
    std::string frame_msg, index_msg, ts_msg;
    for (size_t i = 0; i < count; ++i) {
      const size_t r = first + i;
      const int64_t k = static_cast<int64_t>(i);
      if (rows.frame_index[r] != k && bad_frame++ == 0) {
        frame_msg = StrCat("row ", r, ": frame_index ", rows.frame_index[r], ", expected ", k);
      }
      if (rows.index[r] != ep.dataset_from_index + k && bad_index++ == 0) {
        index_msg = StrCat("row ", r, ": index ", rows.index[r], ", expected ",
                           ep.dataset_from_index + k, " (dataset_from_index + frame_index)");
      }
      const double want = static_cast<double>(k) / fps;
      const double ts = rows.timestamp[r];
      if ((!std::isfinite(ts) || std::fabs(ts - want) > options_.tolerance_s) && bad_ts++ == 0) {
        ts_msg = StrCat("row ", r, " (frame ", k, "): timestamp ", Num(ts), " s, frame_index / fps = ",
                        Num(want), " s at ", Num(fps), " fps (tolerance ", Num(options_.tolerance_s),
                        " s)");
      }
    }
    if (bad_frame > 0) {
      Error(e, "", name, "frame_index", StrCat(frame_msg, "; ", bad_frame, " of ", count, " rows off"));
    }
    if (bad_index > 0) {
      Error(e, "", name, "index", StrCat(index_msg, "; ", bad_index, " of ", count, " rows off"));
    }
    if (bad_ts > 0) {
      Error(e, "", name, "timestamp", StrCat(ts_msg, "; ", bad_ts, " of ", count, " rows off"));
    }
  }

  // One demuxed mp4: its shown frames' times in seconds, sorted, and its frame rate.
  struct VideoProbe {
    absl::Status status;
    bool missing = false;
    std::vector<double> times;
    double rate = 0;
  };

  const VideoProbe& Probe(const std::string& path, const std::string& key) {
    auto [it, fresh] = probes_.try_emplace(path);
    VideoProbe& p = it->second;
    if (!fresh) return p;
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = ds_.storage().Open(path);
    if (!file.ok()) {
      p.missing = absl::IsNotFound(file.status());
      p.status = file.status();
      return p;
    }
    absl::StatusOr<DemuxedStream> d =
        DemuxBestStream(**file, MediaKind::kVideo, key, /*keep_bytes=*/false);
    if (!d.ok()) {
      p.status = d.status();
      return p;
    }
    const double tb = static_cast<double>(d->stream.time_base_num) / d->stream.time_base_den;
    for (const EpisodeData::Packet& packet : d->stream.packets) {
      if (packet.pts >= d->stream.pts_origin) p.times.push_back(static_cast<double>(packet.pts) * tb);
    }
    std::sort(p.times.begin(), p.times.end());
    p.rate = d->stream.info.rate;
    return p;
  }

  // Each camera of episode `i`: its mp4 is there and demuxes, and the frames of the episode's
  // segment agree with its length and its rows' timestamps (k / fps).
  void CheckCameras(size_t i) {
    const lerobot::Meta& meta = *meta_;
    const lerobot::Episode& ep = meta.episodes[i];
    const int64_t e = static_cast<int64_t>(i);
    const double half = 0.5 / meta.fps;
    for (const auto& [key, seg] : ep.videos) {
      const std::string name = ds_.storage().Describe(seg.path);
      const VideoProbe& p = Probe(seg.path, key);
      if (!p.status.ok()) {
        Error(e, key, name, p.missing ? "video_missing" : "video_unreadable",
              p.missing ? StrCat("not there; named by the episode metadata (", ep.source,
                                 ") and info.json's video_path")
                        : std::string(p.status.message()));
        continue;
      }
      // Once per file (a v3.0 mp4 holds many episodes), at its first episode.
      if (p.rate > 0 && std::fabs(p.rate - meta.fps) > 0.005 * meta.fps &&
          rate_reported_.insert(seg.path).second) {
        Warning(e, key, name, "fps_mismatch",
                StrCat("the file's frame rate is ", Num(p.rate), " fps, info.json says ",
                       Num(meta.fps), " fps"));
      }
      // The segment: the frames nearest [from_timestamp, to_timestamp), as the reader cuts it.
      const auto first_it = std::lower_bound(p.times.begin(), p.times.end(), seg.from_s - half);
      const size_t first = static_cast<size_t>(first_it - p.times.begin());
      if (first == p.times.size() || std::fabs(p.times[first] - seg.from_s) > half) {
        Error(e, key, name, "frame_count",
              StrCat("no frame at from_timestamp ", Num(seg.from_s), " s (the file's ",
                     p.times.size(), " frames end at ",
                     p.times.empty() ? std::string("-") : Num(p.times.back()), " s)"));
        continue;
      }
      size_t end = p.times.size();
      if (seg.to_s.has_value()) {
        end = first;
        while (end < p.times.size() && p.times[end] < *seg.to_s - half) ++end;
      }
      const int64_t frames = static_cast<int64_t>(end - first);
      if (frames != ep.length) {
        Error(e, key, name, "frame_count",
              StrCat(frames, " frames",
                     seg.to_s.has_value()
                         ? StrCat(" between from_timestamp ", Num(seg.from_s), " s and to_timestamp ",
                                  Num(*seg.to_s), " s")
                         : std::string(" in the file"),
                     ", the episode has length ", ep.length, " (", ep.source, ")"));
        continue;
      }
      for (int64_t k = 0; k < frames; ++k) {
        const double at = p.times[first + static_cast<size_t>(k)] - p.times[first];
        const double want = static_cast<double>(k) / meta.fps;
        if (std::fabs(at - want) > options_.tolerance_s) {
          Error(e, key, name, "frame_time",
                StrCat("frame ", k, " is ", Num(at), " s after the episode's first, frame_index / fps = ",
                       Num(want), " s (off by ", Num(std::fabs(at - want)), " s, tolerance ",
                       Num(options_.tolerance_s), " s)"));
          break;
        }
      }
    }
  }

  const Dataset& ds_;
  const CheckOptions options_;
  CheckReport report_;
  std::set<int64_t> with_errors_;
  const lerobot::Meta* meta_ = nullptr;
  std::map<std::string, VideoProbe> probes_;
  std::set<std::string> rate_reported_;  // mp4s whose frame rate has been reported
  VideoDecoder decoder_;
  uint64_t next_key_ = 1;
};

}  // namespace

size_t CheckReport::errors() const {
  return static_cast<size_t>(std::count_if(findings.begin(), findings.end(), [](const CheckFinding& f) {
    return f.severity == CheckSeverity::kError;
  }));
}

size_t CheckReport::warnings() const { return findings.size() - errors(); }

std::set<int64_t> CheckReport::EpisodesWithErrors() const {
  std::set<int64_t> out;
  for (const CheckFinding& f : findings) {
    if (f.severity == CheckSeverity::kError && f.episode >= 0) out.insert(f.episode);
  }
  return out;
}

CheckReport CheckDataset(const Dataset& dataset, const CheckOptions& options) {
  return Doctor(dataset, options).Run();
}

CheckReport OpenFailureReport(const std::string& uri, const absl::Status& status) {
  CheckReport r;
  r.uri = uri;
  r.findings.push_back(CheckFinding{CheckSeverity::kError, "", -1, "", uri, "open_failed",
                                    std::string(status.message())});
  return r;
}

std::string CheckSeverityName(CheckSeverity severity) {
  return severity == CheckSeverity::kError ? "error" : "warning";
}

}  // namespace conveyor
