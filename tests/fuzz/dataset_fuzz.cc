// libFuzzer target for the untrusted files of a native dataset: manifest.json, episodes.bin and a
// shard, opened through Dataset (datasets/dataset.h) over an in-memory Storage, then every
// episode's index loaded and every low-dimensional stream read through its zstd blocks. The
// input is [u32 LE manifest length][manifest][u32 LE table length][table][shard bytes]; the
// shard is served under whatever path the manifest names. Nothing may crash or allocate more
// than the bytes present justify (ASan's allocation limit catches the latter).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "format/format.h"
#include "storage/memory_storage.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string manifest, table;
  if (!conveyor::fuzz::TakeLengthPrefixed(&in, &manifest) ||
      !conveyor::fuzz::TakeLengthPrefixed(&in, &table)) return 0;
  std::map<std::string, std::string> files = {{"manifest.json", manifest}, {"episodes.bin", table}};
  conveyor::MemoryStorageOptions options;
  options.any_other_file = std::string(in);
  auto ds = conveyor::Dataset::Open(conveyor::NewMemoryStorage(std::move(files), options), "mem://");
  if (!ds.ok()) return 0;
  const size_t episodes = std::min<size_t>((*ds)->num_episodes(), 8);
  for (size_t e = 0; e < episodes; ++e) {
    auto index = (*ds)->LoadEpisode(e);
    if (!index.ok()) continue;
    for (int s = 0; s < (*index)->streams_size(); ++s) {
      const auto& st = (*index)->streams(s);
      if (st.kind() == conveyor::format::v1::LOWDIM) {
        std::vector<float> values;
        const size_t n = std::min<size_t>(st.num_frames(), 300);
        (void)(*ds)->ReadLowdim(**index, s, 0, n, &values);
        if (st.num_frames() > 2) (void)(*ds)->ReadLowdim(**index, s, st.num_frames() - 2, 2, &values);
      } else if (st.packets().size_size() > 0) {
        std::string packet;
        (void)(*ds)->ReadPacket(**index, s, 0, &packet);
      }
    }
  }
  return 0;
}
