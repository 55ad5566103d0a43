// The HTTP(S) backend: range GETs through the shared request engine
// (storage/internal/http_engine.h: connection reuse, retries, deadlines, cancellation).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "base/strings.h"
#include "storage/internal/http_engine.h"
#include "storage/storage.h"

namespace conveyor {
namespace {

using http_internal::HttpEngine;
using http_internal::RemoteFile;
using http_internal::Request;

// Thread-safe: the engine is, and the rest is constant after construction.
class HttpStorage final : public Storage {
 public:
  HttpStorage(std::string base_url, const HttpOptions& options)
      : base_url_(std::move(base_url)), engine_(options) {
    if (base_url_.back() != '/') base_url_.push_back('/');
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    Request request;
    request.url = StrCat(base_url_, relpath);
    request.name = RedactUri(request.url);
    absl::StatusOr<http_internal::HeadResult> head = engine_.Head(request);
    if (!head.ok()) return head.status();
    return std::make_unique<RemoteFile>(&engine_, std::move(request), head->size,
                                      std::move(head->etag));
  }

  std::string Describe(std::string_view relpath) const override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    return RedactUri(StrCat(base_url_, relpath));
  }

  StorageStats stats() const override { return engine_.stats(); }

 private:
  std::string base_url_;
  HttpEngine engine_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> NewHttpStorage(std::string base_url,
                                                        const HttpOptions& options) {
  if (!absl::StartsWith(base_url, "http://") && !absl::StartsWith(base_url, "https://")) {
    return absl::InvalidArgumentError(
        StrCat(base_url, ": an HTTP storage root must start with http:// or https://"));
  }
  absl::Status valid = http_internal::ValidateHttpOptions(options, RedactUri(base_url));
  if (!valid.ok()) return valid;
  absl::Status init = http_internal::InitCurlOnce();
  if (!init.ok()) return init;
  return std::make_unique<HttpStorage>(std::move(base_url), options);
}

}  // namespace conveyor
