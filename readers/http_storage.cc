// The HTTP(S) backend: range GETs with libcurl's easy API.
//
// Design:
// - Connection reuse. Each HttpStorage keeps a pool of idle CURL easy handles. A request takes
//   one (or makes a new one), and gives it back when done; the handle keeps its TCP (and TLS)
//   connection open, so sequential reads from one thread reuse one connection and N threads
//   reading at once use about N connections. The pool keeps at most
//   HttpOptions::max_idle_connections handles; extra ones are freed (closing their connection).
//   Handles are reset (curl_easy_reset keeps the live connection) and reconfigured per request.
// - Retries. Every request (the HEAD of Open, the range GET of Read) runs up to max_attempts
//   times. Transient failures (5xx, 408, 429, refused or reset connections, a body cut short,
//   stalls) are retried after a full-jitter exponential backoff; anything else (404, 403, a
//   server that ignores Range, a body longer than asked) fails at once. The final error names the
//   URL, the byte range, the number of attempts and the last cause.
// - Bodies are written straight into the caller's buffer, with bounds checks; error bodies (the
//   HTML of a 503) are discarded, never written there.
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "base/cancel.h"
#include "base/strings.h"
#include "readers/storage.h"

namespace conveyor {
namespace {

struct CurlEasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
using CurlHandle = std::unique_ptr<CURL, CurlEasyDeleter>;

absl::Status InitCurlOnce() {
  static std::once_flag once;
  static CURLcode init_result = CURLE_OK;
  std::call_once(once, [] { init_result = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init_result != CURLE_OK) {
    return absl::InternalError(
        StrCat("curl_global_init failed: ", curl_easy_strerror(init_result)));
  }
  return absl::OkStatus();
}

// The outcome of one HTTP exchange. `status` is the error to report if no attempt is left.
struct AttemptResult {
  absl::Status status;
  bool transient = false;
};

AttemptResult Transient(absl::Status status) { return {std::move(status), true}; }
AttemptResult Permanent(absl::Status status) { return {std::move(status), false}; }

// What a request is, for messages: "GET http://h/f.bin bytes=0-99" or "HEAD http://h/f.bin".
std::string RequestName(const std::string& url, uint64_t offset, size_t n, bool head) {
  if (head) return StrCat("HEAD ", RedactUri(url));
  return StrCat("GET ", RedactUri(url), " bytes=", offset, "-", offset + n - 1);
}

// Turns a failed libcurl transfer into an attempt result. `error_buffer` is CURLOPT_ERRORBUFFER,
// which carries more detail ("Failed to connect to 127.0.0.1 port 9: Connection refused") than
// curl_easy_strerror.
AttemptResult CurlFailure(CURLcode code, const char* error_buffer, const std::string& request) {
  std::string msg =
      StrCat(request, ": curl error ", static_cast<int>(code), " (", curl_easy_strerror(code), ")");
  if (error_buffer[0] != '\0') StrAppend(&msg, ": ", error_buffer);
  switch (code) {
    case CURLE_ABORTED_BY_CALLBACK:  // Progress() saw the caller's cancellation
      return Permanent(absl::CancelledError(StrCat(request, ": cancelled")));
    case CURLE_OPERATION_TIMEDOUT:
      return Transient(absl::DeadlineExceededError(msg));
    case CURLE_COULDNT_CONNECT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
      return Transient(absl::UnavailableError(msg));
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
      return Permanent(absl::InvalidArgumentError(msg));
    default:
      return Permanent(absl::UnavailableError(msg));
  }
}

// Turns an HTTP status other than the expected success into an attempt result.
AttemptResult HttpFailure(long http_status, const std::string& request) {
  std::string msg = StrCat(request, ": HTTP status ", http_status);
  if (http_status >= 500 || http_status == 408 || http_status == 429) {
    return Transient(absl::UnavailableError(msg));
  }
  switch (http_status) {
    case 404:
    case 410:
      return Permanent(absl::NotFoundError(msg));
    case 401:
    case 403:
      return Permanent(absl::PermissionDeniedError(msg));
    case 416:
      return Permanent(absl::OutOfRangeError(
          StrCat(msg, " (Range Not Satisfiable: did the file shrink after it was opened?)")));
    default:
      break;
  }
  if (http_status >= 300 && http_status < 400) {
    return Permanent(absl::InvalidArgumentError(
        StrCat(msg, " (redirects are not followed; open the dataset by its final URL)")));
  }
  return Permanent(absl::InvalidArgumentError(msg));
}

// State shared with libcurl's callbacks during one range GET.
struct RangeTransfer {
  CURL* handle = nullptr;
  char* dst = nullptr;         // the caller's buffer, valid for the whole transfer
  size_t capacity = 0;         // bytes asked for
  size_t written = 0;          // body bytes placed in dst
  bool accept_200 = false;     // a 200 is fine only when the whole file was asked for
  bool overflow = false;       // the server sent more than `capacity` bytes
  bool ignored_range = false;  // a 200 with the whole file when a part was asked for
  std::string content_range;   // the Content-Range header value, if any
};

size_t WriteBody(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<RangeTransfer*>(userdata);
  const size_t len = size * nmemb;
  long http_status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &http_status);
  if (http_status == 200 && !t->accept_200) {
    // The server ignored Range and is sending the whole file; stop rather than download it.
    t->ignored_range = true;
    return 0;
  }
  // Error bodies are discarded; the status code says what went wrong.
  if (http_status != 206 && http_status != 200) return len;
  if (len > t->capacity - t->written) {
    t->overflow = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  std::memcpy(t->dst + t->written, data, len);
  t->written += len;
  return len;
}

size_t DiscardBody(char*, size_t size, size_t nmemb, void*) { return size * nmemb; }

size_t CaptureContentRange(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<RangeTransfer*>(userdata);
  const size_t len = size * nmemb;
  absl::string_view line(data, len);
  constexpr absl::string_view kName = "content-range:";
  if (line.size() > kName.size() && absl::StartsWithIgnoreCase(line, kName)) {
    t->content_range = std::string(absl::StripAsciiWhitespace(line.substr(kName.size())));
  }
  return len;
}

// Checks "bytes FIRST-LAST/TOTAL" against the range asked for.
bool ContentRangeMatches(absl::string_view value, uint64_t first, uint64_t last) {
  if (!absl::ConsumePrefix(&value, "bytes ")) return false;
  size_t dash = value.find('-');
  size_t slash = value.find('/');
  if (dash == absl::string_view::npos || slash == absl::string_view::npos || slash < dash) {
    return false;
  }
  uint64_t got_first = 0, got_last = 0;
  return absl::SimpleAtoi(value.substr(0, dash), &got_first) &&
         absl::SimpleAtoi(value.substr(dash + 1, slash - dash - 1), &got_last) &&
         got_first == first && got_last == last;
}

class HttpStorage;

int Progress(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) { return CancelRequested() ? 1 : 0; }

class HttpFile final : public RandomAccessFile {
 public:
  HttpFile(const HttpStorage* storage, std::string url, uint64_t size)
      : storage_(storage), url_(std::move(url)), name_(RedactUri(url_)), size_(size) {}

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override;
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

 private:
  const HttpStorage* storage_;  // outlives its files, as with every Storage
  const std::string url_;   // what is requested
  const std::string name_;  // what messages say: the URL without credentials
  const uint64_t size_;
};

// Thread-safe: the handle pool is guarded by mu_, the counters are atomics, the rest is constant
// after construction.
class HttpStorage final : public Storage {
 public:
  HttpStorage(std::string base_url, const HttpOptions& options)
      : base_url_(std::move(base_url)), options_(options) {
    if (base_url_.back() != '/') base_url_.push_back('/');
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    std::string url = StrCat(base_url_, relpath);
    const std::string request = RequestName(url, 0, 0, /*head=*/true);
    uint64_t size = 0;
    absl::Status status =
        WithRetries(request, [&](CURL* handle) { return Head(handle, url, request, &size); });
    if (!status.ok()) return status;
    return std::make_unique<HttpFile>(this, std::move(url), size);
  }

  std::string Describe(std::string_view relpath) const override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    return RedactUri(StrCat(base_url_, relpath));
  }

  StorageStats stats() const override {
    StorageStats s;
    s.reads = reads_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.retries = retries_.load(std::memory_order_relaxed);
    s.connections_opened = connections_opened_.load(std::memory_order_relaxed);
    return s;
  }

  // The body of HttpFile::Read, once the range is known to be inside the file and non-empty.
  absl::Status ReadRange(const std::string& url, uint64_t file_size, uint64_t offset, size_t n,
                         char* dst) const {
    const std::string request = RequestName(url, offset, n, /*head=*/false);
    absl::Status status = WithRetries(request, [&](CURL* handle) {
      return GetRange(handle, url, request, offset, n, offset == 0 && n == file_size, dst);
    });
    if (!status.ok()) return status;
    reads_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(n, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  void CountEmptyRead() const { reads_.fetch_add(1, std::memory_order_relaxed); }

 private:
  // Runs `attempt` until it succeeds, fails permanently, or max_attempts are spent.
  template <typename Attempt>
  absl::Status WithRetries(const std::string& request, Attempt attempt) const {
    const int max_attempts = std::max(1, options_.max_attempts);
    absl::Status last;
    for (int k = 1; k <= max_attempts; ++k) {
      if (k > 1) {
        retries_.fetch_add(1, std::memory_order_relaxed);
        // The backoff ends early when the caller is cancelled (base/cancel.h).
        const auto until = std::chrono::steady_clock::now() + Backoff(k - 1);
        while (std::chrono::steady_clock::now() < until) {
          if (CancelRequested()) return absl::CancelledError(StrCat(request, ": cancelled"));
          std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
              std::chrono::milliseconds(10), until - std::chrono::steady_clock::now()));
        }
      }
      if (CancelRequested()) return absl::CancelledError(StrCat(request, ": cancelled"));
      CurlHandle handle = AcquireHandle();
      if (handle == nullptr)
        return absl::ResourceExhaustedError(request + ": curl_easy_init failed");
      AttemptResult result = attempt(handle.get());
      long new_connections = 0;
      if (curl_easy_getinfo(handle.get(), CURLINFO_NUM_CONNECTS, &new_connections) == CURLE_OK &&
          new_connections > 0) {
        connections_opened_.fetch_add(static_cast<uint64_t>(new_connections),
                                      std::memory_order_relaxed);
      }
      ReleaseHandle(std::move(handle));
      if (result.status.ok() || !result.transient) return result.status;
      last = std::move(result.status);
    }
    // The last cause already starts with the request; say how often it was tried.
    return absl::Status(last.code(), StrCat(last.message(), " (gave up after ", max_attempts,
                                            max_attempts == 1 ? " attempt)" : " attempts)"));
  }

  // Full jitter: uniform in [0, min(max_backoff, base * 2^(retry-1))].
  std::chrono::milliseconds Backoff(int retry) const {
    const int64_t base = std::max(0, options_.base_backoff_ms);
    const int64_t cap = std::max(0, options_.max_backoff_ms);
    int64_t ceiling = base;
    for (int i = 1; i < retry && ceiling < cap; ++i) ceiling *= 2;
    ceiling = std::min(ceiling, cap);
    thread_local std::minstd_rand rng{std::random_device{}()};
    std::uniform_int_distribution<int64_t> dist(0, ceiling);
    return std::chrono::milliseconds(dist(rng));
  }

  CurlHandle AcquireHandle() const {
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        CurlHandle handle = std::move(idle_.back());
        idle_.pop_back();
        curl_easy_reset(handle.get());
        return handle;
      }
    }
    return CurlHandle(curl_easy_init());
  }

  void ReleaseHandle(CurlHandle handle) const {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < static_cast<size_t>(std::max(0, options_.max_idle_connections))) {
      idle_.push_back(std::move(handle));
    }
    // Otherwise `handle` is freed here, closing its connection.
  }

  // Options every request sets; the handle was just reset or created.
  void Configure(CURL* handle, const std::string& url, char* error_buffer) const {
    error_buffer[0] = '\0';
    curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_buffer);
    curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options_.connect_timeout_ms));
    // A transfer slower than min_bytes_per_s for this many seconds is a stall. libcurl counts in
    // whole seconds, so the stall timeout is rounded up.
    const long stall_s = std::max(1L, static_cast<long>((options_.stall_timeout_ms + 999) / 1000));
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options_.min_bytes_per_s));
    curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, stall_s);
    curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.request_timeout_ms));
    // Called about once a second (and on every chunk): aborts the transfer when the calling
    // thread's pipeline was cancelled (base/cancel.h), so SIGTERM drains within its grace time.
    curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, &Progress);
    curl_easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    // Larger reads from the socket than the 16 KiB default; fewer callbacks on big ranges.
    curl_easy_setopt(handle, CURLOPT_BUFFERSIZE, 256L * 1024);
  }

  AttemptResult Head(CURL* handle, const std::string& url, const std::string& request,
                     uint64_t* size) const {
    char error_buffer[CURL_ERROR_SIZE];
    Configure(handle, url, error_buffer);
    curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &DiscardBody);
    CURLcode code = curl_easy_perform(handle);
    if (code != CURLE_OK) return CurlFailure(code, error_buffer, request);
    long http_status = 0;
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &http_status);
    if (http_status != 200) return HttpFailure(http_status, request);
    curl_off_t length = -1;
    curl_easy_getinfo(handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    if (length < 0) {
      return Permanent(absl::FailedPreconditionError(
          StrCat(request, ": the response has no Content-Length, so the size is unknown")));
    }
    *size = static_cast<uint64_t>(length);
    return {absl::OkStatus()};
  }

  AttemptResult GetRange(CURL* handle, const std::string& url, const std::string& request,
                         uint64_t offset, size_t n, bool whole_file, char* dst) const {
    char error_buffer[CURL_ERROR_SIZE];
    Configure(handle, url, error_buffer);
    const uint64_t last = offset + n - 1;
    const std::string range = StrCat(offset, "-", last);
    RangeTransfer t;
    t.handle = handle;
    t.dst = dst;
    t.capacity = n;
    t.accept_200 = whole_file;
    curl_easy_setopt(handle, CURLOPT_RANGE, range.c_str());
    curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &WriteBody);
    curl_easy_setopt(handle, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, &CaptureContentRange);
    curl_easy_setopt(handle, CURLOPT_HEADERDATA, &t);
    CURLcode code = curl_easy_perform(handle);
    if (t.overflow) {
      return Permanent(absl::DataLossError(
          StrCat(request, ": the server sent more than the ", n, " bytes asked for")));
    }
    if (t.ignored_range) {
      return Permanent(absl::FailedPreconditionError(
          StrCat(request,
                 ": the server ignored the Range header and answered 200 with the whole file; "
                 "Conveyor needs a server that supports range requests")));
    }
    if (code != CURLE_OK) return CurlFailure(code, error_buffer, request);
    long http_status = 0;
    curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &http_status);
    if (http_status != 206 && !(http_status == 200 && whole_file)) {
      return HttpFailure(http_status, request);
    }
    if (http_status == 206 && !ContentRangeMatches(t.content_range, offset, last)) {
      return Permanent(absl::DataLossError(
          StrCat(request, ": the server answered with Content-Range '", t.content_range, "'")));
    }
    if (t.written < n) {
      return Transient(absl::UnavailableError(
          StrCat(request, ": short body, ", t.written, " of ", n, " bytes")));
    }
    return {absl::OkStatus()};
  }

  std::string base_url_;
  const HttpOptions options_;

  mutable absl::Mutex mu_;
  mutable std::vector<CurlHandle> idle_ ABSL_GUARDED_BY(mu_);

  mutable std::atomic<uint64_t> reads_{0};
  mutable std::atomic<uint64_t> bytes_read_{0};
  mutable std::atomic<uint64_t> retries_{0};
  mutable std::atomic<uint64_t> connections_opened_{0};
};

absl::Status HttpFile::Read(uint64_t offset, size_t n, char* dst) const {
  if (offset > size_ || n > size_ - offset) {
    return absl::OutOfRangeError(StrCat(name_, ": read of ", n, " bytes at offset ", offset,
                                        " is past the end of the file (", size_, " bytes)"));
  }
  if (n == 0) {
    storage_->CountEmptyRead();
    return absl::OkStatus();
  }
  return storage_->ReadRange(url_, size_, offset, n, dst);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> NewHttpStorage(std::string base_url,
                                                        const HttpOptions& options) {
  if (!absl::StartsWith(base_url, "http://") && !absl::StartsWith(base_url, "https://")) {
    return absl::InvalidArgumentError(
        StrCat(base_url, ": an HTTP storage root must start with http:// or https://"));
  }
  if (options.max_attempts < 1 || options.connect_timeout_ms < 1 || options.stall_timeout_ms < 1 ||
      options.min_bytes_per_s < 1 || options.request_timeout_ms < 1 ||
      options.base_backoff_ms < 0 || options.max_backoff_ms < 0 ||
      options.max_idle_connections < 0) {
    return absl::InvalidArgumentError(
        StrCat(RedactUri(base_url),
               ": invalid HttpOptions (max_attempts, connect_timeout_ms and stall_timeout_ms "
               "must be >= 1; backoffs and max_idle_connections >= 0)"));
  }
  absl::Status init = InitCurlOnce();
  if (!init.ok()) return init;
  return std::make_unique<HttpStorage>(std::move(base_url), options);
}

}  // namespace conveyor
