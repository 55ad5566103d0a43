// Jobs on one server (docs/serving.md "Job identity"): who may speak for a job name, and which
// job names get series, a coverage ledger and totals of their own.
//
//  - A job's ranks share a secret (ClientOptions::job_secret, $CONVEYOR_JOB_SECRET). The first
//    stream or report of a job name here sets the job's secret (none is a value too); every later
//    one must present the same, else PERMISSION_DENIED: another client cannot write into the
//    job's ledger (turning `conveyor audit` EXACT), its metrics or its reports. Once the job has
//    had no stream open and no call for `idle`, it has ended here: a call with another secret
//    starts a new job of that name (Claim::reclaimed names it: its old state is dropped).
//  - At most `max_jobs` names hold a slot; later ones share the label "_other" and are not
//    protected (they have no ledger of their own to protect). A slot whose job has had no stream
//    open and no call for `idle` is reclaimed when a new name needs one, so filling the slots
//    does not push a real job into "_other" for good; the secret goes with the slot.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace conveyor::server_internal {

class JobRegistry {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr char kOverflowLabel[] = "_other";

  JobRegistry(size_t max_jobs, Clock::duration idle) : max_jobs_(max_jobs), idle_(idle) {}

  struct Claim {
    std::string label;      // the job's name, or kOverflowLabel
    std::string reclaimed;  // a job whose slot (or name) this claim took: drop its state (empty: none)
  };
  // A call of `job` presenting `secret` (empty: none). `stream`: a stream starts, which holds the
  // slot until Release(label). PERMISSION_DENIED, naming the job, when its secret differs.
  absl::StatusOr<Claim> Enter(const std::string& job, std::string_view secret, bool stream,
                              Clock::time_point now = Clock::now());
  // A stream of `label` ended (Enter with stream = true).
  void Release(const std::string& label, Clock::time_point now = Clock::now());

 private:
  struct Job {
    std::string secret_digest;  // SHA-256 of the secret; of "" when the job has none
    int streams = 0;
    Clock::time_point last{};
  };
  const size_t max_jobs_;
  const Clock::duration idle_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace conveyor::server_internal
