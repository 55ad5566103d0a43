// The request engine the HTTP and S3 backends share: a pool of libcurl easy handles (connection
// reuse), bounded retries with full-jitter backoff, per-attempt deadlines and stall detection,
// cancellation of a transfer in flight (base/cancel.h), and range GETs written straight into the
// caller's buffer. A backend adds what is its own through two hooks: how a request is
// authorized (S3 signs it) and what an error response means (S3 reads the XML error code).
//
// INTERNAL header: it exposes libcurl types. Only storage/*.cc (and tests) include it.
#pragma once

#include <curl/curl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/storage.h"

namespace conveyor::http_internal {

struct CurlEasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
using CurlHandle = std::unique_ptr<CURL, CurlEasyDeleter>;

struct CurlSlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
// A request's extra header lines; libcurl reads them during the transfer, so they must live
// until curl_easy_perform returns.
using CurlHeaders = std::unique_ptr<curl_slist, CurlSlistDeleter>;

absl::Status InitCurlOnce();

// The outcome of one HTTP exchange. `status` is the error to report if no attempt is left.
struct AttemptResult {
  absl::Status status;
  bool transient = false;
};
inline AttemptResult Transient(absl::Status status) { return {std::move(status), true}; }
inline AttemptResult Permanent(absl::Status status) { return {std::move(status), false}; }

// An answer other than the success asked for.
struct ErrorResponse {
  long http_status = 0;
  // The first bytes (at most kMaxErrorBody) of the error body; empty for HEAD.
  std::string_view body;
  // What was asked, for messages: "GET s3://b/k bytes=0-99", "HEAD http://h/f".
  std::string_view request;
};
inline constexpr size_t kMaxErrorBody = 16 * 1024;

// The plain HTTP meaning of a status: 5xx, 408 and 429 transient; 404/410 NOT_FOUND, 401/403
// PERMISSION_DENIED, 416 OUT_OF_RANGE, redirects and other 4xx INVALID_ARGUMENT, all permanent.
AttemptResult HttpStatusFailure(const ErrorResponse& response);

// Adds authorization to one attempt, after the engine has configured `handle`: options such as
// CURLOPT_AWS_SIGV4, and header lines appended to `*headers` (which the engine installs). Called
// per attempt, so refreshed credentials reach retries. An error fails the request at once.
using Authorizer = std::function<absl::Status(CURL* handle, CurlHeaders* headers)>;
using ErrorClassifier = std::function<AttemptResult(const ErrorResponse& response)>;

struct Request {
  std::string url;   // what is requested (for HTTP it may hold user:password@)
  std::string name;  // what messages say: never a credential
  Authorizer authorize;     // empty: no authorization
  ErrorClassifier classify;  // empty: HttpStatusFailure
};

struct HeadResult {
  uint64_t size = 0;
  std::string etag;  // the ETag header when there is one (quotes kept), else ""
};

// Thread-safe: the handle pool is guarded by mu_, the counters are atomics, the rest is constant
// after construction.
class HttpEngine {
 public:
  // REQUIRES: `options` validated (ValidateHttpOptions).
  explicit HttpEngine(const HttpOptions& options);
  ~HttpEngine();
  HttpEngine(const HttpEngine&) = delete;
  HttpEngine& operator=(const HttpEngine&) = delete;

  // HEAD, with retries: the size (Content-Length) and ETag.
  absl::StatusOr<HeadResult> Head(const Request& request) const;

  // A range GET of [offset, offset + n) into dst, with retries. `file_size` lets a whole-file
  // read accept a 200. REQUIRES: n > 0, offset + n <= file_size, dst holds n bytes.
  absl::Status GetRange(const Request& request, uint64_t file_size, uint64_t offset, size_t n,
                        char* dst) const;

  // A read of zero bytes: counted, nothing sent.
  void CountEmptyRead() const { reads_.fetch_add(1, std::memory_order_relaxed); }

  StorageStats stats() const;

 private:
  template <typename Attempt>
  absl::Status WithRetries(const std::string& request, Attempt attempt) const;
  std::chrono::milliseconds Backoff(int retry) const;
  CurlHandle AcquireHandle() const;
  // `fd`: the socket of the connection the handle keeps open (-1: unknown).
  void ReleaseHandle(CurlHandle handle, int fd) const;
  void Configure(CURL* handle, const std::string& url, char* error_buffer) const;
  AttemptResult Authorize(const Request& request, CURL* handle, CurlHeaders* headers) const;
  AttemptResult HeadAttempt(CURL* handle, const Request& request, const std::string& name,
                            HeadResult* out) const;
  AttemptResult GetAttempt(CURL* handle, const Request& request, const std::string& name,
                           uint64_t offset, size_t n, bool whole_file, char* dst) const;

  const HttpOptions options_;

  mutable absl::Mutex mu_;
  mutable std::vector<std::pair<CurlHandle, int>> idle_ ABSL_GUARDED_BY(mu_);  // with its socket

  mutable std::atomic<uint64_t> reads_{0};
  mutable std::atomic<uint64_t> bytes_read_{0};
  mutable std::atomic<uint64_t> retries_{0};
  mutable std::atomic<uint64_t> connections_opened_{0};
};

// A file of a remote root: range reads through the engine. Thread-safe.
class RemoteFile final : public RandomAccessFile {
 public:
  // REQUIRES: `engine` outlives the file (the storage owns both).
  RemoteFile(const HttpEngine* engine, Request request, uint64_t size, std::string etag)
      : engine_(engine), request_(std::move(request)), size_(size), etag_(std::move(etag)) {}

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override;
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return request_.name; }
  std::string version() const override { return etag_; }

 private:
  const HttpEngine* engine_;
  const Request request_;
  const uint64_t size_;
  const std::string etag_;
};

// INVALID_ARGUMENT naming `root` when an option is out of range.
absl::Status ValidateHttpOptions(const HttpOptions& options, std::string_view root);

}  // namespace conveyor::http_internal
