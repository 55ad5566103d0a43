// `conveyor audit`: proves an epoch's coverage from the coverage ledgers (base/coverage.h) of the
// servers a job streamed from, or of its trainers' JSON (what each rank received), against the
// digests the order itself gives: exact (every sample of the epoch's positions reached exactly one
// consumer slice exactly once), or which slices are missing or duplicated, with the first sample
// ids concerned. docs/pipeline.md "Coverage ledger".
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/coverage.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "client/client.h"
#include "conveyor/v1/service.pb.h"
#include "pipeline/pipeline.h"
#include "storage/storage.h"
#include "tools/command.h"

namespace conveyor::tools {
namespace {

namespace pb = ::conveyor::v1;

struct AuditOptions {
  std::string dataset;
  std::string config;
  int64_t epoch = 0;
  std::vector<std::string> servers;
  std::string job = "default";
  std::vector<std::string> trainer_json;
  std::string auth_token_file;
  std::string tls_ca;           // PEM roots to verify the servers; giving it switches to TLS
  std::string tls_server_name;
  int schedule_version = 0;
  int64_t show_ids = 5;
};

// The ledgers of every source, merged: the same slice seen by several servers (a failover) adds up.
void Merge(const CoverageSlice& s, std::map<std::tuple<uint64_t, uint64_t, uint32_t, uint32_t>, CoverageSlice>* out) {
  auto [it, fresh] = out->try_emplace(s.Key(), s);
  if (fresh) return;
  CoverageSlice& m = it->second;
  m.samples += s.samples;
  m.digest += s.digest;
  m.batches += s.batches;
  m.first_position = std::min(m.first_position, s.first_position);
  m.end_position = std::max(m.end_position, s.end_position);
}

// The ledgers of job o.job on every server; `jobs` gets every job name the servers know (for the
// "nothing recorded" message). A server serving another dataset than `fingerprint` is refused.
absl::StatusOr<std::vector<CoverageSlice>> FromServers(const AuditOptions& o, const std::string& fingerprint,
                                                       std::set<std::string>* jobs) {
  std::string token;
  if (!o.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(o.auth_token_file));
  }
  std::string tls_ca;
  if (!o.tls_ca.empty()) {
    ASSIGN_OR_RETURN(tls_ca, ReadLocalFile(o.tls_ca, "TLS CA"));
  }
  std::vector<CoverageSlice> out;
  for (const std::string& server : o.servers) {
    client::ClientOptions c;
    c.servers = {server};
    c.auth_token = token;
    c.tls = !tls_ca.empty();
    c.tls_ca_pem = tls_ca;
    c.tls_server_name = o.tls_server_name;
    absl::StatusOr<pb::InfoResponse> info = client::GetInfo(c);
    if (!info.ok()) return Annotate(info.status(), StrCat("server ", server));
    if (info->dataset_fingerprint() != fingerprint) {
      return absl::FailedPreconditionError(StrCat(
          "server ", server, " serves dataset ", info->dataset_name(), " (fingerprint ", info->dataset_fingerprint(),
          "), not ", o.dataset, " (fingerprint ", fingerprint, "): its ledgers say nothing about this dataset's order"));
    }
    for (const pb::JobStatus& j : info->jobs()) {
      jobs->insert(j.job());
      if (j.job() != o.job) continue;
      for (const pb::CoverageSlice& p : j.coverage()) {
        CoverageSlice s;
        s.epoch = p.epoch();
        s.consumer = p.consumer();
        s.consumers = p.consumers();
        s.global_batch_size = p.global_batch_size();
        s.samples = p.samples();
        s.digest = p.digest();
        s.first_position = p.first_position();
        s.end_position = p.end_position();
        s.batches = p.batches();
        out.push_back(s);
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<CoverageSlice>> FromTrainerJson(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(StrCat("cannot open trainer JSON ", path));
  std::vector<CoverageSlice> out;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    if (!j.contains("coverage")) {
      return absl::InvalidArgumentError(StrCat(path, " has no \"coverage\" (written by conveyor train --json of this release?)"));
    }
    for (const nlohmann::json& c : j.at("coverage")) {
      CoverageSlice s;
      s.epoch = c.at("epoch").get<uint64_t>();
      s.consumer = c.at("consumer").get<uint32_t>();
      s.consumers = c.at("consumers").get<uint32_t>();
      s.global_batch_size = c.at("global_batch_size").get<uint64_t>();
      s.samples = c.at("samples").get<uint64_t>();
      s.digest = std::stoull(c.at("digest").get<std::string>(), nullptr, 16);
      s.first_position = c.at("first_position").get<uint64_t>();
      s.end_position = c.at("end_position").get<uint64_t>();
      s.batches = c.value("batches", uint64_t{0});
      out.push_back(s);
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(StrCat("trainer JSON ", path, ": ", e.what()));
  }
  return out;
}

std::string IdText(const SampleId& id) {
  return id.dataset == 0 ? StrCat(id.episode, "/", id.step) : StrCat(id.dataset, ":", id.episode, "/", id.step);
}

std::string Hex(uint64_t x) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(x));
  return b;
}

struct Expected {
  uint64_t samples = 0, digest = 0;
  std::vector<SampleId> first;
};

// Slices grouped by the layout that served them (batch size, consumers), each over the range of
// positions its slices covered.
struct Group {
  uint64_t batch = 0;
  uint32_t consumers = 0;
  uint64_t from = UINT64_MAX, to = 0;
  std::map<uint32_t, CoverageSlice> slices;
};

// What the audit found so far: totals beside the order's, and a line per slice.
struct Tally {
  bool exact = true;
  uint64_t total = 0, expected_total = 0, digest = 0, expected_digest = 0;
  std::string report;
};

// The ledgers to audit: every server's for job o.job, or every trainer JSON's; `jobs` gets every
// job name the servers know.
absl::StatusOr<std::vector<CoverageSlice>> Ledgers(const AuditOptions& o, const Source& source,
                                                   std::set<std::string>* jobs) {
  if (!o.servers.empty()) return FromServers(o, source.manifest().fingerprint, jobs);
  std::vector<CoverageSlice> all;
  for (const std::string& path : o.trainer_json) {
    ASSIGN_OR_RETURN(std::vector<CoverageSlice> part, FromTrainerJson(path));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// The merged slices by layout, in the order of the positions they start at.
std::vector<Group> GroupByLayout(
    const std::map<std::tuple<uint64_t, uint64_t, uint32_t, uint32_t>, CoverageSlice>& merged) {
  std::map<std::pair<uint64_t, uint32_t>, Group> by_layout;
  for (const auto& [key, s] : merged) {
    Group& g = by_layout[{s.global_batch_size, s.consumers}];
    g.batch = s.global_batch_size;
    g.consumers = s.consumers;
    g.from = std::min(g.from, s.first_position);
    g.to = std::max(g.to, s.end_position);
    g.slices[s.consumer] = s;
  }
  std::vector<Group> ordered;
  for (auto& [k, g] : by_layout) ordered.push_back(std::move(g));
  std::sort(ordered.begin(), ordered.end(), [](const Group& a, const Group& b) { return a.from < b.from; });
  return ordered;
}

// What consumer i's slice of group g should have received, from the epoch's sequence.
Expected ExpectedSlice(const Group& g, uint32_t i, const std::vector<SampleId>& seq, int64_t show_ids) {
  const uint64_t local = g.batch / g.consumers;
  Expected e;
  for (uint64_t p = g.from; p + g.batch <= g.to; p += g.batch) {
    for (uint64_t j = p + i * local; j < p + (i + 1) * local; ++j) {
      const SampleId& id = seq[j];
      ++e.samples;
      e.digest += CoverageHash(id);
      if (e.first.size() < static_cast<size_t>(show_ids)) e.first.push_back(id);
    }
  }
  return e;
}

// How a slice that is not exact differs from what it should have received.
std::string Verdict(const CoverageSlice& got, const Expected& e) {
  if (got.samples == 0) return StrCat("missing: 0 of ", e.samples, " samples");
  if (e.samples > 0 && got.samples % e.samples == 0 && got.samples / e.samples >= 2 &&
      got.digest == e.digest * (got.samples / e.samples)) {
    return StrCat("duplicated: delivered ", got.samples / e.samples, " times (", got.samples, " samples, ",
                  e.samples, " expected)");
  }
  if (got.samples > e.samples) {
    return StrCat("duplicated or foreign samples: ", got.samples, " samples, ", e.samples, " expected");
  }
  if (got.samples < e.samples) return StrCat("missing samples: ", got.samples, " of ", e.samples);
  return StrCat("other samples: ", got.samples, " as expected, but digest ", Hex(got.digest),
                " is not the order's ", Hex(e.digest));
}

// The samples to look at in a slice that is not exact: for one that stopped early or started
// late, its first positions outside what it covered; else its first samples.
std::string SamplesToLookAt(const Group& g, uint32_t i, const CoverageSlice& got, const Expected& e,
                            const std::vector<SampleId>& seq, int64_t show_ids) {
  const uint64_t local = g.batch / g.consumers;
  std::vector<SampleId> first = e.first;
  std::string where = "its first samples";
  if (got.samples > 0 && got.samples < e.samples && (got.end_position < g.to || got.first_position > g.from)) {
    first.clear();
    for (uint64_t p = g.from; p + g.batch <= g.to && first.size() < static_cast<size_t>(show_ids); p += g.batch) {
      if (p >= got.first_position && p < got.end_position) continue;
      for (uint64_t j = p + i * local; j < p + (i + 1) * local && first.size() < static_cast<size_t>(show_ids); ++j) {
        first.push_back(seq[j]);
      }
    }
    where = StrCat("it covered positions ", got.first_position, "..", got.end_position - 1,
                   " only; the first samples it lacks");
  }
  std::string ids;
  for (const SampleId& id : first) StrAppend(&ids, ids.empty() ? "" : " ", IdText(id));
  return StrCat(where, ": ", ids);
}

// Audits every consumer slice of group g against the epoch's sequence `seq`.
void AuditGroup(const Group& g, const std::vector<SampleId>& seq, int64_t show_ids, Tally* t) {
  for (uint32_t i = 0; i < g.consumers; ++i) {
    const Expected e = ExpectedSlice(g, i, seq, show_ids);
    t->expected_total += e.samples;
    t->expected_digest += e.digest;
    auto it = g.slices.find(i);
    const CoverageSlice got = it == g.slices.end() ? CoverageSlice{} : it->second;
    t->total += got.samples;
    t->digest += got.digest;
    const std::string name = StrCat("slice ", i, "/", g.consumers, " at global batch ", g.batch, ", positions ",
                                    g.from, "..", g.to == 0 ? 0 : g.to - 1);
    if (got.samples == e.samples && got.digest == e.digest) {
      StrAppend(&t->report, "  ", name, ": exact, ", got.samples, " samples\n");
      continue;
    }
    t->exact = false;
    StrAppend(&t->report, "  ", name, ": ", Verdict(got, e), "; ",
              SamplesToLookAt(g, i, got, e, seq, show_ids), "\n");
  }
}

absl::Status RunAudit(const AuditOptions& o, int* verdict) {
  if (o.servers.empty() == o.trainer_json.empty()) {
    return absl::InvalidArgumentError("give --servers (their ledgers) or --trainer-json (what the ranks received), one of them");
  }
  if (o.epoch < 0) return absl::InvalidArgumentError("--epoch must be >= 0");
  const uint64_t epoch = static_cast<uint64_t>(o.epoch);
  std::set<std::string> jobs;
  ASSIGN_OR_RETURN(std::unique_ptr<Source> source, Source::Open(o.dataset));
  ASSIGN_OR_RETURN(const std::vector<CoverageSlice> all, Ledgers(o, *source, &jobs));
  std::map<std::tuple<uint64_t, uint64_t, uint32_t, uint32_t>, CoverageSlice> merged;
  for (const CoverageSlice& s : all) {
    if (s.epoch == epoch) Merge(s, &merged);
  }
  const std::string what = o.servers.empty() ? "what the trainers received" : StrCat("job ", o.job, " on ", o.servers.size(), " server(s)");
  if (merged.empty()) {
    std::string known;
    for (const std::string& j : jobs) StrAppend(&known, known.empty() ? "" : ", ", j);
    std::printf("epoch %llu (%s): nothing recorded%s\n", static_cast<unsigned long long>(epoch), what.c_str(),
                o.servers.empty() ? "" : known.empty() ? "; the servers know no job" : StrCat("; the servers know the jobs: ", known, " (--job)").c_str());
    *verdict = 1;
    return absl::OkStatus();
  }

  // The order: what each position of the epoch holds.
  ASSIGN_OR_RETURN(std::string text, ReadLocalFile(o.config, "config"));
  ASSIGN_OR_RETURN(SampleSpec spec, SampleSpec::FromYaml(text, source->manifest(), o.config));
  PipelineOptions po;
  RETURN_IF_ERROR(po.MergeYaml(text, spec, source->manifest(), o.config));
  if (o.schedule_version > 0) po.order.version = static_cast<uint32_t>(o.schedule_version);
  std::map<uint64_t, std::vector<SampleId>> sequence;  // by global batch size (one for a dataset)
  auto sequence_at = [&](uint64_t batch) -> absl::StatusOr<const std::vector<SampleId>*> {
    const uint64_t key = source->is_mixture() ? batch : 0;
    auto it = sequence.find(key);
    if (it == sequence.end()) {
      PipelineOptions at = po;
      at.global_batch_size = batch;
      ASSIGN_OR_RETURN(std::vector<SampleId> seq, Pipeline::EpochSequence(*source, spec, at, epoch));
      it = sequence.emplace(key, std::move(seq)).first;
    }
    return &it->second;
  };

  const std::vector<Group> ordered = GroupByLayout(merged);
  Tally t;
  uint64_t covered_to = 0;
  uint64_t epoch_positions = 0;  // of the last layout's sequence
  for (const Group& g : ordered) {
    if (g.batch == 0 || g.consumers == 0 || g.batch % g.consumers != 0) {
      return absl::DataLossError(StrCat("a ledger names a slice of ", g.consumers, " consumers at global batch size ", g.batch));
    }
    if (g.from > covered_to) {
      t.exact = false;
      StrAppend(&t.report, "  positions ", covered_to, "..", g.from - 1, ": delivered to no slice\n");
    } else if (g.from < covered_to) {
      t.exact = false;
      StrAppend(&t.report, "  positions ", g.from, "..", covered_to - 1, ": delivered twice, at two layouts\n");
    }
    covered_to = std::max(covered_to, g.to);
    ASSIGN_OR_RETURN(const std::vector<SampleId>* seq, sequence_at(g.batch));
    epoch_positions = seq->size();
    if (g.to > seq->size()) {
      return absl::DataLossError(StrCat("a ledger's slice reaches position ", g.to, " of epoch ", epoch,
                                        ", which has ", seq->size(), ": another dataset or config?"));
    }
    AuditGroup(g, *seq, o.show_ids, &t);
  }
  const bool complete = covered_to + ordered.back().batch > epoch_positions;
  std::printf("epoch %llu (%s): %s, %llu samples delivered, %llu expected, digest %s (the order's %s)%s\n",
              static_cast<unsigned long long>(epoch), what.c_str(), t.exact ? "EXACT" : "NOT EXACT",
              static_cast<unsigned long long>(t.total), static_cast<unsigned long long>(t.expected_total),
              Hex(t.digest).c_str(), Hex(t.expected_digest).c_str(),
              complete ? "" : StrCat(", in progress (up to position ", covered_to, ")").c_str());
  std::fputs(t.report.c_str(), stdout);
  *verdict = t.exact ? 0 : 1;
  return absl::OkStatus();
}

// `conveyor audit`: its flags and its run (tools/command.h). Exit status 0: exact; 1: not.
class AuditCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand(
        "audit", "Prove an epoch's coverage: every sample to exactly one consumer slice once, or which slices are "
                 "missing or duplicated (docs/pipeline.md \"Coverage ledger\")");
    c->add_option("dataset", o_.dataset, "Dataset path or URL (the order is computed from it)")->required();
    c->add_option("--config", o_.config, "The job's config (YAML)")->required();
    c->add_option("--epoch", o_.epoch, "The epoch to audit")->capture_default_str();
    c->add_option("--servers", o_.servers, "The job's servers: their ledgers of what they delivered")->delimiter(',');
    c->add_option("--job", o_.job, "The job's name (with --servers)")->capture_default_str();
    c->add_option("--trainer-json", o_.trainer_json, "conveyor train --json files: what each rank received");
    c->add_option("--auth-token-file", o_.auth_token_file, "File holding the servers' bearer token");
    c->add_option("--tls-ca", o_.tls_ca, "Use TLS and verify the servers with these roots (PEM)");
    c->add_option("--tls-server-name", o_.tls_server_name, "Name to check in the servers' certificate");
    c->add_option("--schedule-version", o_.schedule_version, "1 to 4: the job's schedule version (default: the config's)");
    c->add_option("--show-ids", o_.show_ids, "Sample ids to show per offending slice")->capture_default_str();
    return c;
  }
  absl::Status Run() override { return RunAudit(o_, &verdict_); }
  int SuccessExitCode() const override { return verdict_; }

 private:
  AuditOptions o_;
  int verdict_ = 0;
};

}  // namespace

std::unique_ptr<Command> NewAuditCommand() { return std::make_unique<AuditCommand>(); }

}  // namespace conveyor::tools
