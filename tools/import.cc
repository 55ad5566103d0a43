// `conveyor import`: one folder per episode of ordinary files (video, audio, .npy, episode.json,
// image folders) -> a Conveyor dataset. Media is remuxed, never re-encoded: the packets and codec
// parameters libavformat demuxes are stored byte for byte. docs/import.md describes the layout.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "base/json_text.h"
#include "absl/algorithm/container.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "media/media_demux.h"
#include "format/dataset_writer.h"
#include "format/format.h"
#include "format/npy.h"
#include "tools/command.h"
#include "tools/commands.h"
#include "tools/import_media.h"

namespace conveyor::tools {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using json = nlohmann::json;

constexpr std::array<std::string_view, 4> kVideoExtensions = {".mp4", ".mkv", ".webm", ".mov"};
constexpr std::array<std::string_view, 6> kAudioExtensions = {".wav",  ".flac", ".ogg",
                                                              ".opus", ".m4a",  ".mp3"};
constexpr std::array<std::string_view, 3> kImageExtensions = {".jpg", ".jpeg", ".png"};
constexpr std::string_view kEpisodeJson = "episode.json";
constexpr std::string_view kTimestampsSuffix = ".timestamps.npy";
constexpr std::string_view kInstructionStream = "instruction";

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

absl::StatusOr<std::string> ReadBytes(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open ", path.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return absl::DataLossError(StrCat("error reading ", path.string()));
  return ss.str();
}

// Sorted (byte order) directory entries, hidden ones ('.'-prefixed) left out. Sorting makes the
// import deterministic: the same folders give a byte-identical dataset.
absl::StatusOr<std::vector<fs::directory_entry>> ListDir(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(StrCat("cannot list ", dir.string(), ": ", ec.message()));
  std::vector<fs::directory_entry> entries;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return absl::UnavailableError(StrCat("cannot list ", dir.string(), ": ", ec.message()));
    if (it->path().filename().string().starts_with('.')) continue;
    entries.push_back(*it);
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.path().filename() < b.path().filename(); });
  return entries;
}

// ---------------------------------------------------------------------------------------------
// episode.json

struct EpisodeMeta {
  std::optional<std::string> instruction;
  std::map<std::string, double> rates;                    // stream name -> steps or frames / s
  std::map<std::string, std::vector<std::string>> names;  // lowdim stream -> dimension names
};

absl::StatusOr<EpisodeMeta> ReadEpisodeMeta(const fs::path& path) {
  EpisodeMeta meta;
  ASSIGN_OR_RETURN(std::string text, ReadBytes(path));
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        StrCat(path.string(), ": not a JSON object (expected e.g. {\"instruction\": \"pick up ",
               "the cup\", \"rates\": {\"state\": 50}})"));
  }
  if (auto it = j.find("instruction"); it != j.end()) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(StrCat(path.string(), ": \"instruction\" is not a string"));
    }
    meta.instruction = it->get<std::string>();
  }
  if (auto it = j.find("rates"); it != j.end()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError(StrCat(path.string(), ": \"rates\" is not an object"));
    }
    for (const auto& [name, v] : it->items()) {
      const double rate = v.is_number() ? v.get<double>() : -1;
      if (!(rate > 0) || !std::isfinite(rate)) {
        return absl::InvalidArgumentError(
            StrCat(path.string(), ": rates.", name, " must be a positive number, got ", JsonText(v)));
      }
      meta.rates[name] = rate;
    }
  }
  if (auto it = j.find("names"); it != j.end()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError(StrCat(path.string(), ": \"names\" is not an object"));
    }
    for (const auto& [name, v] : it->items()) {
      std::vector<std::string>& out = meta.names[name];
      const bool ok = v.is_array() &&
                      std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_string(); });
      if (!ok) {
        return absl::InvalidArgumentError(
            StrCat(path.string(), ": names.", name, " must be an array of strings"));
      }
      for (const json& e : v) out.push_back(e.get<std::string>());
    }
  }
  return meta;
}

// ---------------------------------------------------------------------------------------------
// Media files (VIDEO, AUDIO): demux and copy (media/media_demux.h).

absl::StatusOr<EpisodeData::Stream> DemuxLocalFile(const fs::path& path, MediaKind kind,
                                                   const std::string& name) {
  std::unique_ptr<Storage> dir =
      NewLocalStorage(path.has_parent_path() ? path.parent_path().string() : ".");
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, dir->Open(path.filename().string()));
  ASSIGN_OR_RETURN(DemuxedStream d, DemuxBestStream(*file, kind, name, /*keep_bytes=*/true));
  return std::move(d.stream);
}

// ---------------------------------------------------------------------------------------------
// Image folders (IMAGE): each file is one frame's packet.

absl::StatusOr<EpisodeData::Stream> ReadImageFolder(const fs::path& dir, const std::string& name,
                                                    const EpisodeMeta& meta,
                                                    const fs::path& meta_path) {
  ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries, ListDir(dir));
  std::vector<fs::path> images;
  for (const auto& e : entries) {
    const std::string ext = Lower(e.path().extension().string());
    std::error_code ec;
    if (!e.is_regular_file(ec) || !absl::c_linear_search(kImageExtensions, ext)) {
      return absl::InvalidArgumentError(
          StrCat(e.path().string(), ": an image folder holds only .jpg/.jpeg/.png files"));
    }
    images.push_back(e.path());
  }
  auto rate_it = meta.rates.find(name);
  if (rate_it == meta.rates.end()) {
    return absl::InvalidArgumentError(StrCat("image folder ", dir.string(),
                                             " needs a frame rate: add \"rates\": {\"", name,
                                             "\": FPS} to ", meta_path.string()));
  }
  EpisodeData::Stream out;
  out.info.name = name;
  out.info.kind = pb::IMAGE;
  out.info.rate = rate_it->second;
  // One frame per tick of 1/rate.
  const TimeBase tb = FrameTimeBase(rate_it->second);
  out.time_base_num = tb.num;
  out.time_base_den = tb.den;
  for (size_t i = 0; i < images.size(); ++i) {
    // Probing decodes each image once: a corrupt or differently sized frame is caught here,
    // naming its file, rather than at training time.
    ASSIGN_OR_RETURN(const pb::CodecParams params, ProbeImageFile(images[i].string()));
    if (i == 0) {
      // FFmpeg's codec names: one name per codec id.
      if (params.codec() != "mjpeg" && params.codec() != "png") {
        return absl::InvalidArgumentError(
            StrCat(images[i].string(), " is ", params.codec(), ", not JPEG or PNG"));
      }
      out.codec = params;
      out.info.codec = params.codec();
      out.info.pix_fmt = params.pix_fmt();
      out.info.shape = {params.height(), params.width(), 3};
    } else if (params.codec() != out.codec->codec() || params.width() != out.codec->width() ||
               params.height() != out.codec->height()) {
      return absl::InvalidArgumentError(
          StrCat(images[i].string(), " is ", params.codec(), " ", params.width(), "x",
                 params.height(), ", the folder's first image ",
                 images[0].filename().string(), " is ", out.codec->codec(), " ", out.codec->width(),
                 "x", out.codec->height(), "; every frame of an image stream must match"));
    }
    EpisodeData::Packet& p = out.packets.emplace_back();
    ASSIGN_OR_RETURN(p.bytes, ReadBytes(images[i]));
    p.pts = p.dts = static_cast<int64_t>(i);
    p.duration = 1;
    p.key = true;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// .npy (LOWDIM)

// Timestamps as float64. ReadNpy converts to float32, which would round seconds-since-start to
// ~1 µs at 10 s and ~60 µs at 1000 s; a '<f8' file's data (validated by ParseNpy, which checks
// that it is exactly the file's tail) is read as is instead.
absl::StatusOr<std::vector<double>> ReadTimestamps(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadBytes(path));
  ASSIGN_OR_RETURN(NpyArray arr, ParseNpy(bytes, path.string()));
  if (arr.shape.size() != 1) {
    return absl::InvalidArgumentError(StrCat(
        path.string(), ": timestamps must have shape [T], got ", arr.shape.size(), " dimensions"));
  }
  const size_t n = static_cast<size_t>(arr.shape[0]);
  std::vector<double> t(n);
  if (arr.source_dtype == "<f8") {
    std::memcpy(t.data(), bytes.data() + bytes.size() - n * sizeof(double), n * sizeof(double));
  } else {
    std::copy(arr.values.begin(), arr.values.end(), t.begin());
  }
  return t;
}

double MedianStep(const std::vector<double>& t) {
  if (t.size() < 2) return 0;
  std::vector<double> steps;
  for (size_t i = 1; i < t.size(); ++i) steps.push_back(t[i] - t[i - 1]);
  std::nth_element(steps.begin(), steps.begin() + static_cast<ptrdiff_t>(steps.size() / 2),
                   steps.end());
  return steps[steps.size() / 2];
}

absl::StatusOr<EpisodeData::Stream> ReadLowdimFile(const fs::path& path, const std::string& name,
                                                   const EpisodeMeta& meta,
                                                   const fs::path& meta_path) {
  const std::string file = path.string();
  ASSIGN_OR_RETURN(NpyArray arr, ReadNpy(file));
  if (arr.shape.empty() || arr.shape.size() > 2) {
    return absl::InvalidArgumentError(
        StrCat(file, ": expected shape [T, D] or [T], got ", arr.shape.size(), " dimensions"));
  }
  const int64_t steps = arr.shape[0];
  const int64_t dim = arr.shape.size() == 2 ? arr.shape[1] : 1;
  if (steps <= 0 || dim <= 0) {
    return absl::InvalidArgumentError(
        StrCat(file, ": empty array (shape [", steps, ", ", dim, "])"));
  }
  EpisodeData::Stream out;
  out.info.name = name;
  out.info.kind = pb::LOWDIM;
  out.info.codec = "zstd-shuffle4";
  out.codec->set_codec(out.info.codec);
  out.info.shape = {dim};
  out.values = std::move(arr.values);

  const fs::path ts_path = path.parent_path() / StrCat(name, kTimestampsSuffix);
  auto rate_it = meta.rates.find(name);
  std::error_code ec;
  if (fs::exists(ts_path, ec)) {
    ASSIGN_OR_RETURN(out.timestamps_s, ReadTimestamps(ts_path));
    if (static_cast<int64_t>(out.timestamps_s.size()) != steps) {
      return absl::InvalidArgumentError(StrCat(ts_path.string(), " holds ", out.timestamps_s.size(),
                                               " timestamps but ", file, " has ", steps, " steps"));
    }
    for (size_t i = 0; i < out.timestamps_s.size(); ++i) {
      const double t = out.timestamps_s[i];
      if (!std::isfinite(t) || (i > 0 && t < out.timestamps_s[i - 1])) {
        return absl::InvalidArgumentError(StrCat(ts_path.string(), ": timestamp ", i, " (", t,
                                                 ") is not finite or goes backwards"));
      }
    }
    if (rate_it != meta.rates.end()) {
      out.info.rate = rate_it->second;
    } else {
      const double step = MedianStep(out.timestamps_s);
      out.info.rate = step > 0 ? 1.0 / step : 0;
    }
  } else if (rate_it != meta.rates.end()) {
    out.info.rate = rate_it->second;
    out.timestamps_s.resize(static_cast<size_t>(steps));
    for (int64_t i = 0; i < steps; ++i) {
      out.timestamps_s[static_cast<size_t>(i)] = static_cast<double>(i) / rate_it->second;
    }
  } else {
    return absl::InvalidArgumentError(StrCat(file, " has no timestamps: add ",
                                             ts_path.filename().string(),
                                             " (seconds, shape [T]) or \"rates\": {\"", name,
                                             "\": STEPS_PER_S} to ", meta_path.string()));
  }

  if (auto names_it = meta.names.find(name); names_it != meta.names.end()) {
    if (static_cast<int64_t>(names_it->second.size()) != dim) {
      return absl::InvalidArgumentError(StrCat(meta_path.string(), ": names.", name, " has ",
                                               names_it->second.size(), " entries, ", file, " has ",
                                               dim, " dimensions"));
    }
    out.info.names = names_it->second;
  } else {
    for (int64_t d = 0; d < dim; ++d) out.info.names.push_back(StrCat(name, "_", d));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// One episode folder.

int KindOrder(pb::StreamKind kind) {
  switch (kind) {
    case pb::VIDEO:
      return 0;
    case pb::IMAGE:
      return 1;
    case pb::AUDIO:
      return 2;
    case pb::LOWDIM:
      return 3;
    case pb::TEXT:
      return 4;
    default:
      return 5;
  }
}

absl::StatusOr<EpisodeData> ReadEpisodeFolder(const fs::path& dir) {
  ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries, ListDir(dir));
  const fs::path meta_path = dir / kEpisodeJson;
  EpisodeMeta meta;
  std::error_code ec;
  if (fs::exists(meta_path, ec)) {
    ASSIGN_OR_RETURN(meta, ReadEpisodeMeta(meta_path));
  }

  EpisodeData episode;
  episode.source = dir.string();
  std::map<std::string, fs::path> claimed;  // stream name -> the file or folder it came from
  auto claim = [&](const std::string& name, const fs::path& from) -> absl::Status {
    if (name.empty()) {
      return absl::InvalidArgumentError(StrCat(from.string(), ": empty stream name"));
    }
    auto [it, inserted] = claimed.emplace(name, from);
    if (!inserted) {
      return absl::InvalidArgumentError(StrCat(from.string(), " and ", it->second.string(),
                                               " would both become stream '", name,
                                               "'; rename one"));
    }
    return absl::OkStatus();
  };

  for (const fs::directory_entry& e : entries) {
    const fs::path& path = e.path();
    const std::string filename = path.filename().string();
    const std::string ext = Lower(path.extension().string());
    const std::string stem = path.stem().string();
    if (e.is_directory(ec)) {
      RETURN_IF_ERROR(claim(filename, path));
      ASSIGN_OR_RETURN(EpisodeData::Stream s, ReadImageFolder(path, filename, meta, meta_path));
      if (s.packets.empty()) {
        return absl::InvalidArgumentError(StrCat("image folder ", path.string(), " is empty"));
      }
      episode.streams.push_back(std::move(s));
    } else if (filename == kEpisodeJson) {
      continue;
    } else if (filename.ends_with(kTimestampsSuffix)) {
      const std::string base = filename.substr(0, filename.size() - kTimestampsSuffix.size());
      if (!fs::exists(dir / StrCat(base, ".npy"), ec)) {
        return absl::InvalidArgumentError(
            StrCat(path.string(), " has no matching ", base, ".npy beside it"));
      }
    } else if (absl::c_linear_search(kVideoExtensions, ext) || absl::c_linear_search(kAudioExtensions, ext)) {
      RETURN_IF_ERROR(claim(stem, path));
      const MediaKind kind =
          absl::c_linear_search(kVideoExtensions, ext) ? MediaKind::kVideo : MediaKind::kAudio;
      ASSIGN_OR_RETURN(EpisodeData::Stream s, DemuxLocalFile(path, kind, stem));
      episode.streams.push_back(std::move(s));
    } else if (ext == ".npy") {
      RETURN_IF_ERROR(claim(stem, path));
      ASSIGN_OR_RETURN(EpisodeData::Stream s, ReadLowdimFile(path, stem, meta, meta_path));
      episode.streams.push_back(std::move(s));
    } else {
      spdlog::warn("import: ignoring {} (not a video, audio, .npy, episode.json or image folder)",
                   path.string());
    }
  }
  if (meta.instruction.has_value()) {
    RETURN_IF_ERROR(claim(std::string(kInstructionStream), meta_path));
    EpisodeData::Stream& s = episode.streams.emplace_back();
    s.info.name = std::string(kInstructionStream);
    s.info.kind = pb::TEXT;
    s.info.codec = "utf-8";
    s.codec->set_codec(s.info.codec);
    s.text = *meta.instruction;
  }
  if (episode.streams.empty()) {
    return absl::InvalidArgumentError(
        StrCat("episode folder ", dir.string(), " holds no streams (expected video, audio, .npy ",
               "files, image folders or an episode.json with an instruction)"));
  }
  // The same files give the same stream order in every episode, whatever their extensions.
  std::stable_sort(episode.streams.begin(), episode.streams.end(),
                   [](const EpisodeData::Stream& a, const EpisodeData::Stream& b) {
                     const int ka = KindOrder(a.info.kind), kb = KindOrder(b.info.kind);
                     return ka != kb ? ka < kb : a.info.name < b.info.name;
                   });
  return episode;
}

std::string StreamList(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) StrAppend(&s, s.empty() ? "" : ", ", n);
  return s.empty() ? "(none)" : s;
}

// "video h264 [480, 640, 3]"
std::string Describe(const StreamInfo& info) {
  std::string s = StrCat(format::StreamKindName(info.kind), " ", info.codec, " [");
  for (size_t i = 0; i < info.shape.size(); ++i) StrAppend(&s, i ? ", " : "", info.shape[i]);
  return s + "]";
}

// The writer checks the layout too, positionally; this names what is missing, extra or different.
absl::Status CheckSameStreams(const EpisodeData& first, const EpisodeData& ep) {
  std::set<std::string> a, b;
  for (const auto& s : first.streams) a.insert(s.info.name);
  for (const auto& s : ep.streams) b.insert(s.info.name);
  if (a == b) {
    for (const auto& s : ep.streams) {
      const StreamInfo& x = s.info;
      const StreamInfo& y =
          std::find_if(first.streams.begin(), first.streams.end(), [&](const auto& f) {
            return f.info.name == x.name;
          })->info;
      if (x.kind != y.kind || x.codec != y.codec || x.shape != y.shape) {
        return absl::InvalidArgumentError(
            StrCat("episode folder ", ep.source, ": stream '", x.name, "' is ", Describe(x),
                   ", in the first episode folder ", first.source, " it is ", Describe(y),
                   ". A stream must have the same kind, codec and shape in every episode"));
      }
    }
    return absl::OkStatus();
  }
  std::vector<std::string> missing, extra;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(missing));
  std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(extra));
  return absl::InvalidArgumentError(StrCat(
      "episode folder ", ep.source, " does not have the streams of the first episode folder ",
      first.source, ": missing ", StreamList(missing), "; extra ", StreamList(extra),
      ". Every episode needs the same set of files"));
}

// Writes every episode folder under `from` into `writer`, in name order.
absl::Status ImportEpisodes(const std::vector<fs::path>& episodes, const ImportOptions& options,
                            DatasetWriter* writer) {
  std::optional<EpisodeData> first;
  for (size_t i = 0; i < episodes.size(); ++i) {
    ASSIGN_OR_RETURN(EpisodeData ep, ReadEpisodeFolder(episodes[i]));
    if (first.has_value()) RETURN_IF_ERROR(CheckSameStreams(*first, ep));
    RETURN_IF_ERROR(writer->AddEpisode(ep));
    if (!first.has_value()) {
      // Kept for the layout check only; the packets are not needed.
      first.emplace();
      first->source = ep.source;
      for (const auto& s : ep.streams) first->streams.emplace_back().info = s.info;
    }
    if (options.progress) {
      std::fprintf(stderr, "import: %zu/%zu episodes (%s)\n", i + 1, episodes.size(),
                   episodes[i].filename().c_str());
    }
  }
  ASSIGN_OR_RETURN(Manifest manifest, writer->Finish());
  if (options.progress) {
    std::fprintf(stderr, "import: wrote %llu episodes, %zu streams, %.1f s, %llu bytes to %s\n",
                 static_cast<unsigned long long>(manifest.num_episodes), manifest.streams.size(),
                 manifest.total_duration_s, static_cast<unsigned long long>(manifest.total_bytes),
                 options.out.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunImport(const ImportOptions& options) {
  if (!options.lerobot.empty()) {
    if (!options.from.empty()) {
      return absl::InvalidArgumentError("give either --from or --lerobot, not both");
    }
    return RunImportLeRobot(options);
  }
  if (options.from.empty()) return absl::InvalidArgumentError("no input folder given");
  if (IsLeRobotRoot(options.from)) return RunImportLeRobot(options);
  if (options.out.empty()) return absl::InvalidArgumentError("no output folder given");
  {
    // A format read in place (RLDS, HDF5, at any location, with its #options) is copied through
    // the Dataset interface. A plain folder of episode folders is none of them: the native
    // fallback says NOT_FOUND (no manifest.json) and the folder import below runs.
    absl::StatusOr<std::unique_ptr<Dataset>> ds = Dataset::Open(options.from);
    if (ds.ok() && (*ds)->format() != "conveyor") {
      return ImportDataset(**ds, options, StrCat("conveyor import (", (*ds)->format(), ")"));
    }
    if (!ds.ok() && !absl::IsNotFound(ds.status())) return ds.status();
    std::error_code exists_ec;
    if (!ds.ok() && fs::exists(fs::path(options.from) / "dataset_info.json", exists_ec)) return ds.status();
  }
  const fs::path from(options.from);
  std::error_code ec;
  if (!fs::is_directory(from, ec)) {
    return absl::NotFoundError(StrCat("", options.from, " is not a folder"));
  }
  ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries, ListDir(from));
  std::vector<fs::path> episodes;
  for (const auto& e : entries) {
    if (e.is_directory(ec)) {
      episodes.push_back(e.path());
    } else {
      spdlog::warn("import: ignoring {} (episodes are sub-folders of {})", e.path().string(),
                   options.from);
    }
  }
  if (episodes.empty()) {
    return absl::InvalidArgumentError(
        StrCat("no episode folders in ", options.from,
               " (expected one sub-folder per episode holding video, audio and .npy files)"));
  }

  DatasetWriter::Options wopts;
  wopts.name = options.name;
  if (wopts.name.empty()) {
    fs::path p = from;
    if (!p.has_filename()) p = p.parent_path();  // "data/" -> "data"
    wopts.name = fs::absolute(p, ec).filename().string();
    if (wopts.name.empty()) wopts.name = "dataset";
  }
  wopts.created_by = "conveyor import";
  wopts.episodes_per_shard = options.episodes_per_shard;
  const bool out_existed = fs::exists(options.out, ec);
  absl::Status status;
  {
    auto writer = DatasetWriter::Create(options.out, wopts);
    if (!writer.ok()) return writer.status();
    status = ImportEpisodes(episodes, options, writer->get());
  }
  if (!status.ok()) RemovePartialImport(options.out, out_existed);
  return status;
}

void RemovePartialImport(const std::string& out, bool out_existed) {
  std::error_code ec;
  if (out_existed) {
    std::vector<fs::path> written;
    for (fs::directory_iterator it(out, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      written.push_back(it->path());
    }
    for (const fs::path& p : written) fs::remove_all(p, ec);
  } else {
    fs::remove_all(out, ec);
  }
}


// `conveyor import`: its flags and its run (tools/command.h).
class ImportCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("import", "Build a dataset from existing files (one folder per episode, or a LeRobot dataset; see docs/import.md, docs/lerobot.md)");
    c->add_option("--from", o_.from,
                  "Folder holding one sub-folder per episode, or a dataset read in place: a LeRobot root, an RLDS / TFDS folder (docs/rlds.md), HDF5 episodes (docs/hdf5.md); any location, #options included");
    c->add_option("--lerobot", o_.lerobot,
                  "A LeRobot v3.0 or v2.1 dataset root (meta/info.json); see docs/lerobot.md");
    c->add_option("--tolerance-s", o_.tolerance_s,
                  "LeRobot: allowed distance between a row's timestamp and frame_index / fps, "
                  "and between a video frame and its row")
        ->capture_default_str();
    c->add_flag("--skip-broken-episodes", o_.skip_broken,
                "LeRobot: leave out (and list) episodes that cannot be read instead of failing");
    c->add_option("--out", o_.out, "Output dataset directory")->required();
    c->add_option("--name", o_.name, "Dataset name (default: the input folder's name)");
    c->add_option("--episodes-per-shard", o_.episodes_per_shard, "Episodes per shard file")->capture_default_str();
    c->add_flag("--quiet", quiet_, "No progress output");
    return c;
  }
  absl::Status Run() override {
    o_.progress = !quiet_;
    if (o_.from.empty() && o_.lerobot.empty()) {
      return absl::InvalidArgumentError("give --from DIR or --lerobot DIR");
    }
    return RunImport(o_);
  }

 private:
  ImportOptions o_;
  bool quiet_ = false;
};

std::unique_ptr<Command> NewImportCommand() {
  return std::make_unique<ImportCommand>();
}

}  // namespace conveyor::tools
