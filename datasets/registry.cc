// Dataset::Open: the formats a location may hold, asked in order. A new dataset format is a
// folder beside native/ and lerobot/ (its sources added to conveyor_datasets by its own
// CMakeLists.txt) and one line in kFormats.
#include <string_view>

#include "base/status_macros.h"
#include "base/strings.h"
#include "datasets/dataset.h"
#include "datasets/hdf5/hdf5_dataset.h"
#include "datasets/lerobot/lerobot_dataset.h"
#include "datasets/lerobot/lerobot_meta.h"
#include "datasets/native/native_dataset.h"
#include "datasets/rlds/rlds_dataset.h"
#include "datasets/webdataset/wds_dataset.h"

namespace conveyor {
namespace {

struct DatasetFormat {
  std::string_view name;
  // What recognise() looks for, for the error a location none recognises gets.
  std::string_view looks_for;
  // Whether the format is at the location (a small read, no errors); null: it is the fallback,
  // tried when no other format recognised the location, so its "not found" error is the one a
  // wrong path gets.
  bool (*recognise)(Storage& storage);
  // Takes the location's options it knows (LocationOptions::Take); Dataset::Open refuses any left.
  absl::StatusOr<std::unique_ptr<Dataset>> (*open)(std::unique_ptr<Storage> storage,
                                                   std::string uri, LocationOptions& options);
};

// A LeRobot dataset has meta/info.json with a codebase_version; a Conveyor dataset has
// manifest.json (the fallback).
constexpr DatasetFormat kFormats[] = {
    {"lerobot", "meta/info.json", lerobot::LooksLikeLeRobot,
     [](std::unique_ptr<Storage> s, std::string uri, LocationOptions&) {
       return lerobot::OpenDataset(std::move(s), std::move(uri));
     }},
    {"rlds", "dataset_info.json and features.json", rlds::LooksLikeRlds, rlds::OpenDataset},
    {"hdf5", "*.hdf5 / *.h5 files (remote: episode_0.hdf5 or hdf5_files.txt)", hdf5::LooksLikeHdf5,
     hdf5::OpenDataset},
    {"webdataset", "*.tar shards (remote: shards.txt)", webdataset::LooksLikeWebDataset,
     webdataset::OpenDataset},
    {"conveyor", "manifest.json", nullptr,
     [](std::unique_ptr<Storage> s, std::string uri, LocationOptions&) {
       return native::OpenDataset(std::move(s), std::move(uri));
     }},
};

absl::StatusOr<std::unique_ptr<Dataset>> OpenAs(const DatasetFormat& f,
                                                std::unique_ptr<Storage> storage,
                                                std::string uri, LocationOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, f.open(std::move(storage), std::move(uri), options));
  RETURN_IF_ERROR(options.CheckAllTaken(ds->format()));
  return ds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(std::string_view uri,
                                                       const HttpOptions& http) {
  std::string location;
  RETURN_IF_ERROR(LocationOptions::Parse(uri, &location).status());
  ASSIGN_OR_RETURN(std::unique_ptr<Storage> storage, OpenStorage(location, http));
  return Open(std::move(storage), std::string(uri));
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(std::unique_ptr<Storage> storage,
                                                       std::string uri) {
  std::string location;
  ASSIGN_OR_RETURN(LocationOptions options, LocationOptions::Parse(uri, &location));
  const DatasetFormat* fallback = nullptr;
  for (const DatasetFormat& f : kFormats) {
    if (f.recognise == nullptr) {
      fallback = &f;
    } else if (f.recognise(*storage)) {
      return OpenAs(f, std::move(storage), std::move(location), options);
    }
  }
  absl::StatusOr<std::unique_ptr<Dataset>> ds =
      OpenAs(*fallback, std::move(storage), std::move(location), options);
  if (absl::IsNotFound(ds.status())) {
    // No format recognised the location: say everything that was looked for.
    std::string tried;
    for (const DatasetFormat& f : kFormats) {
      StrAppend(&tried, tried.empty() ? "" : "; ", f.name, ": ", f.looks_for);
    }
    return absl::NotFoundError(StrCat(ds.status().message(), ". No dataset format recognised it; looked for ",
                                      tried));
  }
  return ds;
}

}  // namespace conveyor
