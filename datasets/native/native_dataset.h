// The native Conveyor format read through the Dataset interface (docs/format.md): opening reads
// manifest.json and episodes.bin only; LoadEpisode is one range read of the shard's index plus
// checks against the manifest; ReadPacket and ReadLowdim are one checksum-verified range read each.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "storage/storage.h"

namespace conveyor::native {

// `uri` names the dataset in messages (redacted). NOT_FOUND, saying how to make one, when the root
// holds no manifest.json.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(std::unique_ptr<Storage> storage,
                                                     std::string uri);

}  // namespace conveyor::native
