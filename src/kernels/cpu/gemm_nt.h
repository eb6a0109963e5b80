// gemm_nt.h — the CPU backend's own blocked GEMM, C = A · Bᵀ (private to src/kernels/cpu).
//
// Why not OpenBLAS here: its sgemm gives different bits with 1 and 2 threads (measured in
// tests/unit/kernels_linear.cpp), and kernels.h promises `linear` results independent of the thread
// count. In this kernel every output element is ONE sequential fp32 FMA chain over k = 0..K-1 (the
// partial sum is parked in C between K blocks, which is exact), so neither the blocking, the thread
// count, nor the ISA (AVX-512 or the portable fallback) changes a single bit.
// The bf16 variant (AVX512-BF16 VDPBF16PS) chains over k in pairs instead; same guarantees on a
// given machine. Products of bf16 values are exact in fp32 either way.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace mm3::kern {
class LinearWeight;
}  // namespace mm3::kern

namespace mm3::kern::detail {

// C[m, n] = round_store(sum_k A[m, k] * B[n, k] + bias[n]) for m < M, n < N (C stride ldc; only those
// entries are written). A: fp32 rows (stride lda). B: rows of length K, stride ldb, F32 floats or BF16
// bits (b_dtype). bias: fp32 [N] or null. bf16_dot: use bf16 dot products (A must be bf16-valued;
// requires B in BF16 and cpu_has_avx512bf16(); otherwise ignored).
void gemm_nt(const ThreadPool& pool, const float* A, int64_t lda, int64_t M, const void* B, DType b_dtype, int64_t ldb,
             int64_t N, int64_t K, const float* bias, float* C, int64_t ldc, DType store, bool bf16_dot);

// General form: A[m, k] at A + m * a_rs + k * a_cs (row-major A: a_rs = lda, a_cs = 1; Aᵀ stored
// row-major: a_rs = 1, a_cs = lda). B[n, k] at B + n * ldb + k, or with b_kmajor at B + k * ldb + n
// (a [K, N] matrix, e.g. an im2col buffer); bf16_dot applies only to the n-major form.
// prepacked: B already packed by pack_f32_panels (fp32 products; B, b_dtype, ldb, b_kmajor, bf16_dot are
// then ignored) — the same bits as packing B at the call.
// b_strips: B is a BF16 weight's strip form (strips.h; b_dtype BF16, ldb and b_kmajor ignored), packed
// block by block from it — the same bits as the plain weight gives.
void gemm_ex(const ThreadPool& pool, const float* A, int64_t a_rs, int64_t a_cs, int64_t M, const void* B,
             DType b_dtype, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, const float* bias, float* C, int64_t ldc,
             DType store, bool bf16_dot, const float* prepacked = nullptr, bool b_strips = false);

// B [N, K] (F32 rows, stride ldb) packed once in the layout gemm_ex's fp32 tiles read on this
// machine: column panel p (128 columns) at panels + p·128·K, its K block at k0 at + k0·strips·32
// (strips = that panel's 32-column strips), each block as pack_f32 writes it. pack_f32_panels_size
// floats; zero past N.
int64_t pack_f32_panels_size(int64_t N, int64_t K);
void pack_f32_panels(const ThreadPool& pool, const float* B, int64_t ldb, int64_t N, int64_t K, float* panels);
// The same on the calling thread (for a caller already inside a parallel task), B n-major as above or,
// with b_kmajor, B[n, k] at B + k * ldb + n (a [K, N] matrix).
void pack_f32_panels_serial(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, float* panels);
// Only the part of that form that B's rows [r0, r1) fill (rows: n for n-major B, k for k-major; r0 a
// multiple of 32, r1 too or the last row), pads included: parts over disjoint row ranges make up the whole.
void pack_f32_panels_part(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, int64_t r0, int64_t r1,
                          float* panels);

// B [N, K] as bf16 bits (n-major rows, stride ldb) packed once in the layout gemm_ex's bf16 tiles read
// (the bf16 pairs of pack_bf16 per K block, panels of 128 columns), on the calling thread;
// pack_bf16_panels_size uint16 values, zero past N and K.
int64_t pack_bf16_panels_size(int64_t N, int64_t K);
void pack_bf16_panels_serial(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, uint16_t* panels);
// pack_bf16_panels_serial of an F32 B rounded to bf16 as it is read (f32_to_bf16_bits), without the bf16
// copy: B[n, k] at B + n * ldb + k, or with b_kmajor at B + k * ldb + n (a [K, N] matrix). The same
// uint16 values as f32_to_bf16 into an n-major copy then pack_bf16_panels_serial.
void pack_bf16_panels_from_f32_serial(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K,
                                      uint16_t* panels);
// Only the part of that form that B's rows [r0, r1) fill (rows: n for n-major B, k for k-major; r0 a
// multiple of 32, r1 too or the last row), pads included: parts over disjoint row ranges make up the
// whole, so callers can split the packing by rows (each task reading whole rows, not a head's slice).
void pack_bf16_panels_from_f32_part(const float* B, int64_t ldb, bool b_kmajor, int64_t N, int64_t K, int64_t r0,
                                    int64_t r1, uint16_t* panels);
// C[m, n] = round_store(sum_k A[m, k] * B[n, k]) for m < M, n < N by the bf16 tiles (VDPBF16PS; needs
// cpu_has_avx512bf16()) on B packed by pack_bf16_panels_serial and A as bf16 bits (rows of stride
// lda); with K odd A[m, K] is read as the last pair's second half and must be finite (write a zero).
// The bits of gemm_ex's bf16 form on the same values; runs on the calling thread.
void gemm_bf16_packed_serial(const uint16_t* A, int64_t lda, int64_t M, const uint16_t* panels, int64_t N, int64_t K,
                             float* C, int64_t ldc, DType store);

// y[m, n] = round_bf16(sum_k x[m, k] W[n, k] + bias[n]) by oneDNN on a gemm_only_bf16 weight's
// blocked form (gemm_dnnl.cpp); x bf16-valued, bias the weight's fp32 bias or null.
void dnnl_linear_bf16(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const void* form,
                      const float* bias, float* y, int64_t ldy);
// The same with x given as bf16 bits (rows of stride ldx); round_y false leaves y as oneDNN's fp32
// sums (kernels.h linear_bf16_in).
void dnnl_linear_bf16_in(const ThreadPool& pool, const uint16_t* xb, int64_t M, int64_t ldx, const void* form,
                         const float* bias, float* y, int64_t ldy, bool round_y);

// gemm_only_f32's oneDNN form: `plain` (a contiguous F32 [N, K]) packed for oneDNN's fp32 brgemm (or,
// without AVX-512, its JIT sgemm), its size in `bytes`; null (bytes untouched) when oneDNN is disabled
// (MM3_ONEDNN=0) or has neither kernel for the shape on this CPU.
std::shared_ptr<const void> dnnl_pack_f32(const Tensor& plain, bool bias, size_t& bytes);
// y[m, n] = store(sum_k x[m, k] W[n, k] + bias[n]) by oneDNN on that form (fp32 sums, its order).
void dnnl_linear_f32(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const void* form,
                     const float* bias, float* y, int64_t ldy, DType store);

// gemm_only_i8's oneDNN form: `plain` (a contiguous [N, K] of int8) packed for oneDNN's u8 x s8 -> s32
// matmul (brgemm with AVX512-VNNI, gemm:jit with AVX-VNNI only); null (bytes untouched) when oneDNN is
// disabled or its int8 sums are not exact here (dnnl_i8_exact in gemm_dnnl.cpp: no VNNI).
std::shared_ptr<const void> dnnl_pack_i8(const int8_t* plain, int64_t N, int64_t K, size_t& bytes);
// Whether dnnl_pack_i8 would pack here (oneDNN enabled and its int8 sums exact).
bool dnnl_i8_offered();
// acc [M, N] dense = sum_k xq[m, k] · W[n, k] exactly in int32, xq u8 rows of stride ldx.
void dnnl_matmul_i8(const ThreadPool& pool, const uint8_t* xq, int64_t M, int64_t ldx, const void* form, int32_t* acc);

// linear() on a gemm_only_i8 form (gemm_i8.cpp). What becomes of each output row: Store (linear), Glu
// (linear_glu's fused form: y is then the GLU's [M, N/2] output, stride ldy), Add (linear_add's: added
// to y's values).
enum class I8Sink { Store, Glu, Add };
void i8_linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
               int64_t ldy, DType store, I8Sink sink = I8Sink::Store);
// ff_glu_add on two gemm_only_i8 forms: w_in's output rows go through the GLU and onto w_out's levels
// while in cache.
void i8_ff_glu_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w_in,
                   const LinearWeight& w_out, float* y, int64_t ldy, DType store);

// linear() on a gemm_strassen_f32 form (gemm_strassen.cpp).
void strassen_linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                     int64_t ldy, DType store);

// C [M, N] = A [M, K] · B [K, N], all dense row-major, bf16 x bf16 -> fp32 (no rounding), by oneDNN's
// matmul. Returns false, computing nothing, when oneDNN is disabled (MM3_ONEDNN=0), the CPU lacks
// AVX512-BF16, or oneDNN offers no brgemm kernel for the shape.
bool dnnl_matmul_bf16(const ThreadPool& pool, int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B,
                      float* C);
// Whether dnnl_matmul_bf16 can run at all here (AVX512-BF16 and oneDNN not disabled).
bool dnnl_bf16_available();

}  // namespace mm3::kern::detail
