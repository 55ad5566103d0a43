// The parts of Dataset every format shares; each format's own reads live in its folder
// (native/, lerobot/), and Dataset::Open in registry.cc.
#include "datasets/dataset.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/npy.h"

namespace conveyor {

namespace pb = format::v1;

absl::StatusOr<LocationOptions> LocationOptions::Parse(std::string_view uri, std::string* location) {
  LocationOptions o;
  const size_t hash = uri.find('#');
  *location = std::string(uri.substr(0, hash));
  if (hash == std::string_view::npos) return o;
  o.text_ = std::string(uri.substr(hash + 1));
  std::string_view rest = o.text_;
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view item = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(StrCat(
          "dataset location '", *location, "': option '", item,
          "' after '#' is not key=value (options are written LOCATION#key=value&key2=value2)"));
    }
    const std::string key(item.substr(0, eq));
    if (!o.values_.emplace(key, std::string(item.substr(eq + 1))).second) {
      return absl::InvalidArgumentError(
          StrCat("dataset location '", *location, "': option '", key, "' is given twice"));
    }
  }
  return o;
}

std::optional<std::string> LocationOptions::Take(std::string_view key) {
  auto it = values_.find(key);
  if (it == values_.end()) return std::nullopt;
  std::string v = std::move(it->second);
  values_.erase(it);
  return v;
}

absl::StatusOr<std::optional<double>> LocationOptions::TakePositive(std::string_view key) {
  std::optional<std::string> text = Take(key);
  if (!text.has_value()) return std::optional<double>();
  char* end = nullptr;
  const double v = std::strtod(text->c_str(), &end);
  if (text->empty() || end != text->c_str() + text->size() || !std::isfinite(v) || v <= 0) {
    return absl::InvalidArgumentError(StrCat("dataset option ", key, "=", *text,
                                             ": expected a positive number"));
  }
  return std::optional<double>(v);
}

absl::Status LocationOptions::CheckAllTaken(std::string_view format) const {
  if (values_.empty()) return absl::OkStatus();
  std::string keys;
  for (const auto& [k, v] : values_) StrAppend(&keys, keys.empty() ? "" : ", ", k);
  return absl::InvalidArgumentError(StrCat("dataset option(s) ", keys, " after '#' are not known to ",
                                           "the ", format, " format (the formats that take options: ",
                                           "docs/rlds.md, docs/hdf5.md)"));
}

std::string Dataset::ShardName(uint32_t shard) const {
  if (shard >= manifest_.shards.size()) return StrCat("<shard ", shard, ">");
  return storage_->Describe(manifest_.shards[shard].path);
}

absl::StatusOr<std::vector<int64_t>> Dataset::StoredShape(size_t episode, int stream) const {
  if (episode >= num_episodes() || stream < 0 ||
      static_cast<size_t>(stream) >= manifest_.streams.size()) {
    return absl::OutOfRangeError(StrCat(uri_, ": no episode ", episode, " or stream ", stream));
  }
  const StreamInfo& info = manifest_.streams[static_cast<size_t>(stream)];
  std::optional<std::vector<int64_t>> shape = NpyCodecShape(info.codec);
  if (info.kind != pb::LOWDIM || !shape.has_value()) {
    return absl::InvalidArgumentError(StrCat(uri_, ", stream '", info.name, "' (codec '",
                                             info.codec, "') is not a per-clip tensor (a .npy)"));
  }
  return *shape;
}

absl::Status Dataset::VerifyEpisode(size_t episode) const {
  ASSIGN_OR_RETURN(auto index, LoadEpisode(episode));
  std::string packet;
  std::vector<float> values;
  for (int s = 0; s < index->streams_size(); ++s) {
    const pb::StreamIndex& si = index->streams(s);
    if (si.kind() == pb::LOWDIM) {
      RETURN_IF_ERROR(ReadLowdim(*index, s, 0, si.num_frames(), &values));
    } else if (si.kind() != pb::TEXT) {
      for (int p = 0; p < si.packets().offset_size(); ++p) {
        RETURN_IF_ERROR(ReadPacket(*index, s, static_cast<size_t>(p), &packet));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor
