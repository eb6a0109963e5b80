// strips.h — a BF16 weight held as 32-row strips of bf16 pairs (GemmKind::Bf16Strips, kernels.h).
//
// Layout: strip g holds rows n = 32g .. 32g + 31 of the [N, K] weight; pair p of a strip is 64 uint16
// (128 bytes): element (j, h) at [j * 2 + h] is W[32g + j, 2p + h]. So
//   form[(g * P + p) * 64 + j * 2 + h] = W[32g + j, 2p + h],  P = ceil(K / 2),
// zero for rows past N and for k = K when K is odd. A pair's 128 bytes are what gemm_nt's bf16 tile
// reads per k pair of a 32-column strip (pack_bf16's layout), so the GEMM packs a block of them with a
// copy, and the decode GEMV streams the whole form front to back, one line at a time.
//
// The decode GEMV on this form puts one output row in each vector lane (16 rows a vector) and runs
// each output as ONE chain over k (the GEMM's order, gemm_nt.h): with bf16 products one VDPBF16PS chain
// over the pairs p = 0, 1, ..., with fp32 products one FMA chain over k = 0, 1, ... So on this form
// the GEMV (M <= 4) and the GEMM (M > 4) give every output the same bits, and both give what the GEMM
// gives on the plain weight.
// Why (thirty-second session, Zen 4): the row-major GEMV loads M lines of x per NB weight lines,
// and x (2 x 8 KiB at K = 4096) falls out of the L1D between uses, so those loads are L2 fills that cost
// the stream about what weight lines do (linear.cpp, gemv_bf16_rows). Here x is a broadcast dword per
// pair, so one x line serves 16 pairs of weight lines (2 x lines per 32 weight lines at M = 2).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mm3::kern::detail {

inline constexpr int64_t kStripRows = 32;
inline int64_t strips_count(int64_t N) { return (N + kStripRows - 1) / kStripRows; }
inline int64_t strips_pairs(int64_t K) { return (K + 1) / 2; }
// uint16 elements of the form of an [N, K] weight.
inline int64_t strips_size(int64_t N, int64_t K) { return strips_count(N) * strips_pairs(K) * 2 * kStripRows; }

// Strips [g0, g1) of the form of B ([N, K] bf16 bits, rows ldb apart), written into `form` (the whole
// form's start; other strips untouched). Parts over disjoint strip ranges make up the whole.
void strips_pack_part(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, int64_t g0, int64_t g1, uint16_t* form);

// The same weight's element (n, k) read back from the form (tests, slow).
uint16_t strips_at(const uint16_t* form, int64_t K, int64_t n, int64_t k);

// GEMV on strips [g0, g1): sums[m * N + n] for m < M and the rows n of those strips below N.
// bf16 products (needs AVX512-BF16): xb holds the M rows of x as bf16 bits, Kp = 2 * strips_pairs(K)
// apart, zero past K. M in 1..4.
void strips_gemv_bf16(const uint16_t* xb, int64_t Kp, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0,
                      int64_t g1, float* sums);
// fp32 products (needs AVX-512): x fp32 rows, ldx apart. M in 1..4.
void strips_gemv_f32(const float* x, int64_t ldx, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0,
                     int64_t g1, float* sums);

// gemm_ex's packers from the form (B = the form): the block (columns [n0, n0 + nc), n0 a multiple of 32;
// k's [k0, k0 + kc), k0 even) exactly as pack_bf16 / pack_f32 lay it out from the plain weight.
void strips_block_bf16(const uint16_t* form, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc, uint16_t* Bp);
void strips_block_f32(const uint16_t* form, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float* Bp);

}  // namespace mm3::kern::detail
