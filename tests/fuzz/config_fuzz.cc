// libFuzzer target for a config as a server receives it: YAML text -> SampleSpec -> pipeline
// options -> schedule -> memory estimate -> the server's ceilings -> Pipeline::Create -> the
// first batch, on a tiny dataset this target writes at start-up (two episodes of state, action,
// and an instruction; no media, so every input runs in milliseconds). Seeded with examples/.
// Errors are fine; a crash, a hang, undefined behaviour or an allocation past the ceilings is not.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "format/dataset_writer.h"
#include "pipeline/pipeline.h"

namespace {

namespace pb = conveyor::format::v1;

std::unique_ptr<conveyor::Dataset> g_dataset;

void WriteDataset(const std::string& dir) {
  conveyor::DatasetWriter::Options wo;
  wo.name = "fuzz";
  wo.lowdim_block_steps = 16;
  auto w = conveyor::DatasetWriter::Create(dir, wo);
  if (!w.ok()) std::abort();
  for (int e = 0; e < 2; ++e) {
    conveyor::EpisodeData ep;
    ep.source = "fuzz";
    const int steps = 60 + 20 * e;
    for (const char* name : {"observation.state", "action"}) {
      conveyor::EpisodeData::Stream s;
      s.info = {name, pb::LOWDIM, "zstd-shuffle4", 50, {4}, {"a", "b", "c", "d"}, ""};
      s.codec->set_codec("zstd-shuffle4");
      for (int i = 0; i < steps; ++i) {
        s.timestamps_s.push_back(i / 50.0);
        for (int d = 0; d < 4; ++d) s.values.push_back(static_cast<float>(std::sin(i * 0.1 + d)));
      }
      ep.streams.push_back(std::move(s));
    }
    conveyor::EpisodeData::Stream text;
    text.info = {"instruction", pb::TEXT, "utf-8", 0, {}, {}, ""};
    text.codec->set_codec("utf-8");
    text.text = "pick up the cube";
    ep.streams.push_back(std::move(text));
    if (!(*w)->AddEpisode(ep).ok()) std::abort();
  }
  if (!(*w)->Finish().ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = std::filesystem::temp_directory_path() /
                          ("conveyor-config-fuzz-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  WriteDataset(dir);
  auto ds = conveyor::Dataset::Open(dir);
  if (!ds.ok()) std::abort();
  g_dataset = std::move(*ds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;  // the server's inline config cap
  const std::string_view yaml(reinterpret_cast<const char*>(data), size);
  const conveyor::Dataset& ds = *g_dataset;
  auto spec = conveyor::SampleSpec::FromYaml(yaml, ds.manifest(), "fuzz config");
  if (!spec.ok()) return 0;
  conveyor::PipelineOptions po;
  if (!po.MergeYaml(yaml, *spec, ds.manifest(), "fuzz config").ok()) return 0;
  if (!conveyor::ResolveSchedule(ds, *spec, &po).ok()) return 0;
  // What the server does before it starts a stream (server/server.cc CheckCeilings).
  po.threads = 1;
  po.queue_bytes = std::min<uint64_t>(po.queue_bytes, 8ull << 20);
  const conveyor::MemoryEstimate e = conveyor::EstimateMemory(ds, *spec, po);
  if (e.total > (256ull << 20) || e.sample_bytes > (16ull << 20)) return 0;
  auto p = conveyor::Pipeline::Create(ds, *spec, po, conveyor::Cursor{});
  if (!p.ok()) return 0;
  (void)(*p)->Next();
  return 0;
}
