#include "datasets/hdf5/hdf5_location.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "base/strings.h"
#include "datasets/hdf5/hdf5_dataset.h"
#include "datasets/hdf5/hdf5_file.h"
#include "datasets/internal/format_util.h"

namespace conveyor::hdf5 {
namespace {

namespace fs = std::filesystem;
using datasets_internal::LocalRoot;

constexpr std::string_view kFileList = "hdf5_files.txt";

bool HasHdf5Extension(const std::string& name) {
  for (const char* ext : {".hdf5", ".h5", ".hdf"}) {
    const std::string e(ext);
    if (name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

std::vector<std::string> ListLocal(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (HasHdf5Extension(n) && e.is_regular_file(ec)) names.push_back(n);
  }
  std::sort(names.begin(), names.end(), NaturalLess);
  return names;
}

}  // namespace

bool LooksLikeHdf5(Storage& storage) {
  const std::string local = LocalRoot(storage);
  if (!local.empty()) {
    struct stat st;
    if (::stat(local.c_str(), &st) != 0) return false;
    if (S_ISREG(st.st_mode)) return HasHdf5Extension(local);
    return S_ISDIR(st.st_mode) && !ListLocal(local).empty();
  }
  return storage.Open("episode_0.hdf5").ok() || storage.Open(kFileList).ok();
}

absl::StatusOr<LocationFiles> ResolveFiles(std::unique_ptr<Storage> storage,
                                           const std::vector<std::string>& mapped,
                                           const std::string& uri) {
  LocationFiles out;
  out.storage = std::move(storage);
  const std::string local = LocalRoot(*out.storage);
  std::string single_file;
  struct stat st;
  if (!local.empty() && ::stat(local.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    // The location is one file: read it from its directory.
    const fs::path p(local);
    out.storage = NewLocalStorage(p.parent_path().string());
    single_file = p.filename().string();
  }
  if (!mapped.empty()) {
    out.names = mapped;
  } else if (!single_file.empty()) {
    out.names = {single_file};
  } else if (!local.empty()) {
    out.names = ListLocal(local);
    std::vector<std::string> episodes;
    for (const std::string& f : out.names) {
      if (f.rfind("episode_", 0) == 0) episodes.push_back(f);
    }
    if (!episodes.empty()) out.names = episodes;  // ALOHA: only the episode files
  } else if (absl::StatusOr<std::string> list = ReadWholeFile(*out.storage, kFileList); list.ok()) {
    std::istringstream lines(*list);
    for (std::string line; std::getline(lines, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty() && line[0] != '#') out.names.push_back(line);
    }
  } else {
    // A remote ALOHA directory has no listing: episode_0.hdf5, episode_1.hdf5, ... until one
    // is missing.
    for (int i = 0;; ++i) {
      const std::string name = StrCat("episode_", i, ".hdf5");
      absl::StatusOr<std::unique_ptr<RandomAccessFile>> f = out.storage->Open(name);
      if (absl::IsNotFound(f.status())) break;
      if (!f.ok()) return f.status();
      out.names.push_back(name);
      out.handles.push_back(*std::move(f));
    }
  }
  if (out.names.empty()) {
    return absl::NotFoundError(StrCat(uri, ": no .hdf5 files (remote locations need ",
                                      "episode_0.hdf5... or a file list ", kFileList,
                                      ", docs/hdf5.md)"));
  }
  for (size_t i = out.handles.size(); i < out.names.size(); ++i) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> f = out.storage->Open(out.names[i]);
    if (absl::IsNotFound(f.status())) {
      return absl::NotFoundError(StrCat(out.storage->Describe(out.names[i]), " is missing"));
    }
    if (!f.ok()) return f.status();
    out.handles.push_back(*std::move(f));
  }
  for (size_t i = 0; i < out.names.size(); ++i) {
    std::string v = out.handles[i]->version();
    struct stat st;
    const std::string name = out.storage->Describe(out.names[i]);
    if (v.empty() && name.find("://") == std::string::npos && ::stat(name.c_str(), &st) == 0) {
      v = StrCat("mtime ", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
    }
    out.versions.push_back(std::move(v));
  }
  return out;
}

}  // namespace conveyor::hdf5
