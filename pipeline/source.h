// Source: what a pipeline reads. One dataset, or a weighted mixture of datasets mapped onto one
// shared sample spec (docs/mixtures.md). A mixture is a dataset like any other: wherever a
// dataset location is accepted, the path of a mixture file (YAML with a `mixture:` section) is
// too, and it has a name, a fingerprint and a manifest view (the union of its members' streams
// under their shared names) that configs are checked against.
//
// A member's samples are its own dataset's samples (its own shuffle and GOP schedule, its own
// normalization statistics), assembled with the shared spec bound to its streams, then conformed
// to the shared layout: renamed, low-dimensional streams padded to a common dimension (with a
// `<name>_dim_is_pad` mask), streams the member lacks delivered as padding with `_is_pad` true,
// and an optional int32 tag stream naming the member.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "sample/sample_assembler.h"
#include "sample/sample_spec.h"
#include "datasets/dataset.h"
#include "format/manifest.h"
#include "storage/storage.h"

namespace conveyor {

struct MixtureMember {
  std::string name;        // unique within the mixture; in ids, stats and metrics
  std::string uri;         // as given (relative paths resolve against the mixture file)
  double weight = 1;       // > 0; shares are weight / sum of weights
  int32_t tag = 0;         // value of the tag stream (default: the member's index)
  std::map<std::string, std::string> rename;  // shared stream name -> this dataset's stream name
  std::set<std::string> missing;              // shared streams this dataset lacks (padding)
};

// A member's binding of the shared spec: its own spec (its streams, its statistics) and, per
// stream of the shared spec, where the stream comes from.
struct BoundMember {
  SampleSpec spec;  // the shared spec's streams this member has, in shared order
  // Per stream of the shared spec: the index in `spec.streams`, or -1 when missing (padding).
  std::vector<int> stream_of;
};

// The shared layout of one stream across members, for padding and shape checks.
struct SharedStream {
  std::vector<int64_t> shape;         // the tensor's shape (text: empty, variable)
  DType dtype = DType::kUint8;
  int64_t pad_len = 0;                // elements of `<name>_is_pad` (0 for text)
  int64_t dim = 0;                    // lowdim: the member dimension is padded to this (0: none)
};

class Source {
 public:
  // A dataset location (see Dataset::Open) or the path of a mixture file (*.yaml / *.yml).
  static absl::StatusOr<std::unique_ptr<Source>> Open(std::string_view location,
                                                      const HttpOptions& http = {});
  // One dataset the caller keeps alive.
  static std::unique_ptr<Source> Of(const Dataset& dataset);
  // A mixture from its YAML text; `source` names it in errors, `base_dir` resolves relative
  // member paths. Every member is opened (an unreadable one is an error, never a thinner mixture).
  static absl::StatusOr<std::unique_ptr<Source>> MixtureFromYaml(std::string_view yaml,
                                                                 std::string_view source,
                                                                 std::string_view base_dir,
                                                                 const HttpOptions& http = {});
  ~Source();

  bool is_mixture() const { return mixture_; }
  const std::string& uri() const { return uri_; }
  // One dataset: its manifest. A mixture: name, fingerprint (over the members' fingerprints,
  // weights and mappings) and the union of the members' streams under their shared names.
  const Manifest& manifest() const { return manifest_; }
  size_t size() const { return datasets_.size(); }
  const Dataset& dataset(size_t k) const { return *datasets_[k]; }
  const MixtureMember& member(size_t k) const { return members_[k]; }
  std::vector<double> weights() const;
  // Its datasets' storage counters, summed.
  StorageStats storage_stats() const;
  const std::string& tag_stream() const { return tag_stream_; }

  // Binds a spec parsed against manifest() to every member (re-reading its config text against
  // each member's renamed streams) and checks that stacked batches are possible: equal shapes
  // per stream, or an error naming dataset, stream and shapes. One dataset: the spec itself.
  absl::StatusOr<std::vector<BoundMember>> Bind(const SampleSpec& spec) const;
  // The shared layout per stream of `spec` (after Bind).
  absl::StatusOr<std::vector<SharedStream>> Layout(const SampleSpec& spec,
                                                   const std::vector<BoundMember>& bound) const;

  // Maps member k's sample (assembled with bound[k].spec) onto the shared layout, in place.
  absl::Status Conform(size_t k, const SampleSpec& spec, const BoundMember& bound,
                       const std::vector<SharedStream>& layout, Sample* sample) const;

 private:
  Source() = default;
  absl::Status BuildManifest();
  absl::StatusOr<Manifest> MemberManifest(size_t k) const;

  bool mixture_ = false;
  std::string uri_;
  Manifest manifest_;
  std::vector<std::unique_ptr<Dataset>> owned_;
  std::vector<const Dataset*> datasets_;
  std::vector<MixtureMember> members_;
  std::string tag_stream_;                  // empty: no tag stream
  std::map<std::string, int64_t> pad_dims_;  // lowdim stream -> common dimension
};

}  // namespace conveyor
