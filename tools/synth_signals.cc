#include "tools/synth_signals.h"

#include <algorithm>
#include <cmath>

namespace conveyor::tools {

uint64_t SplitMix64::Next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double SplitMix64::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

double SplitMix64::Normal() {
  double u1 = Uniform(), u2 = Uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  SplitMix64 a(seed ^ (stream * 0xd1b54a32d192ed03ull));
  a.Next();
  return a.Next();
}

SmoothSignal SmoothSignal::Random(SplitMix64& rng, double offset, double total_amp, double min_hz,
                                  double max_hz) {
  SmoothSignal s;
  s.offset = offset;
  double w[3], sum = 0;
  for (double& x : w) sum += (x = rng.Uniform(0.2, 1.0));
  for (int k = 0; k < 3; ++k) {
    s.amp[k] = total_amp * w[k] / sum;
    s.freq[k] = rng.Uniform(min_hz, max_hz);
    s.phase[k] = rng.Uniform(0, 2 * M_PI);
  }
  return s;
}

double SmoothSignal::At(double t) const {
  double v = offset;
  for (int k = 0; k < 3; ++k) v += amp[k] * std::sin(2 * M_PI * freq[k] * t + phase[k]);
  return v;
}

namespace {

const char* const kVerbs[] = {"pick up", "push", "grasp", "lift", "slide"};
const char* const kColours[] = {"red", "green", "blue", "yellow", "white", "black"};
const char* const kObjects[] = {"cube", "cup", "sponge", "block", "marker", "bowl"};
const char* const kPlaces[] = {"into the bin", "onto the plate", "to the left", "to the right",
                               "next to the box"};

template <size_t N>
const char* Pick(SplitMix64& rng, const char* const (&a)[N]) {
  return a[rng.Next() % N];
}

}  // namespace

EpisodePlan PlanEpisode(uint64_t seed, int episode, double min_s, double max_s, double fps,
                        double lowdim_rate, int cameras, int state_dim) {
  SplitMix64 rng(MixSeed(seed, static_cast<uint64_t>(episode)));
  EpisodePlan p;
  p.duration_s = min_s + (max_s - min_s) * rng.Uniform();
  p.num_frames = std::max(1, static_cast<int>(std::floor(p.duration_s * fps + 1e-9)));
  p.num_steps = std::max(1, static_cast<int>(std::floor(p.duration_s * lowdim_rate + 1e-9)));
  for (int d = 0; d < state_dim; ++d) {
    p.state.push_back(SmoothSignal::Random(rng, rng.Uniform(-0.5, 0.5), 1.0, 0.05, 0.5));
  }
  p.cam_colour.resize(cameras);
  for (int c = 0; c < cameras; ++c) {
    for (int ch = 0; ch < 3; ++ch) {
      // Colours change within a second or two, so a misaligned action is a wrong action.
      p.cam_colour[c].push_back(SmoothSignal::Random(rng, 0.5, 0.3, 0.2, 0.8));
    }
  }
  p.instruction = std::string(Pick(rng, kVerbs)) + " the " + Pick(rng, kColours) + " " +
                  Pick(rng, kObjects) + " " + Pick(rng, kPlaces);
  return p;
}

std::string VideoCaption(const EpisodePlan& plan, uint64_t seed, int episode) {
  static const char* const kViews[] = {"a wrist camera", "an overhead camera",
                                       "a camera at table height", "a handheld camera"};
  static const char* const kLight[] = {"soft daylight", "warm lamp light", "flat studio light",
                                       "flickering fluorescent light"};
  static const char* const kMotion[] = {"slowly", "in one quick motion", "after a short pause",
                                        "while the camera pans to follow it"};
  static const char* const kDetail[] = {
      "The table is wooden and slightly scratched.", "A second object stays still in the background.",
      "Shadows shift as the arm moves.", "The gripper opens wide before it closes.",
      "Nothing else in the scene moves."};
  SplitMix64 rng(MixSeed(seed ^ 0x7669646571756f74ull, static_cast<uint64_t>(episode)));
  std::string c = "Seen from " + std::string(Pick(rng, kViews)) + " under " + Pick(rng, kLight) +
                  ", a robot arm reaches to " + plan.instruction + " " + Pick(rng, kMotion) + ".";
  const int extra = static_cast<int>(rng.Next() % 4);  // 0 to 3 more sentences
  for (int i = 0; i < extra; ++i) c += std::string(" ") + Pick(rng, kDetail);
  return c;
}

void RenderFrame(const EpisodePlan& plan, uint64_t seed, int episode, int camera, int frame,
                 double fps, int width, int height, std::vector<uint8_t>* rgb, float mean[3]) {
  const double t = frame / fps;
  // libswscale's SIMD input readers load up to 16 bytes past the last pixel, and those bytes
  // reach the output: keep zeroed padding after the frame so encoding stays deterministic.
  const size_t bytes = static_cast<size_t>(width) * height * 3;
  rgb->resize(bytes + kRgbPadding);
  std::fill(rgb->begin() + static_cast<ptrdiff_t>(bytes), rgb->end(), 0);
  int base[3];
  for (int ch = 0; ch < 3; ++ch) {
    base[ch] = static_cast<int>(std::lround(255.0 * plan.cam_colour[camera][ch].At(t)));
  }
  // The gripper: a disk whose position follows two state dimensions.
  const int sd = static_cast<int>(plan.state.size());
  const double sx = sd ? std::tanh(plan.state[(2 * camera) % sd].At(t)) : 0;
  const double sy = sd ? std::tanh(plan.state[(2 * camera + 1) % sd].At(t)) : 0;
  const double cx = width * (0.5 + 0.35 * sx), cy = height * (0.5 + 0.35 * sy);
  const double r2 = std::pow(std::min(width, height) / 8.0, 2);
  // A drifting stripe pattern (the scene), its phase advancing with time.
  const double stripe_phase = 2 * M_PI * (0.3 * t + 0.1 * camera);
  SplitMix64 noise(MixSeed(MixSeed(seed, static_cast<uint64_t>(episode) * 64 + camera),
                           static_cast<uint64_t>(frame)));
  uint64_t bits = 0;
  int bits_left = 0;
  uint64_t sum[3] = {0, 0, 0};
  uint8_t* px = rgb->data();
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double dx = x - cx, dy = y - cy;
      const bool disk = dx * dx + dy * dy < r2;
      const int stripe = static_cast<int>(18 * std::sin(x * 0.12 + stripe_phase));
      for (int ch = 0; ch < 3; ++ch) {
        if (bits_left == 0) {
          bits = noise.Next();
          bits_left = 8;
        }
        const int n = static_cast<int>(bits & 0x1f) - 16;  // uniform noise in [-16, 15]
        bits >>= 8;
        --bits_left;
        int v = disk ? 255 - base[ch] : base[ch] + stripe;
        v = std::clamp(v + n, 0, 255);
        *px++ = static_cast<uint8_t>(v);
        sum[ch] += static_cast<uint64_t>(v);
      }
    }
  }
  const double count = static_cast<double>(width) * height * 255.0;
  for (int ch = 0; ch < 3; ++ch) mean[ch] = static_cast<float>(sum[ch] / count);
}

void ComputeAction(const float* state, int state_dim, const std::vector<const float*>& cam_means,
                   int action_dim, float* action) {
  const int cams = static_cast<int>(cam_means.size());
  for (int j = 0; j < action_dim; ++j) {
    float a = state_dim > 0 ? 0.5f * state[j % state_dim] : 0.0f;
    if (cams > 0) a += cam_means[j % cams][(j / cams) % 3] - 0.5f;
    action[j] = a;
  }
}

int FrameAtTime(double t, double fps, int num_frames) {
  int k = static_cast<int>(std::floor(t * fps + 1e-9));
  return std::clamp(k, 0, num_frames - 1);
}

void RenderAudio(const EpisodePlan& plan, uint64_t seed, int episode, int sample_rate,
                 std::vector<float>* samples) {
  const size_t n = static_cast<size_t>(std::floor(plan.duration_s * sample_rate));
  samples->resize(n);
  SplitMix64 noise(MixSeed(seed ^ 0xa0d10ull, static_cast<uint64_t>(episode)));
  double phase = 0;
  for (size_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i) / sample_rate;
    const double s0 = plan.state.empty() ? 0 : plan.state[0].At(t);
    const double hz = 180.0 + 60.0 * std::tanh(s0);
    phase += 2 * M_PI * hz / sample_rate;
    const double v = 0.25 * std::sin(phase) + 0.08 * std::sin(2.7 * phase) + 0.03 * noise.Normal();
    (*samples)[i] = static_cast<float>(std::clamp(v, -1.0, 1.0));
  }
}

}  // namespace conveyor::tools
