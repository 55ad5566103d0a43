#include "server/internal/stream_config.h"

#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "pipeline/order_digest.h"
#include "sample/tokenizer.h"

namespace conveyor {

absl::StatusOr<std::shared_ptr<Config>> ResolveConfig(const Source& ds, std::string name, std::string text,
                                                      std::string_view source, uint32_t schedule_version) {
  auto c = std::make_shared<Config>();
  c->name = std::move(name);
  c->text = std::move(text);
  ASSIGN_OR_RETURN(c->spec, SampleSpec::FromYaml(c->text, ds.manifest(), source));
  RETURN_IF_ERROR(c->options.MergeYaml(c->text, c->spec, ds.manifest(), source));
  if (schedule_version != 0) c->options.order.version = schedule_version;
  // The digest a failing-over client compares: the config's text, and the schedule version
  // when it shapes the samples (GOP mode from version 2; every mode from version 3, whose audio
  // is decoded in chunks). A version-1 order, and a naive one of version 2, keep the digest
  // servers gave before versions existed, so old and new servers of one job agree exactly when
  // their samples do.
  // The tokenizer models the config names go in too (their SHA-256): the same text with another
  // model gives other ids. A config without one keeps the digest it had.
  const uint32_t version = c->options.order.version;
  std::string identity = version == 1 || (c->options.order.naive() && version == 2)
                             ? c->text
                             : StrCat(c->text, std::string_view("\0", 1), "schedule_version=",
                                      c->options.order.version);
  const std::string files = TokenizerIdentity(c->spec);
  if (!files.empty()) StrAppend(&identity, std::string_view("\0", 1), files);
  c->digest = Sha256Hex(identity);
  // The schedule shapes the order: resolve it from the config's own byte budget, before the
  // server's per-stream budget applies, so every server and `conveyor batches` agree.
  RETURN_IF_ERROR(ResolveSchedule(ds, c->spec, &c->options));
  ASSIGN_OR_RETURN(const std::string order, OrderIdentityText(c->text, c->options, files));
  c->order_digest = Sha256Hex(order);
  return c;
}

}  // namespace conveyor
