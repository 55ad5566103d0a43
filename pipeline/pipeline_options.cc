// PipelineOptions::MergeYaml (pipeline/pipeline.h): the `pipeline:` and `packing:` sections of a
// config file, checked key by key, merged over the options already set.
#include <yaml-cpp/yaml.h>

#include <limits>
#include <string>

#include "base/status_macros.h"
#include "base/strings.h"
#include "pipeline/pipeline.h"
#include "sample/yaml_config.h"

namespace conveyor {

absl::Status PipelineOptions::MergeYaml(std::string_view yaml, const SampleSpec& spec,
                                        const Manifest& manifest, std::string_view source) {
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(yaml, source));
  if (!root.IsMap()) return absl::OkStatus();
  try {
    if (const YAML::Node p = root["pipeline"]) {
      RETURN_IF_ERROR(yaml::CheckKeys(source, p, "pipeline",
                                      {"seed", "global_batch_size", "threads", "queue_bytes",
                                       "schedule", "max_epochs"}));
      // Ceilings that keep config arithmetic far from overflow (and a typo from asking for a
      // billion threads); a server applies its own, lower ceilings on top (server/server.h).
      auto uint = [&](const char* key, uint64_t min, uint64_t max, uint64_t* out) -> absl::Status {
        if (!p[key]) return absl::OkStatus();
        int64_t v = 0;
        try {
          v = p[key].as<int64_t>();
        } catch (const YAML::Exception&) {
          return yaml::ConfigError(source, p[key], StrCat("pipeline.", key, " must be an integer"));
        }
        if (v < static_cast<int64_t>(min) || static_cast<uint64_t>(v) > max) {
          return yaml::ConfigError(source, p[key], StrCat("pipeline.", key, " is ", v,
                                                          "; it must be in [", min, ", ", max, "]"));
        }
        *out = static_cast<uint64_t>(v);
        return absl::OkStatus();
      };
      constexpr uint64_t kAny = std::numeric_limits<int64_t>::max();
      RETURN_IF_ERROR(uint("seed", 0, kAny, &seed));
      RETURN_IF_ERROR(uint("global_batch_size", 1, kMaxGlobalBatchSize, &global_batch_size));
      RETURN_IF_ERROR(uint("queue_bytes", 1 << 20, kMaxQueueBytes, &queue_bytes));
      RETURN_IF_ERROR(uint("max_epochs", 0, kAny, &max_epochs));
      uint64_t t = static_cast<uint64_t>(threads);
      RETURN_IF_ERROR(uint("threads", 0, kMaxThreads, &t));
      threads = static_cast<int>(t);
      if (const YAML::Node s = p["schedule"]) {
        schedule_given = true;
        RETURN_IF_ERROR(yaml::CheckKeys(source, s, "pipeline.schedule",
                                        {"mode", "block_steps", "window_blocks", "version"}));
        uint32_t version = kScheduleVersionCurrent;
        if (s["version"]) {
          int64_t v = 0;
          try {
            v = s["version"].as<int64_t>();
          } catch (const YAML::Exception&) {
            v = -1;
          }
          if (v < 1 || v > kScheduleVersionCurrent) {
            return yaml::ConfigError(source, s["version"],
                                     "pipeline.schedule.version must be 1 (blocks of block_steps samples, "
                                     "as before 2026-11), 2 (whole GOPs per episode), 3 (version 2's "
                                     "order, audio decoded in chunks) or 4 (version 3, video crops cut "
                                     "in the decoder)");
          }
          version = static_cast<uint32_t>(v);
        }
        std::string mode = "gop";
        if (s["mode"]) mode = s["mode"].as<std::string>();
        if (mode != "naive" && mode != "gop") {
          return yaml::ConfigError(source, s["mode"], StrCat("pipeline.schedule.mode is '", mode,
                                                     "'; expected naive or gop"));
        }
        if (mode == "naive") {
          order = OrderOptions{};
          order.version = version;
        } else {
          order = OrderOptions{};
          order.version = version;
          order.block_steps = 0;  // 0 = auto, resolved in Create
          order.window_blocks = 0;
          auto sub = [&](const char* key, uint64_t* out) -> absl::Status {
            if (!s[key]) return absl::OkStatus();
            int64_t v = 0;
            try {
              v = s[key].as<int64_t>();
            } catch (const YAML::Exception&) {
              return yaml::ConfigError(source, s[key], StrCat("pipeline.schedule.", key, " must be an integer"));
            }
            if (v < 1 || static_cast<uint64_t>(v) > kMaxScheduleValue) {
              return yaml::ConfigError(source, s[key], StrCat("pipeline.schedule.", key, " is ", v,
                                                              "; it must be in [1, ", kMaxScheduleValue, "]"));
            }
            *out = static_cast<uint64_t>(v);
            return absl::OkStatus();
          };
          RETURN_IF_ERROR(sub("block_steps", &order.block_steps));
          RETURN_IF_ERROR(sub("window_blocks", &order.window_blocks));
        }
      }
    }
    if (const YAML::Node pk = root["packing"]) {
      ASSIGN_OR_RETURN(PackingSpec ps, PackingSpec::FromYaml(pk, spec, source, &manifest));
      if (ps.enabled) {
        packing = std::move(ps);
      } else {
        packing.reset();
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": ", e.msg));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
