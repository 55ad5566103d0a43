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

#include "datasets/dataset.h"
#include "storage/memory_storage.h"
#include "tests/fuzz/fuzz_support.h"

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
  conveyor::fuzz::ReadEveryStream(**ds);
  return 0;
}
