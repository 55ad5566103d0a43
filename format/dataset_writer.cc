#include "format/dataset_writer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/strings.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"
#include "format/lowdim_codec.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;

double StreamEndSeconds(const EpisodeData::Stream& s) {
  const double tb = static_cast<double>(s.time_base_num) / s.time_base_den;
  switch (s.info.kind) {
    case pb::VIDEO:
    case pb::IMAGE:
    case pb::AUDIO: {
      double end = 0;
      for (const auto& p : s.packets) {
        end = std::max(end, static_cast<double>(p.pts - s.pts_origin + std::max<int64_t>(p.duration, 0)) * tb);
      }
      return end;
    }
    case pb::LOWDIM: {
      const auto& t = s.timestamps_s;
      if (t.empty()) return 0;
      double step = t.size() > 1 ? t[t.size() - 1] - t[t.size() - 2] : 0;
      return t.back() + step;
    }
    default:
      return 0;
  }
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) return absl::UnavailableError(StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::UnavailableError(StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

DatasetWriter::DatasetWriter(std::string out_dir, Options options)
    : out_dir_(std::move(out_dir)),
      options_(std::move(options)),
      directory_(std::make_unique<pb::ShardDirectory>()) {}

DatasetWriter::~DatasetWriter() {
  if (file_ != nullptr) {
    // Abandoned mid-shard (an error upstream): leave no half-written shard behind.
    file_.reset();
    std::error_code ec;
    fs::remove(shard_tmp_path_, ec);
  }
}

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(std::string out_dir,
                                                                     Options options) {
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) {
    return absl::AlreadyExistsError(StrCat(
        "output directory ", out_dir, " exists and is not empty; choose a new one or remove it"));
  }
  fs::create_directories(fs::path(out_dir) / "shards", ec);
  if (ec) return absl::UnavailableError(StrCat("cannot create ", out_dir, ": ", ec.message()));
  if (options.episodes_per_shard <= 0 || options.lowdim_block_steps <= 0) {
    return absl::InvalidArgumentError("episodes_per_shard and lowdim_block_steps must be positive");
  }
  return std::unique_ptr<DatasetWriter>(new DatasetWriter(std::move(out_dir), std::move(options)));
}

uint64_t DatasetWriter::bytes_written() const { return closed_bytes_ + pos_; }

absl::Status DatasetWriter::Write(std::string_view bytes) {
  if (bytes.empty()) return absl::OkStatus();
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_.get()) != bytes.size()) {
    return absl::UnavailableError(StrCat("write failed at byte offset ", pos_, " of ",
                                               shard_tmp_path_, " (disk full?)"));
  }
  pos_ += bytes.size();
  return absl::OkStatus();
}

absl::Status DatasetWriter::OpenShard() {
  shard_path_ = absl::StrFormat("shards/shard-%06d.cvs", shards_.size());
  shard_tmp_path_ = StrCat(out_dir_, "/", shard_path_, ".tmp");
  file_.reset(std::fopen(shard_tmp_path_.c_str(), "wb"));
  if (file_ == nullptr) return absl::UnavailableError(StrCat("cannot create ", shard_tmp_path_));
  pos_ = 0;
  directory_->Clear();
  directory_->set_format_version(format::kFormatVersion);
  return Write(format::EncodeShardHeader());
}

absl::Status DatasetWriter::CloseShard() {
  std::string dir = directory_->SerializeAsString();
  format::ShardFooter footer;
  footer.directory_offset = pos_;
  footer.directory_size = dir.size();
  footer.directory_xxh3 = format::Checksum(dir);
  RETURN_IF_ERROR(Write(dir));
  RETURN_IF_ERROR(Write(format::EncodeShardFooter(footer)));
  if (std::fflush(file_.get()) != 0) {
    return absl::UnavailableError(StrCat("cannot flush ", shard_tmp_path_));
  }
  file_.reset();
  std::error_code ec;
  fs::rename(shard_tmp_path_, StrCat(out_dir_, "/", shard_path_), ec);
  if (ec) return absl::UnavailableError(StrCat("cannot rename ", shard_tmp_path_, ": ", ec.message()));
  shards_.push_back({shard_path_, pos_, static_cast<uint64_t>(directory_->episodes_size())});
  closed_bytes_ += pos_;
  pos_ = 0;
  return absl::OkStatus();
}

absl::Status DatasetWriter::CheckLayout(const EpisodeData& ep) {
  if (ep.streams.empty()) {
    return absl::InvalidArgumentError(StrCat("episode ", ep.source, " has no streams"));
  }
  if (streams_.empty()) {
    for (const auto& s : ep.streams) {
      for (const auto& other : streams_) {
        if (other.name == s.info.name) {
          return absl::InvalidArgumentError(
              StrCat("episode ", ep.source, ": stream name '", s.info.name, "' repeats"));
        }
      }
      streams_.push_back(s.info);
    }
    stats_.resize(streams_.size());
    return absl::OkStatus();
  }
  if (ep.streams.size() != streams_.size()) {
    return absl::InvalidArgumentError(StrCat("episode ", ep.source, " has ", ep.streams.size(),
                                                   " streams, earlier episodes have ", streams_.size()));
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    const StreamInfo& a = streams_[i];
    const StreamInfo& b = ep.streams[i].info;
    if (a.name != b.name || a.kind != b.kind || a.codec != b.codec || a.shape != b.shape) {
      auto describe = [](const StreamInfo& s) {
        std::string shape;
        for (size_t i = 0; i < s.shape.size(); ++i) StrAppend(&shape, i ? ", " : "", s.shape[i]);
        return StrCat("'", s.name, "' (", format::StreamKindName(s.kind), ", ", s.codec, ", [",
                      shape, "])");
      };
      return absl::InvalidArgumentError(StrCat("episode ", ep.source, ": stream ", i, " is ",
                                               describe(b), ", earlier episodes have ",
                                               describe(a)));
    }
  }
  return absl::OkStatus();
}

absl::Status DatasetWriter::AddEpisode(const EpisodeData& ep) {
  if (finished_) return absl::FailedPreconditionError("AddEpisode after Finish");
  RETURN_IF_ERROR(CheckLayout(ep));
  if (file_ == nullptr) RETURN_IF_ERROR(OpenShard());

  const uint64_t episode_id = records_.size();
  pb::EpisodeIndex index;
  index.set_format_version(format::kFormatVersion);
  index.set_episode_id(episode_id);
  index.set_source(ep.source);
  index.set_data_offset(pos_);
  EpisodeRecord rec;
  rec.episode_id = episode_id;
  rec.shard = static_cast<uint32_t>(shards_.size());
  double duration = 0;

  for (size_t si = 0; si < ep.streams.size(); ++si) {
    const EpisodeData::Stream& s = ep.streams[si];
    const std::string where = StrCat("episode ", ep.source, ", stream '", s.info.name, "'");
    pb::StreamIndex* out = index.add_streams();
    out->set_name(s.info.name);
    out->set_kind(s.info.kind);
    *out->mutable_codec() = *s.codec;
    out->mutable_codec()->set_codec(s.info.codec);
    out->set_time_base_num(s.time_base_num);
    out->set_time_base_den(s.time_base_den);
    out->set_pts_origin(s.pts_origin);
    uint32_t length = 0;
    switch (s.info.kind) {
      case pb::VIDEO:
      case pb::IMAGE:
      case pb::AUDIO: {
        if (s.time_base_num <= 0 || s.time_base_den <= 0) {
          return absl::InvalidArgumentError(StrCat(where, ": invalid time base"));
        }
        if (s.packets.empty()) return absl::InvalidArgumentError(StrCat(where, ": no packets"));
        pb::PacketTable* t = out->mutable_packets();
        for (const auto& p : s.packets) {
          if (p.bytes.size() > std::numeric_limits<uint32_t>::max()) {
            return absl::InvalidArgumentError(StrCat(where, ": packet over 4 GiB"));
          }
          t->add_pts(p.pts);
          t->add_dts(p.dts);
          t->add_duration(p.duration);
          t->add_offset(pos_);
          t->add_size(static_cast<uint32_t>(p.bytes.size()));
          t->add_flags(p.key ? format::kPacketKey : 0);
          t->add_xxh3(format::Checksum(p.bytes));
          RETURN_IF_ERROR(Write(p.bytes));
        }
        length = static_cast<uint32_t>(s.packets.size());
        break;
      }
      case pb::LOWDIM: {
        const size_t steps = s.timestamps_s.size();
        if (s.info.shape.size() != 1 || s.info.shape[0] <= 0) {
          return absl::InvalidArgumentError(StrCat(where, ": lowdim shape must be [D]"));
        }
        const size_t dim = static_cast<size_t>(s.info.shape[0]);
        if (steps == 0 || s.values.size() != steps * dim) {
          return absl::InvalidArgumentError(StrCat(where, ": ", s.values.size(),
                                                         " values for ", steps, " steps of ", dim,
                                                         " dims"));
        }
        for (size_t i = 0; i < steps; ++i) {
          if (!std::isfinite(s.timestamps_s[i]) || (i > 0 && s.timestamps_s[i] < s.timestamps_s[i - 1])) {
            return absl::InvalidArgumentError(StrCat(where, ": timestamp ", i, " (",
                                                           s.timestamps_s[i],
                                                           ") is not finite or goes backwards"));
          }
          out->add_timestamps_s(s.timestamps_s[i]);
        }
        pb::LowdimBlocks* b = out->mutable_blocks();
        b->set_dim(static_cast<int32_t>(dim));
        const size_t block = static_cast<size_t>(options_.lowdim_block_steps);
        for (size_t first = 0; first < steps; first += block) {
          const size_t n = std::min(block, steps - first);
          std::string bytes = EncodeLowdimBlock(s.values.data() + first * dim, n * dim, options_.zstd_level);
          b->add_first_step(static_cast<uint32_t>(first));
          b->add_num_steps(static_cast<uint32_t>(n));
          b->add_offset(pos_);
          b->add_size(static_cast<uint32_t>(bytes.size()));
          b->add_xxh3(format::Checksum(bytes));
          RETURN_IF_ERROR(Write(bytes));
        }
        length = static_cast<uint32_t>(steps);
        // Normalization statistics (Welford, per dimension).
        RunningStats& st = stats_[si];
        if (st.mean.empty()) {
          st.mean.assign(dim, 0);
          st.m2.assign(dim, 0);
          st.min.assign(dim, std::numeric_limits<double>::infinity());
          st.max.assign(dim, -std::numeric_limits<double>::infinity());
        }
        for (size_t i = 0; i < steps; ++i) {
          ++st.count;
          for (size_t d = 0; d < dim; ++d) {
            const double x = s.values[i * dim + d];
            const double delta = x - st.mean[d];
            st.mean[d] += delta / static_cast<double>(st.count);
            st.m2[d] += delta * (x - st.mean[d]);
            st.min[d] = std::min(st.min[d], x);
            st.max[d] = std::max(st.max[d], x);
          }
        }
        break;
      }
      case pb::TEXT:
        out->set_text(s.text);
        length = 1;
        break;
      default:
        return absl::InvalidArgumentError(StrCat(where, ": stream kind not set"));
    }
    out->set_num_frames(s.info.kind == pb::TEXT ? 1 : length);
    rec.lengths.push_back(length);
    duration = std::max(duration, StreamEndSeconds(s));
  }
  index.set_data_size(pos_ - index.data_offset());
  index.set_duration_s(duration);

  std::string index_bytes = index.SerializeAsString();
  rec.index_offset = pos_;
  rec.index_size = static_cast<uint32_t>(index_bytes.size());
  rec.index_xxh3 = format::Checksum(index_bytes);
  rec.data_offset = index.data_offset();
  rec.data_size = index.data_size();
  rec.duration_s = duration;
  RETURN_IF_ERROR(Write(index_bytes));

  pb::DirectoryEntry* e = directory_->add_episodes();
  e->set_episode_id(episode_id);
  e->set_index_offset(rec.index_offset);
  e->set_index_size(rec.index_size);
  e->set_index_xxh3(rec.index_xxh3);
  e->set_data_offset(rec.data_offset);
  e->set_data_size(rec.data_size);
  records_.push_back(std::move(rec));
  total_duration_s_ += duration;

  if (directory_->episodes_size() >= options_.episodes_per_shard ||
      pos_ >= options_.target_shard_bytes) {
    RETURN_IF_ERROR(CloseShard());
  }
  return absl::OkStatus();
}

absl::StatusOr<Manifest> DatasetWriter::Finish() {
  if (finished_) return absl::FailedPreconditionError("Finish called twice");
  if (records_.empty()) return absl::FailedPreconditionError("no episodes were written");
  if (file_ != nullptr) RETURN_IF_ERROR(CloseShard());
  finished_ = true;

  Manifest m;
  m.format_version = format::kFormatVersion;
  m.name = options_.name;
  m.created_by = options_.created_by;
  m.streams = streams_;
  m.shards = shards_;
  m.num_episodes = records_.size();
  m.total_duration_s = total_duration_s_;
  for (size_t i = 0; i < streams_.size(); ++i) {
    const RunningStats& st = stats_[i];
    if (streams_[i].kind != pb::LOWDIM) continue;
    if (auto given = options_.stats.find(streams_[i].name); given != options_.stats.end()) {
      const size_t dim = streams_[i].shape.empty() ? 0 : static_cast<size_t>(streams_[i].shape[0]);
      const StreamStats& g = given->second;
      if (g.mean.size() != dim || g.std.size() != dim || g.min.size() != dim ||
          g.max.size() != dim) {
        return absl::InvalidArgumentError(StrCat("statistics given for stream '",
                                                 streams_[i].name, "' do not have its dimension ",
                                                 dim));
      }
      m.stats[streams_[i].name] = g;
      continue;
    }
    if (st.count == 0) continue;
    StreamStats out;
    out.count = st.count;
    out.mean = st.mean;
    out.min = st.min;
    out.max = st.max;
    for (double m2 : st.m2) out.std.push_back(std::sqrt(m2 / static_cast<double>(st.count)));
    m.stats[streams_[i].name] = std::move(out);
  }
  std::string table = EpisodeTable::Encode(records_, streams_.size());
  m.episode_table_bytes = table.size();
  m.episode_table_xxh3 = format::ChecksumHex(format::Checksum(table));
  m.fingerprint = format::ChecksumHex(
      format::Checksum(StrCat(StreamsFingerprintText(streams_), "\n", table)));
  RETURN_IF_ERROR(WriteFileAtomically(StrCat(out_dir_, "/", kEpisodeTableFile), table));
  m.total_bytes = closed_bytes_ + table.size();
  RETURN_IF_ERROR(WriteFileAtomically(StrCat(out_dir_, "/", kManifestFile), ManifestToJson(m)));
  return m;
}

}  // namespace conveyor
