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
#include <map>
#include <string>
#include <string_view>

#include "datasets/dataset.h"
#include "storage/memory_storage.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("CONVEYOR_INDEX_CACHE_DIR", "none", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string info, features;
  if (!conveyor::fuzz::TakeLengthPrefixed(&in, &info) ||
      !conveyor::fuzz::TakeLengthPrefixed(&in, &features)) return 0;
  conveyor::MemoryStorageOptions options;
  options.any_other_file = std::string(in);
  auto ds = conveyor::Dataset::Open(
      conveyor::NewMemoryStorage({{"dataset_info.json", info}, {"features.json", features}}, options),
      "mem://");
  if (!ds.ok()) return 0;
  conveyor::fuzz::ReadEveryStream(**ds);
  return 0;
}
