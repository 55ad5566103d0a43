#include "media/decode_placement.h"

#include <set>
#include <string>

#include "absl/synchronization/mutex.h"
#include "base/strings.h"
#include "spdlog/spdlog.h"

namespace conveyor {

namespace {

std::string Size(int w, int h) { return StrCat(w, "x", h); }

}  // namespace

Placement PlaceVideoStream(const VideoStreamInfo& s, DecodeBackend asked, const NvdecHost& host) {
  auto cpu = [](std::string why) { return Placement{DecodeBackend::kCpu, std::move(why)}; };
  if (asked == DecodeBackend::kCpu) return cpu("decode: cpu");
  if (!host.unavailable.empty()) return cpu(StrCat("NVDEC unavailable: ", host.unavailable));
  auto caps = host.caps.find(s.codec);
  if (caps != host.caps.end() && !caps->second.supported) {
    return cpu(StrCat(s.codec, ": this GPU's NVDEC has no ", s.codec,
                      " decoder (cuvidGetDecoderCaps)"));
  }
  if (s.codec != "h264" && s.codec != "hevc") {
    return cpu(StrCat(s.codec, ": the NVDEC path decodes h264 and hevc"));
  }
  if (s.pix_fmt != "yuv420p" && s.pix_fmt != "yuvj420p" && s.pix_fmt != "nv12") {
    return cpu(StrCat("pixel format ", s.pix_fmt.empty() ? "(unknown)" : s.pix_fmt,
                      ": the NVDEC path takes 8-bit 4:2:0"));
  }
  if (caps != host.caps.end()) {
    const NvdecCaps& c = caps->second;
    if (s.width < c.min_width || s.height < c.min_height || s.width > c.max_width ||
        s.height > c.max_height) {
      return cpu(StrCat(s.codec, " ", Size(s.width, s.height), ": outside NVDEC's ",
                        Size(c.min_width, c.min_height), " to ", Size(c.max_width, c.max_height)));
    }
  }
  if (host.cpu_frames_per_s > 0 && host.nvdec_frames_per_s > 0) {
    const std::string measured =
        StrCat("measured at ", Size(s.width, s.height), ": NVDEC ",
               static_cast<int64_t>(host.nvdec_frames_per_s), " frames/s, the CPU ",
               static_cast<int64_t>(host.cpu_frames_per_s), " frames/s");
    if (host.nvdec_frames_per_s <= host.cpu_frames_per_s) return cpu(measured);
    return Placement{DecodeBackend::kGpu, measured};
  }
  return Placement{DecodeBackend::kGpu,
                   StrCat("NVDEC decodes ", s.codec, " ", Size(s.width, s.height), " here")};
}

absl::Status NvdecRefusal(const VideoStreamInfo& stream, bool resized, ResizeFilter filter) {
  if (const std::string& unavailable = GpuDecodeUnavailable(); !unavailable.empty()) {
    return absl::FailedPreconditionError(StrCat("video cannot be decoded on the GPU here: ",
                                                unavailable, " (decode: auto decodes on the CPU)"));
  }
  const Placement p = PlaceVideoStream(stream, DecodeBackend::kGpu, ProbeNvdecHost());
  if (p.where != DecodeBackend::kGpu) {
    return absl::FailedPreconditionError(
        StrCat("NVDEC cannot decode it here: ", p.reason, " (decode: cpu)"));
  }
  if (resized && filter != ResizeFilter::kBilinear) {
    return absl::FailedPreconditionError(
        "the NVDEC kernel resizes bilinearly (resize: bilinear, or decode: cpu)");
  }
  return absl::OkStatus();
}

const NvdecHost& ProbeNvdecHost(int device) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* hosts = new std::map<int, NvdecHost>;
  absl::MutexLock lock(&mu);
  auto it = hosts->find(device);
  if (it != hosts->end()) return it->second;
  NvdecHost host;
  host.unavailable = NvdecUnavailable(device);
  if (host.unavailable.empty()) {
    for (const char* codec : {"h264", "hevc", "av1", "vp9"}) {
      absl::StatusOr<NvdecCaps> c = QueryNvdecCaps(codec, device);
      if (c.ok()) host.caps[codec] = *c;
    }
  }
  return hosts->emplace(device, std::move(host)).first->second;
}

void LogPlacementOnce(std::string_view stream_name, const VideoStreamInfo& s, const Placement& p) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* seen = new std::set<std::string>;
  const std::string key = StrCat(s.codec, "|", s.pix_fmt, "|", s.width, "x", s.height, "|",
                                 DecodeBackendName(p.where), "|", p.reason);
  {
    absl::MutexLock lock(&mu);
    if (!seen->insert(key).second) return;
  }
  spdlog::info("decode: {} ({} {} {}x{}) decodes on the {}: {}", stream_name, s.codec, s.pix_fmt,
               s.width, s.height, p.where == DecodeBackend::kGpu ? "GPU (NVDEC)" : "CPU", p.reason);
}

}  // namespace conveyor
