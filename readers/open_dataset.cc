// Dataset::Open: whichever format is at the location. Lives above both implementations (the
// native one in conveyor_readers, LeRobot's in conveyor_lerobot), in conveyor_datasets.
#include "readers/dataset.h"
#include "readers/lerobot/lerobot_dataset.h"
#include "readers/lerobot/lerobot_meta.h"
#include "base/status_macros.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(std::string_view uri,
                                                       const HttpOptions& http) {
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, OpenStorage(uri, http));
  return Open(std::move(storage), std::string(uri));
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(std::unique_ptr<Storage> storage,
                                                       std::string uri) {
  // A LeRobot dataset has meta/info.json with a codebase_version; a Conveyor dataset has
  // manifest.json. The native format is tried first only when info.json is absent, so its
  // "no manifest.json" error is the one a wrong path gets.
  if (lerobot::LooksLikeLeRobot(*storage)) {
    return lerobot::OpenDataset(std::move(storage), std::move(uri));
  }
  return OpenNative(std::move(storage), std::move(uri));
}

}  // namespace conveyor
