// shuffle/schedule.h without a dataset: the automatic block and window sizes are a function of the
// figures the pipeline measures (ScheduleInputs) and the byte budget alone, so they are checked
// here against values worked out by hand from the documented rules (docs/pipeline.md "Schedule
// versions"). The pipeline's measurement of a real dataset is covered by pipeline_test and the
// bit-identical batches of lerobot_import_test and rlds_dataset_test.
#include "shuffle/schedule.h"

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "shuffle/buckets.h"

namespace conveyor {
namespace {

// A 50 Hz anchor, one 30 fps camera of 64x48 RGB frames reaching back 0.1 s, episode 0 keyframed
// every 15 frames (90 frames), and three episodes of 100, 150 and 60 samples.
ScheduleInputs Robot() {
  ScheduleInputs in;
  in.dataset_name = "robot";
  in.anchor_rate = 50;
  ScheduleCamera cam;
  cam.name = "cam0";
  cam.rate = 30;
  cam.min_delta = -0.1;
  cam.max_delta = 0;
  cam.frame_bytes = 64 * 48 * 3;
  in.cameras = {cam};
  KeyframeSample k;
  k.frames = 90;
  for (uint64_t f = 0; f < 90; f += 15) k.keyframes.push_back(f);
  in.keyframes = k;
  in.episode_starts = {0, 100, 250, 310};
  return in;
}

TEST(ScheduleTest, NeedsOnlyWhatTheOrderReads) {
  const ScheduleNeeds naive = ScheduleNeedsOf(OrderOptions{}, false, false);
  EXPECT_FALSE(naive.keyframes);
  EXPECT_FALSE(naive.episode_starts);
  OrderOptions v1 = OrderOptions::AutoGop();
  v1.version = 1;
  EXPECT_TRUE(ScheduleNeedsOf(v1, false, false).keyframes);
  EXPECT_FALSE(ScheduleNeedsOf(v1, false, false).episode_starts);
  const ScheduleNeeds v2 = ScheduleNeedsOf(OrderOptions::AutoGop(), false, false);
  EXPECT_TRUE(v2.keyframes);
  EXPECT_TRUE(v2.episode_starts);
  const ScheduleNeeds clips = ScheduleNeedsOf(OrderOptions::AutoGop(), true, false);
  EXPECT_FALSE(clips.keyframes || clips.episode_starts);
}

// Buckets: the pipeline measures each episode's bucket once, only for the naive order they allow,
// and ResolveOrder turns the figures into the bucket table (shuffle/buckets.h).
TEST(ScheduleTest, BucketsTableFromEpisodeBuckets) {
  const ScheduleNeeds first = ScheduleNeedsOf(OrderOptions{}, true, true);
  EXPECT_TRUE(first.episode_starts && first.episode_buckets);
  EXPECT_FALSE(first.keyframes);
  const ScheduleNeeds gop = ScheduleNeedsOf(OrderOptions::AutoGop(), false, true);
  EXPECT_FALSE(gop.keyframes || gop.episode_starts || gop.episode_buckets);

  ScheduleInputs in;
  in.buckets = true;
  in.num_buckets = 2;
  in.episode_starts = {0, 3, 3, 8};  // episode 1 has no samples
  in.episode_buckets = {1, 0, 0};
  OrderOptions refused = OrderOptions::AutoGop();
  refused.bucket_group = 2;
  const absl::Status st = ResolveOrder(in, 64ull << 20, &refused);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("mode: naive"), std::string_view::npos) << st;

  OrderOptions o;
  o.bucket_group = 2;
  ASSERT_TRUE(ResolveOrder(in, 64ull << 20, &o).ok());
  ASSERT_NE(o.buckets, nullptr);
  EXPECT_TRUE(o.naive());
  ASSERT_EQ(o.buckets->num_buckets(), 2u);
  EXPECT_EQ(o.buckets->BucketSamples(0), 5u);  // episode 2's samples 3..7
  EXPECT_EQ(o.buckets->BucketSamples(1), 3u);  // episode 0's samples 0..2
  EXPECT_EQ(o.buckets->SampleOf(0, 0), 3u);
  EXPECT_EQ(o.buckets->SampleOf(0, 4), 7u);
  EXPECT_EQ(o.buckets->SampleOf(1, 2), 2u);
  EXPECT_EQ(o.buckets->EpochSize(2), 4u + 2u);  // the whole groups of 2 of each bucket
  // Kept: a second resolve measures nothing.
  const ScheduleNeeds again = ScheduleNeedsOf(o, false, true);
  EXPECT_FALSE(again.episode_starts || again.episode_buckets);

  OrderOptions unmeasured;
  unmeasured.bucket_group = 2;
  in.episode_buckets.pop_back();
  EXPECT_EQ(ResolveOrder(in, 64ull << 20, &unmeasured).code(), absl::StatusCode::kInternal);
}

TEST(ScheduleTest, VersionOneBlockIsOneGopOfAnchorSteps) {
  OrderOptions o = OrderOptions::AutoGop();
  o.version = 1;
  ASSERT_TRUE(ResolveOrder(Robot(), 64ull << 20, &o).ok());
  // 90 frames / 6 keyframes / 30 fps = 0.5 s = 25 anchor steps.
  EXPECT_EQ(o.block_steps, 25u);
  EXPECT_EQ(o.blocks, nullptr);
  // A block needs ceil((25 / 50 + 0.1) * 30) + 1 = 19 frames: 175,104 bytes; the window is as many
  // blocks as a quarter of the budget holds.
  EXPECT_EQ(EstimateBlockFrameBytes(Robot().cameras, 50, 25), 19u * 64 * 48 * 3);
  EXPECT_EQ(o.window_blocks, (64ull << 20) / 4 / (19u * 64 * 48 * 3));
}

TEST(ScheduleTest, VersionTwoBlocksAreWholeGopsPerEpisode) {
  OrderOptions o = OrderOptions::AutoGop();
  ASSERT_TRUE(ResolveOrder(Robot(), 64ull << 20, &o).ok());
  ASSERT_NE(o.blocks, nullptr);
  const GopBlocks& g = o.blocks->gop();
  EXPECT_DOUBLE_EQ(g.frames_per_step, 30.0 / 50.0);
  EXPECT_EQ(g.back_frames, 3u);   // 0.1 s at 30 fps
  EXPECT_EQ(g.span_frames, 15u);  // one GOP
  EXPECT_EQ(o.blocks->num_samples(), 310u);
  // Episode 0's first block holds the steps whose frame is below 3 + 15 (steps 0..29).
  EXPECT_EQ(o.blocks->BlockEnd(0), 30u);
  EXPECT_EQ(o.block_steps, o.blocks->max_block_size());
}

TEST(ScheduleTest, WithoutKeyframesBlocksAreASecond) {
  ScheduleInputs in = Robot();
  in.keyframes.reset();  // episode 0 unreadable
  OrderOptions v1 = OrderOptions::AutoGop();
  v1.version = 1;
  ASSERT_TRUE(ResolveOrder(in, 64ull << 20, &v1).ok());
  EXPECT_EQ(v1.block_steps, 50u);
  OrderOptions v2 = OrderOptions::AutoGop();
  ASSERT_TRUE(ResolveOrder(in, 64ull << 20, &v2).ok());
  EXPECT_DOUBLE_EQ(v2.blocks->gop().frames_per_step, 1.0);
  EXPECT_EQ(v2.blocks->gop().span_frames, 50u);
}

TEST(ScheduleTest, WholeEpisodeReadersGetAnEpisodePerBlockAndACache) {
  ScheduleInputs in = Robot();
  in.whole_episodes = true;
  in.mean_episode_bytes = 1 << 20;
  OrderOptions o = OrderOptions::AutoGop();
  ASSERT_TRUE(ResolveOrder(in, 64ull << 20, &o).ok());
  // One block per episode, spanning the longest one (150 steps; BlockTable's bound adds one).
  EXPECT_EQ(o.blocks->gop().span_frames, 150u);
  EXPECT_EQ(o.blocks->num_blocks(), 3u);
  EXPECT_EQ(o.blocks->BlockSize(1), 150u);
  EXPECT_EQ(o.block_steps, o.blocks->max_block_size());
  EXPECT_EQ(o.window_blocks, 16u);  // 64 MiB / 4 per MiB-episode
  EXPECT_EQ(EpisodeCacheBytes(in, o), 2u * 16 * (1 << 20) * 5 / 4);
  EXPECT_EQ(EpisodeCacheBytes(in, OrderOptions{}), 0u);
  EXPECT_EQ(EpisodeCacheBytes(Robot(), o), 0u);
}

TEST(ScheduleTest, ClipsRefuseTheDecodeOnceOrder) {
  ScheduleInputs in = Robot();
  in.clips = true;
  OrderOptions gop = OrderOptions::AutoGop();
  const absl::Status s = ResolveOrder(in, 64ull << 20, &gop);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mode: naive"), std::string::npos) << s;
  OrderOptions naive;
  EXPECT_TRUE(ResolveOrder(in, 64ull << 20, &naive).ok());
  EXPECT_TRUE(naive.naive());
}

}  // namespace
}  // namespace conveyor
