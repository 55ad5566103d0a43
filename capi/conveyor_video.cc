// The C ABI of DeviceFrames (capi/include/conveyor/conveyor_video.h): video decoded on NVDEC in
// the trainer's process, in a library of its own (libconveyor_video.so.1) so that the client's
// libconveyor_c.so.1 carries none of the data path DeviceFrames needs.
#include "conveyor/conveyor_video.h"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "base/json_text.h"
#include "base/types.h"
#include "capi/internal/c_status.h"
#include "nlohmann/json.hpp"
#include "pipeline/device_frames.h"

using json = nlohmann::json;
using ::conveyor::JsonText;
using ::conveyor::capi::Dup;
using ::conveyor::capi::Fail;

struct conveyor_device_frames {
  std::unique_ptr<conveyor::DeviceFrames> frames;
};

extern "C" {

const char* conveyor_video_last_error(void) { return ::conveyor::capi::LastError().c_str(); }
void conveyor_video_string_free(char* s) { std::free(s); }

int conveyor_device_frames_create(const char* options_json, conveyor_device_frames** out) {
  if (out == nullptr) return Fail(absl::StatusCode::kInvalidArgument, "out is NULL");
  *out = nullptr;
  conveyor::DeviceFramesOptions o;
  try {
    const json j = json::parse(options_json != nullptr ? options_json : "{}");
    if (!j.is_object()) return Fail(absl::StatusCode::kInvalidArgument, "options: not an object");
    for (const auto& [key, value] : j.items()) {
      if (key == "dataset") {
        o.dataset = value.get<std::string>();
      } else if (key == "config") {
        o.config = value.get<std::string>();
      } else if (key == "streams") {
        o.streams = value.get<std::vector<std::string>>();
      } else if (key == "device") {
        o.device = value.get<int>();
      } else if (key == "sessions") {
        o.sessions = value.get<int>();
      } else if (key == "cache_bytes") {
        o.cache_bytes = value.get<int64_t>();
      } else {
        return Fail(absl::StatusCode::kInvalidArgument,
                    "options: unknown key '" + key +
                        "'; expected dataset, config, streams, device, sessions, cache_bytes");
      }
    }
  } catch (const json::exception& e) {
    return Fail(absl::StatusCode::kInvalidArgument, std::string("options: ") + e.what());
  }
  auto frames = conveyor::DeviceFrames::Open(o);
  if (!frames.ok()) return Fail(frames.status());
  *out = new conveyor_device_frames{std::move(*frames)};
  return CONVEYOR_OK;
}

int conveyor_device_frames_describe(const conveyor_device_frames* f, char** result_json) {
  if (f == nullptr || result_json == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "a NULL argument");
  }
  json out = json::array();
  for (const conveyor::DeviceFramesTensor& t : f->frames->tensors()) {
    out.push_back({{"name", t.name},
                   {"dtype", t.dtype == conveyor::DType::kFloat32 ? "float32" : "uint8"},
                   {"sample_shape", t.shape},
                   {"sample_bytes", t.sample_bytes},
                   {"frames_per_sample", t.frames_per_sample}});
  }
  *result_json = Dup(JsonText(out));
  return CONVEYOR_OK;
}

int conveyor_device_frames_decode(conveyor_device_frames* f, uint32_t tensor, const int64_t* ids,
                                  const int32_t* datasets, uint64_t n, void* dst, uint8_t* pads,
                                  void* cuda_stream) {
  if (f == nullptr || (n > 0 && ids == nullptr)) {
    return Fail(absl::StatusCode::kInvalidArgument, "a NULL argument");
  }
  std::vector<conveyor::SampleId> samples(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (ids[3 * i] < 0 || ids[3 * i + 1] < 0 || ids[3 * i + 2] < 0 ||
        ids[3 * i + 2] > INT64_C(0xffffffff) || (datasets != nullptr && datasets[i] < 0)) {
      return Fail(absl::StatusCode::kInvalidArgument,
                  "sample " + std::to_string(i) + ": a negative or oversized id");
    }
    samples[i].index = static_cast<uint64_t>(ids[3 * i]);
    samples[i].episode = static_cast<uint64_t>(ids[3 * i + 1]);
    samples[i].step = static_cast<uint32_t>(ids[3 * i + 2]);
    samples[i].dataset = datasets != nullptr ? static_cast<uint32_t>(datasets[i]) : 0;
  }
  if (absl::Status st = f->frames->Decode(tensor, samples, dst, pads, cuda_stream); !st.ok()) {
    return Fail(st);
  }
  return CONVEYOR_OK;
}

int conveyor_device_frames_stats(const conveyor_device_frames* f, char** result_json) {
  if (f == nullptr || result_json == nullptr) {
    return Fail(absl::StatusCode::kInvalidArgument, "a NULL argument");
  }
  const conveyor::DeviceFramesStats s = f->frames->stats();
  const json out = {{"calls", s.calls},
                    {"samples", s.samples},
                    {"frames", s.frames},
                    {"frames_decoded", s.frames_decoded},
                    {"seeks", s.seeks},
                    {"cache_hits", s.cache_hits},
                    {"frames_cached", s.frames_cached},
                    {"seconds", s.seconds}};
  *result_json = Dup(JsonText(out));
  return CONVEYOR_OK;
}

void conveyor_device_frames_destroy(conveyor_device_frames* f) { delete f; }

}  // extern "C"
