// kernels.h — the op interface model code calls (ARCHITECTURE.md: ops agnostic of the model).
//
// Conventions (read these before adding a kernel):
// * Activations are float buffers. `store` is the dtype torch would hold the op's *output* in: with
//   DType::BF16 the kernel rounds each written value to the nearest bf16 (round_bf16), exactly at the
//   op boundary where torch rounds; with DType::F32 it never rounds. Inputs of a bf16 computation are
//   already bf16-valued floats. Internal accumulation is fp32 or wider.
// * Matrices are row-major with an explicit leading dimension (elements between rows), so a kernel can
//   read a column block of a fused buffer or a KV cache without a copy.
// * Dim order in comments is PyTorch's. `[S, H, D]` = tokens, heads, head dim (token-major rows).
// * Every kernel here has a scalar, double-accumulating twin in ref/ref_kernels.h (tests only) with
//   the same signature in namespace mm3::ref.
// * Kernels that parallelise take the ThreadPool explicitly; none reads a global thread count.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/quant.h"

namespace mm3::kern {

// ---------------------------------------------------------------------------------------------
// Linear / GEMM
// ---------------------------------------------------------------------------------------------

// A Linear layer's weight in torch layout [out, in] (row n produces output n), stored F32 or BF16
// (usually a zero-copy view of the checkpoint), plus an optional bias [out] (F32 or BF16).
// Immutable once built; a backend may attach a prepacked copy at construction (`prepack()`).
// Or a quantized weight (kernels/quant.h: Int8 / Q4 blocks): then weight() is an empty Tensor and
// `linear` takes the quantized paths described in quant.h (bias as above).
// The backend GEMM forms a LinearWeight may hold instead of its plain tensor (gemm_only_bf16,
// gemm_only_f32, gemm_strassen_f32 below).
enum class GemmKind : uint8_t { None, Bf16Dnnl, F32Panels, F32Dnnl, F32Strassen, I8, Bf16Strips };

class LinearWeight {
 public:
  LinearWeight() = default;
  explicit LinearWeight(Tensor weight, Tensor bias = Tensor());
  explicit LinearWeight(std::shared_ptr<const QuantMatrix> quant, Tensor bias = Tensor());
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  const Tensor& weight() const { return w_; }
  const Tensor& bias() const { return b_; }
  bool has_bias() const { return !bias_f32_.empty(); }
  const float* bias_f32() const { return bias_f32_.empty() ? nullptr : bias_f32_.data(); }
  // The quantized form (null for an F32 / BF16 weight).
  bool quantized() const { return quant_ != nullptr; }
  const QuantMatrix* quant() const { return quant_.get(); }
  const std::shared_ptr<const QuantMatrix>& quant_ptr() const { return quant_; }
  QuantType quant_type() const { return quant_ ? quant_->type() : QuantType::None; }
  // Bytes one pass over the weight reads (the quantized blocks + scales, the blocked bf16 form, or
  // the dense tensor).
  size_t weight_bytes() const { return quant_ ? quant_->bytes() : gemm_ ? gemm_bytes_ : w_.nbytes(); }
  // Which GEMM form the weight is held in (None: the plain tensor or the quantized form).
  GemmKind gemm_kind() const { return kind_; }
  // The backend's blocked bf16 GEMM form (gemm_only_bf16); then weight() is an empty Tensor.
  bool gemm_packed() const { return kind_ == GemmKind::Bf16Dnnl; }
  // A pre-packed fp32 GEMM form (gemm_only_f32, either kind); then weight() is an empty Tensor.
  bool f32_packed() const { return kind_ == GemmKind::F32Panels || kind_ == GemmKind::F32Dnnl; }
  const void* gemm_form() const { return gemm_.get(); }
  // Backend use (gemm_only_bf16 / gemm_only_f32): a weight held only in a blocked form of `bytes`
  // bytes, of kind `kind` (not None).
  LinearWeight(int64_t out, int64_t in, std::shared_ptr<const void> gemm_form, size_t bytes, Tensor bias,
               GemmKind kind);

 private:
  void set_bias(Tensor bias);
  Tensor w_, b_;
  std::shared_ptr<const QuantMatrix> quant_;
  std::shared_ptr<const void> gemm_;
  size_t gemm_bytes_ = 0;
  GemmKind kind_ = GemmKind::None;
  std::vector<float> bias_f32_;
  int64_t out_ = 0, in_ = 0;
};

// A BF16 weight ([N, K] bf16 bits, rows ldw apart) for the decode GEMV and the GEMM alike, held in
// 32-row strips of bf16 pairs (GemmKind::Bf16Strips; kernels/cpu/strips.h) in huge-page memory; the
// plain tensor is not kept (weight() is empty). `linear` on it writes what `linear` on the plain weight
// writes in a bf16 computation (store BF16) for every M: the row-major bf16 GEMV's bits for M <= 4, the
// GEMM's above. With store F32 its GEMV (M <= 4) runs the GEMM's order (one FMA chain per output over k),
// not the plain fp32 GEMV's. The form's GEMV needs AVX512-BF16 (bf16_strips_offered()); `pool` (may be
// null) packs it. Throws InternalError where the form is not offered.
bool bf16_strips_offered();
LinearWeight bf16_strips(const uint16_t* w, int64_t ldw, int64_t N, int64_t K, const ThreadPool* pool,
                         Tensor bias = Tensor());

// A copy of `w` (F32 or BF16, rounded to bf16) for a bf16 computation that only ever runs it as a
// GEMM: held in the backend's blocked bf16 layout (CPU: oneDNN's matmul weights format, packed once;
// oneDNN brgemm measured 690-790 GFLOP/s on 2 Zen 5 cores at the DiT shapes against 515 for
// gemm_nt's bf16 path and ~550 for oneDNN on the plain layout), and the plain tensor is not kept.
// `linear` on it needs store == BF16 (InternalError otherwise) and takes oneDNN for every M; x must
// be bf16-valued. Results are deterministic; oneDNN's summation order is its own (fp32 accumulation
// of exact bf16 products), and unlike gemm_nt it does not promise thread-count independence (the
// shapes tested in kernels_linear_dnnl.cpp are bitwise equal on 1 and 2 threads). Where oneDNN
// offers no blocked bf16 kernel (no AVX512-BF16 / AMX), and where the CPU lacks AMX and its VDPBF16PS
// is slow (cpu_bf16_dot_slow: gemm_ex's tile then runs the pairs as FMAs; the knob bf16_dot, read
// here, overrides), this returns the plain bf16 weight instead.
LinearWeight gemm_only_bf16(const LinearWeight& w);

// A copy of an F32 weight for an fp32 computation that runs it as a GEMM, packed once so that no call
// re-packs it; the plain tensor is not kept (weight() is empty). `linear` on it takes that GEMM for
// every M (also M <= 4, where a plain weight would take the GEMV). Two forms (CPU backend):
// - GemmKind::F32Dnnl where `onednn` is true (and MM3_ONEDNN is not 0) and oneDNN has an fp32 brgemm
//   kernel for the shape (AVX-512 CPUs) or, on a CPU without AVX-512, its JIT sgemm (gemm:jit):
//   oneDNN's layout and matmul, 10-19% faster than gemm_nt's panels at the DiT's shapes on Zen 5
//   (brgemm), ~20% capped to AVX2 (gemm:jit; gemm_dnnl.cpp). fp32 sums in oneDNN's order: not
//   gemm_nt's bits; deterministic, and bitwise equal on 1 and 2 threads at the shapes
//   kernels_linear_dnnl.cpp tests (ctest also runs them capped to AVX2), which oneDNN does not promise
//   in general.
// - GemmKind::F32Panels otherwise: the layout gemm_nt's tile reads, in huge-page memory, with the
//   GEMM's bits: one FMA chain per output, the same as gemm_nt on the plain weight, independent of the
//   thread count.
// Either layout depends on the ISA this process dispatches to, so the form is built and used in one
// process. Throws InternalError for a weight that is not plain F32.
LinearWeight gemm_only_f32(const LinearWeight& w, const ThreadPool& pool, bool onednn = true);

// An F32 weight for an fp32 computation, held as one level of Strassen's scheme (GemmKind::F32Strassen,
// cpu/gemm_strassen.cpp): seven [N/2, K/2] combinations of W's quadrants, each a gemm_only_f32 form, so
// that `linear` on it runs 7 GEMMs of 1/8 the work (plus passes that add x's and the products' blocks)
// instead of one: 8-10% faster at the DiT's FF shapes on Zen 5 (M = 1380; the whole fp32 DiT forward
// 2-3%, so the DiT takes it only on request, model/dit.h). The price: 7/4 of the weight's
// memory, and the same product in another association (rounding error a small constant factor above a
// plain fp32 GEMM's; still ~1e-6 relative where the reference's TF32 is ~1e-3). Deterministic, with the
// products' thread behaviour (gemm_only_f32). `linear` on it takes every M, with any store. A weight
// with an odd N or K gets gemm_only_f32's form instead. Throws InternalError for a weight that is not
// plain F32.
LinearWeight gemm_strassen_f32(const LinearWeight& w, const ThreadPool& pool, bool onednn = true);

// A W8A8 copy of a plain F32 / BF16 weight for a computation that accepts int8 rounding (the DiT's
// opt-in int8 profile, model/dit.h): GemmKind::I8, each weight row quantized once to 127 symmetric
// levels with its own scale, and at every `linear` call each row of x likewise (dynamic, per token);
// the integer products summed exactly in int32, then y = store(fma(float(sum), sx[m]·sw[n], bias[n]))
// (cpu/gemm_i8.cpp states the scheme exactly; ref::linear_i8 is its scalar twin, bitwise equal). The
// sums run in our own AVX512-VNNI GEMM, whose tiles apply that epilogue (and linear_glu's GLU) while
// the sums are in registers, or, where the CPU has AMX-INT8 or only AVX-VNNI (Intel's client cores), in
// oneDNN's u8 x s8 GEMM followed by a pass over its int32 output, or, where the CPU has no VNNI at all (oneDNN's
// sums there saturate), in our own AVX2 GEMM on 16-bit pairs (VPMADDWD; the weights held as int16)
// followed by that pass. Measured on 2 Zen 5 cores at the DiT's shapes, the integer GEMM runs 2.1x
// oneDNN's bf16 and 4x its fp32. Its error is the quantization's: ~1% relative per product on Gaussian
// data, far above fp32's or bf16's, so it is never a default. `linear` on it takes every M with either
// store; bitwise deterministic, independent of the thread count and the same bits from every GEMM (the
// sums are exact). Returns an empty LinearWeight (out_features() 0) where none of them runs (no AVX2 and
// FMA within MM3_ISA, and no exact oneDNN GEMM: gemm_dnnl.cpp's probe; MM3_ONEDNN=0 removes oneDNN's);
// the caller then keeps a float form. MM3_ISA below avx512 leaves oneDNN's and the AVX2 one;
// MM3_I8_GEMM=onednn takes oneDNN's where ours on VNNI exists, MM3_I8_GEMM=avx2 the AVX2 one wherever
// AVX2 is (for tests and comparisons). Throws BadModel for a weight with a non-finite value.
// I8Options::x_two_level: each row of x is taken on two levels, x ≈ sx·(q1 + q2/128) (q2 the first
// level's rounding error on 127 levels of its own), both through one integer GEMM of 2M rows: x's
// quantization error drops ~128-fold (what remains is the weight's, ~1% per product), for twice the GEMM
// work. For inputs with heavy tails (the DiT's GLU output: max/rms ~12 over 8192 values against ~4 for a
// Gaussian row); the DiT took it for ff_out until the rotation below made one level enough.
// I8Options::rotate (used where K is a power of two, rotation_applies; otherwise ignored): every weight
// row and every row of x goes through rotate_row before it is quantized, so the levels are spent on
// rotated rows, x·Wᵀ = rot(x)·rot(W)ᵀ / K. The rotation spreads a row's few large values over all K:
// heavy tails and outlier channels (a few channels 30-300x the rest) then cost about what a Gaussian
// row does, ~1.0-1.1% per product, where one level without it is off by ~2% (heavy tails) and 5-9%
// (outlier channels); tests/unit/kernels_linear_i8.cpp measures it. Weight rows with heavy tails gain
// likewise; bounded ones (uniform-like, as random test weights are) lose a little (their max/rms rises
// towards a Gaussian's). Activation rows cost K log2 K adds each, in cache (cpu/hadamard.cpp).
// I8Options::glu_pairs (a layout hint, no change to any value): for a weight whose output rows are
// [a | g] of a GLU (linear_glu, ff_glu_add's w_in), its own VNNI panels (cpu/gemm_i8.cpp) pair column j
// with column j + N/2, so the GLU leaves the GEMM's tiles and only the [M, N/2] activations reach
// memory. Taken where N is a multiple of 128 and the CPU runs that GEMM; any use gives the same bits.
struct I8Options {
  bool x_two_level = false;
  bool rotate = false;
  bool glu_pairs = false;
};
LinearWeight gemm_only_i8(const LinearWeight& w, const ThreadPool& pool, I8Options opt = {});
// The integer GEMM a gemm_only_i8 form runs on: "vnni" (ours, AVX512-VNNI), "onednn", "avx2" (ours on
// 16-bit pairs, the weights held as int16: twice the int8 bytes); "" for any other weight.
const char* i8_gemm_name(const LinearWeight& w);
// The one gemm_only_i8 takes on this CPU now (MM3_ISA, MM3_I8_GEMM and MM3_ONEDNN read); "" for none.
// "vnni": its one-level forms keep no int32 sums in memory; "avx2": its weights take twice the int8
// bytes and x is widened (the memory plan counts on both).
const char* i8_gemm_engine();
// What i8_gemm_engine decides from (pick_i8_gemm: the rule alone, so that it can be tested on any CPU).
struct I8GemmCpu {
  bool vnni = false;        // our VNNI GEMM runs here (an AVX-512 build, AVX512-VNNI, MM3_ISA allowing it)
  bool amx_int8 = false;    // AMX-INT8 tiles (MM3_ISA allowing them)
  bool dnnl_exact = false;  // oneDNN offers an int8 GEMM whose sums its probe found exact (not MM3_ONEDNN=0)
  bool avx2_fma = false;    // our AVX2 GEMM on 16-bit pairs runs here
};
// env: MM3_I8_GEMM's value ("vnni", "onednn", "avx2" or empty), honoured where that GEMM runs. Unforced:
// oneDNN's where the CPU has AMX-INT8 (its brgemm runs on the tiles: by Intel's figures 1024 int8
// multiply-adds a cycle and core, against AVX512-VNNI's 128), else ours on VNNI, else oneDNN's (AVX-VNNI),
// else ours on AVX2.
const char* pick_i8_gemm(const I8GemmCpu& cpu, std::string_view env);

// The rotation gemm_only_i8 applies (I8Options::rotate): v[k] *= rotation_sign(k) for k < n, then the
// unnormalized Walsh-Hadamard transform in place (Sylvester order: stages h = 1, 2, 4, .., n/2, each
// (a, b) -> (a + b, a - b) over pairs h apart): an orthogonal map times sqrt(n), so
// rotate_row(x) · rotate_row(w) = n (x · w). n must be a power of two <= 65536 (rotation_applies;
// otherwise InternalError). A row with a NaN or Inf comes out with NaN or Inf. Same bits on every ISA
// (AVX-512, AVX2, scalar): each output is the same sequence of adds and subtracts; ref::rotate_row is
// its scalar twin.
// rotate_row(src, dst, n): the same into dst (src unchanged unless it is dst; no other overlap).
bool rotation_applies(int64_t n);
void rotate_row(float* v, int64_t n);
void rotate_row(const float* src, float* dst, int64_t n);
// The fixed sign pattern: -1 or +1 for index k (a hash of k; the same for every n).
inline float rotation_sign(int64_t k) {
  uint64_t z = static_cast<uint64_t>(k) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return ((z ^ (z >> 31)) >> 63) ? -1.0f : 1.0f;
}

// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]), for m < M. x rows stride ldx >= in, y rows stride
// ldy >= out. Accumulates in fp32; the result is rounded once to `store`. Small M (decode, M <= 2..4)
// dispatches to a GEMV that streams each weight row once for all M rows.
// With a quantized weight (w.quantized()): M <= 4 takes quant.h's decode GEMV (activations quantized
// per 32-block, VPDPBUSD), M > 4 its prefill path (dequantized panels through the GEMM); the same
// thread-count independence holds.
// CPU backend specifics: M <= 4 takes the GEMV, M > 4 a blocked GEMM; the two sum in different
// (fixed) orders, so a row's bits may differ between an M <= 4 and an M > 4 call. Within a path the
// result is bitwise deterministic and independent of the pool's thread count. With BF16 weights and
// store == BF16 (a bf16 computation) x is read as bf16 (it is bf16-valued by the convention above)
// and multiplied with AVX512-BF16 dot products where the CPU has them. y must not overlap x.
void linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
            int64_t ldy, DType store);

// The gated FF's first half in one call: with y = linear(x, w) ([M, 2F], rows [a | g]),
// act[m, j] = silu_mul(gate = y[m, F + j], up = y[m, j]) for j < F, rows of stride ldact: bitwise what
// linear() and then silu_mul(..., store) write. A gemm_only_i8 weight takes each output row through
// the GLU while it is in cache, so the [M, 2F] output never goes to memory (two passes over it fewer);
// any other weight runs linear() into a scratch kept by the calling thread, then silu_mul.
// w.out_features() must be even.
void linear_glu(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* act,
                int64_t ldact, DType store);

// y = add(y, linear(x, w)): a residual connection, y[m, n] = store(y[m, n] + store(sum + bias)), bitwise
// linear() into a scratch and then add(). A gemm_only_i8 weight adds each output row as it scales the
// integer sums (no [M, N] scratch, no separate pass); any other runs exactly that composition, with a
// scratch kept by the calling thread. y must not overlap x.
void linear_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                int64_t ldy, DType store);

// The gated FF block with its residual: y = add(y, linear(linear_glu(x, w_in), w_out)), bitwise that
// composition (w_in [2F, K] with rows [a | g], w_out [D, F]). With both weights gemm_only_i8, each row of
// w_in's output goes through the GLU and onto w_out's integer levels while it is in cache, and w_out's
// rows are added to y as they are scaled: neither the [M, 2F] nor the [M, F] floats go to memory.
void ff_glu_add(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w_in,
                const LinearWeight& w_out, float* y, int64_t ldy, DType store);

// linear() for a bf16 computation whose x is held as bf16 bits (rows of uint16_t, stride ldx), so
// a caller that produces bf16 activations (layer_norm_bf16, silu_mul_bf16) hands them to the GEMM
// without a float copy and a conversion pass: y bitwise what linear(x as floats, ..., BF16) writes.
// round_y false lets a gemm_only_bf16 weight leave y as oneDNN's fp32 sums, not yet rounded to bf16,
// for a consumer that rounds as it reads (silu_mul_bf16): one pass over y fewer. Any other weight
// rounds anyway (rounding is idempotent, so such a consumer sees the same values).
void linear_bf16_in(const ThreadPool& pool, const uint16_t* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                    int64_t ldy, bool round_y = true);

// linear() of several weights that read the same x (same in_features), e.g. a layer's q, k and v
// projections: y_i = x · W_iᵀ (+ bias_i) rounded to `store`, bitwise what linear(x, *w_i) writes.
// Where the decode GEMV serves them all (M <= 4; all quantized, or all plain of one dtype) it is one
// parallel pass over their concatenated output rows: one pool dispatch and, quantized, one
// quantization of x, instead of one per weight. Otherwise linear() on each in turn. Its reference is
// linear() itself (kernels_linear.cpp compares bitwise). The y_i must not overlap x or each other.
struct LinearOut {
  const LinearWeight* w;
  float* y;
  int64_t ldy;
};
void linear_multi(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, std::span<const LinearOut> outs,
                  DType store);

// Plain fp32 GEMM (OpenBLAS): C[M,N] = alpha * op(A) * op(B) + beta * C, row-major. Note: OpenBLAS's
// bits may change with the thread count; `linear` and the convolutions do not use it for that reason.
void gemm_f32(const ThreadPool& pool, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// ---------------------------------------------------------------------------------------------
// Gathers, norms, positional encodings
// ---------------------------------------------------------------------------------------------

// out[i, :] = table[ids[i], :] for a [V, H] F32 or BF16 table (exact: bf16 -> f32 is lossless).
// Throws InvalidInput when an id is outside [0, V).
void embedding(const Tensor& table, const int64_t* ids, int64_t n, float* out, int64_t ldo);

// torch RMSNorm (Qwen3RMSNorm / diffusers RMSNorm): var = mean(x^2) in fp32; xn = x * rsqrt(var+eps)
// in fp32; xn rounded to `store`; y = weight * xn rounded to `store`. weight is [dim] (float values).
void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps, float* y,
              int64_t ldy, DType store);

// torch LayerNorm over the last dim (biased variance), affine: y = (x - mean) / sqrt(var + eps) * w + b.
void layer_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, const float* bias,
                float eps, float* y, int64_t ldy, DType store);

// layer_norm(..., BF16) with its output written as bf16 bits (the same values): the input of a
// linear_bf16_in.
void layer_norm_bf16(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, const float* bias,
                     float eps, uint16_t* y, int64_t ldy);

// RoPE tables as transformers' default rope computes them: inv_freq[i] = 1 / theta^(2i / rot_dim)
// (fp32), freqs = pos * inv_freq (fp32), emb = cat(freqs, freqs), cos/sin in fp32 then rounded to
// `store`. cos/sin are [n_pos, rot_dim].
void rope_tables(const int64_t* positions, int64_t n_pos, int rot_dim, double theta, float* cos, float* sin,
                 DType store);

// In-place rotate_half RoPE on the first rot_dim dims of every head: x is [S, H, head_dim] with token
// stride ld; cos/sin are [S, rot_dim]. For each head: r = x[:rot_dim];
// r' = r * cos + rotate_half(r) * sin, rotate_half([a, b]) = [-b, a]; dims >= rot_dim unchanged.
// With store BF16 each of the two products and the sum round to bf16 (torch's three ops).
void rope_apply(float* x, int64_t S, int H, int head_dim, int64_t ld, const float* cos, const float* sin,
                int rot_dim, DType store);

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

// Scaled dot-product attention with GQA. q: [Sq, Hq, D], token stride ldq. k, v: key j of KV head hk
// at element j * ldkv + hk * ldh (ldh = 0 means D: [Skv, Hkv, D] rows; a head-major cache [Hkv, cap, D]
// passes ldkv = D, ldh = cap * D), element type kv_dtype (F32 floats or BF16 bits). out: [Sq, Hq, D],
// stride ldo.
// Query head h reads KV head h / (Hq / Hkv). causal: query i sits at absolute position q_pos0 + i and
// sees keys [0, q_pos0 + i]; otherwise every key. Scores in fp32; the softmax is the reference's
// (torch's CPU flash kernel): online over 512-key blocks, its vector exps (exp_u20 in fp32, the
// bf16-accurate fexp_u20 with store BF16), and with store BF16 the unnormalised probabilities
// rounded to bf16 before P·V (the sums stay fp32 over unrounded values);
// output rounded to store. kv_span: the number of keys in the reference's call, which fixes where
// its blocks' vector parts end (a prefill split into chunks passes the whole prompt's length);
// 0 means Skv. It changes rounding only, never which keys are seen. With store BF16, q, k and v are
// taken to be bf16-valued (a bf16 computation's tensors): the bidirectional many-row path (the DiT)
// rounds them to bf16 for VDPBF16PS pair dot products where the CPU has AVX512-BF16.
void attention(const ThreadPool& pool, const float* q, int64_t ldq, const void* k, const void* v, int64_t ldkv,
               DType kv_dtype, float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
               bool causal, int64_t q_pos0, DType store, int64_t kv_span = 0, int64_t ldh = 0);

// Whether attention() with store BF16 takes its bf16 pair-dot form here (AVX512-BF16, within MM3_ISA's
// cap); elsewhere that form runs fp32 products on the bf16-rounded values, no faster than store F32.
bool attention_bf16_dots();

// In-place softmax over each row of [rows, cols] (fp32, max-subtracted).
void softmax_rows(float* x, int64_t rows, int64_t cols);

// ---------------------------------------------------------------------------------------------
// Elementwise
// ---------------------------------------------------------------------------------------------

// out = silu(gate) * up; with BF16 store, silu's result rounds before the product (torch's two ops).
// Serves SwiGLU (Qwen3: silu(gate) * up) and the DiT's GLU (a * silu(g): pass gate = g, up = a).
void silu_mul(const float* gate, const float* up, float* out, int64_t n, DType store);
void silu(const float* x, float* out, int64_t n, DType store);
// silu_mul(round_bf16(gate), round_bf16(up), out, n, BF16) with out written as bf16 bits: gate and
// up may be unrounded fp32 (linear_bf16_in's round_y = false), rounded here as they are read.
void silu_mul_bf16(const float* gate, const float* up, uint16_t* out, int64_t n);

// out = a + b (residual), rounded to store.
void add(const float* a, const float* b, float* out, int64_t n, DType store);
// In-place tanh.
void tanh_inplace(float* x, int64_t n, DType store);
// Snake over [C, L]: y = x + 1 / (alpha[c] + 1e-9) * sin(alpha[c] * x)^2, in one pass. sin is a
// vector fp32 sine within 2 ulps (|alpha x| > 8192, inf and NaN take std::sin); y may equal x.
void snake(const float* x, const float* alpha, float* y, int64_t C, int64_t L, DType store);

// ---------------------------------------------------------------------------------------------
// Convolutions and resampling (one batch item; [C, L] channel-major like torch)
// ---------------------------------------------------------------------------------------------

inline int64_t conv1d_out_len(int64_t L, int K, int stride, int pad, int dilation) {
  return (L + 2 * pad - dilation * (K - 1) - 1) / stride + 1;
}
inline int64_t conv_transpose1d_out_len(int64_t L, int K, int stride, int pad, int output_padding) {
  return (L - 1) * stride - 2 * pad + K + output_padding;
}

// Ops fused around a convolution, each optional (null: off). They compute exactly what the separate
// kernels compute, rounding at the same points: the convolution's input is kern::snake(x, snake_alpha)
// (x itself is not modified), and its output is kern::add(residual, conv + bias). residual may be y
// itself (an in-place residual connection); x must not overlap y.
struct ConvFusion {
  const float* snake_alpha = nullptr;  // [Cin]: convolve snake(x) instead of x
  const float* residual = nullptr;     // [Cout, Lout]: y = residual + conv(...)
};

// torch Conv1d (zero padding): x [Cin, L], w [Cout, Cin, K], bias [Cout] or null, y [Cout, Lout].
// Each output is one sequential fp32 FMA chain over (ci, k) in that order, from 0, then + bias and one
// rounding to store; bits do not depend on the thread count. Stride 1 runs the direct kernel of
// conv_packed (packing w on every call: layers called repeatedly should hold a ConvWeight).
void conv1d(const ThreadPool& pool, const float* x, int64_t Cin, int64_t L, const float* w, const float* bias,
            int64_t Cout, int K, int stride, int pad, int dilation, float* y, DType store,
            const ConvFusion& fusion = {});

// torch ConvTranspose1d: x [Cin, L], w [Cin, Cout, K], bias [Cout] or null, y [Cout, Lout].
// Shapes ConvWeight::transpose_packable accepts (the vocoder's) run the direct kernel: each output is one
// FMA chain over (ci, tap) in that order (taps k ≡ (o + pad) mod stride, ascending k), then + bias.
// Others sum each tap over ci first, then the taps in ascending k (GEMM + col2im).
void conv_transpose1d(const ThreadPool& pool, const float* x, int64_t Cin, int64_t L, const float* w,
                      const float* bias, int64_t Cout, int K, int stride, int pad, int output_padding, float* y,
                      DType store, const ConvFusion& fusion = {});

// A Conv1d (stride 1) or ConvTranspose1d weight, packed once (at model load) for the direct kernel.
// The packed form is backend-private (CPU: output-channel blocks × input channel × tap, see
// cpu/conv_direct.cpp). Immutable; copies share the packed data.
class ConvWeight {
 public:
  ConvWeight() = default;
  // Conv1d, stride 1: w [Cout, Cin, K] (torch layout), bias [Cout] or null.
  static ConvWeight conv1d(const float* w, const float* bias, int64_t Cout, int64_t Cin, int K, int pad, int dilation);
  // ConvTranspose1d: w [Cin, Cout, K], bias [Cout] or null. Shapes transpose_packable rejects keep the
  // torch-layout weight and run conv_transpose1d's GEMM path.
  static ConvWeight conv_transpose1d(const float* w, const float* bias, int64_t Cin, int64_t Cout, int K, int stride,
                                     int pad, int output_padding);
  // stride divides both 16 and K (stride 1, 2, 4, 8, 16; the vocoder's K = 2·stride).
  static bool transpose_packable(int K, int stride) { return stride > 0 && 16 % stride == 0 && K % stride == 0; }
  // A copy with every weight and bias value rounded to `store` (the bf16 compute copies).
  ConvWeight rounded(DType store) const;

  bool empty() const { return !packed; }
  bool transposed() const { return transposed_; }
  int64_t in_channels() const { return cin_; }
  int64_t out_channels() const { return cout_; }
  int kernel_size() const { return k_; }
  int stride() const { return stride_; }
  int pad() const { return pad_; }
  int dilation() const { return dilation_; }
  int output_padding() const { return output_padding_; }
  int64_t out_len(int64_t L) const {
    return transposed_ ? conv_transpose1d_out_len(L, k_, stride_, pad_, output_padding_)
                       : conv1d_out_len(L, k_, 1, pad_, dilation_);
  }
  // 2 flops per multiply-add of one call on an input of length L.
  double flops(int64_t L) const {
    return 2.0 * double(cin_) * double(cout_) * k_ * double(transposed_ ? L : out_len(L));
  }
  std::shared_ptr<const void> packed;  // backend-private
  // Backend-private bf16 GEMM form (conv_gemm_bf16); null when the layer has none.
  std::shared_ptr<const void> gemm;
  // Backend-private bf16 channel-pair form of the direct kernel (conv_dpbf16); null when none.
  std::shared_ptr<const void> pairs;
  // Backend-private fp32 Winograd form (conv_winograd's F(6,7), or conv_winograd_t's F(3,2) for a
  // ConvTranspose1d); null when none.
  std::shared_ptr<const void> winograd;

 private:
  bool transposed_ = false;
  int64_t cin_ = 0, cout_ = 0;
  int k_ = 1, stride_ = 1, pad_ = 0, dilation_ = 1, output_padding_ = 0;
};

// y [Cout, w.out_len(L)] = the convolution w describes of x [Cin, L], with `fusion`, rounded to store;
// the same numerics as conv1d / conv_transpose1d on that layer's torch-layout weight (except for a
// conv_gemm_bf16 weight, below).
void conv_packed(const ThreadPool& pool, const ConvWeight& w, const float* x, int64_t L, float* y, DType store,
                 const ConvFusion& fusion = {});

// A copy of a packed weight (values already bf16, e.g. rounded(BF16)) that conv_packed runs, when
// store is BF16, as bf16 GEMMs through oneDNN (AMX / AVX512-BF16), the (Snake'd) input as bf16:
// Conv1d as W[Cout, Cin·K] times im2col column chunks; ConvTranspose1d as W'[Cout·K, Cin] times the
// input columns a chunk of outputs reads, the taps of each output then summed in ascending k (col2im).
// Then y = round(round(sum + bias) [+ residual]) — the direct kernel's rounding points, but oneDNN's
// fp32 summation order over exact bf16 products instead of one FMA chain, so a value may differ from
// the direct kernel's by a bf16 ulp. Store F32 ignores the form (the direct, golden-exact kernel
// runs). Returns w unchanged without a oneDNN bf16 kernel (no AVX512-BF16, MM3_ONEDNN=0), and for a
// ConvTranspose1d the direct kernel does not pack or one with output_padding.
ConvWeight conv_gemm_bf16(const ConvWeight& w);

// A copy of a packed weight (values already bf16) that conv_packed runs, when store is BF16, on the
// direct kernel with bf16 operands: input channels taken in pairs, each AVX512-BF16 vdpbf16ps adding a
// pair's two exact products to the fp32 accumulators (the (Snake'd) input rounded to bf16 as the slab is
// packed). Same tiling, rounding points and epilogue as the fp32 direct kernel, but the chain adds the
// products two at a time (the instruction's order; denormals flush to zero), so a value may differ from
// the direct kernel's by a bf16 ulp. For CPUs without AMX, where oneDNN's bf16 GEMMs (conv_gemm_bf16)
// run at the same dot-product rate plus im2col traffic. Store F32 ignores the form. Returns w unchanged
// without AVX512-BF16, and for a ConvTranspose1d the direct kernel does not pack.
ConvWeight conv_dpbf16(const ConvWeight& w);

// The faster of the two bf16 forms on this CPU, as measured on the vocoder: conv_gemm_bf16 with AMX
// (oneDNN's tiles), conv_dpbf16 with AVX512-BF16 only (on Zen 4 the pairs ran the vocoder's layers
// faster than oneDNN's avx512_core_bf16 GEMMs) unless its VDPBF16PS is slow (the knob bf16_dot, else
// cpu_bf16_dot_slow: then w unchanged, the fp32-operand direct kernel), else w unchanged.
// MM3_CONV_BF16=gemm|pairs|direct picks one (direct: no form, the fp32-operand direct kernel on the bf16 weights).
ConvWeight conv_bf16_form(const ConvWeight& w);

// A copy of a 7-tap, stride-1 Conv1d weight with padding 3·dilation (the vocoder's conv_in and
// residual-unit conv1) that conv_packed runs, when store is F32, as Winograd F(6,7): per six outputs
// y[t + e·d] 12 products over the input channels instead of 42 (cpu/conv_winograd.cpp). Not the direct
// kernel's bits, nor its one-FMA-chain order: the transforms add rounding (rel RMS error against an
// exact sum ~4e-6 on one layer where the direct kernel's is ~1e-6; with F(4,7), until the thirtieth
// session, ~3e-6, and the full-size vocoder 1.7e-5 against the direct kernel's 8e-6). Bits still depend neither on the
// thread count nor on the ISA path. Store BF16 ignores the form. Returns w unchanged for other shapes, and when the
// environment sets MM3_CONV_WINOGRAD=0.
ConvWeight conv_winograd(const ConvWeight& w);
// Its points: the one-tap [Cout, Cin] point weights it holds per layer (memory), and the products per
// tile of 6 outputs.
inline constexpr int kWinogradPoints = 12;
// The share of a layer's multiply-adds its Winograd form runs in its products (12 per 6 outputs
// instead of 42).
inline constexpr double kWinogradProductShare = kWinogradPoints / 42.0;

// One residual unit of the vocoder (MODEL.md §5.1), y = x + conv2(snake(conv1(snake(x, alpha1)), alpha2)),
// as one pass: conv1 a conv_winograd form, conv2 a one-tap Conv1d with as many input and output
// channels as conv1's. Each task's conv1 outputs stay in the thread's buffer (in cache), where conv2
// reads them as soon as a run of 64 positions is complete, instead of conv1 writing [C, L] to memory
// and conv2 reading it back. The same bits as conv_packed(conv1, x -> u, {alpha1}) then
// conv_packed(conv2, u -> y, {alpha2, residual x}) (store F32). y must not overlap x.
void conv_residual_unit(const ThreadPool& pool, const ConvWeight& conv1, const float* alpha1, const ConvWeight& conv2,
                        const float* alpha2, const float* x, int64_t L, float* y);
// Whether conv_residual_unit takes these weights at this length: the forms above, and enough tasks
// for the pool's threads (the first block's short, wide layers are run as two convolutions).
bool conv_residual_unit_fuses(const ThreadPool& pool, const ConvWeight& conv1, const ConvWeight& conv2, int64_t L);

// A copy of a ConvTranspose1d weight with kernel 2·stride, padding below the stride and no output
// padding (the vocoder's upsampling convs) that conv_packed runs, when store is F32, as Winograd F(3,2)
// per output phase: per three input positions 4 products over the input channels instead of 6
// (cpu/conv_winograd_t.cpp). Not the direct kernel's bits (the transforms add a rounding on each
// side); bits depend neither on the thread count nor on the ISA path. Store BF16 ignores the form.
// Returns w unchanged for other shapes, and when the environment sets MM3_CONV_WINOGRAD=0.
ConvWeight conv_winograd_t(const ConvWeight& w);
// The share of a layer's multiply-adds its conv_winograd_t form runs in its products (4 per 6).
inline constexpr double kWinogradTProductShare = 4.0 / 6.0;

// torch F.interpolate(mode="nearest") source index (ATen nearest_idx, legacy float32 scale rule).
int64_t nearest_src_index(int64_t dst, int64_t in_len, int64_t out_len);
// x [C, Lin] -> y [C, Lout] by nearest_src_index.
void interpolate_nearest(const float* x, int64_t C, int64_t Lin, int64_t Lout, float* y);

// out [cols, rows] = transpose of x [rows, cols] (x row stride ldx).
void transpose_2d(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out);

}  // namespace mm3::kern
