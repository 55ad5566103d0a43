// libFuzzer target for the tar reader of WebDataset shards (datasets/webdataset/tar.h): any bytes
// as a shard, listed through an in-memory Storage with a small and the default read window (so
// headers, pax records and GNU long names that straddle a window are read both ways), then every
// member read whole through its sub-range file. A listing names an error or members inside the
// file; nothing may crash, hang or allocate more than the bytes present justify.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "datasets/webdataset/tar.h"
#include "storage/memory_storage.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto storage = conveyor::NewMemoryStorage({{"shard.tar", bytes}});
  auto file = storage->Open("shard.tar");
  if (!file.ok()) return 0;
  for (size_t chunk : {size_t{512}, size_t{1} << 20}) {
    auto listing = conveyor::webdataset::ListTar(**file, chunk);
    if (!listing.ok()) continue;
    for (const auto& m : listing->members) {
      if (m.offset > size || m.size > size - m.offset) __builtin_trap();  // a member past the end
      auto sub = conveyor::webdataset::SubRangeFile(**file, m.offset, m.size, m.path);
      std::string out(static_cast<size_t>(m.size), '\0');
      if (!sub->Read(0, m.size, out.data()).ok()) __builtin_trap();
    }
  }
  return 0;
}
