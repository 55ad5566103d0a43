// `conveyor bench` on a tiny dataset: every modality gets its rows with positive figures and the
// limits it promises (a smoke test of the command, never a timing assertion), and bad flags are
// refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "nlohmann/json.hpp"
#include "tests/support/test_env.h"

namespace conveyor {
namespace {

using json = nlohmann::json;

TEST(BenchCliTest, EveryModalityHasItsFiguresAndLimits) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --threads 1 --seconds 0.2 --json " +
            dir.Join("bench.json") + " > " + dir.Join("out.txt") + " 2>&1");
  std::ifstream f(dir.Join("bench.json"));
  ASSERT_TRUE(f.good()) << testing::ReadFile(dir.Join("out.txt"));
  const json doc = json::parse(f);
  std::map<std::string, int> seen;
  for (const json& r : doc["rows"]) {
    const std::string key = r["modality"].get<std::string>() + "/" + r["stage"].get<std::string>();
    ++seen[key];
    EXPECT_GT(r["value"].get<double>(), 0) << key;
    EXPECT_EQ(r["order"].get<std::string>().find("warm frame cache"), std::string::npos) << "no cache asked for";
    if (key == "video/decode" || key == "audio/decode" || key == "video/read" || key == "all/serve") {
      EXPECT_GT(r["limit"].get<double>(), 0) << key << " has no limit";
    }
  }
  for (const char* key : {"video/read", "video/decode", "video/assemble", "audio/read", "audio/decode",
                          "audio/assemble", "lowdim/decode", "lowdim/assemble", "all/serve"}) {
    EXPECT_TRUE(seen.count(key)) << key << " missing:\n" << testing::ReadFile(dir.Join("out.txt"));
  }
  EXPECT_EQ(seen["video/assemble"], 3);  // in order, shuffled naive, shuffled gop
  // The epoch boundary row (issue 30 item 3): the wait near a boundary beside the mid-epoch
  // steps', and the pipeline's counters: the next epoch's order was planned ahead, none built late.
  EXPECT_EQ(seen["video/epoch boundary"], 1);
  for (const json& r : doc["rows"]) {
    if (r["stage"] != "epoch boundary") continue;
    const json& st = r["stages"];
    for (const char* key : {"step0_wait_ms", "mid_p50_ms", "mid_p99_ms", "mid_max_ms", "pace_ms"}) {
      EXPECT_TRUE(st.contains(key)) << key;
    }
    EXPECT_GT(st["mid_steps"].get<uint64_t>(), 0u);
    EXPECT_GE(st["epoch_orders_planned_ahead"].get<uint64_t>(), 1u);
    EXPECT_EQ(st["epoch_orders_built_late"].get<uint64_t>(), 0u);
  }
  // Start-up is a row of its own, beside the offline pipeline's, not part of the served rate.
  bool first_batch = false;
  for (const json& r : doc["rows"]) {
    if (r["order"] != "time to first batch (served)") continue;
    first_batch = true;
    EXPECT_EQ(r["unit"], "s");
    EXPECT_GT(r["limit"].get<double>(), 0) << "no offline time to first batch beside it";
  }
  EXPECT_TRUE(first_batch);
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  EXPECT_NE(out.find("where the time goes"), std::string::npos) << out;

  const testing::CommandResult bad = testing::RunCommand(cli + " bench " + dir.Join("ds") + " --modality smell");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--modality 'smell'"), std::string::npos) << bad.output;
}

// --plan: the cores a target needs, from the serve rows measured in the same run. The arithmetic is
// checked against the figures the command printed, never against a time.
TEST(BenchCliTest, PlanDerivesCoresPerGpuFromTheMeasuredPerCoreRate) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --threads 1,2 --seconds 0.3 --plan 5000 --gpus 4 " +
            "--server-cores 2 --json " + dir.Join("plan.json") + " > " + dir.Join("out.txt") + " 2>&1");
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  std::ifstream f(dir.Join("plan.json"));
  ASSERT_TRUE(f.good()) << out;
  const json plan = json::parse(f)["plan"];
  ASSERT_EQ(plan["measured"].size(), 2u) << plan.dump(2);  // threads 1 and 2, nothing else measured
  double lowest = 0;
  for (const json& m : plan["measured"]) {
    const double per_core = m["samples_per_s"].get<double>() / m["threads"].get<int>();
    EXPECT_GT(per_core, 0);
    EXPECT_DOUBLE_EQ(m["per_core"].get<double>(), per_core);
    if (lowest == 0 || per_core < lowest) lowest = per_core;
  }
  EXPECT_DOUBLE_EQ(plan["per_core_samples_per_s"].get<double>(), lowest);
  const double cores = 5000 / lowest;
  EXPECT_NEAR(plan["cores"].get<double>(), cores, 1e-9 * cores);
  EXPECT_NEAR(plan["cores_per_gpu"].get<double>(), cores / 4, 1e-9 * cores);
  EXPECT_EQ(plan["cores_for_the_job"].get<int64_t>(), static_cast<int64_t>(std::ceil(cores - 1e-9)));
  EXPECT_EQ(plan["servers"].get<int64_t>(), static_cast<int64_t>(std::ceil(cores / 2 - 1e-9)));
  EXPECT_EQ(plan["servers_with_spare"].get<int64_t>(), plan["servers"].get<int64_t>() + 1);
  // What it printed: the measurement it rests on and the answer.
  char line[160];
  std::snprintf(line, sizeof line, "per-core rate used: %.1f samples/s", lowest);
  EXPECT_NE(out.find(line), std::string::npos) << out;
  std::snprintf(line, sizeof line, "%.2f per GPU", cores / 4);
  EXPECT_NE(out.find(line), std::string::npos) << out;
  EXPECT_EQ(out.find("video decode"), std::string::npos) << "--plan measured more than it needs:\n" << out;

  for (const std::string bad : {" --plan -5", " --plan 100 --no-serve", " --plan 100 --gpus 0",
                                " --plan 100 --consumers 0"}) {
    const testing::CommandResult r = testing::RunCommand(cli + " bench " + dir.Join("ds") + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.output.find("error"), std::string::npos) << bad << ": " << r.output;
  }
}

// --frame-cache-bytes: two more rows for the video GOP pipeline, epoch 1 (cold) and epochs 2+
// (warm), with what the cache did; a cache that holds the dataset serves the warm epochs without
// decoding. Without the flag no such row appears. Never a timing assertion.
TEST(BenchCliTest, FrameCacheRowsShowTheWarmEpochServedFromTheCache) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  // 200 samples (action at 50 Hz) in batches of 8: epoch 1 delivers every sample, so it needs
  // (and offers the cache) every frame a later epoch needs.
  {
    std::ofstream config(dir.Join("config.yaml"));
    config << "anchor: action\nstreams:\n  cam0: {delta_timestamps: [0.0]}\n"
              "pipeline:\n  global_batch_size: 8\n  schedule: {mode: gop}\n";
  }
  const uint64_t bound = 64ull << 20;  // the dataset decodes to 120 x 64 x 64 x 3 = 1.5 MB
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --config " + dir.Join("config.yaml") +
            " --modality video --threads 1 --seconds 0.2 --no-serve --frame-cache-bytes " + std::to_string(bound) +
            " --json " + dir.Join("cache.json") + " --markdown " + dir.Join("cache.md") + " > " + dir.Join("out.txt") +
            " 2>&1");
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  std::ifstream f(dir.Join("cache.json"));
  ASSERT_TRUE(f.good()) << out;
  const json doc = json::parse(f);
  const json* cold = nullptr;
  const json* warm = nullptr;
  double uncached = 0;
  for (const json& r : doc["rows"]) {
    if (r["order"] == "shuffled, gop") uncached = r["value"].get<double>();
    if (!r.contains("frame_cache")) continue;
    EXPECT_EQ(r["modality"], "video");
    EXPECT_EQ(r["unit"], "samples/s");
    if (r["frame_cache"]["epoch"] == "1") cold = &r;
    if (r["frame_cache"]["epoch"] == "2+") warm = &r;
  }
  ASSERT_NE(cold, nullptr) << doc.dump(2);
  ASSERT_NE(warm, nullptr) << doc.dump(2);
  EXPECT_EQ((*cold)["order"], "shuffled, gop, frame cache, epoch 1 (cold)");
  EXPECT_EQ((*warm)["order"], "shuffled, gop, frame cache, epoch 2+ (warm)");
  const json& c = (*cold)["frame_cache"];
  EXPECT_DOUBLE_EQ(c["epoch_1_fraction"].get<double>(), 1.0) << c.dump(2);
  EXPECT_EQ(c["epoch_1_samples"].get<uint64_t>(), 200u);
  EXPECT_GT(c["frames_decoded_into_cache"].get<uint64_t>(), 0u) << c.dump(2);
  const json& w = (*warm)["frame_cache"];
  EXPECT_DOUBLE_EQ(w["hit_rate"].get<double>(), 1.0) << w.dump(2);
  EXPECT_EQ(w["frames_decoded"].get<uint64_t>(), 0u) << w.dump(2);
  EXPECT_GT(w["frames_from_cache"].get<uint64_t>(), 0u) << w.dump(2);
  EXPECT_GT(w["held_bytes"].get<uint64_t>(), 0u) << w.dump(2);
  EXPECT_LE(w["held_bytes"].get<uint64_t>(), w["bound_bytes"].get<uint64_t>()) << w.dump(2);
  EXPECT_EQ(w["bound_bytes"].get<uint64_t>(), bound);
  EXPECT_EQ(w["frames"].get<uint64_t>(), c["frames"].get<uint64_t>()) << "the warm epoch admitted new frames";
  EXPECT_EQ(w["not_admitted"].get<uint64_t>(), 0u);
  EXPECT_EQ(w["evicted_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(w["decode_seconds_saved"].get<double>(), 0) << w.dump(2);
  EXPECT_FALSE(w.contains("store"));
  // Beside the uncached gop row of the same run and its decode bound.
  EXPECT_GT(uncached, 0);
  EXPECT_DOUBLE_EQ(w["uncached_samples_per_s"].get<double>(), uncached);
  EXPECT_DOUBLE_EQ((*warm)["limit"].get<double>(), w["decode_bound_samples_per_s"].get<double>());
  EXPECT_GT((*warm)["limit"].get<double>(), 0);
  // The human-readable table, its legend and the Markdown table carry them too.
  EXPECT_NE(out.find("the decoded-frame cache (video, shuffled gop; --frame-cache-bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("frame cache rows ("), std::string::npos) << out;
  EXPECT_NE(out.find("hit rate 1.000"), std::string::npos) << out;
  const std::string md = testing::ReadFile(dir.Join("cache.md"));
  EXPECT_NE(md.find("**decoded-frame cache (video, shuffled gop)**"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2+ | 1 |"), std::string::npos) << md;

  // Without the flag: no cache row, no cache section.
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --config " + dir.Join("config.yaml") +
            " --modality video --threads 1 --seconds 0.2 --no-serve --json " + dir.Join("plain.json") + " > " +
            dir.Join("plain.txt") + " 2>&1");
  std::ifstream g(dir.Join("plain.json"));
  ASSERT_TRUE(g.good()) << testing::ReadFile(dir.Join("plain.txt"));
  const json plain = json::parse(g);  // named: a range-for over a temporary's member dangles
  for (const json& r : plain["rows"]) {
    EXPECT_FALSE(r.contains("frame_cache")) << r.dump(2);
    EXPECT_EQ(r["order"].get<std::string>().find("frame cache"), std::string::npos) << r.dump(2);
  }
  EXPECT_EQ(testing::ReadFile(dir.Join("plain.txt")).find("frame cache"), std::string::npos);
}

// --frame-cache-bytes with the serve rows on: the two served rows again with a warm frame cache
// in the server, each beside the offline pipeline with a warm cache of its own, and the server's
// hit rate over the timed stream (the cache was warm). The uncached serve rows stay as they were.
// Lowdim alone, so that the only video work is the serve rows'. Never a timing assertion.
TEST(BenchCliTest, ServeRowsWithAWarmFrameCacheStandBesideAWarmOfflinePipeline) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  // The naive order (no schedule): the warm rows run with the GOP schedule, the cache's.
  {
    std::ofstream config(dir.Join("config.yaml"));
    config << "anchor: action\nstreams:\n  cam0: {delta_timestamps: [0.0]}\n  action: {delta_timestamps: [0.0]}\n"
              "pipeline:\n  global_batch_size: 8\n";
  }
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --config " + dir.Join("config.yaml") +
            " --modality lowdim --threads 1 --seconds 0.2 --frame-cache-bytes 67108864 --json " +
            dir.Join("serve.json") + " > " + dir.Join("out.txt") + " 2>&1");
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  std::ifstream f(dir.Join("serve.json"));
  ASSERT_TRUE(f.good()) << out;
  const json doc = json::parse(f);
  std::map<std::string, json> serve;
  for (const json& r : doc["rows"]) {
    if (r["stage"] == "serve") serve[r["order"].get<std::string>()] = r;
  }
  for (const char* uncached : {"gRPC to a client", "same host (shared memory) to a client"}) {
    ASSERT_TRUE(serve.count(uncached)) << uncached << "\n" << out;
    EXPECT_EQ(serve[uncached]["limit_name"], "offline pipeline");
    EXPECT_FALSE(serve[uncached]["stages"].contains("frame_cache_hit_rate"));
  }
  for (const char* warm : {"gRPC to a client, warm frame cache", "same host (shared memory) to a client, warm frame cache"}) {
    ASSERT_TRUE(serve.count(warm)) << warm << " missing:\n" << out;
    const json& r = serve[warm];
    EXPECT_EQ(r["modality"], "all");
    EXPECT_EQ(r["unit"], "samples/s");
    EXPECT_GT(r["value"].get<double>(), 0) << r.dump(2);
    EXPECT_EQ(r["limit_name"], "offline pipeline, warm frame cache");
    EXPECT_GT(r["limit"].get<double>(), 0) << r.dump(2);
    const json& st = r["stages"];
    // 200 samples in batches of 8: the warm-up epoch delivers every sample, so each cache holds
    // every frame epoch 2 needs.
    EXPECT_EQ(st["epoch_samples"].get<uint64_t>(), 200u) << st.dump(2);
    EXPECT_EQ(st["warm_up_samples"].get<uint64_t>(), 200u) << st.dump(2);
    EXPECT_EQ(st["offline_warm_up_samples"].get<uint64_t>(), 200u) << st.dump(2);
    EXPECT_GT(st["frame_cache_lookups"].get<uint64_t>(), 0u) << st.dump(2);
    EXPECT_DOUBLE_EQ(st["frame_cache_hit_rate"].get<double>(), 1.0) << st.dump(2);
    EXPECT_DOUBLE_EQ(st["offline_frame_cache_hit_rate"].get<double>(), 1.0) << st.dump(2);
    EXPECT_EQ(st["schedule"], "gop (the config's order is naive)");
    EXPECT_GT(st["mb_per_s"].get<double>(), 0);
  }
  EXPECT_GT(serve["same host (shared memory) to a client, warm frame cache"]["stages"]["shared_memory_batches"].get<uint64_t>(), 0u);
  EXPECT_NE(out.find("serve, warm frame cache ("), std::string::npos) << out;
}

}  // namespace

// --plan --consumers N: the job's N ranks stream at once (consumer i of N), and the plan rests on
// what the server delivers to all of them together.
TEST(BenchCliTest, PlanForSeveralConsumersMeasuresThemStreamingAtOnce) {
  testing::TempDir dir;
  const std::string cli = CONVEYOR_CLI;
  ASSERT_SH(cli + " synth --out " + dir.Join("ds") +
            " --episodes 2 --episode-seconds 2 --cameras 1 --size 64x64 --quiet");
  ASSERT_SH(cli + " bench " + dir.Join("ds") + " --threads 1 --seconds 0.5 --plan 1000 --gpus 2 " +
            "--consumers 2 --json " + dir.Join("plan.json") + " > " + dir.Join("out.txt") + " 2>&1");
  const std::string out = testing::ReadFile(dir.Join("out.txt"));
  std::ifstream f(dir.Join("plan.json"));
  ASSERT_TRUE(f.good()) << out;
  const json doc = json::parse(f);
  EXPECT_EQ(doc["plan"]["consumers"].get<int>(), 2) << doc.dump(2);
  ASSERT_EQ(doc["plan"]["measured"].size(), 1u) << doc.dump(2);
  EXPECT_GT(doc["plan"]["measured"][0]["samples_per_s"].get<double>(), 0);
  EXPECT_NE(out.find("gRPC to 2 consumers"), std::string::npos) << out;
  EXPECT_NE(out.find("through a server to 2 consumers at once"), std::string::npos) << out;
}
}  // namespace conveyor
