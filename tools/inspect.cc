// `conveyor inspect`: what a dataset holds, from its manifest and episode table alone (no shard
// is read unless --verify asks for every checksum to be checked).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "format/format.h"
#include "tools/command.h"
#include "tools/commands.h"

namespace conveyor::tools {
namespace {

namespace pb = format::v1;
using json = nlohmann::json;

std::string HumanBytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return absl::StrFormat(u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
}

std::string ShapeText(const StreamInfo& s) {
  std::string out;
  for (size_t i = 0; i < s.shape.size(); ++i) StrAppend(&out, i ? "x" : "", s.shape[i]);
  if (s.kind == pb::LOWDIM) out = "[" + out + "]";
  if (s.kind == pb::AUDIO) out = StrCat(out, " ch");
  if (!s.pix_fmt.empty()) StrAppend(&out, " ", s.pix_fmt);
  return out;
}

std::string RateText(const StreamInfo& s) {
  if (s.rate <= 0) return "-";
  switch (s.kind) {
    case pb::VIDEO:
    case pb::IMAGE:
      return absl::StrFormat("%g fps", s.rate);
    default:
      return absl::StrFormat("%g Hz", s.rate);
  }
}

std::string Vec(const std::vector<double>& v, size_t max_items) {
  std::string out = "[";
  for (size_t i = 0; i < v.size() && i < max_items; ++i) {
    StrAppend(&out, i ? ", " : "", absl::StrFormat("%.3g", v[i]));
  }
  if (v.size() > max_items) StrAppend(&out, ", ... (", v.size(), ")");
  return out + "]";
}

}  // namespace

absl::Status RunInspect(const InspectOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Dataset::Open(options.dataset));
  const Manifest& m = ds->manifest();
  const size_t n = ds->num_episodes();
  std::vector<uint64_t> totals(m.streams.size(), 0);
  double min_d = 1e300, max_d = 0;
  for (size_t e = 0; e < n; ++e) {
    const EpisodeRecord r = ds->episodes().record(e);
    for (size_t s = 0; s < m.streams.size(); ++s) totals[s] += r.lengths[s];
    min_d = std::min(min_d, r.duration_s);
    max_d = std::max(max_d, r.duration_s);
  }
  uint64_t shard_bytes = 0;
  for (const ShardInfo& s : m.shards) shard_bytes += s.bytes;
  // A dataset read in place (LeRobot) has its own files: no shards, no format version.
  const bool native = ds->format() == "conveyor";

  if (options.verify) {
    const bool tty = isatty(STDERR_FILENO);
    for (size_t s = 0; s < m.shards.size(); ++s) {
      RETURN_IF_ERROR(ds->VerifyShard(static_cast<uint32_t>(s)));
      std::fprintf(stderr, "%sverify: %zu/%zu %s, every checksum matches%s", tty ? "\r" : "",
                   s + 1, m.shards.size(), native ? "shards" : "data files and their videos",
                   tty ? "" : "\n");
    }
    if (tty) std::fprintf(stderr, "\n");
  }

  if (options.json) {
    json j;
    j["uri"] = ds->uri();
    j["name"] = m.name;
    j["created_by"] = m.created_by;
    j["format"] = ds->format();
    j["format_version"] = m.format_version;
    j["fingerprint"] = m.fingerprint;
    j["episodes"] = n;
    j["shards"] = m.shards.size();
    j["bytes"] = m.total_bytes;
    j["shard_bytes"] = shard_bytes;
    j["duration_s"] = m.total_duration_s;
    j["episode_duration_s"] = {{"min", n ? min_d : 0}, {"max", max_d},
                               {"mean", n ? m.total_duration_s / n : 0}};
    j["verified"] = options.verify;
    j["streams"] = json::array();
    for (size_t s = 0; s < m.streams.size(); ++s) {
      const StreamInfo& si = m.streams[s];
      json js = {{"name", si.name},   {"kind", std::string(format::StreamKindName(si.kind))},
                 {"rate", si.rate},   {"shape", si.shape},
                 {"total_frames", totals[s]}};
      if (si.kind != pb::TEXT) js["codec"] = si.codec;
      if (!si.names.empty()) js["names"] = si.names;
      if (!si.pix_fmt.empty()) js["pix_fmt"] = si.pix_fmt;
      j["streams"].push_back(std::move(js));
    }
    j["stats"] = json::object();
    for (const auto& [name, st] : m.stats) {
      j["stats"][name] = {{"mean", st.mean}, {"std", st.std}, {"min", st.min}, {"max", st.max},
                          {"count", st.count}};
    }
    j["shard_list"] = json::array();
    for (const ShardInfo& s : m.shards) {
      j["shard_list"].push_back({{"path", s.path}, {"bytes", s.bytes}, {"episodes", s.episodes}});
    }
    std::printf("%s\n", JsonText(j, 2).c_str());
    return absl::OkStatus();
  }

  std::printf("dataset      %s  (%s, created by %s)\n", ds->uri().c_str(), m.name.c_str(),
              m.created_by.c_str());
  if (native) {
    std::printf("format       conveyor v%u, fingerprint %s\n", m.format_version,
                m.fingerprint.c_str());
  } else {
    std::printf("format       %s, read in place, fingerprint %s\n", ds->format().c_str(),
                m.fingerprint.c_str());
  }
  std::printf("episodes     %zu, %.1f s in all (min %.1f s, mean %.1f s, max %.1f s)\n", n,
              m.total_duration_s, n ? min_d : 0.0, n ? m.total_duration_s / n : 0.0, max_d);
  if (native) {
    std::printf("shards       %zu, %s (%s in all)\n", m.shards.size(),
                HumanBytes(static_cast<double>(shard_bytes)).c_str(),
                HumanBytes(static_cast<double>(m.total_bytes)).c_str());
  } else {
    std::printf("data files   %zu (each episode's frames; videos are indexed when first read)\n",
                m.shards.size());
  }
  if (options.verify) {
    std::printf("verified     %s\n", native ? "every packet, block and index checksum matches"
                                            : "every row, frame and packet checked against the "
                                              "metadata and the videos' indexes");
  }
  std::printf("\n%-22s %-7s %-14s %-10s %-22s %s\n", "stream", "kind", "codec", "rate", "shape",
              "frames/steps");
  for (size_t s = 0; s < m.streams.size(); ++s) {
    const StreamInfo& si = m.streams[s];
    std::printf("%-22s %-7s %-14s %-10s %-22s %llu\n", si.name.c_str(),
                std::string(format::StreamKindName(si.kind)).c_str(), si.codec.c_str(),
                RateText(si).c_str(), ShapeText(si).c_str(),
                static_cast<unsigned long long>(totals[s]));
  }
  if (!m.stats.empty()) {
    std::printf("\nnormalization statistics (per dimension)\n");
    for (const auto& [name, st] : m.stats) {
      std::printf("  %s (%llu steps)\n", name.c_str(), static_cast<unsigned long long>(st.count));
      std::printf("    mean %s\n    std  %s\n    min  %s\n    max  %s\n", Vec(st.mean, 6).c_str(),
                  Vec(st.std, 6).c_str(), Vec(st.min, 6).c_str(), Vec(st.max, 6).c_str());
    }
  }
  return absl::OkStatus();
}


// `conveyor inspect`: its flags and its run (tools/command.h).
class InspectCommand final : public Command {
 public:
  CLI::App* Register(CLI::App& app) override {
    CLI::App* c = app.add_subcommand("inspect", "Describe a dataset: episodes, streams, shards, statistics");
    c->add_option("dataset", o_.dataset, "Dataset path or URL (http://host:port/prefix/)")->required();
    c->add_flag("--json", o_.json, "Print one JSON object");
    c->add_flag("--verify", o_.verify, "Read every shard and check every checksum");
    return c;
  }
  absl::Status Run() override {
    return RunInspect(o_);
  }

 private:
  InspectOptions o_;
};

std::unique_ptr<Command> NewInspectCommand() {
  return std::make_unique<InspectCommand>();
}

}  // namespace conveyor::tools
