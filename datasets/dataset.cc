// The parts of Dataset every format shares; each format's own reads live in its folder
// (native/, lerobot/), and Dataset::Open in registry.cc.
#include "datasets/dataset.h"

#include <string>
#include <vector>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"

namespace conveyor {

namespace pb = format::v1;

std::string Dataset::ShardName(uint32_t shard) const {
  if (shard >= manifest_.shards.size()) return StrCat("<shard ", shard, ">");
  return storage_->Describe(manifest_.shards[shard].path);
}

absl::Status Dataset::VerifyEpisode(size_t episode) const {
  ASSIGN_OR_RETURN(auto index, LoadEpisode(episode));
  std::string packet;
  std::vector<float> values;
  for (int s = 0; s < index->streams_size(); ++s) {
    const pb::StreamIndex& si = index->streams(s);
    if (si.kind() == pb::LOWDIM) {
      RETURN_IF_ERROR(ReadLowdim(*index, s, 0, si.num_frames(), &values));
    } else if (si.kind() != pb::TEXT) {
      for (int p = 0; p < si.packets().offset_size(); ++p) {
        RETURN_IF_ERROR(ReadPacket(*index, s, static_cast<size_t>(p), &packet));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace conveyor
