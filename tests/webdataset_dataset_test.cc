// WebDataset shards read in place (datasets/webdataset/, docs/webdataset.md), on shard folders
// written at test time by tests/fixtures/webdataset/make_wds.py (Python's tarfile in its ustar,
// pax and GNU variants, mp4 clips by the ffmpeg CLI, .npy by numpy): the tar listing against
// tarfile's, every frame against the ffmpeg CLI's decode of the member, .npy values bit for bit,
// Cosmos-Curate's columns joined by key, the members that lie, damaged and compressed shards,
// the member index kept, batches over HTTP and at any thread count with examples/webdataset.yaml.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "datasets/webdataset/tar.h"
#include "datasets/webdataset/wds_index.h"
#include "media/video_decoder.h"
#include "tests/support/media_checks.h"
#include "tests/support/nginx_server.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using json = nlohmann::json;

class WebDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // Member indexes go here, not to the user's cache (the CLI runs below inherit it).
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
    const auto r = RunCommand(
        "/usr/bin/python3 " +
        ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/tests/fixtures/webdataset/make_wds.py") +
        " " + ShellQuote(dir_->Join("wds")) + " 2>&1");
    if (r.exit_code != 0) error_ = r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << "make_wds.py failed:\n" << error_; }

  static std::string Root(const std::string& copy) { return dir_->Join("wds/" + copy); }
  static std::string Expected(const std::string& file) {
    return ReadFile(dir_->Join("wds/expected/" + file));
  }

  static std::unique_ptr<Dataset> Open(const std::string& location) {
    auto ds = Dataset::Open(location);
    EXPECT_TRUE(ds.ok()) << ds.status();
    return ds.ok() ? *std::move(ds) : nullptr;
  }

  // The samples' keys in shard order, as make_wds.py wrote them.
  static std::vector<std::string> Keys() {
    std::vector<std::string> keys;
    for (const json& k : json::parse(Expected("keys.json"))) keys.push_back(k.get<std::string>());
    return keys;
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::string error_;
};

bool Mentions(const absl::Status& s, const std::string& text) {
  return std::string(s.message()).find(text) != std::string::npos;
}

// The listing of each tar variant: the members tarfile wrote, at offsets whose bytes are the
// members' (read back from the file), directory entries skipped, a zero-length member listed.
TEST_F(WebDatasetTest, ListsUstarPaxAndGnuTars) {
  const std::vector<std::string> keys = Keys();
  auto storage = OpenStorage(Root("flat"));
  ASSERT_TRUE(storage.ok());
  struct Want {
    std::string shard;
    std::vector<int> samples;
  };
  for (const Want& w :
       {Want{"000000.tar", {0, 1}}, Want{"000001.tar", {2}}, Want{"000002.tar", {3}}}) {
    auto file = (*storage)->Open(w.shard);
    ASSERT_TRUE(file.ok()) << file.status();
    auto l = webdataset::ListTar(**file, 4096);  // a small window: headers across many reads
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_TRUE(l->error.empty()) << l->error;
    EXPECT_TRUE(l->skipped.empty());
    std::vector<std::string> paths;
    for (const auto& m : l->members) paths.push_back(m.path);
    std::vector<std::string> want;
    for (int i : w.samples) {
      for (const char* ext : {"mp4", "json", "txt", "t5.npy"}) want.push_back(keys[i] + "." + ext);
      if (i == 1) want.push_back(keys[i] + ".extra");
    }
    EXPECT_EQ(paths, want) << w.shard;
    for (const auto& m : l->members) {
      std::string bytes(m.size, '\0');
      ASSERT_TRUE((*file)->Read(m.offset, m.size, bytes.data()).ok());
      const int i = w.samples[&m - &l->members[0] < 4 ? 0 : 1];
      if (m.path.ends_with(".mp4")) {
        EXPECT_TRUE(bytes == Expected(std::to_string(i) + ".mp4")) << m.path;
      }
      if (m.path.ends_with(".txt")) {
        EXPECT_EQ(bytes, Expected(std::to_string(i) + ".txt")) << m.path;
      }
    }
    if (w.shard == "000000.tar") {
      EXPECT_EQ(l->members[2].size, 0u);  // sample 0's empty caption
    }
  }
}

TEST(WebDatasetKeyTest, KeyUpToTheFirstDotOfTheBasename) {
  using webdataset::SplitKey;
  EXPECT_EQ(SplitKey("clips/0001.t5.npy"),
            (std::pair<std::string, std::string>{"clips/0001", "t5.npy"}));
  EXPECT_EQ(SplitKey("v1.2/a.b/0001.mp4"),
            (std::pair<std::string, std::string>{"v1.2/a.b/0001", "mp4"}));
  EXPECT_EQ(SplitKey("README"), (std::pair<std::string, std::string>{"README", ""}));
  EXPECT_EQ(SplitKey(".hidden"), (std::pair<std::string, std::string>{"", "hidden"}));
}

TEST_F(WebDatasetTest, StreamsFromTheMembers) {
  auto ds = Open(Root("flat"));
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->format(), "webdataset");
  ASSERT_EQ(ds->num_episodes(), 4u);
  const Manifest& m = ds->manifest();
  std::vector<std::string> names;
  for (const StreamInfo& s : m.streams) names.push_back(s.name);
  // Video first, then lowdim, then text (each by name); the nested object is not a stream.
  EXPECT_EQ(names, (std::vector<std::string>{"mp4", "json.clip", "json.duration", "json.fps",
                                             "json.watermark", "t5.npy", "json.caption", "txt"}));
  const StreamInfo& video = m.streams[0];
  EXPECT_EQ(video.kind, pb::VIDEO);
  EXPECT_EQ(video.codec, "h264");
  EXPECT_EQ(video.shape, (std::vector<int64_t>{48, 64, 3}));
  EXPECT_DOUBLE_EQ(video.rate, 12);
  const StreamInfo& t5 = m.streams[static_cast<size_t>(m.StreamIndex("t5.npy"))];
  EXPECT_EQ(t5.kind, pb::LOWDIM);
  EXPECT_EQ(t5.codec, "npy <f2 8x16");
  EXPECT_EQ(t5.shape, (std::vector<int64_t>{128}));
  EXPECT_EQ(m.streams[static_cast<size_t>(m.StreamIndex("json.clip"))].shape,
            (std::vector<int64_t>{2}));
  // Clips of 1, 1.5, 1 and 2 s at 12 fps, in shard order.
  const std::vector<uint32_t> frames = {12, 18, 12, 24};
  const std::vector<std::string> keys = Keys();
  for (size_t e = 0; e < 4; ++e) {
    EXPECT_EQ(ds->episodes().length(e, 0), frames[e]);
    auto index = ds->LoadEpisode(e);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_NE((*index)->source().find("'" + keys[e] + "'"), std::string::npos)
        << (*index)->source();
  }
}

// Every frame served equals what the ffmpeg CLI decodes from the member extracted.
TEST_F(WebDatasetTest, EveryFrameEqualsTheFfmpegCliOnTheMember) {
  auto ds = Open(Root("flat"));
  ASSERT_NE(ds, nullptr);
  VideoDecoder decoder;
  for (size_t e = 0; e < 4; ++e) {
    const std::string member = dir_->Join("member.mp4");
    conveyor::testing::WriteFile(member, Expected(std::to_string(e) + ".mp4"));
    const std::vector<std::string> golden =
        conveyor::testing::FrameMd5s(member, "v", "-pix_fmt rgb24");
    auto index = ds->LoadEpisode(e);
    ASSERT_TRUE(index.ok()) << index.status();
    auto table = FrameTable::Build((*index)->streams(0));
    ASSERT_TRUE(table.ok()) << table.status();
    ASSERT_EQ(table->size(), golden.size());
    std::vector<int64_t> all(golden.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    std::vector<RgbImage> images;
    auto read = [&](size_t p, std::string* bytes) { return ds->ReadPacket(**index, 0, p, bytes); };
    ASSERT_TRUE(decoder
                    .Decode(e, (*index)->streams(0), *table, read, all, VideoOutput{},
                            DecodeLimits{}, &images)
                    .ok());
    for (size_t i = 0; i < images.size(); ++i) {
      EXPECT_EQ(conveyor::testing::Md5Hex(images[i].pixels.data(), images[i].pixels.size()),
                golden[i])
          << "episode " << e << ", frame " << i;
    }
  }
}

// .npy values bit for bit (float16 converted to float32 exactly), the same at every step of the
// clip; text and JSON fields as written.
TEST_F(WebDatasetTest, NpyTextAndJsonValues) {
  for (const std::string& copy : {std::string("flat"), std::string("cosmos")}) {
    auto ds = Open(Root(copy));
    ASSERT_NE(ds, nullptr);
    ASSERT_EQ(ds->num_episodes(), 4u) << copy;
    const int t5 = ds->manifest().StreamIndex("t5.npy");
    const int duration = ds->manifest().StreamIndex("json.duration");
    const int caption = ds->manifest().StreamIndex("json.caption");
    ASSERT_GE(t5, 0);
    ASSERT_GE(duration, 0);
    ASSERT_GE(caption, 0);
    for (size_t e = 0; e < 4; ++e) {
      auto index = ds->LoadEpisode(e);
      ASSERT_TRUE(index.ok()) << index.status();
      std::vector<float> values;
      ASSERT_TRUE(ds->ReadLowdim(**index, t5, 3, 2, &values).ok());
      const std::string want = Expected(std::to_string(e) + ".t5.f32");
      ASSERT_EQ(values.size() * 4, 2 * want.size());
      EXPECT_EQ(std::memcmp(values.data(), want.data(), want.size()), 0) << copy << " " << e;
      EXPECT_EQ(std::memcmp(values.data() + 128, want.data(), want.size()), 0);
      ASSERT_TRUE(ds->ReadLowdim(**index, duration, 0, 1, &values).ok());
      const float durations[] = {1.0f, 1.5f, 1.0f, 2.0f};
      EXPECT_FLOAT_EQ(values[0], durations[e]);
      EXPECT_EQ((*index)->streams(caption).text(), Expected(std::to_string(e) + ".txt"));
      const int txt = ds->manifest().StreamIndex("txt");
      if (copy == "flat") {
        EXPECT_EQ((*index)->streams(txt).text(), Expected(std::to_string(e) + ".txt"));
      }
      // Every per-clip value sits at the video's frame times.
      EXPECT_EQ((*index)->streams(t5).timestamps_s_size(),
                static_cast<int>(ds->episodes().length(e, 0)));
    }
  }
}

// img2dataset's layout: a JPEG, a caption and a class label per key, no video: each sample is one
// instant (t = 0), the image packet the member's bytes, decoded by libjpeg-turbo.
TEST_F(WebDatasetTest, ImagesTextAndClassLabels) {
  auto ds = Open(Root("images"));
  ASSERT_NE(ds, nullptr);
  ASSERT_EQ(ds->num_episodes(), 3u);
  const Manifest& m = ds->manifest();
  ASSERT_EQ(m.streams.size(), 3u);
  EXPECT_EQ(m.streams[0].name, "jpg");
  EXPECT_EQ(m.streams[0].kind, pb::IMAGE);
  EXPECT_EQ(m.streams[0].codec, "mjpeg");
  EXPECT_EQ(m.streams[0].shape, (std::vector<int64_t>{30, 40, 3}));
  EXPECT_EQ(m.streams[1].name, "cls");
  EXPECT_EQ(m.streams[2].name, "txt");
  for (size_t e = 0; e < 3; ++e) {
    auto index = ds->LoadEpisode(e);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_EQ(ds->episodes().length(e, 0), 1u);
    std::string bytes;
    ASSERT_TRUE(ds->ReadPacket(**index, 0, 0, &bytes).ok());
    EXPECT_TRUE(bytes == Expected("img" + std::to_string(e) + ".jpg")) << e;
    std::vector<float> label;
    ASSERT_TRUE(ds->ReadLowdim(**index, 1, 0, 1, &label).ok());
    EXPECT_EQ(label, std::vector<float>{static_cast<float>(7 * e)});
    EXPECT_EQ((*index)->streams(2).text(), "picture " + std::to_string(e));
  }
  // The default sample of every stream assembles (the image decoded at t = 0).
  const std::string out = dir_->Join("image_samples");
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " sample " + ShellQuote(Root("images")) +
                                " --count 3 --out " + ShellQuote(out) + " 2>&1",
                            120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  size_t written = 0;
  for (const auto& f : fs::recursive_directory_iterator(out))
    written += f.path().extension() == ".npy";
  EXPECT_GE(written, 9u) << r.output;  // jpg, cls (and its _is_pad), txt per sample
}

TEST_F(WebDatasetTest, CosmosColumnsJoinedByKey) {
  auto ds = Open(Root("cosmos"));
  ASSERT_NE(ds, nullptr);
  // Two shard sets of three columns each.
  ASSERT_EQ(ds->manifest().shards.size(), 6u);
  EXPECT_EQ(ds->manifest().shards[0].path, "metas/part_0/0.tar");
  EXPECT_EQ(ds->manifest().streams[0].name, "mp4");
  EXPECT_EQ(ds->episodes().length(3, 0), 24u);
  auto one = Dataset::Open(Root("cosmos") + "#columns=video,t5_xxl");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_LT((*one)->manifest().StreamIndex("json.duration"), 0);
  EXPECT_GE((*one)->manifest().StreamIndex("t5.npy"), 0);
  auto bad = Dataset::Open(Root("cosmos") + "#columns=video,captions");
  EXPECT_FALSE(bad.ok());
  EXPECT_TRUE(Mentions(bad.status(), "column 'captions'")) << bad.status();
}

// The member index is built once and kept: a second open reads no tar bytes, and the cache
// entries are private files.
TEST_F(WebDatasetTest, MemberIndexKeptAndReused) {
  const std::string cache = dir_->Join("index_reuse");
  setenv("CONVEYOR_INDEX_CACHE_DIR", cache.c_str(), 1);
  auto first = Open(Root("flat"));
  ASSERT_NE(first, nullptr);
  EXPECT_GT(first->storage().stats().bytes_read, 0u);
  int entries = 0;
  for (const auto& f : fs::directory_iterator(cache)) {
    ++entries;
    struct stat st;
    ASSERT_EQ(::stat(f.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  EXPECT_EQ(entries, 3);
  auto second = Open(Root("flat"));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->storage().stats().bytes_read, 0u);
  EXPECT_EQ(second->manifest().fingerprint, first->manifest().fingerprint);
  // Served from the kept index: the packet tables read back from the entry.
  auto index = second->LoadEpisode(3);
  ASSERT_TRUE(index.ok()) << index.status();
  std::string packet;
  EXPECT_TRUE(second->ReadPacket(**index, 0, 0, &packet).ok());
  // Without an index cache the packet tables are kept in memory: the same samples.
  setenv("CONVEYOR_INDEX_CACHE_DIR", "none", 1);
  auto memory = Open(Root("flat"));
  ASSERT_NE(memory, nullptr);
  EXPECT_EQ(memory->manifest().fingerprint, first->manifest().fingerprint);
  auto again = memory->LoadEpisode(3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->SerializeAsString(), (*index)->SerializeAsString());
  std::string same;
  EXPECT_TRUE(memory->ReadPacket(**again, 0, 0, &same).ok());
  EXPECT_EQ(same, packet);
  setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index").c_str(), 1);
}

// Members that lie are broken samples naming shard, key and member; the rest are served.
TEST_F(WebDatasetTest, MembersThatLieAreBrokenSamples) {
  const std::vector<std::string> keys = Keys();
  struct Case {
    std::string copy;
    size_t episode;
    std::vector<std::string> mentions;
  };
  for (const Case& c :
       {Case{"lying_jpeg", 1, {"000000.tar", keys[1] + ".mp4", "not a .mp4", "a JPEG"}},
        Case{"lying_duration",
             2,
             {"000001.tar", keys[2], "says duration 9 s", "its video ('.mp4') lasts"}},
        Case{"misshapen", 3, {"000002.tar", keys[3] + ".t5.npy", "[8,16,1]", "[8,16]", "rank"}},
        Case{"missing_member", 1, {keys[1] + ".json", "is missing"}}}) {
    auto ds = Open(Root(c.copy));
    ASSERT_NE(ds, nullptr) << c.copy;
    ASSERT_EQ(ds->num_episodes(), 4u);
    for (size_t e = 0; e < 4; ++e) {
      auto index = ds->LoadEpisode(e);
      if (e != c.episode) {
        EXPECT_TRUE(index.ok()) << c.copy << " " << e << ": " << index.status();
        continue;
      }
      ASSERT_FALSE(index.ok()) << c.copy;
      EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
      for (const std::string& m : c.mentions)
        EXPECT_TRUE(Mentions(index.status(), m)) << c.copy << ": " << index.status();
    }
  }
}

// `conveyor check` names the broken sample (exit 2: errors) and writes the quarantine that leaves
// it out.
TEST_F(WebDatasetTest, CheckReportsTheLyingMember) {
  const std::string q = dir_->Join("quarantine.json");
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " check " + ShellQuote(Root("lying_jpeg")) +
                                " --json" + " --write-quarantine " + ShellQuote(q) + " 2>/dev/null",
                            120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const json j = json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  EXPECT_EQ(j["episodes_with_errors"], 1) << r.output;
  bool named = false;
  for (const json& f : j["findings"]) {
    if (f["episode"] == 1 && f["detail"].get<std::string>().find("not a .mp4") != std::string::npos)
      named = true;
  }
  EXPECT_TRUE(named) << r.output;
  EXPECT_FALSE(ReadFile(q).empty());
}

// Bytes that are not UTF-8 where text is expected: a key (a member name) of byte 0xff and a .npy
// header whose dtype starts with byte 0xbc (the input tests/fuzz/webdataset_fuzz.cc found, which
// ended the process: the probe wrote the dtype into JSON, and nlohmann::json throws on such a
// string). The sample is broken, naming its member and the dtype; `conveyor check --json` reports
// it, its key written with U+FFFD, as valid JSON.
TEST_F(WebDatasetTest, BytesThatAreNotUtf8AreBrokenSamplesNotCrashes) {
  const std::string root = dir_->Join("not_utf8");
  fs::create_directories(root);
  const std::string script = dir_->Join("not_utf8.py");
  std::ofstream(script) << R"PY(
import io, sys, tarfile
import numpy as np
def npy(a):
    b = io.BytesIO(); np.save(b, a); return b.getvalue()
good = npy(np.arange(4, dtype=np.float32))
bad = good.replace(b"'descr': '<f4'", b"'descr': '\xbcf4'")
assert bad != good
with tarfile.open(sys.argv[1] + "/000000.tar", "w", format=tarfile.USTAR_FORMAT,
                  encoding="utf-8", errors="surrogateescape") as t:
    for key, data in (("a", good), ("b\udcff", bad)):
        for ext, payload in (("txt", b"a caption"), ("t5.npy", data)):
            i = tarfile.TarInfo(key + "." + ext); i.size = len(payload)
            t.addfile(i, io.BytesIO(payload))
)PY";
  const auto made = RunCommand("/usr/bin/python3 " + ShellQuote(script) + " " + ShellQuote(root) + " 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto ds = Open(root);
  ASSERT_NE(ds, nullptr);
  ASSERT_EQ(ds->num_episodes(), 2u);
  int broken = 0;
  for (size_t e = 0; e < 2; ++e) {
    auto index = ds->LoadEpisode(e);
    if (index.ok()) continue;
    ++broken;
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss) << index.status();
    EXPECT_TRUE(Mentions(index.status(), ".t5.npy")) << index.status();
    EXPECT_TRUE(Mentions(index.status(), "unsupported dtype '\\xbc")) << index.status();
  }
  EXPECT_EQ(broken, 1);
  const auto r = RunCommand(ShellQuote(CONVEYOR_CLI) + " check " + ShellQuote(root) + " --json 2>/dev/null", 120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const json j = json::parse(r.output, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.output;
  bool named = false;
  for (const json& f : j["findings"]) {
    const std::string detail = f["detail"].get<std::string>();
    if (detail.find("unsupported dtype") != std::string::npos &&
        detail.find("b\xef\xbf\xbd") != std::string::npos) {
      named = true;
    }
  }
  EXPECT_TRUE(named) << r.output;
}

// A shard cut inside a member: the samples before it are served, the cut sample and the damage
// are broken samples that say so. A damaged header checksum likewise.
TEST_F(WebDatasetTest, TruncatedShardAndBadChecksum) {
  auto ds = Open(Root("truncated"));
  ASSERT_NE(ds, nullptr);
  ASSERT_EQ(ds->num_episodes(), 4u);  // samples 0-2 and the damage (sample 3 lost its members)
  for (size_t e = 0; e < 3; ++e) EXPECT_TRUE(ds->LoadEpisode(e).ok()) << e;
  auto damaged = ds->LoadEpisode(3);
  ASSERT_FALSE(damaged.ok());
  EXPECT_TRUE(Mentions(damaged.status(), "000002.tar")) << damaged.status();
  EXPECT_TRUE(Mentions(damaged.status(), "truncated shard")) << damaged.status();

  auto bad = Open(Root("bad_checksum"));
  ASSERT_NE(bad, nullptr);
  ASSERT_EQ(bad->num_episodes(), 4u);  // 0, 1, the damage in 000001.tar, 3
  auto e2 = bad->LoadEpisode(2);
  ASSERT_FALSE(e2.ok());
  EXPECT_TRUE(Mentions(e2.status(), "000001.tar, header at byte 0: bad header checksum"))
      << e2.status();
  EXPECT_TRUE(bad->LoadEpisode(3).ok());
}

TEST_F(WebDatasetTest, CompressedShardsRefusedWithTheReason) {
  auto ds = Dataset::Open(Root("tgz"));
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Mentions(ds.status(), "000001.tar.gz is a compressed tar")) << ds.status();
  EXPECT_TRUE(Mentions(ds.status(), "gzip -d")) << ds.status();
  // The same bytes under a .tar name are caught by their magic.
  const std::string renamed = dir_->Join("renamed");
  fs::create_directories(renamed);
  fs::copy_file(Root("tgz/000001.tar.gz"), renamed + "/000001.tar");
  ds = Dataset::Open(renamed);
  ASSERT_FALSE(ds.ok());
  EXPECT_TRUE(Mentions(ds.status(), "is a gzip-compressed tar")) << ds.status();
}

std::string Batches(const std::string& location, const std::string& extra) {
  const auto r =
      RunCommand(ShellQuote(CONVEYOR_CLI) + " batches " + ShellQuote(location) + " --config " +
                     ShellQuote(std::string(CONVEYOR_SOURCE_DIR) + "/examples/webdataset.yaml") +
                     " --digest " + extra + " 2>/dev/null",
                 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// examples/webdataset.yaml end to end: the same batches at 1 and 2 threads, over HTTP from nginx
// (shards.txt), and resumed from a cursor.
TEST_F(WebDatasetTest, BatchesAtAnyThreadCountOverHttpAndResumed) {
  const std::string one = Batches(Root("flat"), "--steps 8 --threads 1");
  const std::vector<std::string> lines = conveyor::testing::SplitLines(one);
  ASSERT_EQ(lines.size(), 8u) << one;
  EXPECT_EQ(Batches(Root("flat"), "--steps 8 --threads 2"), one);
  auto nginx = conveyor::testing::NginxServer::Start(dir_->Join("wds"));
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  EXPECT_EQ(Batches((*nginx)->base_url() + "flat/", "--steps 8 --threads 2"), one)
      << (*nginx)->ErrorLog();
  const std::string cursor = lines[3].substr(0, lines[3].find(' '));
  std::string want;
  for (size_t i = 3; i < 8; ++i) want += lines[i] + "\n";
  EXPECT_EQ(Batches(Root("flat"), "--threads 2 --steps 5 --cursor " + cursor), want);
}

}  // namespace
}  // namespace conveyor
