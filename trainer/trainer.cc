#include "trainer/trainer.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/float16.h"
#include "base/json_text.h"
#include "base/strings.h"
#include "conveyor/v1/service.pb.h"
#include "device/gpu.h"
#include "nlohmann/json.hpp"
#include "trainer/comm.h"

namespace conveyor::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

PartSummary Summarize(std::vector<double> v) {
  PartSummary s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  std::sort(v.begin(), v.end());
  auto q = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))]; };
  s.p50 = q(0.5);
  s.p99 = q(0.99);
  return s;
}

bool IsFloat(client::DType t) {
  return t == client::DType::kFloat32 || t == client::DType::kFloat16 ||
         t == client::DType::kBFloat16;
}

// A float tensor's values as float32: a float16 or bfloat16 stream (`dtype:`) widened exactly.
std::vector<float> Widen(const client::TensorView& t) {
  std::vector<float> v(t.bytes / DTypeSize(t.dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == client::DType::kFloat32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
      continue;
    }
    uint16_t bits;
    std::memcpy(&bits, t.data + 2 * i, 2);
    v[i] = t.dtype == client::DType::kFloat16 ? HalfToFloat(bits) : BFloat16ToFloat(bits);
  }
  return v;
}

// The policy's inputs from one batch: per sample, every camera frame average-pooled to
// pool x pool patches per channel (uint8 scaled to [0, 1]), then every small float tensor (the
// state) flattened. Audio, text and masks are left out.
absl::Status Features(const client::Batch& b, int pool, const std::string& action,
                      std::vector<float>* x, int64_t* per_sample) {
  const int64_t n = static_cast<int64_t>(b.ids.size());
  std::vector<std::vector<float>> rows(n);
  for (const client::TensorView& t : b.tensors) {
    if (t.role != client::TensorRole::kData || t.name == action || t.shape.empty() || t.shape[0] != n) continue;
    const bool image = t.shape.size() == 5 && (t.dtype == client::DType::kUint8 || t.dtype == client::DType::kFloat32);
    if (image) {
      // [B, T, H, W, C] (hwc) or [B, T, C, H, W] (chw): channels are the small dimension.
      const bool chw = t.shape[2] <= 4 && t.shape[4] > 4;
      const int64_t T = t.shape[1];
      const int64_t C = chw ? t.shape[2] : t.shape[4];
      const int64_t H = chw ? t.shape[3] : t.shape[2];
      const int64_t W = chw ? t.shape[4] : t.shape[3];
      const bool u8 = t.dtype == client::DType::kUint8;
      const float scale = u8 ? 1.0f / 255 : 1.0f;
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t f = 0; f < T; ++f) {
          const int64_t frame = (i * T + f) * H * W * C;
          std::vector<double> sum(static_cast<size_t>(pool * pool * C), 0.0);
          std::vector<int64_t> cnt(static_cast<size_t>(pool * pool), 0);
          std::vector<int64_t> px(static_cast<size_t>(W));  // column -> patch column
          for (int64_t xx = 0; xx < W; ++xx) px[xx] = xx * pool / W;
          std::vector<double> row(static_cast<size_t>(pool * C));
          for (int64_t y = 0; y < H; ++y) {
            const int64_t py = y * pool / H;
            std::fill(row.begin(), row.end(), 0.0);
            if (!chw) {  // HWC: one pass along the row
              const int64_t base = frame + y * W * C;
              for (int64_t xx = 0; xx < W; ++xx) {
                double* r = row.data() + px[xx] * C;
                for (int64_t c = 0; c < C; ++c) {
                  r[c] += u8 ? t.data[base + xx * C + c]
                             : reinterpret_cast<const float*>(t.data)[base + xx * C + c];
                }
              }
            } else {
              for (int64_t c = 0; c < C; ++c) {
                const int64_t base = frame + (c * H + y) * W;
                for (int64_t xx = 0; xx < W; ++xx) {
                  row[px[xx] * C + c] += u8 ? t.data[base + xx] : reinterpret_cast<const float*>(t.data)[base + xx];
                }
              }
            }
            for (int64_t q = 0; q < pool; ++q) {
              for (int64_t c = 0; c < C; ++c) sum[(py * pool + q) * C + c] += row[q * C + c];
            }
            for (int64_t xx = 0; xx < W; ++xx) ++cnt[py * pool + px[xx]];
          }
          for (size_t p = 0; p < cnt.size(); ++p) {
            for (int64_t c = 0; c < C; ++c) {
              rows[i].push_back(static_cast<float>(sum[p * C + c] / std::max<int64_t>(1, cnt[p])) * scale);
            }
          }
        }
      }
      continue;
    }
    if (IsFloat(t.dtype) && t.shape.size() >= 2 && t.shape.size() <= 3) {
      const int64_t per = static_cast<int64_t>(t.bytes / DTypeSize(t.dtype)) / n;
      if (per > 256) continue;  // audio
      const std::vector<float> v = Widen(t);
      for (int64_t i = 0; i < n; ++i) {
        rows[i].insert(rows[i].end(), v.begin() + i * per, v.begin() + (i + 1) * per);
      }
    }
  }
  *per_sample = rows.empty() ? 0 : static_cast<int64_t>(rows[0].size()) + 1;  // + bias
  x->clear();
  for (auto& r : rows) {
    if (static_cast<int64_t>(r.size()) + 1 != *per_sample) {
      return absl::DataLossError("samples of one batch have different feature counts");
    }
    x->insert(x->end(), r.begin(), r.end());
    x->push_back(1.0f);
  }
  return absl::OkStatus();
}

// A linear policy with Adam.
struct Linear {
  int64_t in = 0, out = 0;
  std::vector<float> w, m, v;  // [out, in]
  int64_t t = 0;

  void Init(int64_t i, int64_t o) {
    in = i;
    out = o;
    w.assign(static_cast<size_t>(i * o), 0.0f);
    m.assign(w.size(), 0.0f);
    v.assign(w.size(), 0.0f);
  }
  // MSE of x [n, in] -> y [n, out] against target; fills grad (d loss / d w, mean over n * out).
  double Step(const std::vector<float>& x, const float* target, int64_t n, std::vector<float>* grad,
              std::vector<float>* pred) const {
    grad->assign(w.size(), 0.0f);
    pred->resize(static_cast<size_t>(n * out));
    double loss = 0;
    const double norm = 2.0 / static_cast<double>(n * out);
    std::vector<float> y(static_cast<size_t>(out));
    for (int64_t s = 0; s < n; ++s) {
      const float* xs = x.data() + s * in;
      for (int64_t o = 0; o < out; ++o) {
        const float* wo = w.data() + o * in;
        float acc = 0;
        for (int64_t k = 0; k < in; ++k) acc += wo[k] * xs[k];
        (*pred)[s * out + o] = acc;
        const float d = acc - target[s * out + o];
        loss += static_cast<double>(d) * d;
        const float g = static_cast<float>(norm * d);
        float* go = grad->data() + o * in;
        for (int64_t k = 0; k < in; ++k) go[k] += g * xs[k];
      }
    }
    return loss / static_cast<double>(n * out);
  }
  void Adam(const std::vector<float>& g, double lr) {
    ++t;
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = static_cast<float>(b1 * m[i] + (1 - b1) * g[i]);
      v[i] = static_cast<float>(b2 * v[i] + (1 - b2) * g[i] * g[i]);
      w[i] -= static_cast<float>(lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps));
    }
  }
};

uint64_t Fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string Hex64(uint64_t x) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(x));
  return hex;
}

constexpr char kCheckpointMagic[] = "conveyor-train-checkpoint 1\n";

}  // namespace

// The file: the magic line, one line of JSON (step, cursor, shape, Adam's step, the byte count
// and FNV-1a of what follows), then w, m and v as little-endian float32.
absl::Status WriteCheckpoint(const std::string& path, const TrainState& st) {
  const size_t n = static_cast<size_t>(st.in * st.out);
  if (st.w.size() != n || st.m.size() != n || st.v.size() != n) {
    return absl::InvalidArgumentError(StrCat("checkpoint ", path, ": the state's arrays are not ", n, " long"));
  }
  std::string body;
  body.reserve(3 * n * sizeof(float));
  for (const std::vector<float>* a : {&st.w, &st.m, &st.v}) {
    body.append(reinterpret_cast<const char*>(a->data()), a->size() * sizeof(float));
  }
  nlohmann::json head = {{"step", st.step},   {"cursor", st.cursor},          {"in", st.in},
                         {"out", st.out},     {"adam_t", st.adam_t},          {"bytes", body.size()},
                         {"fnv1a", Hex64(Fnv1a(body.data(), body.size()))},
                         {"schedule_version", st.schedule_version},
                         {"global_batch_size", st.global_batch_size},
                         {"dataset_fingerprint", st.dataset_fingerprint},
                         {"order_digest", st.order_digest}};
  const std::string text = kCheckpointMagic + JsonText(head) + "\n" + body;
  const std::string tmp = StrCat(path, ".tmp.", getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(StrCat("checkpoint ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t k = ::write(fd, text.data() + done, text.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::InternalError(StrCat("checkpoint ", tmp, ": write: ", err));
    }
    done += static_cast<size_t>(k);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(StrCat("checkpoint ", tmp, ": ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::InternalError(StrCat("checkpoint ", path, ": rename: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainState> ReadCheckpoint(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    if (errno == ENOENT) return absl::NotFoundError(StrCat("checkpoint ", path, " does not exist"));
    return absl::InternalError(StrCat("checkpoint ", path, ": ", std::strerror(errno)));
  }
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return absl::DataLossError(StrCat("checkpoint ", path, ": ", why)); };
  const std::string magic = kCheckpointMagic;
  if (text.compare(0, magic.size(), magic) != 0) return bad("not a conveyor train checkpoint (no magic line)");
  const size_t eol = text.find('\n', magic.size());
  if (eol == std::string::npos) return bad("truncated in its header");
  TrainState st;
  std::string fnv;
  size_t bytes = 0;
  try {
    const nlohmann::json head = nlohmann::json::parse(text.substr(magic.size(), eol - magic.size()));
    st.step = head.at("step").get<int64_t>();
    st.cursor = head.at("cursor").get<std::string>();
    st.in = head.at("in").get<int64_t>();
    st.out = head.at("out").get<int64_t>();
    st.adam_t = head.at("adam_t").get<int64_t>();
    bytes = head.at("bytes").get<size_t>();
    fnv = head.at("fnv1a").get<std::string>();
    st.schedule_version = head.value("schedule_version", 0u);
    st.global_batch_size = head.value("global_batch_size", uint64_t{0});
    st.dataset_fingerprint = head.value("dataset_fingerprint", std::string());
    st.order_digest = head.value("order_digest", std::string());
  } catch (const nlohmann::json::exception& e) {
    return bad(StrCat("bad header: ", e.what()));
  }
  if (st.step < 0 || st.in < 0 || st.out < 0 || st.adam_t < 0 || (st.in > 0 && st.out > (1 << 28) / st.in)) {
    return bad("impossible header values");
  }
  const size_t n = static_cast<size_t>(st.in * st.out);
  if (bytes != 3 * n * sizeof(float)) return bad(StrCat("header says ", bytes, " bytes for a ", st.in, "x", st.out, " model"));
  if (text.size() - eol - 1 != bytes) {
    return bad(StrCat("holds ", text.size() - eol - 1, " bytes of state, its header says ", bytes, " (torn or truncated)"));
  }
  const char* body = text.data() + eol + 1;
  if (Hex64(Fnv1a(body, bytes)) != fnv) return bad("the state's checksum does not match (corrupt)");
  for (std::vector<float>* a : {&st.w, &st.m, &st.v}) {
    a->resize(n);
    std::memcpy(a->data(), body, n * sizeof(float));
    body += n * sizeof(float);
  }
  return st;
}

absl::StatusOr<std::string> ShiftCameras(const std::string& yaml, const std::vector<std::string>& cameras,
                                         double shift_s) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat("config: ", e.what()));
  }
  YAML::Node streams = root["streams"];
  if (!streams || !streams.IsMap()) return absl::InvalidArgumentError("config has no streams: section");
  int shifted = 0;
  for (const std::string& cam : cameras) {
    YAML::Node s = streams[cam];
    if (!s) continue;
    YAML::Node d = s["delta_timestamps"];
    if (!d) {
      s["delta_timestamps"] = std::vector<double>{shift_s};
    } else if (d.IsSequence()) {
      for (size_t i = 0; i < d.size(); ++i) d[i] = d[i].as<double>() + shift_s;
    } else if (d.IsMap() && d["start"]) {
      d["start"] = d["start"].as<double>() + shift_s;
    } else {
      return absl::InvalidArgumentError(StrCat("config: streams.", cam, ".delta_timestamps: cannot shift"));
    }
    ++shifted;
  }
  if (shifted == 0) return absl::InvalidArgumentError("--shift-frames: the config samples no camera");
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

namespace {

// The client's options for this rank: its GPU, the config sent, and with --shift-frames the
// config's cameras moved against the anchor (the control run).
absl::StatusOr<client::ClientOptions> ClientOptionsFor(const TrainOptions& o, int rank) {
  client::ClientOptions co = o.client;
  co.max_batches = static_cast<uint64_t>(o.steps);
  co.device = o.device;
  // The rank's GPU, as NCCL picks it (trainer/comm.h): rank % devices.
  if (o.device && ProbeGpus().devices > 0) co.device_index = rank % ProbeGpus().devices;
  if (!o.config_yaml.empty()) co.config_yaml = o.config_yaml;
  if (o.shift_frames_steps == 0) return co;
  if (co.config_yaml.empty()) return absl::InvalidArgumentError("--shift-frames needs --config FILE");
  absl::StatusOr<conveyor::v1::InfoResponse> info = client::GetInfo(co);
  if (!info.ok()) return info.status();
  YAML::Node root = YAML::Load(co.config_yaml);
  const std::string anchor = root["anchor"] ? root["anchor"].as<std::string>() : "action";
  double rate = 0;
  std::vector<std::string> cameras;
  for (const auto& s : info->streams()) {
    if (s.name() == anchor) rate = s.rate();
    if (s.kind() == "video" || s.kind() == "image") cameras.push_back(s.name());
  }
  if (rate <= 0) return absl::InvalidArgumentError(StrCat("anchor stream '", anchor, "' has no rate"));
  absl::StatusOr<std::string> shifted =
      ShiftCameras(co.config_yaml, cameras, static_cast<double>(o.shift_frames_steps) / rate);
  if (!shifted.ok()) return shifted.status();
  co.config_yaml = *shifted;
  return co;
}

// Resumes from --checkpoint when it exists: the model, and the client's start cursor and schedule
// version. Returns the first step to train (0 without a checkpoint).
absl::StatusOr<int64_t> Resume(const TrainOptions& o, client::ClientOptions* co, Linear* model,
                               TrainResult* r) {
  if (o.checkpoint.empty()) return 0;
  absl::StatusOr<TrainState> ck = ReadCheckpoint(o.checkpoint);
  if (!ck.ok()) {
    if (absl::IsNotFound(ck.status())) return 0;
    return ck.status();
  }
  if (ck->step >= o.steps) {
    return absl::FailedPreconditionError(StrCat("checkpoint ", o.checkpoint, " is at step ", ck->step,
                                                ": nothing left of --steps ", o.steps));
  }
  absl::StatusOr<client::Cursor> cursor = client::Cursor::Parse(ck->cursor);
  if (!cursor.ok()) return absl::DataLossError(StrCat("checkpoint ", o.checkpoint, ": ", cursor.status().message()));
  // An EPOCH:STEP cursor (a checkpoint from a server that predates positions) keeps the meaning
  // it had at the batch size it was recorded with, whatever the batch size now.
  if (!cursor->position && ck->global_batch_size > 0) {
    uint64_t position = 0;
    if (!cursor->PositionAt(ck->global_batch_size, &position)) {
      return absl::DataLossError(StrCat("checkpoint ", o.checkpoint, ": cursor ", ck->cursor,
                                        " at global_batch_size ", ck->global_batch_size, " overflows"));
    }
    cursor->position = position;
  }
  co->start = *cursor;
  co->schedule_version = ck->schedule_version;  // the order the run started with
  if (!o.allow_data_change) {  // the data it trained on (checked when the stream starts)
    co->expect_dataset_fingerprint = ck->dataset_fingerprint;
    co->expect_order_digest = ck->order_digest;
  } else {
    co->pin_from_environment = false;
  }
  if (ck->in > 0) {
    model->Init(ck->in, ck->out);
    model->w = std::move(ck->w);
    model->m = std::move(ck->m);
    model->v = std::move(ck->v);
    model->t = ck->adam_t;
  }
  r->resumed_at_step = ck->step;
  r->resumed_cursor = ck->cursor;
  if (!o.quiet) {
    std::fprintf(stderr, "train: rank %d resumes from %s at step %lld, cursor %s\n", r->rank,
                 o.checkpoint.c_str(), static_cast<long long>(ck->step), ck->cursor.c_str());
  }
  return ck->step;
}

// The losses of the last quarter of the run, beside the baseline of predicting the mean action
// seen so far (this rank's batches), for the whole chunk and for its first step.
struct LossTally {
  std::vector<float> target_sum;
  uint64_t targets_seen = 0;
  int64_t first_outputs = 0;  // the chunk's first step: [B, chunk, dim] -> dim
  double final_sum = 0, mean_sum = 0, first_sum = 0, first_mean_sum = 0;
  int64_t final_n = 0;

  // `target` and `pred` are [n, out]; `counted`: the step is in the last quarter.
  void Add(const float* target, const std::vector<float>& pred, int64_t n, int64_t out,
           double loss, bool counted) {
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t k = 0; k < out; ++k) target_sum[k] += target[s * out + k];
    }
    targets_seen += n;
    if (!counted) return;
    double mse = 0, first = 0, first_mean = 0;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t k = 0; k < out; ++k) {
        const double d = target[s * out + k] - target_sum[k] / targets_seen;
        mse += d * d;
        if (k < first_outputs) {
          const double e = pred[s * out + k] - target[s * out + k];
          first += e * e;
          first_mean += d * d;
        }
      }
    }
    mean_sum += mse / static_cast<double>(n * out);
    first_sum += first / static_cast<double>(n * first_outputs);
    first_mean_sum += first_mean / static_cast<double>(n * first_outputs);
    final_sum += loss;
    ++final_n;
  }
};

// The step-time summaries and throughput of `r.steps`.
void SummarizeSteps(double seconds, uint64_t samples, TrainResult* r) {
  std::vector<double> w, h, c, m, t;
  double wait_total = 0, step_total = 0;
  for (const StepTimes& s : r->steps) {
    w.push_back(s.wait);
    h.push_back(s.h2d);
    c.push_back(s.compute);
    m.push_back(s.comm);
    t.push_back(s.total);
    wait_total += s.wait;
    step_total += s.total;
  }
  r->wait = Summarize(w);
  r->h2d = Summarize(h);
  r->compute = Summarize(c);
  r->comm_time = Summarize(m);
  r->total = Summarize(t);
  r->samples_per_s = samples / std::max(seconds, 1e-9);
  r->wait_share = step_total > 0 ? wait_total / step_total : 0;
}

// Losses over all ranks.
absl::Status ReduceLosses(const LossTally& l, Communicator& comm, TrainResult* r) {
  float sums[5] = {static_cast<float>(l.final_sum), static_cast<float>(l.mean_sum),
                   static_cast<float>(l.final_n), static_cast<float>(l.first_sum),
                   static_cast<float>(l.first_mean_sum)};
  if (absl::Status s = comm.AllreduceSum(sums, 5); !s.ok()) return s;
  r->final_loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  r->mean_action_loss = sums[2] > 0 ? sums[1] / sums[2] : 0;
  r->first_step_loss = sums[2] > 0 ? sums[3] / sums[2] : 0;
  r->first_step_mean_loss = sums[2] > 0 ? sums[4] / sums[2] : 0;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainResult> Train(const TrainOptions& o) {
  TrainResult r;
  r.rank = static_cast<int>(o.client.consumer);
  r.world_size = static_cast<int>(o.client.consumers);
  if (o.steps < 1) return absl::InvalidArgumentError("--steps must be at least 1");
  if (o.pool < 1 || o.pool > 16) return absl::InvalidArgumentError("--pool must be in [1, 16]");
  absl::StatusOr<client::ClientOptions> options = ClientOptionsFor(o, r.rank);
  if (!options.ok()) return options.status();
  client::ClientOptions co = *std::move(options);
  r.config_sent = co.config_yaml;
  // Resume before meeting the other ranks: rank 0 may rewrite the checkpoint once training runs.
  Linear model;
  absl::StatusOr<int64_t> resumed = Resume(o, &co, &model, &r);
  if (!resumed.ok()) return resumed.status();
  const int64_t first_step = *resumed;
  co.max_batches = static_cast<uint64_t>(o.steps - first_step);
  client::Client* client = nullptr;  // set below, before the first save
  auto save = [&](int64_t steps_done, const client::Cursor& next) -> absl::Status {
    if (o.checkpoint.empty() || r.rank != 0) return absl::OkStatus();
    const client::ClientStats served = client->stats();
    TrainState st{steps_done, next.ToString(), model.in, model.out, model.t,
                  model.w,    model.m,         model.v,  client->schedule_version(),
                  client->global_batch_size(), served.dataset_fingerprint, served.order_digest};
    return WriteCheckpoint(o.checkpoint, st);
  };
  absl::StatusOr<std::unique_ptr<Communicator>> comm =
      CreateCommunicator(o.comm, r.rank, r.world_size, o.rendezvous, o.comm_timeout_s, o.comm_host);
  if (!comm.ok()) return comm.status();
  r.comm = (*comm)->name();
  absl::StatusOr<std::unique_ptr<client::Client>> cl = client::Client::Create(co);
  if (!cl.ok()) return cl.status();
  client = cl->get();

  std::vector<float> x, grad;
  LossTally losses;
  const int64_t final_from = o.steps - std::max<int64_t>(1, o.steps / 4);
  const auto start = Clock::now();
  uint64_t samples = 0;
  client::Cursor next_cursor = co.start;
  int64_t saved_at = first_step;
  for (int64_t step = first_step; step < o.steps; ++step) {
    StepTimes st;
    st.step = step;
    // Each boundary is one clock reading shared by the parts on either side of it, so the parts
    // add up to the step exactly, however the thread is preempted between them.
    const auto t0 = Clock::now();
    absl::StatusOr<std::optional<client::Batch>> next = (*cl)->Next();
    auto t1 = Clock::now();
    st.wait = Seconds(t0, t1);
    if (!next.ok()) return next.status();
    if (!next->has_value()) break;  // the end of the stream (max_epochs)
    const client::Batch* b = &**next;
    // The copy started when the batch arrived (the client's one device path, device/upload.h);
    // this is the part of it the step still waits for. Nothing on the CPU path.
    if (absl::Status s = b->WaitDevice(); !s.ok()) return s;
    const auto t1b = Clock::now();
    st.h2d = Seconds(t1, t1b);
    t1 = t1b;
    const client::TensorView* y = b->Find(o.action);
    if (y == nullptr || !IsFloat(y->dtype)) {
      return absl::InvalidArgumentError(StrCat("the batch has no float tensor '", o.action, "' to predict"));
    }
    int64_t in = 0;
    if (absl::Status s = Features(*b, o.pool, o.action, &x, &in); !s.ok()) return s;
    const int64_t n = static_cast<int64_t>(b->ids.size());
    const int64_t out = static_cast<int64_t>(y->bytes / DTypeSize(y->dtype)) / n;
    if (model.in == 0) model.Init(in, out);
    if (model.in != in || model.out != out) {
      return absl::DataLossError(StrCat("batch ", b->cursor.ToString(), " has ", in, " features and ", out,
                                        " outputs per sample; the model (", step == first_step ? "from the checkpoint" : "from the first batch",
                                        ") has ", model.in, " and ", model.out));
    }
    if (losses.target_sum.empty()) {
      losses.first_outputs = y->shape.size() == 3 ? y->shape[2] : out;
      losses.target_sum.assign(static_cast<size_t>(out), 0.0f);
      r.features = in;
      r.outputs = out;
    }
    st.cursor = b->cursor.ToString();
    for (const client::SampleId& id : b->ids) {
      st.ids.push_back(id.dataset != 0 ? StrCat(id.dataset, ":", id.episode, "/", id.step)
                                       : StrCat(id.episode, "/", id.step));
    }
    const std::vector<float> target_values = Widen(*y);
    const float* target = target_values.data();
    std::vector<float> pred;
    st.loss = model.Step(x, target, n, &grad, &pred);
    losses.Add(target, pred, n, out, st.loss, step >= final_from);
    auto t2 = Clock::now();
    st.compute = Seconds(t1, t2);
    if (o.step_ms > 0 && st.compute * 1e3 < o.step_ms) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.step_ms - st.compute * 1e3));
      t2 = Clock::now();
      st.compute = Seconds(t1, t2);
    }
    if (absl::Status s = (*comm)->AllreduceSum(grad.data(), grad.size()); !s.ok()) return s;
    const auto t3 = Clock::now();
    st.comm = Seconds(t2, t3);
    for (float& g : grad) g /= static_cast<float>(r.world_size);
    model.Adam(grad, o.lr);
    const auto t4 = Clock::now();
    st.compute += Seconds(t3, t4);
    st.total = Seconds(t0, t4);
    st.samples = static_cast<uint64_t>(n);
    samples += st.samples;
    next_cursor = b->next;
    if ((step + 1 - first_step) % std::max<int64_t>(o.checkpoint_every, 1) == 0 || step + 1 == o.steps) {
      if (absl::Status s = save(step + 1, next_cursor); !s.ok()) return s;
      saved_at = step + 1;
    }
    r.steps.push_back(std::move(st));
    if (!o.quiet && r.rank == 0 && (step % o.print_every == 0 || step + 1 == o.steps)) {
      const StepTimes& t = r.steps.back();
      std::fprintf(stderr,
                   "train: step %4lld/%lld  loss %.5f  wait %6.1f ms  h2d %5.1f ms  compute %6.1f ms  "
                   "comm %5.1f ms  (cursor %s)\n",
                   static_cast<long long>(step + 1), static_cast<long long>(o.steps), t.loss,
                   t.wait * 1e3, t.h2d * 1e3, t.compute * 1e3, t.comm * 1e3,
                   b->next.ToString().c_str());
    }
  }
  const double seconds = Since(start);
  const int64_t done = first_step + static_cast<int64_t>(r.steps.size());
  if (done != saved_at) {
    if (absl::Status s = save(done, next_cursor); !s.ok()) return s;
  }
  SummarizeSteps(seconds, samples, &r);
  if (absl::Status s = ReduceLosses(losses, **comm, &r); !s.ok()) return s;
  r.weights_fnv1a = Hex64(Fnv1a(model.w.data(), model.w.size() * sizeof(float)));
  r.coverage = client->coverage();
  return r;
}

std::string ResultJson(const TrainResult& r) {
  using json = nlohmann::json;
  auto part = [](const PartSummary& p) { return json{{"mean_s", p.mean}, {"p50_s", p.p50}, {"p99_s", p.p99}}; };
  json steps = json::array();
  for (const StepTimes& s : r.steps) {
    steps.push_back({{"step", s.step}, {"cursor", s.cursor}, {"wait_s", s.wait}, {"h2d_s", s.h2d},
                     {"compute_s", s.compute}, {"comm_s", s.comm}, {"total_s", s.total}, {"loss", s.loss},
                     {"samples", s.samples}, {"ids", s.ids}});
  }
  json j = {{"rank", r.rank},
            {"world_size", r.world_size},
            {"comm", r.comm},
            {"features", r.features},
            {"outputs", r.outputs},
            {"weights_fnv1a", r.weights_fnv1a},
            {"resumed_at_step", r.resumed_at_step},
            {"resumed_cursor", r.resumed_cursor},
            {"summary",
             {{"wait", part(r.wait)}, {"h2d", part(r.h2d)}, {"compute", part(r.compute)},
              {"comm", part(r.comm_time)}, {"step", part(r.total)},
              {"samples_per_s", r.samples_per_s}, {"wait_share", r.wait_share}}},
            {"loss",
             {{"final", r.final_loss}, {"mean_action", r.mean_action_loss},
              {"ratio", r.mean_action_loss > 0 ? r.final_loss / r.mean_action_loss : 0},
              {"first_step", r.first_step_loss}, {"first_step_mean_action", r.first_step_mean_loss},
              {"first_step_ratio", r.first_step_mean_loss > 0 ? r.first_step_loss / r.first_step_mean_loss : 0}}},
            {"steps", steps}};
  // What this rank received, per epoch and consumer slice: `conveyor audit --trainer-json`.
  json coverage = json::array();
  for (const client::CoverageSlice& c : r.coverage) {
    coverage.push_back({{"epoch", c.epoch}, {"consumer", c.consumer}, {"consumers", c.consumers},
                        {"global_batch_size", c.global_batch_size}, {"samples", c.samples},
                        {"digest", Hex64(c.digest)}, {"first_position", c.first_position},
                        {"end_position", c.end_position}, {"batches", c.batches}});
  }
  j["coverage"] = coverage;
  return JsonText(j, 2) + "\n";
}

}  // namespace conveyor::trainer
