#include "format/lowdim_codec.h"

#include <zstd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor {
namespace {

struct DCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// One context per thread: creating a zstd context costs more than decoding a small block.
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}
ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}

}  // namespace

std::string EncodeLowdimBlock(const float* values, size_t count, int level) {
  const size_t bytes = count * sizeof(float);
  std::vector<char> shuffled(bytes);
  const auto* in = reinterpret_cast<const unsigned char*>(values);
  for (size_t b = 0; b < sizeof(float); ++b) {
    for (size_t i = 0; i < count; ++i) shuffled[b * count + i] = static_cast<char>(in[i * 4 + b]);
  }
  std::string out(ZSTD_compressBound(bytes), '\0');
  size_t n = ZSTD_compressCCtx(ThreadCCtx(), out.data(), out.size(), shuffled.data(), bytes, level);
  // Compression into a ZSTD_compressBound buffer cannot fail short of memory exhaustion.
  if (ZSTD_isError(n)) std::abort();
  out.resize(n);
  return out;
}

absl::Status CheckLowdimBlockSize(std::string_view block, size_t count, std::string_view where) {
  const size_t bytes = count * sizeof(float);
  unsigned long long content = ZSTD_getFrameContentSize(block.data(), block.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content != bytes) {
    return absl::DataLossError(StrCat(
        where, ": zstd block holds ",
        content == ZSTD_CONTENTSIZE_ERROR ? std::string("no valid frame")
        : content == ZSTD_CONTENTSIZE_UNKNOWN ? std::string("an unknown number of bytes")
                                              : StrCat(content, " bytes"),
        ", expected ", bytes));
  }
  return absl::OkStatus();
}

absl::Status DecodeLowdimBlock(std::string_view block, float* out, size_t count,
                               std::string_view where) {
  const size_t bytes = count * sizeof(float);
  RETURN_IF_ERROR(CheckLowdimBlockSize(block, count, where));
  std::vector<unsigned char> shuffled(bytes);
  size_t n = ZSTD_decompressDCtx(ThreadDCtx(), shuffled.data(), bytes, block.data(), block.size());
  if (ZSTD_isError(n)) {
    return absl::DataLossError(StrCat(where, ": zstd: ", ZSTD_getErrorName(n)));
  }
  if (n != bytes) {
    return absl::DataLossError(
        StrCat(where, ": zstd block decompressed to ", n, " bytes, expected ", bytes));
  }
  auto* o = reinterpret_cast<unsigned char*>(out);
  for (size_t b = 0; b < sizeof(float); ++b) {
    for (size_t i = 0; i < count; ++i) o[i * 4 + b] = shuffled[b * count + i];
  }
  return absl::OkStatus();
}

}  // namespace conveyor
