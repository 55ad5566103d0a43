// The files an HDF5 location names (docs/hdf5.md "Remote locations"): a local .hdf5 file, a local
// directory (listed; ALOHA's episode_N files when there are any), a remote directory with a file
// list hdf5_files.txt, or a remote ALOHA directory probed episode_0.hdf5, episode_1.hdf5, ...
// until one is missing; a mapping's own `files:` take precedence. Each file is opened once here
// and its version taken (ETag, else a local file's mtime) for the index cache's keys.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/storage.h"

namespace conveyor::hdf5 {

struct LocationFiles {
  // The location's storage, or its directory's when the location is one local file.
  std::unique_ptr<Storage> storage;
  std::vector<std::string> names;                          // relative to storage's root
  std::vector<std::unique_ptr<RandomAccessFile>> handles;  // per file, opened once
  std::vector<std::string> versions;  // per file: ETag or mtime ("": unknown, no sidecar)
};

// Resolves the files of `storage`'s root: `mapped` (a mapping's files) when not empty, else as
// above. `uri` (redacted) names the location in errors; NOT_FOUND when no file is found or a
// named file is missing.
absl::StatusOr<LocationFiles> ResolveFiles(std::unique_ptr<Storage> storage,
                                           const std::vector<std::string>& mapped,
                                           const std::string& uri);

}  // namespace conveyor::hdf5
