// `conveyor check`: the dataset doctor (datasets/dataset_check.h, docs/check.md). A table of what
// is wrong, per episode and stream, a summary line, --json, and an exit status: 0 clean, 1
// warnings only, 2 errors (a dataset that does not open is an error).
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "sample/yaml_config.h"
#include "sample/quarantine.h"
#include "sample/sample_spec.h"
#include "sample/stored_tensor.h"
#include "pipeline/source.h"
#include "storage/storage.h"
#include "datasets/dataset_check.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

using json = nlohmann::json;

struct Checked {
  std::string member;  // mixture member name; empty alone
  CheckReport report;
};

std::string EpisodeText(int64_t e) { return e < 0 ? "-" : StrCat(e); }

void PrintTable(const std::vector<Checked>& checked, bool mixture) {
  size_t stream_w = 6, what_w = 4, member_w = 7;
  for (const Checked& c : checked) {
    member_w = std::max(member_w, c.member.size());
    for (const CheckFinding& f : c.report.findings) {
      stream_w = std::max(stream_w, f.stream.size());
      what_w = std::max(what_w, f.what.size());
    }
  }
  bool header = false;
  for (const Checked& c : checked) {
    for (const CheckFinding& f : c.report.findings) {
      if (!header) {
        if (mixture) std::printf("%-*s  ", static_cast<int>(member_w), "dataset");
        std::printf("%-8s %-7s %-*s %-*s %s\n", "severity", "episode", static_cast<int>(stream_w),
                    "stream", static_cast<int>(what_w), "what", "file: detail");
        header = true;
      }
      if (mixture) std::printf("%-*s  ", static_cast<int>(member_w), c.member.c_str());
      std::printf("%-8s %-7s %-*s %-*s %s%s%s\n", CheckSeverityName(f.severity).c_str(),
                  EpisodeText(f.episode).c_str(), static_cast<int>(stream_w),
                  f.stream.empty() ? "-" : f.stream.c_str(), static_cast<int>(what_w),
                  f.what.c_str(), f.file.c_str(), f.file.empty() ? "" : ": ", f.detail.c_str());
    }
  }
}

json FindingJson(const std::string& member, const CheckFinding& f) {
  json j = {{"severity", CheckSeverityName(f.severity)},
            {"episode", f.episode},
            {"stream", f.stream},
            {"file", f.file},
            {"what", f.what},
            {"detail", f.detail}};
  if (!member.empty()) j["dataset"] = member;
  return j;
}

// The quarantine file: the episodes with errors, per dataset, keyed by fingerprint
// (sample/quarantine.h reads it).
absl::Status WriteQuarantine(const std::string& path, const std::vector<Checked>& checked) {
  Quarantine q;
  for (const Checked& c : checked) {
    if (c.report.fingerprint.empty()) {
      return absl::FailedPreconditionError(
          StrCat("not writing ", path, ": ", c.report.uri,
                 " did not open, so no episode of it can be named (see the table)"));
    }
    QuarantinedDataset d;
    d.name = c.member;
    d.uri = c.report.uri;
    d.fingerprint = c.report.fingerprint;
    for (const CheckFinding& f : c.report.findings) {
      if (f.severity != CheckSeverity::kError || f.episode < 0) continue;
      std::string& reason = d.episodes[static_cast<uint64_t>(f.episode)];
      if (reason.empty()) reason = StrCat(f.what, ": ", f.file.empty() ? "" : f.file + ": ", f.detail);
    }
    q.datasets.push_back(std::move(d));
  }
  return WriteQuarantineFile(path, q);
}

// With --config: each episode's stored tensors against what the config's `shape: stored` streams
// take (sample/stored_tensor.h: the stream's shape, pad_to's rows, or any shape with buckets.by),
// read from the dataset's member index (no tensor read). A sample the reader found broken has its
// own finding already.
absl::Status CheckStoredShapes(const Dataset& dataset, const std::string& config,
                               int64_t max_episodes, CheckReport* report) {
  ASSIGN_OR_RETURN(const SampleSpec spec, SampleSpec::FromFile(config, dataset.manifest()));
  const uint64_t n = max_episodes > 0
                         ? std::min<uint64_t>(dataset.num_episodes(), static_cast<uint64_t>(max_episodes))
                         : dataset.num_episodes();
  for (size_t si = 0; si < spec.streams.size(); ++si) {
    const StreamSpec& s = spec.streams[si];
    if (s.stored_shape.empty()) continue;
    for (uint64_t e = 0; e < n; ++e) {
      absl::StatusOr<std::vector<int64_t>> stored = dataset.StoredShape(e, s.stream);
      if (!stored.ok()) continue;
      const std::string file = dataset.ShardName(dataset.episodes().shard(e));
      absl::StatusOr<ServedTensor> served =
          ServeStoredTensor(spec, si, *stored, StrCat(file, ", episode ", e, ", member '.", s.name, "'"));
      if (served.ok()) continue;
      report->findings.push_back({CheckSeverity::kError, "", static_cast<int64_t>(e), s.name, file,
                                  "tensor_shape", std::string(served.status().message())});
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct CheckOptionsCli {
  std::string dataset;
  std::string config;  // its `quarantine:` is where --write-quarantine writes by default
  bool json = false;
  int64_t episodes = 0;
  bool decode_ends = true;
  double tolerance_s = 1e-4;
  std::string write_quarantine;
};

// Returns the exit status (0, 1, 2) through `exit_status`; an error only for a usage problem or a
// quarantine file that cannot be written.
absl::Status RunCheck(const CheckOptionsCli& o, int* exit_status) {
  CheckOptions options;
  options.max_episodes = o.episodes;
  options.decode_ends = o.decode_ends;
  options.tolerance_s = o.tolerance_s;
  std::string quarantine_path = o.write_quarantine;
  if (!o.config.empty() && quarantine_path.empty()) {
    ASSIGN_OR_RETURN(std::optional<std::string> from_config, QuarantinePathOfConfig(o.config));
    if (from_config.has_value()) quarantine_path = *from_config;
  }

  std::vector<Checked> checked;
  bool mixture = false;
  absl::StatusOr<std::unique_ptr<Source>> source = Source::Open(o.dataset);
  if (!source.ok()) {
    checked.push_back({"", OpenFailureReport(RedactUri(o.dataset), source.status())});
  } else {
    mixture = (*source)->is_mixture();
    for (size_t k = 0; k < (*source)->size(); ++k) {
      Checked c{mixture ? (*source)->member(k).name : "",
                CheckDataset((*source)->dataset(k), options)};
      if (!o.config.empty() && !mixture && !c.report.format.empty()) {
        RETURN_IF_ERROR(CheckStoredShapes((*source)->dataset(k), o.config, o.episodes, &c.report));
      }
      for (CheckFinding& f : c.report.findings) f.dataset = c.member;
      checked.push_back(std::move(c));
    }
  }

  size_t errors = 0, warnings = 0, bad_episodes = 0;
  uint64_t episodes = 0, episodes_checked = 0;
  for (const Checked& c : checked) {
    errors += c.report.errors();
    warnings += c.report.warnings();
    bad_episodes += c.report.EpisodesWithErrors().size();
    episodes += c.report.episodes;
    episodes_checked += c.report.episodes_checked;
  }
  // Per kind of finding: how many, in how many episodes ("videos missing for most episodes" shows
  // at a glance).
  std::map<std::string, std::pair<size_t, std::set<std::pair<std::string, int64_t>>>> by_what;
  for (const Checked& c : checked) {
    for (const CheckFinding& f : c.report.findings) {
      auto& [count, eps] = by_what[f.what];
      ++count;
      if (f.episode >= 0) eps.insert({c.member, f.episode});
    }
  }
  *exit_status = errors > 0 ? 2 : warnings > 0 ? 1 : 0;
  const char* verdict = errors > 0 ? "errors" : warnings > 0 ? "warnings" : "clean";

  if (!quarantine_path.empty()) RETURN_IF_ERROR(WriteQuarantine(quarantine_path, checked));

  if (o.json) {
    json j;
    j["uri"] = RedactUri(o.dataset);
    j["mixture"] = mixture;
    j["episodes"] = episodes;
    j["episodes_checked"] = episodes_checked;
    j["decode_ends"] = o.decode_ends;
    j["errors"] = errors;
    j["warnings"] = warnings;
    j["episodes_with_errors"] = bad_episodes;
    j["status"] = verdict;
    j["exit_status"] = *exit_status;
    if (!quarantine_path.empty()) j["quarantine"] = quarantine_path;
    j["by_what"] = json::object();
    for (const auto& [what, v] : by_what) {
      j["by_what"][what] = {{"findings", v.first}, {"episodes", v.second.size()}};
    }
    j["datasets"] = json::array();
    j["findings"] = json::array();
    for (const Checked& c : checked) {
      json d = {{"uri", c.report.uri},
                {"format", c.report.format},
                {"fingerprint", c.report.fingerprint},
                {"episodes", c.report.episodes},
                {"episodes_checked", c.report.episodes_checked},
                {"errors", c.report.errors()},
                {"warnings", c.report.warnings()},
                {"episodes_with_errors", c.report.EpisodesWithErrors()}};
      if (!c.member.empty()) d["name"] = c.member;
      j["datasets"].push_back(std::move(d));
      for (const CheckFinding& f : c.report.findings) j["findings"].push_back(FindingJson(c.member, f));
    }
    std::printf("%s\n", JsonText(j, 2).c_str());
    return absl::OkStatus();
  }

  PrintTable(checked, mixture);
  if (errors + warnings > 0) std::printf("\n");
  std::string formats;
  for (const Checked& c : checked) {
    if (c.report.format.empty()) continue;
    if (formats.find(c.report.format) == std::string::npos) {
      StrAppend(&formats, formats.empty() ? "" : ", ", c.report.format);
    }
  }
  std::printf("check: %s%s: %s; %llu of %llu episodes checked%s, %zu error%s in %zu episode%s, "
              "%zu warning%s\n",
              RedactUri(o.dataset).c_str(), formats.empty() ? "" : StrCat(" (", formats, ")").c_str(), verdict,
              static_cast<unsigned long long>(episodes_checked),
              static_cast<unsigned long long>(episodes),
              o.decode_ends ? "" : " (ends not decoded)", errors, errors == 1 ? "" : "s",
              bad_episodes, bad_episodes == 1 ? "" : "s", warnings, warnings == 1 ? "" : "s");
  if (!by_what.empty()) {
    std::string kinds;
    for (const auto& [what, v] : by_what) {
      StrAppend(&kinds, kinds.empty() ? "" : ", ", what, " ", v.first);
      if (!v.second.empty()) {
        StrAppend(&kinds, " (", v.second.size(), " of ", episodes_checked, " episodes)");
      }
    }
    std::printf("check: by kind: %s\n", kinds.c_str());
  }
  if (!quarantine_path.empty()) {
    std::printf("check: %zu episode%s with errors written to %s\n", bad_episodes,
                bad_episodes == 1 ? "" : "s", quarantine_path.c_str());
  }
  return absl::OkStatus();
}

// `conveyor check`: its flags and its run (tools/command.h).
class CheckCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand(
        "check", "Find what is wrong in a dataset: frames vs metadata, timestamps, index "
                 "bookkeeping, missing files (exit 0 clean, 1 warnings, 2 errors)");
    c->add_option("dataset", o_.dataset, "Dataset path or URL, or a mixture file")->required();
    c->add_option("--config", o_.config,
                  "A config whose `quarantine:` file --write-quarantine defaults to, and whose "
                  "`shape: stored` streams each sample's tensor shapes are checked against");
    c->add_flag("--json", o_.json, "Print one JSON object");
    c->add_option("--episodes", o_.episodes, "Check only the first N episodes (default: all)")
        ->check(CLI::NonNegativeNumber);
    c->add_flag("--decode-ends,!--no-decode-ends", o_.decode_ends,
                "Decode every video's first and last frame (default on; off: a quick check)");
    c->add_option("--tolerance-s", o_.tolerance_s,
                  "LeRobot: allowed distance of a timestamp from frame_index / fps, seconds")
        ->check(CLI::PositiveNumber);
    c->add_option("--write-quarantine", o_.write_quarantine,
                  "Write the episodes with errors to this file (a config's `quarantine:` "
                  "leaves them out of training)");
    return c;
  }
  absl::Status Run() override { return RunCheck(o_, &exit_status_); }
  int SuccessExitCode() const override { return exit_status_; }

 private:
  CheckOptionsCli o_;
  int exit_status_ = 0;
};

std::unique_ptr<Command> NewCheckCommand() { return std::make_unique<CheckCommand>(); }

}  // namespace conveyor::tools
