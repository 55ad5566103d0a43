// libFuzzer target for a WebDataset shard read in place (datasets/webdataset/): any bytes as the one
// tar of a remote root (shards.txt names it) over an in-memory Storage, opened through Dataset, so
// the member index is built by probing every member (a video demuxed into its packet table, an
// image's size, a .npy header, a JSON's fields, a class label); then each sample's index loaded,
// its stored shapes asked for, its low-dim values read, its text read and a packet of each video
// read. The index cache is off (CONVEYOR_INDEX_CACHE_DIR=none), so every input is probed afresh.
// Nothing may crash, hang or allocate more than the bytes present justify; a bad member is an
// error or a broken sample (tar_fuzz covers the tar reader alone).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "storage/memory_storage.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CONVEYOR_INDEX_CACHE_DIR", "none", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> files = {
      {"shards.txt", "00000.tar\n"},
      {"00000.tar", std::string(reinterpret_cast<const char*>(data), size)}};
  auto ds = conveyor::Dataset::Open(conveyor::NewMemoryStorage(std::move(files)), "mem://");
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
