// Pieces every dataset format read in place shares (lerobot/, rlds/, hdf5/): private to
// conveyor_datasets.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "conveyor/format/v1/shard.pb.h"

namespace conveyor::datasets_internal {

// Streams are ordered by kind (video, image, audio, lowdim, text), then name, as `conveyor
// import` orders them, so a dataset read in place and its import give the same batches.
inline int StreamKindOrder(int kind) {
  namespace pb = format::v1;
  return kind == pb::VIDEO ? 0 : kind == pb::IMAGE ? 1 : kind == pb::AUDIO ? 2 : kind == pb::LOWDIM ? 3 : 4;
}

// A value computed once by the first thread that needs it; the others wait for it. A failure is
// not kept (a transient read error is retried by the next caller).
template <typename T>
struct Once {
  absl::Mutex mu;
  std::shared_ptr<const T> value ABSL_GUARDED_BY(mu);

  template <typename F>
  absl::StatusOr<std::shared_ptr<const T>> Get(F make) {
    absl::MutexLock lock(&mu);
    if (value != nullptr) return value;
    absl::StatusOr<std::unique_ptr<T>> made = make();
    if (!made.ok()) return made.status();
    value = std::shared_ptr<const T>(std::move(*made));
    return value;
  }
};

}  // namespace conveyor::datasets_internal
