// resample.cpp — kern::nearest_src_index, interpolate_nearest, transpose_2d (kernels.h), the CPU backend.
//
// nearest_src_index is ATen's legacy `nearest_idx` (F.interpolate(mode="nearest") without
// scale_factor; MODEL.md §3 step 7): L == T -> dst; L == 2T -> dst >> 1; otherwise
// scale = (float)T / (float)L in float32 and src = min((int64)floorf((float)dst * scale), T - 1).
// The float32 arithmetic is the point: a double scale gives different indices for some lengths.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

int64_t nearest_src_index(int64_t dst, int64_t in_len, int64_t out_len) {
  if (out_len == in_len) return dst;
  if (out_len == 2 * in_len) return dst >> 1;
  const float scale = static_cast<float>(in_len) / static_cast<float>(out_len);
  const float p = static_cast<float>(dst) * scale;
  return std::min(static_cast<int64_t>(std::floor(p)), in_len - 1);
}

void interpolate_nearest(const float* x, int64_t C, int64_t Lin, int64_t Lout, float* y) {
  MM3_CHECK(Lin > 0 && Lout > 0, "interpolate_nearest: Lin={} Lout={}", Lin, Lout);
  std::vector<int64_t> src(static_cast<size_t>(Lout));
  for (int64_t j = 0; j < Lout; ++j) src[static_cast<size_t>(j)] = nearest_src_index(j, Lin, Lout);
  for (int64_t c = 0; c < C; ++c) {
    const float* xr = x + c * Lin;
    float* yr = y + c * Lout;
    for (int64_t j = 0; j < Lout; ++j) yr[j] = xr[src[static_cast<size_t>(j)]];
  }
}

void transpose_2d(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out) {
  MM3_CHECK(ldx >= cols, "transpose_2d: ldx {} < cols {}", ldx, cols);
  constexpr int64_t B = 32;  // cache blocks: both sides touch whole lines
  for (int64_t r0 = 0; r0 < rows; r0 += B)
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t r1 = std::min(rows, r0 + B), c1 = std::min(cols, c0 + B);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out[c * rows + r] = x[r * ldx + c];
    }
}

}  // namespace mm3::kern
