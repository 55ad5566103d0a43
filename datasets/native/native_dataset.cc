#include "datasets/native/native_dataset.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/strings.h"
#include "base/status_macros.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"
#include "format/lowdim_codec.h"

namespace conveyor {
namespace {
namespace pb = format::v1;

// The native format: manifest.json, episodes.bin and checksummed shards (docs/format.md).
class NativeDataset final : public Dataset {
 public:
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(std::unique_ptr<Storage> storage,
                                                       std::string uri);
  std::string format() const override { return "conveyor"; }
  absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> LoadEpisode(size_t episode) const override;
  absl::Status ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                          std::string* out) const override;
  absl::Status ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first, size_t count,
                          std::vector<float>* out) const override;
  absl::Status VerifyShard(uint32_t shard) const override;

 private:
  NativeDataset() = default;
  absl::StatusOr<const RandomAccessFile*> Shard(uint32_t shard) const;
  absl::Status CheckAgainstManifest(const pb::EpisodeIndex& index, size_t episode,
                                    std::string_view shard_name) const;

  mutable absl::Mutex mu_;
  // Opened (and header/footer-checked) shard files, by shard number; null until first use.
  mutable std::vector<std::unique_ptr<RandomAccessFile>> shards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> native::OpenDataset(std::unique_ptr<Storage> storage,
                                                               std::string uri) {
  return NativeDataset::Open(std::move(storage), std::move(uri));
}

absl::StatusOr<std::unique_ptr<Dataset>> NativeDataset::Open(std::unique_ptr<Storage> storage,
                                                             std::string uri) {
  std::unique_ptr<NativeDataset> ds(new NativeDataset());
  ds->uri_ = RedactUri(uri);  // for messages and Info: never a credential
  ds->storage_ = std::move(storage);
  const std::string manifest_name = ds->storage_->Describe(kManifestFile);
  // Caps on the two files read whole: their real sizes are far below (a manifest lists streams
  // and shards; the episode table is tens of bytes per episode and stream).
  constexpr uint64_t kMaxManifestBytes = 64ull << 20;
  constexpr uint64_t kMaxEpisodeTableBytes = 1ull << 30;
  auto manifest_text = ReadWholeFile(*ds->storage_, kManifestFile, kMaxManifestBytes);
  if (!manifest_text.ok()) {
    if (manifest_text.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(StrCat(
          "no Conveyor dataset at ", ds->uri_, ": ", manifest_name,
          " does not exist (create one with `conveyor synth` or `conveyor import`)"));
    }
    return manifest_text.status();
  }
  ASSIGN_OR_RETURN(ds->manifest_, ManifestFromJson(*manifest_text, manifest_name));

  const std::string table_name = ds->storage_->Describe(kEpisodeTableFile);
  ASSIGN_OR_RETURN(std::string table,
                   ReadWholeFile(*ds->storage_, kEpisodeTableFile,
                                 std::min(kMaxEpisodeTableBytes, ds->manifest_.episode_table_bytes)));
  if (table.size() != ds->manifest_.episode_table_bytes ||
      format::ChecksumHex(format::Checksum(table)) != ds->manifest_.episode_table_xxh3) {
    return absl::DataLossError(StrCat(
        table_name, " (", table.size(), " bytes, xxh3 ", format::ChecksumHex(format::Checksum(table)),
        ") does not match the manifest ", manifest_name, " (", ds->manifest_.episode_table_bytes,
        " bytes, xxh3 ", ds->manifest_.episode_table_xxh3, ")"));
  }
  ASSIGN_OR_RETURN(ds->episodes_,
                   EpisodeTable::Parse(std::move(table), ds->manifest_.streams.size(),
                                       ds->manifest_.shards.size(), table_name));
  if (ds->episodes_.size() != ds->manifest_.num_episodes) {
    return absl::DataLossError(StrCat(manifest_name, " says ", ds->manifest_.num_episodes,
                                            " episodes, ", table_name, " holds ",
                                            ds->episodes_.size()));
  }
  {
    absl::MutexLock lock(&ds->mu_);
    ds->shards_.resize(ds->manifest_.shards.size());
  }
  return std::unique_ptr<Dataset>(std::move(ds));
}

absl::StatusOr<const RandomAccessFile*> NativeDataset::Shard(uint32_t shard) const {
  if (shard >= manifest_.shards.size()) {
    return absl::OutOfRangeError(StrCat("shard ", shard, " does not exist in ", uri_));
  }
  {
    absl::MutexLock lock(&mu_);
    if (shards_[shard] != nullptr) return shards_[shard].get();
  }
  // Open and check outside the lock: a slow HTTP HEAD must not block readers of other shards.
  const ShardInfo& info = manifest_.shards[shard];
  const std::string name = storage_->Describe(info.path);
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, storage_->Open(info.path));
  if (file->size() != info.bytes) {
    return absl::DataLossError(StrCat("shard ", name, " is ", file->size(),
                                            " bytes but the manifest says ", info.bytes,
                                            file->size() < info.bytes ? " (truncated?)" : ""));
  }
  std::string header(format::kShardHeaderSize, '\0');
  RETURN_IF_ERROR(file->Read(0, header.size(), header.data()));
  RETURN_IF_ERROR(format::CheckShardHeader(header, name));
  std::string footer(format::kShardFooterSize, '\0');
  RETURN_IF_ERROR(file->Read(file->size() - footer.size(), footer.size(), footer.data()));
  RETURN_IF_ERROR(format::ParseShardFooter(footer, file->size(), name).status());

  absl::MutexLock lock(&mu_);
  if (shards_[shard] == nullptr) shards_[shard] = std::move(file);
  return shards_[shard].get();
}

absl::Status NativeDataset::CheckAgainstManifest(const pb::EpisodeIndex& index, size_t episode,
                                           std::string_view shard_name) const {
  const auto& streams = manifest_.streams;
  if (static_cast<size_t>(index.streams_size()) != streams.size()) {
    return absl::DataLossError(StrCat("manifest does not match shard ", shard_name,
                                            ": episode ", episode, " has ", index.streams_size(),
                                            " streams in the shard, the manifest lists ",
                                            streams.size()));
  }
  for (size_t s = 0; s < streams.size(); ++s) {
    const pb::StreamIndex& si = index.streams(static_cast<int>(s));
    const uint32_t expected = episodes_.length(episode, s);
    if (si.name() != streams[s].name || si.kind() != streams[s].kind) {
      return absl::DataLossError(StrCat(
          "manifest does not match shard ", shard_name, ": episode ", episode, " stream ", s,
          " is '", si.name(), "' (", format::StreamKindName(si.kind()), ") in the shard, '",
          streams[s].name, "' (", format::StreamKindName(streams[s].kind), ") in the manifest"));
    }
    if (si.num_frames() != expected) {
      return absl::DataLossError(StrCat("manifest does not match shard ", shard_name,
                                              ": episode ", episode, " stream '", si.name(),
                                              "' has ", si.num_frames(),
                                              " frames/steps in the shard, the manifest says ",
                                              expected));
    }
    if (si.kind() == pb::LOWDIM && (streams[s].shape.size() != 1 || si.blocks().dim() != streams[s].shape[0])) {
      return absl::DataLossError(StrCat("manifest does not match shard ", shard_name,
                                              ": episode ", episode, " stream '", si.name(),
                                              "' has dimension ", si.blocks().dim(),
                                              " in the shard"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const pb::EpisodeIndex>> NativeDataset::LoadEpisode(size_t episode) const {
  if (episode >= episodes_.size()) {
    return absl::OutOfRangeError(StrCat("episode ", episode, " does not exist (", uri_,
                                              " has ", episodes_.size(), " episodes)"));
  }
  const EpisodeRecord rec = episodes_.record(episode);
  ASSIGN_OR_RETURN(const RandomAccessFile* file, Shard(rec.shard));
  if (rec.index_size > format::kMaxIndexBytes) {
    return absl::DataLossError(StrCat("episode table entry ", episode,
                                            " has an implausible index size ", rec.index_size));
  }
  std::string bytes(rec.index_size, '\0');
  absl::Status read = file->Read(rec.index_offset, bytes.size(), bytes.data());
  if (!read.ok()) {
    return Annotate(read, StrCat("reading the index of episode ", episode, " (manifest ",
                                       "points at byte offset ", rec.index_offset, ")"));
  }
  ASSIGN_OR_RETURN(pb::EpisodeIndex index,
                   format::ParseEpisodeIndex(bytes, rec.index_offset, rec.index_xxh3, episode,
                                             file->size(), file->name()));
  if (index.data_offset() != rec.data_offset || index.data_size() != rec.data_size) {
    return absl::DataLossError(StrCat("manifest does not match shard ", file->name(),
                                            ": episode ", episode, " data range"));
  }
  RETURN_IF_ERROR(CheckAgainstManifest(index, episode, file->name()));
  return std::make_shared<const pb::EpisodeIndex>(std::move(index));
}

absl::Status NativeDataset::ReadPacket(const pb::EpisodeIndex& index, int stream, size_t packet,
                                 std::string* out) const {
  if (stream < 0 || stream >= index.streams_size()) {
    return absl::OutOfRangeError(StrCat("stream ", stream, " does not exist"));
  }
  const pb::StreamIndex& s = index.streams(stream);
  const pb::PacketTable& t = s.packets();
  if (packet >= static_cast<size_t>(t.offset_size())) {
    return absl::OutOfRangeError(StrCat("episode ", index.episode_id(), " stream '",
                                              s.name(), "' has ", t.offset_size(),
                                              " packets; asked for ", packet));
  }
  const uint32_t shard = episodes_.shard(index.episode_id());
  ASSIGN_OR_RETURN(const RandomAccessFile* file, Shard(shard));
  const int p = static_cast<int>(packet);
  out->resize(t.size(p));
  RETURN_IF_ERROR(file->Read(t.offset(p), t.size(p), out->data()));
  if (format::Checksum(*out) != t.xxh3(p)) {
    return absl::DataLossError(StrCat("checksum mismatch in shard ", file->name(),
                                            ", episode ", index.episode_id(), ", stream '",
                                            s.name(), "', packet ", packet, " at byte offset ",
                                            t.offset(p), " (", t.size(p), " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status NativeDataset::ReadLowdim(const pb::EpisodeIndex& index, int stream, size_t first,
                                 size_t count, std::vector<float>* out) const {
  if (stream < 0 || stream >= index.streams_size() || index.streams(stream).kind() != pb::LOWDIM) {
    return absl::InvalidArgumentError(StrCat("stream ", stream, " is not a lowdim stream"));
  }
  const pb::StreamIndex& s = index.streams(stream);
  const pb::LowdimBlocks& b = s.blocks();
  if (first > s.num_frames() || count > s.num_frames() - first) {
    return absl::OutOfRangeError(StrCat("episode ", index.episode_id(), " stream '",
                                              s.name(), "' has ", s.num_frames(),
                                              " steps; asked for [", first, ", ", first + count,
                                              ")"));
  }
  // The index is untrusted: every count is checked against the others and against the caps
  // before anything of that size is allocated.
  constexpr uint64_t kMaxDim = 1 << 20;
  constexpr uint64_t kMaxValues = 1ull << 31;  // per read and per block (8 GiB of float32)
  const size_t dim = static_cast<size_t>(b.dim());
  const int blocks = b.first_step_size();
  if (dim == 0 || dim > kMaxDim || b.num_steps_size() != blocks || b.offset_size() != blocks ||
      b.size_size() != blocks || b.xxh3_size() != blocks) {
    return absl::DataLossError(StrCat("episode ", index.episode_id(), " stream '", s.name(),
                                      "': malformed lowdim block index (dim ", dim, ", ", blocks,
                                      " first_step, ", b.num_steps_size(), " num_steps, ",
                                      b.offset_size(), " offset, ", b.size_size(), " size, ",
                                      b.xxh3_size(), " xxh3 entries)"));
  }
  if (count > kMaxValues / dim) {
    return absl::InvalidArgumentError(StrCat("episode ", index.episode_id(), " stream '", s.name(),
                                             "': a read of ", count, " steps of ", dim,
                                             " values is too large"));
  }
  out->resize(count * dim);
  if (count == 0) return absl::OkStatus();
  const uint32_t shard = episodes_.shard(index.episode_id());
  ASSIGN_OR_RETURN(const RandomAccessFile* file, Shard(shard));
  std::string block;
  std::vector<float> decoded;
  for (int i = 0; i < b.first_step_size(); ++i) {
    const size_t lo = b.first_step(i), n = b.num_steps(i);
    if (lo > s.num_frames() || n > s.num_frames() - lo || n > kMaxValues / dim) {
      return absl::DataLossError(StrCat("episode ", index.episode_id(), " stream '", s.name(),
                                        "': block ", i, " claims steps [", lo, ", ", lo + n,
                                        ") of an episode of ", s.num_frames(), " steps"));
    }
    if (lo + n <= first || lo >= first + count) continue;
    if (b.size(i) > file->size()) {
      return absl::DataLossError(StrCat("shard ", file->name(), ", episode ", index.episode_id(),
                                        ", stream '", s.name(), "': block ", i, " claims ", b.size(i),
                                        " bytes, more than the shard's ", file->size()));
    }
    block.resize(b.size(i));
    RETURN_IF_ERROR(file->Read(b.offset(i), b.size(i), block.data()));
    const std::string where = StrCat("shard ", file->name(), ", episode ", index.episode_id(),
                                           ", stream '", s.name(), "', block ", i,
                                           " at byte offset ", b.offset(i));
    if (format::Checksum(block) != b.xxh3(i)) {
      return absl::DataLossError(StrCat("checksum mismatch in ", where));
    }
    RETURN_IF_ERROR(CheckLowdimBlockSize(block, n * dim, where));  // before allocating for it
    decoded.resize(n * dim);
    RETURN_IF_ERROR(DecodeLowdimBlock(block, decoded.data(), n * dim, where));
    const size_t from = std::max(lo, first), to = std::min(lo + n, first + count);
    std::copy(decoded.begin() + static_cast<ptrdiff_t>((from - lo) * dim),
              decoded.begin() + static_cast<ptrdiff_t>((to - lo) * dim),
              out->begin() + static_cast<ptrdiff_t>((from - first) * dim));
  }
  return absl::OkStatus();
}

absl::Status NativeDataset::VerifyShard(uint32_t shard) const {
  ASSIGN_OR_RETURN(const RandomAccessFile* file, Shard(shard));
  std::string footer(format::kShardFooterSize, '\0');
  RETURN_IF_ERROR(file->Read(file->size() - footer.size(), footer.size(), footer.data()));
  ASSIGN_OR_RETURN(format::ShardFooter f, format::ParseShardFooter(footer, file->size(), file->name()));
  std::string dir_bytes(f.directory_size, '\0');
  RETURN_IF_ERROR(file->Read(f.directory_offset, dir_bytes.size(), dir_bytes.data()));
  ASSIGN_OR_RETURN(pb::ShardDirectory dir,
                   format::ParseShardDirectory(dir_bytes, f, file->size(), file->name()));
  for (const pb::DirectoryEntry& e : dir.episodes()) {
    if (e.episode_id() >= episodes_.size() || episodes_.shard(e.episode_id()) != shard ||
        episodes_.record(e.episode_id()).index_xxh3 != e.index_xxh3()) {
      return absl::DataLossError(StrCat("manifest does not match shard ", file->name(),
                                              ": its directory lists episode ", e.episode_id(),
                                              " which the episode table does not place here"));
    }
    RETURN_IF_ERROR(VerifyEpisode(e.episode_id()));
  }
  if (static_cast<uint64_t>(dir.episodes_size()) != manifest_.shards[shard].episodes) {
    return absl::DataLossError(StrCat("manifest does not match shard ", file->name(), ": ",
                                            dir.episodes_size(), " episodes in the shard, ",
                                            manifest_.shards[shard].episodes,
                                            " in the manifest"));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
