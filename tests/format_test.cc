// The dataset format: writer -> reader round trips, and every kind of damage a reader must name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <type_traits>

#include "conveyor/format/v1/shard.pb.h"
#include "format/codec_params_value.h"
#include "datasets/dataset.h"
#include "format/dataset_writer.h"
#include "format/format.h"
#include "format/lowdim_codec.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace pb = format::v1;
using testing::TempDir;

std::string Bytes(uint64_t seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    s[i] = static_cast<char>(seed >> 56);
  }
  return s;
}

// A small episode: a fake video stream (opaque packets), a lowdim stream, a text stream.
EpisodeData MakeEpisode(int e, int frames = 40, int steps = 600, int dim = 3) {
  EpisodeData ep;
  ep.source = "test episode " + std::to_string(e);
  EpisodeData::Stream video;
  video.info = {"cam", pb::VIDEO, "h264", 30, {48, 64, 3}, {}, "yuv420p"};
  video.codec->set_codec("h264");
  video.codec->set_width(64);
  video.codec->set_height(48);
  video.codec->set_extradata(Bytes(99, 20));
  video.time_base_num = 1;
  video.time_base_den = 30;
  for (int k = 0; k < frames; ++k) {
    EpisodeData::Packet p;
    p.pts = k + 2;
    p.dts = k;
    p.duration = 1;
    p.key = k % 10 == 0;
    p.bytes = Bytes(static_cast<uint64_t>(e * 1000 + k), 100 + static_cast<size_t>(k) * 3);
    video.packets.push_back(std::move(p));
  }
  ep.streams.push_back(std::move(video));
  EpisodeData::Stream state;
  state.info = {"state", pb::LOWDIM, "zstd-shuffle4", 50, {dim}, {}, ""};
  for (int i = 0; i < steps; ++i) {
    state.timestamps_s.push_back(i / 50.0);
    for (int d = 0; d < dim; ++d) state.values.push_back(std::sin(0.01f * i * (d + 1)) + e);
  }
  ep.streams.push_back(std::move(state));
  EpisodeData::Stream text;
  text.info = {"instruction", pb::TEXT, "utf-8", 0, {}, {}, ""};
  text.text = "pick up block " + std::to_string(e);
  ep.streams.push_back(std::move(text));
  return ep;
}

// Writes `n` episodes, 2 per shard.
std::string WriteDataset(const TempDir& dir, int n, const std::string& sub = "ds") {
  std::string out = dir.Join(sub);
  DatasetWriter::Options o;
  o.episodes_per_shard = 2;
  o.lowdim_block_steps = 256;
  auto w = DatasetWriter::Create(out, o);
  EXPECT_TRUE(w.ok()) << w.status();
  for (int e = 0; e < n; ++e) EXPECT_TRUE((*w)->AddEpisode(MakeEpisode(e)).ok());
  auto m = (*w)->Finish();
  EXPECT_TRUE(m.ok()) << m.status();
  return out;
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x5a));
}

void ReplaceInFile(const std::string& path, const std::string& from, const std::string& to) {
  std::string s = testing::ReadFile(path);
  size_t pos = s.find(from);
  ASSERT_NE(pos, std::string::npos) << from;
  s.replace(pos, from.size(), to);
  testing::WriteFile(path, s);
}

bool Contains(const absl::Status& s, std::string_view needle) {
  return std::string_view(s.message().data(), s.message().size()).find(needle) != std::string_view::npos;
}

TEST(Format, RoundTripsPacketsLowdimTextAndStats) {
  TempDir dir;
  std::string path = WriteDataset(dir, 5);
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Manifest& m = (*ds)->manifest();
  EXPECT_EQ(m.num_episodes, 5u);
  EXPECT_EQ(m.shards.size(), 3u);  // 2 + 2 + 1
  ASSERT_EQ(m.streams.size(), 3u);
  EXPECT_EQ(m.streams[0].shape, (std::vector<int64_t>{48, 64, 3}));
  EXPECT_EQ(m.fingerprint.size(), 16u);

  for (int e = 0; e < 5; ++e) {
    EpisodeData want = MakeEpisode(e);
    auto index = (*ds)->LoadEpisode(static_cast<size_t>(e));
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ((*index)->source(), want.source);
    const pb::StreamIndex& v = (*index)->streams(0);
    EXPECT_EQ(v.codec().extradata(), want.streams[0].codec->extradata());
    ASSERT_EQ(v.num_frames(), want.streams[0].packets.size());
    std::string got;
    for (size_t k = 0; k < want.streams[0].packets.size(); ++k) {
      ASSERT_TRUE((*ds)->ReadPacket(**index, 0, k, &got).ok());
      EXPECT_EQ(got, want.streams[0].packets[k].bytes);
      EXPECT_EQ(v.packets().pts(static_cast<int>(k)), want.streams[0].packets[k].pts);
      EXPECT_EQ((v.packets().flags(static_cast<int>(k)) & format::kPacketKey) != 0,
                want.streams[0].packets[k].key);
    }
    // Windows inside one block, across a block boundary, and the whole stream.
    for (auto [first, count] : {std::pair<size_t, size_t>{0, 50}, {240, 40}, {500, 100}, {0, 600}}) {
      std::vector<float> values;
      ASSERT_TRUE((*ds)->ReadLowdim(**index, 1, first, count, &values).ok());
      ASSERT_EQ(values.size(), count * 3);
      for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_EQ(values[i], want.streams[1].values[first * 3 + i]) << first << " " << i;
      }
    }
    EXPECT_EQ((*index)->streams(2).text(), want.streams[2].text);
    EXPECT_NEAR((*index)->duration_s(), 12.0, 1e-9);  // 600 steps at 50 Hz
  }
  // Statistics equal a direct computation over every step of every episode.
  const StreamStats& st = m.stats.at("state");
  ASSERT_EQ(st.count, 5u * 600u);
  for (int d = 0; d < 3; ++d) {
    double sum = 0, sq = 0, lo = 1e9, hi = -1e9;
    for (int e = 0; e < 5; ++e) {
      EpisodeData ep = MakeEpisode(e);
      for (int i = 0; i < 600; ++i) {
        double x = ep.streams[1].values[static_cast<size_t>(i * 3 + d)];
        sum += x;
        sq += x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
    }
    double mean = sum / 3000, var = sq / 3000 - mean * mean;
    EXPECT_NEAR(st.mean[d], mean, 1e-9);
    EXPECT_NEAR(st.std[d], std::sqrt(var), 1e-6);
    EXPECT_EQ(st.min[d], lo);
    EXPECT_EQ(st.max[d], hi);
  }
  for (uint32_t s = 0; s < 3; ++s) EXPECT_TRUE((*ds)->VerifyShard(s).ok());
}

TEST(Format, SameInputGivesIdenticalBytesAndFingerprint) {
  TempDir dir;
  std::string a = WriteDataset(dir, 3, "a"), b = WriteDataset(dir, 3, "b");
  EXPECT_EQ(testing::ReadFile(a + "/manifest.json"), testing::ReadFile(b + "/manifest.json"));
  EXPECT_EQ(testing::ReadFile(a + "/shards/shard-000000.cvs"),
            testing::ReadFile(b + "/shards/shard-000000.cvs"));
}

// EpisodeData::Stream holds its CodecParams through CodecParamsValue (so that the writer's header
// includes no protobuf): a value like the message itself.
TEST(Format, CodecParamsValueIsAValue) {
  CodecParamsValue empty;
  EXPECT_EQ(empty->codec(), "");
  EXPECT_EQ((*empty).SerializeAsString(), "");

  pb::CodecParams params;
  params.set_codec("h264");
  params.set_width(64);
  params.set_extradata(Bytes(1, 12));
  CodecParamsValue a = params;  // a copy of the message
  params.set_width(32);
  EXPECT_EQ(a->width(), 64);
  EXPECT_EQ(a->extradata(), Bytes(1, 12));

  CodecParamsValue b = a;  // copies are deep
  b->set_width(128);
  EXPECT_EQ(a->width(), 64);
  EXPECT_EQ(b->width(), 128);
  b = a;
  EXPECT_EQ(b->SerializeAsString(), a->SerializeAsString());
  b = params;  // a message assigns
  EXPECT_EQ(b->width(), 32);

  CodecParamsValue c = std::move(b);  // a moved-from value reads (and writes) as empty
  EXPECT_EQ(c->width(), 32);
  const CodecParamsValue& moved = b;  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(moved->codec(), "");
  b->set_codec("png");
  EXPECT_EQ(b->codec(), "png");

  // Streams in a vector move, never copy, when it grows.
  static_assert(std::is_nothrow_move_constructible_v<EpisodeData::Stream>);
}

TEST(Format, OpeningReadsNoShard) {
  TempDir dir;
  std::string path = WriteDataset(dir, 4);
  std::filesystem::remove(path + "/shards/shard-000001.cvs");
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok()) << ds.status();  // the missing shard is not touched
  EXPECT_TRUE((*ds)->LoadEpisode(0).ok());
  auto missing = (*ds)->LoadEpisode(2);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "shard-000001.cvs")) << missing.status();
}

TEST(Format, CorruptPacketNamesShardEpisodeStreamAndOffset) {
  TempDir dir;
  std::string path = WriteDataset(dir, 2);
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  auto index = (*ds)->LoadEpisode(1);
  ASSERT_TRUE(index.ok());
  const uint64_t offset = (*index)->streams(0).packets().offset(7);
  FlipByte(path + "/shards/shard-000000.cvs", offset + 3);
  std::string got;
  absl::Status s = (*ds)->ReadPacket(**index, 0, 7, &got);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "shard-000000.cvs")) << s;
  EXPECT_TRUE(Contains(s, "episode 1")) << s;
  EXPECT_TRUE(Contains(s, "stream 'cam'")) << s;
  EXPECT_TRUE(Contains(s, "byte offset " + std::to_string(offset))) << s;
  // Other packets still read.
  EXPECT_TRUE((*ds)->ReadPacket(**index, 0, 6, &got).ok());
}

TEST(Format, CorruptLowdimBlockIsNamed) {
  TempDir dir;
  std::string path = WriteDataset(dir, 1);
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  auto index = (*ds)->LoadEpisode(0);
  ASSERT_TRUE(index.ok());
  const uint64_t offset = (*index)->streams(1).blocks().offset(1);
  FlipByte(path + "/shards/shard-000000.cvs", offset + 1);
  std::vector<float> v;
  absl::Status s = (*ds)->ReadLowdim(**index, 1, 250, 20, &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "stream 'state', block 1 at byte offset " + std::to_string(offset))) << s;
  EXPECT_TRUE((*ds)->ReadLowdim(**index, 1, 0, 100, &v).ok());  // block 0 is intact
}

TEST(Format, CorruptIndexIsNamed) {
  TempDir dir;
  std::string path = WriteDataset(dir, 2);
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  const EpisodeRecord r = (*ds)->episodes().record(1);
  FlipByte(path + "/shards/shard-000000.cvs", r.index_offset + 5);
  auto index = (*ds)->LoadEpisode(1);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(index.status(), "episode 1")) << index.status();
  EXPECT_TRUE(Contains(index.status(), "byte offset " + std::to_string(r.index_offset)));
}

TEST(Format, TruncatedShardIsReportedAsTruncated) {
  TempDir dir;
  std::string path = WriteDataset(dir, 2);
  const std::string shard = path + "/shards/shard-000000.cvs";
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  auto index = (*ds)->LoadEpisode(0);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(index.status(), "truncated")) << index.status();
  EXPECT_TRUE(Contains(index.status(), "shard-000000.cvs"));
}

TEST(Format, WrongVersionAndBadMagicAreRefused) {
  TempDir dir;
  std::string path = WriteDataset(dir, 2);
  const std::string shard = path + "/shards/shard-000000.cvs";
  std::string bytes = testing::ReadFile(shard);
  std::string v99 = bytes;
  v99[8] = 99;
  testing::WriteFile(shard, v99);
  {
    auto ds = Dataset::Open(path);
    ASSERT_TRUE(ds.ok());
    auto index = (*ds)->LoadEpisode(0);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(index.status(), "version 99 is not supported")) << index.status();
  }
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  testing::WriteFile(shard, bad_magic);
  {
    auto ds = Dataset::Open(path);
    ASSERT_TRUE(ds.ok());
    auto index = (*ds)->LoadEpisode(0);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(index.status(), "not a Conveyor shard")) << index.status();
  }
  // A manifest from a future version.
  ReplaceInFile(path + "/manifest.json", "\"format_version\": 1", "\"format_version\": 7");
  auto ds = Dataset::Open(path);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(ds.status(), "format version 7")) << ds.status();
}

TEST(Format, LyingManifestIsCaught) {
  TempDir dir;
  std::string path = WriteDataset(dir, 2);
  const std::string manifest = path + "/manifest.json";
  const std::string original = testing::ReadFile(manifest);

  ReplaceInFile(manifest, "\"num_episodes\": 2", "\"num_episodes\": 3");
  auto ds = Dataset::Open(path);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(ds.status(), "says 3 episodes")) << ds.status();

  testing::WriteFile(manifest, original);
  ReplaceInFile(manifest, "\"name\": \"state\"", "\"name\": \"joints\"");
  ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  auto index = (*ds)->LoadEpisode(0);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(index.status(), "manifest does not match shard")) << index.status();
  EXPECT_TRUE(Contains(index.status(), "'joints'")) << index.status();

  testing::WriteFile(manifest, original);
  const uint64_t size = std::filesystem::file_size(path + "/shards/shard-000000.cvs");
  ReplaceInFile(manifest, "\"bytes\": " + std::to_string(size), "\"bytes\": " + std::to_string(size + 10));
  ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok());
  index = (*ds)->LoadEpisode(0);
  EXPECT_TRUE(Contains(index.status(), "but the manifest says " + std::to_string(size + 10)))
      << index.status();

  testing::WriteFile(manifest, original);
  FlipByte(path + "/episodes.bin", 40);
  ds = Dataset::Open(path);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(ds.status(), "episodes.bin")) << ds.status();
}

TEST(Format, MissingOrMalformedManifest) {
  TempDir dir;
  auto ds = Dataset::Open(dir.path());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(ds.status(), "no Conveyor dataset at")) << ds.status();
  testing::WriteFile(dir.Join("manifest.json"), "{\"format\": \"conveyor-dataset\", ");
  ds = Dataset::Open(dir.path());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(ds.status(), "manifest.json")) << ds.status();
  testing::WriteFile(dir.Join("manifest.json"), "{\"format\": \"conveyor-dataset\", \"format_version\": 1}");
  ds = Dataset::Open(dir.path());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(ds.status(), "fingerprint")) << ds.status();
}

TEST(Format, WriterRejectsInconsistentEpisodes) {
  TempDir dir;
  auto w = DatasetWriter::Create(dir.Join("ds"), {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->AddEpisode(MakeEpisode(0)).ok());
  absl::Status s = (*w)->AddEpisode(MakeEpisode(1, 40, 600, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "test episode 1")) << s;
  EpisodeData bad = MakeEpisode(2);
  bad.streams[1].timestamps_s[10] = -1;
  s = (*w)->AddEpisode(bad);
  EXPECT_TRUE(Contains(s, "goes backwards")) << s;
  // Refuses a non-empty output directory.
  EXPECT_EQ(DatasetWriter::Create(dir.Join("ds"), {}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(LowdimCodec, RoundTripsAndRejectsWrongSizes) {
  std::vector<float> v;
  for (int i = 0; i < 1000; ++i) v.push_back(std::cos(i * 0.01f) * 3.0f);
  std::string block = EncodeLowdimBlock(v.data(), v.size(), 3);
  EXPECT_LT(block.size(), v.size() * 4);
  std::vector<float> out(v.size());
  ASSERT_TRUE(DecodeLowdimBlock(block, out.data(), out.size(), "t").ok());
  EXPECT_EQ(out, v);
  EXPECT_EQ(DecodeLowdimBlock(block, out.data(), 999, "t").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeLowdimBlock("garbage", out.data(), 10, "t").code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace conveyor
