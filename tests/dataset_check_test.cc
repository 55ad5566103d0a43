// `conveyor check`, the dataset doctor (datasets/dataset_check.h, docs/check.md), on datasets made
// by `conveyor synth` and by tests/fixtures/lerobot/make_lerobot.sh, clean and then damaged: a
// shard deleted and one truncated, a video's timestamps that jump, LeRobot videos missing or
// truncated, rows that belong to no episode, an episode length that lies. Each damage must be
// reported for the episode, stream and file it concerns, with the exit status, in the JSON and in
// the human table; the quarantine it writes must keep those episodes out of `conveyor batches`.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "datasets/dataset_check.h"
#include "format/dataset_writer.h"
#include "format/format.h"
#include "tests/support/lerobot_fixtures.h"
#include "tests/support/nginx_server.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

namespace fs = std::filesystem;
namespace pb = format::v1;
using conveyor::testing::ReadFile;
using conveyor::testing::RunCommand;
using conveyor::testing::ShellQuote;
using conveyor::testing::TempDir;
using conveyor::testing::WriteFile;
using json = nlohmann::json;

struct CheckRun {
  int exit_code = -1;
  std::string output;  // stdout (the table or the JSON)
  json j;              // with --json
};

// Runs `conveyor check ROOT FLAGS`; stderr (log lines) is left out of `output`.
CheckRun Check(const std::string& root, const std::string& flags = "--json") {
  CheckRun r;
  const auto c = RunCommand(std::string(CONVEYOR_CLI) + " check " + ShellQuote(root) + " " + flags +
                                " 2>/dev/null",
                            300);
  r.exit_code = c.exit_code;
  r.output = c.output;
  if (flags.find("--json") != std::string::npos) {
    try {
      r.j = json::parse(c.output);
    } catch (const json::exception& e) {
      ADD_FAILURE() << "not JSON: " << e.what() << "\n" << c.output;
    }
  }
  return r;
}

// The findings of one episode (-1: the dataset's own), optionally of one kind.
std::vector<json> FindingsOf(const json& j, int64_t episode, const std::string& what = "") {
  std::vector<json> out;
  for (const json& f : j["findings"]) {
    if (f["episode"].get<int64_t>() == episode && (what.empty() || f["what"] == what)) {
      out.push_back(f);
    }
  }
  return out;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// A line of the human table: severity, episode, stream and what, in that order.
bool TableHasRow(const std::string& table, const std::string& severity, const std::string& episode,
                 const std::string& stream, const std::string& what, const std::string& file) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string sev, ep, st, wh;
    words >> sev >> ep >> st >> wh;
    if (sev == severity && ep == episode && st == stream && wh == what &&
        line.find(file) != std::string::npos) {
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Native datasets made by `conveyor synth`.

class NativeCheckTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // Four episodes of 2 s, one per shard, two cameras at 10 fps with a keyframe every 10 frames.
    const auto r = RunCommand(std::string(CONVEYOR_CLI) + " synth --quiet --out " +
                              ShellQuote(dir_->Join("clean")) +
                              " --episodes 4 --episode-seconds 2 --cameras 2 --size 64x48 --fps 10"
                              " --gop 10 --state-dim 4 --action-dim 4 --lowdim-rate 10"
                              " --audio-codec none --episodes-per-shard 1 --seed 3");
    if (r.exit_code != 0) error_ = r.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(error_.empty()) << error_; }

  static std::string Clean() { return dir_->Join("clean"); }
  static std::string CopyOf(const std::string& name) {
    const std::string to = dir_->Join(name);
    fs::copy(Clean(), to, fs::copy_options::recursive);
    return to;
  }

  static TempDir* dir_;
  static std::string error_;
};
TempDir* NativeCheckTest::dir_ = nullptr;
std::string NativeCheckTest::error_;

TEST_F(NativeCheckTest, ASynthDatasetIsClean) {
  const CheckRun r = Check(Clean());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.j["status"], "clean");
  EXPECT_EQ(r.j["errors"], 0);
  EXPECT_EQ(r.j["warnings"], 0);
  EXPECT_EQ(r.j["episodes_checked"], 4);
  EXPECT_TRUE(r.j["findings"].empty()) << r.j.dump(2);
  const CheckRun table = Check(Clean(), "");
  EXPECT_EQ(table.exit_code, 0);
  EXPECT_NE(table.output.find(" (conveyor): clean; 4 of 4 episodes checked, 0 errors"), std::string::npos)
      << table.output;
  // --episodes bounds the work; --no-decode-ends says so.
  const CheckRun quick = Check(Clean(), "--episodes 2 --no-decode-ends");
  EXPECT_EQ(quick.exit_code, 0) << quick.output;
  EXPECT_NE(quick.output.find("2 of 4 episodes checked (ends not decoded)"), std::string::npos)
      << quick.output;
}

// A deleted shard and a truncated one: errors for exactly those episodes, naming the shard; the
// quarantine they write keeps those episodes out of the batches, counted.
TEST_F(NativeCheckTest, DeletedAndTruncatedShardsAreErrorsOfTheirEpisodes) {
  const std::string root = CopyOf("shards");
  const std::string deleted = root + "/shards/shard-000001.cvs";
  const std::string truncated = root + "/shards/shard-000002.cvs";
  fs::remove(deleted);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);

  const std::string quarantine = dir_->Join("shards_quarantine.json");
  const CheckRun r = Check(root, "--json --write-quarantine " + ShellQuote(quarantine));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.j["status"], "errors");
  EXPECT_EQ(r.j["episodes_with_errors"], 2);
  EXPECT_TRUE(FindingsOf(r.j, 0).empty()) << r.j.dump(2);
  EXPECT_TRUE(FindingsOf(r.j, 3).empty()) << r.j.dump(2);
  for (const auto& [episode, file] : {std::pair<int64_t, std::string>{1, deleted}, {2, truncated}}) {
    const std::vector<json> f = FindingsOf(r.j, episode);
    ASSERT_FALSE(f.empty()) << "episode " << episode << ": " << r.j.dump(2);
    EXPECT_EQ(f[0]["severity"], "error");
    EXPECT_EQ(f[0]["file"], file) << f[0].dump();
    EXPECT_FALSE(f[0]["detail"].get<std::string>().empty());
  }
  const CheckRun table = Check(root, "");
  EXPECT_EQ(table.exit_code, 2);
  EXPECT_TRUE(TableHasRow(table.output, "error", "1", "-", "file_missing", "shard-000001.cvs"))
      << table.output;
  EXPECT_NE(table.output.find(": errors; 4 of 4 episodes checked, "), std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find(" in 2 episodes"), std::string::npos) << table.output;

  // The quarantine: episodes 1 and 2, with their reasons.
  const json q = json::parse(ReadFile(quarantine));
  ASSERT_EQ(q["datasets"].size(), 1u);
  std::set<int64_t> listed;
  for (const json& e : q["datasets"][0]["episodes"]) listed.insert(e["episode"].get<int64_t>());
  EXPECT_EQ(listed, (std::set<int64_t>{1, 2}));

  // Batches over every sample: on_error: fail fails on a broken episode without the quarantine,
  // and with it runs through, never serving a sample of episodes 1 or 2, and says so.
  const std::string config = dir_->Join("shards.yaml");
  const std::string body =
      "streams:\n  cam0: {}\n  observation.state: {}\npipeline:\n  global_batch_size: 4\n  seed: 1\n";
  const std::string cli = std::string(CONVEYOR_CLI);
  WriteFile(config, body);
  const auto without = RunCommand(cli + " batches " + ShellQuote(root) + " --config " +
                                      ShellQuote(config) + " --steps 1000 --threads 1 2>&1",
                                  300);
  EXPECT_NE(without.exit_code, 0) << without.output;
  WriteFile(config, "quarantine: " + quarantine + "\n" + body);
  const auto with = RunCommand(cli + " batches " + ShellQuote(root) + " --config " +
                                   ShellQuote(config) + " --steps 10 --threads 1 --ids --stats 2>&1",
                               300);
  ASSERT_EQ(with.exit_code, 0) << with.output;
  size_t samples = 0;
  std::istringstream lines(with.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t open = line.find('[');
    if (line.find(" consumer ") == std::string::npos || open == std::string::npos) continue;
    std::istringstream ids(line.substr(open + 1, line.find(']') - open - 1));
    for (std::string id; ids >> id;) {
      ++samples;
      EXPECT_TRUE(id.rfind("0/", 0) == 0 || id.rfind("3/", 0) == 0)
          << "a sample of a quarantined episode was served: " << line;
    }
  }
  EXPECT_GT(samples, 0u) << with.output;
  EXPECT_NE(with.output.find("quarantine: 2 episodes"), std::string::npos) << with.output;
  EXPECT_NE(with.output.find(quarantine), std::string::npos) << "the log names the file: "
                                                            << with.output;

  // Served: the server's metrics count the job's quarantined episodes and samples.
  conveyor::testing::ServerProcess server(
      cli, {root, "--config", config, "--metrics-listen", "127.0.0.1:0", "--threads", "1"},
      dir_->path());
  ASSERT_TRUE(server.ok()) << server.log();
  const auto fetched = RunCommand(cli + " fetch --servers " + server.address() +
                                      " --job quarantined --config " + ShellQuote(config) +
                                      " --steps 2 2>&1",
                                  120);
  EXPECT_EQ(fetched.exit_code, 0) << fetched.output << server.log();
  int code = 0;
  const std::string metrics = conveyor::testing::Capture(
      "curl -sf http://" + server.metrics_address() + "/metrics", &code);
  ASSERT_EQ(code, 0);
  EXPECT_NE(metrics.find("conveyor_quarantined_episodes{job=\"quarantined\"} 2"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("conveyor_quarantined_samples{job=\"quarantined\"} 40"), std::string::npos)
      << metrics;
  EXPECT_NE(server.log().find("quarantine " + quarantine), std::string::npos) << server.log();

  // A quarantine written for another dataset is an error, never silently ignored (the damaged
  // copy keeps the clean one's fingerprint: it is the same dataset, as a deleted file leaves
  // manifest.json and episodes.bin as they were).
  const std::string another = dir_->Join("another");
  ASSERT_EQ(RunCommand(cli + " synth --quiet --out " + ShellQuote(another) +
                       " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x48 --fps 10"
                       " --state-dim 4 --action-dim 4 --lowdim-rate 10 --audio-codec none --seed 9")
                .exit_code,
            0);
  const auto other = RunCommand(cli + " batches " + ShellQuote(another) + " --config " +
                                    ShellQuote(config) + " --steps 1 2>&1",
                                300);
  EXPECT_NE(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("has no entry for"), std::string::npos) << other.output;
}

// Copies `src` to `dst` through the Dataset API, letting `change` rewrite camera `stream`'s
// packets (decode order, with their index and the ticks of one frame period) in `episode`: a
// damage written with valid checksums, in an otherwise consistent dataset.
using PacketChange = std::function<void(int packet, int64_t period, EpisodeData::Packet*)>;
void CopyWithDamage(const std::string& src, const std::string& dst, size_t episode,
                    const std::string& stream, const PacketChange& change) {
  auto ds = Dataset::Open(src);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Manifest& m = (*ds)->manifest();
  DatasetWriter::Options o;
  o.name = m.name;
  o.episodes_per_shard = 1;
  auto w = DatasetWriter::Create(dst, o);
  ASSERT_TRUE(w.ok()) << w.status();
  for (size_t e = 0; e < (*ds)->num_episodes(); ++e) {
    auto index = (*ds)->LoadEpisode(e);
    ASSERT_TRUE(index.ok()) << index.status();
    EpisodeData ep;
    ep.source = (*index)->source();
    for (int s = 0; s < (*index)->streams_size(); ++s) {
      const pb::StreamIndex& si = (*index)->streams(s);
      EpisodeData::Stream out;
      out.info = m.streams[static_cast<size_t>(s)];
      out.codec = si.codec();
      out.time_base_num = si.time_base_num();
      out.time_base_den = si.time_base_den();
      out.pts_origin = si.pts_origin();
      if (si.kind() == pb::LOWDIM) {
        out.timestamps_s.assign(si.timestamps_s().begin(), si.timestamps_s().end());
        ASSERT_TRUE((*ds)->ReadLowdim(**index, s, 0, si.num_frames(), &out.values).ok());
      } else if (si.kind() == pb::TEXT) {
        out.text = si.text();
      } else {
        const pb::PacketTable& t = si.packets();
        const double tb = static_cast<double>(si.time_base_num()) / si.time_base_den();
        const int64_t period = std::llround(1.0 / (out.info.rate * tb));
        for (int p = 0; p < t.pts_size(); ++p) {
          EpisodeData::Packet packet;
          packet.pts = t.pts(p);
          packet.dts = t.dts(p);
          packet.duration = t.duration(p);
          packet.key = (t.flags(p) & format::kPacketKey) != 0;
          ASSERT_TRUE((*ds)->ReadPacket(**index, s, static_cast<size_t>(p), &packet.bytes).ok());
          if (e == episode && out.info.name == stream) change(p, period, &packet);
          out.packets.push_back(std::move(packet));
        }
      }
      ep.streams.push_back(std::move(out));
    }
    ASSERT_TRUE((*w)->AddEpisode(ep).ok());
  }
  ASSERT_TRUE((*w)->Finish().ok());
}

// Frames missing in the middle of a camera (its times jump by 5 frame periods): a warning naming
// the episode, the camera, where the jump is and how wide; the dataset still loads (exit 1). The
// jump makes that camera, and so the episode, 0.4 s longer, which leaves the other camera short
// of the episode's duration: a second warning, of that camera.
TEST_F(NativeCheckTest, TimestampsThatJumpAreAWarning) {
  const std::string root = dir_->Join("jump");
  // From decode-order packet 10 (a keyframe) on, 5 frame periods later.
  ASSERT_NO_FATAL_FAILURE(CopyWithDamage(
      Clean(), root, 1, "cam1", [](int p, int64_t period, EpisodeData::Packet* packet) {
        if (p == 10) ASSERT_TRUE(packet->key) << "packet 10 is not a keyframe";
        if (p >= 10) {
          packet->pts += 5 * period;
          packet->dts += 5 * period;
        }
      }));
  const CheckRun r = Check(root);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(r.j["status"], "warnings");
  EXPECT_EQ(r.j["errors"], 0) << r.j.dump(2);
  const std::vector<json> f = FindingsOf(r.j, 1, "timestamp_jump");
  ASSERT_EQ(f.size(), 1u) << r.j.dump(2);
  EXPECT_EQ(f[0]["severity"], "warning");
  EXPECT_EQ(f[0]["stream"], "cam1");
  EXPECT_TRUE(EndsWith(f[0]["file"].get<std::string>(), "shards/shard-000001.cvs")) << f[0].dump();
  EXPECT_NE(f[0]["detail"].get<std::string>().find("first at frame 10 (0.9 s -> 1.5 s)"),
            std::string::npos)
      << f[0].dump();
  EXPECT_NE(f[0]["detail"].get<std::string>().find("6 frame periods at 10 fps"), std::string::npos)
      << f[0].dump();
  const std::vector<json> short_camera = FindingsOf(r.j, 1, "duration_mismatch");
  ASSERT_EQ(short_camera.size(), 1u) << r.j.dump(2);
  EXPECT_EQ(short_camera[0]["stream"], "cam0");
  EXPECT_NE(short_camera[0]["detail"].get<std::string>().find(
                "covers 2 s (20 frames), the episode lasts 2.4 s: 4 frames short"),
            std::string::npos)
      << short_camera[0];
  EXPECT_EQ(r.j["findings"].size(), 2u) << "only episode 1: " << r.j.dump(2);
  // The library says the same.
  auto ds = Dataset::Open(root);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const CheckReport report = CheckDataset(**ds, CheckOptions{});
  EXPECT_EQ(report.errors(), 0u);
  EXPECT_EQ(report.warnings(), 2u);
  EXPECT_TRUE(report.EpisodesWithErrors().empty());
}

// A mixture: each dataset checked, its findings named by the mixture's name for it; the
// quarantine applies to that member only.
TEST_F(NativeCheckTest, AMixtureNamesItsDatasets) {
  const std::string bad = CopyOf("mixture_bad");
  fs::remove(bad + "/shards/shard-000003.cvs");
  const std::string mixture = dir_->Join("mixture.yaml");
  WriteFile(mixture, "mixture:\n  datasets:\n    - {name: good, uri: " + Clean() +
                         ", weight: 1}\n    - {name: bad, uri: " + bad + ", weight: 1}\n");
  const std::string quarantine = dir_->Join("mixture_quarantine.json");
  const CheckRun r = Check(mixture, "--json --write-quarantine " + ShellQuote(quarantine));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(r.j["mixture"].get<bool>());
  ASSERT_EQ(r.j["findings"].size(), 1u) << r.j.dump(2);
  EXPECT_EQ(r.j["findings"][0]["dataset"], "bad");
  EXPECT_EQ(r.j["findings"][0]["episode"], 3);
  EXPECT_EQ(r.j["findings"][0]["what"], "file_missing");
  ASSERT_EQ(r.j["datasets"].size(), 2u);
  const CheckRun table = Check(mixture, "");
  EXPECT_NE(table.output.find("dataset"), std::string::npos) << table.output;
  std::istringstream lines(table.output);
  bool row = false;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string member, sev, ep;
    words >> member >> sev >> ep;
    row = row || (member == "bad" && sev == "error" && ep == "3");
  }
  EXPECT_TRUE(row) << table.output;
  // The mixture trains without bad's episode 3 (on_error: fail, every sample of two epochs).
  const std::string config = dir_->Join("mixture_config.yaml");
  WriteFile(config, "quarantine: " + quarantine +
                        "\nstreams:\n  cam0: {}\npipeline:\n  global_batch_size: 4\n");
  const auto b = RunCommand(std::string(CONVEYOR_CLI) + " batches " + ShellQuote(mixture) +
                                " --config " + ShellQuote(config) + " --steps 80 --threads 1 --stats 2>&1",
                            300);
  EXPECT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("quarantine: 1 episodes"), std::string::npos) << b.output;
  // check --config writes the config's quarantine file.
  fs::remove(quarantine);
  const CheckRun again = Check(mixture, "--config " + ShellQuote(config));
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find("1 episode with errors written to " + quarantine), std::string::npos)
      << again.output;
  EXPECT_TRUE(fs::exists(quarantine));
}

// A keyframe whose bytes were damaged before they were written (so every checksum matches): the
// index loads and the packets read, but the first frame does not decode. With --no-decode-ends
// the quick check cannot see it.
TEST_F(NativeCheckTest, AFirstFrameThatDoesNotDecodeIsAnError) {
  const std::string root = dir_->Join("undecodable");
  ASSERT_NO_FATAL_FAILURE(CopyWithDamage(
      Clean(), root, 2, "cam0", [](int p, int64_t, EpisodeData::Packet* packet) {
        if (p == 0) packet->bytes.assign(packet->bytes.size(), '\xff');
      }));
  const CheckRun r = Check(root);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::vector<json> f = FindingsOf(r.j, 2, "decode_failed");
  ASSERT_EQ(f.size(), 1u) << r.j.dump(2);
  EXPECT_EQ(f[0]["stream"], "cam0");
  EXPECT_NE(f[0]["detail"].get<std::string>().find("the first frame (0) does not decode"),
            std::string::npos)
      << f[0];
  EXPECT_EQ(r.j["findings"].size(), 1u) << r.j.dump(2);
  EXPECT_EQ(Check(root, "--json --no-decode-ends").exit_code, 0);
}

// A dataset that is not there: an error naming it, exit 2.
TEST_F(NativeCheckTest, ADatasetThatDoesNotOpenIsAnError) {
  const CheckRun r = Check(dir_->Join("nothing_here"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  ASSERT_EQ(r.j["findings"].size(), 1u) << r.j.dump(2);
  EXPECT_EQ(r.j["findings"][0]["what"], "open_failed");
  EXPECT_NE(r.j["findings"][0]["file"].get<std::string>().find("nothing_here"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// LeRobot v3.0 and v2.1 read in place (the fixtures of lerobot_import_test).

const std::string kFixtures = std::string(CONVEYOR_LEROBOT_FIXTURE_DIR);

class LeRobotCheckTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const conveyor::testing::LeRobotFixtures made =
        conveyor::testing::MakeLeRobotFixtures(CONVEYOR_PARQUET_NPM_DIR, kFixtures);
    skip_ = made.skip;
    error_ = made.error;
    if (!skip_.empty() || !error_.empty()) return;
    dir_ = new TempDir();
    setenv("CONVEYOR_INDEX_CACHE_DIR", dir_->Join("index-cache").c_str(), 1);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(error_.empty()) << error_;
  }
  static std::string CopyOf(const std::string& v, const std::string& name) {
    const std::string to = dir_->Join(name);
    fs::copy(kFixtures + "/" + v, to, fs::copy_options::recursive);
    return to;
  }

  static TempDir* dir_;
  static std::string skip_, error_;
};
TempDir* LeRobotCheckTest::dir_ = nullptr;
std::string LeRobotCheckTest::skip_;
std::string LeRobotCheckTest::error_;

TEST_F(LeRobotCheckTest, TheFixturesAreClean) {
  for (const char* v : {"v30", "v21"}) {
    const CheckRun r = Check(kFixtures + "/" + v);
    EXPECT_EQ(r.exit_code, 0) << v << "\n" << r.output;
    EXPECT_TRUE(r.j["findings"].empty()) << v << "\n" << r.j.dump(2);
    const CheckRun table = Check(kFixtures + "/" + v, "");
    EXPECT_NE(table.output.find(std::string("(lerobot ") + (v[1] == '3' ? "v3.0" : "v2.1") +
                                "): clean"),
              std::string::npos)
        << table.output;
  }
}

// v3.0: episode 3 dropped from the episode table (its 8 rows in data file-001 orphaned), the
// wrist camera's file-001 (episodes 1-3) deleted, and the top camera's file-000 (episodes 0, 1)
// cut after 20 of its 23 frames, so episode 1 has 11 of its 14 frames.
TEST_F(LeRobotCheckTest, ADamagedV30) {
  const std::string root = CopyOf("v30", "v30_damaged");
  fs::remove(root + "/meta/episodes/chunk-000/file-001.parquet");
  json info = json::parse(ReadFile(root + "/meta/info.json"));
  info["total_episodes"] = 3;
  info["total_frames"] = info["total_frames"].get<int64_t>() - 8;
  WriteFile(root + "/meta/info.json", info.dump());
  const std::string wrist = root + "/videos/observation.images.wrist/chunk-000/file-001.mp4";
  fs::remove(wrist);
  const std::string top = root + "/videos/observation.images.top/chunk-000/file-000.mp4";
  const auto cut = RunCommand(conveyor::testing::kFfmpeg + " -i " + ShellQuote(top) +
                              " -frames:v 20 -c copy " + ShellQuote(top + ".cut.mp4") + " && mv " +
                              ShellQuote(top + ".cut.mp4") + " " + ShellQuote(top));
  ASSERT_EQ(cut.exit_code, 0) << cut.output;

  const CheckRun r = Check(root);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  // Orphaned rows: a warning on the data file, with the count and share.
  const std::vector<json> orphans = FindingsOf(r.j, -1, "orphaned_rows");
  ASSERT_EQ(orphans.size(), 1u) << r.j.dump(2);
  EXPECT_EQ(orphans[0]["severity"], "warning");
  EXPECT_TRUE(EndsWith(orphans[0]["file"], "data/chunk-000/file-001.parquet")) << orphans[0];
  EXPECT_NE(orphans[0]["detail"].get<std::string>().find("8 of 19 rows (42.1%)"), std::string::npos)
      << orphans[0];
  // The missing wrist video: episodes 1 and 2.
  for (int64_t e : {1, 2}) {
    const std::vector<json> f = FindingsOf(r.j, e, "video_missing");
    ASSERT_EQ(f.size(), 1u) << e << ": " << r.j.dump(2);
    EXPECT_EQ(f[0]["stream"], "observation.images.wrist");
    EXPECT_EQ(f[0]["file"], wrist);
  }
  // The truncated top video: episode 1 has 11 frames for its 14 rows.
  const std::vector<json> count = FindingsOf(r.j, 1, "frame_count");
  ASSERT_EQ(count.size(), 1u) << r.j.dump(2);
  EXPECT_EQ(count[0]["stream"], "observation.images.top");
  EXPECT_EQ(count[0]["file"], top);
  EXPECT_NE(count[0]["detail"].get<std::string>().find("11 frames between from_timestamp"),
            std::string::npos)
      << count[0];
  EXPECT_NE(count[0]["detail"].get<std::string>().find("length 14"), std::string::npos) << count[0];
  EXPECT_TRUE(FindingsOf(r.j, 0).empty()) << "episode 0 is whole: " << r.j.dump(2);
  EXPECT_EQ(r.j["episodes_with_errors"], 2);

  const CheckRun table = Check(root, "");
  EXPECT_TRUE(TableHasRow(table.output, "warning", "-", "-", "orphaned_rows", "file-001.parquet"))
      << table.output;
  EXPECT_TRUE(TableHasRow(table.output, "error", "2", "observation.images.wrist", "video_missing",
                          wrist))
      << table.output;
  EXPECT_TRUE(TableHasRow(table.output, "error", "1", "observation.images.top", "frame_count", top))
      << table.output;
  EXPECT_NE(table.output.find("check: by kind: frame_count 1 (1 of 3 episodes), orphaned_rows 1, "
                              "video_missing 2 (2 of 3 episodes)"),
            std::string::npos)
      << table.output;
  EXPECT_EQ(r.j["by_what"]["video_missing"]["episodes"], 2) << r.j.dump(2);
}

// Truncated files whose readers name the file in their error: the table's "file: detail" column
// names each file once (it used to read "F: F: not a Parquet file ...").
TEST_F(LeRobotCheckTest, ATruncatedFileIsNamedOnce) {
  const std::string root = CopyOf("v30", "v30_truncated");
  const std::string data = root + "/data/chunk-000/file-001.parquet";
  const std::string wrist = root + "/videos/observation.images.wrist/chunk-000/file-000.mp4";
  fs::resize_file(data, 500);
  fs::resize_file(wrist, 3000);

  const CheckRun table = Check(root, "");
  EXPECT_EQ(table.exit_code, 2) << table.output;
  for (const std::string& file : {data, wrist}) {
    const size_t first = table.output.find(file);
    ASSERT_NE(first, std::string::npos) << file << "\n" << table.output;
    std::istringstream lines(table.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.find(file) == std::string::npos) continue;
      EXPECT_EQ(line.find(file, line.find(file) + file.size()), std::string::npos)
          << "the path twice: " << line;
    }
  }
  EXPECT_TRUE(TableHasRow(table.output, "error", "2", "-", "data_unreadable", data)) << table.output;
  EXPECT_NE(table.output.find(data + ": not a Parquet file"), std::string::npos) << table.output;
  EXPECT_TRUE(TableHasRow(table.output, "error", "0", "observation.images.wrist",
                          "video_unreadable", wrist))
      << table.output;
}

// v2.1: episodes.jsonl says episode 1 has 8 frames (its rows and video have 7; info.json agrees
// with the lie), and episode 2's video is deleted.
TEST_F(LeRobotCheckTest, ADamagedV21) {
  const std::string root = CopyOf("v21", "v21_damaged");
  std::string episodes = ReadFile(root + "/meta/episodes.jsonl");
  const std::string from = "\"length\":7", to = "\"length\":8";
  ASSERT_NE(episodes.find(from), std::string::npos) << episodes;
  episodes.replace(episodes.find(from), from.size(), to);
  WriteFile(root + "/meta/episodes.jsonl", episodes);
  json info = json::parse(ReadFile(root + "/meta/info.json"));
  info["total_frames"] = info["total_frames"].get<int64_t>() + 1;
  WriteFile(root + "/meta/info.json", info.dump());
  const std::string video = root + "/videos/chunk-000/observation.images.cam/episode_000002.mp4";
  fs::remove(video);

  const CheckRun r = Check(root);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const std::vector<json> rows = FindingsOf(r.j, 1, "rows_vs_length");
  ASSERT_EQ(rows.size(), 1u) << r.j.dump(2);
  EXPECT_TRUE(EndsWith(rows[0]["file"], "data/chunk-000/episode_000001.parquet")) << rows[0];
  EXPECT_NE(rows[0]["detail"].get<std::string>().find("7 rows of episode_index 1"), std::string::npos)
      << rows[0];
  EXPECT_NE(rows[0]["detail"].get<std::string>().find("says length 8"), std::string::npos) << rows[0];
  const std::vector<json> frames = FindingsOf(r.j, 1, "frame_count");
  ASSERT_EQ(frames.size(), 1u) << r.j.dump(2);
  EXPECT_NE(frames[0]["detail"].get<std::string>().find("7 frames in the file"), std::string::npos)
      << frames[0];
  const std::vector<json> missing = FindingsOf(r.j, 2, "video_missing");
  ASSERT_EQ(missing.size(), 1u) << r.j.dump(2);
  EXPECT_EQ(missing[0]["file"], video);
  EXPECT_TRUE(FindingsOf(r.j, 0).empty()) << r.j.dump(2);
}

// Over HTTP (nginx): the same findings, naming URLs.
TEST_F(LeRobotCheckTest, OverHttp) {
  const std::string root = CopyOf("v30", "v30_http");
  fs::remove(root + "/videos/observation.images.wrist/chunk-000/file-001.mp4");  // episodes 1-3
  auto nginx = conveyor::testing::NginxServer::Start(dir_->path());
  ASSERT_TRUE(nginx.ok()) << nginx.status();
  const std::string url = (*nginx)->base_url() + "v30_http/";
  const CheckRun r = Check(url);
  EXPECT_EQ(r.exit_code, 2) << r.output << (*nginx)->ErrorLog();
  for (int64_t e : {1, 2, 3}) {
    const std::vector<json> f = FindingsOf(r.j, e, "video_missing");
    ASSERT_EQ(f.size(), 1u) << e << ": " << r.j.dump(2);
    EXPECT_EQ(f[0]["file"], url + "videos/observation.images.wrist/chunk-000/file-001.mp4");
  }
  EXPECT_TRUE(FindingsOf(r.j, 0).empty()) << r.j.dump(2);
}

// A lying fps in info.json (25 for 30): every row's timestamp is off frame_index / fps, and the
// videos' rate disagrees.
TEST_F(LeRobotCheckTest, ALyingFps) {
  const std::string root = CopyOf("v30", "v30_fps");
  json info = json::parse(ReadFile(root + "/meta/info.json"));
  info["fps"] = 25;
  WriteFile(root + "/meta/info.json", info.dump());
  const CheckRun r = Check(root, "--json --no-decode-ends");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (int64_t e = 0; e < 4; ++e) {
    const std::vector<json> ts = FindingsOf(r.j, e, "timestamp");
    ASSERT_EQ(ts.size(), 1u) << e << ": " << r.j.dump(2);
    EXPECT_NE(ts[0]["detail"].get<std::string>().find("at 25 fps"), std::string::npos) << ts[0];
  }
  // The frame rate once per mp4 (four files hold the four episodes' two cameras).
  std::set<std::string> files;
  for (const json& f : r.j["findings"]) {
    if (f["what"] == "fps_mismatch") {
      EXPECT_TRUE(files.insert(f["file"].get<std::string>()).second) << "twice: " << f;
      EXPECT_NE(f["detail"].get<std::string>().find("info.json says 25 fps"), std::string::npos) << f;
    }
  }
  EXPECT_EQ(files.size(), 4u) << r.j.dump(2);
}

}  // namespace
}  // namespace conveyor
