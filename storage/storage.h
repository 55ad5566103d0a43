// Storage: byte-range reads from local disk or HTTP(S), behind one interface.
//
// A dataset lives under a root (a directory path, file://..., http(s)://host/prefix/,
// s3://bucket/prefix/). Everything Conveyor reads is a range read of a file under that root.
// Remote roots can go through a node-local cache of byte ranges (StorageCacheOptions).
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
  // What identifies this version of the file's bytes when the backend knows it (an HTTP or S3
  // ETag), else "". A cache keys its entries by it, so a rewritten object is never served stale.
  virtual std::string version() const { return {}; }
};

// Counters a backend keeps; read them for metrics and tests. All monotonically increasing.
struct StorageStats {
  uint64_t reads = 0;             // completed Read calls
  uint64_t bytes_read = 0;        // payload bytes returned
  uint64_t retries = 0;           // requests retried after a transient failure
  uint64_t connections_opened = 0;  // HTTP: new TCP connections (reuse keeps this low)
  // The node-local cache (StorageCacheOptions), when there is one; `reads`, `bytes_read` and
  // the rest above then count what the backend behind it did.
  uint64_t cache_hits = 0;           // blocks served from the cache
  uint64_t cache_misses = 0;         // blocks fetched from the backend
  uint64_t cache_hit_bytes = 0;      // bytes of blocks served from the cache
  uint64_t cache_fill_bytes = 0;     // bytes of blocks written to the cache
  uint64_t cache_corrupt = 0;        // entries that failed their checksum (removed, re-fetched)
  uint64_t cache_evicted_bytes = 0;  // bytes this process evicted to keep the bound
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

// Options of the S3 backend. Each empty field is looked up as AWS's own tools do; see
// docs/storage.md for the order.
struct S3Options {
  // The service's URL, e.g. "http://127.0.0.1:7480" (radosgw, MinIO) or
  // "https://s3.eu-west-1.amazonaws.com". Empty: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
  // profile's endpoint_url, then https://s3.REGION.amazonaws.com.
  std::string endpoint;
  // Empty: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, then us-east-1.
  std::string region;
  // The profile in ~/.aws/credentials and ~/.aws/config. Empty: AWS_PROFILE, then "default".
  std::string profile;
  // "path" (http://endpoint/bucket/key), "virtual" (http://bucket.endpoint/key) or "auto":
  // virtual-hosted on AWS's own endpoints when the bucket name allows it, path-style on custom
  // endpoints (what radosgw, MinIO and most S3-compatible stores answer). Empty:
  // CONVEYOR_S3_ADDRESSING, the profile's s3.addressing_style, then "auto".
  std::string addressing;
  // Unsigned requests, for public buckets. Also turned on by AWS_NO_SIGN_REQUEST=true.
  bool anonymous = false;
};

// The node-local cache of byte ranges in front of a remote (HTTP, S3) root: files in a directory
// shared by every process on the node, bounded in bytes (least recently used evicted first),
// each entry published atomically and checksum-verified on every read. Local roots never use it.
struct StorageCacheOptions {
  // Empty: CONVEYOR_CACHE_DIR; when that is empty too there is no cache. Private to this uid
  // (0700; one owned by another user is refused) unless shared_key_file is given.
  std::string dir;
  // Empty: CONVEYOR_CACHE_SHARED_KEY. A node secret (32+ random bytes, readable by the group that
  // shares `dir`, not by every user): `dir` is then a group-shared cache whose entries carry a MAC
  // under it (base/cache_dir.h, docs/serving.md "Shared nodes").
  std::string shared_key_file;
  // The bound on the bytes of entries in `dir`, shared by every process using it. 0:
  // CONVEYOR_CACHE_BYTES, then 10 GiB.
  uint64_t max_bytes = 0;
  // Files are cached in aligned blocks of this size (a small file is one block). Larger blocks
  // mean fewer requests and more bytes read around a small read. Every process sharing `dir`
  // must use the same value (it is part of each entry's key).
  uint32_t block_bytes = 1u << 20;
  // A run of missing blocks (a read plus its read-ahead) of at least 2 x kMinPartBlocks blocks is
  // fetched as up to this many range requests at once, each of consecutive blocks, so one
  // remote scan keeps several connections busy (a single S3/HTTP stream is bound by its
  // round-trips and window, not the link). 1: one request per run.
  uint32_t parallel_ranges = 4;
};

// Everything OpenStorage needs. HTTP options apply to S3 too (it is HTTP underneath).
struct StorageOptions {
  HttpOptions http;
  S3Options s3;
  StorageCacheOptions cache;
};

// `uri` with any user:password@ removed, for messages, logs, metrics and Info responses: a
// credential in a dataset URL never leaves the process that was given it.
std::string RedactUri(std::string_view uri);

// Opens the root named by `uri`: a local path, file://PATH, http://..., https://...,
// s3://bucket/prefix/. HTTP and S3 roots go through the node-local cache when one is configured
// (in `options.cache` or CONVEYOR_CACHE_DIR).
absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(std::string_view uri,
                                                     const StorageOptions& options);
absl::StatusOr<std::unique_ptr<Storage>> OpenStorage(std::string_view uri,
                                                     const HttpOptions& http = {});

std::unique_ptr<Storage> NewLocalStorage(std::string root_dir);
// `base_url` is the URL of the root; a '/' is appended when missing.
absl::StatusOr<std::unique_ptr<Storage>> NewHttpStorage(std::string base_url,
                                                        const HttpOptions& options);
// `uri` is s3://bucket/prefix/ (a '/' is appended to a non-empty prefix when missing). Resolves
// the endpoint, region and credentials now (docs/storage.md); an error says what was missing.
absl::StatusOr<std::unique_ptr<Storage>> NewS3Storage(std::string_view uri,
                                                      const S3Options& s3,
                                                      const HttpOptions& http);
// Wraps a remote `backend` with the node-local cache. `root` names the backend's root in the
// cache's keys (the URI it was opened by, without credentials). Fails when `options.dir`
// cannot be created or written.
absl::StatusOr<std::unique_ptr<Storage>> NewCachingStorage(std::unique_ptr<Storage> backend,
                                                           std::string root,
                                                           const StorageCacheOptions& options);

// Reads a whole file (for small files such as the manifest). A file larger than `max_bytes` is
// an error naming it, its size and the cap, before anything is allocated: a lying
// Content-Length cannot make the process allocate it.
absl::StatusOr<std::string> ReadWholeFile(Storage& storage, std::string_view relpath,
                                          uint64_t max_bytes = 256ull << 20);

// Reads a small local file (a config, a token, a certificate); NOT_FOUND names `what` and `path`.
absl::StatusOr<std::string> ReadLocalFile(const std::string& path, std::string_view what);

// A bearer token file (--auth-token-file): its text without leading and trailing whitespace (a
// final newline, CRLF, spaces). The one rule for the server and every client, so a token file that
// works for one works for all.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace conveyor
