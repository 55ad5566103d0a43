// Storage: byte-range reads from local disk or HTTP(S), behind one interface.
//
// A dataset lives under a root (a directory path, file://..., http(s)://host/prefix/, later
// s3://bucket/prefix/). Everything Conveyor reads is a range read of a file under that root.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor {

// An open file of known size. Thread-safe: Read may be called concurrently from many threads.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;

  // Reads exactly `n` bytes at `offset` into `dst` (which must hold n bytes). Reading past the end
  // is an OUT_OF_RANGE error naming the file, the range and the file size; a short read from the
  // backend is an error, never a silent partial result.
  virtual absl::Status Read(uint64_t offset, size_t n, char* dst) const = 0;

  virtual uint64_t size() const = 0;
  // The full path or URL, used in every error message about this file.
  virtual const std::string& name() const = 0;
};

// Counters a backend keeps; read them for metrics and tests. All monotonically increasing.
struct StorageStats {
  uint64_t reads = 0;             // completed Read calls
  uint64_t bytes_read = 0;        // payload bytes returned
  uint64_t retries = 0;           // requests retried after a transient failure
  uint64_t connections_opened = 0;  // HTTP: new TCP connections (reuse keeps this low)
};

// A root under which files are opened. Thread-safe. A Storage must outlive every file opened
// from it (files share its connection pool and counters).
class Storage {
 public:
  virtual ~Storage() = default;

  // Opens `relpath` (relative to the root, '/'-separated). NOT_FOUND when it does not exist.
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) = 0;

  // The full path or URL of `relpath` under this root, for messages.
  virtual std::string Describe(std::string_view relpath) const = 0;

  virtual StorageStats stats() const = 0;
};

// Options of the HTTP backend. Defaults suit a nearby object store or an nginx on the same rack.
struct HttpOptions {
  // Time to establish a TCP (and TLS) connection.
  int connect_timeout_ms = 5000;
  // A transfer slower than `min_bytes_per_s` for this long is abandoned (and retried): a store
  // trickling bytes holds a worker no longer than this per attempt.
  int stall_timeout_ms = 10000;
  int min_bytes_per_s = 1024;
  // Deadline of one attempt (connect, request and the whole body), however fast bytes arrive.
  int request_timeout_ms = 120000;
  // Attempts per request, the first included. Retries happen on 5xx, 408, 429, connection
  // resets, a body cut short, and timeouts; never on other 4xx.
  int max_attempts = 5;
  // Backoff before retry k (1-based) is uniform in [0, min(max_backoff, base * 2^(k-1))]
  // ("full jitter"), so many clients that failed together do not retry together.
  int base_backoff_ms = 50;
  int max_backoff_ms = 2000;
  // Idle connections kept per storage root for reuse.
  int max_idle_connections = 16;
};

// `uri` with any user:password@ removed, for messages, logs, metrics and Info responses: a
// credential in a dataset URL never leaves the process that was given it.
std::string RedactUri(std::string_view uri);

// Opens the root named by `uri`: a local path, file://PATH, http://..., https://...
// s3:// is recognised and answered with UNIMPLEMENTED (planned backend).
absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(std::string_view uri,
                                                     const HttpOptions& http = {});

std::unique_ptr<Storage> NewLocalStorage(std::string root_dir);
// `base_url` is the URL of the root; a '/' is appended when missing.
absl::StatusOr<std::unique_ptr<Storage>> NewHttpStorage(std::string base_url,
                                                        const HttpOptions& options);

// Reads a whole file (for small files such as the manifest). A file larger than `max_bytes` is
// an error naming it, its size and the cap, before anything is allocated: a lying
// Content-Length cannot make the process allocate it.
absl::StatusOr<std::string> ReadWholeFile(Storage& storage, std::string_view relpath,
                                          uint64_t max_bytes = 256ull << 20);

// Reads a small local file (a config, a token, a certificate); NOT_FOUND names `what` and `path`.
absl::StatusOr<std::string> ReadLocalFile(const std::string& path, std::string_view what);

}  // namespace conveyor
