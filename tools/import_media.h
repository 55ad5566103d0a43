// Shared by the importers (tools/import.cc, tools/import_lerobot.cc): demuxing one media file's
// best video or audio stream into the writer's EpisodeData::Stream, packets copied byte for byte.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "readers/dataset_writer.h"

namespace conveyor::tools {

enum class MediaKind { kVideo, kAudio };

// Opens `path` and reads every packet of its best stream of `kind`, in decode order, with the
// codec parameters, time base and pts_origin (the stream's start time, else the first pts).
// Missing dts are filled in as ffmpeg's stream copy does. A truncated or corrupt file is an error
// naming `path`. The stream is named `name`.
absl::StatusOr<EpisodeData::Stream> DemuxMediaFile(const std::string& path, MediaKind kind,
                                                   const std::string& name);

// After a failed import: leaves no half-written dataset behind, so that the same command can
// simply be rerun. A folder that existed before (it was empty: DatasetWriter refuses others) is
// emptied; one the import created is removed.
void RemovePartialImport(const std::string& out, bool out_existed);

}  // namespace conveyor::tools
