#include "datasets/rlds/rlds_features.h"

#include <nlohmann/json.hpp>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::rlds {
namespace {

using json = nlohmann::json;

// TFDS writes the class's full Python name; the last component is enough.
std::string ClassOf(const json& j) {
  const std::string name = j.value("pythonClassName", std::string());
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

// Shape dimensions are written as strings ("256") or numbers.
absl::StatusOr<std::vector<int64_t>> ShapeOf(const json& body, const std::string& where) {
  std::vector<int64_t> shape;
  if (!body.contains("shape")) return shape;
  const json& dims = body["shape"].value("dimensions", json::array());
  if (!dims.is_array()) return absl::InvalidArgumentError(StrCat(where, ": shape.dimensions is not a list"));
  for (const json& d : dims) {
    int64_t v = 0;
    if (d.is_number_integer()) {
      v = d.get<int64_t>();
    } else if (d.is_string()) {
      try {
        v = std::stoll(d.get<std::string>());
      } catch (...) {
        return absl::InvalidArgumentError(StrCat(where, ": shape dimension '", d.get<std::string>(),
                                                 "' is not a number"));
      }
    } else {
      return absl::InvalidArgumentError(StrCat(where, ": a shape dimension is not a number"));
    }
    shape.push_back(v);
  }
  return shape;
}

struct Walker {
  const std::string& source;
  Features out;

  absl::Status Walk(const json& j, const std::string& key, bool per_step) {
    const std::string cls = ClassOf(j);
    const std::string where = StrCat(source, ": feature '", key.empty() ? "(root)" : key, "'");
    if (!j.is_object()) return absl::InvalidArgumentError(StrCat(where, " is not an object"));
    if (cls == "FeaturesDict" || j.contains("featuresDict")) {
      const json& fs = j.value("featuresDict", json::object()).value("features", json::object());
      if (!fs.is_object()) return absl::InvalidArgumentError(StrCat(where, ": featuresDict.features is not an object"));
      for (const auto& [name, sub] : fs.items()) {
        RETURN_IF_ERROR(Walk(sub, key.empty() ? name : StrCat(key, "/", name), per_step));
      }
      return absl::OkStatus();
    }
    if (cls == "Dataset" || cls == "Sequence" || j.contains("sequence")) {
      if (per_step) {
        out.skipped.push_back(StrCat(key, " (a sequence inside steps)"));
        return absl::OkStatus();
      }
      const json& seq = j.value("sequence", json::object());
      if (!seq.contains("feature")) return absl::InvalidArgumentError(StrCat(where, ": sequence has no feature"));
      return Walk(seq["feature"], key, /*per_step=*/true);
    }
    FeatureSpec f;
    f.key = key;
    f.per_step = per_step;
    if (cls == "Image" || j.contains("image")) {
      const json& body = j.value("image", json::object());
      f.kind = FeatureKind::kImage;
      ASSIGN_OR_RETURN(f.shape, ShapeOf(body, where));
      f.dtype = body.value("dtype", std::string("uint8"));
      f.encoding = body.value("encodingFormat", std::string("png"));
      if (f.encoding != "jpeg" && f.encoding != "png") {
        out.skipped.push_back(StrCat(key, " (image encoding '", f.encoding, "')"));
        return absl::OkStatus();
      }
    } else if (cls == "Text" || j.contains("text")) {
      f.kind = FeatureKind::kText;
      f.dtype = "string";
    } else if (cls == "Tensor" || cls == "Scalar" || j.contains("tensor")) {
      const json& body = j.value("tensor", json::object());
      ASSIGN_OR_RETURN(f.shape, ShapeOf(body, where));
      f.dtype = body.value("dtype", std::string());
      f.encoding = body.value("encoding", std::string("none"));
      f.kind = f.dtype == "string" ? FeatureKind::kText : FeatureKind::kTensor;
      if (f.encoding != "none" && f.encoding != "") {
        out.skipped.push_back(StrCat(key, " (tensor encoding '", f.encoding, "')"));
        return absl::OkStatus();
      }
      for (int64_t d : f.shape) {
        if (d <= 0) {
          out.skipped.push_back(StrCat(key, " (a variable dimension)"));
          return absl::OkStatus();
        }
      }
      if (f.kind == FeatureKind::kText && !f.shape.empty()) {
        out.skipped.push_back(StrCat(key, " (a tensor of strings)"));
        return absl::OkStatus();
      }
    } else if (cls == "ClassLabel" || j.contains("classLabel")) {
      f.kind = FeatureKind::kTensor;
      f.dtype = "int64";
    } else {
      out.skipped.push_back(StrCat(key, " (", cls.empty() ? "unknown feature" : cls, ")"));
      return absl::OkStatus();
    }
    out.features.push_back(std::move(f));
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<Features> ParseFeatures(std::string_view text, const std::string& source) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(StrCat(source, ": not a JSON object"));
  }
  Walker w{source, {}};
  try {
    RETURN_IF_ERROR(w.Walk(j, "", false));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ": ", e.what()));
  }
  return std::move(w.out);
}

std::string StreamName(const FeatureSpec& f) {
  std::string name = f.key;
  if (f.per_step && name.rfind("steps/", 0) == 0) name = name.substr(6);
  for (char& c : name) {
    if (c == '/') c = '.';
  }
  return name;
}

}  // namespace conveyor::rlds
