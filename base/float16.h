// The two 16-bit float types tensors may be served in (DType::kFloat16, DType::kBFloat16), as bit
// patterns, converted from and to float32. Written by hand (docs/sampling.md "Tensor dtypes" says
// why: Debian 12's GCC 12 has no C++ `__bf16` arithmetic, `_Float16` is x86-64 only there, FFmpeg's
// float2half is internal to libavutil, and the tree links no Eigen) and tested bit for bit against
// numpy's `astype(np.float16)` and torch's `.to(torch.bfloat16)` (tests/tensor_dtype_test.cc with
// tests/fixtures/tensor_dtype/make_tensor_dtype.py).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/types.h"

namespace conveyor {

// IEEE binary16 bits of `value`, rounded to nearest, ties to even: numpy's
// npy_floatbits_to_halfbits. Above the largest half (65504) by half an ulp or more: infinity;
// below half the smallest subnormal (2^-25; exactly it rounds to even, zero): a signed zero. NaN
// keeps its sign and the top 10 bits of its payload (at least one bit set, so it stays a NaN).
inline uint16_t FloatToHalf(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t abs = f & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    const uint16_t payload = static_cast<uint16_t>((abs >> 13) & 0x3ffu);
    return static_cast<uint16_t>(sign | 0x7c00u | (payload != 0 ? payload : 1u));
  }
  if (abs >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 2^16 and up, infinity
  uint32_t h, rem, halfway;
  if (abs < 0x38800000u) {  // under 2^-14: a half subnormal, in units of 2^-24
    if (abs < 0x33000000u) return sign;  // under 2^-25
    const uint32_t exponent = abs >> 23;  // 102 ..= 112
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 ..= 24
    h = mantissa >> shift;
    rem = mantissa & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {  // the exponent rebiased (127 -> 15), the mantissa cut from 23 to 10 bits
    h = (abs - 0x38000000u) >> 13;
    rem = abs & 0x1fffu;
    halfway = 0x1000u;
  }
  // A carry out of the mantissa moves to the next exponent, and from the largest to infinity.
  if (rem > halfway || (rem == halfway && (h & 1u) != 0)) ++h;
  return static_cast<uint16_t>(sign | h);
}

// The float32 of half bits `h`, exactly (every half is a float32); a NaN keeps its sign and
// payload, so FloatToHalf(HalfToFloat(h)) == h for every h.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t f;
  if (exponent == 0x1f) {
    f = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    f = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    f = sign;
  } else {  // a subnormal: normalised, its leading bit becoming the implicit one
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    f = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(f);
}

// bfloat16 bits of `value`: the float32's upper half rounded to nearest, ties to even (overflow
// rounds to infinity), as torch's `.to(torch.bfloat16)` on the CPU. Every NaN becomes 0xffff, the
// bits torch's vectorised conversion gives it (its scalar path gives 0x7fc0; both are NaN).
inline uint16_t FloatToBFloat16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return 0xffffu;
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

inline float BFloat16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// Writes `value` as element `i` of a tensor of `dtype` (kFloat32, kFloat16 or kBFloat16) whose
// bytes start at `dst`: the one place a float stream's values take their served dtype.
inline void StoreFloat(DType dtype, float value, uint8_t* dst, size_t i) {
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    const uint16_t bits = dtype == DType::kFloat16 ? FloatToHalf(value) : FloatToBFloat16(value);
    std::memcpy(dst + 2 * i, &bits, 2);
  } else {
    std::memcpy(dst + 4 * i, &value, 4);
  }
}

// StoreFloat for `n` values from `src` into elements 0..n-1 at `dst`: float32 as one copy.
inline void StoreFloats(DType dtype, const float* src, size_t n, uint8_t* dst) {
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; ++i) StoreFloat(dtype, src[i], dst, i);
}

}  // namespace conveyor
