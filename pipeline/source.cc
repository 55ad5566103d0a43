#include "pipeline/source.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/status_macros.h"
#include "base/strings.h"
#include "conveyor/format/v1/shard.pb.h"
#include "sample/yaml_config.h"
#include "format/format.h"

namespace conveyor {

namespace pb = format::v1;

namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string MemberLabel(const MixtureMember& m) { return StrCat("dataset '", m.name, "'"); }

// The shape and dtype a stream's tensor has for a member, from its spec and manifest.
SharedStream OutputOf(const StreamSpec& s, const StreamInfo& info) {
  SharedStream o;
  const int64_t t = static_cast<int64_t>(s.deltas.size());
  switch (s.kind) {
    case pb::VIDEO:
    case pb::IMAGE: {
      const int64_t h = s.height > 0 ? s.height : (info.shape.size() >= 2 ? info.shape[0] : 0);
      const int64_t w = s.width > 0 ? s.width : (info.shape.size() >= 2 ? info.shape[1] : 0);
      o.shape = s.layout == ImageLayout::kCHW ? std::vector<int64_t>{t, 3, h, w}
                                              : std::vector<int64_t>{t, h, w, 3};
      o.dtype = s.dtype == ImageDType::kFloat32 ? DType::kFloat32 : DType::kUint8;
      o.pad_len = t;
      break;
    }
    case pb::LOWDIM:
      o.shape = {t, info.shape.empty() ? 1 : info.shape[0]};
      o.dtype = DType::kFloat32;
      o.pad_len = t;
      break;
    case pb::AUDIO: {
      const int rate = s.audio_rate > 0 ? s.audio_rate : static_cast<int>(std::lround(info.rate));
      const int64_t n = std::llround((s.window_end - s.window_start) * static_cast<double>(rate));
      const int64_t ch = s.audio_channels > 0 ? s.audio_channels : (info.shape.empty() ? 1 : info.shape[0]);
      o.shape = {n, ch};
      o.dtype = DType::kFloat32;
      o.pad_len = n;
      break;
    }
    default:  // text: variable length, UTF-8 bytes or token ids
      o.dtype = s.tokenizer != nullptr ? DType::kInt32 : DType::kUint8;
      break;
  }
  return o;
}

OwnedTensor Zeros(std::string name, DType dtype, std::vector<int64_t> shape) {
  OwnedTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.assign(t.num_elements() * DTypeSize(dtype), 0);
  return t;
}

}  // namespace

Source::~Source() = default;

std::unique_ptr<Source> Source::Of(const Dataset& dataset) {
  std::unique_ptr<Source> s(new Source());
  s->uri_ = dataset.uri();
  s->manifest_ = dataset.manifest();
  s->datasets_.push_back(&dataset);
  MixtureMember m;
  m.name = dataset.manifest().name;
  m.uri = dataset.uri();
  s->members_.push_back(std::move(m));
  return s;
}

absl::StatusOr<std::unique_ptr<Source>> Source::Open(std::string_view location,
                                                     const HttpOptions& http) {
  if (EndsWith(location, ".yaml") || EndsWith(location, ".yml")) {
    const std::string path(location);
    ASSIGN_OR_RETURN(std::string text, ReadLocalFile(path, "mixture file"));
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    return MixtureFromYaml(text, path, dir, http);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds, Dataset::Open(location, http));
  std::unique_ptr<Source> s = Of(*ds);
  s->owned_.push_back(std::move(ds));
  return s;
}

absl::StatusOr<std::unique_ptr<Source>> Source::MixtureFromYaml(std::string_view text,
                                                                std::string_view source,
                                                                std::string_view base_dir,
                                                                const HttpOptions& http) {
  constexpr size_t kMaxMembers = 4096;
  std::unique_ptr<Source> s(new Source());
  s->mixture_ = true;
  s->uri_ = std::string(source);
  ASSIGN_OR_RETURN(YAML::Node root, yaml::Load(text, source));
  try {
    if (!root.IsMap() || !root["mixture"]) {
      return absl::InvalidArgumentError(StrCat(source, ": a mixture file needs a 'mixture:' section "
                                               "(docs/mixtures.md)"));
    }
    RETURN_IF_ERROR(yaml::CheckKeys(source, root, "a mixture file", {"mixture"}));
    const YAML::Node mx = root["mixture"];
    RETURN_IF_ERROR(yaml::CheckKeys(source, mx, "mixture", {"name", "tag", "pad", "datasets"}));
    std::string name = "mixture";
    if (mx["name"]) name = mx["name"].as<std::string>();
    if (mx["tag"]) s->tag_stream_ = mx["tag"].as<std::string>();
    if (const YAML::Node pad = mx["pad"]) {
      if (!pad.IsMap()) return yaml::ConfigError(source, pad, "mixture.pad maps vector streams to a dimension");
      for (const auto& kv : pad) {
        ASSIGN_OR_RETURN(int64_t d, yaml::Integer(source, kv.second, "mixture.pad dimension", 1, 1 << 20));
        s->pad_dims_[kv.first.as<std::string>()] = d;
      }
    }
    const YAML::Node list = mx["datasets"];
    if (!list || !list.IsSequence() || list.size() == 0) {
      return yaml::ConfigError(source, list ? list : mx, "mixture.datasets must list at least one dataset");
    }
    if (list.size() > kMaxMembers) {
      return yaml::ConfigError(source, list, StrCat("mixture.datasets lists ", list.size(),
                                                    " datasets; at most ", kMaxMembers));
    }
    std::set<std::string> names;
    for (size_t k = 0; k < list.size(); ++k) {
      const YAML::Node d = list[k];
      RETURN_IF_ERROR(yaml::CheckKeys(source, d, "mixture.datasets[]",
                                      {"name", "uri", "weight", "tag", "streams", "missing"}));
      MixtureMember m;
      if (!d["uri"]) return yaml::ConfigError(source, d, "a mixture dataset needs a 'uri'");
      m.uri = d["uri"].as<std::string>();
      m.name = d["name"] ? d["name"].as<std::string>() : StrCat("d", k);
      if (m.name.empty() || !names.insert(m.name).second) {
        return yaml::ConfigError(source, d["name"] ? d["name"] : d,
                                 StrCat("mixture dataset name '", m.name, "' is empty or used twice"));
      }
      if (d["weight"]) {
        ASSIGN_OR_RETURN(m.weight, yaml::Number(source, d["weight"], "weight"));
        if (!std::isfinite(m.weight) || m.weight <= 0 || m.weight > 1e12) {
          return yaml::ConfigError(source, d["weight"], StrCat("weight of '", m.name, "' is ",
                                                               m.weight, "; it must be > 0"));
        }
      }
      m.tag = static_cast<int32_t>(k);
      if (d["tag"]) {
        ASSIGN_OR_RETURN(int64_t t, yaml::Integer(source, d["tag"], "tag", INT32_MIN, INT32_MAX));
        m.tag = static_cast<int32_t>(t);
      }
      if (const YAML::Node st = d["streams"]) {
        if (!st.IsMap()) return yaml::ConfigError(source, st, "streams maps shared names to this dataset's stream names");
        for (const auto& kv : st) m.rename[kv.first.as<std::string>()] = kv.second.as<std::string>();
      }
      if (const YAML::Node miss = d["missing"]) {
        if (!miss.IsSequence()) return yaml::ConfigError(source, miss, "missing lists shared stream names");
        for (const auto& n : miss) m.missing.insert(n.as<std::string>());
      }
      std::string location = m.uri;
      if (location.find("://") == std::string::npos && !location.empty() && location[0] != '/') {
        location = StrCat(base_dir, "/", location);
      }
      absl::StatusOr<std::unique_ptr<Dataset>> ds = Dataset::Open(location, http);
      if (!ds.ok()) {
        return Annotate(ds.status(), StrCat(yaml::Where(source, d), ": mixture dataset '", m.name,
                                            "' (", RedactUri(m.uri), ")"));
      }
      s->datasets_.push_back(ds->get());
      s->owned_.push_back(std::move(*ds));
      s->members_.push_back(std::move(m));
    }
    s->manifest_.name = name;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                                             ": ", e.msg));
  }
  RETURN_IF_ERROR(s->BuildManifest());
  return s;
}

StorageStats Source::storage_stats() const {
  StorageStats sum;
  for (const Dataset* d : datasets_) {
    const StorageStats s = d->storage().stats();
    sum.reads += s.reads;
    sum.bytes_read += s.bytes_read;
    sum.retries += s.retries;
    sum.connections_opened += s.connections_opened;
    sum.cache_hits += s.cache_hits;
    sum.cache_misses += s.cache_misses;
    sum.cache_hit_bytes += s.cache_hit_bytes;
    sum.cache_fill_bytes += s.cache_fill_bytes;
    sum.cache_corrupt += s.cache_corrupt;
    sum.cache_evicted_bytes += s.cache_evicted_bytes;
  }
  return sum;
}

std::vector<double> Source::weights() const {
  std::vector<double> w;
  for (const MixtureMember& m : members_) w.push_back(m.weight);
  return w;
}

// A member's manifest under the shared names, with placeholder streams (after its own) for the
// shared streams it lacks.
absl::StatusOr<Manifest> Source::MemberManifest(size_t k) const {
  const MixtureMember& mem = members_[k];
  const Manifest& own = datasets_[k]->manifest();
  Manifest m = own;
  m.stats.clear();
  std::map<std::string, std::string> shared_of;  // member name -> shared name
  for (const auto& [shared, theirs] : mem.rename) {
    if (own.StreamIndex(theirs) < 0) {
      std::string known;
      for (const auto& s : own.streams) StrAppend(&known, known.empty() ? "" : ", ", s.name);
      return absl::InvalidArgumentError(StrCat(uri_, ": ", MemberLabel(mem), " maps '", shared,
                                               "' to '", theirs, "', which it does not have (its streams: ",
                                               known, ")"));
    }
    if (!shared_of.emplace(theirs, shared).second) {
      return absl::InvalidArgumentError(StrCat(uri_, ": ", MemberLabel(mem), " maps two shared streams to '",
                                               theirs, "'"));
    }
  }
  std::set<std::string> seen;
  for (StreamInfo& s : m.streams) {
    auto it = shared_of.find(s.name);
    std::string shared = it == shared_of.end() ? s.name : it->second;
    if (it == shared_of.end() && mem.rename.count(s.name)) {
      // Its own stream of a name that another of its streams now serves: hidden (an empty
      // name no config can ask for), so the mapping decides.
      s.name.clear();
      continue;
    }
    auto st = own.stats.find(s.name);
    if (st != own.stats.end()) m.stats[shared] = st->second;
    s.name = shared;
    if (!seen.insert(shared).second) {
      return absl::InvalidArgumentError(StrCat(uri_, ": ", MemberLabel(mem), " has two streams named '",
                                               shared, "' after renaming"));
    }
  }
  for (const std::string& miss : mem.missing) {
    if (seen.count(miss)) {
      return absl::InvalidArgumentError(StrCat(uri_, ": ", MemberLabel(mem), " declares '", miss,
                                               "' missing but has a stream of that name"));
    }
    if (manifest_.streams.empty()) continue;  // while building the shared manifest
    const int i = manifest_.StreamIndex(miss);
    if (i < 0) {
      return absl::InvalidArgumentError(StrCat(uri_, ": ", MemberLabel(mem), " declares '", miss,
                                               "' missing and no dataset of the mixture has it"));
    }
    m.streams.push_back(manifest_.streams[i]);
    auto st = manifest_.stats.find(miss);
    if (st != manifest_.stats.end()) m.stats[miss] = st->second;
  }
  return m;
}

absl::Status Source::BuildManifest() {
  Manifest& out = manifest_;
  out.format_version = 1;
  out.created_by = "conveyor mixture";
  std::map<std::string, size_t> owner;  // shared stream -> the member that defined it
  std::string canon = "conveyor-mixture-v1\n";
  for (size_t k = 0; k < members_.size(); ++k) {
    ASSIGN_OR_RETURN(Manifest mm, MemberManifest(k));
    const Manifest& own = datasets_[k]->manifest();
    const MixtureMember& mem = members_[k];
    for (const StreamInfo& s : mm.streams) {
      if (s.name.empty()) continue;  // hidden by a mapping
      const int i = out.StreamIndex(s.name);
      StreamInfo info = s;
      auto pad = pad_dims_.find(s.name);
      if (pad != pad_dims_.end()) {
        if (s.kind != pb::LOWDIM) {
          return absl::InvalidArgumentError(StrCat(uri_, ": mixture.pad names '", s.name,
                                                   "', which is not a vector (lowdim) stream"));
        }
        const int64_t d = s.shape.empty() ? 1 : s.shape[0];
        if (d > pad->second) {
          return absl::InvalidArgumentError(StrCat(uri_, ": '", s.name, "' has dimension ", d, " in ",
                                                   MemberLabel(mem), ", more than mixture.pad's ", pad->second));
        }
        info.shape = {pad->second};
        info.names.clear();
      }
      if (i < 0) {
        out.streams.push_back(info);
        owner[s.name] = k;
        auto st = mm.stats.find(s.name);
        if (st != mm.stats.end()) {
          StreamStats padded = st->second;
          const size_t d = info.shape.empty() ? 1 : static_cast<size_t>(info.shape[0]);
          padded.mean.resize(d, 0);
          padded.std.resize(d, 1);
          padded.min.resize(d, 0);
          padded.max.resize(d, 1);
          out.stats[s.name] = padded;
        }
      } else if (out.streams[i].kind != s.kind) {
        return absl::InvalidArgumentError(StrCat(
            uri_, ": stream '", s.name, "' is ", format::StreamKindName(s.kind), " in ",
            MemberLabel(mem), " and ", format::StreamKindName(out.streams[i].kind), " in ",
            MemberLabel(members_[owner[s.name]]), "; map one of them to another name"));
      }
    }
    out.num_episodes += own.num_episodes;
    out.total_duration_s += own.total_duration_s;
    out.total_bytes += own.total_bytes;
    char weight[64];
    std::snprintf(weight, sizeof(weight), "%.17g", mem.weight);
    StrAppend(&canon, "dataset ", mem.name, " ", own.fingerprint, " weight ", weight, " tag ", mem.tag, "\n");
    for (const auto& [a, b] : mem.rename) StrAppend(&canon, "  stream ", a, " = ", b, "\n");
    for (const auto& a : mem.missing) StrAppend(&canon, "  missing ", a, "\n");
  }
  for (const auto& [a, d] : pad_dims_) {
    if (out.StreamIndex(a) < 0) {
      return absl::InvalidArgumentError(StrCat(uri_, ": mixture.pad names '", a, "', which no dataset has"));
    }
    StrAppend(&canon, "pad ", a, " ", d, "\n");
  }
  if (!tag_stream_.empty()) {
    if (out.StreamIndex(tag_stream_) >= 0) {
      return absl::InvalidArgumentError(StrCat(uri_, ": mixture.tag '", tag_stream_,
                                               "' is also the name of a dataset stream"));
    }
    StrAppend(&canon, "tag ", tag_stream_, "\n");
  }
  // Every member must be able to resolve its missing streams now that the union is known.
  for (size_t k = 0; k < members_.size(); ++k) RETURN_IF_ERROR(MemberManifest(k).status());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016" PRIx64, format::Checksum(canon));
  out.fingerprint = hex;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BoundMember>> Source::Bind(const SampleSpec& spec) const {
  std::vector<BoundMember> out;
  if (!mixture_) {
    BoundMember b;
    b.spec = spec;
    for (size_t i = 0; i < spec.streams.size(); ++i) b.stream_of.push_back(static_cast<int>(i));
    out.push_back(std::move(b));
    return out;
  }
  if (spec.config_text.empty() && !spec.streams.empty()) {
    return absl::InternalError("a mixture needs the spec's config text to bind it to its datasets");
  }
  for (size_t k = 0; k < members_.size(); ++k) {
    const MixtureMember& mem = members_[k];
    ASSIGN_OR_RETURN(Manifest mm, MemberManifest(k));
    const size_t real = datasets_[k]->manifest().streams.size();
    // The config's own source, which names its file: paths in it (a tokenizer's model) are
    // relative to that file's folder. The error below names the member.
    absl::StatusOr<SampleSpec> ms = SampleSpec::FromYaml(spec.config_text, mm, spec.config_source);
    if (!ms.ok()) {
      return Annotate(ms.status(), StrCat("binding the config to ", MemberLabel(mem),
                                          " (map its streams with 'streams:' or declare them "
                                          "'missing:' in ", uri_, ")"));
    }
    if (ms->anchor_stream >= static_cast<int>(real)) {
      return absl::InvalidArgumentError(StrCat("the anchor stream '", spec.anchor, "' is missing from ",
                                               MemberLabel(mem), " of ", uri_,
                                               ": every dataset of a mixture needs the anchor"));
    }
    BoundMember b;
    SampleSpec own = *ms;
    own.streams.clear();
    for (const StreamSpec& s : ms->streams) {
      if (s.stream >= static_cast<int>(real)) {
        b.stream_of.push_back(-1);
      } else {
        b.stream_of.push_back(static_cast<int>(own.streams.size()));
        own.streams.push_back(s);
      }
    }
    if (b.stream_of.size() != spec.streams.size()) {
      return absl::InternalError("a mixture member's spec has another stream count");
    }
    b.spec = std::move(own);
    out.push_back(std::move(b));
  }
  RETURN_IF_ERROR(Layout(spec, out).status());
  return out;
}

absl::StatusOr<std::vector<SharedStream>> Source::Layout(const SampleSpec& spec,
                                                         const std::vector<BoundMember>& bound) const {
  std::vector<SharedStream> layout(spec.streams.size());
  for (size_t i = 0; i < spec.streams.size(); ++i) {
    const StreamSpec& shared = spec.streams[i];
    int first = -1;
    for (size_t k = 0; k < bound.size(); ++k) {
      const int j = bound[k].stream_of[i];
      if (j < 0) continue;
      const StreamSpec& s = bound[k].spec.streams[static_cast<size_t>(j)];
      SharedStream o = OutputOf(s, datasets_[k]->manifest().streams[s.stream]);
      auto pad = pad_dims_.find(shared.name);
      if (pad != pad_dims_.end() && s.kind == pb::LOWDIM) {
        o.dim = pad->second;
        o.shape[1] = pad->second;
      }
      if (first < 0) {
        layout[i] = o;
        first = static_cast<int>(k);
      } else if (o.shape != layout[i].shape || o.dtype != layout[i].dtype) {
        std::string hint = shared.kind == pb::LOWDIM
                               ? StrCat("pad it under mixture.pad: {", shared.name, ": DIM}")
                               : "give cameras a size: [H, W] (audio: rate and channels) in the config";
        return absl::InvalidArgumentError(StrCat(
            "mixture ", uri_, ": stream '", shared.name, "' is ", ShapeText(o.shape), " ",
            DTypeName(o.dtype), " in ", MemberLabel(members_[k]), " and ", ShapeText(layout[i].shape),
            " ", DTypeName(layout[i].dtype), " in ", MemberLabel(members_[static_cast<size_t>(first)]),
            "; batches stack samples, so shapes must be equal: ", hint));
      }
    }
  }
  return layout;
}

absl::Status Source::Conform(size_t k, const SampleSpec& spec, const BoundMember& bound,
                             const std::vector<SharedStream>& layout, Sample* sample) const {
  if (!mixture_) return absl::OkStatus();
  sample->member = static_cast<uint32_t>(k);
  std::vector<OwnedTensor> in = std::move(sample->tensors);
  std::vector<OwnedTensor> out;
  out.reserve(in.size() + 4);
  auto take = [&](const std::string& name) -> OwnedTensor* {
    for (OwnedTensor& t : in) {
      if (t.name == name) return &t;
    }
    return nullptr;
  };
  for (size_t i = 0; i < spec.streams.size(); ++i) {
    const StreamSpec& s = spec.streams[i];
    const SharedStream& l = layout[i];
    const bool text = s.kind == pb::TEXT;
    if (bound.stream_of[i] < 0) {  // this dataset lacks the stream: padding, all of it marked
      out.push_back(Zeros(s.name, l.dtype, text ? std::vector<int64_t>{0} : l.shape));
      if (!text) {
        OwnedTensor pad = Zeros(StrCat(s.name, "_is_pad"), DType::kBool, {l.pad_len});
        pad.role = TensorRole::kPaddingMask;
        std::fill(pad.data.begin(), pad.data.end(), 1);
        out.push_back(std::move(pad));
      }
      if (l.dim > 0) {
        OwnedTensor m = Zeros(StrCat(s.name, "_dim_is_pad"), DType::kBool, {l.dim});
        m.role = TensorRole::kPaddingMask;
        std::fill(m.data.begin(), m.data.end(), 1);
        out.push_back(std::move(m));
      }
      continue;
    }
    OwnedTensor* t = take(s.name);
    if (t == nullptr) {
      return absl::InternalError(StrCat(MemberLabel(members_[k]), " sample has no tensor '", s.name, "'"));
    }
    int64_t real_dim = 0;
    if (l.dim > 0) {  // pad each row [T, d] to [T, D]
      const int64_t rows = t->shape[0], d = t->shape[1];
      real_dim = d;
      if (d < l.dim) {
        OwnedTensor padded = Zeros(s.name, DType::kFloat32, {rows, l.dim});
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(padded.data.data() + r * l.dim * 4, t->data.data() + r * d * 4,
                      static_cast<size_t>(d) * 4);
        }
        *t = std::move(padded);
      }
    }
    if (!text && t->shape != l.shape) {
      return absl::InvalidArgumentError(StrCat(
          "mixture ", uri_, ": ", MemberLabel(members_[k]), " delivered '", s.name, "' as ",
          ShapeText(t->shape), " where the mixture expects ", ShapeText(l.shape),
          " (episode ", sample->episode, ", step ", sample->step, "): give the stream's size in the config"));
    }
    out.push_back(std::move(*t));
    if (!text) {
      OwnedTensor* pad = take(StrCat(s.name, "_is_pad"));
      if (pad == nullptr) return absl::InternalError(StrCat("no '", s.name, "_is_pad' tensor"));
      out.push_back(std::move(*pad));
    }
    if (l.dim > 0) {
      OwnedTensor m = Zeros(StrCat(s.name, "_dim_is_pad"), DType::kBool, {l.dim});
      m.role = TensorRole::kPaddingMask;
      for (int64_t d = real_dim; d < l.dim; ++d) m.data[static_cast<size_t>(d)] = 1;
      out.push_back(std::move(m));
    }
  }
  if (!tag_stream_.empty()) {
    OwnedTensor tag = Zeros(tag_stream_, DType::kInt32, {});
    tag.role = TensorRole::kSampleInfo;
    const int32_t v = members_[k].tag;
    std::memcpy(tag.data.data(), &v, sizeof(v));
    out.push_back(std::move(tag));
  }
  sample->tensors = std::move(out);
  return absl::OkStatus();
}

}  // namespace conveyor
