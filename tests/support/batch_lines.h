// A pipeline's batches as plain values a test compares: the same bits at another thread count,
// consumer count or resume point is two runs compared with ==. Header-only: its users link
// conveyor_pipeline, the test support library does not.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "base/types.h"
#include "datasets/dataset.h"
#include "pipeline/pipeline.h"
#include "sample/sample_spec.h"

namespace conveyor::testing {

struct BatchLine {
  Cursor cursor;
  std::vector<SampleId> ids;
  std::map<std::string, std::vector<uint8_t>> tensors;  // bytes per tensor name
  std::map<std::string, std::vector<int64_t>> shapes;
  bool operator==(const BatchLine&) const = default;
};

// `steps` batches of `spec` on `dataset` from `start`; a failure to create or to give a batch is
// a test failure, and the batches before it are returned.
inline std::vector<BatchLine> RunBatches(const Dataset& dataset, const SampleSpec& spec,
                                         PipelineOptions o, Cursor start, int steps) {
  auto p = Pipeline::Create(dataset, spec, std::move(o), start);
  EXPECT_TRUE(p.ok()) << p.status();
  std::vector<BatchLine> out;
  if (!p.ok()) return out;
  for (int i = 0; i < steps; ++i) {
    auto next = (*p)->Next();
    EXPECT_TRUE(next.ok() && next->has_value()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    const Batch* b = &**next;
    BatchLine l{b->cursor, b->ids, {}, {}};
    for (const TensorView& t : b->tensors) {
      l.tensors[t.name].assign(b->data(t), b->data(t) + t.bytes);
      l.shapes[t.name] = t.shape;
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace conveyor::testing
