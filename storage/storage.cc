#include "storage/storage.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"

#include "base/strings.h"
#include "base/status_macros.h"

namespace conveyor {

namespace {

// The cache options with the environment's defaults filled in (CONVEYOR_CACHE_DIR,
// CONVEYOR_CACHE_SHARED_KEY, CONVEYOR_CACHE_BYTES). INVALID_ARGUMENT for a CONVEYOR_CACHE_BYTES that is not a number.
absl::StatusOr<StorageCacheOptions> CacheOptionsWithDefaults(StorageCacheOptions cache) {
  if (cache.dir.empty()) {
    if (const char* dir = std::getenv("CONVEYOR_CACHE_DIR"); dir != nullptr) cache.dir = dir;
  }
  if (cache.shared_key_file.empty()) {
    if (const char* key = std::getenv("CONVEYOR_CACHE_SHARED_KEY"); key != nullptr) cache.shared_key_file = key;
  }
  if (cache.max_bytes == 0) {
    if (const char* bytes = std::getenv("CONVEYOR_CACHE_BYTES"); bytes != nullptr && *bytes) {
      if (!absl::SimpleAtoi(bytes, &cache.max_bytes) || cache.max_bytes == 0) {
        return absl::InvalidArgumentError(StrCat(
            "CONVEYOR_CACHE_BYTES='", bytes, "' is not a positive number of bytes"));
      }
    }
  }
  if (cache.max_bytes == 0) cache.max_bytes = 10ull << 30;
  return cache;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(std::string_view uri,
                                                     const StorageOptions& options) {
  if (uri.empty()) return absl::InvalidArgumentError("empty dataset path or URL");
  std::unique_ptr<Storage> remote;
  if (uri.starts_with("http://") || uri.starts_with("https://")) {
    ASSIGN_OR_RETURN(remote, NewHttpStorage(std::string(uri), options.http));
  } else if (uri.starts_with("s3://")) {
    ASSIGN_OR_RETURN(remote, NewS3Storage(uri, options.s3, options.http));
  } else {
    if (uri.starts_with("file://")) uri.remove_prefix(7);
    if (uri.find("://") != std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat(
          uri, ": unknown URL scheme (expected a path, file://, http://, https://, s3://)"));
    }
    return NewLocalStorage(std::string(uri));
  }
  ASSIGN_OR_RETURN(StorageCacheOptions cache, CacheOptionsWithDefaults(options.cache));
  if (cache.dir.empty()) return remote;
  return NewCachingStorage(std::move(remote), RedactUri(uri), cache);
}

absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(std::string_view uri, const HttpOptions& http) {
  StorageOptions options;
  options.http = http;
  return OpenStorage(uri, options);
}

absl::StatusOr<std::string> ReadLocalFile(const std::string& path, std::string_view what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open ", what, " ", path));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string t, ReadLocalFile(path, "token file"));
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!t.empty() && space(t.back())) t.pop_back();
  size_t first = 0;
  while (first < t.size() && space(t[first])) ++first;
  return t.substr(first);
}

std::string RedactUri(std::string_view uri) {
  const size_t scheme = uri.find("://");
  if (scheme == std::string_view::npos) return std::string(uri);
  const size_t host = scheme + 3;
  const size_t end = uri.find_first_of("/?#", host);
  const std::string_view authority = uri.substr(host, end == std::string_view::npos ? uri.npos : end - host);
  const size_t at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(uri);
  return StrCat(uri.substr(0, host), "***@", uri.substr(host + at + 1));
}

absl::StatusOr<std::string> ReadWholeFile(Storage& storage, std::string_view relpath,
                                          uint64_t max_bytes) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, storage.Open(relpath));
  if (file->size() > max_bytes) {
    return absl::FailedPreconditionError(StrCat(file->name(), " is ", file->size(),
                                                " bytes, more than the ", max_bytes,
                                                " this file may have"));
  }
  std::string out(file->size(), '\0');
  RETURN_IF_ERROR(file->Read(0, out.size(), out.data()));
  return out;
}

}  // namespace conveyor
