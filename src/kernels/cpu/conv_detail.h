// conv_detail.h — private helpers shared by the CPU convolution files (conv.cpp, conv_direct.cpp,
// conv_snake.cpp) and kern::snake (elementwise.cpp); not part of kernels.h.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mm3::kern::detail {

// (alpha + 1e-9).reciprocal() of one Snake channel: two torch ops, each rounded to store.
float snake_inv(float alpha, DType store);

// One channel row of kern::snake: y[t] = x[t] + inv * sin(alpha * x[t])^2 for t < n, the ops mul, sin,
// square, mul, add each rounded to store (inv from snake_inv). y may equal x. Every call computes a
// value with the same instructions whatever the row offset or length, so a conv's fused Snake gives the
// bits kern::snake gives.
void snake_row(const float* x, float alpha, float inv, float* y, int64_t n, DType store);

// y[i] = sin(x[i]) by snake_row's sine (the vector one where the CPU has AVX-512), for its tests.
void sin_row(const float* x, float* y, int64_t n);

}  // namespace mm3::kern::detail
