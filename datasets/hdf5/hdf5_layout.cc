#include "datasets/hdf5/hdf5_layout.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/hdf5/hdf5_reader.h"
#include "conveyor/format/v1/shard.pb.h"

namespace conveyor::hdf5 {
namespace {

namespace pb = format::v1;

// A lowdim stream wider than this is not made automatically (a depth image, a point cloud).
constexpr uint64_t kMaxAutoLowdim = 4096;

bool IsNumeric(const DType& t) {
  return t.cls == TypeClass::kInt || t.cls == TypeClass::kUInt || t.cls == TypeClass::kFloat;
}

bool LooksLikeRawImage(const Array& a) {
  return a.dtype.cls == TypeClass::kUInt && a.dtype.size == 1 &&
         ((a.dims.size() == 4 && (a.dims[3] == 3 || a.dims[3] == 1)) || a.dims.size() == 3);
}

StreamSpec Lowdim(std::string name, std::string path) {
  StreamSpec s;
  s.name = std::move(name);
  s.kind = pb::LOWDIM;
  s.path = std::move(path);
  return s;
}

// A numeric per-step dataset as a lowdim stream, when it is one.
bool AddLowdim(const File& file, const std::string& group, const std::string& child,
               const std::string& name, const std::string& rel, Layout* out) {
  absl::StatusOr<Array> a = file.Describe(group + "/" + child, false);
  if (!a.ok() || !IsNumeric(a->dtype) || a->dims.empty()) return false;
  if (a->elements_per_row() > kMaxAutoLowdim) {
    spdlog::warn("hdf5: {}: {}/{} ({} {}) is not read (not an image, and too wide for a lowdim "
                 "stream; map it with #mapping=, docs/hdf5.md)", file.name(), group, child,
                 a->dtype.text, a->ShapeText());
    return false;
  }
  out->streams.push_back(Lowdim(name, rel));
  return true;
}

}  // namespace

std::string PathIn(const std::string& group, const std::string& rel) {
  if (rel == "..") {
    const size_t slash = group.rfind('/');
    return slash == 0 || slash == std::string::npos ? "/" : group.substr(0, slash);
  }
  if (rel.empty()) return group.empty() ? "/" : group;
  return group + "/" + rel;
}

absl::StatusOr<Layout> AlohaLayout(const File& file) {
  Layout l;
  l.kind = "aloha";
  l.rate = 50;
  const bool compressed = file.Exists("/compress_len");
  if (file.Exists("/observations/images")) {
    ASSIGN_OR_RETURN(std::vector<Child> cams, file.List("/observations/images"));
    int row = 0;
    for (const Child& c : cams) {  // byte-wise name order: ACT's camera_names order
      if (!c.is_dataset) continue;
      StreamSpec s;
      s.name = "observation.images." + c.name;
      s.kind = pb::IMAGE;
      s.path = "observations/images/" + c.name;
      ASSIGN_OR_RETURN(Array a, file.Describe("/" + s.path, false));
      if (a.dims.size() == 2 && a.dtype.size == 1) {  // JPEG rows
        s.encoded = true;
        s.codec = "mjpeg";
        if (compressed) {
          s.lengths_path = "compress_len";
          s.lengths_row = row;
        }
      }
      ++row;
      l.streams.push_back(std::move(s));
    }
  }
  if (file.Exists("/observations")) {
    ASSIGN_OR_RETURN(std::vector<Child> obs, file.List("/observations"));
    for (const Child& c : obs) {
      if (!c.is_dataset) continue;
      const std::string name = c.name == "qpos"     ? "observation.state"
                               : c.name == "qvel"   ? "observation.velocity"
                               : c.name == "effort" ? "observation.effort"
                                                    : "observation." + c.name;
      AddLowdim(file, "/observations", c.name, name, "observations/" + c.name, &l);
    }
  }
  ASSIGN_OR_RETURN(std::vector<Child> root, file.List("/"));
  for (const Child& c : root) {
    if (!c.is_dataset || c.name == "compress_len") continue;
    AddLowdim(file, "", c.name, c.name, c.name, &l);
  }
  if (l.streams.empty()) {
    return absl::InvalidArgumentError(
        StrCat(file.name(), ": no /observations/images/<camera>, /observations/<x> or /action ",
               "datasets (not the ALOHA layout; give a mapping, docs/hdf5.md)"));
  }
  return l;
}

absl::StatusOr<Layout> RobomimicLayout(const File& file) {
  Layout l;
  l.kind = "robomimic";
  l.rate = 20;
  l.episode_group = "/data";
  l.group_prefix = "demo_";
  ASSIGN_OR_RETURN(std::vector<Child> demos, file.List("/data"));
  std::vector<std::string> names;
  for (const Child& c : demos) {
    if (c.is_group && c.name.rfind("demo_", 0) == 0) names.push_back(c.name);
  }
  if (names.empty()) {
    return absl::InvalidArgumentError(StrCat(file.name(), ": /data holds no demo_N groups"));
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  const std::string demo = "/data/" + names.front();
  if (file.Exists(demo + "/obs")) {
    ASSIGN_OR_RETURN(std::vector<Child> obs, file.List(demo + "/obs"));
    for (const Child& c : obs) {
      if (!c.is_dataset) continue;
      ASSIGN_OR_RETURN(Array a, file.Describe(demo + "/obs/" + c.name, false));
      if (LooksLikeRawImage(a)) {
        StreamSpec s;
        s.name = "observation.images." + c.name;
        s.kind = pb::IMAGE;
        s.path = "obs/" + c.name;
        l.streams.push_back(std::move(s));
      } else {
        AddLowdim(file, demo + "/obs", c.name, "observation." + c.name, "obs/" + c.name, &l);
      }
    }
  }
  ASSIGN_OR_RETURN(std::vector<Child> top, file.List(demo));
  for (const Child& c : top) {
    if (!c.is_dataset) continue;
    const std::string name = c.name == "actions"   ? "action"
                             : c.name == "rewards" ? "reward"
                             : c.name == "dones"   ? "done"
                             : c.name == "states"  ? "observation.sim_state"
                                                   : c.name;
    AddLowdim(file, demo, c.name, name, c.name, &l);
  }
  // LIBERO: the task's instruction in data's problem_info attribute (JSON).
  ASSIGN_OR_RETURN(std::optional<std::string> info, file.StringAttribute("/data", "problem_info"));
  if (info.has_value() && info->find("language_instruction") != std::string::npos) {
    StreamSpec s;
    s.name = "instruction";
    s.kind = pb::TEXT;
    s.attribute_path = "..";
    s.attribute = "problem_info";
    s.json_key = "language_instruction";
    l.streams.push_back(std::move(s));
  }
  return l;
}

absl::StatusOr<Layout> DetectLayout(const File& file) {
  if (file.Exists("/data")) {
    ASSIGN_OR_RETURN(std::vector<Child> demos, file.List("/data"));
    for (const Child& c : demos) {
      if (c.is_group && c.name.rfind("demo_", 0) == 0) return RobomimicLayout(file);
    }
  }
  if (file.Exists("/observations") || file.Exists("/action")) return AlohaLayout(file);
  return absl::NotFoundError(StrCat(
      file.name(), ": neither the ALOHA layout (/observations, /action) nor the robomimic layout ",
      "(/data/demo_N); name the datasets with a mapping file, #mapping=map.yaml (docs/hdf5.md)"));
}

namespace {

absl::StatusOr<StreamSpec> ParseStream(const std::string& name, const YAML::Node& n,
                                       const std::string& where) {
  StreamSpec s;
  s.name = name;
  const std::string kind = n["kind"] ? n["kind"].as<std::string>() : "lowdim";
  if (kind == "image") {
    s.kind = pb::IMAGE;
  } else if (kind == "lowdim") {
    s.kind = pb::LOWDIM;
  } else if (kind == "text") {
    s.kind = pb::TEXT;
  } else {
    return absl::InvalidArgumentError(StrCat(where, ": kind \"", kind,
                                             "\" (expected image, lowdim or text)"));
  }
  if (n["path"]) s.path = n["path"].as<std::string>();
  while (!s.path.empty() && s.path.front() == '/') s.path.erase(0, 1);
  if (s.kind != pb::TEXT && s.path.empty()) {
    return absl::InvalidArgumentError(StrCat(where, ": no path (the HDF5 dataset)"));
  }
  const std::string enc = n["encoding"] ? n["encoding"].as<std::string>() : "raw";
  if (enc == "jpeg" || enc == "png") {
    s.encoded = true;
    s.codec = enc == "jpeg" ? "mjpeg" : "png";
  } else if (enc != "raw") {
    return absl::InvalidArgumentError(StrCat(where, ": encoding \"", enc,
                                             "\" (expected raw, jpeg or png)"));
  }
  if (n["lengths"]) s.lengths_path = n["lengths"].as<std::string>();
  if (n["lengths_row"]) s.lengths_row = n["lengths_row"].as<int>();
  if (n["value"]) s.text = n["value"].as<std::string>();
  if (n["attribute"]) {
    // "path@name" or "name" (of the episode group).
    const std::string a = n["attribute"].as<std::string>();
    const size_t at = a.find('@');
    s.attribute_path = at == std::string::npos ? "" : a.substr(0, at);
    s.attribute = at == std::string::npos ? a : a.substr(at + 1);
  }
  if (n["json_key"]) s.json_key = n["json_key"].as<std::string>();
  if (s.kind == pb::TEXT && s.attribute.empty() && !n["value"]) {
    return absl::InvalidArgumentError(StrCat(where, ": a text stream needs value or attribute"));
  }
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    static const char* kKnown[] = {"kind", "path", "encoding", "lengths", "lengths_row", "value",
                                   "attribute", "json_key"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return absl::InvalidArgumentError(StrCat(where, ": unknown key \"", key, "\""));
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<Layout> ParseMapping(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(name, ": not YAML or JSON: ", e.what()));
  }
  try {
    Layout l;
    l.kind = "mapped";
    if (!root.IsMap() || !root["streams"] || !root["streams"].IsMap()) {
      return absl::InvalidArgumentError(StrCat(name, ": no \"streams\" map (docs/hdf5.md)"));
    }
    if (root["rate"]) l.rate = root["rate"].as<double>();
    if (root["episodes"]) {
      const YAML::Node e = root["episodes"];
      l.episode_group = e["group"] ? e["group"].as<std::string>() : "";
      if (!l.episode_group.empty() && l.episode_group.front() != '/') {
        l.episode_group = "/" + l.episode_group;
      }
      if (e["prefix"]) l.group_prefix = e["prefix"].as<std::string>();
    }
    if (root["files"]) {
      for (const auto& f : root["files"]) l.files.push_back(f.as<std::string>());
    }
    for (const auto& kv : root["streams"]) {
      const std::string key = kv.first.as<std::string>();
      ASSIGN_OR_RETURN(StreamSpec s, ParseStream(key, kv.second, StrCat(name, ": streams.", key)));
      l.streams.push_back(std::move(s));
    }
    if (l.streams.empty()) return absl::InvalidArgumentError(StrCat(name, ": no streams"));
    return l;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(name, ": ", e.what()));
  }
}

namespace {

// Whether `row` holds a JPEG of exactly `len` bytes: it ends in EOI (FF D9), zeros after it.
bool JpegOfLength(const std::string& row, double len) {
  if (!(len >= 2) || len > static_cast<double>(row.size()) || len != std::floor(len)) return false;
  const size_t n = static_cast<size_t>(len);
  if (static_cast<uint8_t>(row[n - 2]) != 0xFF || static_cast<uint8_t>(row[n - 1]) != 0xD9) return false;
  return std::all_of(row.begin() + static_cast<ptrdiff_t>(n), row.end(), [](char c) { return c == 0; });
}

// Which row of an ALOHA compress_len [cameras, T] is this camera's. ACT writes the rows in its
// config's camera_names order, which the file does not keep (h5py lists datasets by name, and
// ACT's real-robot order, cam_high, cam_low, cam_left_wrist, cam_right_wrist, is not by name): the
// row whose length for frame 0 ends that frame's JPEG exactly, the name-order row first.
absl::Status PickLengthsRow(const RandomAccessFile& raf, const Array& a,
                            const std::vector<double>& lengths, uint64_t t, uint64_t* row) {
  std::string first(static_cast<size_t>(a.dims[1]), '\0');
  RETURN_IF_ERROR(ReadRows(raf, a, 0, 1, first.data()));
  const uint64_t rows = lengths.size() / t;
  if (*row < rows && JpegOfLength(first, lengths[static_cast<size_t>(*row * t)])) return absl::OkStatus();
  for (uint64_t r = 0; r < rows; ++r) {
    if (JpegOfLength(first, lengths[static_cast<size_t>(r * t)])) {
      *row = r;
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();  // none fits: the name-order row, checked frame by frame when read
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> EncodedSizes(const File& f, const RandomAccessFile& raf,
                                                   const std::string& group, const StreamSpec& s,
                                                   const Array& a) {
  const uint64_t t = a.dims[0], maxlen = a.dims[1];
  std::vector<uint32_t> sizes(static_cast<size_t>(t));
  if (s.lengths_path.empty()) {
    std::string row(static_cast<size_t>(maxlen), '\0');
    for (uint64_t i = 0; i < t; ++i) {
      RETURN_IF_ERROR(ReadRows(raf, a, i, 1, row.data()));
      size_t n = row.size();
      while (n > 0 && row[n - 1] == 0) --n;
      sizes[static_cast<size_t>(i)] = static_cast<uint32_t>(n);
    }
    return sizes;
  }
  const std::string lp = PathIn(group, s.lengths_path);
  ASSIGN_OR_RETURN(Array la, f.Describe(lp, false));
  const bool two = la.dims.size() == 2;
  if (!(two ? s.lengths_row >= 0 && static_cast<uint64_t>(s.lengths_row) < la.dims[0] &&
                  la.dims[1] == t
            : la.dims.size() == 1 && la.dims[0] == t)) {
    return absl::InvalidArgumentError(StrCat(
        f.name(), ": ", lp, " is ", la.ShapeText(), ", but stream '", s.name, "' (", a.path,
        ", T = ", t, ") needs its lengths ", two ? StrCat("in row ", s.lengths_row, " of ") : "",
        "[", two ? "cameras, " : "", "T]"));
  }
  ASSIGN_OR_RETURN(std::vector<double> all, f.ReadNumbers(lp));
  uint64_t row = two ? static_cast<uint64_t>(s.lengths_row) : 0;
  if (two && s.codec == "mjpeg") RETURN_IF_ERROR(PickLengthsRow(raf, a, all, t, &row));
  for (uint64_t i = 0; i < t; ++i) {
    const double v = all[static_cast<size_t>(row * t + i)];
    if (!(v >= 0) || v != std::floor(v) || v > static_cast<double>(maxlen)) {
      return absl::DataLossError(StrCat(f.name(), ": ", lp, " says frame ", i, " of stream '",
                                        s.name, "' (", a.path, ") is ", v, " bytes, but its rows ",
                                        "hold ", maxlen, " bytes"));
    }
    sizes[static_cast<size_t>(i)] = static_cast<uint32_t>(v);
  }
  return sizes;
}


}  // namespace conveyor::hdf5
