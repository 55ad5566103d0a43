// The content of `conveyor synth` episodes: smooth joint trajectories, camera colours, rendered
// frames, audio, and the documented action function. Pure functions of (seed, episode), so the
// same options produce the same dataset bit for bit at any thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::tools {

// splitmix64: a tiny, well-mixed generator whose outputs are fixed by its definition (unlike
// std::normal_distribution, whose outputs differ between standard libraries).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next();
  double Uniform();  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  double Normal();   // Box-Muller

 private:
  uint64_t state_;
};

uint64_t MixSeed(uint64_t seed, uint64_t stream);

// A smooth, bounded signal: a sum of three sinusoids with random amplitudes, 0.05-0.8 Hz
// frequencies and phases. Evaluated at any time, so every stream samples the same underlying
// motion on its own clock.
struct SmoothSignal {
  double offset = 0;
  double amp[3] = {0, 0, 0}, freq[3] = {0, 0, 0}, phase[3] = {0, 0, 0};
  static SmoothSignal Random(SplitMix64& rng, double offset, double total_amp, double min_hz,
                             double max_hz);
  double At(double t) const;
};

// Everything about one synthetic episode that is not encoded media.
struct EpisodePlan {
  double duration_s = 0;
  int num_frames = 0;  // per camera
  int num_steps = 0;   // lowdim steps
  std::vector<SmoothSignal> state;                    // one per state dim
  std::vector<std::vector<SmoothSignal>> cam_colour;  // [camera][rgb], values in [0.15, 0.85]
  std::string instruction;
};

EpisodePlan PlanEpisode(uint64_t seed, int episode, double min_s, double max_s, double fps,
                        double lowdim_rate, int cameras, int state_dim);

// A video model's caption for an episode (`conveyor synth --preset video-model`): the
// instruction's scene described in one to four sentences, so captions vary in length (their
// token count varies in a packed batch). Drawn from its own random stream: the robot preset's
// datasets are the same bytes with or without it.
std::string VideoCaption(const EpisodePlan& plan, uint64_t seed, int episode);

inline constexpr size_t kRgbPadding = 64;

// Renders camera `camera`'s frame `frame` (RGB24, row-major, w*h*3 bytes followed by
// kRgbPadding zero bytes) and returns its mean
// colour per channel in [0, 1], measured on the rendered pixels.
void RenderFrame(const EpisodePlan& plan, uint64_t seed, int episode, int camera, int frame,
                 double fps, int width, int height, std::vector<uint8_t>* rgb, float mean[3]);

// The action function (docs/format.md, "Synthetic episodes"):
//   action[j] = 0.5 * state[j mod S] + (mean colour of camera (j mod C), channel
//               ((j div C) mod 3)) - 0.5
// where the camera frame is the latest one at or before the step time. C = 0 drops the colour.
void ComputeAction(const float* state, int state_dim, const std::vector<const float*>& cam_means,
                   int action_dim, float* action);

// The camera frame seen at time t: the latest frame at or before t.
int FrameAtTime(double t, double fps, int num_frames);

// Audio: a motor hum whose pitch follows state[0], plus noise; mono float in [-1, 1].
void RenderAudio(const EpisodePlan& plan, uint64_t seed, int episode, int sample_rate,
                 std::vector<float>* samples);

}  // namespace conveyor::tools
