#include "datasets/episode_data.h"

#include <memory>
#include <string>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "format/format.h"
#include "format/lowdim_codec.h"

namespace conveyor {

namespace pb = format::v1;

absl::StatusOr<EpisodeData> ReadEpisodeData(const Dataset& dataset, size_t episode) {
  ASSIGN_OR_RETURN(std::shared_ptr<const pb::EpisodeIndex> index, dataset.LoadEpisode(episode));
  const Manifest& m = dataset.manifest();
  EpisodeData out;
  out.source = index->source().empty() ? StrCat(dataset.uri(), " episode ", episode) : index->source();
  for (int s = 0; s < index->streams_size(); ++s) {
    const pb::StreamIndex& si = index->streams(s);
    EpisodeData::Stream& st = out.streams.emplace_back();
    st.info = m.streams[static_cast<size_t>(s)];
    st.codec = si.codec();
    st.time_base_num = si.time_base_num();
    st.time_base_den = si.time_base_den();
    st.pts_origin = si.pts_origin();
    switch (si.kind()) {
      case pb::VIDEO:
      case pb::IMAGE:
      case pb::AUDIO: {
        const pb::PacketTable& t = si.packets();
        st.packets.resize(static_cast<size_t>(t.offset_size()));
        for (int p = 0; p < t.offset_size(); ++p) {
          EpisodeData::Packet& pk = st.packets[static_cast<size_t>(p)];
          RETURN_IF_ERROR(dataset.ReadPacket(*index, s, static_cast<size_t>(p), &pk.bytes));
          pk.pts = t.pts(p);
          pk.dts = t.dts(p);
          pk.duration = t.duration(p);
          pk.key = (t.flags(p) & format::kPacketKey) != 0;
        }
        break;
      }
      case pb::LOWDIM:
        st.info.codec = std::string(kLowdimCodec);
        st.codec->set_codec(st.info.codec);
        st.timestamps_s.assign(si.timestamps_s().begin(), si.timestamps_s().end());
        RETURN_IF_ERROR(dataset.ReadLowdim(*index, s, 0, si.num_frames(), &st.values));
        break;
      case pb::TEXT:
        st.text = si.text();
        break;
      default:
        return absl::DataLossError(StrCat(out.source, ": stream '", si.name(), "' has no kind"));
    }
  }
  return out;
}

}  // namespace conveyor
