// Page decompression: SNAPPY (libsnappy), GZIP (zlib), ZSTD (libzstd); UNCOMPRESSED copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace conveyor::parquet::internal {

// Decompresses `in` with parquet.thrift codec `codec` into `out`, which holds exactly the page's
// declared uncompressed size `out_size`. Output that would be longer or shorter than `out_size`
// is an error, so a lying header cannot make the decoder write past `out` or leave it half filled.
absl::Status Decompress(int32_t codec, std::string_view in, char* out, size_t out_size);

}  // namespace conveyor::parquet::internal
