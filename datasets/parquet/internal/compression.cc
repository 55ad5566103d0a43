#include "datasets/parquet/internal/compression.h"

#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <cstring>
#include <memory>

#include "base/strings.h"
#include "datasets/parquet/internal/metadata.h"

namespace conveyor::parquet::internal {
namespace {

struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};
using UniqueZstdDCtx = std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter>;

// Ends the inflate stream however the function leaves.
struct InflateEnd {
  void operator()(z_stream* s) const { inflateEnd(s); }
};

absl::Status Snappy(std::string_view in, char* out, size_t out_size) {
  size_t length = 0;
  if (!snappy::GetUncompressedLength(in.data(), in.size(), &length)) {
    return absl::DataLossError("snappy: corrupt length header");
  }
  if (length != out_size) {
    return absl::DataLossError(
        StrCat("snappy: ", length, " bytes inside, page header says ", out_size));
  }
  if (!snappy::RawUncompress(in.data(), in.size(), out)) {
    return absl::DataLossError("snappy: corrupt compressed data");
  }
  return absl::OkStatus();
}

absl::Status Zstd(std::string_view in, char* out, size_t out_size) {
  // One context per thread: creating one costs more than decoding a small page.
  thread_local UniqueZstdDCtx ctx(ZSTD_createDCtx());
  if (ctx == nullptr) return absl::ResourceExhaustedError("zstd: cannot create a context");
  const size_t n = ZSTD_decompressDCtx(ctx.get(), out, out_size, in.data(), in.size());
  if (ZSTD_isError(n)) return absl::DataLossError(StrCat("zstd: ", ZSTD_getErrorName(n)));
  if (n != out_size) {
    return absl::DataLossError(StrCat("zstd: ", n, " bytes inside, page header says ", out_size));
  }
  return absl::OkStatus();
}

absl::Status Gzip(std::string_view in, char* out, size_t out_size) {
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  // 15 + 32: a gzip or zlib header, detected (Parquet says gzip; some writers wrote zlib).
  if (inflateInit2(&stream, 15 + 32) != Z_OK)
    return absl::InternalError("zlib: inflateInit2 failed");
  std::unique_ptr<z_stream, InflateEnd> guard(&stream);
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  stream.next_out = reinterpret_cast<Bytef*>(out);
  // zlib counts in uInt; pages are capped far below 4 GiB by the reader (int32 sizes).
  stream.avail_in = static_cast<uInt>(in.size());
  stream.avail_out = static_cast<uInt>(out_size);
  while (true) {
    const int rc = inflate(&stream, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      // Concatenated gzip members are one stream; go on while input remains.
      if (stream.avail_in == 0) break;
      if (inflateReset(&stream) != Z_OK) return absl::DataLossError("zlib: inflateReset failed");
      continue;
    }
    if (rc == Z_OK) continue;  // progress was made
    if (rc == Z_BUF_ERROR) {   // no progress possible: output full, or input exhausted
      if (stream.avail_out == 0) {
        return absl::DataLossError(
            StrCat("gzip: more than ", out_size, " bytes inside, the page header's size"));
      }
      return absl::DataLossError("gzip: compressed data cut short");
    }
    return absl::DataLossError(
        StrCat("gzip: ", stream.msg != nullptr ? stream.msg : "inflate", " (zlib error ", rc, ")"));
  }
  if (stream.avail_out != 0) {
    return absl::DataLossError(StrCat("gzip: ", out_size - stream.avail_out,
                                      " bytes inside, page header says ", out_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Decompress(int32_t codec, std::string_view in, char* out, size_t out_size) {
  switch (static_cast<Codec>(codec)) {
    case Codec::kUncompressed:
      if (in.size() != out_size) {
        return absl::DataLossError(
            StrCat("uncompressed page of ", in.size(), " bytes, header says ", out_size));
      }
      if (out_size > 0) std::memcpy(out, in.data(), out_size);
      return absl::OkStatus();
    case Codec::kSnappy:
      return Snappy(in, out, out_size);
    case Codec::kZstd:
      return Zstd(in, out, out_size);
    case Codec::kGzip:
      return Gzip(in, out, out_size);
    default:
      return absl::UnimplementedError(
          StrCat("compression codec ", CodecName(codec), " (", codec, ") is not supported"));
  }
}

}  // namespace conveyor::parquet::internal
