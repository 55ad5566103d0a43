// `conveyor top SERVER...`: per training job, live in the terminal: samples/s, the streams' queue
// fill, decode amplification, the step waits the clients report (p50, p99, max) and the ranks
// that wait most. Asks each server's Info once per interval (the servers keep no history beyond
// their 60 s report window) and merges the jobs over servers.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>
#include <thread>

#include "base/status_macros.h"
#include "base/strings.h"
#include "client/client.h"
#include "client/launch_env.h"
#include "conveyor/v1/service.pb.h"
#include "storage/storage.h"
#include "tools/command.h"

namespace conveyor::tools {
namespace {

namespace pb = ::conveyor::v1;

struct TopOptions {
  std::vector<std::string> servers;  // empty: $CONVEYOR_SERVERS
  std::string auth_token_file;
  double interval = 1;
  int64_t iterations = 0;  // 0: until interrupted
  int64_t ranks = 8;       // rank rows per job
};

// One rank over all servers (a rank that failed over reported to two).
struct RankRow {
  uint32_t rank = 0;
  uint64_t steps = 0;
  double wait = 0, step = 0, max = 0;
  std::vector<uint64_t> buckets;
  double share() const { return step > 0 ? wait / step : 0; }
};

struct JobRow {
  uint64_t samples = 0, streams = 0, queue = 0, budget = 0, decoded = 0, delivered = 0;
  uint64_t refused_data_pin = 0;  // streams refused: they pin other data
  std::map<uint32_t, RankRow> ranks;
  // The coverage ledger's latest epoch over all servers: samples per (batch, consumers, consumer).
  uint64_t coverage_epoch = 0;
  std::map<std::tuple<uint64_t, uint32_t, uint32_t>, uint64_t> coverage;
};

// "epoch E: N samples to S of M slices", flagging a layout whose slices are not all there or not
// even (a rank missing, two ranks with the same rank): `conveyor audit` says exactly.
std::string CoverageLine(const JobRow& job) {
  if (job.coverage.empty()) return "";
  uint64_t samples = 0, expected_slices = 0;
  std::map<std::pair<uint64_t, uint32_t>, std::vector<uint64_t>> layouts;
  for (const auto& [key, n] : job.coverage) {
    samples += n;
    layouts[{std::get<0>(key), std::get<1>(key)}].push_back(n);
  }
  bool uneven = false;
  for (const auto& [layout, counts] : layouts) {
    expected_slices += layout.second;
    uneven = uneven || counts.size() != layout.second ||
             *std::max_element(counts.begin(), counts.end()) > *std::min_element(counts.begin(), counts.end()) +
                                                                   8 * (layout.first / layout.second);
  }
  return StrCat("    coverage: epoch ", job.coverage_epoch, ", ", samples, " samples to ", job.coverage.size(), " of ",
                expected_slices, " slices", uneven ? " UNEVEN: run conveyor audit" : "", "\n");
}

// The bucket's upper bound where the cumulative count reaches q, never above the largest wait.
double Quantile(const std::vector<uint64_t>& buckets, const std::vector<double>& bounds, double max,
                double q) {
  uint64_t total = 0;
  for (uint64_t b : buckets) total += b;
  if (total == 0) return 0;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    cumulative += buckets[i];
    if (buckets[i] > 0 && static_cast<double>(cumulative) >= q * static_cast<double>(total)) {
      return i < bounds.size() ? std::min(bounds[i], max) : max;
    }
  }
  return max;
}

std::string Ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, seconds < 0.01 ? "%.2f ms" : "%.1f ms", seconds * 1e3);
  return buf;
}

std::string Bytes(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f MiB", b / 1048576.0);
  return buf;
}

// One round of Info calls over the servers, merged per job.
struct Poll {
  std::map<std::string, JobRow> jobs;
  std::vector<double> bounds;  // the wait buckets' upper bounds (the first server's)
  std::string problems, caches;
  int answered = 0;
};

// A server's decoded-frame cache and node frame store, a line each.
std::string CacheLines(const std::string& server, const pb::FrameCacheStatus& fc) {
  std::string out;
  const uint64_t lookups = fc.hits() + fc.misses();
  StrAppend(&out, "  ", server, " frame cache (", fc.policy(), "): ", Bytes(fc.bytes()), " of ",
            Bytes(fc.max_bytes()), ", ", fc.frames(), " frames, hit rate ",
            lookups > 0 ? StrCat(static_cast<int64_t>(100.0 * fc.hits() / lookups), "%") : std::string("-"),
            fc.evicted_bytes() > 0 ? StrCat(", ", Bytes(fc.evicted_bytes()), " evicted") : std::string(),
            fc.rejected() > 0 ? StrCat(", ", fc.rejected(), " frames not admitted (full)") : std::string(),
            "\n");
  if (!fc.store_dir().empty()) {
    const uint64_t store_lookups = fc.store_hits() + fc.store_misses();
    StrAppend(&out, "  ", server, " node frame store ", fc.store_dir(), ": ", Bytes(fc.store_bytes()), " of ",
              Bytes(fc.store_max_bytes()), ", hit rate ",
              store_lookups > 0 ? StrCat(static_cast<int64_t>(100.0 * fc.store_hits() / store_lookups), "%")
                                : std::string("-"),
              ", ", fc.store_published(), " frames written",
              fc.store_rejected() > 0 ? StrCat(", ", fc.store_rejected(), " not admitted (full)") : std::string(),
              fc.store_evicted_bytes() > 0 ? StrCat(", ", Bytes(fc.store_evicted_bytes()), " evicted") : std::string(),
              fc.store_corrupt() > 0 ? StrCat(", ", fc.store_corrupt(), " corrupt entries re-decoded") : std::string(),
              "\n");
  }
  return out;
}

// Adds one server's jobs to `jobs` (a job on several servers adds up).
void AddJobs(const pb::InfoResponse& info, std::map<std::string, JobRow>* jobs) {
  for (const pb::JobStatus& j : info.jobs()) {
    JobRow& row = (*jobs)[j.job()];
    row.samples += j.samples();
    row.streams += j.streams();
    row.queue += j.queue_bytes();
    row.budget += j.queue_budget_bytes();
    row.decoded += j.frames_decoded();
    row.delivered += j.frames_delivered();
    row.refused_data_pin += j.refused_data_pin();
    for (const pb::CoverageSlice& c : j.coverage()) {
      if (c.epoch() > row.coverage_epoch) {
        row.coverage_epoch = c.epoch();
        row.coverage.clear();
      }
      if (c.epoch() == row.coverage_epoch) {
        row.coverage[{c.global_batch_size(), c.consumers(), c.consumer()}] += c.samples();
      }
    }
    for (const pb::RankWait& w : j.ranks()) {
      RankRow& r = row.ranks[w.rank()];
      r.rank = w.rank();
      r.steps += w.steps();
      r.wait += w.wait_seconds();
      r.step += w.step_seconds();
      r.max = std::max(r.max, w.max_wait_seconds());
      r.buckets.resize(std::max<size_t>(r.buckets.size(), w.wait_buckets_size()));
      for (int i = 0; i < w.wait_buckets_size(); ++i) r.buckets[i] += w.wait_buckets(i);
    }
  }
}

Poll PollServers(const std::vector<std::string>& servers, const std::string& token) {
  Poll poll;
  for (const std::string& server : servers) {
    client::ClientOptions c;
    c.servers = {server};
    c.auth_token = token;
    absl::StatusOr<pb::InfoResponse> info = client::GetInfo(c);
    if (!info.ok()) {
      poll.problems += StrCat("  ", server, ": ", info.status().message().substr(0, 100), "\n");
      continue;
    }
    ++poll.answered;
    if (info->has_frame_cache()) poll.caches += CacheLines(server, info->frame_cache());
    if (poll.bounds.empty()) poll.bounds.assign(info->wait_bucket_bounds().begin(), info->wait_bucket_bounds().end());
    AddJobs(*info, &poll.jobs);
  }
  return poll;
}

// The ranks that wait most, most first: at most `ranks` rows.
std::string RankLines(const JobRow& job, const std::vector<double>& bounds, int64_t ranks) {
  std::string out;
  char line[256];
  std::vector<const RankRow*> by_share;
  for (const auto& [rank, r] : job.ranks) by_share.push_back(&r);
  std::sort(by_share.begin(), by_share.end(), [](const RankRow* a, const RankRow* b) {
    return a->share() != b->share() ? a->share() > b->share() : a->rank < b->rank;
  });
  if (!by_share.empty()) {
    std::snprintf(line, sizeof line, "    %6s %8s %8s %9s %9s %9s\n", "rank", "waiting", "steps",
                  "p50", "p99", "max");
    out += line;
  }
  for (size_t i = 0; i < by_share.size() && static_cast<int64_t>(i) < ranks; ++i) {
    const RankRow& r = *by_share[i];
    std::snprintf(line, sizeof line, "    %6u %7.1f%% %8llu %9s %9s %9s\n", r.rank, 100 * r.share(),
                  static_cast<unsigned long long>(r.steps), Ms(Quantile(r.buckets, bounds, r.max, 0.5)).c_str(),
                  Ms(Quantile(r.buckets, bounds, r.max, 0.99)).c_str(), Ms(r.max).c_str());
    out += line;
  }
  if (by_share.size() > static_cast<size_t>(ranks)) {
    StrAppend(&out, "    ... ", by_share.size() - static_cast<size_t>(ranks), " more ranks\n");
  }
  return out;
}

// A job's row (its samples/s is `rate`), its coverage, refusals and the ranks that wait most.
std::string JobLines(const std::string& name, const JobRow& job, const std::string& rate,
                     const std::vector<double>& bounds, int64_t ranks) {
  std::vector<uint64_t> all;
  double max = 0;
  const RankRow* slowest = nullptr;
  for (const auto& [rank, r] : job.ranks) {
    all.resize(std::max(all.size(), r.buckets.size()));
    for (size_t i = 0; i < r.buckets.size(); ++i) all[i] += r.buckets[i];
    max = std::max(max, r.max);
    if (r.step > 0 && (!slowest || r.share() > slowest->share())) slowest = &r;
  }
  const std::string queue =
      job.budget > 0 ? StrCat(static_cast<int64_t>(100.0 * job.queue / job.budget), "% of ", Bytes(job.budget))
                     : "-";
  const std::string amplif =
      job.delivered > 0 ? StrCat(static_cast<double>(static_cast<int64_t>(100.0 * job.decoded / job.delivered)) / 100)
                        : "-";
  const std::string waits_most =
      slowest ? StrCat("rank ", slowest->rank, " (", static_cast<int64_t>(100 * slowest->share()),
                       "% of its step time)")
              : "-";
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %10s %7llu %14s %7s %9s %9s %9s  %s\n",
                name.substr(0, 24).c_str(), rate.c_str(), static_cast<unsigned long long>(job.streams),
                queue.c_str(), amplif.c_str(), job.ranks.empty() ? "-" : Ms(Quantile(all, bounds, max, 0.5)).c_str(),
                job.ranks.empty() ? "-" : Ms(Quantile(all, bounds, max, 0.99)).c_str(),
                job.ranks.empty() ? "-" : Ms(max).c_str(), waits_most.c_str());
  std::string out = line;
  out += CoverageLine(job);
  if (job.refused_data_pin > 0) {
    out += StrCat("    REFUSED ", job.refused_data_pin, " stream(s) that pin other data: a rank points at the "
                  "wrong server, or resumes on changed data (the server's log names rank and data)\n");
  }
  return out + RankLines(job, bounds, ranks);
}

absl::Status RunTop(const TopOptions& o) {
  client::LaunchOverrides lo;
  std::string list;
  for (const std::string& s : o.servers) list += (list.empty() ? "" : ",") + s;
  lo.servers = list;
  ASSIGN_OR_RETURN(client::LaunchEnv launch, client::ResolveLaunch(lo));
  std::string token;
  if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(o.auth_token_file));
  }
  if (o.interval <= 0) return absl::InvalidArgumentError("--interval must be > 0");
  const bool tty = isatty(STDOUT_FILENO);
  std::map<std::string, uint64_t> last_samples;
  auto last_at = std::chrono::steady_clock::now();
  for (int64_t it = 0; o.iterations == 0 || it < o.iterations; ++it) {
    if (it > 0) std::this_thread::sleep_for(std::chrono::duration<double>(o.interval));
    const Poll poll = PollServers(launch.servers, token);
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last_at).count();
    last_at = now;

    std::string out;
    if (tty) out += "\033[H\033[2J";
    StrAppend(&out, "conveyor top: ", poll.answered, " of ", launch.servers.size(),
              " servers answered; every ", o.interval, " s; step waits over the servers' last 60 s\n",
              poll.problems, poll.caches, "\n");
    char line[256];
    std::snprintf(line, sizeof line, "%-24s %10s %7s %14s %7s %9s %9s %9s  %s\n", "JOB", "SAMPLES/S",
                  "STREAMS", "QUEUE", "AMPLIF", "WAIT p50", "p99", "max", "WAITS MOST");
    out += line;
    for (const auto& [name, job] : poll.jobs) {
      std::string rate = "-";
      if (it > 0 && last_samples.count(name) && job.samples >= last_samples[name] && dt > 0) {
        rate = StrCat(static_cast<int64_t>((job.samples - last_samples[name]) / dt));
      }
      last_samples[name] = job.samples;
      out += JobLines(name, job, rate, poll.bounds, o.ranks);
    }
    if (poll.jobs.empty()) out += "(no jobs: no stream open and no report in the window)\n";
    if (!tty) out += "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// `conveyor top`: its flags and its run (tools/command.h).
class TopCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("top", "Per job, live: samples/s, queue fill, amplification, data wait p50/p99/max and the ranks that wait most (docs/serving.md)");
    c->add_option("servers", o_.servers, "HOST:PORT ... (default: $CONVEYOR_SERVERS)");
    c->add_option("--auth-token-file", o_.auth_token_file, "File holding the bearer token");
    c->add_option("--interval", o_.interval, "Seconds between refreshes")->capture_default_str();
    c->add_option("--iterations", o_.iterations, "Refresh this many times, then exit (0: until Ctrl-C)")->capture_default_str()->check(CLI::NonNegativeNumber);
    c->add_option("--ranks", o_.ranks, "Rank rows per job (the ranks that wait most)")->capture_default_str()->check(CLI::NonNegativeNumber);
    return c;
  }
  absl::Status Run() override { return RunTop(o_); }

 private:
  TopOptions o_;
};

}  // namespace

std::unique_ptr<Command> NewTopCommand() { return std::make_unique<TopCommand>(); }

}  // namespace conveyor::tools
