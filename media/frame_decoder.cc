#include "media/frame_decoder.h"

#include <algorithm>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"
#include "media/nvdec_decoder.h"
#include "media/video_decoder.h"

namespace conveyor {

namespace pb = format::v1;

absl::StatusOr<FrameTable> FrameTable::Build(const pb::StreamIndex& stream) {
  const pb::PacketTable& pk = stream.packets();
  const size_t n = static_cast<size_t>(pk.pts_size());
  if (n == 0) {
    return absl::InvalidArgumentError(StrCat("stream '", stream.name(), "' has no packets"));
  }
  if (stream.time_base_num() <= 0 || stream.time_base_den() <= 0) {
    return absl::DataLossError(StrCat("stream '", stream.name(), "' has no valid time base"));
  }
  // Keyframes in decode order.
  std::vector<uint32_t> keys;
  for (size_t i = 0; i < n; ++i) {
    if (pk.flags(static_cast<int>(i)) & format::kPacketKey) keys.push_back(static_cast<uint32_t>(i));
  }
  if (keys.empty()) {
    return absl::DataLossError(StrCat("stream '", stream.name(), "' has no keyframe"));
  }
  std::vector<uint32_t> shown;
  shown.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int ii = static_cast<int>(i);
    if (pk.flags(ii) & format::kPacketDiscard) continue;
    if (pk.pts(ii) < stream.pts_origin()) continue;  // decoded as a reference, never shown
    if (i < keys.front()) continue;                  // undecodable: no keyframe before it
    shown.push_back(static_cast<uint32_t>(i));
  }
  std::stable_sort(shown.begin(), shown.end(), [&](uint32_t a, uint32_t b) {
    return pk.pts(static_cast<int>(a)) < pk.pts(static_cast<int>(b));
  });
  FrameTable t;
  t.pts.reserve(shown.size());
  t.time_s.reserve(shown.size());
  t.packet.reserve(shown.size());
  t.start_packet.reserve(shown.size());
  const double tb = static_cast<double>(stream.time_base_num()) / stream.time_base_den();
  for (uint32_t d : shown) {
    const int64_t pts = pk.pts(static_cast<int>(d));
    if (!t.pts.empty() && pts == t.pts.back()) {
      return absl::DataLossError(StrCat("stream '", stream.name(), "': packets ", t.packet.back(),
                                        " and ", d, " have the same presentation timestamp ", pts));
    }
    // The last keyframe at or before d in decode order; a leading picture (shown before that
    // keyframe) may reference the previous group of pictures, so it starts one keyframe earlier.
    auto it = std::upper_bound(keys.begin(), keys.end(), d);
    --it;
    if (pts < pk.pts(static_cast<int>(*it)) && it != keys.begin()) --it;
    t.pts.push_back(pts);
    t.time_s.push_back(static_cast<double>(pts - stream.pts_origin()) * tb);
    t.packet.push_back(d);
    t.start_packet.push_back(*it);
  }
  if (t.pts.empty()) {
    return absl::DataLossError(
        StrCat("stream '", stream.name(), "' has no frame at or after its start time"));
  }
  return t;
}

int64_t FrameTable::Nearest(double t) const {
  if (time_s.empty()) return -1;
  auto it = std::lower_bound(time_s.begin(), time_s.end(), t);
  if (it == time_s.begin()) return 0;
  if (it == time_s.end()) return static_cast<int64_t>(time_s.size()) - 1;
  const int64_t hi = it - time_s.begin();
  return (t - time_s[hi - 1] <= time_s[hi] - t) ? hi - 1 : hi;
}

int64_t FrameTable::AtOrBefore(double t) const {
  if (time_s.empty()) return -1;
  auto it = std::upper_bound(time_s.begin(), time_s.end(), t);
  if (it == time_s.begin()) return 0;
  return (it - time_s.begin()) - 1;
}

absl::StatusOr<std::unique_ptr<FrameDecoder>> OpenFrameDecoder(DecodeBackend backend, int device) {
  switch (backend) {
    case DecodeBackend::kCpu:
      return std::make_unique<VideoDecoder>();
    case DecodeBackend::kGpu: {
      ASSIGN_OR_RETURN(std::unique_ptr<NvdecDecoder> nvdec, NvdecDecoder::Create(device));
      return std::unique_ptr<FrameDecoder>(std::move(nvdec));
    }
    case DecodeBackend::kAuto:
      break;
  }
  return absl::InvalidArgumentError(
      StrCat("no frame decoder for decode: ", DecodeBackendName(backend),
             " (ChooseDecodeBackend decides auto for where the stream is decoded)"));
}

}  // namespace conveyor
