#include "sample/quarantine.h"

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/json_text.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "sample/yaml_config.h"

namespace conveyor {

using json = nlohmann::json;

absl::Status WriteQuarantineFile(const std::string& path, const Quarantine& quarantine) {
  json j;
  j["written_by"] = "conveyor check";
  j["datasets"] = json::array();
  for (const QuarantinedDataset& d : quarantine.datasets) {
    json e = {{"name", d.name}, {"uri", d.uri}, {"fingerprint", d.fingerprint},
              {"episodes", json::array()}};
    for (const auto& [episode, reason] : d.episodes) {
      e["episodes"].push_back({{"episode", episode}, {"reason", reason}});
    }
    j["datasets"].push_back(std::move(e));
  }
  // Written whole, then renamed: a reader never sees half a file.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << JsonText(j, 2) << "\n";
    if (!out.good()) return absl::InternalError(StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<Quarantine> ReadQuarantineFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("quarantine file ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  Quarantine q;
  try {
    const json j = json::parse(text.str());
    for (const json& d : j.at("datasets")) {
      QuarantinedDataset e;
      e.name = d.value("name", "");
      e.uri = d.value("uri", "");
      e.fingerprint = d.at("fingerprint").get<std::string>();
      for (const json& ep : d.at("episodes")) {
        e.episodes[ep.at("episode").get<uint64_t>()] = ep.value("reason", "");
      }
      q.datasets.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        StrCat("quarantine file ", path, " is not what conveyor check writes: ", e.what()));
  }
  return q;
}

absl::StatusOr<std::set<uint64_t>> QuarantinedEpisodes(const std::string& path,
                                                       const Dataset& dataset) {
  ASSIGN_OR_RETURN(Quarantine q, ReadQuarantineFile(path));
  const std::string& fingerprint = dataset.manifest().fingerprint;
  std::string listed;
  // The entry with the dataset's fingerprint; among several (copies of one dataset, as a mixture
  // may hold), the one checked at the same location.
  const QuarantinedDataset* entry = nullptr;
  for (const QuarantinedDataset& d : q.datasets) {
    if (d.fingerprint != fingerprint) {
      StrAppend(&listed, listed.empty() ? "" : ", ", d.uri, " (", d.fingerprint, ")");
    } else if (entry == nullptr || (entry->uri != dataset.uri() && d.uri == dataset.uri())) {
      entry = &d;
    }
  }
  if (entry != nullptr) {
    const QuarantinedDataset& d = *entry;
    std::set<uint64_t> out;
    for (const auto& [episode, reason] : d.episodes) {
      if (episode >= dataset.num_episodes()) {
        return absl::InvalidArgumentError(StrCat("quarantine file ", path, " lists episode ",
                                                 episode, " of ", dataset.uri(), ", which has ",
                                                 dataset.num_episodes(), " episodes"));
      }
      out.insert(episode);
    }
    return out;
  }
  return absl::FailedPreconditionError(
      StrCat("quarantine file ", path, " has no entry for ", dataset.uri(), " (fingerprint ",
             fingerprint, "); it lists ", listed.empty() ? "no dataset" : listed,
             ". Run conveyor check --write-quarantine on this dataset again"));
}

absl::StatusOr<std::set<uint64_t>> QuarantinedEpisodes(const SampleSpec& spec,
                                                       const Dataset& dataset) {
  if (spec.quarantine.empty()) return std::set<uint64_t>();
  return QuarantinedEpisodes(spec.quarantine, dataset);
}

absl::StatusOr<std::optional<std::string>> QuarantinePathOfConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("config ", path, " cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(text.str(), path));
  if (!root.IsMap() || !root["quarantine"]) return std::optional<std::string>();
  if (!root["quarantine"].IsScalar()) {
    return yaml::ConfigError(path, root["quarantine"], "quarantine must be a file path");
  }
  return std::optional<std::string>(root["quarantine"].Scalar());
}

}  // namespace conveyor
