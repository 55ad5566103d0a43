#include "datasets/lerobot/lerobot_meta.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "base/json_text.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::lerobot {
namespace {

using json = nlohmann::json;

constexpr std::string_view kStatsPath = "meta/stats.json";
constexpr std::string_view kTasksParquet = "meta/tasks.parquet";
constexpr std::string_view kEpisodesParquet =
    "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet";
constexpr std::string_view kLegacyEpisodes = "meta/episodes.jsonl";
constexpr std::string_view kLegacyTasks = "meta/tasks.jsonl";
constexpr std::string_view kLegacyEpisodesStats = "meta/episodes_stats.jsonl";

absl::StatusOr<json> ParseJson(std::string_view text, const std::string& name) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(StrCat(name, ": not valid JSON"));
  return j;
}

// Every number of a (nested) JSON array, depth first: LeRobot writes image statistics as
// [3][1][1] lists and scalars as [x].
bool FlattenNumbers(const json& j, std::vector<double>* out) {
  if (j.is_number()) {
    out->push_back(j.get<double>());
    return true;
  }
  if (!j.is_array()) return false;
  for (const json& e : j) {
    if (!FlattenNumbers(e, out)) return false;
  }
  return true;
}

bool IsQuantileKey(std::string_view k) {
  return k.size() >= 2 && k[0] == 'q' &&
         std::all_of(k.begin() + 1, k.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// One feature's statistics object ({"mean": [...], "std": [...], ..., "count": [N]}).
absl::StatusOr<FeatureStats> ParseStats(const json& s, const std::string& where) {
  if (!s.is_object()) return absl::InvalidArgumentError(StrCat(where, ": not an object"));
  FeatureStats st;
  for (const auto& [k, v] : s.items()) {
    std::vector<double> values;
    if (!FlattenNumbers(v, &values)) {
      return absl::InvalidArgumentError(StrCat(where, ".", k, ": not a number or list of numbers"));
    }
    if (k == "mean") {
      st.mean = std::move(values);
    } else if (k == "std") {
      st.std = std::move(values);
    } else if (k == "min") {
      st.min = std::move(values);
    } else if (k == "max") {
      st.max = std::move(values);
    } else if (k == "count") {
      if (values.size() != 1 || !(values[0] >= 0)) {
        return absl::InvalidArgumentError(StrCat(where, ".count: expected one count"));
      }
      st.count = static_cast<uint64_t>(values[0]);
    } else if (IsQuantileKey(k)) {
      st.quantiles[k] = std::move(values);
    }
  }
  return st;
}

std::vector<std::string> FeatureNames(const json& names, int64_t elements) {
  std::vector<std::string> out;
  const json* list = &names;
  if (names.is_object() && names.size() == 1) list = &names.begin().value();
  if (!list->is_array() || static_cast<int64_t>(list->size()) != elements) return out;
  for (const json& n : *list) {
    if (!n.is_string()) return {};
    out.push_back(n.get<std::string>());
  }
  return out;
}

absl::StatusOr<Feature> ParseFeature(const std::string& key, const json& f,
                                     const std::string& info_name) {
  const std::string where = StrCat(info_name, ": features.", key);
  if (!f.is_object() || !f.contains("dtype") || !f["dtype"].is_string()) {
    return absl::InvalidArgumentError(StrCat(where, " has no \"dtype\" string"));
  }
  Feature out;
  out.key = key;
  out.dtype = f["dtype"].get<std::string>();
  if (f.contains("shape")) {
    const json& shape = f["shape"];
    if (!shape.is_array()) return absl::InvalidArgumentError(StrCat(where, ".shape: not a list"));
    for (const json& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() <= 0) {
        return absl::InvalidArgumentError(
            StrCat(where, ".shape: ", JsonText(shape), " is not a list of positive integers"));
      }
      out.shape.push_back(d.get<int64_t>());
    }
  }
  if (f.contains("names") && !f["names"].is_null()) {
    out.names = FeatureNames(f["names"], out.elements());
  }
  if (out.is_video()) {
    // v3.0 writes "info", v2.0 wrote "video_info"; both hold "video.codec" and "video.fps".
    for (const char* block : {"info", "video_info"}) {
      if (!f.contains(block) || !f[block].is_object()) continue;
      const json& info = f[block];
      if (info.contains("video.codec") && info["video.codec"].is_string()) {
        out.video_codec = info["video.codec"].get<std::string>();
      }
      if (info.contains("video.fps") && info["video.fps"].is_number()) {
        out.video_fps = info["video.fps"].get<double>();
      }
      if (info.contains("video.pix_fmt") && info["video.pix_fmt"].is_string()) {
        out.video_pix_fmt = info["video.pix_fmt"].get<std::string>();
      }
      if (info.contains("video.height") && info["video.height"].is_number_integer()) {
        out.video_height = info["video.height"].get<int64_t>();
      }
      if (info.contains("video.width") && info["video.width"].is_number_integer()) {
        out.video_width = info["video.width"].get<int64_t>();
      }
    }
  }
  return out;
}

// The next (chunk, file) pair, as LeRobot's writer advances them.
std::pair<int64_t, int64_t> NextChunkFile(int64_t chunk, int64_t file, int64_t chunks_size) {
  if (file + 1 >= chunks_size) return {chunk + 1, 0};
  return {chunk, file + 1};
}

absl::StatusOr<std::vector<double>> ReadDoubleColumn(const parquet::ParquetFile& file,
                                                     std::string_view column) {
  ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn(column));
  if (!c.lists.empty() || c.null_count != 0) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": column '", column,
                                             "' is not a flat non-null number column"));
  }
  std::vector<double> out;
  if (const auto* d = std::get_if<std::vector<double>>(&c.values)) {
    out = *d;
  } else if (const auto* f = std::get_if<std::vector<float>>(&c.values)) {
    out.assign(f->begin(), f->end());
  } else {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column '", column, "' is ",
               parquet::PhysicalTypeName(c.descriptor.physical_type), ", expected DOUBLE or FLOAT"));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<std::string>>> ReadStringListColumn(
    const parquet::ParquetFile& file, std::string_view column) {
  ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn(column));
  const auto* v = std::get_if<parquet::BinaryValues>(&c.values);
  if (v == nullptr || c.lists.size() != 1) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column '", column, "' is not a list of strings"));
  }
  std::vector<std::vector<std::string>> out(static_cast<size_t>(c.num_rows));
  const parquet::ListLevel& rows = c.lists[0];
  for (size_t r = 0; r < out.size(); ++r) {
    for (int64_t i = rows.offsets[r]; i < rows.offsets[r + 1]; ++i) {
      out[r].emplace_back((*v)[static_cast<size_t>(i)]);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ReadStringColumn(const parquet::ParquetFile& file,
                                                          std::string_view column) {
  ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn(column));
  const auto* v = std::get_if<parquet::BinaryValues>(&c.values);
  if (v == nullptr || !c.lists.empty() || c.null_count != 0) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column '", column, "' is not a non-null string column"));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) out.emplace_back((*v)[i]);
  return out;
}

// info.json.
absl::Status ReadInfo(Storage& storage, Meta* meta) {
  const std::string name = storage.Describe(kInfoPath);
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(storage, kInfoPath));
  ASSIGN_OR_RETURN(json info, ParseJson(text, name));
  if (!info.is_object()) return absl::InvalidArgumentError(StrCat(name, ": not a JSON object"));
  auto str = [&](const char* key) -> std::string {
    return info.contains(key) && info[key].is_string() ? info[key].get<std::string>() : "";
  };
  meta->codebase_version = str("codebase_version");
  if (meta->codebase_version == "v3.0") {
    meta->version = Version::kV30;
  } else if (meta->codebase_version == "v2.1" || meta->codebase_version == "v2.0") {
    meta->version = Version::kV21;
  } else {
    return absl::UnimplementedError(
        StrCat(name, ": codebase_version \"", meta->codebase_version,
               "\" is not supported (Conveyor reads LeRobot v3.0 and v2.1; convert older datasets ",
               "with LeRobot's own scripts first)"));
  }
  if (!info.contains("fps") || !info["fps"].is_number() || !(info["fps"].get<double>() > 0)) {
    return absl::InvalidArgumentError(StrCat(name, ": \"fps\" must be a positive number"));
  }
  meta->fps = info["fps"].get<double>();
  auto integer = [&](const char* key, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (!info.contains(key) || info[key].is_null()) return fallback;
    if (!info[key].is_number_integer() || info[key].get<int64_t>() < 0) {
      return absl::InvalidArgumentError(StrCat(name, ": \"", key, "\" is not a count"));
    }
    return info[key].get<int64_t>();
  };
  ASSIGN_OR_RETURN(meta->chunks_size, integer("chunks_size", 1000));
  if (meta->chunks_size <= 0) {
    return absl::InvalidArgumentError(StrCat(name, ": \"chunks_size\" must be positive"));
  }
  ASSIGN_OR_RETURN(meta->total_episodes, integer("total_episodes", -1));
  ASSIGN_OR_RETURN(meta->total_frames, integer("total_frames", -1));
  if (meta->total_episodes < 0 || meta->total_frames < 0) {
    return absl::InvalidArgumentError(
        StrCat(name, ": \"total_episodes\" and \"total_frames\" are required"));
  }
  meta->data_path = str("data_path");
  meta->video_path = str("video_path");
  if (meta->data_path.empty()) {
    return absl::InvalidArgumentError(StrCat(name, ": \"data_path\" is missing"));
  }
  if (!info.contains("features") || !info["features"].is_object()) {
    return absl::InvalidArgumentError(StrCat(name, ": \"features\" is missing"));
  }
  bool has_video = false;
  for (const auto& [key, f] : info["features"].items()) {
    ASSIGN_OR_RETURN(Feature feature, ParseFeature(key, f, name));
    has_video = has_video || feature.is_video();
    meta->features.push_back(std::move(feature));
  }
  if (has_video && meta->video_path.empty()) {
    return absl::InvalidArgumentError(
        StrCat(name, ": features include videos but \"video_path\" is missing"));
  }
  return absl::OkStatus();
}

// v3.0: meta/episodes/chunk-XXX/file-YYY.parquet, in (chunk, file) order until total_episodes
// have been read. Storage cannot list a directory (HTTP, S3), so files are found by the writer's
// own naming sequence.
absl::Status ReadEpisodesV30(Storage& storage, Meta* meta) {
  std::vector<std::string> video_keys;
  for (const Feature& f : meta->features) {
    if (f.is_video()) video_keys.push_back(f.key);
  }
  int64_t chunk = 0, file_index = 0;
  while (static_cast<int64_t>(meta->episodes.size()) < meta->total_episodes) {
    ASSIGN_OR_RETURN(std::string path,
                     FormatPathTemplate(kEpisodesParquet,
                                        {{"chunk_index", chunk}, {"file_index", file_index}}, {}));
    absl::StatusOr<parquet::ParquetFile> pf = OpenParquet(storage, path);
    if (absl::IsNotFound(pf.status())) {
      return absl::NotFoundError(StrCat(
          storage.Describe(path), " is missing: ", storage.Describe("meta/info.json"), " says ",
          meta->total_episodes, " episodes, but the episode files up to it hold ",
          meta->episodes.size()));
    }
    if (!pf.ok()) return pf.status();
    const std::string name = pf->name();
    ASSIGN_OR_RETURN(std::vector<int64_t> index, ReadIntColumn(*pf, "episode_index"));
    ASSIGN_OR_RETURN(std::vector<int64_t> length, ReadIntColumn(*pf, "length"));
    ASSIGN_OR_RETURN(std::vector<int64_t> data_chunk, ReadIntColumn(*pf, "data/chunk_index"));
    ASSIGN_OR_RETURN(std::vector<int64_t> data_file, ReadIntColumn(*pf, "data/file_index"));
    ASSIGN_OR_RETURN(std::vector<int64_t> from, ReadIntColumn(*pf, "dataset_from_index"));
    ASSIGN_OR_RETURN(std::vector<int64_t> to, ReadIntColumn(*pf, "dataset_to_index"));
    ASSIGN_OR_RETURN(std::vector<std::vector<std::string>> tasks,
                     ReadStringListColumn(*pf, "tasks"));
    struct VideoColumns {
      std::vector<int64_t> chunk, file;
      std::vector<double> from, to;
    };
    std::map<std::string, VideoColumns> videos;
    for (const std::string& key : video_keys) {
      VideoColumns& v = videos[key];
      const std::string prefix = StrCat("videos/", key, "/");
      ASSIGN_OR_RETURN(v.chunk, ReadIntColumn(*pf, prefix + "chunk_index"));
      ASSIGN_OR_RETURN(v.file, ReadIntColumn(*pf, prefix + "file_index"));
      ASSIGN_OR_RETURN(v.from, ReadDoubleColumn(*pf, prefix + "from_timestamp"));
      ASSIGN_OR_RETURN(v.to, ReadDoubleColumn(*pf, prefix + "to_timestamp"));
    }
    for (size_t r = 0; r < index.size(); ++r) {
      Episode ep;
      ep.index = index[r];
      ep.length = length[r];
      ep.tasks = tasks[r];
      ep.dataset_from_index = from[r];
      ep.dataset_to_index = to[r];
      ep.source = StrCat(name, " row ", r);
      ASSIGN_OR_RETURN(ep.data_path,
                       FormatPathTemplate(meta->data_path,
                                          {{"chunk_index", data_chunk[r]},
                                           {"file_index", data_file[r]}},
                                          {}));
      for (const auto& [key, v] : videos) {
        VideoSegment seg;
        ASSIGN_OR_RETURN(seg.path, FormatPathTemplate(meta->video_path,
                                                      {{"chunk_index", v.chunk[r]},
                                                       {"file_index", v.file[r]}},
                                                      {{"video_key", key}}));
        seg.from_s = v.from[r];
        seg.to_s = v.to[r];
        if (!std::isfinite(seg.from_s) || !std::isfinite(*seg.to_s) || seg.from_s < 0 ||
            *seg.to_s <= seg.from_s) {
          return absl::InvalidArgumentError(
              StrCat(ep.source, " (episode ", ep.index, "): camera '", key, "' has from_timestamp ",
                     seg.from_s, " and to_timestamp ", *seg.to_s, "; expected 0 <= from < to"));
        }
        ep.videos[key] = std::move(seg);
      }
      meta->episodes.push_back(std::move(ep));
    }
    std::tie(chunk, file_index) = NextChunkFile(chunk, file_index, meta->chunks_size);
  }
  return absl::OkStatus();
}

absl::Status ReadTasksV30(Storage& storage, Meta* meta) {
  ASSIGN_OR_RETURN(parquet::ParquetFile pf, OpenParquet(storage, kTasksParquet));
  ASSIGN_OR_RETURN(std::vector<int64_t> index, ReadIntColumn(pf, "task_index"));
  // pandas writes the DataFrame's index as a column: "task" when the index is named (LeRobot's
  // writer names it), "__index_level_0__" when it is not.
  std::string text_column;
  for (const char* c : {"task", "__index_level_0__"}) {
    if (pf.FindColumn(c).ok()) {
      text_column = c;
      break;
    }
  }
  if (text_column.empty()) {
    return absl::InvalidArgumentError(StrCat(
        pf.name(), ": no task text column (expected \"task\" or pandas' \"__index_level_0__\")"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> text, ReadStringColumn(pf, text_column));
  for (size_t i = 0; i < index.size(); ++i) {
    if (!meta->tasks.emplace(index[i], text[i]).second) {
      return absl::InvalidArgumentError(
          StrCat(pf.name(), ": task_index ", index[i], " appears twice"));
    }
  }
  return absl::OkStatus();
}

// Calls `line_fn` for each non-empty line of a JSONL file, parsed.
template <typename Fn>
absl::Status ForEachJsonLine(Storage& storage, std::string_view path, Fn line_fn) {
  ASSIGN_OR_RETURN(std::string text, ReadWholeFile(storage, path));
  const std::string name = storage.Describe(path);
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = StrCat(name, " line ", n);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(StrCat(where, ": not a JSON object"));
    }
    RETURN_IF_ERROR(line_fn(j, where));
  }
  return absl::OkStatus();
}

absl::Status ReadEpisodesV21(Storage& storage, Meta* meta) {
  RETURN_IF_ERROR(ForEachJsonLine(
      storage, kLegacyEpisodes, [&](const json& j, const std::string& where) -> absl::Status {
        if (!j.contains("episode_index") || !j["episode_index"].is_number_integer() ||
            !j.contains("length") || !j["length"].is_number_integer()) {
          return absl::InvalidArgumentError(
              StrCat(where, ": needs integer \"episode_index\" and \"length\""));
        }
        Episode ep;
        ep.index = j["episode_index"].get<int64_t>();
        ep.length = j["length"].get<int64_t>();
        ep.source = where;
        if (j.contains("tasks") && j["tasks"].is_array()) {
          for (const json& t : j["tasks"]) {
            if (t.is_string()) ep.tasks.push_back(t.get<std::string>());
          }
        }
        meta->episodes.push_back(std::move(ep));
        return absl::OkStatus();
      }));
  std::sort(meta->episodes.begin(), meta->episodes.end(),
            [](const Episode& a, const Episode& b) { return a.index < b.index; });
  int64_t global = 0;
  for (Episode& ep : meta->episodes) {
    if (ep.index < 0 || ep.length < 0) continue;  // reported by CheckEpisodes
    const int64_t chunk = ep.index / meta->chunks_size;
    ASSIGN_OR_RETURN(ep.data_path,
                     FormatPathTemplate(meta->data_path,
                                        {{"episode_chunk", chunk}, {"episode_index", ep.index}},
                                        {}));
    for (const Feature& f : meta->features) {
      if (!f.is_video()) continue;
      VideoSegment seg;
      ASSIGN_OR_RETURN(seg.path,
                       FormatPathTemplate(meta->video_path,
                                          {{"episode_chunk", chunk}, {"episode_index", ep.index}},
                                          {{"video_key", f.key}}));
      ep.videos[f.key] = std::move(seg);
    }
    ep.dataset_from_index = global;
    global += ep.length;
    ep.dataset_to_index = global;
  }
  return ForEachJsonLine(storage, kLegacyTasks,
                         [&](const json& j, const std::string& where) -> absl::Status {
                           if (!j.contains("task_index") || !j["task_index"].is_number_integer() ||
                               !j.contains("task") || !j["task"].is_string()) {
                             return absl::InvalidArgumentError(
                                 StrCat(where, ": needs \"task_index\" and \"task\""));
                           }
                           if (!meta->tasks
                                    .emplace(j["task_index"].get<int64_t>(),
                                             j["task"].get<std::string>())
                                    .second) {
                             return absl::InvalidArgumentError(
                                 StrCat(where, ": task_index repeated"));
                           }
                           return absl::OkStatus();
                         });
}

// Per-episode statistics merged as LeRobot's aggregate_stats does: count-weighted means, the
// pooled variance, the extremes. Quantiles cannot be merged exactly and are left out.
FeatureStats Aggregate(const std::vector<FeatureStats>& parts) {
  FeatureStats out;
  if (parts.empty()) return out;
  const size_t dim = parts[0].mean.size();
  out.mean.assign(dim, 0);
  out.min = parts[0].min;
  out.max = parts[0].max;
  double total = 0;
  for (const FeatureStats& p : parts) total += static_cast<double>(p.count);
  if (total <= 0) return {};
  for (const FeatureStats& p : parts) {
    for (size_t d = 0; d < dim; ++d) out.mean[d] += p.mean[d] * static_cast<double>(p.count) / total;
    for (size_t d = 0; d < dim && d < p.min.size() && d < out.min.size(); ++d) {
      out.min[d] = std::min(out.min[d], p.min[d]);
      out.max[d] = std::max(out.max[d], p.max[d]);
    }
  }
  std::vector<double> var(dim, 0);
  for (const FeatureStats& p : parts) {
    for (size_t d = 0; d < dim; ++d) {
      const double delta = p.mean[d] - out.mean[d];
      var[d] += (p.std[d] * p.std[d] + delta * delta) * static_cast<double>(p.count) / total;
    }
  }
  for (double v : var) out.std.push_back(std::sqrt(v));
  out.count = static_cast<uint64_t>(total);
  return out;
}

absl::Status ReadStats(Storage& storage, Meta* meta) {
  absl::StatusOr<std::string> text = ReadWholeFile(storage, kStatsPath);
  if (text.ok()) {
    const std::string name = storage.Describe(kStatsPath);
    ASSIGN_OR_RETURN(json j, ParseJson(*text, name));
    if (!j.is_object()) return absl::InvalidArgumentError(StrCat(name, ": not a JSON object"));
    for (const auto& [key, s] : j.items()) {
      ASSIGN_OR_RETURN(meta->stats[key], ParseStats(s, StrCat(name, ": ", key)));
    }
    meta->stats_source = std::string(kStatsPath);
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(text.status())) return text.status();
  if (meta->version != Version::kV21) return absl::OkStatus();  // no stats: computed on import
  std::map<std::string, std::vector<FeatureStats>> parts;
  absl::Status s = ForEachJsonLine(
      storage, kLegacyEpisodesStats, [&](const json& j, const std::string& where) -> absl::Status {
        if (!j.contains("stats") || !j["stats"].is_object()) {
          return absl::InvalidArgumentError(StrCat(where, ": no \"stats\" object"));
        }
        for (const auto& [key, st] : j["stats"].items()) {
          ASSIGN_OR_RETURN(FeatureStats f, ParseStats(st, StrCat(where, ": ", key)));
          if (!parts[key].empty() && (f.mean.size() != parts[key][0].mean.size() ||
                                      f.std.size() != f.mean.size())) {
            return absl::InvalidArgumentError(
                StrCat(where, ": ", key, " has statistics of another dimension"));
          }
          parts[key].push_back(std::move(f));
        }
        return absl::OkStatus();
      });
  if (absl::IsNotFound(s)) return absl::OkStatus();
  RETURN_IF_ERROR(s);
  for (const auto& [key, p] : parts) meta->stats[key] = Aggregate(p);
  meta->stats_source = StrCat(kLegacyEpisodesStats, " (aggregated)");
  return absl::OkStatus();
}

// The episode table must be 0..N-1 with contiguous global indices, and agree with info.json.
absl::Status CheckEpisodes(Storage& storage, const Meta& meta) {
  const std::string info = storage.Describe(kInfoPath);
  if (static_cast<int64_t>(meta.episodes.size()) != meta.total_episodes) {
    return absl::InvalidArgumentError(StrCat(info, " says total_episodes ", meta.total_episodes,
                                             ", the episode metadata lists ",
                                             meta.episodes.size()));
  }
  int64_t frames = 0;
  for (size_t i = 0; i < meta.episodes.size(); ++i) {
    const Episode& ep = meta.episodes[i];
    if (ep.index != static_cast<int64_t>(i)) {
      return absl::InvalidArgumentError(StrCat(ep.source, ": episode_index ", ep.index,
                                               " where episode ", i, " was expected (episodes ",
                                               "must be numbered 0, 1, 2, ... without gaps)"));
    }
    if (ep.length <= 0) {
      return absl::InvalidArgumentError(
          StrCat(ep.source, ": episode ", ep.index, " has length ", ep.length));
    }
    if (ep.dataset_from_index != frames || ep.dataset_to_index - ep.dataset_from_index != ep.length) {
      return absl::InvalidArgumentError(StrCat(
          ep.source, ": episode ", ep.index, " has dataset_from_index ", ep.dataset_from_index,
          ", dataset_to_index ", ep.dataset_to_index, " and length ", ep.length,
          "; after the episodes before it they should be ", frames, ", ", frames + ep.length));
    }
    frames += ep.length;
  }
  if (frames != meta.total_frames) {
    return absl::InvalidArgumentError(StrCat(info, " says total_frames ", meta.total_frames,
                                             ", the episode lengths add up to ", frames));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsNumericDtype(std::string_view dtype) {
  static const std::set<std::string_view> kNumeric = {
      "float16", "float32", "float64", "int8",   "int16",  "int32", "int64",
      "uint8",   "uint16",  "uint32",  "uint64", "bool",   "double", "float"};
  return kNumeric.count(dtype) > 0;
}

bool IsIndexColumn(std::string_view key) {
  return std::find(std::begin(kIndexColumns), std::end(kIndexColumns), key) !=
         std::end(kIndexColumns);
}

int64_t Feature::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const Feature* Meta::FindFeature(std::string_view key) const {
  for (const Feature& f : features) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

bool LooksLikeLeRobot(Storage& storage) {
  absl::StatusOr<std::string> text = ReadWholeFile(storage, kInfoPath);
  if (!text.ok()) return false;
  json j = json::parse(text->begin(), text->end(), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("codebase_version");
}

absl::StatusOr<Meta> ReadMeta(Storage& storage, std::string root_name) {
  Meta meta;
  meta.root = std::move(root_name);
  RETURN_IF_ERROR(ReadInfo(storage, &meta));
  if (meta.version == Version::kV30) {
    RETURN_IF_ERROR(ReadEpisodesV30(storage, &meta));
    RETURN_IF_ERROR(ReadTasksV30(storage, &meta));
  } else {
    RETURN_IF_ERROR(ReadEpisodesV21(storage, &meta));
  }
  RETURN_IF_ERROR(CheckEpisodes(storage, meta));
  RETURN_IF_ERROR(ReadStats(storage, &meta));
  for (const Episode& ep : meta.episodes) {
    for (const std::string& task : ep.tasks) {
      const bool known = std::any_of(meta.tasks.begin(), meta.tasks.end(),
                                     [&](const auto& t) { return t.second == task; });
      if (!known) {
        return absl::InvalidArgumentError(StrCat(ep.source, ": episode ", ep.index, " lists task \"",
                                                 task, "\", which the tasks table does not hold"));
      }
    }
  }
  return meta;
}

absl::StatusOr<std::string> FormatPathTemplate(std::string_view tmpl,
                                               const std::map<std::string, int64_t>& ints,
                                               const std::map<std::string, std::string>& strings) {
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    const char c = tmpl[i];
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    const size_t close = tmpl.find('}', i);
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat("path template \"", tmpl, "\": unclosed '{'"));
    }
    const std::string_view field = tmpl.substr(i + 1, close - i - 1);
    const size_t colon = field.find(':');
    const std::string name(field.substr(0, colon));
    const std::string_view spec =
        colon == std::string_view::npos ? std::string_view() : field.substr(colon + 1);
    if (auto s = strings.find(name); s != strings.end() && spec.empty()) {
      out += s->second;
    } else if (auto n = ints.find(name); n != ints.end()) {
      // "", "d", "Nd" or "0Nd".
      std::string_view digits = spec;
      if (!digits.empty() && digits.back() == 'd') digits.remove_suffix(1);
      const bool zero = !digits.empty() && digits[0] == '0';
      int width = 0;
      for (char d : digits) {
        if (d < '0' || d > '9' || width > 100) {
          return absl::InvalidArgumentError(
              StrCat("path template \"", tmpl, "\": format spec '", spec, "' is not supported"));
        }
        width = width * 10 + (d - '0');
      }
      std::string v = std::to_string(n->second);
      if (static_cast<int>(v.size()) < width) {
        v.insert(v.begin(), static_cast<size_t>(width) - v.size(), zero ? '0' : ' ');
      }
      out += v;
    } else {
      return absl::InvalidArgumentError(
          StrCat("path template \"", tmpl, "\": field {", field, "} is not one this layout has"));
    }
    i = close + 1;
  }
  return out;
}

absl::StatusOr<parquet::ParquetFile> OpenParquet(Storage& storage, std::string_view relpath) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, storage.Open(relpath));
  std::shared_ptr<RandomAccessFile> file(std::move(f));
  parquet::ReadRangeFn read = [file](uint64_t offset,
                                     uint64_t length) -> absl::StatusOr<std::string> {
    std::string out(length, '\0');
    RETURN_IF_ERROR(file->Read(offset, length, out.data()));
    return out;
  };
  return parquet::ParquetFile::Open(file->name(), file->size(), std::move(read));
}

absl::StatusOr<std::vector<int64_t>> ReadIntColumn(const parquet::ParquetFile& file,
                                                   std::string_view column) {
  ASSIGN_OR_RETURN(parquet::Column c, file.ReadColumn(column));
  if (!c.lists.empty() || c.null_count != 0) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": column '", column, "' is not a flat non-null integer column"));
  }
  if (const auto* v = std::get_if<std::vector<int64_t>>(&c.values)) return *v;
  if (const auto* v = std::get_if<std::vector<int32_t>>(&c.values)) {
    return std::vector<int64_t>(v->begin(), v->end());
  }
  return absl::InvalidArgumentError(
      StrCat(file.name(), ": column '", column, "' is ",
             parquet::PhysicalTypeName(c.descriptor.physical_type), ", expected an integer"));
}

}  // namespace conveyor::lerobot
