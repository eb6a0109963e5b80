// ref_kernels.h — scalar, double-accumulating twins of every kernel in kernels/kernels.h (tests only).
//
// Same signatures, namespace mm3::ref. Written for obviousness, not speed: plain loops straight from
// the torch definitions cited in kernels.h, sums in double, and rounding to the store dtype at exactly
// the op boundaries kernels.h names (double -> float -> bf16). Where torch's definition itself is fp32
// (RoPE's inv_freq and freqs, the nearest-neighbour scale), the twin keeps that fp32 step, because
// it is part of the op rather than an accumulation. ThreadPool arguments are accepted and ignored.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/kernels.h"

namespace mm3::ref {

using kern::LinearWeight;

void linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
            int64_t ldy, DType store);
// kern::gemm_only_i8's W8A8 scheme (kernels.h, cpu/gemm_i8.cpp) from the plain weight [N, K] (F32 or
// BF16) and bias ([N] or an empty Tensor): per-row weight and activation quantization, exact integer
// sums, y = store(fma(float(sum), sx·sw, bias)). Bitwise what linear() on gemm_only_i8(w) writes;
// opt as gemm_only_i8's: x on two levels (cpu/gemm_i8.cpp); rows rotated (rotate_row) where K allows.
void linear_i8(const float* x, int64_t M, int64_t ldx, const Tensor& weight, const Tensor& bias, float* y, int64_t ldy,
               DType store, kern::I8Options opt = {});
// kern::rotate_row's scalar twin, written from its contract (kernels.h).
void rotate_row(float* v, int64_t n);
void gemm_f32(const ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

void embedding(const Tensor& table, const int64_t* ids, int64_t n, float* out, int64_t ldo);
void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps, float* y,
              int64_t ldy, DType store);
void layer_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, const float* bias,
                float eps, float* y, int64_t ldy, DType store);
void rope_tables(const int64_t* positions, int64_t n_pos, int rot_dim, double theta, float* cos, float* sin,
                 DType store);
void rope_apply(float* x, int64_t S, int H, int head_dim, int64_t ld, const float* cos, const float* sin,
                int rot_dim, DType store);

void attention(const ThreadPool& pool, const float* q, int64_t ldq, const void* k, const void* v, int64_t ldkv,
               DType kv_dtype, float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
               bool causal, int64_t q_pos0, DType store, int64_t kv_span = 0, int64_t ldh = 0);
void softmax_rows(float* x, int64_t rows, int64_t cols);

void silu_mul(const float* gate, const float* up, float* out, int64_t n, DType store);
void silu(const float* x, float* out, int64_t n, DType store);
void add(const float* a, const float* b, float* out, int64_t n, DType store);
void tanh_inplace(float* x, int64_t n, DType store);
void snake(const float* x, const float* alpha, float* y, int64_t C, int64_t L, DType store);

// Fusions as three ops: ref::snake into a copy of x, the convolution (double sum, one rounding), then
// st(residual + conv).
void conv1d(const ThreadPool& pool, const float* x, int64_t Cin, int64_t L, const float* w, const float* bias,
            int64_t Cout, int K, int stride, int pad, int dilation, float* y, DType store,
            const kern::ConvFusion& fusion = {});
void conv_transpose1d(const ThreadPool& pool, const float* x, int64_t Cin, int64_t L, const float* w,
                      const float* bias, int64_t Cout, int K, int stride, int pad, int output_padding, float* y,
                      DType store, const kern::ConvFusion& fusion = {});

int64_t nearest_src_index(int64_t dst, int64_t in_len, int64_t out_len);
void interpolate_nearest(const float* x, int64_t C, int64_t Lin, int64_t Lout, float* y);
void transpose_2d(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out);

}  // namespace mm3::ref
