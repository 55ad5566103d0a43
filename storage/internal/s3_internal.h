// The pieces of the S3 backend that need no network, apart so that tests can check them: URL
// encoding, s3:// parsing, the AWS shared config files, resolving endpoint, region and
// credentials as AWS's tools do, and reading S3's XML error bodies.
//
// INTERNAL header: only storage/*.cc and tests include it.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/storage.h"

namespace conveyor::s3_internal {

// RFC 3986 percent-encoding as SigV4 wants it: A-Z a-z 0-9 - . _ ~ stay, every other byte is
// %XX (upper-case hex); '/' stays when `keep_slash` (an object key in a path).
std::string UriEncode(std::string_view s, bool keep_slash);

struct S3Location {
  std::string bucket;
  std::string prefix;  // "" or ending in '/'
};
// "s3://bucket/prefix" -> {bucket, "prefix/"}. INVALID_ARGUMENT for a missing or malformed bucket.
absl::StatusOr<S3Location> ParseS3Uri(std::string_view uri);

// An INI file as AWS writes them: [section] headers, key = value lines, '#' and ';' comments,
// and nested blocks ("s3 =" followed by indented "addressing_style = path", read as
// "s3.addressing_style"). Keys are lower-cased; values trimmed.
using IniFile = std::map<std::string, std::map<std::string, std::string>>;
IniFile ParseIni(std::string_view text);

// Looks up an environment variable; nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup ProcessEnvironment();

struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;  // never in a message
  std::string session_token;      // never in a message; "" when none
  std::optional<std::time_t> expiration;  // from credential_process, when it says
};

// Where credentials come from, resolved once; Get() runs a credential_process again shortly
// before what it gave expires. Thread-safe.
class CredentialSource {
 public:
  enum class Kind { kAnonymous, kStatic, kProcess };
  static std::shared_ptr<CredentialSource> Anonymous();
  static std::shared_ptr<CredentialSource> Static(S3Credentials credentials, std::string origin);
  static std::shared_ptr<CredentialSource> Process(std::string command, std::string origin);

  CredentialSource(const CredentialSource&) = delete;
  CredentialSource& operator=(const CredentialSource&) = delete;

  Kind kind() const { return kind_; }
  // Where they came from, for messages: "the environment (AWS_ACCESS_KEY_ID,
  // AWS_SECRET_ACCESS_KEY)", "profile 'x' in /home/u/.aws/credentials", ...
  const std::string& origin() const { return origin_; }
  // REQUIRES: kind() != kAnonymous.
  absl::StatusOr<S3Credentials> Get() const;

 private:
  CredentialSource(Kind kind, std::string origin) : kind_(kind), origin_(std::move(origin)) {}
  absl::StatusOr<S3Credentials> RunProcess() const;

  const Kind kind_;
  const std::string origin_;
  std::string command_;  // kProcess
  mutable absl::Mutex mu_;
  mutable std::optional<S3Credentials> cached_ ABSL_GUARDED_BY(mu_);
};

// Parses credential_process output (JSON with Version 1, AccessKeyId, SecretAccessKey and
// optional SessionToken, Expiration). Messages never quote the output.
absl::StatusOr<S3Credentials> ParseProcessCredentials(std::string_view json,
                                                      std::string_view origin);

// Everything the backend needs to address and sign requests.
struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  bool custom_endpoint = false;
  std::string region;
  bool path_style = true;
  std::shared_ptr<CredentialSource> credentials;  // never null once resolved
};

// Resolves `options` against the environment and the shared config files, in AWS's order.
// `bucket` decides whether virtual-hosted addressing is possible.
absl::StatusOr<S3Config> ResolveS3Config(const S3Options& options, std::string_view bucket,
                                         const EnvLookup& env);

// The URL of `key` in `bucket`, the key percent-encoded (SigV4 signs the path as sent).
std::string ObjectUrl(const S3Config& config, std::string_view bucket, std::string_view key);

// <Code> and <Message> of an S3 XML error body; empty strings when absent.
struct S3Error {
  std::string code;
  std::string message;
};
S3Error ParseS3Error(std::string_view body);

// An access key id shown in messages: its last 4 characters only ("...WXYZ").
std::string MaskKeyId(std::string_view access_key_id);

}  // namespace conveyor::s3_internal
