// The S3 backend: HEAD for sizes and range GETs, signed with SigV4, through the request engine
// the HTTP backend uses (storage/internal/http_engine.h: connection reuse, retries, deadlines,
// cancellation).
//
// Signing is libcurl's (CURLOPT_AWS_SIGV4). libcurl 7.88 signs the path exactly as given and
// does not add x-amz-content-sha256, so keys are percent-encoded here (RFC 3986, as SigV4's
// canonical URI wants) and every request carries `x-amz-content-sha256: UNSIGNED-PAYLOAD`
// (bodiless GETs and HEADs; libcurl signs the header's value as the payload hash).
//
// Secrets: the secret key and session token go to libcurl only (CURLOPT_PASSWORD, a header
// line), never into a name, message or log; messages name the access key id by its last four
// characters and say where the credentials came from, so a user knows what to check.
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "nlohmann/json.hpp"
#include "storage/internal/http_engine.h"
#include "storage/internal/s3_internal.h"
#include "storage/storage.h"

namespace conveyor {
namespace s3_internal {
namespace {

bool IsUnreserved(unsigned char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

std::string Trim(std::string_view s) {
  absl::string_view v(s.data(), s.size());
  return std::string(absl::StripAsciiWhitespace(v));
}

bool IsTrue(const std::optional<std::string>& v) {
  if (!v) return false;
  const std::string s = absl::AsciiStrToLower(Trim(*v));
  return s == "true" || s == "1" || s == "yes";
}

// Bucket names that can be a DNS label under an endpoint (and match a TLS wildcard: no dots).
bool VirtualHostable(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) return false;
  for (char c : bucket) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return bucket.front() != '-' && bucket.back() != '-';
}

std::string ExpandHome(const std::string& path, const EnvLookup& env) {
  if (path.starts_with("~/")) {
    if (std::optional<std::string> home = env("HOME")) return *home + path.substr(1);
  }
  return path;
}

std::string NonEmpty(const std::optional<std::string>& v) { return v ? Trim(*v) : std::string(); }

// A profile's keys from both files: the credentials file's [NAME] over the config file's
// [profile NAME] ([default] in both).
struct Profile {
  std::string name;
  std::string credentials_path;
  std::string config_path;
  std::map<std::string, std::string> credentials;  // from the credentials file
  std::map<std::string, std::string> config;       // from the config file
  bool found = false;
};

Profile LoadProfile(std::string name, const EnvLookup& env) {
  Profile p;
  p.name = std::move(name);
  p.credentials_path = ExpandHome(
      NonEmpty(env("AWS_SHARED_CREDENTIALS_FILE")).empty() ? "~/.aws/credentials"
                                                            : NonEmpty(env("AWS_SHARED_CREDENTIALS_FILE")),
      env);
  p.config_path = ExpandHome(
      NonEmpty(env("AWS_CONFIG_FILE")).empty() ? "~/.aws/config" : NonEmpty(env("AWS_CONFIG_FILE")),
      env);
  if (absl::StatusOr<std::string> text = ReadLocalFile(p.credentials_path, "credentials");
      text.ok()) {
    IniFile ini = ParseIni(*text);
    if (auto it = ini.find(p.name); it != ini.end()) {
      p.credentials = it->second;
      p.found = true;
    }
  }
  if (absl::StatusOr<std::string> text = ReadLocalFile(p.config_path, "config"); text.ok()) {
    IniFile ini = ParseIni(*text);
    auto it = ini.find(p.name == "default" ? "default" : "profile " + p.name);
    if (it == ini.end() && p.name == "default") it = ini.find("profile default");
    if (it != ini.end()) {
      p.config = it->second;
      p.found = true;
    }
  }
  return p;
}

std::string Lookup(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? std::string() : it->second;
}

// "2026-11-24T03:00:00Z" (fractions and offsets other than UTC are not expected from AWS tools).
std::optional<std::time_t> ParseIso8601Utc(std::string_view s) {
  if (s.size() < 19) return std::nullopt;
  std::tm tm{};
  const std::string head(s.substr(0, 19));
  const char* end = strptime(head.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr || *end != '\0') return std::nullopt;
  return timegm(&tm);
}

}  // namespace

std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

absl::StatusOr<S3Location> ParseS3Uri(std::string_view uri) {
  std::string_view rest = uri;
  if (!rest.starts_with("s3://")) {
    return absl::InvalidArgumentError(StrCat(uri, ": an S3 root must start with s3://"));
  }
  rest.remove_prefix(5);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) loc.prefix = std::string(rest.substr(slash + 1));
  const bool bucket_ok =
      loc.bucket.size() >= 3 && loc.bucket.size() <= 255 &&
      std::all_of(loc.bucket.begin(), loc.bucket.end(), [](char c) {
        return absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_';
      });
  if (!bucket_ok) {
    return absl::InvalidArgumentError(
        StrCat(uri, ": '", loc.bucket,
               "' is not a bucket name (3 to 255 letters, digits, '-', '.', '_'); expected "
               "s3://BUCKET/PREFIX/"));
  }
  while (loc.prefix.starts_with('/')) loc.prefix.erase(0, 1);
  if (!loc.prefix.empty() && loc.prefix.back() != '/') loc.prefix.push_back('/');
  return loc;
}

IniFile ParseIni(std::string_view text) {
  IniFile ini;
  std::string section;
  std::string nested;  // "s3" while inside "s3 =" followed by indented lines
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    const bool indented = !raw.empty() && (raw.front() == ' ' || raw.front() == '\t');
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = std::string(absl::StripAsciiWhitespace(line.substr(1, line.size() - 2)));
      // "[profile   x]" -> "profile x"
      if (absl::StartsWith(section, "profile ")) {
        section = "profile " + std::string(absl::StripAsciiWhitespace(
                                   absl::string_view(section).substr(8)));
      }
      ini[section];
      nested.clear();
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    if (!indented) nested.clear();
    if (!indented && value.empty()) {
      nested = key;
      continue;
    }
    if (indented && !nested.empty()) key = nested + "." + key;
    ini[section][key] = std::move(value);
  }
  return ini;
}

EnvLookup ProcessEnvironment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string MaskKeyId(std::string_view id) {
  if (id.size() <= 4) return "...";
  return StrCat("...", id.substr(id.size() - 4));
}

std::shared_ptr<CredentialSource> CredentialSource::Anonymous() {
  return std::shared_ptr<CredentialSource>(
      new CredentialSource(Kind::kAnonymous, "none (unsigned requests)"));
}

std::shared_ptr<CredentialSource> CredentialSource::Static(S3Credentials credentials,
                                                           std::string origin) {
  std::shared_ptr<CredentialSource> s(new CredentialSource(Kind::kStatic, std::move(origin)));
  absl::MutexLock lock(&s->mu_);
  s->cached_ = std::move(credentials);
  return s;
}

std::shared_ptr<CredentialSource> CredentialSource::Process(std::string command,
                                                            std::string origin) {
  std::shared_ptr<CredentialSource> s(new CredentialSource(Kind::kProcess, std::move(origin)));
  s->command_ = std::move(command);
  return s;
}

absl::StatusOr<S3Credentials> CredentialSource::Get() const {
  absl::MutexLock lock(&mu_);
  if (kind_ == Kind::kAnonymous) {
    return absl::InternalError("S3: credentials asked of an anonymous source");
  }
  // A process's credentials are renewed 5 minutes before they expire, as the AWS SDKs do.
  const bool fresh = cached_.has_value() &&
                     (!cached_->expiration || *cached_->expiration - std::time(nullptr) > 300);
  if (fresh || kind_ == Kind::kStatic) return *cached_;
  ASSIGN_OR_RETURN(S3Credentials c, RunProcess());
  cached_ = c;
  return c;
}

absl::StatusOr<S3Credentials> CredentialSource::RunProcess() const {
  // The command is the user's own (from their config file), run through the shell as the AWS
  // tools run it. Its stdout is read in full; its stderr goes to ours.
  struct PipeCloser {
    void operator()(FILE* f) const {
      if (f != nullptr) pclose(f);
    }
  };
  FILE* raw = popen(command_.c_str(), "r");
  if (raw == nullptr) {
    return absl::UnavailableError(
        StrCat("S3 credentials: cannot run the credential_process of ", origin_, ": ",
               std::strerror(errno)));
  }
  std::string out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, raw)) > 0 && out.size() < (1u << 20)) out.append(buf, got);
  const int status = pclose(raw);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnauthenticatedError(StrCat(
        "S3 credentials: the credential_process of ", origin_, " failed (exit status ",
        WIFEXITED(status) ? WEXITSTATUS(status) : -1, "); run it by hand to see why"));
  }
  return ParseProcessCredentials(out, origin_);
}

absl::StatusOr<S3Credentials> ParseProcessCredentials(std::string_view json,
                                                      std::string_view origin) {
  // Messages say which field is wrong, never the text (it holds the secret).
  const std::string where = StrCat("S3 credentials: the output of the credential_process of ", origin);
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::UnauthenticatedError(StrCat(where, " is not a JSON object"));
  if (!j.contains("Version") || j["Version"] != 1) {
    return absl::UnauthenticatedError(StrCat(where, " has no \"Version\": 1"));
  }
  S3Credentials c;
  for (const auto& [field, dst] : {std::pair<const char*, std::string*>{"AccessKeyId", &c.access_key_id},
                                   {"SecretAccessKey", &c.secret_access_key},
                                   {"SessionToken", &c.session_token}}) {
    if (j.contains(field) && j[field].is_string()) *dst = j[field].get<std::string>();
  }
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::UnauthenticatedError(
        StrCat(where, " lacks AccessKeyId or SecretAccessKey"));
  }
  if (j.contains("Expiration") && j["Expiration"].is_string()) {
    c.expiration = ParseIso8601Utc(j["Expiration"].get<std::string>());
    if (!c.expiration) {
      return absl::UnauthenticatedError(
          StrCat(where, " has an Expiration that is not an ISO 8601 UTC time"));
    }
  }
  return c;
}

absl::StatusOr<S3Config> ResolveS3Config(const S3Options& options, std::string_view bucket,
                                         const EnvLookup& env) {
  std::string profile_name = options.profile;
  if (profile_name.empty()) profile_name = NonEmpty(env("AWS_PROFILE"));
  if (profile_name.empty()) profile_name = NonEmpty(env("AWS_DEFAULT_PROFILE"));
  const bool profile_explicit = !profile_name.empty();
  if (profile_name.empty()) profile_name = "default";
  const Profile profile = LoadProfile(profile_name, env);
  if (profile_explicit && !profile.found) {
    return absl::NotFoundError(StrCat("S3: profile '", profile_name, "' is in neither ",
                                      profile.credentials_path, " nor ", profile.config_path,
                                      " (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE)"));
  }
  auto setting = [&](const std::string& key) {
    std::string v = Lookup(profile.config, key);
    return v.empty() ? Lookup(profile.credentials, key) : v;
  };

  S3Config c;
  c.credentials = CredentialSource::Anonymous();
  c.region = options.region;
  if (c.region.empty()) c.region = NonEmpty(env("AWS_REGION"));
  if (c.region.empty()) c.region = NonEmpty(env("AWS_DEFAULT_REGION"));
  if (c.region.empty()) c.region = setting("region");
  if (c.region.empty()) c.region = "us-east-1";

  c.endpoint = options.endpoint;
  if (c.endpoint.empty()) c.endpoint = NonEmpty(env("AWS_ENDPOINT_URL_S3"));
  if (c.endpoint.empty()) c.endpoint = NonEmpty(env("AWS_ENDPOINT_URL"));
  if (c.endpoint.empty()) c.endpoint = setting("s3.endpoint_url");
  if (c.endpoint.empty()) c.endpoint = setting("endpoint_url");
  c.custom_endpoint = !c.endpoint.empty();
  if (c.endpoint.empty()) c.endpoint = StrCat("https://s3.", c.region, ".amazonaws.com");
  if (!c.endpoint.starts_with("http://") && !c.endpoint.starts_with("https://")) {
    return absl::InvalidArgumentError(StrCat("S3: endpoint '", RedactUri(c.endpoint),
                                             "' must start with http:// or https://"));
  }
  while (c.endpoint.ends_with('/')) c.endpoint.pop_back();
  if (c.endpoint.find('/', c.endpoint.find("://") + 3) != std::string::npos) {
    return absl::InvalidArgumentError(StrCat("S3: endpoint '", RedactUri(c.endpoint),
                                             "' must be scheme://host[:port], without a path"));
  }

  std::string addressing = options.addressing;
  if (addressing.empty()) addressing = NonEmpty(env("CONVEYOR_S3_ADDRESSING"));
  if (addressing.empty()) addressing = setting("s3.addressing_style");
  if (addressing.empty()) addressing = "auto";
  if (addressing == "path") {
    c.path_style = true;
  } else if (addressing == "virtual") {
    if (!VirtualHostable(bucket)) {
      return absl::InvalidArgumentError(StrCat(
          "S3: bucket '", bucket,
          "' cannot be addressed virtual-hosted (not a lower-case DNS label without dots); use "
          "path-style addressing"));
    }
    c.path_style = false;
  } else if (addressing == "auto") {
    c.path_style = c.custom_endpoint || !VirtualHostable(bucket);
  } else {
    return absl::InvalidArgumentError(
        StrCat("S3: addressing '", addressing, "' is not one of path, virtual, auto"));
  }

  if (options.anonymous || IsTrue(env("AWS_NO_SIGN_REQUEST"))) {
    c.credentials = CredentialSource::Anonymous();
    return c;
  }
  const std::string env_id = NonEmpty(env("AWS_ACCESS_KEY_ID"));
  const std::string env_secret = NonEmpty(env("AWS_SECRET_ACCESS_KEY"));
  if (!env_id.empty() || !env_secret.empty()) {
    if (env_id.empty() || env_secret.empty()) {
      return absl::UnauthenticatedError(
          "S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together "
          "(one of them is empty)");
    }
    S3Credentials cred{env_id, env_secret, NonEmpty(env("AWS_SESSION_TOKEN")), std::nullopt};
    std::string origin = cred.session_token.empty()
                             ? "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
                             : "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                               "AWS_SESSION_TOKEN)";
    c.credentials = CredentialSource::Static(std::move(cred), std::move(origin));
    return c;
  }
  // The profile: static keys (credentials file first), then credential_process.
  for (const auto& [file, path] :
       {std::pair{&profile.credentials, &profile.credentials_path},
        std::pair{&profile.config, &profile.config_path}}) {
    const std::string id = Lookup(*file, "aws_access_key_id");
    const std::string secret = Lookup(*file, "aws_secret_access_key");
    if (id.empty() && secret.empty()) continue;
    const std::string origin = StrCat("profile '", profile.name, "' in ", *path);
    if (id.empty() || secret.empty()) {
      return absl::UnauthenticatedError(StrCat(
          "S3 credentials: ", origin, " has only one of aws_access_key_id and aws_secret_access_key"));
    }
    c.credentials = CredentialSource::Static(
        S3Credentials{id, secret, Lookup(*file, "aws_session_token"), std::nullopt}, origin);
    return c;
  }
  if (const std::string process = setting("credential_process"); !process.empty()) {
    c.credentials = CredentialSource::Process(
        process, StrCat("profile '", profile.name, "' (credential_process in ",
                        Lookup(profile.config, "credential_process").empty()
                            ? profile.credentials_path
                            : profile.config_path,
                        ")"));
    return c;
  }
  if (!setting("role_arn").empty() || !setting("sso_start_url").empty() ||
      !setting("sso_session").empty() || !setting("web_identity_token_file").empty()) {
    return absl::UnimplementedError(StrCat(
        "S3 credentials: profile '", profile.name,
        "' uses role assumption or SSO, which Conveyor does not do itself; export the "
        "credentials (e.g. `aws configure export-credentials --format env`) or use a "
        "credential_process"));
  }
  return absl::UnauthenticatedError(StrCat(
      "S3 credentials: none found. Looked in the environment (AWS_ACCESS_KEY_ID and "
      "AWS_SECRET_ACCESS_KEY), then profile '", profile.name, "' in ", profile.credentials_path,
      " and ", profile.config_path,
      " (static keys or credential_process). Set one of them, or AWS_NO_SIGN_REQUEST=true for a "
      "public bucket (instance metadata and SSO are not queried)"));
}

std::string ObjectUrl(const S3Config& config, std::string_view bucket, std::string_view key) {
  const std::string path = UriEncode(key, /*keep_slash=*/true);
  if (config.path_style) return StrCat(config.endpoint, "/", bucket, "/", path);
  const size_t host = config.endpoint.find("://") + 3;
  return StrCat(config.endpoint.substr(0, host), bucket, ".", config.endpoint.substr(host), "/",
                path);
}

S3Error ParseS3Error(std::string_view body) {
  auto element = [&](std::string_view tag) {
    const std::string open = StrCat("<", tag, ">");
    const std::string close = StrCat("</", tag, ">");
    const size_t a = body.find(open);
    if (a == std::string_view::npos) return std::string();
    const size_t start = a + open.size();
    const size_t b = body.find(close, start);
    if (b == std::string_view::npos) return std::string();
    // Bounded: a message is for a human, not a place for a server to dump a page.
    return std::string(body.substr(start, std::min<size_t>(b - start, 300)));
  };
  return {element("Code"), element("Message")};
}

}  // namespace s3_internal

namespace {

using http_internal::AttemptResult;
using http_internal::CurlHeaders;
using http_internal::ErrorResponse;
using http_internal::HttpEngine;
using http_internal::Permanent;
using http_internal::RemoteFile;
using http_internal::Request;
using http_internal::Transient;
using s3_internal::CredentialSource;
using s3_internal::S3Config;

// Thread-safe: the engine and the credential source are; the rest is constant.
class S3Storage final : public Storage {
 public:
  S3Storage(s3_internal::S3Location location, S3Config config, const HttpOptions& http)
      : location_(std::move(location)),
        config_(std::move(config)),
        sigv4_(StrCat("aws:amz:", config_.region, ":s3")),
        engine_(http) {}

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Open(std::string_view relpath) override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    Request request = MakeRequest(StrCat(location_.prefix, relpath));
    absl::StatusOr<http_internal::HeadResult> head = engine_.Head(request);
    if (!head.ok()) {
      // A HEAD error has no body, so it cannot say which S3 error it was (a wrong secret and a
      // missing key can both be a bare 403): one range GET of the first byte asks again, and its
      // XML error names the cause.
      const absl::StatusCode code = head.status().code();
      if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kPermissionDenied ||
          code == absl::StatusCode::kUnauthenticated ||
          code == absl::StatusCode::kInvalidArgument) {
        char byte;
        absl::Status probe = engine_.GetRange(request, /*file_size=*/2, 0, 1, &byte);
        if (!probe.ok()) return probe;
      }
      return head.status();
    }
    return std::make_unique<RemoteFile>(&engine_, std::move(request), head->size,
                                        std::move(head->etag));
  }

  std::string Describe(std::string_view relpath) const override {
    while (!relpath.empty() && relpath.front() == '/') relpath.remove_prefix(1);
    return StrCat("s3://", location_.bucket, "/", location_.prefix, relpath);
  }

  StorageStats stats() const override { return engine_.stats(); }

 private:
  Request MakeRequest(std::string key) {
    Request r;
    r.url = s3_internal::ObjectUrl(config_, location_.bucket, key);
    r.name = StrCat("s3://", location_.bucket, "/", key);
    r.authorize = [this](CURL* handle, CurlHeaders* headers) { return Authorize(handle, headers); };
    r.classify = [this, key](const ErrorResponse& response) { return Classify(response, key); };
    return r;
  }

  absl::Status Authorize(CURL* handle, CurlHeaders* headers) const {
    if (config_.credentials->kind() == CredentialSource::Kind::kAnonymous) return absl::OkStatus();
    ASSIGN_OR_RETURN(s3_internal::S3Credentials c, config_.credentials->Get());
    auto append = [&](const std::string& line) {
      curl_slist* list = curl_slist_append(headers->get(), line.c_str());
      if (list != nullptr) {
        (void)headers->release();
        headers->reset(list);
      }
      return list != nullptr;
    };
    if (!append("x-amz-content-sha256: UNSIGNED-PAYLOAD") ||
        (!c.session_token.empty() && !append("x-amz-security-token: " + c.session_token))) {
      return absl::ResourceExhaustedError("S3: out of memory building request headers");
    }
    curl_easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(handle, CURLOPT_USERNAME, c.access_key_id.c_str());
    curl_easy_setopt(handle, CURLOPT_PASSWORD, c.secret_access_key.c_str());
    return absl::OkStatus();
  }

  // What an S3 error response means, and what the user should check.
  AttemptResult Classify(const ErrorResponse& r, const std::string& key) const {
    const s3_internal::S3Error e = s3_internal::ParseS3Error(r.body);
    const std::string& code = e.code;
    std::string head = StrCat(r.request, ": HTTP status ", r.http_status);
    if (!code.empty()) StrAppend(&head, " ", code);
    if (!e.message.empty()) StrAppend(&head, " (", e.message, ")");
    const std::string creds = CredentialsDescription();
    if (r.http_status >= 500 || r.http_status == 408 || r.http_status == 429 ||
        code == "SlowDown" || code == "InternalError" || code == "ServiceUnavailable" ||
        code == "RequestTimeout") {
      return Transient(absl::UnavailableError(head));
    }
    if (code == "SignatureDoesNotMatch") {
      return Permanent(absl::UnauthenticatedError(StrCat(
          head, ": the signature does not match: the secret key does not belong to the access "
                "key id ", creds, "; check the secret (AWS_SECRET_ACCESS_KEY or the profile's "
                "aws_secret_access_key), and that no proxy rewrites the request's host or path")));
    }
    if (code == "InvalidAccessKeyId") {
      return Permanent(absl::UnauthenticatedError(StrCat(
          head, ": the endpoint ", config_.endpoint, " does not know the access key id ", creds,
          "; check AWS_ACCESS_KEY_ID (or the profile's aws_access_key_id) and that the endpoint "
          "(AWS_ENDPOINT_URL) is the service that issued the key")));
    }
    if (code == "ExpiredToken" || code == "TokenRefreshRequired" || code == "InvalidToken") {
      return Permanent(absl::UnauthenticatedError(StrCat(
          head, ": the session token was refused (", code, ") for ", creds,
          "; get fresh temporary credentials (AWS_SESSION_TOKEN, the profile's "
          "aws_session_token, or its credential_process)")));
    }
    if (code == "AccessDenied" || (code.empty() && r.http_status == 403)) {
      return Permanent(absl::PermissionDeniedError(StrCat(
          head, ": access to bucket '", location_.bucket, "' key '", key, "' is denied for ",
          creds, "; check the bucket policy and the user's permissions (s3:GetObject)")));
    }
    if (code == "RequestTimeTooSkewed") {
      return Permanent(absl::FailedPreconditionError(StrCat(
          head, ": this machine's clock differs from the service's by more than 15 minutes; "
                "fix the clock (NTP)")));
    }
    if (code == "AuthorizationHeaderMalformed" || code == "PermanentRedirect" ||
        code == "IncorrectEndpoint" || (r.http_status >= 300 && r.http_status < 400)) {
      return Permanent(absl::InvalidArgumentError(StrCat(
          head, ": the bucket is not served at ", config_.endpoint, " with region ",
          config_.region, "; check AWS_REGION and AWS_ENDPOINT_URL")));
    }
    if (code == "NoSuchBucket") {
      return Permanent(absl::NotFoundError(StrCat(head, ": bucket '", location_.bucket,
                                                  "' does not exist at ", config_.endpoint,
                                                  " (reading key '", key, "')")));
    }
    if (code == "NoSuchKey" || (code.empty() && r.http_status == 404)) {
      return Permanent(absl::NotFoundError(
          StrCat(head, ": bucket '", location_.bucket, "' has no object '", key, "'")));
    }
    if (r.http_status == 416) return http_internal::HttpStatusFailure(r);
    return Permanent(absl::InvalidArgumentError(head));
  }

  std::string CredentialsDescription() const {
    const CredentialSource& source = *config_.credentials;
    if (source.kind() == CredentialSource::Kind::kAnonymous) return "none (unsigned requests)";
    absl::StatusOr<s3_internal::S3Credentials> c = source.Get();
    const std::string id = c.ok() ? s3_internal::MaskKeyId(c->access_key_id) : "?";
    return StrCat(id, " from ", source.origin());
  }

  const s3_internal::S3Location location_;
  const S3Config config_;
  const std::string sigv4_;  // CURLOPT_AWS_SIGV4: "aws:amz:REGION:s3"
  HttpEngine engine_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Storage>> NewS3Storage(std::string_view uri, const S3Options& s3,
                                                      const HttpOptions& http) {
  ASSIGN_OR_RETURN(s3_internal::S3Location location, s3_internal::ParseS3Uri(uri));
  RETURN_IF_ERROR(http_internal::ValidateHttpOptions(http, uri));
  ASSIGN_OR_RETURN(S3Config config,
                   s3_internal::ResolveS3Config(s3, location.bucket,
                                                s3_internal::ProcessEnvironment()));
  RETURN_IF_ERROR(http_internal::InitCurlOnce());
  return std::make_unique<S3Storage>(std::move(location), std::move(config), http);
}

}  // namespace conveyor
