// quant.h — block-quantized Linear weights (int8 and 4-bit) for the memory-bound AR decode (issue 8).
//
// The decode step streams every LM and depth-decoder weight once per step for only M = 2 rows (the
// two CFG rows), so its time is weight bytes / memory bandwidth. These formats cut the bytes to ~53 %
// (int8) and ~31 % (q4) of bf16. They are an *approximation* of the checkpoint: a quantized run is a
// different computation from the reference's bf16 one (ARCHITECTURE.md habit 7) and is never used
// unless asked for (see model/quant_weights.h); the bf16 path is untouched.
//
// ---- Format (exact layout; the on-disk sidecar of `mm3 quantize` stores these same bytes) --------
// A weight W [N, K] (torch layout [out, in]) is quantized row by row in blocks of 32 consecutive k:
// block b of row n covers k in [32b, 32b + 32). K is zero-padded to Kp = ceil(K / 512) · 512, so a
// row has S = Kp / 512 *superblocks* of 16 blocks; superblock s holds blocks b = 16s + l, l = 0..15
// ("lane" l). Elements past K are padding: value 0, and their activations are 0 as well.
//
// QuantType::Int8 (8.5 bits per weight: 32 int8 + one fp16 scale per block)
//   d  = fp16(amax / 127), amax = max |w| over the block's real elements (fp32 division, RNE to fp16)
//   q  = clamp(round_half_even(w / d), -127, 127)   (d == 0: q = 0)     value(w) = d · q  (fp32 product)
//   qs row: Kp bytes. Superblock s is bytes [512s, 512s + 512); its byte 64v + 4l + i (v = 0..7,
//           l = 0..15, i = 0..3) holds q + 128 (as u8) of element 4v + i of block 16s + l. So each
//           64-byte vector v holds 4 consecutive elements of each of the 16 blocks: exactly one
//           VPDPBUSD operand, whose 32-bit lane l then accumulates only block l's products.
//   scales row: S · 16 fp16; entry 16s + l = d of block 16s + l.
// QuantType::Q4 (5 bits per weight: 32 4-bit codes + fp16 scale + fp16 minimum per block)
//   q(d, m) = clamp(round_half_even((w − m) / d), 0, 15)  (d == 0: q = 0)   value(w) = d · q + m (fp32
//   mul, add). (d, m): candidate 0 is m = fp16(min w), d = fp16((max w − m) / 15); then twice a
//   least-squares refit of (d, m) to the codes q(d, m) of the previous candidate (sums in double in k
//   order; stop when the fit is degenerate or d <= 0), rounded to fp16; the candidate with the least
//   Σ (w − value)² (double, k order; the first on ties) is stored. (Gaussian weights: 6 % lower RMS error than min/max
//   alone.) qs row: Kp / 2 bytes. Superblock s is bytes [256s, 256s + 256): four 64-byte chunks c = 0..3; the
//           low nibble of byte 64c + j is byte j of unpacked vector c, the high nibble byte j of
//           unpacked vector c + 4, where the unpacked vectors v = 0..7 are laid out as for Int8
//           (byte 4l + i of vector v = element 4v + i of block 16s + l), holding q (0..15).
//   scales row: S · 32 fp16; entry 32s + l = d of block 16s + l, entry 32s + 16 + l = m of that block.
// Padding blocks (all k >= K): Int8 d = 0 and bytes 128; Q4 d = m = 0 and q = 0.
// In memory (and in the sidecar) qs is a tensor I32 [N, qs_bytes / 4] of raw bytes (little-endian; the
// safetensors reader has no byte dtype) and scales a tensor F16 [N, scales_per_row].
//
// ---- Decode product (M <= 4 rows; kern::linear's GEMV path with a quantized weight) ---------------
// The activations are quantized per 32-block too (part of the op, as llama.cpp's Q8 dot products):
//   amax = max |x| over the block (x past K = 0); dx = amax / 127, ix = 127 / amax (fp32 divisions);
//   xq = clamp(round_half_even(x · ix), -127, 127); amax == 0: dx = 0, xq = 0. sx = Σ xq (int).
// For output (m, n), block b: isum = Σ_k q · xq (exact int32). Per superblock s = 0, 1, ... in order,
// in fp32 lane l (block 16s + l), acc_l starting at 0:
//   Int8: acc_l = fma(float(isum), d · dx, acc_l)
//   Q4:   acc_l = fma(float(isum), d · dx, acc_l); acc_l = fma(m, dx · float(sx), acc_l)
// then a fixed tree over the 16 lanes: t8_i = acc_i + acc_{i+8}; t4_i = t8_i + t8_{i+4};
// t2_i = t4_i + t4_{i+2}; r = t2_0 + t2_1; y = round_store(r + bias[n]). The AVX512-VNNI path, the AVX2
// path and the portable scalar path perform exactly these operations, so they give the same bits, independent of
// the thread count (threads split output rows; each output is computed by one thread).
//
// ---- Prefill product (M > 4) ---------------------------------------------------------------------
// Rows of W are dequantized (value() above) into panels and fed to the blocked GEMM (gemm_nt.h): for
// a bf16 computation (store BF16) the values are rounded to bf16 and the GEMM takes its AVX512-BF16
// pair dots (bf16 rounding of a dequantized value, ≤ 2^-9 relative, is below the quantization step);
// with an F32 store the fp32 values and the fp32 GEMM. x is not quantized on this path.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "core/aligned.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace mm3::kern {

enum class QuantType : uint8_t { None = 0, Int8 = 1, Q4 = 2 };

const char* quant_name(QuantType t);                         // "none", "int8", "q4"
std::optional<QuantType> quant_from_name(std::string_view s);  // also "bf16" -> None, "q8" -> Int8

inline constexpr int64_t kQuantBlock = 32;   // weights per block (one scale)
inline constexpr int64_t kQuantLanes = 16;   // blocks per superblock
inline constexpr int64_t kQuantSuper = 512;  // weights per superblock

inline int64_t quant_padded_k(int64_t K) { return (K + kQuantSuper - 1) / kQuantSuper * kQuantSuper; }
int64_t quant_row_qs_bytes(QuantType t, int64_t K);   // Kp (Int8) or Kp / 2 (Q4)
int64_t quant_row_scales(QuantType t, int64_t K);     // fp16 entries per row: Kp / 32 or Kp / 16

// ---- Strip form (a second copy for the AVX512-VNNI decode GEMV; with_strips below) ----------------
// The row form gives each 64-byte vector 4 codes of each of 16 *blocks* of one row, so the GEMV loads
// a 64-byte vector of x beside every vector of codes, per activation row m. The strip form regroups
// the same bytes so that a vector holds 4 codes of each of 16 *rows* ("lane = row"): the GEMV then
// broadcasts 4 bytes of x per vector and m (a load of x per 16 rows instead of per row), which on
// Zen 4 is what held the q4 body's rate and the K = 12288 GEMVs' (docs/performance-history.md,
// thirty-third session).
// Strip j holds rows 16j..16j+15; rows past N are padding (codes of value 0: Int8 bytes 128, Q4 0;
// d = m = 0). Its blocks go residue-major: block (l, s), i.e. block b = 16s + l of each of its 16 rows,
// sits at codes byte ((16j + l) · S + s) · B, B = 512 (Int8) or 256 (Q4), and its byte 64g + 4r + i is
// the byte the row form holds at 64g + 4l + i of row 16j + r's superblock s (a 16 x 16 transpose of
// 4-byte words per 64-byte vector g). Its scales sit at entry ((16j + l) · S + s) · E: E = 16 (Int8: d of
// rows r = 0..15) or 32 (Q4: d of the 16 rows, then m of the 16 rows).
// The GEMV on this form runs, per strip and residue l, the blocks s = 0, 1, ... in order into one fp32
// vector whose lane r is lane l of row 16j + r's accumulator in quant.h's decode product, then quant.h's
// lane tree lane-wise over the 16 residues: the same operations, so the same bits as the row form.
struct QuantStrips {
  int64_t strips = 0, S = 0;  // ceil(N / 16) strips of S superblocks
  int64_t block_bytes = 0;    // B
  int64_t block_scales = 0;   // E
  Tensor codes;               // I32 [strips · 16 · S · B / 4] (raw bytes)
  Tensor scales;              // F16 [strips · 16 · S · E]
  const uint8_t* block(int64_t j, int64_t l) const {
    return static_cast<const uint8_t*>(codes.raw()) + ((16 * j + l) * S) * block_bytes;
  }
  const uint16_t* block_scales_at(int64_t j, int64_t l) const {
    return static_cast<const uint16_t*>(scales.raw()) + ((16 * j + l) * S) * block_scales;
  }
  size_t bytes() const { return codes.nbytes() + scales.nbytes(); }
};

// An immutable quantized [N, K] weight in the layout above. Holds its two tensors (owned, or zero-copy
// views of a sidecar file that they keep mapped), and optionally the strip form (with_strips).
class QuantMatrix {
 public:
  // Validates type, dims and the tensors' dtypes / shapes (InternalError on a mismatch; the sidecar
  // loader checks first and reports BadModel with the key).
  QuantMatrix(QuantType type, int64_t N, int64_t K, Tensor qs, Tensor scales);

  QuantType type() const { return type_; }
  int64_t rows() const { return n_; }
  int64_t cols() const { return k_; }
  int64_t padded_cols() const { return kp_; }
  int64_t superblocks() const { return kp_ / kQuantSuper; }
  int64_t row_qs_bytes() const { return row_qs_; }
  int64_t row_scales() const { return row_sc_; }
  const uint8_t* qs_row(int64_t n) const { return qs_bytes_ + n * row_qs_; }
  const uint16_t* scales_row(int64_t n) const { return scales_ + n * row_sc_; }
  const Tensor& qs() const { return qs_; }           // I32 [N, row_qs_bytes / 4]
  const Tensor& scales() const { return sc_; }       // F16 [N, row_scales]
  size_t bytes() const { return qs_.nbytes() + sc_.nbytes(); }
  // The stored value of w[n, k] (0 for k >= K), exactly as the kernels use it.
  float value(int64_t n, int64_t k) const;
  // The strip form, where with_strips built one (else null).
  const QuantStrips* strips() const { return strips_.get(); }

 private:
  friend std::shared_ptr<const QuantMatrix> with_strips(const ThreadPool& pool, const QuantMatrix& q);
  std::shared_ptr<const QuantStrips> strips_;
  QuantType type_;
  int64_t n_, k_, kp_, row_qs_, row_sc_;
  Tensor qs_, sc_;
  const uint8_t* qs_bytes_;
  const uint16_t* scales_;
};

// Quantizes a 2-D F32 or BF16 weight [N, K] (rows contiguous, e.g. a row slice) into `type` (Int8 or
// Q4). Deterministic (rows are independent), parallel over rows. Throws InvalidInput on a non-finite
// weight.
std::shared_ptr<const QuantMatrix> quantize_weight(const ThreadPool& pool, const Tensor& w, QuantType type);

// Whether the strip form has a GEMV on this CPU (AVX512-VNNI).
bool quant_strips_offered();
// Whether its GEMV beats the row form's at width K: where M = 2 rows of quantized activations fill more
// than half the L1D, so that the row bodies read them from L2 beside the streamed codes (the test that
// picks gemv_vnni's 4-rows-side-by-side body). Zen 4, thirty-third session, in one process with the
// forms alternating (40 runs, probe 57-58 GB/s): [4096, 12288] int8 32.7 -> 40.9 GB/s, q4 29.2 -> 40.0;
// probe 36: int8 0.85x, q4 0.86x the time. At K = 4096 the strips lost: int8 47.3 -> 43.1 GB/s, q4 even.
bool quant_strips_pay(int64_t K);
// A QuantMatrix sharing q's tensors, with the strip form built beside them (parallel over strips).
// The decode GEMV (M <= 4, AVX512-VNNI) and dequantize_rows (the prefill) then read the strips; the
// other GEMV paths (forced scalar / AVX2), value() and the sidecar writer read the row form.
std::shared_ptr<const QuantMatrix> with_strips(const ThreadPool& pool, const QuantMatrix& q);

// out[(n − n0) · ldo + k] = q.value(n, k) for n in [n0, n1), k < K.
void dequantize_rows(const QuantMatrix& q, int64_t n0, int64_t n1, float* out, int64_t ldo);

namespace detail {

// The decode GEMV's quantized activations (layout of the weights: per row m, Kp int8 interleaved as
// the Int8 qs, i.e. byte 512s + 64v + 4l + i = xq of element 4v + i of block 16s + l), with per-block
// dx, the Int8 correction −128 · sx (the weights are stored as q + 128) and dx · float(sx) for Q4.
struct QuantActs {
  int64_t M = 0, Kp = 0;
  // On cache lines (the bodies load 64 bytes at a time; core/aligned.h says what a split line costs).
  aligned_vector<int8_t> xq;     // [M, Kp]
  aligned_vector<float> dx;      // [M, Kp / 32]
  aligned_vector<int32_t> corr;  // [M, Kp / 32]
  aligned_vector<float> sxdx;    // [M, Kp / 32]
  // The strip GEMV's order of the same values (order_acts_for_strips): word ((l · S + s) · 8 + g) · M + m
  // of sxw = the 4 bytes of xq row m at 512s + 64g + 4l; entry (l · S + s) · M + m of sdx, scorr and
  // ssxdx = dx, corr and sxdx of row m, block 16s + l.
  aligned_vector<int32_t> sxw;
  aligned_vector<float> sdx, ssxdx;
  aligned_vector<int32_t> scorr;
};
// scalar: the portable loop even where AVX-512 is available (both give the same bytes).
void quantize_acts(const float* x, int64_t M, int64_t ldx, int64_t K, QuantActs& a, bool scalar = false);
// Fills a's strip-order arrays (sxw, sdx, scorr, ssxdx) from its row-order ones.
void order_acts_for_strips(QuantActs& a);

enum class QuantIsa { Auto, Scalar, Avx512Vnni, Avx2, AvxVnni };  // AvxVnni: AVX2 + VEX VPDPBUSD (256 bits)
bool quant_isa_available(QuantIsa isa);

// y[m, n] = the decode product above, for m < M <= 4. `isa` forces a path (tests); Auto picks the best.
void quant_gemv(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const QuantMatrix& w,
                const float* bias, float* y, int64_t ldy, DType store, QuantIsa isa = QuantIsa::Auto);
// quant_gemv for several weights of the same K sharing x (kern::linear_multi): x quantized once, one
// parallel pass over all their output rows; each output the same bits as quant_gemv gives it.
struct QuantOut {
  const QuantMatrix* w;
  const float* bias;
  float* y;
  int64_t ldy;
};
void quant_gemv_multi(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const QuantOut* outs, int n,
                      DType store, QuantIsa isa = QuantIsa::Auto);
// y = the prefill product above (any M).
void quant_gemm(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const QuantMatrix& w,
                const float* bias, float* y, int64_t ldy, DType store);

}  // namespace detail

}  // namespace mm3::kern
