// `conveyor import --lerobot DIR|URL`: a LeRobot dataset (v3.0 or v2.1) -> a Conveyor dataset,
// losslessly; `conveyor import --from LOCATION` does the same for any format read in place (RLDS,
// HDF5) through ImportDataset. The dataset is read in place (datasets/lerobot/lerobot_dataset.h: every check of its
// tables against info.json and the videos happens there) and copied episode by episode: video
// packets byte for byte (each episode cut out of its camera's mp4, frame-exact, starting on a
// keyframe), numeric features as lowdim streams (float32 values kept bit for bit), embedded images
// as image streams, the task as the `instruction` text stream. docs/lerobot.md has the mapping.

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/episode_data.h"
#include "datasets/lerobot/lerobot_dataset.h"
#include "datasets/lerobot/lerobot_meta.h"
#include "format/dataset_writer.h"
#include "storage/storage.h"
#include "tools/commands.h"
#include "tools/import_media.h"

namespace conveyor::tools {

namespace fs = std::filesystem;

bool IsLeRobotRoot(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / lerobot::kInfoPath, ec)) return false;
  std::unique_ptr<Storage> storage = NewLocalStorage(dir);
  return lerobot::LooksLikeLeRobot(*storage);
}

absl::Status RunImportLeRobot(const ImportOptions& options) {
  const std::string root = options.lerobot.empty() ? options.from : options.lerobot;
  if (root.empty()) return absl::InvalidArgumentError("no LeRobot dataset given");
  if (options.out.empty()) return absl::InvalidArgumentError("no output folder given");
  if (!(options.tolerance_s > 0)) {
    return absl::InvalidArgumentError("--tolerance-s must be positive");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, OpenStorage(root));
  if (!lerobot::LooksLikeLeRobot(*storage)) {
    return absl::NotFoundError(StrCat(root, " is not a LeRobot dataset (no ",
                                      storage->Describe(lerobot::kInfoPath),
                                      " with a codebase_version)"));
  }
  lerobot::DatasetOptions lopts;
  lopts.tolerance_s = options.tolerance_s;
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, lerobot::OpenDataset(std::move(storage), root, lopts));
  return ImportDataset(*ds, options, "conveyor import (LeRobot)");
}

absl::Status ImportDataset(const Dataset& dataset, const ImportOptions& options,
                           const std::string& created_by) {
  const Dataset* ds = &dataset;
  DatasetWriter::Options wopts;
  wopts.name = options.name;
  if (wopts.name.empty()) wopts.name = ds->manifest().name;
  wopts.created_by = created_by;
  wopts.episodes_per_shard = options.episodes_per_shard;
  wopts.stats = ds->manifest().stats;  // the dataset's own statistics, quantiles included
  std::error_code ec;
  const bool out_existed = fs::exists(options.out, ec);
  absl::Status status;
  {
    auto writer = DatasetWriter::Create(options.out, wopts);
    if (!writer.ok()) return writer.status();
    status = [&]() -> absl::Status {
      std::vector<std::string> skipped;
      for (size_t e = 0; e < ds->num_episodes(); ++e) {
        absl::StatusOr<EpisodeData> data = ReadEpisodeData(*ds, e);
        if (!data.ok() && options.skip_broken) {
          spdlog::warn("import: skipping episode {}: {}", e, std::string(data.status().message()));
          skipped.push_back(StrCat(e, ": ", data.status().message()));
          continue;
        }
        if (!data.ok()) return data.status();
        RETURN_IF_ERROR((*writer)->AddEpisode(*data));
        if (options.progress) {
          std::fprintf(stderr, "import: %zu/%zu episodes\n", e + 1, ds->num_episodes());
        }
      }
      if (skipped.size() == ds->num_episodes()) {
        return absl::DataLossError(StrCat("import: every episode of ", ds->uri(),
                                          " failed; the first: ", skipped.front()));
      }
      if (!skipped.empty()) {
        // Always said, --quiet or not: these episodes are not in the output.
        std::fprintf(stderr, "import: skipped %zu of %zu episodes (--skip-broken-episodes):\n",
                     skipped.size(), ds->num_episodes());
        for (const std::string& s : skipped) std::fprintf(stderr, "  episode %s\n", s.c_str());
      }
      ASSIGN_OR_RETURN(Manifest manifest, (*writer)->Finish());
      if (options.progress) {
        std::fprintf(stderr,
                     "import: %s dataset %s -> %llu episodes, %zu streams, %.1f s, %llu bytes "
                     "in %s\n",
                     ds->format().c_str(), ds->uri().c_str(),
                     static_cast<unsigned long long>(manifest.num_episodes),
                     manifest.streams.size(), manifest.total_duration_s,
                     static_cast<unsigned long long>(manifest.total_bytes), options.out.c_str());
      }
      return absl::OkStatus();
    }();
  }
  if (!status.ok()) RemovePartialImport(options.out, out_existed);
  return status;
}

}  // namespace conveyor::tools
