// An episode of any dataset as the native writer takes it (format/dataset_writer.h: EpisodeData),
// read through the Dataset interface. `conveyor import --lerobot` is this, episode by episode,
// handed to DatasetWriter; it lives here, above both the format and the dataset interface, so
// the writer does not depend on the readers.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "datasets/dataset.h"
#include "format/dataset_writer.h"

namespace conveyor {

// Episode `episode` of `dataset`: every packet and lowdim value read, and checked, through the
// Dataset interface (lowdim streams become the native "zstd-shuffle4").
absl::StatusOr<EpisodeData> ReadEpisodeData(const Dataset& dataset, size_t episode);

}  // namespace conveyor
