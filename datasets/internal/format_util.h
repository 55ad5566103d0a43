// Pieces every dataset format read in place shares (lerobot/, rlds/, hdf5/): private to
// conveyor_datasets.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "conveyor/format/v1/shard.pb.h"
#include "storage/storage.h"

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

// The local directory a storage root names ("/data/x" for "/data/x/" or "file:///data/x"), ""
// for a remote one (http, https, s3): formats that list a folder or keep an index beside their
// files do so only where the files are local.
inline std::string LocalRoot(const Storage& storage) {
  std::string root = storage.Describe("");
  if (root.find("://") != std::string::npos && root.rfind("file://", 0) != 0) return "";
  if (root.rfind("file://", 0) == 0) root = root.substr(7);
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  return root;
}

// Names in the order people number them: digit runs compare as numbers ("episode_10" after
// "episode_9", "part_2/10.tar" after "part_2/9.tar"), everything else byte by byte.
inline bool NaturalLess(const std::string& a, const std::string& b) {
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (digit(a[i]) && digit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && digit(a[ie])) ++ie;
      while (je < b.size() && digit(b[je])) ++je;
      std::string_view x(a.data() + i, ie - i), y(b.data() + j, je - j);
      while (x.size() > 1 && x[0] == '0') x.remove_prefix(1);
      while (y.size() > 1 && y[0] == '0') y.remove_prefix(1);
      if (x.size() != y.size()) return x.size() < y.size();
      if (x != y) return x < y;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

}  // namespace conveyor::datasets_internal
