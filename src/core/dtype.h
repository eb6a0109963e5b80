// dtype.h — element types and the scalar conversions between them.
//
// bf16 rounding is bit-identical to torch (c10/util/BFloat16.h round_to_nearest_even): NaN becomes
// 0x7FC0, everything else rounds to nearest, ties to even. f16 follows IEEE 754 binary16 with RNE.
//
// Precision convention used by every kernel (ARCHITECTURE.md habit 7): activations live in float
// buffers; a kernel told that the *store dtype* is BF16 rounds each value it writes to the nearest
// bf16 (kept in a float), exactly where torch's bf16 op boundary rounds. An fp32 store never rounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace mm3 {

enum class DType : uint8_t { F32, BF16, F16, I64, I32 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "F32", "BF16", ... (safetensors spelling)
std::optional<DType> dtype_from_name(std::string_view s);

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16_bits(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u = f32_bits(f);
  uint32_t bias = ((u >> 16) & 1u) + 0x7FFFu;
  return static_cast<uint16_t>((u + bias) >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }
// Round a float to the nearest bf16 value, returned as a float.
inline float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }

uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);

// Round `x[0..n)` in place to the store dtype (no-op for F32).
void round_to_store(float* x, size_t n, DType store);
inline float round_store(float v, DType store) { return store == DType::BF16 ? round_bf16(v) : v; }

// Bulk conversions.
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);

}  // namespace mm3
