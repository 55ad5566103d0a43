#include "pipeline/order_digest.h"

#include <yaml-cpp/yaml.h>

#include "base/status_macros.h"
#include "base/strings.h"
#include "sample/yaml_config.h"

namespace conveyor {
namespace {

std::string OrderText(const OrderOptions& o) {
  return StrCat("version=", o.version, " naive=", o.naive() ? 1 : 0, " block_steps=", o.block_steps,
                " window_blocks=", o.window_blocks, " gop_blocks=", o.blocks ? 1 : 0,
                // The group size shapes a bucketed order; it follows global_batch_size when the
                // config names none, so a resume at another batch size is then another order.
                o.bucket_group > 0 ? StrCat(" bucket_group=", o.bucket_group) : std::string());
}

}  // namespace

absl::StatusOr<std::string> OrderIdentityText(std::string_view config_text, const PipelineOptions& resolved,
                                              std::string_view files) {
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(config_text, "config"));
  std::string spec;
  try {
    YAML::Node copy = YAML::Clone(root);
    if (copy.IsMap()) copy.remove("pipeline");
    YAML::Emitter out;
    out << copy;
    spec = out.c_str();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat("config: ", e.what()));
  }
  std::string order = StrCat("seed=", resolved.seed, " ", OrderText(resolved.order));
  for (const OrderOptions& m : resolved.member_orders) StrAppend(&order, "\nmember ", OrderText(m));
  if (files.empty()) return StrCat(spec, "\n---\n", order);
  return StrCat(spec, "\n---\n", order, "\n---\n", files);
}

}  // namespace conveyor
