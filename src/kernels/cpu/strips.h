// strips.h — a BF16 weight held as 32-row strips of bf16 pairs (GemmKind::Bf16Strips, kernels.h).
//
// Layout: strip g holds rows n = 32g .. 32g + 31 of the [N, K] weight, as P = ceil(K / 2) bf16 pairs of
// 64 uint16 (128 bytes) each: element (j, h) of pair p at [j * 2 + h] is W[32g + j, 2p + h] (zero for rows
// past N and for k = K when K is odd). That is the 128 bytes gemm_nt's bf16 tile reads per k pair of a
// 32-column strip (pack_bf16's layout). Within a strip the pairs are stored by residue: first the pairs
// p = 0, 16, 32, ..., then p = 1, 17, ..., up to p = 15, 31, ... (strips_pair_pos), the order in which the
// decode GEMV below consumes them.
//
// The decode GEMV (M <= 4) on this form puts one output row in each vector lane (16 rows a vector) and
// gives every output the bits of the row-major bf16 GEMV (linear.cpp, gemv_rows_bf16: 16 lanes, lane q
// a VDPBF16PS chain over the pairs p = q (mod 16) in order, then _mm512_reduce_add_ps's tree): one pass
// per residue q, each a chain per (row, m) over the pairs of that residue, then the same tree over the 16
// partial sums, lane by lane. So a frame decodes to the same bits in either form (the bf16 goldens'
// depth decoder is bit-identical to torch with that order). With fp32 products (store F32) it runs one
// FMA chain per output over k = 0, 1, ..., the GEMM's order. The GEMM (M > 4) copies its blocks' pairs
// out of the form, so it gives what the GEMM on the plain weight gives.
// Why (thirty-second session, Zen 4): the row-major GEMV loads M lines of x per NB weight lines, and x
// (2 x 8 KiB at K = 4096) falls out of the L1D between uses, so those loads are L2 fills that cost the
// stream about what weight lines do (linear.cpp, gemv_bf16_rows). Here x is a broadcast dword per pair,
// from a copy in the form's pair order, so one x line serves 16 pairs: 2 x lines per 32 weight lines at
// M = 2, where 12 rows side by side read 2 per 12, and the weights stream as one sequence.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"

namespace mm3::kern::detail {

inline constexpr int64_t kStripRows = 32;
inline int64_t strips_count(int64_t N) { return (N + kStripRows - 1) / kStripRows; }
inline int64_t strips_pairs(int64_t K) { return (K + 1) / 2; }
// uint16 elements of the form of an [N, K] weight.
inline int64_t strips_size(int64_t N, int64_t K) { return strips_count(N) * strips_pairs(K) * 2 * kStripRows; }
// Where pair p of a strip of P pairs is stored (in pairs from the strip's start): residue q = p mod 16
// after the pairs of the residues below it, each residue's pairs in order.
inline int64_t strips_residue_start(int64_t q, int64_t P) { return q * (P / 16) + std::min<int64_t>(q, P % 16); }
inline int64_t strips_pair_pos(int64_t p, int64_t P) { return strips_residue_start(p % 16, P) + p / 16; }

// Strips [g0, g1) of the form of B ([N, K] bf16 bits, rows ldb apart), written into `form` (the whole
// form's start; other strips untouched). Parts over disjoint strip ranges make up the whole.
void strips_pack_part(const uint16_t* B, int64_t ldb, int64_t N, int64_t K, int64_t g0, int64_t g1, uint16_t* form);

// The same weight's element (n, k) read back from the form (tests, slow).
uint16_t strips_at(const uint16_t* form, int64_t K, int64_t n, int64_t k);

// x for strips_gemv_bf16: the M rows of xb (bf16 bits, Kp = 2 * strips_pairs(K) apart, zero past K) as
// bf16 pairs in the form's pair order, strips_pairs(K) of them a row.
void strips_order_x(const uint16_t* xb, int64_t Kp, int64_t M, uint32_t* xq);

// GEMV on strips [g0, g1): sums[m * N + n] for m < M and the rows n of those strips below N. M in 1..4.
// bf16 products (needs AVX512-BF16), x from strips_order_x:
void strips_gemv_bf16(const uint32_t* xq, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0, int64_t g1,
                      float* sums);
// The same sums without VDPBF16PS (needs AVX-512; for CPUs where it is slow, cpu_bf16_dot_slow): each
// pair as two FMAs in the instruction's order and rounding, x from strips_split_x. The same bits.
void strips_gemv_bf16fma(const float* xs, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0, int64_t g1,
                         float* sums, bool prefetch);
// xq (M rows of P pairs, strips_order_x) split for strips_gemv_bf16fma: xs[2i] the pair word's high half
// (the odd k), xs[2i + 1] its low half, as fp32.
void strips_split_x(const uint32_t* xq, int64_t M, int64_t P, float* xs);
// fp32 products (needs AVX-512): x fp32 rows, ldx apart.
void strips_gemv_f32(const float* x, int64_t ldx, int64_t M, const uint16_t* form, int64_t N, int64_t K, int64_t g0,
                     int64_t g1, float* sums);

// gemm_ex's packers from the form (B = the form): the block (columns [n0, n0 + nc), n0 a multiple of 32;
// k's [k0, k0 + kc), k0 even) exactly as pack_bf16 / pack_f32 lay it out from the plain weight.
void strips_block_bf16(const uint16_t* form, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc, uint16_t* Bp);
void strips_block_f32(const uint16_t* form, int64_t K, int64_t n0, int64_t nc, int64_t k0, int64_t kc, float* Bp);

}  // namespace mm3::kern::detail
