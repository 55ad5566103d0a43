#include "datasets/rlds/rlds_dataset.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/internal/format_util.h"
#include "datasets/lerobot/lerobot_dataset.h"
#include "datasets/rlds/internal/rlds_episode.h"
#include "datasets/rlds/rlds_features.h"
#include "datasets/rlds/rlds_index.h"
#include "format/format.h"
#include "media/image_decoder.h"
#include "media/media_demux.h"

namespace conveyor::rlds {
namespace {

namespace pb = format::v1;
using json = nlohmann::json;

constexpr std::string_view kInfoFile = "dataset_info.json";
constexpr std::string_view kFeaturesFile = "features.json";
constexpr std::string_view kInstructionKey = "steps/language_instruction";


// What dataset_info.json says of the split read: its shard files, in order.
struct SplitInfo {
  std::string dataset;  // dataset_info.json's name
  std::string name;
  std::vector<std::string> shards;
  std::vector<uint64_t> shard_episodes;  // shardLengths
};

absl::StatusOr<std::string> ShardFileName(std::string tmpl, const std::string& dataset,
                                          const std::string& split, size_t i, size_t n,
                                          const std::string& where) {
  char xy[64];
  std::snprintf(xy, sizeof(xy), "%05zu-of-%05zu", i, n);
  const std::pair<std::string, std::string> subs[] = {
      {"{DATASET}", dataset}, {"{SPLIT}", split}, {"{FILEFORMAT}", "tfrecord"}, {"{SHARD_X_OF_Y}", xy}};
  for (const auto& [from, to] : subs) {
    for (size_t at = tmpl.find(from); at != std::string::npos; at = tmpl.find(from, at + to.size())) {
      tmpl.replace(at, from.size(), to);
    }
  }
  if (tmpl.find('{') != std::string::npos) {
    return absl::InvalidArgumentError(StrCat(where, ": filepathTemplate '", tmpl,
                                             "' has a field Conveyor does not know"));
  }
  return tmpl;
}

absl::StatusOr<SplitInfo> ReadSplit(const std::string& text, const std::string& where,
                                    std::optional<std::string> want) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(StrCat(where, ": not a JSON object"));
  try {
    const std::string format = j.value("fileFormat", std::string("tfrecord"));
    if (format != "tfrecord") {
      return absl::UnimplementedError(StrCat(where, ": fileFormat '", format, "': Conveyor reads ",
                                             "RLDS / TFDS datasets written as TFRecord shards only"));
    }
    const std::string name = j.value("name", std::string());
    const json splits = j.value("splits", json::array());
    std::vector<std::string> names;
    for (const json& s : splits) names.push_back(s.value("name", std::string()));
    std::string pick;
    if (want.has_value()) {
      pick = *want;
    } else if (std::find(names.begin(), names.end(), "train") != names.end()) {
      pick = "train";
    } else if (names.size() == 1) {
      pick = names[0];
    }
    for (const json& s : splits) {
      if (s.value("name", std::string()) != pick) continue;
      SplitInfo out;
      out.dataset = name.empty() ? std::string("rlds") : name;
      out.name = pick;
      const std::string tmpl = s.value("filepathTemplate", std::string("{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"));
      const json lengths = s.value("shardLengths", json::array());
      for (size_t i = 0; i < lengths.size(); ++i) {
        const json& l = lengths[i];
        out.shard_episodes.push_back(l.is_string() ? std::stoull(l.get<std::string>()) : l.get<uint64_t>());
        ASSIGN_OR_RETURN(std::string file, ShardFileName(tmpl, name, pick, i, lengths.size(), where));
        out.shards.push_back(std::move(file));
      }
      if (out.shards.empty()) return absl::InvalidArgumentError(StrCat(where, ": split '", pick, "' lists no shards (shardLengths)"));
      return out;
    }
    std::string list;
    for (const std::string& n : names) StrAppend(&list, list.empty() ? "" : ", ", n);
    return absl::InvalidArgumentError(StrCat(where, ": ", pick.empty() ? "no split named 'train' and more than one split" : StrCat("no split '", pick, "'"),
                                             " (splits: ", list, "); choose one with the location option #split=NAME"));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat(where, ": ", e.what()));
  }
}

class RldsDataset final : public Dataset {
 public:
  std::string format() const override { return "rlds"; }
  absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> LoadEpisode(size_t episode) const override;
  absl::Status ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                          std::string* out) const override;
  absl::Status ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first, size_t count,
                          std::vector<float>* out) const override;
  absl::Status VerifyShard(uint32_t shard) const override;
  bool reads_whole_episodes() const override { return true; }
  uint64_t mean_episode_bytes() const override { return mean_episode_bytes_; }
  std::optional<EpisodeReadStats> episode_read_stats() const override { return cache_->stats(); }
  void ReserveEpisodeCache(uint64_t bytes) const override { cache_->Reserve(bytes); }
  void DropEpisodeCache() const override { cache_->Clear(); }

  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri, LocationOptions& options);

 private:
  struct Episode {
    uint32_t shard = 0;
    RecordEntry record;
  };
  absl::Status Init(LocationOptions& options);
  absl::Status IndexShards(const SplitInfo& split);
  absl::Status BuildStreams(const Features& features);
  absl::Status BuildTable(const std::string& options_text);
  absl::StatusOr<std::unique_ptr<ParsedEpisode>> Load(size_t episode) const;
  absl::StatusOr<std::shared_ptr<const ParsedEpisode>> Parsed(size_t episode) const;
  absl::Status BuildIndex(size_t episode, uint64_t steps, ParsedEpisode* p) const;
  std::string Where(size_t episode) const;

  double rate_ = 1;
  std::string features_name_;
  std::vector<FeatureSpec> read_;                // every feature checked in each record
  std::vector<FeatureSpec> stream_features_;     // per manifest stream
  std::vector<std::unique_ptr<RandomAccessFile>> files_;  // per shard
  std::vector<Episode> episodes_list_;
  std::map<std::string, Moments> moments_;  // lowdim features' statistics, by key
  std::map<std::string, pb::CodecParams> image_params_;  // image features, probed once (by key)
  uint64_t mean_episode_bytes_ = 0;
  std::unique_ptr<EpisodeCache> cache_;
  mutable absl::Mutex mu_;
  mutable std::map<std::string, bool> inexact_warned_ ABSL_GUARDED_BY(mu_);
};

std::string RldsDataset::Where(size_t episode) const {
  const Episode& e = episodes_list_[episode];
  return StrCat(files_[e.shard]->name(), ", record at byte ", e.record.ref.offset, " (episode ", episode, ")");
}

absl::StatusOr<std::unique_ptr<Dataset>> RldsDataset::Open(std::unique_ptr<Storage> storage,
                                                           std::string uri, LocationOptions& options) {
  std::unique_ptr<RldsDataset> ds(new RldsDataset());
  ds->uri_ = RedactUri(uri);
  ds->storage_ = std::move(storage);
  RETURN_IF_ERROR(ds->Init(options));
  return std::unique_ptr<Dataset>(std::move(ds));
}

absl::Status RldsDataset::Init(LocationOptions& options) {
  ASSIGN_OR_RETURN(std::optional<double> rate, options.TakePositive("rate"));
  rate_ = rate.value_or(1.0);
  ASSIGN_OR_RETURN(std::optional<double> cache_mb, options.TakePositive("cache_mb"));
  const std::optional<std::string> split_name = options.Take("split");
  const std::string info_name = storage_->Describe(kInfoFile);
  features_name_ = storage_->Describe(kFeaturesFile);
  ASSIGN_OR_RETURN(std::string info_text, ReadWholeFile(*storage_, kInfoFile, 64ull << 20));
  ASSIGN_OR_RETURN(SplitInfo split, ReadSplit(info_text, info_name, split_name));
  ASSIGN_OR_RETURN(std::string features_text, ReadWholeFile(*storage_, kFeaturesFile, 64ull << 20));
  ASSIGN_OR_RETURN(Features features, ParseFeatures(features_text, features_name_));
  for (const std::string& s : features.skipped) {
    spdlog::warn("rlds: {}: feature {} is not read (docs/rlds.md)", uri_, s);
  }
  for (const FeatureSpec& f : features.features) {
    if (f.per_step || f.kind == FeatureKind::kText) read_.push_back(f);
    if (!f.per_step && f.kind != FeatureKind::kText) {
      spdlog::info("rlds: {}: episode-level feature {} is not a stream (only per-step features and "
                   "episode text are)", uri_, f.key);
    }
  }
  if (std::none_of(read_.begin(), read_.end(), [](const FeatureSpec& f) { return f.per_step; })) {
    return absl::InvalidArgumentError(StrCat(features_name_, ": no per-step feature Conveyor can ",
                                             "read (an RLDS dataset has a 'steps' Dataset feature)"));
  }
  RETURN_IF_ERROR(IndexShards(split));
  cache_ = std::make_unique<EpisodeCache>(
      static_cast<uint64_t>(cache_mb.value_or(256.0) * (1 << 20)), episodes_list_.size());
  RETURN_IF_ERROR(BuildStreams(features));
  RETURN_IF_ERROR(BuildTable(options.text()));
  manifest_.name = split.dataset;
  manifest_.created_by = StrCat("RLDS / TFDS split '", split.name, "' (read in place)");
  return absl::OkStatus();
}

absl::Status RldsDataset::IndexShards(const SplitInfo& split) {
  const size_t n = split.shards.size();
  files_.resize(n);
  std::vector<ShardIndex> indexes(n);
  const std::string cache_dir = lerobot::IndexCacheDir({});
  std::atomic<size_t> built{0};
  std::atomic<uint64_t> built_bytes{0};
  const RecordVisitor count = [&](std::string_view data, const std::string& where,
                                  std::map<std::string, Moments>* moments) -> absl::StatusOr<uint64_t> {
    tensorflow::Example ex;
    ASSIGN_OR_RETURN(uint64_t steps, CheckRecord(data, read_, where, &ex));
    std::vector<float> row;
    for (const FeatureSpec& f : read_) {
      if (!f.per_step || f.kind != FeatureKind::kTensor) continue;
      const tensorflow::Feature& feat = ex.features().feature().at(f.key);
      const size_t dim = static_cast<size_t>(f.elements());
      row.resize(dim);
      Moments& m = (*moments)[f.key];
      for (uint64_t k = 0; k < steps; ++k) {
        if (feat.kind_case() == tensorflow::Feature::kFloatList) {
          m.Add(feat.float_list().value().data() + k * dim, dim);
        } else {
          for (size_t d = 0; d < dim; ++d) row[d] = static_cast<float>(feat.int64_list().value(static_cast<int>(k * dim + d)));
          m.Add(row.data(), dim);
        }
      }
    }
    return steps;
  };
  RETURN_IF_ERROR(ParallelFor("rlds-index", static_cast<int>(std::min<size_t>(n, 4)), n, [&](size_t i) -> absl::Status {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> f = storage_->Open(split.shards[i]);
    if (absl::IsNotFound(f.status())) {
      return absl::NotFoundError(StrCat(storage_->Describe(split.shards[i]), " is missing (shard ", i,
                                        " of ", n, " of split '", split.name, "', named by dataset_info.json)"));
    }
    RETURN_IF_ERROR(f.status());
    files_[i] = *std::move(f);
    ASSIGN_OR_RETURN(indexes[i], IndexShard(*files_[i], cache_dir, count));
    if (!indexes[i].from_cache) {
      const size_t done = ++built;
      built_bytes += files_[i]->size();
      spdlog::info("rlds: indexed {} ({} records); {} shards indexed, {:.1f} MB read", files_[i]->name(),
                   indexes[i].records.size(), done, static_cast<double>(built_bytes.load()) / 1e6);
    }
    if (indexes[i].records.size() != split.shard_episodes[i]) {
      spdlog::warn("rlds: {} holds {} records, dataset_info.json's shardLengths says {}; the records are read",
                   files_[i]->name(), indexes[i].records.size(), split.shard_episodes[i]);
    }
    return absl::OkStatus();
  }));
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [key, m] : indexes[i].moments) moments_[key].Merge(m);
    manifest_.shards.push_back({split.shards[i], files_[i]->size(), indexes[i].records.size()});
    for (const RecordEntry& r : indexes[i].records) {
      episodes_list_.push_back({static_cast<uint32_t>(i), r});
      total += r.ref.frame_bytes();
    }
  }
  if (episodes_list_.empty()) return absl::InvalidArgumentError(StrCat(uri_, ": the split's shards hold no records"));
  mean_episode_bytes_ = total / episodes_list_.size();
  return absl::OkStatus();
}

absl::Status RldsDataset::BuildStreams(const Features& features) {
  // The first readable episode's record tells the cameras' codec and size (not kept: its index
  // needs the streams).
  size_t e0 = 0;
  while (e0 < episodes_list_.size() && !episodes_list_[e0].record.error.empty()) ++e0;
  if (e0 == episodes_list_.size()) {
    return absl::DataLossError(StrCat(uri_, ": every record is broken; the first: ",
                                      episodes_list_[0].record.error));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ParsedEpisode> first, Load(e0));
  std::vector<std::pair<StreamInfo, FeatureSpec>> streams;
  for (const FeatureSpec& f : read_) {
    StreamInfo info;
    info.name = f.key == kInstructionKey ? std::string("instruction") : StreamName(f);
    info.rate = rate_;
    if (f.kind == FeatureKind::kImage) {
      uint64_t steps = 0;
      ASSIGN_OR_RETURN(const tensorflow::Feature* feat, FindFeature(first->example, f, &steps, Where(e0)));
      ASSIGN_OR_RETURN(pb::CodecParams params,
                       ProbeImageBytes(feat->bytes_list().value(0), StrCat(Where(e0), ", '", f.key, "' step 0")));
      info.kind = pb::IMAGE;
      image_params_[f.key] = params;
      info.codec = params.codec();
      info.pix_fmt = params.pix_fmt();
      info.shape = {params.height(), params.width(), 3};
    } else if (f.kind == FeatureKind::kTensor) {
      info.kind = pb::LOWDIM;
      info.codec = "rlds";
      info.shape = {f.elements()};
      for (int64_t i = 0; i < f.elements(); ++i) info.names.push_back(StrCat(info.name, "_", i));
    } else {
      info.kind = pb::TEXT;
      info.codec = "utf-8";
      info.rate = 0;
    }
    streams.push_back({std::move(info), f});
  }
  std::stable_sort(streams.begin(), streams.end(), [](const auto& a, const auto& b) {
    const int ka = datasets_internal::StreamKindOrder(a.first.kind), kb = datasets_internal::StreamKindOrder(b.first.kind);
    return ka != kb ? ka < kb : a.first.name < b.first.name;
  });
  for (size_t i = 1; i < streams.size(); ++i) {
    if (streams[i].first.name == streams[i - 1].first.name) {
      return absl::InvalidArgumentError(StrCat(features_name_, ": features '", streams[i - 1].second.key,
                                               "' and '", streams[i].second.key, "' map to one stream name '",
                                               streams[i].first.name, "'"));
    }
  }
  for (auto& [info, f] : streams) {
    auto m = moments_.find(f.key);
    if (info.kind == pb::LOWDIM && m != moments_.end() && m->second.count > 0) {
      StreamStats& st = manifest_.stats[info.name];
      st.mean = m->second.mean;
      st.min = m->second.min;
      st.max = m->second.max;
      st.count = m->second.count;
      for (double m2 : m->second.m2) st.std.push_back(std::sqrt(m2 / static_cast<double>(m->second.count)));
    }
    manifest_.streams.push_back(std::move(info));
    stream_features_.push_back(f);
  }
  return absl::OkStatus();
}

absl::Status RldsDataset::BuildTable(const std::string& options_text) {
  std::vector<EpisodeRecord> records;
  records.reserve(episodes_list_.size());
  std::string files;
  for (const ShardInfo& s : manifest_.shards) StrAppend(&files, s.path, " ", s.bytes, "\n");
  for (size_t e = 0; e < episodes_list_.size(); ++e) {
    const Episode& ep = episodes_list_[e];
    if (ep.record.steps == 0 || ep.record.steps > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(StrCat(Where(e), ": ", ep.record.steps, " steps"));
    }
    EpisodeRecord r;
    r.episode_id = e;
    r.shard = ep.shard;
    r.data_offset = ep.record.ref.offset;
    r.data_size = ep.record.ref.frame_bytes();
    r.duration_s = static_cast<double>(ep.record.steps) / rate_;
    for (const StreamInfo& s : manifest_.streams) {
      r.lengths.push_back(s.kind == pb::TEXT ? 1u : static_cast<uint32_t>(ep.record.steps));
    }
    manifest_.total_duration_s += r.duration_s;
    records.push_back(std::move(r));
  }
  std::string table = EpisodeTable::Encode(records, manifest_.streams.size());
  manifest_.fingerprint = format::ChecksumHex(format::Checksum(StrCat(
      StreamsFingerprintText(manifest_.streams), "\nrlds #", options_text, "\n", files, table)));
  manifest_.episode_table_bytes = table.size();
  manifest_.episode_table_xxh3 = format::ChecksumHex(format::Checksum(table));
  for (const ShardInfo& s : manifest_.shards) manifest_.total_bytes += s.bytes;
  ASSIGN_OR_RETURN(episodes_, EpisodeTable::Parse(std::move(table), manifest_.streams.size(),
                                                  manifest_.shards.size(), features_name_));
  manifest_.num_episodes = episodes_.size();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParsedEpisode>> RldsDataset::Load(size_t episode) const {
  const Episode& ep = episodes_list_[episode];
  const std::string where = Where(episode);
  if (!ep.record.error.empty()) {
    // Broken when indexed; read again in case the shard was repaired (then it is re-indexed).
    return absl::DataLossError(StrCat(ep.record.error, " (episode ", episode, "; found when the shard was indexed)"));
  }
  std::string frame(ep.record.ref.frame_bytes(), '\0');
  RETURN_IF_ERROR(files_[ep.shard]->Read(ep.record.ref.offset, frame.size(), frame.data()));
  ASSIGN_OR_RETURN(std::string_view data, CheckFrame(frame, ep.record.ref.length, where));
  auto p = std::make_unique<ParsedEpisode>();
  ASSIGN_OR_RETURN(uint64_t steps, CheckRecord(data, read_, where, &p->example));
  if (steps != ep.record.steps) {
    return absl::DataLossError(StrCat(where, ": ", steps, " steps, its index says ", ep.record.steps,
                                      " (the shard changed after it was indexed; delete its entry in ",
                                      lerobot::IndexCacheDir({}), ")"));
  }
  p->bytes = frame.size();
  if (!stream_features_.empty()) RETURN_IF_ERROR(BuildIndex(episode, steps, p.get()));
  return p;
}

absl::Status RldsDataset::BuildIndex(size_t episode, uint64_t steps, ParsedEpisode* p) const {
  const std::string where = Where(episode);
  auto index = std::make_shared<pb::EpisodeIndex>();
  index->set_format_version(format::kFormatVersion);
  index->set_episode_id(episode);
  index->set_source(where);
  index->set_duration_s(static_cast<double>(steps) / rate_);
  const TimeBase tb = FrameTimeBase(rate_);
  for (size_t s = 0; s < stream_features_.size(); ++s) {
    const FeatureSpec& f = stream_features_[s];
    const StreamInfo& info = manifest_.streams[s];
    uint64_t n = 0;
    ASSIGN_OR_RETURN(const tensorflow::Feature* feat, FindFeature(p->example, f, &n, where));
    p->features.push_back(feat);
    pb::StreamIndex* out = index->add_streams();
    out->set_name(info.name);
    out->set_kind(info.kind);
    out->mutable_codec()->set_codec(info.codec);
    if (info.kind == pb::IMAGE) {
      const auto& values = feat->bytes_list().value();
      // The stream's codec parameters, probed (decoded) once; each episode's first image header
      // is checked against them (a header parse, not a decode: this runs per episode read).
      *out->mutable_codec() = image_params_.at(f.key);
      absl::StatusOr<ImageHeader> h = PeekImageHeader(values.Get(0));
      if (!h.ok()) return Annotate(h.status(), StrCat(where, ", '", f.key, "' step 0"));
      if (h->codec != info.codec || h->height != info.shape[0] || h->width != info.shape[1]) {
        return absl::DataLossError(StrCat(where, ", '", f.key, "': ", h->codec, " ", h->width, "x",
                                          h->height, ", the dataset's stream is ", info.codec, " ",
                                          info.shape[1], "x", info.shape[0], " (its first readable episode); every episode must match"));
      }
      out->set_time_base_num(tb.num);
      out->set_time_base_den(tb.den);
      pb::PacketTable* t = out->mutable_packets();
      for (int k = 0; k < values.size(); ++k) {
        t->add_pts(k);
        t->add_dts(k);
        t->add_duration(1);
        t->add_offset(static_cast<uint64_t>(k));  // the step in the record
        t->add_size(static_cast<uint32_t>(values.Get(k).size()));
        t->add_flags(format::kPacketKey);
        t->add_xxh3(format::Checksum(values.Get(k)));
      }
      out->set_num_frames(static_cast<uint64_t>(values.size()));
    } else if (info.kind == pb::LOWDIM) {
      out->set_time_base_num(1);
      out->set_time_base_den(1);
      for (uint64_t k = 0; k < steps; ++k) out->add_timestamps_s(static_cast<double>(k) / rate_);
      out->mutable_blocks()->set_dim(static_cast<int32_t>(info.shape[0]));
      out->set_num_frames(steps);
    } else {
      out->set_time_base_num(1);
      out->set_time_base_den(1);
      const auto& values = feat->bytes_list().value();
      out->set_text(values.empty() ? std::string() : values.Get(0));
      out->set_num_frames(1);
    }
    if (out->num_frames() != episodes_.length(episode, s)) {
      return absl::DataLossError(StrCat(where, ", stream '", info.name, "': ", out->num_frames(),
                                        " frames, the index says ", episodes_.length(episode, s)));
    }
  }
  p->index = std::move(index);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ParsedEpisode>> RldsDataset::Parsed(size_t episode) const {
  if (episode >= episodes_list_.size()) {
    return absl::OutOfRangeError(StrCat("episode ", episode, " does not exist (", episodes_list_.size(), " episodes)"));
  }
  return cache_->Get(episode, [&] { return Load(episode); });
}

absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> RldsDataset::LoadEpisode(size_t episode) const {
  ASSIGN_OR_RETURN(std::shared_ptr<const ParsedEpisode> p, Parsed(episode));
  return std::shared_ptr<const pb::EpisodeIndex>(p, p->index.get());
}

absl::Status RldsDataset::ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                                     std::string* out) const {
  if (stream < 0 || static_cast<size_t>(stream) >= stream_features_.size() ||
      manifest_.streams[static_cast<size_t>(stream)].kind != pb::IMAGE) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not an image stream"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const ParsedEpisode> p, Parsed(index.episode_id()));
  const auto& values = p->features[static_cast<size_t>(stream)]->bytes_list().value();
  const pb::PacketTable& t = index.streams(stream).packets();
  if (packet >= static_cast<size_t>(values.size()) || packet >= static_cast<size_t>(t.xxh3_size())) {
    return absl::OutOfRangeError(StrCat(Where(index.episode_id()), ", stream '", manifest_.streams[stream].name,
                                        "': no step ", packet, " (", values.size(), " steps)"));
  }
  out->assign(values.Get(static_cast<int>(packet)));
  if (format::Checksum(*out) != t.xxh3(static_cast<int>(packet))) {
    return absl::DataLossError(StrCat("checksum mismatch in ", Where(index.episode_id()), ", stream '",
                                      manifest_.streams[stream].name, "', step ", packet,
                                      ": the record changed after its index was built"));
  }
  return absl::OkStatus();
}

absl::Status RldsDataset::ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first,
                                     size_t count, std::vector<float>* out) const {
  if (stream < 0 || static_cast<size_t>(stream) >= stream_features_.size() ||
      manifest_.streams[static_cast<size_t>(stream)].kind != pb::LOWDIM) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not a lowdim stream"));
  }
  const size_t dim = static_cast<size_t>(manifest_.streams[stream].shape[0]);
  const uint64_t steps = episodes_.length(index.episode_id(), static_cast<size_t>(stream));
  if (first > steps || count > steps - first) {
    return absl::OutOfRangeError(StrCat(Where(index.episode_id()), ", stream '", manifest_.streams[stream].name,
                                        "' has ", steps, " steps; asked for [", first, ", ", first + count, ")"));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const ParsedEpisode> p, Parsed(index.episode_id()));
  const tensorflow::Feature& f = *p->features[static_cast<size_t>(stream)];
  out->resize(count * dim);
  if (count == 0) return absl::OkStatus();
  if (f.kind_case() == tensorflow::Feature::kFloatList) {
    std::memcpy(out->data(), f.float_list().value().data() + first * dim, count * dim * sizeof(float));
    return absl::OkStatus();
  }
  const int64_t* v = f.int64_list().value().data() + first * dim;
  int64_t inexact = 0;
  for (size_t i = 0; i < count * dim; ++i) {
    (*out)[i] = static_cast<float>(v[i]);
    if (static_cast<int64_t>((*out)[i]) != v[i]) ++inexact;
  }
  if (inexact > 0) {
    absl::MutexLock lock(&mu_);
    if (!inexact_warned_[manifest_.streams[stream].name]) {
      inexact_warned_[manifest_.streams[stream].name] = true;
      spdlog::warn("rlds: integer values of '{}' are not exactly representable as float32 and are rounded",
                   manifest_.streams[stream].name);
    }
  }
  return absl::OkStatus();
}

absl::Status RldsDataset::VerifyShard(uint32_t shard) const {
  if (shard >= files_.size()) return absl::OutOfRangeError(StrCat("shard ", shard, " does not exist in ", uri_));
  size_t records = 0;
  RETURN_IF_ERROR(ScanRecords(*files_[shard], 8u << 20, [&](const RecordRef&, absl::StatusOr<std::string_view> data) {
    ++records;
    return data.status();
  }));
  if (records != manifest_.shards[shard].episodes) {
    return absl::DataLossError(StrCat(files_[shard]->name(), ": ", records, " records, its index says ",
                                      manifest_.shards[shard].episodes));
  }
  for (size_t e = 0; e < episodes_list_.size(); ++e) {
    if (episodes_list_[e].shard == shard) RETURN_IF_ERROR(VerifyEpisode(e));
  }
  return absl::OkStatus();
}

}  // namespace

bool LooksLikeRlds(Storage& storage) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> info = storage.Open(kInfoFile);
  if (!info.ok()) return false;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> features = storage.Open(kFeaturesFile);
  return features.ok();
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri, LocationOptions& options) {
  return RldsDataset::Open(std::move(storage), std::move(uri), options);
}

}  // namespace conveyor::rlds
