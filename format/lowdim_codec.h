// Low-dimensional blocks ("zstd-shuffle4"): float32 rows, byte-shuffled (all first bytes, then
// all second bytes, ... as Blosc does) and compressed with zstd. Shuffling groups the slowly
// changing exponent bytes together: on 50 Hz joint trajectories it lifts zstd's ratio from ~1.08
// to ~1.45 and decompresses faster (shared/LIMITS.md).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace conveyor {

inline constexpr std::string_view kLowdimCodec = "zstd-shuffle4";

// Compresses `count` floats at zstd `level`.
std::string EncodeLowdimBlock(const float* values, size_t count, int level);

// OK when `block` is a zstd frame that declares exactly count * 4 decompressed bytes: check it
// before allocating `count` floats for an untrusted block.
absl::Status CheckLowdimBlockSize(std::string_view block, size_t count, std::string_view where);

// Decompresses a block into exactly `count` floats at `out`. DATA_LOSS if the block does not
// decompress to exactly count * 4 bytes. `where` names the block in errors.
absl::Status DecodeLowdimBlock(std::string_view block, float* out, size_t count,
                               std::string_view where);

}  // namespace conveyor
