// A WebDataset member by its kind (datasets/webdataset/wds_dataset.h): probing it while the member
// index is built (the facts the index cache keeps), the streams a member of the first sample makes,
// and reading a small member whole. Included only by datasets/webdataset/*.cc.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "conveyor/format/v1/shard.pb.h"
#include "datasets/dataset.h"
#include "datasets/webdataset/tar.h"
#include "datasets/webdataset/wds_index.h"
#include "storage/storage.h"

namespace conveyor::webdataset {

// Members read whole (text, JSON, .npy, images) larger than this are an error, not an allocation.
inline constexpr uint64_t kMaxSmallMember = 1ull << 30;
// The most values a .npy member may hold to be a stream.
inline constexpr int64_t kMaxNpyElements = int64_t{64} << 20;

enum class MemberKind { kVideo, kImage, kText, kJson, kNpy, kClass, kUnknown };

// The kind by the extension's last part, case-insensitive ("t5_xxl.npy" is a .npy).
MemberKind KindOf(std::string_view ext);

// Video facts: a fixed head (rate f64, shown frames u64, duration s f64, width i32, height i32,
// codec and pixel format names in 16 bytes each) that opening checks every sample by, then the
// serialized StreamIndex (packet offsets absolute in the tar) that only loading a sample needs.
// Opening cuts the facts to their head once the index file holds them, so the packet tables of a
// dataset are never in memory together.
struct VideoFacts {
  double rate = 0;
  uint64_t frames = 0;
  double duration_s = 0;
  int32_t width = 0, height = 0;
  std::string codec, pix_fmt;
  format::v1::StreamIndex index;  // when decoded with_index
};
inline constexpr size_t kVideoFactsHead = 64;

absl::StatusOr<VideoFacts> DecodeVideoFacts(std::string_view bytes, bool with_index,
                                            const std::string& where);

// A member's bytes, at most kMaxSmallMember of them.
absl::StatusOr<std::string> ReadMember(const RandomAccessFile& tar, uint64_t offset, uint64_t size,
                                       const std::string& where);

// A JSON member parsed; it must be an object.
absl::StatusOr<nlohmann::json> ParseJsonMember(const std::string& bytes, const std::string& where);

// The facts of member `m` (extension `ext`) of `tar`, for the index cache (a wds_index.h
// MemberProber): a video's VideoFacts, an image's XXH3-64 and CodecParams, a JSON's fields, a
// .npy's dtype and shape; "" for the kinds read as they are.
absl::StatusOr<std::string> ProbeMember(const RandomAccessFile& tar, const TarMember& m,
                                        std::string_view ext, const std::string& where);

// Where a manifest stream's values come from.
// The shape in a `.npy` member's index facts ({"dtype", "shape"}) in *shape, and its element
// count, or -1 where that is not 1 to kMaxNpyElements (a zero or negative dimension, an overflow).
int64_t NpyFactsShape(const nlohmann::json& facts, std::vector<int64_t>* shape);

// A sample's `.npy` facts against its stream's (the first sample's): shapes may differ (T5
// embeddings of varying L, latents per resolution bucket; the spec says what it serves of them,
// docs/sampling.md "Tensors of varying shape"), the dtype and the rank may not. The sample's shape
// in *shape; "" or what is wrong, after `where`.
std::string CheckNpySample(const std::string& stream_facts, const std::string& facts,
                           const std::string& where, std::vector<int64_t>* shape);

struct StreamSource {
  size_t member = 0;     // index into WebDataset::members_
  std::string field;     // JSON: the field; else empty
  int64_t elements = 1;  // LOWDIM: values per step
};

// `src` (a `.npy` member's stream, its first sample's) for a sample of `shape` (CheckNpySample's):
// the sample's element count, and its codec in *out naming the shape (`npy DTYPE [SHAPE]`).
StreamSource NpySampleSource(const std::string& stream_facts, const std::vector<int64_t>& shape,
                             StreamSource src, format::v1::StreamIndex* out);

// Appends the streams the first sample's member `r` (of kind `kind`, the dataset's member
// `member`) makes to *streams: one per member, a JSON's one per number, array or string field.
// `clip_rate` is the clip's video rate; `where` names the sample, `uri` the dataset.
absl::Status AppendMemberStreams(const MemberRef& r, MemberKind kind, size_t member,
                                 double clip_rate, const std::string& where, const std::string& uri,
                                 std::vector<std::pair<StreamInfo, StreamSource>>* streams);

// A LOWDIM stream's one row per clip from its member: a .npy's values, a .cls label, or (with
// `parsed`, the member's JSON) the field src.field.
absl::StatusOr<std::vector<float>> ReadMemberRow(const RandomAccessFile& tar, MemberKind kind,
                                                 uint64_t offset, uint64_t size,
                                                 const StreamSource& src, nlohmann::json* parsed,
                                                 const std::string& where);

}  // namespace conveyor::webdataset
