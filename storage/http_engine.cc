// The request engine shared by the HTTP and S3 backends (storage/internal/http_engine.h).
//
// Design:
// - Connection reuse. The engine keeps a pool of idle CURL easy handles. A request takes one (or
//   makes a new one), and gives it back when done; the handle keeps its TCP (and TLS) connection
//   open, so sequential reads from one thread reuse one connection and N threads reading at once
//   use about N connections. The pool keeps at most HttpOptions::max_idle_connections handles;
//   extra ones are freed (closing their connection). Handles are reset (curl_easy_reset keeps
//   the live connection) and reconfigured per request.
// - Retries. Every request (a HEAD, a range GET) runs up to max_attempts times. Transient
//   failures (5xx, 408, 429, refused or reset connections, a body cut short, stalls) are retried
//   after a full-jitter exponential backoff; anything else (404, 403, a server that ignores
//   Range, a body longer than asked) fails at once. The backend's ErrorClassifier decides what
//   an error response means. The final error names the request (URL or s3:// name and byte
//   range), the number of attempts and the last cause.
// - Bodies are written straight into the caller's buffer, with bounds checks; error bodies are
//   kept (at most kMaxErrorBody bytes) for the classifier, never written there.
#include "storage/internal/http_engine.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/cancel.h"
#include "base/cpu_slots.h"
#include "base/strings.h"

namespace conveyor::http_internal {
namespace {

// What a request is, for messages: "GET http://h/f.bin bytes=0-99" or "HEAD http://h/f.bin".
std::string RequestName(const std::string& name, uint64_t offset, size_t n, bool head) {
  if (head) return StrCat("HEAD ", name);
  return StrCat("GET ", name, " bytes=", offset, "-", offset + n - 1);
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

// State shared with libcurl's callbacks during one request.
struct Transfer {
  CURL* handle = nullptr;
  int fd = -1;                 // the connection's socket, for AcknowledgeNow
  char* dst = nullptr;         // the caller's buffer, valid for the whole transfer
  size_t capacity = 0;         // bytes asked for
  size_t written = 0;          // body bytes placed in dst
  bool accept_200 = false;     // a 200 is fine only when the whole file was asked for
  bool overflow = false;       // the server sent more than `capacity` bytes
  bool ignored_range = false;  // a 200 with the whole file when a part was asked for
  std::string content_range;   // the Content-Range header value, if any
  std::string etag;            // the ETag header value, if any
  std::string error_body;      // the first kMaxErrorBody bytes of an error response's body
};

// Acknowledges at once what has arrived. A server that writes a small response's headers and body
// in two sends with Nagle's algorithm on (radosgw's beast frontend does) holds the body back until
// the headers are acknowledged, and Linux delays that acknowledgement by up to 40 ms when the
// receiver has nothing to send: on a kept-alive connection every small range GET then took
// ~43 ms instead of ~1 ms (measured against radosgw on loopback, bench/RESULTS.md "S3"). Setting
// TCP_QUICKACK while an ACK is pending sends it now; done for every header line and body chunk
// received (the kernel turns quick ACKs off again by itself).
void AcknowledgeNow(int fd) {
  if (fd < 0) return;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one));  // best effort
}

// The socket of the connection a transfer uses, as libcurl reports it at connect time
// (CURLOPT_SOCKOPTFUNCTION); a reused connection's comes from the previous transfer on the handle
// (HttpEngine keeps it with the idle handle and hands it over in CURLOPT_PRIVATE).
int RecordSocket(void* clientp, curl_socket_t fd, curlsocktype purpose) {
  if (purpose == CURLSOCKTYPE_IPCXN) *static_cast<int*>(clientp) = static_cast<int>(fd);
  return CURL_SOCKOPT_OK;
}

int KnownSocket(CURL* handle) {
  void* p = nullptr;
  if (curl_easy_getinfo(handle, CURLINFO_PRIVATE, &p) != CURLE_OK) return -1;
  return static_cast<int>(reinterpret_cast<intptr_t>(p)) - 1;  // 0: none known
}

size_t WriteBody(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t len = size * nmemb;
  AcknowledgeNow(t->fd);
  long http_status = 0;
  curl_easy_getinfo(t->handle, CURLINFO_RESPONSE_CODE, &http_status);
  if (http_status == 200 && !t->accept_200) {
    // The server ignored Range and is sending the whole file; stop rather than download it.
    t->ignored_range = true;
    return 0;
  }
  if (http_status != 206 && http_status != 200) {
    // An error body (S3's XML, the HTML of a 503): kept for the classifier, never in dst.
    const size_t keep = std::min(len, kMaxErrorBody - std::min(kMaxErrorBody, t->error_body.size()));
    t->error_body.append(data, keep);
    return len;
  }
  if (len > t->capacity - t->written) {
    t->overflow = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  std::memcpy(t->dst + t->written, data, len);
  t->written += len;
  return len;
}

size_t DiscardBody(char*, size_t size, size_t nmemb, void*) { return size * nmemb; }

size_t CaptureHeaders(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t len = size * nmemb;
  absl::string_view line(data, len);
  AcknowledgeNow(t->fd);
  constexpr absl::string_view kRange = "content-range:";
  constexpr absl::string_view kEtag = "etag:";
  if (line.size() > kRange.size() && absl::StartsWithIgnoreCase(line, kRange)) {
    t->content_range = std::string(absl::StripAsciiWhitespace(line.substr(kRange.size())));
  } else if (line.size() > kEtag.size() && absl::StartsWithIgnoreCase(line, kEtag)) {
    t->etag = std::string(absl::StripAsciiWhitespace(line.substr(kEtag.size())));
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

AttemptResult Classify(const Request& request, const ErrorResponse& response) {
  return request.classify ? request.classify(response) : HttpStatusFailure(response);
}

int Progress(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return CancelRequested() ? 1 : 0;
}

}  // namespace

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

AttemptResult HttpStatusFailure(const ErrorResponse& response) {
  const long http_status = response.http_status;
  std::string msg = StrCat(response.request, ": HTTP status ", http_status);
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

absl::Status ValidateHttpOptions(const HttpOptions& options, std::string_view root) {
  if (options.max_attempts < 1 || options.connect_timeout_ms < 1 || options.stall_timeout_ms < 1 ||
      options.min_bytes_per_s < 1 || options.request_timeout_ms < 1 ||
      options.base_backoff_ms < 0 || options.max_backoff_ms < 0 ||
      options.max_idle_connections < 0) {
    return absl::InvalidArgumentError(
        StrCat(root,
               ": invalid HttpOptions (max_attempts, connect_timeout_ms and stall_timeout_ms "
               "must be >= 1; backoffs and max_idle_connections >= 0)"));
  }
  return absl::OkStatus();
}

HttpEngine::HttpEngine(const HttpOptions& options) : options_(options) {}

HttpEngine::~HttpEngine() = default;

StorageStats HttpEngine::stats() const {
  StorageStats s;
  s.reads = reads_.load(std::memory_order_relaxed);
  s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.connections_opened = connections_opened_.load(std::memory_order_relaxed);
  return s;
}

absl::StatusOr<HeadResult> HttpEngine::Head(const Request& request) const {
  const std::string name = RequestName(request.name, 0, 0, /*head=*/true);
  HeadResult result;
  absl::Status status = WithRetries(
      name, [&](CURL* handle) { return HeadAttempt(handle, request, name, &result); });
  if (!status.ok()) return status;
  return result;
}

absl::Status HttpEngine::GetRange(const Request& request, uint64_t file_size, uint64_t offset,
                                  size_t n, char* dst) const {
  const std::string name = RequestName(request.name, offset, n, /*head=*/false);
  absl::Status status = WithRetries(name, [&](CURL* handle) {
    return GetAttempt(handle, request, name, offset, n, offset == 0 && n == file_size, dst);
  });
  if (!status.ok()) return status;
  reads_.fetch_add(1, std::memory_order_relaxed);
  bytes_read_.fetch_add(n, std::memory_order_relaxed);
  return absl::OkStatus();
}

// Runs `attempt` until it succeeds, fails permanently, or max_attempts are spent.
template <typename Attempt>
absl::Status HttpEngine::WithRetries(const std::string& request, Attempt attempt) const {
  // A pipeline worker waiting on the network lends its CPU slot (base/cpu_slots.h) meanwhile.
  ScopedSlotRelease lend;
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
    if (handle == nullptr) return absl::ResourceExhaustedError(request + ": curl_easy_init failed");
    AttemptResult result = attempt(handle.get());
    curl_socket_t fd = CURL_SOCKET_BAD;
    if (curl_easy_getinfo(handle.get(), CURLINFO_ACTIVESOCKET, &fd) != CURLE_OK) fd = CURL_SOCKET_BAD;
    long new_connections = 0;
    if (curl_easy_getinfo(handle.get(), CURLINFO_NUM_CONNECTS, &new_connections) == CURLE_OK &&
        new_connections > 0) {
      connections_opened_.fetch_add(static_cast<uint64_t>(new_connections),
                                    std::memory_order_relaxed);
    }
    ReleaseHandle(std::move(handle), fd == CURL_SOCKET_BAD ? -1 : static_cast<int>(fd));
    if (result.status.ok() || !result.transient) return result.status;
    last = std::move(result.status);
  }
  // The last cause already starts with the request; say how often it was tried.
  return absl::Status(last.code(), StrCat(last.message(), " (gave up after ", max_attempts,
                                          max_attempts == 1 ? " attempt)" : " attempts)"));
}

// Full jitter: uniform in [0, min(max_backoff, base * 2^(retry-1))].
std::chrono::milliseconds HttpEngine::Backoff(int retry) const {
  const int64_t base = std::max(0, options_.base_backoff_ms);
  const int64_t cap = std::max(0, options_.max_backoff_ms);
  int64_t ceiling = base;
  for (int i = 1; i < retry && ceiling < cap; ++i) ceiling *= 2;
  ceiling = std::min(ceiling, cap);
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::uniform_int_distribution<int64_t> dist(0, ceiling);
  return std::chrono::milliseconds(dist(rng));
}

CurlHandle HttpEngine::AcquireHandle() const {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      CurlHandle handle = std::move(idle_.back().first);
      const int fd = idle_.back().second;
      idle_.pop_back();
      curl_easy_reset(handle.get());
      // The socket of the connection it keeps open, for KnownSocket (0: none).
      curl_easy_setopt(handle.get(), CURLOPT_PRIVATE, reinterpret_cast<void*>(intptr_t{fd} + 1));
      return handle;
    }
  }
  return CurlHandle(curl_easy_init());
}

void HttpEngine::ReleaseHandle(CurlHandle handle, int fd) const {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < static_cast<size_t>(std::max(0, options_.max_idle_connections))) {
    idle_.emplace_back(std::move(handle), fd);
  }
  // Otherwise `handle` is freed here, closing its connection.
}

// Options every request sets; the handle was just reset or created.
void HttpEngine::Configure(CURL* handle, const std::string& url, char* error_buffer) const {
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

AttemptResult HttpEngine::Authorize(const Request& request, CURL* handle,
                                    CurlHeaders* headers) const {
  if (!request.authorize) return {absl::OkStatus()};
  absl::Status s = request.authorize(handle, headers);
  if (!s.ok()) return Permanent(std::move(s));
  if (*headers != nullptr) curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers->get());
  return {absl::OkStatus()};
}

AttemptResult HttpEngine::HeadAttempt(CURL* handle, const Request& request,
                                      const std::string& name, HeadResult* out) const {
  char error_buffer[CURL_ERROR_SIZE];
  Configure(handle, request.url, error_buffer);
  Transfer t;
  t.handle = handle;
  t.fd = KnownSocket(handle);
  curl_easy_setopt(handle, CURLOPT_SOCKOPTFUNCTION, &RecordSocket);
  curl_easy_setopt(handle, CURLOPT_SOCKOPTDATA, &t.fd);
  curl_easy_setopt(handle, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &DiscardBody);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, &CaptureHeaders);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &t);
  CurlHeaders headers;
  if (AttemptResult a = Authorize(request, handle, &headers); !a.status.ok()) return a;
  CURLcode code = curl_easy_perform(handle);
  if (code != CURLE_OK) return CurlFailure(code, error_buffer, name);
  long http_status = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &http_status);
  if (http_status != 200) return Classify(request, {http_status, {}, name});
  curl_off_t length = -1;
  curl_easy_getinfo(handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  if (length < 0) {
    return Permanent(absl::FailedPreconditionError(
        StrCat(name, ": the response has no Content-Length, so the size is unknown")));
  }
  out->size = static_cast<uint64_t>(length);
  out->etag = std::move(t.etag);
  return {absl::OkStatus()};
}

AttemptResult HttpEngine::GetAttempt(CURL* handle, const Request& request,
                                     const std::string& name, uint64_t offset, size_t n,
                                     bool whole_file, char* dst) const {
  char error_buffer[CURL_ERROR_SIZE];
  Configure(handle, request.url, error_buffer);
  const uint64_t last = offset + n - 1;
  const std::string range = StrCat(offset, "-", last);
  Transfer t;
  t.handle = handle;
  t.fd = KnownSocket(handle);
  curl_easy_setopt(handle, CURLOPT_SOCKOPTFUNCTION, &RecordSocket);
  curl_easy_setopt(handle, CURLOPT_SOCKOPTDATA, &t.fd);
  t.dst = dst;
  t.capacity = n;
  t.accept_200 = whole_file;
  curl_easy_setopt(handle, CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &WriteBody);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, &CaptureHeaders);
  curl_easy_setopt(handle, CURLOPT_HEADERDATA, &t);
  CurlHeaders headers;
  if (AttemptResult a = Authorize(request, handle, &headers); !a.status.ok()) return a;
  CURLcode code = curl_easy_perform(handle);
  if (t.overflow) {
    return Permanent(absl::DataLossError(
        StrCat(name, ": the server sent more than the ", n, " bytes asked for")));
  }
  if (t.ignored_range) {
    return Permanent(absl::FailedPreconditionError(
        StrCat(name,
               ": the server ignored the Range header and answered 200 with the whole file; "
               "Conveyor needs a server that supports range requests")));
  }
  if (code != CURLE_OK) return CurlFailure(code, error_buffer, name);
  long http_status = 0;
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &http_status);
  if (http_status != 206 && !(http_status == 200 && whole_file)) {
    return Classify(request, {http_status, t.error_body, name});
  }
  if (http_status == 206 && !ContentRangeMatches(t.content_range, offset, last)) {
    return Permanent(absl::DataLossError(
        StrCat(name, ": the server answered with Content-Range '", t.content_range, "'")));
  }
  if (t.written < n) {
    return Transient(
        absl::UnavailableError(StrCat(name, ": short body, ", t.written, " of ", n, " bytes")));
  }
  return {absl::OkStatus()};
}

absl::Status RemoteFile::Read(uint64_t offset, size_t n, char* dst) const {
  if (offset > size_ || n > size_ - offset) {
    return absl::OutOfRangeError(StrCat(request_.name, ": read of ", n, " bytes at offset ", offset,
                                        " is past the end of the file (", size_, " bytes)"));
  }
  if (n == 0) {
    engine_->CountEmptyRead();
    return absl::OkStatus();
  }
  return engine_->GetRange(request_, size_, offset, n, dst);
}

}  // namespace conveyor::http_internal
