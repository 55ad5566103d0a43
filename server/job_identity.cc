#include "server/internal/job_identity.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "base/strings.h"

namespace conveyor::server_internal {
namespace {

std::string Digest(std::string_view secret) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(secret.data(), secret.size(), md, &len, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(md), len);
}

}  // namespace

absl::StatusOr<JobRegistry::Claim> JobRegistry::Enter(const std::string& job, std::string_view secret,
                                                      bool stream, Clock::time_point now) {
  const std::string digest = Digest(secret);
  Claim claim;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    if (jobs_.size() >= max_jobs_) {
      // The slot idle longest, if any is idle: its job ended (or went quiet) on this server.
      auto oldest = jobs_.end();
      for (auto j = jobs_.begin(); j != jobs_.end(); ++j) {
        if (j->second.streams > 0 || now - j->second.last < idle_) continue;
        if (oldest == jobs_.end() || j->second.last < oldest->second.last) oldest = j;
      }
      if (oldest == jobs_.end()) {
        claim.label = kOverflowLabel;
        return claim;
      }
      claim.reclaimed = oldest->first;
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(job, Job{digest, 0, now}).first;
  } else if (it->second.secret_digest.size() != digest.size() ||
             CRYPTO_memcmp(it->second.secret_digest.data(), digest.data(), digest.size()) != 0) {
    if (it->second.streams == 0 && now - it->second.last >= idle_) {
      // The job of that name ended here: a new job may take the name with its own secret, and
      // starts with none of the old job's state.
      claim.reclaimed = job;
      it->second = Job{digest, 0, now};
      if (stream) ++it->second.streams;
      claim.label = job;
      return claim;
    }
    return absl::PermissionDeniedError(StrCat(
        "job '", job, "' is held on this server by clients with ",
        it->second.secret_digest == Digest("") ? "no job secret" : "another job secret",
        ", and this call presents ", secret.empty() ? "none" : "a different one",
        ": every rank of a job must share its secret (ClientOptions::job_secret or "
        "$CONVEYOR_JOB_SECRET, docs/serving.md \"Job identity\"); the name is free again once "
        "that job has had no stream and no call for --job-idle-seconds, or use another job name"));
  }
  it->second.last = now;
  if (stream) ++it->second.streams;
  claim.label = job;
  return claim;
}

void JobRegistry::Release(const std::string& label, Clock::time_point now) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(label);
  if (it == jobs_.end()) return;
  if (it->second.streams > 0) --it->second.streams;
  it->second.last = now;
}

}  // namespace conveyor::server_internal
