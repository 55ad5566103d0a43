// `conveyor extract`: one stream of one episode back out as a standard file. Video and audio
// packets are muxed as stored (no re-encode; media/media_writer.h), so the file decodes to the
// same frames as the imported original. docs/import.md lists the formats.

#include <spdlog/spdlog.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "media/media_writer.h"
#include "datasets/dataset.h"
#include "format/format.h"
#include "format/npy.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;

constexpr std::array<std::string_view, 4> kVideoOut = {".mp4", ".mkv", ".webm", ".mov"};
constexpr std::array<std::string_view, 10> kAudioOut = {".m4a",  ".mka", ".mkv", ".ogg",  ".opus",
                                                        ".flac", ".wav", ".mp3", ".webm", ".mp4"};

template <size_t N>
std::string JoinList(const std::array<std::string_view, N>& list) {
  std::string s;
  for (std::string_view e : list) StrAppend(&s, s.empty() ? "" : ", ", e);
  return s;
}

std::string LowerExtension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

// Removes a partly written output unless Commit() is called, so a failed extract leaves nothing
// that looks like a finished file. `remove_all`: the output is a folder this run created.
class PartialOutput {
 public:
  PartialOutput(std::string path, bool remove_all) : path_(std::move(path)), all_(remove_all) {}
  ~PartialOutput() {
    if (committed_) return;
    std::error_code ec;
    if (all_) {
      fs::remove_all(path_, ec);
    } else if (fs::is_regular_file(path_, ec)) {
      fs::remove(path_, ec);
    }
  }
  PartialOutput(const PartialOutput&) = delete;
  PartialOutput& operator=(const PartialOutput&) = delete;
  void Commit() { committed_ = true; }

 private:
  std::string path_;
  bool all_;
  bool committed_ = false;
};

absl::Status WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(StrCat("cannot create ", path));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return absl::UnavailableError(StrCat("cannot write ", path, " (disk full?)"));
  return absl::OkStatus();
}

// VIDEO and AUDIO: the stored packets, timestamps shifted so that the file's t = 0 is the
// episode's t = 0 (pts_origin), into the container `out`'s extension names.
absl::Status MuxPackets(const Dataset& ds, const pb::EpisodeIndex& index, int stream,
                        const std::string& out) {
  const pb::StreamIndex& si = index.streams(stream);
  const bool video = si.kind() == pb::VIDEO;
  const std::string ext = LowerExtension(out);
  const std::string where = StrCat("episode ", index.episode_id(), " stream '", si.name(), "' (",
                                   si.codec().codec(), ")");
  MuxedStream muxed;
  muxed.kind = video ? MediaKind::kVideo : MediaKind::kAudio;
  muxed.codec = si.codec();
  muxed.time_base_num = si.time_base_num();
  muxed.time_base_den = si.time_base_den();
  if (video) {
    const int s = ds.manifest().StreamIndex(si.name());
    muxed.frame_rate = s >= 0 ? ds.manifest().streams[static_cast<size_t>(s)].rate : 0;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<MediaFileWriter> writer,
                   MediaFileWriter::Create(out, muxed, where));
  const double rotation = si.codec().rotation_deg();
  if (video && rotation != 0 && ext != ".mp4" && ext != ".mov") {
    // FFmpeg 5.1's Matroska muxer has no place for a display matrix.
    spdlog::warn(
        "extract: {} does not keep the stored rotation of {} degrees; use .mp4 or "
        ".mov to keep it",
        out, rotation);
  }
  // From here on a failure removes the partly written file (MediaFileWriter).
  RETURN_IF_ERROR(writer->Start());

  const pb::PacketTable& t = si.packets();
  std::string bytes;
  for (int p = 0; p < t.offset_size(); ++p) {
    RETURN_IF_ERROR(ds.ReadPacket(index, stream, static_cast<size_t>(p), &bytes));
    RETURN_IF_ERROR(writer->WritePacket(bytes, t.pts(p) - si.pts_origin(),
                                        t.dts(p) - si.pts_origin(), t.duration(p),
                                        (t.flags(p) & format::kPacketKey) != 0,
                                        (t.flags(p) & format::kPacketDiscard) != 0));
  }
  return writer->Finish();
}

// LOWDIM: float32 [T, D] to `out`, float64 seconds [T] to <out stem>.timestamps.npy.
absl::Status WriteLowdim(const Dataset& ds, const pb::EpisodeIndex& index, int stream,
                         const std::string& out) {
  const pb::StreamIndex& si = index.streams(stream);
  std::vector<float> values;
  RETURN_IF_ERROR(ds.ReadLowdim(index, stream, 0, si.num_frames(), &values));
  const int64_t steps = static_cast<int64_t>(si.num_frames());
  const int64_t dim = si.blocks().dim();
  const std::vector<double> ts(si.timestamps_s().begin(), si.timestamps_s().end());
  if (static_cast<int64_t>(ts.size()) != steps) {
    return absl::DataLossError(StrCat("episode ", index.episode_id(), " stream '", si.name(),
                                      "' has ", ts.size(), " timestamps for ", steps, " steps"));
  }
  const std::string ts_path = fs::path(out).replace_extension(".timestamps.npy").string();
  PartialOutput partial_values(out, false), partial_ts(ts_path, false);
  RETURN_IF_ERROR(WriteNpy(out, {steps, dim}, values.data()));
  RETURN_IF_ERROR(WriteNpyF64(ts_path, {steps}, ts.data()));
  partial_values.Commit();
  partial_ts.Commit();
  return absl::OkStatus();
}

// IMAGE: each frame's stored bytes as <out>/frame_%06d.<jpg|png>.
absl::Status WriteImages(const Dataset& ds, const pb::EpisodeIndex& index, int stream,
                         const std::string& out) {
  const pb::StreamIndex& si = index.streams(stream);
  std::error_code ec;
  const bool existed = fs::exists(out, ec);
  if (existed && !(fs::is_directory(out, ec) && fs::is_empty(out, ec))) {
    return absl::AlreadyExistsError(StrCat(
        out, " exists and is not an empty folder; image streams are written as one file per ",
        "frame into a new folder"));
  }
  fs::create_directories(out, ec);
  if (ec)
    return absl::PermissionDeniedError(StrCat("cannot create folder ", out, ": ", ec.message()));
  PartialOutput partial(out, /*remove_all=*/!existed);
  const std::string& codec = si.codec().codec();
  const std::string ext = codec == "mjpeg" ? "jpg" : codec;  // png -> png
  std::string bytes;
  for (int p = 0; p < si.packets().offset_size(); ++p) {
    RETURN_IF_ERROR(ds.ReadPacket(index, stream, static_cast<size_t>(p), &bytes));
    RETURN_IF_ERROR(WriteBytes(StrCat(out, "/", absl::StrFormat("frame_%06d.", p), ext), bytes));
  }
  partial.Commit();
  return absl::OkStatus();
}

std::string StreamListText(const Manifest& m) {
  std::string s;
  for (const StreamInfo& info : m.streams) {
    StrAppend(&s, s.empty() ? "" : ", ", info.name, " (", format::StreamKindName(info.kind), ")");
  }
  return s;
}

}  // namespace

absl::Status RunExtract(const ExtractOptions& options) {
  if (options.dataset.empty()) return absl::InvalidArgumentError("no dataset given");
  if (options.out.empty()) return absl::InvalidArgumentError("no output path given");
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Dataset::Open(options.dataset));
  const Manifest& m = ds->manifest();
  const int stream = m.StreamIndex(options.stream);
  if (stream < 0) {
    return absl::NotFoundError(StrCat("", options.dataset, " has no stream '", options.stream,
                                      "'; its streams are: ", StreamListText(m)));
  }
  if (options.episode < 0 || static_cast<uint64_t>(options.episode) >= ds->num_episodes()) {
    return absl::OutOfRangeError(
        StrCat("episode ", options.episode, " does not exist: ", options.dataset, " has ",
               ds->num_episodes(), " episodes (0 to ", ds->num_episodes() - 1, ")"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const pb::EpisodeIndex> index,
                   ds->LoadEpisode(static_cast<size_t>(options.episode)));
  const pb::StreamIndex& si = index->streams(stream);
  const std::string ext = LowerExtension(options.out);
  const std::string kind(format::StreamKindName(si.kind()));
  auto wrong_extension = [&](std::string_view wanted) {
    return absl::InvalidArgumentError(StrCat("stream '", si.name(), "' is ", kind, "; write it to ",
                                             wanted, " (got ", options.out, ")"));
  };
  switch (si.kind()) {
    case pb::VIDEO:
      if (!absl::c_linear_search(kVideoOut, ext)) return wrong_extension(JoinList(kVideoOut));
      return MuxPackets(*ds, *index, stream, options.out);
    case pb::AUDIO:
      if (!absl::c_linear_search(kAudioOut, ext)) return wrong_extension(JoinList(kAudioOut));
      return MuxPackets(*ds, *index, stream, options.out);
    case pb::LOWDIM:
      if (ext != ".npy") return wrong_extension(".npy");
      return WriteLowdim(*ds, *index, stream, options.out);
    case pb::TEXT: {
      if (ext != ".txt") return wrong_extension(".txt");
      PartialOutput partial(options.out, false);
      RETURN_IF_ERROR(WriteBytes(options.out, si.text()));
      partial.Commit();
      return absl::OkStatus();
    }
    case pb::IMAGE:
      if (!ext.empty()) return wrong_extension("a folder (a path without an extension)");
      return WriteImages(*ds, *index, stream, options.out);
    default:
      return absl::DataLossError(
          StrCat("stream '", si.name(), "' has unknown kind ", static_cast<int>(si.kind())));
  }
}


// `conveyor extract`: its flags and its run (tools/command.h).
class ExtractCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("extract", "Write one stream of one episode as a standard file");
    c->add_option("dataset", o_.dataset, "Dataset path or URL")->required();
    c->add_option("--episode", o_.episode, "Episode number (0-based)")->required();
    c->add_option("--stream", o_.stream, "Stream name (see `conveyor inspect`)")->required();
    c->add_option("--out", o_.out,
                   "Output file: .mp4/.mkv/.webm (video), .wav/.flac/.m4a/.mka/.ogg (audio), .npy (lowdim), .txt (text), a directory (images)")
        ->required();
    return c;
  }
  absl::Status Run() override {
    return RunExtract(o_);
  }

 private:
  ExtractOptions o_;
};

std::unique_ptr<Command> NewExtractCommand() {
  return std::make_unique<ExtractCommand>();
}

}  // namespace conveyor::tools
