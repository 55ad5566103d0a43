// libFuzzer target for an RLDS / TFDS builder folder read in place (datasets/rlds/): the input is
// [u32 LE dataset_info.json length][dataset_info.json][u32 LE features.json length][features.json]
// [shard bytes], over an in-memory Storage that serves the shard under whatever names
// dataset_info.json's split makes, with the index cache off (CONVEYOR_INDEX_CACHE_DIR=none); then
// every episode's index loaded (its tf.train.Example record parsed against features.json), its
// stored shapes asked for, its low-dim values and a packet of each image or text stream read. The
// TFRecord framing, the protobuf record and both JSON files are untrusted: nothing may crash, hang
// or allocate more than the bytes present justify.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "storage/memory_storage.h"

namespace {

bool Take(std::string_view* in, std::string* out) {
  if (in->size() < 4) return false;
  uint32_t n = 0;
  std::memcpy(&n, in->data(), 4);
  in->remove_prefix(4);
  if (n > in->size()) return false;
  *out = std::string(in->substr(0, n));
  in->remove_prefix(n);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CONVEYOR_INDEX_CACHE_DIR", "none", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string info, features;
  if (!Take(&in, &info) || !Take(&in, &features)) return 0;
  conveyor::MemoryStorageOptions options;
  options.any_other_file = std::string(in);
  auto ds = conveyor::Dataset::Open(
      conveyor::NewMemoryStorage({{"dataset_info.json", info}, {"features.json", features}}, options),
      "mem://");
  if (!ds.ok()) return 0;
  const conveyor::Dataset& d = **ds;
  const size_t episodes = std::min<size_t>(d.num_episodes(), 8);
  for (size_t e = 0; e < episodes; ++e) {
    auto index = d.LoadEpisode(e);
    if (!index.ok()) continue;
    for (int s = 0; s < (*index)->streams_size(); ++s) {
      const auto& st = (*index)->streams(s);
      (void)d.StoredShape(e, s);
      if (st.kind() == conveyor::format::v1::LOWDIM) {
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
  return 0;
}
