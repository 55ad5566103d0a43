#include "datasets/rlds/internal/rlds_episode.h"

#include <algorithm>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::rlds {
namespace {

bool IsFloat(const std::string& dtype) {
  return dtype == "float32" || dtype == "float64" || dtype == "float16" || dtype == "bfloat16";
}

const char* ListName(const tensorflow::Feature& f) {
  switch (f.kind_case()) {
    case tensorflow::Feature::kBytesList: return "a BytesList";
    case tensorflow::Feature::kFloatList: return "a FloatList";
    case tensorflow::Feature::kInt64List: return "an Int64List";
    default: return "an empty Feature";
  }
}

}  // namespace

absl::StatusOr<const tensorflow::Feature*> FindFeature(const tensorflow::Example& ex,
                                                       const FeatureSpec& f, uint64_t* steps,
                                                       const std::string& where) {
  const auto& map = ex.features().feature();
  auto it = map.find(f.key);
  if (it == map.end()) {
    return absl::InvalidArgumentError(StrCat(where, ": feature '", f.key, "' (named by features.json) is missing"));
  }
  const tensorflow::Feature& feat = it->second;
  tensorflow::Feature::KindCase want = tensorflow::Feature::kInt64List;
  if (f.kind != FeatureKind::kTensor) {
    want = tensorflow::Feature::kBytesList;
  } else if (IsFloat(f.dtype)) {
    want = tensorflow::Feature::kFloatList;
  }
  // An empty list may be written with no kind at all (a zero-step episode); treat it as empty.
  uint64_t values = 0;
  if (feat.kind_case() == want) {
    values = want == tensorflow::Feature::kBytesList ? static_cast<uint64_t>(feat.bytes_list().value_size())
             : want == tensorflow::Feature::kFloatList ? static_cast<uint64_t>(feat.float_list().value_size())
                                                       : static_cast<uint64_t>(feat.int64_list().value_size());
  } else if (feat.kind_case() != tensorflow::Feature::KIND_NOT_SET) {
    return absl::InvalidArgumentError(StrCat(where, ": feature '", f.key, "' is ", ListName(feat),
                                             ", features.json's ", f.dtype, " needs ",
                                             ListName([&] {
                                               tensorflow::Feature t;
                                               if (want == tensorflow::Feature::kBytesList) t.mutable_bytes_list();
                                               if (want == tensorflow::Feature::kFloatList) t.mutable_float_list();
                                               if (want == tensorflow::Feature::kInt64List) t.mutable_int64_list();
                                               return t;
                                             }())));
  }
  const uint64_t per_step = f.kind == FeatureKind::kTensor ? static_cast<uint64_t>(f.elements()) : 1;
  if (f.per_step) {
    if (values % per_step != 0) {
      return absl::InvalidArgumentError(StrCat(where, ": feature '", f.key, "' holds ", values,
                                               " values, not a whole number of steps of ", per_step,
                                               " (features.json's shape)"));
    }
    *steps = values / per_step;
  } else if (values < per_step) {
    return absl::InvalidArgumentError(StrCat(where, ": feature '", f.key, "' holds ", values,
                                             " values, features.json's shape needs ", per_step));
  }
  return &feat;
}

absl::StatusOr<uint64_t> CheckRecord(std::string_view data, const std::vector<FeatureSpec>& features,
                                     const std::string& where, tensorflow::Example* out) {
  if (!out->ParseFromArray(data.data(), static_cast<int>(data.size()))) {
    return absl::DataLossError(StrCat(where, ": not a tf.train.Example (", data.size(),
                                      " bytes that do not parse)"));
  }
  uint64_t steps = 0;
  const FeatureSpec* first = nullptr;
  for (const FeatureSpec& f : features) {
    uint64_t n = 0;
    RETURN_IF_ERROR(FindFeature(*out, f, &n, where).status());
    if (!f.per_step) continue;
    if (first == nullptr) {
      first = &f;
      steps = n;
    } else if (n != steps) {
      return absl::InvalidArgumentError(StrCat(where, ": the steps' features disagree: '", first->key,
                                               "' has ", steps, " steps, '", f.key, "' has ", n));
    }
  }
  if (first != nullptr && steps == 0) {
    return absl::InvalidArgumentError(StrCat(where, ": an episode with no steps"));
  }
  return steps;
}

absl::StatusOr<std::shared_ptr<const ParsedEpisode>> EpisodeCache::Get(size_t episode,
                                                                       const Loader& load) {
  std::shared_ptr<Slot> slot;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Slot>& s = slots_[episode];
    if (s == nullptr) s = std::make_shared<Slot>();
    slot = s;
    auto p = pos_.find(episode);
    if (p != pos_.end()) lru_.splice(lru_.begin(), lru_, p->second);
  }
  absl::MutexLock slot_lock(&slot->mu);
  if (slot->value != nullptr) return slot->value;
  ASSIGN_OR_RETURN(std::unique_ptr<ParsedEpisode> made, load());
  const uint64_t bytes = made->bytes;
  slot->value = std::shared_ptr<const ParsedEpisode>(std::move(made));
  Admit(episode, slot, bytes);
  return slot->value;
}

void EpisodeCache::Admit(size_t episode, const std::shared_ptr<Slot>& slot, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  ++stats_.reads;
  stats_.bytes_read += bytes;
  if (episode < seen_.size() && !seen_[episode]) {
    seen_[episode] = true;
    ++stats_.distinct;
    stats_.distinct_bytes += bytes;
  }
  auto it = slots_.find(episode);
  if (it == slots_.end() || it->second != slot) return;  // evicted while loading: not kept
  lru_.emplace_front(episode, bytes);
  pos_[episode] = lru_.begin();
  bytes_ += bytes;
  // Evict the least recently used, never the one just loaded. Holders keep theirs alive.
  while (bytes_ > capacity_ && lru_.size() > 1) {
    const auto [victim, victim_bytes] = lru_.back();
    lru_.pop_back();
    pos_.erase(victim);
    slots_.erase(victim);
    bytes_ -= victim_bytes;
  }
}

void EpisodeCache::Reserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = std::max(capacity_, bytes);
}

void EpisodeCache::Clear() {
  absl::MutexLock lock(&mu_);
  slots_.clear();
  lru_.clear();
  pos_.clear();
  bytes_ = 0;
  seen_.assign(seen_.size(), false);
  stats_ = {};
}

EpisodeReadStats EpisodeCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace conveyor::rlds
