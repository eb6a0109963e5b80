// conv_detail.h — private helpers shared by the CPU convolution files (conv.cpp, conv_direct.cpp,
// conv_snake.cpp) and kern::snake (elementwise.cpp); not part of kernels.h.
#pragma once

#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/kernels.h"

namespace mm3::kern::detail {

// (alpha + 1e-9).reciprocal() of one Snake channel: two torch ops, each rounded to store.
float snake_inv(float alpha, DType store);

// One channel row of kern::snake: y[t] = x[t] + inv * sin(alpha * x[t])^2 for t < n, the ops mul, sin,
// square, mul, add each rounded to store (inv from snake_inv). y may equal x. Every call computes a
// value with the same instructions whatever the row offset or length, so a conv's fused Snake gives the
// bits kern::snake gives.
void snake_row(const float* x, float alpha, float inv, float* y, int64_t n, DType store);

// y[i] = sin(x[i]) by the bf16 snake_row's sine (the vector one where the CPU has AVX-512 or AVX2),
// for its tests.
void sin_row(const float* x, float* y, int64_t n);
// y[i] = sin(x[i])² as the fp32 snake_row computes it (one vector sequence, not a sine then its
// square; std::sin squared without AVX2), for its tests.
void sin2_row(const float* x, float* y, int64_t n);

// The torch-layout weight and bias [Cout] (empty without) of a packed layer (conv_direct.cpp): a
// Conv1d's [Cout, Cin, K], a ConvTranspose1d's [Cin, Cout, K].
void conv_unpack(const ConvWeight& w, std::vector<float>& weight, std::vector<float>& bias);

// v[co][0 .. cols) = sum_ci w[co, ci] · u[ci][0 .. cols) for a packed one-tap Conv1d w, every co, on the
// calling thread (no bias), cols <= 64: a full strip by its own AVX-512 body where the CPU has it, else by
// the direct kernel's tiles, the same bits either way: the input channels in chunks of
// `chunk`, each summed in one FMA chain from 0, the chunk sums added to v in order. Reads 64 columns of
// every u row (ldu >= 64); writes only cols of each v row.
void conv_onetap_strip(const ConvWeight& w, const float* u, int64_t ldu, int cols, float* v, int64_t ldv,
                       int64_t chunk);

// The bias of a packed layer (conv_direct.cpp; Cout values, then zero padding) or null without one.
const float* conv_bias(const ConvWeight& w);

// False when the environment sets MM3_CONV_WINOGRAD=0 (read once): conv_winograd and conv_winograd_t
// then return their weight unchanged (conv_winograd.cpp).
bool winograd_enabled();

// conv_packed on a conv_winograd weight, store F32 (conv_winograd.cpp).
void winograd_run(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y,
                  const ConvFusion& fusion);
// conv_packed on a conv_winograd_t weight, store F32 (conv_winograd_t.cpp).
void winograd_t_run(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y,
                    const ConvFusion& fusion);

}  // namespace mm3::kern::detail
