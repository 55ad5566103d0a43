#include "datasets/parquet/internal/encodings.h"

#include <algorithm>
#include <cstring>

#include "base/status_macros.h"
#include "base/strings.h"

namespace conveyor::parquet::internal {
namespace {

absl::Status Corrupt(std::string_view what, size_t offset) {
  return absl::DataLossError(StrCat(what, " at byte ", offset, " of the encoded data"));
}

absl::StatusOr<uint64_t> ReadUleb(std::string_view data, size_t* pos) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*pos >= data.size()) return Corrupt("varint runs past the end", *pos);
    const uint8_t b = static_cast<uint8_t>(data[(*pos)++]);
    value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return value;
  }
  return Corrupt("varint longer than 10 bytes", *pos);
}

// Unpacks `n` values of `bit_width` bits, least significant bit first, from `in` (which holds at
// least ceil(n * bit_width / 8) bytes).
template <typename T>
void UnpackLsb(const uint8_t* in, int bit_width, size_t n, T* out) {
  if (bit_width == 0) {
    std::fill(out, out + n, T{0});
    return;
  }
  if (bit_width > 32) {  // delta miniblocks only; the buffered loop below holds up to 39 bits
    uint64_t bit = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t v = 0;
      for (int got = 0; got < bit_width;) {
        const int shift = static_cast<int>(bit % 8);
        const int take = std::min(8 - shift, bit_width - got);
        v |= static_cast<uint64_t>((in[bit / 8] >> shift) & ((1u << take) - 1)) << got;
        got += take;
        bit += take;
      }
      out[i] = static_cast<T>(v);
    }
    return;
  }
  const uint64_t mask = bit_width >= 64 ? ~uint64_t{0} : (uint64_t{1} << bit_width) - 1;
  uint64_t buffer = 0;
  int bits = 0;
  size_t byte = 0;
  for (size_t i = 0; i < n; ++i) {
    while (bits < bit_width) {
      buffer |= static_cast<uint64_t>(in[byte++]) << bits;
      bits += 8;
    }
    out[i] = static_cast<T>(buffer & mask);
    buffer >>= bit_width;
    bits -= bit_width;
  }
}

}  // namespace

int BitWidth(uint64_t max_value) {
  int width = 0;
  while (max_value != 0) {
    ++width;
    max_value >>= 1;
  }
  return width;
}

absl::Status DecodeRleHybrid(std::string_view data, int bit_width, size_t count, uint32_t* out,
                             size_t* consumed) {
  if (bit_width < 0 || bit_width > 32) {
    return Corrupt(StrCat("bit width ", bit_width, " outside 0..32"), 0);
  }
  const size_t value_bytes = (bit_width + 7) / 8;
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  size_t pos = 0, done = 0;
  while (done < count) {
    const size_t run_start = pos;
    ASSIGN_OR_RETURN(const uint64_t header, ReadUleb(data, &pos));
    if (header & 1) {
      // Bit-packed run: (header >> 1) groups of 8 values.
      const uint64_t groups = header >> 1;
      if (groups == 0) return Corrupt("empty bit-packed run", run_start);
      if (groups > (uint64_t{1} << 40)) return Corrupt("bit-packed run too long", run_start);
      const uint64_t run_bytes = groups * bit_width;
      // Some writers end the last run early; take the values whose bits are all present.
      const size_t available = std::min<uint64_t>(run_bytes, data.size() - pos);
      const uint64_t run_values = bit_width == 0 ? groups * 8 : available * 8 / bit_width;
      const size_t take =
          std::min<uint64_t>(std::min<uint64_t>(run_values, groups * 8), count - done);
      UnpackLsb(bytes + pos, bit_width, take, out + done);
      done += take;
      pos += available;
      if (done < count && available < run_bytes) {
        return Corrupt(StrCat("bit-packed run cut short (", count - done, " values missing)"),
                       run_start);
      }
    } else {
      const uint64_t run = header >> 1;
      if (run == 0) return Corrupt("empty RLE run", run_start);
      if (value_bytes > data.size() - pos) return Corrupt("RLE run value past the end", run_start);
      uint32_t value = 0;
      for (size_t b = 0; b < value_bytes; ++b)
        value |= static_cast<uint32_t>(bytes[pos + b]) << (8 * b);
      pos += value_bytes;
      if (bit_width < 32 && (value >> bit_width) != 0) {
        return Corrupt(StrCat("RLE value ", value, " wider than ", bit_width, " bits"), run_start);
      }
      const size_t take = std::min<uint64_t>(run, count - done);
      std::fill(out + done, out + done + take, value);
      done += take;
    }
  }
  if (consumed != nullptr) *consumed = pos;
  return absl::OkStatus();
}

absl::Status DecodeBitPackedLevels(std::string_view data, int bit_width, size_t count,
                                   uint32_t* out, size_t* consumed) {
  if (bit_width < 0 || bit_width > 16) return Corrupt("level bit width outside 0..16", 0);
  const uint64_t bits = static_cast<uint64_t>(count) * bit_width;
  const uint64_t bytes = (bits + 7) / 8;
  if (bytes > data.size()) {
    return Corrupt(StrCat("bit-packed levels need ", bytes, " bytes, ", data.size(), " present"),
                   0);
  }
  const auto* in = reinterpret_cast<const uint8_t*>(data.data());
  uint64_t bit = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t v = 0;
    for (int b = 0; b < bit_width; ++b, ++bit) {
      v = (v << 1) | ((in[bit / 8] >> (7 - bit % 8)) & 1);
    }
    out[i] = v;
  }
  *consumed = bytes;
  return absl::OkStatus();
}

absl::Status DecodeDeltaBinaryPacked(std::string_view data, size_t count, int64_t* out,
                                     size_t* consumed) {
  size_t pos = 0;
  ASSIGN_OR_RETURN(const uint64_t block_size, ReadUleb(data, &pos));
  ASSIGN_OR_RETURN(const uint64_t miniblocks, ReadUleb(data, &pos));
  ASSIGN_OR_RETURN(const uint64_t total, ReadUleb(data, &pos));
  ASSIGN_OR_RETURN(const uint64_t first_zz, ReadUleb(data, &pos));
  if (block_size == 0 || block_size % 128 != 0 || block_size > (1u << 15) || miniblocks == 0 ||
      block_size % miniblocks != 0 || (block_size / miniblocks) % 32 != 0) {
    return Corrupt(
        StrCat("delta header with block size ", block_size, " and ", miniblocks, " miniblocks"), 0);
  }
  if (total != count) {
    return Corrupt(StrCat("delta block holds ", total, " values, ", count, " expected"), 0);
  }
  const uint64_t per_mini = block_size / miniblocks;
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  // Arithmetic wraps, as the encoding defines it; unsigned avoids undefined overflow.
  uint64_t value = (first_zz >> 1) ^ (~(first_zz & 1) + 1);
  size_t done = 0;
  if (count > 0) out[done++] = static_cast<int64_t>(value);
  std::vector<uint64_t> deltas(per_mini);
  // `total` values are encoded, of which the caller wants the first `count`: stop there, so that a
  // header claiming billions of values costs nothing.
  uint64_t remaining = total == 0 ? 0 : total - 1;
  while (remaining > 0 && done < count) {
    const size_t block_start = pos;
    ASSIGN_OR_RETURN(const uint64_t min_zz, ReadUleb(data, &pos));
    const uint64_t min_delta = (min_zz >> 1) ^ (~(min_zz & 1) + 1);
    if (miniblocks > data.size() - pos)
      return Corrupt("delta bit widths past the end", block_start);
    const uint8_t* widths = bytes + pos;
    pos += miniblocks;
    for (uint64_t m = 0; m < miniblocks && remaining > 0 && done < count; ++m) {
      const int width = widths[m];
      if (width > 64) return Corrupt(StrCat("delta bit width ", width), block_start);
      const uint64_t mini_bytes = per_mini * width / 8;
      if (mini_bytes > data.size() - pos) return Corrupt("delta miniblock past the end", pos);
      UnpackLsb(bytes + pos, width, per_mini, deltas.data());
      pos += mini_bytes;
      const uint64_t n = std::min<uint64_t>(per_mini, remaining);
      for (uint64_t i = 0; i < n; ++i) {
        value += min_delta + deltas[i];
        if (done < count) out[done++] = static_cast<int64_t>(value);
      }
      remaining -= n;
    }
  }
  *consumed = pos;
  return absl::OkStatus();
}

absl::Status DecodeDeltaLengthByteArray(std::string_view data, size_t count, uint64_t max_bytes,
                                        BinaryValues* out, size_t* consumed) {
  std::vector<int64_t> lengths(count);
  size_t pos = 0;
  RETURN_IF_ERROR(Annotate(DecodeDeltaBinaryPacked(data, count, lengths.data(), &pos), "lengths"));
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (lengths[i] < 0 || static_cast<uint64_t>(lengths[i]) > data.size() - pos - total) {
      return Corrupt(StrCat("value ", i, " of ", lengths[i], " bytes runs past the end"), pos);
    }
    total += static_cast<uint64_t>(lengths[i]);
  }
  if (total > max_bytes) {
    return absl::ResourceExhaustedError(StrCat(total, " bytes of values exceed the limit"));
  }
  out->data.append(data.data() + pos, total);
  int64_t offset = out->offsets.back();
  for (size_t i = 0; i < count; ++i) out->offsets.push_back(offset += lengths[i]);
  *consumed = pos + total;
  return absl::OkStatus();
}

absl::Status DecodeDeltaByteArray(std::string_view data, size_t count, uint64_t max_bytes,
                                  BinaryValues* out) {
  std::vector<int64_t> prefixes(count);
  size_t pos = 0;
  RETURN_IF_ERROR(
      Annotate(DecodeDeltaBinaryPacked(data, count, prefixes.data(), &pos), "prefix lengths"));
  BinaryValues suffixes;
  size_t consumed = 0;
  RETURN_IF_ERROR(
      Annotate(DecodeDeltaLengthByteArray(data.substr(pos), count, max_bytes, &suffixes, &consumed),
               "suffixes"));
  std::string previous;
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (prefixes[i] < 0 || static_cast<uint64_t>(prefixes[i]) > previous.size()) {
      return Corrupt(StrCat("value ", i, ": prefix of ", prefixes[i],
                            " bytes, the previous value has ", previous.size()),
                     0);
    }
    previous.resize(static_cast<size_t>(prefixes[i]));
    const std::string_view suffix = suffixes[i];
    previous.append(suffix.data(), suffix.size());
    total += previous.size();
    if (total > max_bytes) {
      return absl::ResourceExhaustedError(
          StrCat("DELTA_BYTE_ARRAY values expand beyond ", max_bytes, " bytes"));
    }
    out->data += previous;
    out->offsets.push_back(static_cast<int64_t>(out->data.size()));
  }
  return absl::OkStatus();
}

absl::Status DecodeByteStreamSplit(std::string_view data, size_t count, size_t width, char* out) {
  if (width == 0 || count > data.size() / width) {
    return Corrupt(StrCat(count, " values of ", width, " bytes with ", data.size(), " present"), 0);
  }
  for (size_t b = 0; b < width; ++b) {
    const char* stream = data.data() + b * count;
    for (size_t i = 0; i < count; ++i) out[i * width + b] = stream[i];
  }
  return absl::OkStatus();
}

}  // namespace conveyor::parquet::internal
