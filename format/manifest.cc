#include "format/manifest.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/strings.h"
#include "format/format.h"

namespace conveyor {
namespace {

using json = nlohmann::json;
namespace pb = format::v1;

constexpr size_t kFixedRecordBytes = 56;

size_t RecordSize(size_t num_streams) {
  size_t n = kFixedRecordBytes + 4 * num_streams;
  return (n + 7) / 8 * 8;
}

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // the table is little-endian; so are all our targets
  out->append(buf, sizeof(T));
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

json StreamToJson(const StreamInfo& s) {
  json j;
  j["name"] = s.name;
  j["kind"] = std::string(format::StreamKindName(s.kind));
  j["codec"] = s.codec;
  j["rate"] = s.rate;
  j["shape"] = s.shape;
  if (!s.names.empty()) j["names"] = s.names;
  if (!s.pix_fmt.empty()) j["pix_fmt"] = s.pix_fmt;
  return j;
}

}  // namespace

int Manifest::StreamIndex(std::string_view name) const {
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::string StreamsFingerprintText(const std::vector<StreamInfo>& streams) {
  json arr = json::array();
  for (const StreamInfo& s : streams) arr.push_back(StreamToJson(s));
  return JsonText(arr);
}

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["format"] = "conveyor-dataset";
  j["format_version"] = m.format_version;
  j["name"] = m.name;
  j["created_by"] = m.created_by;
  j["fingerprint"] = m.fingerprint;
  j["num_episodes"] = m.num_episodes;
  j["total_duration_s"] = m.total_duration_s;
  j["total_bytes"] = m.total_bytes;
  j["streams"] = json::array();
  for (const StreamInfo& s : m.streams) j["streams"].push_back(StreamToJson(s));
  j["stats"] = json::object();
  for (const auto& [name, st] : m.stats) {
    j["stats"][name] = {{"mean", st.mean}, {"std", st.std}, {"min", st.min},
                        {"max", st.max},   {"count", st.count}};
    for (const auto& [q, values] : st.quantiles) j["stats"][name][q] = values;
  }
  j["episode_table"] = {{"path", std::string(kEpisodeTableFile)},
                        {"bytes", m.episode_table_bytes},
                        {"xxh3", m.episode_table_xxh3}};
  j["shards"] = json::array();
  for (const ShardInfo& s : m.shards) {
    j["shards"].push_back({{"path", s.path}, {"bytes", s.bytes}, {"episodes", s.episodes}});
  }
  return JsonText(j, 2) + "\n";
}

absl::StatusOr<Manifest> ManifestFromJson(std::string_view text, std::string_view source) {
  auto bad = [&](std::string_view what) {
    return absl::DataLossError(StrCat("invalid manifest ", source, ": ", what));
  };
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  try {
    if (j.value("format", "") != "conveyor-dataset") {
      return bad("\"format\" is not \"conveyor-dataset\" (is this a Conveyor dataset?)");
    }
    Manifest m;
    m.format_version = j.at("format_version").get<uint32_t>();
    if (m.format_version != format::kFormatVersion) {
      return absl::FailedPreconditionError(StrCat(
          source, ": dataset format version ", m.format_version, " is not supported (this build ",
          "reads version ", format::kFormatVersion, ")"));
    }
    m.name = j.value("name", "");
    m.created_by = j.value("created_by", "");
    m.fingerprint = j.at("fingerprint").get<std::string>();
    m.num_episodes = j.at("num_episodes").get<uint64_t>();
    m.total_duration_s = j.value("total_duration_s", 0.0);
    m.total_bytes = j.value("total_bytes", uint64_t{0});
    for (const json& s : j.at("streams")) {
      StreamInfo info;
      info.name = s.at("name").get<std::string>();
      auto kind = format::ParseStreamKind(s.at("kind").get<std::string>());
      if (!kind.ok()) return bad(StrCat("stream '", info.name, "': ", kind.status().message()));
      info.kind = *kind;
      info.codec = s.value("codec", "");
      info.rate = s.value("rate", 0.0);
      info.shape = s.value("shape", std::vector<int64_t>{});
      info.names = s.value("names", std::vector<std::string>{});
      info.pix_fmt = s.value("pix_fmt", "");
      if (info.name.empty() || m.StreamIndex(info.name) >= 0) {
        return bad(StrCat("stream name '", info.name, "' is empty or repeated"));
      }
      m.streams.push_back(std::move(info));
    }
    const json stats = j.value("stats", json::object());
    for (const auto& [name, s] : stats.items()) {
      StreamStats st;
      st.mean = s.at("mean").get<std::vector<double>>();
      st.std = s.at("std").get<std::vector<double>>();
      st.min = s.at("min").get<std::vector<double>>();
      st.max = s.at("max").get<std::vector<double>>();
      st.count = s.value("count", uint64_t{0});
      for (const auto& [key, v] : s.items()) {
        const bool quantile =
            key.size() >= 2 && key[0] == 'q' &&
            key.find_first_not_of("0123456789", 1) == std::string::npos;
        if (quantile) st.quantiles[key] = v.get<std::vector<double>>();
      }
      m.stats[name] = std::move(st);
    }
    const json& table = j.at("episode_table");
    m.episode_table_bytes = table.at("bytes").get<uint64_t>();
    m.episode_table_xxh3 = table.at("xxh3").get<std::string>();
    for (const json& s : j.at("shards")) {
      ShardInfo info;
      info.path = s.at("path").get<std::string>();
      info.bytes = s.at("bytes").get<uint64_t>();
      info.episodes = s.value("episodes", uint64_t{0});
      if (info.path.empty() || info.path.front() == '/' || info.path.find("..") != std::string::npos) {
        return bad(StrCat("shard path '", info.path, "' must be relative and stay inside the dataset"));
      }
      m.shards.push_back(std::move(info));
    }
    return m;
  } catch (const json::exception& e) {
    return bad(e.what());
  }
}

std::string EpisodeTable::Encode(const std::vector<EpisodeRecord>& records, size_t num_streams) {
  const size_t rs = RecordSize(num_streams);
  std::string out(kEpisodeTableMagic);
  Put<uint32_t>(&out, format::kFormatVersion);
  Put<uint32_t>(&out, static_cast<uint32_t>(num_streams));
  Put<uint64_t>(&out, records.size());
  Put<uint32_t>(&out, static_cast<uint32_t>(rs));
  Put<uint32_t>(&out, 0);
  for (const EpisodeRecord& r : records) {
    size_t start = out.size();
    Put(&out, r.episode_id);
    Put(&out, r.shard);
    Put(&out, r.index_size);
    Put(&out, r.index_offset);
    Put(&out, r.index_xxh3);
    Put(&out, r.data_offset);
    Put(&out, r.data_size);
    Put(&out, r.duration_s);
    for (size_t s = 0; s < num_streams; ++s) Put<uint32_t>(&out, s < r.lengths.size() ? r.lengths[s] : 0);
    out.resize(start + rs, '\0');
  }
  Put<uint64_t>(&out, format::Checksum(out));
  return out;
}

absl::StatusOr<EpisodeTable> EpisodeTable::Parse(std::string bytes, size_t num_streams,
                                                 size_t num_shards, std::string_view source) {
  auto bad = [&](std::string_view what) {
    return absl::DataLossError(StrCat("invalid episode table ", source, ": ", what));
  };
  if (bytes.size() < kEpisodeTableHeaderSize + 8 ||
      std::string_view(bytes).substr(0, 8) != kEpisodeTableMagic) {
    return bad("bad magic at byte offset 0");
  }
  const size_t body = bytes.size() - 8;
  if (format::Checksum(bytes.data(), body) != Get<uint64_t>(bytes.data() + body)) {
    return bad(StrCat("checksum mismatch (", bytes.size(), " bytes)"));
  }
  EpisodeTable t;
  uint32_t version = Get<uint32_t>(bytes.data() + 8);
  if (version != format::kFormatVersion) {
    return absl::FailedPreconditionError(
        StrCat(source, ": episode table version ", version, " is not supported"));
  }
  t.num_streams_ = Get<uint32_t>(bytes.data() + 12);
  t.count_ = Get<uint64_t>(bytes.data() + 16);
  t.record_size_ = Get<uint32_t>(bytes.data() + 24);
  if (t.num_streams_ != num_streams) {
    return bad(StrCat("has ", t.num_streams_, " streams per episode, the manifest lists ",
                            num_streams));
  }
  if (t.record_size_ != RecordSize(num_streams) ||
      (body - kEpisodeTableHeaderSize) != t.count_ * t.record_size_) {
    return bad(StrCat("size ", bytes.size(), " does not fit ", t.count_, " records of ",
                            t.record_size_, " bytes"));
  }
  t.bytes_ = std::move(bytes);
  for (size_t i = 0; i < t.count_; ++i) {
    // Episode ids are record numbers: readers index the table by id.
    const uint64_t id = Get<uint64_t>(t.bytes_.data() + kEpisodeTableHeaderSize + i * t.record_size_);
    if (id != i) return bad(StrCat("record ", i, " has episode id ", id));
    const uint32_t shard = t.shard(i);
    if (shard >= num_shards) {
      return bad(StrCat("episode record ", i, " points at shard ", shard, " but the manifest lists ",
                              num_shards, " shards"));
    }
  }
  return t;
}

EpisodeRecord EpisodeTable::record(size_t i) const {
  const char* p = bytes_.data() + kEpisodeTableHeaderSize + i * record_size_;
  EpisodeRecord r;
  r.episode_id = Get<uint64_t>(p);
  r.shard = Get<uint32_t>(p + 8);
  r.index_size = Get<uint32_t>(p + 12);
  r.index_offset = Get<uint64_t>(p + 16);
  r.index_xxh3 = Get<uint64_t>(p + 24);
  r.data_offset = Get<uint64_t>(p + 32);
  r.data_size = Get<uint64_t>(p + 40);
  r.duration_s = Get<double>(p + 48);
  r.lengths.resize(num_streams_);
  for (size_t s = 0; s < num_streams_; ++s) r.lengths[s] = Get<uint32_t>(p + kFixedRecordBytes + 4 * s);
  return r;
}

uint32_t EpisodeTable::shard(size_t i) const {
  return Get<uint32_t>(bytes_.data() + kEpisodeTableHeaderSize + i * record_size_ + 8);
}

uint32_t EpisodeTable::length(size_t i, size_t stream) const {
  return Get<uint32_t>(bytes_.data() + kEpisodeTableHeaderSize + i * record_size_ +
                       kFixedRecordBytes + 4 * stream);
}

}  // namespace conveyor
