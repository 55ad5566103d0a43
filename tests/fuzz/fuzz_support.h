// What the dataset fuzz targets share: taking a length-prefixed file off the input, and reading a
// dataset that opened the way a pipeline would (every episode's index, stored shapes, low-dim
// values and packets), each result ignored: only a crash, a hang or an outsized allocation is a
// finding.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"

namespace conveyor::fuzz {

// [u32 LE length][bytes] off the front of `in` into `out`; false when `in` is too short.
inline bool TakeLengthPrefixed(std::string_view* in, std::string* out) {
  if (in->size() < 4) return false;
  uint32_t n = 0;
  std::memcpy(&n, in->data(), 4);
  in->remove_prefix(4);
  if (n > in->size()) return false;
  *out = std::string(in->substr(0, n));
  in->remove_prefix(n);
  return true;
}

// The first 8 episodes: each one's index, then per stream its stored shape, its first 300 and last
// low-dim rows, or its first and last packet.
inline void ReadEveryStream(const Dataset& d) {
  const size_t episodes = std::min<size_t>(d.num_episodes(), 8);
  for (size_t e = 0; e < episodes; ++e) {
    auto index = d.LoadEpisode(e);
    if (!index.ok()) continue;
    for (int s = 0; s < (*index)->streams_size(); ++s) {
      const auto& st = (*index)->streams(s);
      (void)d.StoredShape(e, s);
      if (st.kind() == format::v1::LOWDIM) {
        std::vector<float> values;
        const size_t n = std::min<size_t>(st.num_frames(), 300);
        (void)d.ReadLowdim(**index, s, 0, n, &values);
        if (st.num_frames() > 1) (void)d.ReadLowdim(**index, s, st.num_frames() - 1, 1, &values);
      } else if (st.packets().size_size() > 0) {
        std::string packet;
        (void)d.ReadPacket(**index, s, 0, &packet);
        if (st.packets().size_size() > 1) {
          (void)d.ReadPacket(**index, s, static_cast<size_t>(st.packets().size_size() - 1), &packet);
        }
      }
    }
  }
}

}  // namespace conveyor::fuzz
