// kernels_util.h — helpers for the kernel parity tests (tests/unit/kernels_*.cpp): seeded random
// inputs, guarded output buffers, bf16 spacing, and tolerance-checked comparison (ARCHITECTURE.md
// habit 4: odd sizes, strided views, guard values, tolerances scaled to the data).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mm3::test {

constexpr float kEps32 = 1.0f / (1 << 23);  // fp32 machine epsilon (ulp of 1)
constexpr float kEps16 = 1.0f / (1 << 7);   // bf16 machine epsilon (ulp of 1)

// Spacing of bf16 values around |v| (the ulp of v's binade; 2^-133 for zero/denormal range).
inline float bf16_ulp(float v) {
  v = std::fabs(v);
  if (v < 1.17549435e-38f) return std::ldexp(1.0f, -133);
  int e;
  std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, e - 8);
}

inline bool is_bf16_value(float v) { return std::isnan(v) || (f32_bits(v) & 0xFFFFu) == 0; }

class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  // Uniform in [lo, hi), never exactly zero; rounded to bf16 when `bf16`.
  float uni(float lo, float hi, bool bf16 = false) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (;;) {
      float v = d(g_);
      if (bf16) v = round_bf16(v);
      if (v != 0.f) return v;
    }
  }
  std::vector<float> vec(size_t n, float lo, float hi, bool bf16 = false) {
    std::vector<float> v(n);
    for (auto& x : v) x = uni(lo, hi, bf16);
    return v;
  }
  std::vector<uint16_t> vec_bf16_bits(size_t n, float lo, float hi) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f32_to_bf16_bits(uni(lo, hi, true));
    return v;
  }
  int64_t int_in(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_); }

 private:
  std::mt19937_64 g_;
};

// An output buffer with sentinel-filled guard zones before and after, and a strided layout: the
// kernel may write only the `cols` leading entries of each of `rows` rows of stride `ld`.
class Guarded {
 public:
  static constexpr uint32_t kSentinel = 0x7FA5A5A5u;  // a signalling-NaN pattern no kernel produces
  Guarded(int64_t rows, int64_t cols, int64_t ld, int64_t guard = 37)
      : rows_(rows), cols_(cols), ld_(ld), guard_(guard),
        buf_(static_cast<size_t>(guard + (rows > 0 ? (rows - 1) * ld + cols : 0) + guard)) {
    for (auto& v : buf_) v = f32_from_bits(kSentinel);
  }
  float* data() { return buf_.data() + guard_; }
  const float* data() const { return buf_.data() + guard_; }
  float at(int64_t r, int64_t c) const { return data()[r * ld_ + c]; }
  // Number of positions outside the written region whose bits changed.
  int64_t touched_outside() const {
    int64_t bad = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(buf_.size()); ++i) {
      const int64_t off = i - guard_;
      bool inside = false;
      if (off >= 0 && rows_ > 0) {
        const int64_t r = off / ld_, c = off % ld_;
        inside = r < rows_ && c < cols_;
      }
      if (!inside && f32_bits(buf_[static_cast<size_t>(i)]) != kSentinel) ++bad;
    }
    return bad;
  }
  // Number of written-region positions still holding the sentinel (the kernel skipped them).
  int64_t untouched_inside() const {
    int64_t bad = 0;
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t c = 0; c < cols_; ++c)
        if (f32_bits(at(r, c)) == kSentinel) ++bad;
    return bad;
  }

 private:
  int64_t rows_, cols_, ld_, guard_;
  std::vector<float> buf_;
};

// Compares got[r*ld_got + c] with ref[r*cols + c] under per-element tolerance tol(r, c, ref).
// Reports the worst few violations. Returns the number of violations.
template <class TolFn>
int64_t count_violations(const std::string& what, const float* got, int64_t ld_got, const float* ref, int64_t rows,
                         int64_t cols, TolFn tol, int report = 5) {
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float g = got[r * ld_got + c], e = ref[r * cols + c];
      const double t = tol(r, c, e);
      const bool ok = (std::isnan(g) && std::isnan(e)) || std::fabs(double(g) - double(e)) <= t;
      if (!ok) {
        if (bad < report)
          ADD_FAILURE() << what << ": at [" << r << ", " << c << "] got " << g << " want " << e << " |d| "
                        << std::fabs(double(g) - double(e)) << " > tol " << t;
        ++bad;
      }
    }
  return bad;
}

// Number of elements whose bits differ.
inline int64_t count_bit_diffs(const float* got, int64_t ld_got, const float* ref, int64_t rows, int64_t cols) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) n += f32_bits(got[r * ld_got + c]) != f32_bits(ref[r * cols + c]);
  return n;
}

inline int64_t count_non_bf16(const float* got, int64_t ld_got, int64_t rows, int64_t cols) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) n += !is_bf16_value(got[r * ld_got + c]);
  return n;
}

inline const char* store_name(DType s) { return s == DType::BF16 ? "bf16" : "f32"; }

}  // namespace mm3::test
