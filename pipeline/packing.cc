#include "pipeline/packing.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "base/status_macros.h"
#include "base/strings.h"
#include "base/worker_pool.h"
#include "conveyor/format/v1/shard.pb.h"
#include "sample/yaml_config.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

constexpr int64_t kMaxTokensLimit = int64_t{1} << 24;  // segment_ids is S x max_tokens int32
constexpr int64_t kMaxCost = int64_t{1} << 20;
constexpr size_t kAlign = 64;

// ---- config parsing (sample/yaml_config.h) ----
using yaml::Bool;
using yaml::CheckKeys;
using yaml::Integer;
using yaml::JoinNames;
constexpr auto& Bad = yaml::ConfigError;

// A tokenized text stream's tensor holds token ids, so its cost is per token; raw text's is per
// byte of UTF-8.
std::string_view UnitKey(const StreamSpec& s) {
  if (s.kind == pb::TEXT && s.tokenizer != nullptr) return "per_token";
  switch (s.kind) {
    case pb::VIDEO:
    case pb::IMAGE:
      return "per_frame";
    case pb::LOWDIM:
      return "per_step";
    case pb::AUDIO:
      return "per_second";
    case pb::TEXT:
      return "per_byte";
    default:
      return "";
  }
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Audio tokens of `samples` output samples at `rate` per second: ceil(samples / rate * per_second)
// in integers, so a window of exactly one second at 50 tokens/s is 50 tokens, never 51.
int64_t AudioTokens(int64_t samples, const StreamTokens& cost) {
  if (cost.audio_rate <= 0 || samples <= 0) return 0;
  return CeilDiv(samples * cost.per_unit, cost.audio_rate);
}

int64_t PatchTokens(int64_t height, int64_t width, int64_t patch) {
  return CeilDiv(height, patch) * CeilDiv(width, patch);
}

// A frame's most tokens at per_patch: the largest bucket's, or the stream's `size`; 0 when the
// frames keep their own size (CountTokens checks each sample against max_tokens).
int64_t MaxPatchTokens(const SampleSpec& spec, const StreamSpec& s, int64_t patch) {
  int64_t most = s.height > 0 ? PatchTokens(s.height, s.width, patch) : 0;
  for (const BucketSize& b : spec.buckets.sizes) {
    most = std::max(most, PatchTokens(b.height, b.width, patch));
  }
  return most;
}

// The most tokens a sample of `spec` costs in its fixed-size streams (all but text).
int64_t FixedTokens(const SampleSpec& spec, const PackingSpec& p, std::string* breakdown) {
  int64_t total = 0;
  for (size_t k = 0; k < spec.streams.size(); ++k) {
    const StreamSpec& s = spec.streams[k];
    const StreamTokens& c = p.tokens[k];
    if (c.per_unit == 0) continue;
    int64_t n = 0;
    if (s.kind == pb::AUDIO) {
      n = AudioTokens(
          std::llround((s.window_end - s.window_start) * static_cast<double>(c.audio_rate)), c);
    } else if (c.patch > 0) {
      n = static_cast<int64_t>(s.deltas.size()) * MaxPatchTokens(spec, s, c.patch);
    } else if (!s.stored_shape.empty()) {  // one tensor of stored_shape[0] rows (pad_to's N)
      // Keyed buckets take any shape: the first sample's rows bound nothing, so CountTokens
      // checks each sample.
      n = spec.buckets.by == static_cast<int>(k) ? 0 : s.stored_shape[0] * c.per_unit;
    } else if (s.kind != pb::TEXT) {
      n = static_cast<int64_t>(s.deltas.size()) * c.per_unit;
    }
    if (n == 0) continue;
    total += n;
    StrAppend(breakdown, breakdown->empty() ? "" : ", ", s.name, " ", n);
  }
  return total;
}

absl::StatusOr<PackingSpec> ParsePacking(const YAML::Node& node, const SampleSpec& spec,
                                         std::string_view source, const Manifest* manifest) {
  PackingSpec p;
  p.tokens.assign(spec.streams.size(), StreamTokens{});
  RETURN_IF_ERROR(CheckKeys(source, node, "packing",
                            {"enabled", "max_tokens", "window", "tokens", "count_padding"}));
  p.enabled = true;
  if (node["enabled"]) {
    ASSIGN_OR_RETURN(p.enabled, Bool(source, node["enabled"], "packing.enabled"));
  }
  if (node["max_tokens"]) {
    ASSIGN_OR_RETURN(p.max_tokens,
                     Integer(source, node["max_tokens"], "packing.max_tokens", 1, kMaxTokensLimit));
  } else if (p.enabled) {
    return Bad(source, node, "packing needs max_tokens (the tokens of one packed sequence)");
  }
  if (node["window"]) {
    ASSIGN_OR_RETURN(int64_t w, Integer(source, node["window"], "packing.window", 0,
                                        std::numeric_limits<int32_t>::max()));
    p.window = static_cast<size_t>(w);
  }
  if (node["count_padding"]) {
    ASSIGN_OR_RETURN(p.count_padding, Bool(source, node["count_padding"], "packing.count_padding"));
  }
  const YAML::Node tokens = node["tokens"];
  if (!tokens) {
    if (p.enabled) return Bad(source, node, "packing needs tokens (the token cost of each stream)");
    return p;
  }
  if (!tokens.IsMap()) return Bad(source, tokens, "packing.tokens must be a mapping of streams");
  std::set<std::string> names;
  for (const auto& s : spec.streams) names.insert(s.name);
  bool any_cost = false;
  for (const auto& kv : tokens) {
    const std::string name = kv.first.as<std::string>();
    auto it = std::find_if(spec.streams.begin(), spec.streams.end(),
                           [&](const StreamSpec& s) { return s.name == name; });
    if (it == spec.streams.end()) {
      return Bad(source, kv.first,
                 StrCat("packing.tokens: '", name,
                        "' is not a stream of the sample spec (streams: ", JoinNames(names), ")"));
    }
    const StreamSpec& s = *it;
    const std::string what = StrCat("packing.tokens.", name);
    const std::string key(UnitKey(s));
    if (s.kind == pb::TEXT && key == "per_byte" && kv.second["per_token"]) {
      return Bad(source, kv.second["per_token"],
                 StrCat(what, ".per_token needs a tokenizer on stream '", name,
                        "' (streams: ", name, ": {tokenizer: {model: ...}}); without one its "
                        "cost is per_byte"));
    }
    if (key == "per_token" && kv.second["per_byte"]) {
      return Bad(source, kv.second["per_byte"],
                 StrCat(what, ": '", name, "' has a tokenizer, so its tensor is token ids and "
                        "its cost is per_token (e.g. {per_token: 1}), not per_byte"));
    }
    StreamTokens& c = p.tokens[static_cast<size_t>(it - spec.streams.begin())];
    if (key == "per_frame" && kv.second.IsMap() && kv.second["per_patch"]) {
      RETURN_IF_ERROR(CheckKeys(source, kv.second, what, {"per_patch"}));
      ASSIGN_OR_RETURN(c.patch, Integer(source, kv.second["per_patch"], StrCat(what, ".per_patch"),
                                        1, 1 << 14));
      c.per_unit = 1;
      any_cost = true;
      continue;
    }
    RETURN_IF_ERROR(CheckKeys(source, kv.second, what, {key}));
    if (!kv.second[key]) return Bad(source, kv.second, StrCat(what, " needs ", key));
    ASSIGN_OR_RETURN(c.per_unit,
                     Integer(source, kv.second[key], StrCat(what, ".", key), 0, kMaxCost));
    if (s.kind == pb::AUDIO && c.per_unit > 0) {
      if (s.audio_rate > 0) {
        c.audio_rate = s.audio_rate;
      } else if (manifest != nullptr && s.stream >= 0 &&
                 static_cast<size_t>(s.stream) < manifest->streams.size()) {
        // What the assembler resamples to when the spec gives no rate.
        c.audio_rate = std::lround(manifest->streams[static_cast<size_t>(s.stream)].rate);
      }
      if (c.audio_rate <= 0) {
        return Bad(source, kv.second[key],
                   StrCat(what, ".per_second needs the audio rate: set `rate:` for '", name,
                          "' in streams, or parse with the dataset's manifest"));
      }
    }
    any_cost = any_cost || c.per_unit > 0;
  }
  if (!p.enabled) return p;
  if (!any_cost) return Bad(source, tokens, "packing.tokens gives every stream 0 tokens");
  std::string breakdown;
  const int64_t fixed = FixedTokens(spec, p, &breakdown);
  if (fixed > p.max_tokens) {
    return Bad(source, node["max_tokens"],
               StrCat("a sample of this spec costs up to ", fixed, " tokens before text (",
                      breakdown, "), over packing.max_tokens ", p.max_tokens));
  }
  return p;
}

// ---- batch building ----

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// One tensor name of the batch: where each sample's tensor is and the stacked shape.
struct StackedTensor {
  std::string name;
  DType dtype = DType::kUint8;
  bool has_first_axis = true;        // false for rank-0 tensors
  std::vector<int64_t> inner;        // dimensions after the first
  TensorRole role = TensorRole::kData;  // the samples' tensor's
  int64_t max_len = 0;               // longest first dimension
  bool masked = false;               // padded to max_len, with `<name>_mask`
  std::vector<const OwnedTensor*> parts;  // per sample
  size_t view = 0, mask_view = 0;    // indices into Batch::tensors
};

std::string SampleName(const Sample& s, size_t position) {
  return StrCat("sample ", s.index, " (batch position ", position, ")");
}

absl::StatusOr<std::vector<StackedTensor>> PlanStack(const std::vector<Sample>& samples,
                                                     const SampleSpec& spec) {
  if (samples.empty()) return absl::InvalidArgumentError("a batch needs at least one sample");
  const Sample& first = samples.front();
  std::vector<StackedTensor> out;
  std::set<std::string> names;
  for (const OwnedTensor& t : first.tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          StrCat(SampleName(first, 0), " has two tensors named '", t.name, "'"));
    }
  }
  for (const OwnedTensor& t0 : first.tensors) {
    StackedTensor st;
    st.name = t0.name;
    st.dtype = t0.dtype;
    st.role = t0.role;
    st.has_first_axis = !t0.shape.empty();
    if (st.has_first_axis) st.inner.assign(t0.shape.begin() + 1, t0.shape.end());
    for (const StreamSpec& s : spec.streams) {
      if (s.name == t0.name && s.kind == pb::TEXT) st.masked = true;
    }
    for (size_t j = 0; j < samples.size(); ++j) {
      const Sample& sj = samples[j];
      if (sj.tensors.size() != first.tensors.size()) {
        return absl::InvalidArgumentError(StrCat(
            SampleName(sj, j), " has ", sj.tensors.size(), " tensors and ", SampleName(first, 0),
            " has ", first.tensors.size(), "; every sample of a batch needs the same tensors"));
      }
      const OwnedTensor* t = sj.Find(t0.name);
      if (t == nullptr) {
        return absl::InvalidArgumentError(
            StrCat(SampleName(sj, j), " has no tensor '", t0.name, "'"));
      }
      if (t->dtype != t0.dtype) {
        return absl::InvalidArgumentError(
            StrCat("tensor '", t0.name, "' is ", DTypeName(t->dtype), " in ", SampleName(sj, j),
                   " and ", DTypeName(t0.dtype), " in ", SampleName(first, 0)));
      }
      const bool same_inner = t->shape.size() == t0.shape.size() &&
                              (t0.shape.empty() || std::equal(t0.shape.begin() + 1, t0.shape.end(),
                                                              t->shape.begin() + 1));
      if (!same_inner) {
        return absl::InvalidArgumentError(
            StrCat("tensor '", t0.name, "' has shape ", ShapeText(t->shape), " in ",
                   SampleName(sj, j), " and ", ShapeText(t0.shape), " in ", SampleName(first, 0),
                   "; only the first dimension may differ between samples"));
      }
      for (int64_t d : t->shape) {
        if (d < 0) {
          return absl::InvalidArgumentError(StrCat("tensor '", t0.name, "' of ", SampleName(sj, j),
                                                   " has shape ", ShapeText(t->shape)));
        }
      }
      if (t->bytes() != t->num_elements() * DTypeSize(t->dtype)) {
        return absl::InvalidArgumentError(
            StrCat("tensor '", t0.name, "' of ", SampleName(sj, j), " holds ", t->bytes(),
                   " bytes; shape ", ShapeText(t->shape), " ", DTypeName(t->dtype), " needs ",
                   t->num_elements() * DTypeSize(t->dtype)));
      }
      if (st.has_first_axis) {
        if (j > 0 && t->shape[0] != st.max_len) st.masked = true;
        st.max_len = std::max(st.max_len, t->shape[0]);
      }
      st.parts.push_back(t);
    }
    if (st.masked && names.count(StrCat(st.name, "_mask"))) {
      return absl::InvalidArgumentError(StrCat("tensor '", st.name, "' needs a mask named '",
                                               st.name,
                                               "_mask' and the samples have a tensor of "
                                               "that name"));
    }
    out.push_back(std::move(st));
  }
  return out;
}

// Appends a view at the next 64-byte aligned offset after *end.
size_t AddView(Batch* batch, size_t* end, std::string name, DType dtype,
               std::vector<int64_t> shape, TensorRole role) {
  TensorView v;
  v.name = std::move(name);
  v.dtype = dtype;
  v.role = role;
  v.shape = std::move(shape);
  size_t elements = 1;
  for (int64_t d : v.shape) elements *= static_cast<size_t>(d);
  v.bytes = elements * DTypeSize(dtype);
  v.offset = AlignUp(*end);
  *end = v.offset + v.bytes;
  batch->tensors.push_back(std::move(v));
  return batch->tensors.size() - 1;
}

// The samples' tensors stacked. Their roles as the wire protocol has them: padding masks stay
// masks; the rest is data in a stacked batch, while a packed one marks what is not a stream's
// samples (a mixture's tag, the `<name>_mask` of a variable length) as per-sample bookkeeping.
void AddStackedViews(std::vector<StackedTensor>& plan, size_t b, bool packed, Batch* batch,
                     size_t* end) {
  const TensorRole bookkeeping = packed ? TensorRole::kSampleInfo : TensorRole::kData;
  for (StackedTensor& st : plan) {
    std::vector<int64_t> shape = {static_cast<int64_t>(b)};
    if (st.has_first_axis) shape.push_back(st.max_len);
    shape.insert(shape.end(), st.inner.begin(), st.inner.end());
    const TensorRole role = st.role == TensorRole::kSampleInfo ? bookkeeping : st.role;
    st.view = AddView(batch, end, st.name, st.dtype, std::move(shape), role);
    if (st.masked) {
      st.mask_view = AddView(batch, end, StrCat(st.name, "_mask"), DType::kBool,
                             {static_cast<int64_t>(b), st.max_len}, bookkeeping);
    }
  }
}

absl::StatusOr<std::shared_ptr<HostBuffer>> AllocateFor(const Batch& batch, size_t end,
                                                        bool pinned, const BatchBuffers& buffers) {
  const size_t bytes = std::max(AlignUp(end), kAlign);
  std::shared_ptr<HostBuffer> buffer;
  if (buffers) {
    ASSIGN_OR_RETURN(buffer, buffers(bytes));
  } else {
    buffer = HostBuffer::Allocate(bytes, pinned);
  }
  if (buffer == nullptr || buffer->data() == nullptr || buffer->size() < end) {
    return absl::ResourceExhaustedError(
        StrCat("cannot allocate a batch buffer of ", bytes, " bytes"));
  }
  // Zero the alignment gaps and the tail, so the buffer's bytes are a function of the batch.
  size_t pos = 0;
  for (const TensorView& v : batch.tensors) {
    std::memset(buffer->data() + pos, 0, v.offset - pos);
    pos = v.offset + v.bytes;
  }
  std::memset(buffer->data() + pos, 0, buffer->size() - pos);
  return buffer;
}

// Batches of at least this many bytes are filled on several threads: one thread copies at
// about 10 GB/s, which bounds a pipeline whose samples come from a warm frame cache.
constexpr size_t kParallelFillBytes = 4 << 20;

// Sample j's slot of every stacked tensor; the samples' slots are disjoint.
void FillSlot(const std::vector<StackedTensor>& plan, Batch* batch, size_t j) {
  uint8_t* base = batch->buffer->data();
  for (const StackedTensor& st : plan) {
    if (j >= st.parts.size()) continue;
    const TensorView& v = batch->tensors[st.view];
    size_t row_elements = 1;
    for (int64_t d : st.inner) row_elements *= static_cast<size_t>(d);
    const size_t row_bytes = row_elements * DTypeSize(st.dtype);
    const size_t slot_bytes =
        st.has_first_axis ? static_cast<size_t>(st.max_len) * row_bytes : DTypeSize(st.dtype);
    uint8_t* mask = st.masked ? base + batch->tensors[st.mask_view].offset : nullptr;
    const OwnedTensor& t = *st.parts[j];
    uint8_t* dst = base + v.offset + j * slot_bytes;
    const size_t n = t.bytes();
    t.CopyTo(dst);
    std::memset(dst + n, 0, slot_bytes - n);
    if (mask != nullptr) {
      const size_t len = static_cast<size_t>(t.shape[0]);
      uint8_t* row = mask + j * static_cast<size_t>(st.max_len);
      std::memset(row, 1, len);
      std::memset(row + len, 0, static_cast<size_t>(st.max_len) - len);
    }
  }
}

// Every sample's slots, on up to `threads` threads when the batch is large (the bytes land
// where they would on one thread: the result does not depend on the thread count).
void FillStacked(const std::vector<StackedTensor>& plan, Batch* batch, int threads) {
  size_t samples = 0;
  for (const StackedTensor& st : plan) samples = std::max(samples, st.parts.size());
  if (threads <= 1 || samples < 2 || batch->buffer->size() < kParallelFillBytes) {
    for (size_t j = 0; j < samples; ++j) FillSlot(plan, batch, j);
    return;
  }
  const size_t chunks = std::min<size_t>(static_cast<size_t>(threads), samples);
  // Copies cannot fail: the status is always OK.
  (void)ParallelFor("conveyor-stack", static_cast<int>(chunks), chunks, [&](size_t c) {
    for (size_t j = samples * c / chunks; j < samples * (c + 1) / chunks; ++j) FillSlot(plan, batch, j);
    return absl::OkStatus();
  });
}

std::vector<SampleId> IdsOf(const std::vector<Sample>& samples) {
  std::vector<SampleId> ids;
  ids.reserve(samples.size());
  for (const Sample& s : samples) ids.push_back(SampleId{s.index, s.episode, s.step, s.member});
  return ids;
}

// PackSamples' arguments agree: max_tokens in range, the plan made for it, a token count per
// sample, and the plan places every sample exactly once, within max_tokens per sequence.
absl::Status CheckPackInputs(const PackPlan& plan, const std::vector<Sample>& samples,
                             std::span<const int64_t> tokens, int64_t max_tokens) {
  const size_t n = samples.size();
  if (max_tokens <= 0 || max_tokens > kMaxTokensLimit) {
    return absl::InvalidArgumentError(
        StrCat("packing.max_tokens is ", max_tokens, "; it must be in [1, ", kMaxTokensLimit, "]"));
  }
  if (plan.max_tokens != 0 && plan.max_tokens != max_tokens) {
    return absl::InvalidArgumentError(StrCat("the plan was made for ", plan.max_tokens,
                                             " tokens per sequence and packing.max_tokens is ",
                                             max_tokens));
  }
  if (tokens.size() != n) {
    return absl::InvalidArgumentError(StrCat(n, " samples and ", tokens.size(), " token counts"));
  }
  // The plan must place every sample exactly once, within max_tokens per sequence.
  std::vector<int32_t> sequence_of(n, -1);
  for (size_t q = 0; q < plan.sequences.size(); ++q) {
    if (plan.sequences[q].empty()) {
      return absl::InvalidArgumentError(StrCat("packed sequence ", q, " is empty"));
    }
    int64_t used = 0;
    for (size_t i : plan.sequences[q]) {
      if (i >= n) {
        return absl::InvalidArgumentError(
            StrCat("packed sequence ", q, " names batch position ", i, " of ", n));
      }
      if (sequence_of[i] >= 0) {
        return absl::InvalidArgumentError(
            StrCat("batch position ", i, " is in packed sequences ", sequence_of[i], " and ", q));
      }
      sequence_of[i] = static_cast<int32_t>(q);
      used += tokens[i];
    }
    if (used > max_tokens) {
      return absl::InvalidArgumentError(StrCat("packed sequence ", q, " holds ", used,
                                               " tokens, over packing.max_tokens ", max_tokens));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (sequence_of[i] < 0) {
      return absl::InvalidArgumentError(StrCat("batch position ", i, " (sample ", samples[i].index,
                                               ") is in no packed sequence"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PackingSpec> PackingSpec::FromYaml(const YAML::Node& packing_node,
                                                  const SampleSpec& spec, std::string_view source,
                                                  const Manifest* manifest) {
  if (!packing_node.IsDefined() || packing_node.IsNull()) {
    PackingSpec p;
    p.tokens.assign(spec.streams.size(), StreamTokens{});
    return p;
  }
  try {
    return ParsePacking(packing_node, spec, source, manifest);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
}

absl::StatusOr<PackingSpec> PackingSpec::FromYaml(std::string_view whole_yaml,
                                                  const SampleSpec& spec, std::string_view source,
                                                  const Manifest* manifest) {
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(whole_yaml, source));
  if (root.IsDefined() && !root.IsNull() && !root.IsMap()) {
    return Bad(source, root, "the config must be a mapping");
  }
  const YAML::Node& croot = root;
  return FromYaml(root.IsMap() ? croot["packing"] : YAML::Node(), spec, source, manifest);
}

int64_t TokenCount(const Sample& sample, const SampleSpec& spec, const PackingSpec& packing,
                   std::vector<int64_t>* per_stream) {
  if (per_stream != nullptr) per_stream->assign(spec.streams.size(), 0);
  int64_t total = 0;
  for (size_t k = 0; k < spec.streams.size() && k < packing.tokens.size(); ++k) {
    const StreamSpec& s = spec.streams[k];
    const StreamTokens& cost = packing.tokens[k];
    if (cost.per_unit == 0) continue;
    const OwnedTensor* t = sample.Find(s.name);
    if (t == nullptr || t->shape.empty()) continue;
    int64_t units = t->shape[0];
    if (!packing.count_padding && s.kind != pb::TEXT) {
      const OwnedTensor* pad = sample.Find(StrCat(s.name, "_is_pad"));
      if (pad != nullptr && pad->dtype == DType::kBool &&
          pad->data.size() == static_cast<size_t>(units)) {
        units -= static_cast<int64_t>(pad->data.size()) -
                 std::count(pad->data.begin(), pad->data.end(), uint8_t{0});
      } else if (pad != nullptr && !s.stored_shape.empty() && pad->data.size() == 1 &&
                 pad->data[0] != 0) {
        units = 0;  // one padded tensor of stored_shape[0] rows
      }
    }
    int64_t per_unit = cost.per_unit;
    if (cost.patch > 0 && t->shape.size() == 4) {  // [T, H, W, 3] or [T, 3, H, W]
      const bool chw = s.layout == ImageLayout::kCHW;
      per_unit = PatchTokens(t->shape[chw ? 2 : 1], t->shape[chw ? 3 : 2], cost.patch);
    }
    const int64_t n = s.kind == pb::AUDIO ? AudioTokens(units, cost) : units * per_unit;
    if (per_stream != nullptr) (*per_stream)[k] = n;
    total += n;
  }
  return total;
}

absl::StatusOr<std::vector<int64_t>> CountTokens(std::span<const Sample> samples,
                                                 const SampleSpec& spec,
                                                 const PackingSpec& packing) {
  std::vector<int64_t> out;
  out.reserve(samples.size());
  std::vector<int64_t> per_stream;
  for (const Sample& sample : samples) {
    for (size_t k = 0; k < spec.streams.size() && k < packing.tokens.size(); ++k) {
      if (packing.tokens[k].per_unit > 0 && sample.Find(spec.streams[k].name) == nullptr) {
        return absl::InvalidArgumentError(
            StrCat("sample ", sample.index, " (episode ", sample.episode, ", step ", sample.step,
                   ") has no tensor '", spec.streams[k].name, "', which costs tokens"));
      }
    }
    const int64_t n = TokenCount(sample, spec, packing, &per_stream);
    if (packing.max_tokens > 0 && n > packing.max_tokens) {
      std::string breakdown;
      for (size_t k = 0; k < per_stream.size(); ++k) {
        if (per_stream[k] == 0) continue;
        StrAppend(&breakdown, breakdown.empty() ? "" : ", ", spec.streams[k].name, " ",
                  per_stream[k]);
      }
      return absl::InvalidArgumentError(StrCat(
          "sample ", sample.index, " (episode ", sample.episode, ", step ", sample.step, ") costs ",
          n, " tokens (", breakdown, "), over packing.max_tokens ", packing.max_tokens,
          "; samples are not truncated: raise max_tokens or cap the "
          "stream (e.g. the instruction's length)"));
    }
    out.push_back(n);
  }
  return out;
}

double PackPlan::fill_ratio() const {
  if (sequences.empty() || max_tokens <= 0) return 0;
  return static_cast<double>(tokens_used) /
         (static_cast<double>(sequences.size()) * static_cast<double>(max_tokens));
}

PackPlan PackBestFitDecreasing(std::span<const int64_t> tokens, int64_t max_tokens, size_t window) {
  PackPlan plan;
  plan.max_tokens = max_tokens;
  const size_t n = tokens.size();
  const size_t w = window == 0 ? std::max<size_t>(n, 1) : window;
  std::vector<size_t> order;
  std::set<std::pair<int64_t, size_t>> open;  // (room left, sequence): best fit = lower_bound
  for (size_t begin = 0; begin < n; begin += w) {
    const size_t end = std::min(n, begin + w);
    const size_t first_sequence = plan.sequences.size();
    order.resize(end - begin);
    for (size_t i = begin; i < end; ++i) order[i - begin] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return tokens[a] != tokens[b] ? tokens[a] > tokens[b] : a < b;
    });
    open.clear();
    for (size_t i : order) {
      const int64_t t = tokens[i];
      plan.tokens_used += t;
      auto it = open.lower_bound({t, 0});
      if (it == open.end()) {
        open.emplace(max_tokens - t, plan.sequences.size());
        plan.sequences.push_back({i});
        continue;
      }
      const auto [room, seq] = *it;
      open.erase(it);
      open.emplace(room - t, seq);
      plan.sequences[seq].push_back(i);
    }
    for (size_t q = first_sequence; q < plan.sequences.size(); ++q) {
      std::sort(plan.sequences[q].begin(), plan.sequences[q].end());
    }
  }
  return plan;
}

PackPlan PackFirstFit(std::span<const int64_t> tokens, int64_t max_tokens, size_t window) {
  PackPlan plan;
  plan.max_tokens = max_tokens;
  const size_t n = tokens.size();
  const size_t w = window == 0 ? std::max<size_t>(n, 1) : window;
  std::vector<int64_t> room;  // per sequence of the current window
  for (size_t begin = 0; begin < n; begin += w) {
    const size_t end = std::min(n, begin + w);
    const size_t first_sequence = plan.sequences.size();
    room.clear();
    for (size_t i = begin; i < end; ++i) {
      const int64_t t = tokens[i];
      plan.tokens_used += t;
      size_t q = 0;
      while (q < room.size() && room[q] < t) ++q;
      if (q == room.size()) {
        room.push_back(max_tokens);
        plan.sequences.emplace_back();
      }
      room[q] -= t;
      plan.sequences[first_sequence + q].push_back(i);
    }
  }
  return plan;
}

absl::StatusOr<Batch> StackSamples(std::vector<Sample> samples, const SampleSpec& spec,
                                   bool pinned, const BatchBuffers& buffers, int threads) {
  ASSIGN_OR_RETURN(std::vector<StackedTensor> plan, PlanStack(samples, spec));
  Batch batch;
  size_t end = 0;
  AddStackedViews(plan, samples.size(), /*packed=*/false, &batch, &end);
  ASSIGN_OR_RETURN(batch.buffer, AllocateFor(batch, end, pinned, buffers));
  FillStacked(plan, &batch, threads);
  batch.ids = IdsOf(samples);
  return batch;
}

absl::StatusOr<Batch> PackSamples(std::vector<Sample> samples, const SampleSpec& spec,
                                  const PackingSpec& packing, std::span<const int64_t> tokens,
                                  const PackPlan& plan, bool pinned,
                                  const BatchBuffers& buffers, int threads) {
  const size_t n = samples.size();
  const int64_t max_tokens = packing.max_tokens;
  RETURN_IF_ERROR(CheckPackInputs(plan, samples, tokens, max_tokens));

  // Per-stream token counts, checked against `tokens`.
  const size_t streams = spec.streams.size();
  std::vector<std::vector<int64_t>> per_stream(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t count = TokenCount(samples[i], spec, packing, &per_stream[i]);
    if (count != tokens[i]) {
      return absl::InvalidArgumentError(StrCat("sample ", samples[i].index, " (batch position ", i,
                                               ") costs ", count, " tokens, and ", tokens[i],
                                               " were given for it"));
    }
  }

  // Packed order: sequence by sequence.
  std::vector<Sample> packed;
  packed.reserve(n);
  std::vector<std::vector<int64_t>> packed_streams;
  packed_streams.reserve(n);
  std::vector<int64_t> packed_tokens;
  packed_tokens.reserve(n);
  for (const auto& seq : plan.sequences) {
    for (size_t i : seq) {
      packed.push_back(std::move(samples[i]));
      packed_streams.push_back(std::move(per_stream[i]));
      packed_tokens.push_back(tokens[i]);
    }
  }
  samples.clear();

  ASSIGN_OR_RETURN(std::vector<StackedTensor> stack, PlanStack(packed, spec));
  Batch batch;
  size_t end = 0;
  AddStackedViews(stack, n, /*packed=*/true, &batch, &end);
  const int64_t S = static_cast<int64_t>(plan.sequences.size());
  const int64_t N = static_cast<int64_t>(n);
  const int64_t K = static_cast<int64_t>(streams);
  const TensorRole info = TensorRole::kSampleInfo;
  const size_t segment_ids =
      AddView(&batch, &end, "segment_ids", DType::kInt32, {S, max_tokens}, TensorRole::kSegmentIds);
  const size_t positions =
      AddView(&batch, &end, "positions", DType::kInt32, {S, max_tokens}, TensorRole::kPositions);
  const size_t sample_sequence = AddView(&batch, &end, "sample_sequence", DType::kInt32, {N}, info);
  const size_t sample_offset = AddView(&batch, &end, "sample_offset", DType::kInt32, {N}, info);
  const size_t stream_offsets = AddView(&batch, &end, "stream_offsets", DType::kInt32, {N, K}, info);
  const size_t stream_lengths = AddView(&batch, &end, "stream_lengths", DType::kInt32, {N, K}, info);
  ASSIGN_OR_RETURN(batch.buffer, AllocateFor(batch, end, pinned, buffers));
  FillStacked(stack, &batch, threads);

  // The buffer and every offset are 64-byte aligned, so these int32 pointers are aligned.
  auto i32 = [&](size_t view) {
    return reinterpret_cast<int32_t*>(batch.buffer->data() + batch.tensors[view].offset);
  };
  int32_t* seg = i32(segment_ids);
  int32_t* pos = i32(positions);
  std::memset(seg, 0, batch.tensors[segment_ids].bytes);
  std::memset(pos, 0, batch.tensors[positions].bytes);
  int32_t* s_seq = i32(sample_sequence);
  int32_t* s_off = i32(sample_offset);
  int32_t* st_off = i32(stream_offsets);
  int32_t* st_len = i32(stream_lengths);
  size_t p = 0;  // packed position
  for (size_t q = 0; q < plan.sequences.size(); ++q) {
    int64_t offset = 0;
    int32_t* seg_row = seg + q * static_cast<size_t>(max_tokens);
    int32_t* pos_row = pos + q * static_cast<size_t>(max_tokens);
    for (size_t slot = 0; slot < plan.sequences[q].size(); ++slot, ++p) {
      const int64_t count = packed_tokens[p];
      for (int64_t k = 0; k < count; ++k) {
        seg_row[offset + k] = static_cast<int32_t>(slot + 1);
        pos_row[offset + k] = static_cast<int32_t>(k);
      }
      s_seq[p] = static_cast<int32_t>(q);
      s_off[p] = static_cast<int32_t>(offset);
      int64_t stream_start = offset;
      for (size_t k = 0; k < streams; ++k) {
        st_off[p * streams + k] = static_cast<int32_t>(stream_start);
        st_len[p * streams + k] = static_cast<int32_t>(packed_streams[p][k]);
        stream_start += packed_streams[p][k];
      }
      offset += count;
    }
  }
  batch.ids = IdsOf(packed);
  return batch;
}

}  // namespace conveyor
