#include "readers/storage.h"

#include <fstream>
#include <sstream>

#include "base/strings.h"
#include "base/status_macros.h"

namespace conveyor {

absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(std::string_view uri, const HttpOptions& http) {
  if (uri.empty()) return absl::InvalidArgumentError("empty dataset path or URL");
  if (uri.starts_with("http://") || uri.starts_with("https://")) {
    return NewHttpStorage(std::string(uri), http);
  }
  if (uri.starts_with("s3://")) {
    return absl::UnimplementedError(StrCat(
        uri, ": the S3 backend is not built yet; serve the bucket over HTTP(S) (e.g. a presigned "
             "or public endpoint) and open the dataset by its http(s):// URL"));
  }
  if (uri.starts_with("file://")) uri.remove_prefix(7);
  if (uri.find("://") != std::string_view::npos) {
    return absl::InvalidArgumentError(
        StrCat(uri, ": unknown URL scheme (expected a path, file://, http://, https://)"));
  }
  return NewLocalStorage(std::string(uri));
}

absl::StatusOr<std::string> ReadLocalFile(const std::string& path, std::string_view what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open ", what, " ", path));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
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
