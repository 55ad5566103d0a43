// `conveyor import --lerobot DIR`: a LeRobot dataset (v3.0 or v2.1) -> a Conveyor dataset,
// losslessly. Video packets are remuxed, never re-encoded: for v3.0 each episode is cut out of
// its camera's concatenated mp4 by from/to timestamp, frame-exact, and must start on a keyframe.
// Numeric Parquet columns become lowdim streams (float32 values kept bit for bit), embedded
// images become image streams, the task becomes the `instruction` text stream. LeRobot's own
// index columns (timestamp, frame_index, episode_index, index, task_index) are checked against
// info.json and the videos, never imported as streams. docs/lerobot.md has the mapping.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/strings.h"
#include "decoders/internal/av_codec_params.h"
#include "decoders/internal/av_util.h"
#include "readers/dataset_writer.h"
#include "readers/lerobot/lerobot_meta.h"
#include "readers/parquet/parquet_file.h"
#include "readers/storage.h"
#include "tools/commands.h"
#include "tools/import_media.h"

namespace conveyor::tools {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using lerobot::Episode;
using lerobot::Feature;
using lerobot::Meta;

constexpr std::string_view kInstructionStream = "instruction";

bool IsNumericDtype(std::string_view dtype) {
  static const std::set<std::string_view> kNumeric = {
      "float16", "float32", "float64", "int8",   "int16",  "int32", "int64",
      "uint8",   "uint16",  "uint32",  "uint64", "bool",   "double", "float"};
  return kNumeric.count(dtype) > 0;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) StrAppend(&s, s.empty() ? "" : ", ", "\"", x, "\"");
  return s;
}

// ---------------------------------------------------------------------------------------------
// Data files: the frame rows of one parquet, read once for all the episodes it holds.

struct DataFile {
  std::string path;  // relative
  std::string name;  // full, for messages
  int64_t rows = 0;
  std::vector<int64_t> episode_index, frame_index, index, task_index;
  std::vector<double> timestamp;  // float32 in LeRobot's files, widened exactly
  std::map<std::string, parquet::Column> columns;  // lowdim and image features, by key
  std::map<int64_t, std::pair<int64_t, int64_t>> episode_rows;  // episode -> (first row, count)
};

absl::StatusOr<std::vector<double>> ReadTimestampColumn(const parquet::ParquetFile& file) {
  ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn("timestamp"));
  if (!c.lists.empty() || c.null_count != 0) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column 'timestamp' is not a flat non-null number column"));
  }
  if (const auto* f = std::get_if<std::vector<float>>(&c.values)) {
    return std::vector<double>(f->begin(), f->end());
  }
  if (const auto* d = std::get_if<std::vector<double>>(&c.values)) return *d;
  return absl::InvalidArgumentError(StrCat(file.name(), ": column 'timestamp' is ",
                                           parquet::PhysicalTypeName(c.descriptor.physical_type),
                                           ", expected FLOAT or DOUBLE"));
}

absl::StatusOr<std::unique_ptr<DataFile>> LoadDataFile(Storage& storage, const std::string& path,
                                                       int64_t episode,
                                                       const std::vector<const Feature*>& lowdim,
                                                       const std::vector<const Feature*>& images) {
  auto out = std::make_unique<DataFile>();
  out->path = path;
  out->name = storage.Describe(path);
  absl::StatusOr<parquet::ParquetFile> pf = lerobot::OpenParquet(storage, path);
  if (absl::IsNotFound(pf.status())) {
    return absl::NotFoundError(StrCat(out->name, " is missing (the data file of episode ", episode,
                                      ", named by the episode metadata and info.json's ",
                                      "data_path)"));
  }
  if (!pf.ok()) return pf.status();
  out->rows = pf->num_rows();
  ASSIGN_OR_RETURN(out->episode_index, lerobot::ReadIntColumn(*pf, "episode_index"));
  ASSIGN_OR_RETURN(out->frame_index, lerobot::ReadIntColumn(*pf, "frame_index"));
  ASSIGN_OR_RETURN(out->index, lerobot::ReadIntColumn(*pf, "index"));
  ASSIGN_OR_RETURN(out->task_index, lerobot::ReadIntColumn(*pf, "task_index"));
  ASSIGN_OR_RETURN(out->timestamp, ReadTimestampColumn(*pf));
  for (const Feature* f : lowdim) {
    ASSIGN_OR_RETURN(out->columns[f->key], pf->ReadColumn(f->key));
  }
  for (const Feature* f : images) {
    // The Hugging Face Image feature: a struct {bytes: binary, path: string}.
    absl::StatusOr<parquet::Column> c = pf->ReadColumn(f->key + ".bytes");
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          StrCat(out->name, ": image feature '", f->key, "' has no '", f->key,
                 ".bytes' column (images must be embedded as the Hugging Face Image struct ",
                 "{bytes, path}): ", c.status().message()));
    }
    out->columns[f->key] = *std::move(c);
  }
  // Each episode's rows must be one contiguous run.
  for (int64_t r = 0; r < out->rows; ++r) {
    const int64_t e = out->episode_index[static_cast<size_t>(r)];
    auto [it, inserted] = out->episode_rows.emplace(e, std::make_pair(r, int64_t{0}));
    if (!inserted && it->second.first + it->second.second != r) {
      return absl::InvalidArgumentError(
          StrCat(out->name, ": the rows of episode ", e, " are not contiguous (row ", r,
                 " after rows ", it->second.first, "..", it->second.first + it->second.second - 1,
                 " and others between)"));
    }
    ++it->second.second;
  }
  return out;
}

// The value slots [begin, end) of row `row` of a (possibly nested) list column.
absl::Status RowSlots(const parquet::Column& c, int64_t row, int64_t* begin, int64_t* end,
                      const std::string& where) {
  int64_t b = row, e = row + 1;
  for (const parquet::ListLevel& level : c.lists) {
    for (int64_t i = b; i < e; ++i) {
      if (!level.valid[static_cast<size_t>(i)]) {
        return absl::InvalidArgumentError(StrCat(where, ": a null list"));
      }
    }
    b = level.offsets[static_cast<size_t>(b)];
    e = level.offsets[static_cast<size_t>(e)];
  }
  *begin = b;
  *end = e;
  return absl::OkStatus();
}

// Rows [first, first + count) of a numeric feature column as float32 [count, D]. float32 values
// are copied bit for bit; other types are converted, and `inexact` counts values that float32
// cannot hold exactly.
absl::Status LowdimRows(const parquet::Column& c, const Feature& f, int64_t first, int64_t count,
                        const std::string& where, std::vector<float>* out, int64_t* inexact) {
  const int64_t dim = f.elements();
  out->resize(static_cast<size_t>(count * dim));
  if (c.null_count != 0) {
    return absl::InvalidArgumentError(StrCat(where, ": column '", f.key, "' has null values"));
  }
  for (int64_t r = 0; r < count; ++r) {
    int64_t b = 0, e = 0;
    RETURN_IF_ERROR(RowSlots(c, first + r, &b, &e, StrCat(where, " row ", first + r)));
    if (e - b != dim) {
      return absl::InvalidArgumentError(StrCat(where, " row ", first + r, ": '", f.key, "' holds ",
                                               e - b, " values, info.json's shape says ", dim));
    }
    float* dst = out->data() + r * dim;
    const absl::Status s = std::visit(
        [&](const auto& v) -> absl::Status {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, parquet::BinaryValues>) {
            return absl::InvalidArgumentError(
                StrCat(where, ": column '", f.key, "' holds bytes, not numbers"));
          } else if constexpr (std::is_same_v<V, std::vector<float>>) {
            std::memcpy(dst, v.data() + b, static_cast<size_t>(dim) * sizeof(float));
            return absl::OkStatus();
          } else {
            for (int64_t i = 0; i < dim; ++i) {
              const auto x = v[static_cast<size_t>(b + i)];
              dst[i] = static_cast<float>(x);
              if (static_cast<double>(dst[i]) != static_cast<double>(x)) ++*inexact;
            }
            return absl::OkStatus();
          }
        },
        c.values);
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Embedded images: each row's bytes are one packet. Every image is decoded once here, so a
// corrupt or differently sized one is caught at import, naming its row.

absl::StatusOr<pb::CodecParams> ProbeImageBytes(std::string_view bytes, const std::string& where) {
  AVCodecID id = AV_CODEC_ID_NONE;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    id = AV_CODEC_ID_PNG;
  } else if (bytes.size() >= 3 && std::memcmp(bytes.data(), "\xff\xd8\xff", 3) == 0) {
    id = AV_CODEC_ID_MJPEG;
  } else {
    return absl::InvalidArgumentError(StrCat(where, ": not a PNG or JPEG image"));
  }
  av::QuietLogging();
  const AVCodec* codec = avcodec_find_decoder(id);
  if (codec == nullptr) return absl::InternalError(StrCat("no decoder for ", avcodec_get_name(id)));
  av::UniqueCodecContext ctx(avcodec_alloc_context3(codec));
  if (ctx == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating a decoder");
  int ret = avcodec_open2(ctx.get(), codec, nullptr);
  if (ret < 0) return av::AvError(ret, StrCat(where, ": opening the image decoder"));
  av::UniquePacket pkt = av::MakePacket();
  av::UniqueFrame frame = av::MakeFrame();
  if (pkt == nullptr || frame == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating");
  pkt->data = reinterpret_cast<uint8_t*>(const_cast<char*>(bytes.data()));
  pkt->size = static_cast<int>(bytes.size());
  ret = avcodec_send_packet(ctx.get(), pkt.get());
  if (ret >= 0) ret = avcodec_send_packet(ctx.get(), nullptr);
  if (ret >= 0) ret = avcodec_receive_frame(ctx.get(), frame.get());
  if (ret < 0) return av::AvError(ret, StrCat(where, ": the image does not decode"));
  av::UniqueCodecParameters par(avcodec_parameters_alloc());
  if (par == nullptr) return av::AvError(AVERROR(ENOMEM), "allocating");
  ret = avcodec_parameters_from_context(par.get(), ctx.get());
  if (ret < 0) return av::AvError(ret, "codec parameters");
  par->width = frame->width;
  par->height = frame->height;
  par->format = frame->format;
  return av::CodecParamsFromAv(*par, 0);
}

absl::StatusOr<EpisodeData::Stream> ImageRows(const parquet::Column& c, const Feature& f,
                                              const Meta& meta, int64_t first, int64_t count,
                                              const std::string& where) {
  const auto* bytes = std::get_if<parquet::BinaryValues>(&c.values);
  if (bytes == nullptr || !c.lists.empty()) {
    return absl::InvalidArgumentError(StrCat(where, ": '", f.key, ".bytes' is not a binary column"));
  }
  EpisodeData::Stream out;
  out.info.name = f.key;
  out.info.kind = pb::IMAGE;
  out.info.rate = meta.fps;
  const AVRational q = av_d2q(meta.fps, 1 << 20);
  out.time_base_num = q.den;
  out.time_base_den = q.num;
  for (int64_t r = 0; r < count; ++r) {
    const size_t row = static_cast<size_t>(first + r);
    const std::string at = StrCat(where, " row ", first + r, " ('", f.key, "')");
    if (!c.valid[row] || (*bytes)[row].empty()) {
      return absl::InvalidArgumentError(
          StrCat(at, ": no image bytes (only images embedded in the parquet are read; a dataset ",
                 "still pointing at image files must be pushed or re-saved with embedded images)"));
    }
    ASSIGN_OR_RETURN(pb::CodecParams params, ProbeImageBytes((*bytes)[row], at));
    if (r == 0) {
      out.codec = params;
      out.info.codec = params.codec();
      out.info.pix_fmt = params.pix_fmt();
      out.info.shape = {params.height(), params.width(), 3};
    } else if (params.codec() != out.codec.codec() || params.width() != out.codec.width() ||
               params.height() != out.codec.height()) {
      return absl::InvalidArgumentError(
          StrCat(at, ": ", params.codec(), " ", params.width(), "x", params.height(),
                 ", the episode's first image is ", out.codec.codec(), " ", out.codec.width(), "x",
                 out.codec.height(), "; every image of a stream must match"));
    }
    EpisodeData::Packet& p = out.packets.emplace_back();
    p.bytes = std::string((*bytes)[row]);
    p.pts = p.dts = r;
    p.duration = 1;
    p.key = true;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Videos: one camera's file demuxed once (a v3.0 file holds many episodes), then cut.

struct DemuxedVideo {
  std::string path;  // relative
  std::string name;  // full, for messages
  EpisodeData::Stream stream;
  std::vector<size_t> shown;  // packet indices of the presented frames, in pts order
};

absl::StatusOr<std::unique_ptr<DemuxedVideo>> DemuxVideo(Storage& storage, const fs::path& root,
                                                         const std::string& path,
                                                         const std::string& key,
                                                         int64_t episode) {
  auto out = std::make_unique<DemuxedVideo>();
  out->path = path;
  out->name = storage.Describe(path);
  std::error_code ec;
  if (!fs::exists(root / path, ec)) {
    return absl::NotFoundError(StrCat(out->name, " is missing (episode ", episode, ", camera '", key,
                                      "', named by the episode metadata and info.json's ",
                                      "video_path)"));
  }
  ASSIGN_OR_RETURN(out->stream, DemuxMediaFile((root / path).string(), MediaKind::kVideo, key));
  const auto& packets = out->stream.packets;
  for (size_t i = 0; i < packets.size(); ++i) {
    // Frames before the stream's start (an edit list's hidden lead-in) are references only.
    if (packets[i].pts >= out->stream.pts_origin) out->shown.push_back(i);
  }
  std::stable_sort(out->shown.begin(), out->shown.end(),
                   [&](size_t a, size_t b) { return packets[a].pts < packets[b].pts; });
  return out;
}

// Cuts `length` frames of episode `ep` out of `video`: the frames whose presentation time lies in
// [from, to) (each rounded to the nearest frame; LeRobot's from_timestamp is a float sum of
// durations and the concat demuxer shifts later files by a few ticks), with their packets, which
// must be one contiguous run in decode order starting with a keyframe. Timestamps are rebased so
// that the episode's first frame is t = 0. `row_ts` are the episode's data timestamps, which
// every frame must match within `tolerance_s` (relative to the first).
absl::StatusOr<EpisodeData::Stream> CutEpisode(const DemuxedVideo& video, const Episode& ep,
                                               const lerobot::VideoSegment& seg,
                                               const std::string& key, const Meta& meta,
                                               const std::vector<double>& row_ts,
                                               double tolerance_s) {
  const EpisodeData::Stream& s = video.stream;
  const auto& packets = s.packets;
  const double tb = static_cast<double>(s.time_base_num) / s.time_base_den;
  const double half = 0.5 / meta.fps;
  const std::string where = StrCat("episode ", ep.index, ", camera '", key, "', ", video.name);
  auto time_of = [&](size_t shown) { return static_cast<double>(packets[video.shown[shown]].pts) * tb; };
  const size_t n_shown = video.shown.size();

  // The first frame: the one nearest from_timestamp.
  size_t first = std::lower_bound(video.shown.begin(), video.shown.end(), seg.from_s - half,
                                  [&](size_t p, double t) {
                                    return static_cast<double>(packets[p].pts) * tb < t;
                                  }) -
                 video.shown.begin();
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
  const int64_t origin = packets[video.shown[first]].pts;
  for (int64_t k = 0; k < frames; ++k) {
    const double t = static_cast<double>(packets[video.shown[first + k]].pts - origin) * tb;
    const double want = row_ts[static_cast<size_t>(k)] - row_ts[0];
    if (std::fabs(t - want) > tolerance_s) {
      return absl::InvalidArgumentError(
          StrCat(where, ": frame ", k, " of the episode is at ", t,
                 " s from its first frame, the data row says ", want, " s (off by ",
                 std::fabs(t - want), " s, over the tolerance of ", tolerance_s,
                 " s); check info.json's fps (", meta.fps, ") and the video's frame rate"));
    }
  }

  // Its packets: one contiguous run in decode order, starting with a keyframe.
  size_t lo = packets.size(), hi = 0;
  for (size_t k = first; k < end; ++k) {
    lo = std::min(lo, video.shown[k]);
    hi = std::max(hi, video.shown[k]);
  }
  for (size_t p = lo; p <= hi; ++p) {
    const bool in_episode = packets[p].pts >= origin &&
                            (end == n_shown || packets[p].pts < packets[video.shown[end]].pts);
    if (!in_episode) {
      return absl::InvalidArgumentError(StrCat(
          where, ": packet ", p, " (pts ", packets[p].pts, ") lies inside the episode's run of ",
          "packets in decode order but belongs to another episode; episodes must be cut at ",
          "closed GOP boundaries"));
    }
  }
  if (!packets[lo].key) {
    return absl::InvalidArgumentError(StrCat(
        where, ": the episode does not start on a keyframe (its first packet in decode order, ",
        "packet ", lo, " at pts ", packets[lo].pts,
        ", is not a keyframe), so it cannot be cut out without re-encoding; LeRobot's writer ",
        "starts every episode with one: check how this file was made"));
  }

  EpisodeData::Stream out;
  out.info = s.info;
  out.info.rate = meta.fps;
  out.codec = s.codec;
  out.time_base_num = s.time_base_num;
  out.time_base_den = s.time_base_den;
  out.pts_origin = 0;
  out.packets.reserve(hi - lo + 1);
  for (size_t p = lo; p <= hi; ++p) {
    EpisodeData::Packet pk = packets[p];
    pk.pts -= origin;
    pk.dts -= origin;
    out.packets.push_back(std::move(pk));
  }
  return out;
}

// info.json's description of a camera against the file.
absl::Status CheckVideoFeature(const Feature& f, const EpisodeData::Stream& s,
                               const std::string& info_name, const std::string& file) {
  const int64_t h = s.codec.height(), w = s.codec.width();
  if (f.shape.size() == 3) {
    const bool hwc = f.shape[0] == h && f.shape[1] == w;
    const bool chw = f.shape[1] == h && f.shape[2] == w;
    if (!hwc && !chw) {
      return absl::InvalidArgumentError(StrCat(info_name, ": features.", f.key, ".shape is [",
                                               f.shape[0], ", ", f.shape[1], ", ", f.shape[2],
                                               "], but ", file, " is ", w, "x", h));
    }
  }
  if (!f.video_codec.empty() && f.video_codec != s.info.codec) {
    return absl::InvalidArgumentError(StrCat(info_name, ": features.", f.key,
                                             ".info says video.codec \"", f.video_codec, "\", but ",
                                             file, " is ", s.info.codec));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

class LeRobotImporter {
 public:
  LeRobotImporter(const ImportOptions& options, std::string root)
      : options_(options), root_(std::move(root)), storage_(NewLocalStorage(root_)) {}

  // Reads and checks the metadata, and puts the dataset's own statistics into `wopts`. Writes
  // nothing.
  absl::Status Prepare(DatasetWriter::Options* wopts) {
    ASSIGN_OR_RETURN(meta_, lerobot::ReadMeta(*storage_, root_));
    info_name_ = storage_->Describe(lerobot::kInfoPath);
    std::vector<std::string> skipped;
    for (const Feature& f : meta_.features) {
      if (f.is_video()) {
        videos_.push_back(&f);
      } else if (f.is_image()) {
        images_.push_back(&f);
      } else if (lerobot::IsIndexColumn(f.key)) {
        continue;
      } else if (IsNumericDtype(f.dtype)) {
        lowdim_.push_back(&f);
      } else {
        skipped.push_back(StrCat(f.key, " (", f.dtype, ")"));
      }
    }
    for (const std::string& s : skipped) {
      spdlog::warn("import: feature {} is not imported (only numeric, image and video features "
                   "are; see docs/lerobot.md)", s);
    }
    for (const Feature* f : lowdim_) {
      auto it = meta_.stats.find(f->key);
      if (it == meta_.stats.end()) continue;
      const lerobot::FeatureStats& st = it->second;
      const size_t dim = static_cast<size_t>(f->elements());
      if (st.mean.size() != dim || st.std.size() != dim || st.min.size() != dim ||
          st.max.size() != dim) {
        return absl::InvalidArgumentError(
            StrCat(storage_->Describe(meta_.stats_source), ": statistics of '", f->key,
                   "' do not have its dimension ", dim, " (info.json's shape)"));
      }
      StreamStats& out = wopts->stats[f->key];
      out.mean = st.mean;
      out.std = st.std;
      out.min = st.min;
      out.max = st.max;
      out.count = st.count;
      for (const auto& [q, v] : st.quantiles) {
        if (v.size() == dim) out.quantiles[q] = v;
      }
    }
    return absl::OkStatus();
  }

  absl::Status Write(DatasetWriter* writer, const std::string& out) {
    for (const Episode& ep : meta_.episodes) {
      ASSIGN_OR_RETURN(EpisodeData data, ReadEpisode(ep));
      RETURN_IF_ERROR(writer->AddEpisode(data));
      if (options_.progress) {
        std::fprintf(stderr, "import: %lld/%zu episodes\n", static_cast<long long>(ep.index + 1),
                     meta_.episodes.size());
      }
    }
    for (const auto& [key, n] : inexact_) {
      if (n == 0) continue;
      spdlog::warn("import: {} values of '{}' are not exactly representable as float32 and were "
                   "rounded", n, key);
    }
    ASSIGN_OR_RETURN(Manifest manifest, writer->Finish());
    if (options_.progress) {
      std::fprintf(stderr,
                   "import: LeRobot %s dataset %s -> %llu episodes, %zu streams, %.1f s, %llu "
                   "bytes in %s\n",
                   meta_.codebase_version.c_str(), root_.c_str(),
                   static_cast<unsigned long long>(manifest.num_episodes), manifest.streams.size(),
                   manifest.total_duration_s,
                   static_cast<unsigned long long>(manifest.total_bytes), out.c_str());
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<EpisodeData> ReadEpisode(const Episode& ep) {
    if (data_ == nullptr || data_->path != ep.data_path) {
      data_.reset();
      ASSIGN_OR_RETURN(data_, LoadDataFile(*storage_, ep.data_path, ep.index, lowdim_, images_));
    }
    const DataFile& d = *data_;
    const std::string where = StrCat(d.name, ", episode ", ep.index);
    auto rows_it = d.episode_rows.find(ep.index);
    const int64_t rows = rows_it == d.episode_rows.end() ? 0 : rows_it->second.second;
    if (rows != ep.length) {
      return absl::InvalidArgumentError(StrCat(where, ": ", rows, " rows, but the episode ",
                                               "metadata (", ep.source, ") says length ",
                                               ep.length));
    }
    if (meta_.version == lerobot::Version::kV21 && d.rows != rows) {
      return absl::InvalidArgumentError(StrCat(where, ": the file holds ", d.rows - rows,
                                               " rows of other episodes"));
    }
    const int64_t first = rows_it->second.first;
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
      if (!std::isfinite(d.timestamp[r]) ||
          std::fabs(d.timestamp[r] - want) > options_.tolerance_s) {
        return absl::InvalidArgumentError(StrCat(
            where, " row ", first + i, " (frame_index ", i, "): timestamp ", d.timestamp[r],
            " s, but frame_index / fps = ", want, " s with fps ", meta_.fps, " from ", info_name_,
            " (off by more than ", options_.tolerance_s, " s); check fps in info.json"));
      }
    }

    EpisodeData out;
    out.source = where;
    for (const Feature* f : videos_) {
      const lerobot::VideoSegment& seg = ep.videos.at(f->key);
      std::unique_ptr<DemuxedVideo>& cached = videos_cache_[f->key];
      if (cached == nullptr || cached->path != seg.path) {
        cached.reset();
        ASSIGN_OR_RETURN(cached, DemuxVideo(*storage_, root_, seg.path, f->key, ep.index));
        RETURN_IF_ERROR(CheckVideoFeature(*f, cached->stream, info_name_, cached->name));
      }
      ASSIGN_OR_RETURN(EpisodeData::Stream s,
                       CutEpisode(*cached, ep, seg, f->key, meta_, ts, options_.tolerance_s));
      out.streams.push_back(std::move(s));
    }
    for (const Feature* f : images_) {
      ASSIGN_OR_RETURN(EpisodeData::Stream s,
                       ImageRows(d.columns.at(f->key), *f, meta_, first, rows, where));
      out.streams.push_back(std::move(s));
    }
    for (const Feature* f : lowdim_) {
      EpisodeData::Stream& s = out.streams.emplace_back();
      s.info.name = f->key;
      s.info.kind = pb::LOWDIM;
      s.info.codec = "zstd-shuffle4";
      s.codec.set_codec(s.info.codec);
      s.info.rate = meta_.fps;
      s.info.shape = {f->elements()};
      s.info.names = f->names;
      if (s.info.names.empty()) {
        for (int64_t i = 0; i < f->elements(); ++i) s.info.names.push_back(StrCat(f->key, "_", i));
      }
      RETURN_IF_ERROR(LowdimRows(d.columns.at(f->key), *f, first, rows, where, &s.values,
                                 &inexact_[f->key]));
      s.timestamps_s = ts;
    }
    // The instruction: the task of the episode's first frame.
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
    for (int64_t i = 1; i < rows; ++i) {
      if (d.task_index[static_cast<size_t>(first + i)] != task_index) {
        spdlog::warn("import: {} changes task at frame {}; the instruction is the first task, "
                     "\"{}\"", where, i, task->second);
        break;
      }
    }
    EpisodeData::Stream& text = out.streams.emplace_back();
    text.info.name = std::string(kInstructionStream);
    text.info.kind = pb::TEXT;
    text.info.codec = "utf-8";
    text.codec.set_codec(text.info.codec);
    text.text = task->second;
    // Kind, then name: the order `conveyor import` gives folders.
    auto kind_order = [](pb::StreamKind k) {
      return k == pb::VIDEO ? 0 : k == pb::IMAGE ? 1 : k == pb::AUDIO ? 2 : k == pb::LOWDIM ? 3 : 4;
    };
    std::stable_sort(out.streams.begin(), out.streams.end(), [&](const auto& a, const auto& b) {
      const int ka = kind_order(a.info.kind), kb = kind_order(b.info.kind);
      return ka != kb ? ka < kb : a.info.name < b.info.name;
    });
    return out;
  }

  const ImportOptions& options_;
  std::string root_;
  std::unique_ptr<Storage> storage_;
  Meta meta_;
  std::string info_name_;
  std::vector<const Feature*> videos_, images_, lowdim_;
  std::unique_ptr<DataFile> data_;
  std::map<std::string, std::unique_ptr<DemuxedVideo>> videos_cache_;
  std::map<std::string, int64_t> inexact_;
};

}  // namespace

bool IsLeRobotRoot(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / lerobot::kInfoPath, ec)) return false;
  std::unique_ptr<Storage> storage = NewLocalStorage(dir);
  return lerobot::LooksLikeLeRobot(*storage);
}

absl::Status RunImportLeRobot(const ImportOptions& options) {
  const std::string root = options.lerobot.empty() ? options.from : options.lerobot;
  if (root.empty()) return absl::InvalidArgumentError("no LeRobot dataset given");
  if (options.out.empty()) return absl::InvalidArgumentError("no output folder given");
  if (!(options.tolerance_s > 0)) {
    return absl::InvalidArgumentError("--tolerance-s must be positive");
  }
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(root) / lerobot::kInfoPath, ec)) {
    return absl::NotFoundError(StrCat(root, " is not a LeRobot dataset (no ", lerobot::kInfoPath,
                                      ")"));
  }
  DatasetWriter::Options wopts;
  wopts.name = options.name;
  if (wopts.name.empty()) {
    fs::path p(root);
    if (!p.has_filename()) p = p.parent_path();
    wopts.name = fs::absolute(p, ec).filename().string();
    if (wopts.name.empty()) wopts.name = "dataset";
  }
  wopts.created_by = "conveyor import (LeRobot)";
  wopts.episodes_per_shard = options.episodes_per_shard;
  LeRobotImporter importer(options, root);
  RETURN_IF_ERROR(importer.Prepare(&wopts));
  const bool out_existed = fs::exists(options.out, ec);
  absl::Status status;
  {
    auto writer = DatasetWriter::Create(options.out, wopts);
    if (!writer.ok()) return writer.status();
    status = importer.Write(writer->get(), options.out);
  }
  if (!status.ok()) RemovePartialImport(options.out, out_existed);
  return status;
}

}  // namespace conveyor::tools
