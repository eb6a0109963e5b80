// stage_kernels.cpp — `mm3 bench` stages that time single kernels (kernels/kernels.h) at the shapes the
// full-size model runs them (MODEL.md §1.2 LM decode GEMV, §1.5/§4 DiT GEMMs and attention over a
// 690-token window, §1.6/§5 vocoder block 0 ConvTranspose1d), plus a memory-bandwidth floor.
// Inputs are deterministic random values (model/synth_checkpoint.h generator); no model is needed.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <immintrin.h>

// GCC 12 flags its own intrinsic headers (_mm512_set1_epi16) as reading an uninitialised value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "bench_stages.h"
#include "core/errors.h"
#include "core/tensor.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "model/quant_weights.h"
#include "model/synth_checkpoint.h"

namespace mm3::bench {
namespace {

// A float buffer of n random values N(0, std) (Irwin–Hall, synth generator).
std::shared_ptr<std::vector<float>> random_f32(const ThreadPool& pool, int64_t n, float std, uint64_t key) {
  auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  synth::fill(pool, synth::Init::normal(0.f, std), key, 0, n, DType::F32, v->data());
  return v;
}

Tensor random_tensor(const ThreadPool& pool, DType dt, Shape shape, float std, uint64_t key) {
  Tensor t = Tensor::empty(dt, shape);
  synth::fill(pool, synth::Init::normal(0.f, std), key, 0, t.numel(), dt, t.raw());
  return t;
}

// kern::linear over x [M, K] with a weight [N, K] of `dt`; y [M, N] stored as `store`. With `stream`
// (the decode GEMV), the run cycles through enough weight copies to span >= 512 MiB, so each call reads
// its weight from memory as a real decode step does (16 GB of LM weights never sit in a cache) rather
// than from whatever cache holds one 100 MB matrix; bytes then counts the weight only.
// How linear_stage holds its weight: the plain tensor, or gemm_only_f32's form (oneDNN's where it
// has an fp32 brgemm, else gemm_nt's panels), or gemm_nt's panels forced, or a BF16 weight's strip
// form (kern::bf16_strips, as the model holds its LM and depth weights where the CPU offers it).
enum class WeightForm { Plain, F32Packed, F32Panels, Bf16Strips, I8Rotated };

StageRun linear_stage(const BenchContext& ctx, int64_t M, int64_t N, int64_t K, DType dt, DType store, bool stream,
                      WeightForm form = WeightForm::Plain) {
  const ThreadPool& pool = ctx.pool();
  const double wbytes = double(N) * K * dtype_size(dt);
  const int copies = stream ? std::max(1, static_cast<int>(std::ceil(512.0 * (1 << 20) / wbytes))) : 1;
  auto ws = std::make_shared<std::vector<kern::LinearWeight>>();
  const Tensor w0 = random_tensor(pool, dt, {N, K}, 0.02f, 1);
  if (form == WeightForm::Bf16Strips) {
    if (dt != DType::BF16 || !kern::bf16_strips_offered())
      throw InvalidInput("the strip form needs a BF16 weight and a CPU with AVX512-BF16");
    for (int c = 0; c < copies; ++c)  // each copy its own form (separate memory, the same values)
      ws->push_back(kern::bf16_strips(static_cast<const uint16_t*>(w0.raw()), K, N, K, &pool));
  } else {
    ws->emplace_back(w0);
    if (form == WeightForm::I8Rotated) {
      (*ws)[0] = kern::gemm_only_i8((*ws)[0], pool, {.rotate = true});
      if ((*ws)[0].out_features() == 0) throw InvalidInput("no exact int8 GEMM on this CPU (it needs AVX2 and FMA)");
    } else if (form != WeightForm::Plain) {
      (*ws)[0] = kern::gemm_only_f32((*ws)[0], pool, form == WeightForm::F32Packed);
    }
    for (int c = 1; c < copies; ++c) {  // separate memory with the same values (generating is slower)
      Tensor wc = Tensor::empty(dt, {N, K});
      std::memcpy(wc.raw(), w0.raw(), w0.nbytes());
      ws->emplace_back(wc);
    }
  }
  auto x = random_f32(pool, M * K, 1.f, 2);
  if (store == DType::BF16) round_to_store(x->data(), x->size(), DType::BF16);  // bf16-valued activations
  auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(M * N));
  auto next = std::make_shared<size_t>(0);
  StageRun r;
  r.run = [&pool, ws, x, y, next, M, N, K, store] {
    const kern::LinearWeight& w = (*ws)[(*next)++ % ws->size()];
    kern::linear(pool, x->data(), M, K, w, y->data(), N, store);
  };
  r.bytes = stream ? wbytes : wbytes + 4.0 * M * K + 4.0 * M * N;
  r.flops = 2.0 * M * N * K;
  r.info = {{"M", M},
            {"N", N},
            {"K", K},
            {"weight_dtype", dtype_name(dt)},
            {"store", dtype_name(store)},
            {"bytes_counts", stream ? "weight" : "weight+x+y"},
            {"weight_copies", copies},
            {"weight_form", form == WeightForm::Plain        ? std::string("plain")
                            : form == WeightForm::Bf16Strips ? std::string("bf16_strips")
                            : form == WeightForm::I8Rotated  ? std::string("i8_") + kern::i8_gemm_name((*ws)[0])
                            : (*ws)[0].gemm_kind() == kern::GemmKind::F32Dnnl ? std::string("onednn_packed")
                                                                              : std::string("gemm_nt_panels")}};
  return r;
}

RegisterStage gemv_bf16{{
    .name = "gemv_bf16_4096x12288_m2",
    .description = "kern::linear M=2 over a BF16 [12288, 4096] weight (LM mlp.gate_proj, one decode step of "
                   "the [cond, uncond] batch), cycling 6 copies (600 MB) so it streams from memory; bytes = "
                   "weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 2, 12288, 4096, DType::BF16, DType::BF16, true); },
}};

// The same two shapes on the strip form (kern::bf16_strips: lanes = rows, the row-major GEMV's bits),
// which the model's LM and depth weights take where the CPU has AVX512-BF16: against the stages above
// in one process, the form's rate against the row-major GEMV's.
RegisterStage gemv_bf16_strips{{
    .name = "gemv_bf16_strips_4096x12288_m2",
    .description = "gemv_bf16_4096x12288_m2 on the weight's strip form (kern::bf16_strips: 32-row strips of bf16 "
                   "pairs, as the model holds its LM and depth weights where the CPU has AVX512-BF16; no number "
                   "elsewhere); bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup =
        [](const BenchContext& ctx) {
          return linear_stage(ctx, 2, 12288, 4096, DType::BF16, DType::BF16, true, WeightForm::Bf16Strips);
        },
}};

RegisterStage gemv_bf16_strips_down{{
    .name = "gemv_bf16_strips_12288x4096_m2",
    .description = "gemv_bf16_12288x4096_m2 (the LM down_proj, K = 12288) on the strip form (as "
                   "gemv_bf16_strips_4096x12288_m2); bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup =
        [](const BenchContext& ctx) {
          return linear_stage(ctx, 2, 4096, 12288, DType::BF16, DType::BF16, true, WeightForm::Bf16Strips);
        },
}};

// The other decode GEMV shapes of one LM layer, and the fused forms (q|k|v rows, gate|up rows): how
// the streaming rate depends on the matrix size, i.e. what one call per small matrix costs.
RegisterStage gemv_bf16_kv{{
    .name = "gemv_bf16_4096x1024_m2",
    .description = "kern::linear M=2 over a BF16 [1024, 4096] weight (LM k_proj / v_proj), cycling copies "
                   "(512 MB) so it streams from memory; bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 2, 1024, 4096, DType::BF16, DType::BF16, true); },
}};

RegisterStage gemv_bf16_q{{
    .name = "gemv_bf16_4096x4096_m2",
    .description = "kern::linear M=2 over a BF16 [4096, 4096] weight (LM q_proj / o_proj), cycling copies "
                   "(512 MB) so it streams from memory; bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 2, 4096, 4096, DType::BF16, DType::BF16, true); },
}};

RegisterStage gemv_bf16_down{{
    .name = "gemv_bf16_12288x4096_m2",
    .description = "kern::linear M=2 over a BF16 [4096, 12288] weight (LM mlp.down_proj: long rows, 2 x 24 KiB "
                   "of bf16 activations, the GEMV's rows-side-by-side regime), cycling copies (512 MB) so it "
                   "streams from memory; bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 2, 4096, 12288, DType::BF16, DType::BF16, true); },
}};

RegisterStage gemv_bf16_qkv{{
    .name = "gemv_bf16_4096x6144_m2",
    .description = "kern::linear M=2 over a BF16 [6144, 4096] weight (LM q|k|v fused), cycling copies "
                   "(512 MB) so it streams from memory; bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 2, 6144, 4096, DType::BF16, DType::BF16, true); },
}};

RegisterStage gemv_bf16_gateup{{
    .name = "gemv_bf16_4096x24576_m2",
    .description = "kern::linear M=2 over a BF16 [24576, 4096] weight (LM gate|up fused), cycling copies "
                   "(576 MB) so it streams from memory; bytes = weight bytes streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 2, 24576, 4096, DType::BF16, DType::BF16, true); },
}};

// The quantized decode GEMV (kernels/quant.h) at the gate_proj shape: the weight quantized once in
// setup, copied to span >= 512 MiB like the bf16 stages, so each call streams its blocks from memory.
// in_cache: one copy only (a small N keeps it in L2), so the stage measures the body's compute rate,
// the ceiling the streaming stages are compared with.
StageRun quant_gemv_stage(const BenchContext& ctx, int64_t M, int64_t N, int64_t K, kern::QuantType qt,
                          bool in_cache = false) {
  const ThreadPool& pool = ctx.pool();
  const Tensor w0 = random_tensor(pool, DType::BF16, {N, K}, 0.02f, 1);
  const auto q0 = kern::quantize_weight(pool, w0, qt);
  const double wbytes = double(q0->bytes());
  const int copies = in_cache ? 1 : std::max(1, static_cast<int>(std::ceil(512.0 * (1 << 20) / wbytes)));
  // Each copy holds the strip form beside the row form where the model would hold it (quant_strips_for;
  // MM3_QUANT_STRIPS=3: at every K), so that `--alternate quant_strips=0,1` compares the two bodies in
  // one process (the default runs the strips where they are).
  const bool strips = quant_strips_for(K);
  auto ws = std::make_shared<std::vector<kern::LinearWeight>>();
  ws->emplace_back(strips ? kern::with_strips(pool, *q0) : q0);
  for (int c = 1; c < copies; ++c) {
    Tensor qs = Tensor::empty(q0->qs().dtype(), q0->qs().shape()),
           sc = Tensor::empty(q0->scales().dtype(), q0->scales().shape());
    std::memcpy(qs.raw(), q0->qs().raw(), q0->qs().nbytes());
    std::memcpy(sc.raw(), q0->scales().raw(), q0->scales().nbytes());
    const kern::QuantMatrix qc(qt, N, K, std::move(qs), std::move(sc));
    ws->emplace_back(strips ? kern::with_strips(pool, qc) : std::make_shared<const kern::QuantMatrix>(qc));
  }
  auto x = random_f32(pool, M * K, 1.f, 2);
  round_to_store(x->data(), x->size(), DType::BF16);
  auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(M * N));
  auto next = std::make_shared<size_t>(0);
  StageRun r;
  r.run = [&pool, ws, x, y, next, M, N, K] {
    const kern::LinearWeight& w = (*ws)[(*next)++ % ws->size()];
    kern::linear(pool, x->data(), M, K, w, y->data(), N, DType::BF16);
  };
  r.bytes = wbytes;
  r.flops = 2.0 * M * N * K;
  r.info = {{"M", M},
            {"N", N},
            {"K", K},
            {"quant", kern::quant_name(qt)},
            {"bytes_counts", "quantized weight (codes + scales)"},
            {"strip_form", strips},
            {"weight_copies", copies}};
  return r;
}

RegisterStage gemv_int8{{
    .name = "gemv_int8_4096x12288_m2",
    .description = "gemv_bf16_4096x12288_m2 with the weight in the int8 block format (kernels/quant.h; the "
                   "activations quantized per block inside the op), cycling copies (>= 512 MB); bytes = int8 "
                   "codes + scales streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return quant_gemv_stage(ctx, 2, 12288, 4096, kern::QuantType::Int8); },
}};

RegisterStage gemv_q4{{
    .name = "gemv_q4_4096x12288_m2",
    .description = "gemv_int8_4096x12288_m2 with the 4-bit block format; bytes = packed codes + scales + minima "
                   "streamed",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return quant_gemv_stage(ctx, 2, 12288, 4096, kern::QuantType::Q4); },
}};

RegisterStage gemv_int8_down{{
    .name = "gemv_int8_12288x4096_m2",
    .description = "gemv_int8_4096x12288_m2 at the LM down_proj shape ([4096, 12288]: long rows, 2 x 12 KiB of "
                   "quantized activations)",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return quant_gemv_stage(ctx, 2, 4096, 12288, kern::QuantType::Int8); },
}};

RegisterStage gemv_q4_down{{
    .name = "gemv_q4_12288x4096_m2",
    .description = "gemv_q4_4096x12288_m2 at the LM down_proj shape ([4096, 12288])",
    .needs_model = false,
    .memory_floor = true,
    .setup = [](const BenchContext& ctx) { return quant_gemv_stage(ctx, 2, 4096, 12288, kern::QuantType::Q4); },
}};

RegisterStage gemv_int8_l2{{
    .name = "gemv_int8_192x4096_m2_l2",
    .description = "the int8 decode GEMV over one [192, 4096] weight (836 KB) called again and again, so it stays "
                   "in L2 (1 MB a core on Zen 4/5; use -t 1 for one core): the body's compute rate, plus the "
                   "activation quantizing and pool dispatch of every call; gb_per_s is not a memory figure",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return quant_gemv_stage(ctx, 2, 192, 4096, kern::QuantType::Int8, true); },
}};

RegisterStage gemv_q4_l2{{
    .name = "gemv_q4_192x4096_m2_l2",
    .description = "gemv_int8_192x4096_m2_l2 with the 4-bit format (492 KB)",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return quant_gemv_stage(ctx, 2, 192, 4096, kern::QuantType::Q4, true); },
}};

RegisterStage gemm_bf16{{
    .name = "gemm_bf16_689x2048x8192",
    .description = "kern::linear M=689 N=2048 K=8192, BF16 weight, BF16 store (DiT ff_out size in a bf16 "
                   "profile); bytes = weight + x + y",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 689, 2048, 8192, DType::BF16, DType::BF16, false); },
}};

RegisterStage gemm_f32{{
    .name = "gemm_f32_689x2048x8192",
    .description = "kern::linear M=689 N=2048 K=8192, F32 weight and store, the plain weight (gemm_nt packs it "
                   "on every call; the fp32 DiT holds it packed: gemm_f32_packed_*); bytes = weight + x + y",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return linear_stage(ctx, 689, 2048, 8192, DType::F32, DType::F32, false); },
}};

RegisterStage gemm_f32_packed{{
    .name = "gemm_f32_packed_1380x2048x8192",
    .description = "kern::linear M=1380 N=2048 K=8192 on kern::gemm_only_f32's form, F32 store: ff_out as the fp32 "
                   "DiT's Euler step (batch 2) runs it (oneDNN's fp32 brgemm on its packed layout where the CPU "
                   "has one, else gemm_nt's panels; info weight_form); bytes = weight + x + y",
    .needs_model = false,
    .setup =
        [](const BenchContext& ctx) {
          return linear_stage(ctx, 1380, 2048, 8192, DType::F32, DType::F32, false, WeightForm::F32Packed);
        },
}};

RegisterStage gemm_f32_panels{{
    .name = "gemm_f32_panels_1380x2048x8192",
    .description = "gemm_f32_packed_1380x2048x8192 on gemm_nt's pre-packed panels (gemm_only_f32 with onednn = "
                   "false, as MM3_ONEDNN=0 runs the DiT); bytes = weight + x + y",
    .needs_model = false,
    .setup =
        [](const BenchContext& ctx) {
          return linear_stage(ctx, 1380, 2048, 8192, DType::F32, DType::F32, false, WeightForm::F32Panels);
        },
}};

RegisterStage gemm_i8{{
    .name = "gemm_i8_1380x2048x8192",
    .description = "kern::linear M=1380 N=2048 K=8192 on kern::gemm_only_i8's rotated one-level form, F32 store: "
                   "ff_out as the int8 DiT's Euler step (batch 2) runs it, x's rotation and quantizing included "
                   "(info weight_form: i8_vnni, i8_onednn or i8_avx2, the integer GEMM taken); flops = 2MNK, the "
                   "integer multiply-adds x 2; bytes = the plain weight's + x + y",
    .needs_model = false,
    .setup =
        [](const BenchContext& ctx) {
          return linear_stage(ctx, 1380, 2048, 8192, DType::F32, DType::F32, false, WeightForm::I8Rotated);
        },
}};

RegisterStage sgemm_blas{{
    .name = "sgemm_blas_689x2048x8192",
    .description = "kern::gemm_f32 (OpenBLAS) C[689,2048] = A[689,8192] * B[2048,8192]^T: the library "
                   "reference for gemm_f32_689x2048x8192; bytes = A + B + C",
    .needs_model = false,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          const int64_t M = 689, N = 2048, K = 8192;
          auto a = random_f32(pool, M * K, 1.f, 3);
          auto b = random_f32(pool, N * K, 0.02f, 4);
          auto c = std::make_shared<std::vector<float>>(static_cast<size_t>(M * N));
          StageRun r;
          r.run = [&pool, a, b, c] {
            kern::gemm_f32(pool, false, true, M, N, K, 1.f, a->data(), K, b->data(), K, 0.f, c->data(), N);
          };
          r.bytes = 4.0 * (M * K + N * K + M * N);
          r.flops = 2.0 * M * N * K;
          r.info = {{"M", M}, {"N", N}, {"K", K}};
          return r;
        },
}};

RegisterStage conv_t_block0{{
    .name = "conv_transpose1d_vocoder_block0",
    .description = "kern::conv_packed on a ConvWeight::conv_transpose1d packed in setup (as the vocoder holds it), "
                   "F32, Cin 1536 -> Cout 768, k 16, stride 8, pad 4, L 689 -> 5512 (vocoder block 0 over one "
                   "window); bytes = w + x + y",
    .needs_model = false,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          const int64_t Cin = 1536, Cout = 768, L = 689;
          const int K = 16, stride = 8, pad = 4;
          const int64_t Lout = kern::conv_transpose1d_out_len(L, K, stride, pad, 0);
          auto x = random_f32(pool, Cin * L, 1.f, 5);
          const auto w = random_f32(pool, Cin * Cout * K, 1.f / std::sqrt(2.f * Cin), 6);
          const auto b = random_f32(pool, Cout, 0.01f, 7);
          // Packing is a load-time cost (single-threaded, ~0.2 s here): timing it with each call, as
          // the one-shot kern::conv_transpose1d does, made this stage 2-3x the vocoder layer's time.
          auto cw = std::make_shared<kern::ConvWeight>(
              kern::ConvWeight::conv_transpose1d(w->data(), b->data(), Cin, Cout, K, stride, pad, 0));
          auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(Cout * Lout));
          StageRun r;
          r.run = [&pool, x, cw, y, L] { kern::conv_packed(pool, *cw, x->data(), L, y->data(), DType::F32); };
          r.bytes = 4.0 * (x->size() + w->size() + y->size());
          r.flops = 2.0 * Cin * Cout * K * L;
          r.info = {{"Cin", Cin}, {"Cout", Cout}, {"K", K}, {"stride", stride}, {"pad", pad}, {"L", L}, {"Lout", Lout}};
          return r;
        },
}};

// The DiT's attention in either compute dtype (bf16: inputs bf16-valued, the oneDNN batched path).
Stage attention_dit_spec(DType store) {
  const bool bf = store == DType::BF16;
  return {
      .name = bf ? "attention_dit_L690_bf16" : "attention_dit_L690",
      .description = std::string("kern::attention ") + (bf ? "BF16 (bf16-valued q, k, v; bf16 store)" : "F32") +
                     ", 32 heads x 64, 690 tokens (the DiT window: 689 latents + the time token), "
                     "bidirectional; bytes = q + k + v + out",
      .needs_model = false,
      .setup =
          [store](const BenchContext& ctx) {
            const ThreadPool& pool = ctx.pool();
            const int64_t S = 690;
            const int H = 32, D = 64;
            const int64_t ld = int64_t(H) * D;
            auto q = random_f32(pool, S * ld, 1.f, 8);
            auto k = random_f32(pool, S * ld, 1.f, 9);
            auto v = random_f32(pool, S * ld, 1.f, 10);
            for (auto* x : {q.get(), k.get(), v.get()}) round_to_store(x->data(), x->size(), store);
            auto o = std::make_shared<std::vector<float>>(static_cast<size_t>(S * ld));
            StageRun r;
            r.run = [&pool, q, k, v, o, S, H, D, ld, store] {
              kern::attention(pool, q->data(), ld, k->data(), v->data(), ld, DType::F32, o->data(), ld, S, S, H, H, D,
                              1.f / std::sqrt(float(D)), false, 0, store);
            };
            r.bytes = 4.0 * 4 * S * ld;
            r.flops = 4.0 * S * S * H * D;  // q.k and p.v, 2 flops per multiply-add each
            r.info = {{"S", S}, {"heads", H}, {"head_dim", D}, {"causal", false}, {"store", dtype_name(store)}};
            return r;
          },
  };
}
RegisterStage attention_dit{attention_dit_spec(DType::F32)};
RegisterStage attention_dit_bf16{attention_dit_spec(DType::BF16)};

RegisterStage attention_lm_decode{{
    .name = "attention_lm_decode_513",
    .description = "kern::attention of one LM decode step as Qwen3Lm::forward runs it: 36 layers, each one call "
                   "for the 2 CFG rows (1 query each, 32 heads x 128, GQA 8 KV heads, i.e. 64 heads over 16) "
                   "over 513 cached BF16 keys (a 512-token prompt + the new one), causal, BF16; laid out as "
                   "KvCache holds them (head-major: ldkv = 128, ldh = 513 * 128, row 1's heads after row 0's), "
                   "151 MB in all so it streams from memory; bytes = K + V read",
    .needs_model = false,
    .memory_floor = true,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          constexpr int kLayers = 36, kRows = 2, H = 32, Hkv = 8, D = 128;
          constexpr int64_t S = 513, ldq = int64_t(H) * D;
          const int64_t per = int64_t(kRows) * Hkv * S * D;  // bf16 elements of one layer's K (or V), both rows
          // [layers, 2 (k, v), rows, Hkv, S, D] in a Tensor like the real KvCache (huge-page advised).
          const Tensor kv = random_tensor(pool, DType::BF16, {2 * kLayers, per}, 1.f, 11);
          auto q = random_f32(pool, kRows * ldq, 1.f, 12);
          round_to_store(q->data(), q->size(), DType::BF16);
          auto o = std::make_shared<std::vector<float>>(static_cast<size_t>(kRows * ldq));
          StageRun r;
          r.run = [&pool, kv, q, o, per] {
            for (int l = 0; l < kLayers; ++l) {
              const uint16_t* k = static_cast<const uint16_t*>(kv.raw()) + size_t(2 * l) * per;
              kern::attention(pool, q->data(), kRows * ldq, k, k + per, D, DType::BF16, o->data(), kRows * ldq, 1, S,
                              kRows * H, kRows * Hkv, D, 1.f / std::sqrt(float(D)), true, S - 1, DType::BF16, S, S * D);
            }
          };
          r.bytes = double(kv.nbytes());
          r.flops = 4.0 * kLayers * kRows * S * H * D;
          r.info = {{"layers", kLayers}, {"rows", kRows}, {"keys", S}, {"heads", H}, {"kv_heads", Hkv}, {"head_dim", D}};
          return r;
        },
}};

// ---- compute peaks: the denominators of the README's compute limits ----
// Each pool thread runs 12 independent accumulator chains (enough to hide the FMA latency on current
// cores) of one instruction over register operands: no memory traffic, so the rate is the cores' issue
// limit at the clock they hold under this load.
constexpr int64_t kPeakIters = int64_t(1) << 25;

__attribute__((target("avx512f"))) float peak_fma_avx512(int64_t iters) {
  __m512 a[12];
  for (auto& v : a) v = _mm512_setzero_ps();
  const __m512 b = _mm512_set1_ps(1e-9f), c = _mm512_set1_ps(1.0f);
  for (int64_t n = 0; n < iters; ++n)
    for (auto& v : a) v = _mm512_fmadd_ps(b, c, v);
  float s = 0;
  for (auto& v : a) s += _mm512_reduce_add_ps(v);
  return s;
}

__attribute__((target("avx2,fma"))) float peak_fma_avx2(int64_t iters) {
  __m256 a[12];
  for (auto& v : a) v = _mm256_setzero_ps();
  const __m256 b = _mm256_set1_ps(1e-9f), c = _mm256_set1_ps(1.0f);
  for (int64_t n = 0; n < iters; ++n)
    for (auto& v : a) v = _mm256_fmadd_ps(b, c, v);
  alignas(32) float o[8];
  float s = 0;
  for (auto& v : a) {
    _mm256_store_ps(o, v);
    for (float x : o) s += x;
  }
  return s;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) float peak_dpbf16(int64_t iters) {
  __m512 a[12];
  for (auto& v : a) v = _mm512_setzero_ps();
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80), c = (__m512bh)_mm512_set1_epi16(0x3000);
  for (int64_t n = 0; n < iters; ++n)
    for (auto& v : a) v = _mm512_dpbf16_ps(v, b, c);
  float s = 0;
  for (auto& v : a) s += _mm512_reduce_add_ps(v);
  return s;
}

// The int8 limit of `--dit-gemm int8` (oneDNN's u8 x s8 brgemm is built on this instruction): each
// vpdpbusd adds four u8 x s8 products into each of 16 int32 lanes, 128 integer ops.
__attribute__((target("avx512f,avx512vnni"))) float peak_dpbusd(int64_t iters) {
  __m512i a[12];
  for (auto& v : a) v = _mm512_setzero_si512();
  const __m512i b = _mm512_set1_epi8(1), c = _mm512_set1_epi8(-1);
  // In asm: GCC's register allocation of the intrinsic copied every accumulator twice per iteration
  // (24 vmovdqa beside the 12 vpdpbusd: 1.09 instead of ~1.8 TOP/s on 2 Zen 5 cores).
  for (int64_t n = 0; n < iters; ++n)
    for (auto& v : a) asm volatile("vpdpbusd %[c], %[b], %[acc]" : [acc] "+v"(v) : [b] "v"(b), [c] "v"(c));
  int64_t s = 0;
  for (auto& v : a) s += _mm512_reduce_add_epi32(v);
  return static_cast<float>(s);
}

// Without VNNI, the int8 GEMM's instruction pair (gemm_i8.cpp's AVX2 GEMM on 16-bit pairs): vpmaddwd
// multiplies 16 int16 pairs and adds each pair into 8 int32 lanes, vpaddd adds them to the accumulator:
// 16 multiply-adds, 32 integer ops a pair. In asm, as peak_dpbusd, so each pair is exactly those two.
__attribute__((target("avx2"))) float peak_madd_avx2(int64_t iters) {
  __m256i a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
  a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = a10 = a11 = _mm256_setzero_si256();
  const __m256i b = _mm256_set1_epi16(3), c = _mm256_set1_epi16(-2);
  // One asm block for the 12 chains: GCC 12 otherwise stored every accumulator to the stack each
  // iteration (half the rate).
#define MM3_MADD_PAIR(acc, t) "vpmaddwd %[c], %[b], %[" #t "]\n\tvpaddd %[" #t "], %[" #acc "], %[" #acc "]\n\t"
  for (int64_t n = 0; n < iters; ++n) {
    __m256i t0, t1;
    asm volatile(
        MM3_MADD_PAIR(a0, t0) MM3_MADD_PAIR(a1, t1) MM3_MADD_PAIR(a2, t0) MM3_MADD_PAIR(a3, t1) MM3_MADD_PAIR(a4, t0)
            MM3_MADD_PAIR(a5, t1) MM3_MADD_PAIR(a6, t0) MM3_MADD_PAIR(a7, t1) MM3_MADD_PAIR(a8, t0)
                MM3_MADD_PAIR(a9, t1) MM3_MADD_PAIR(a10, t0) MM3_MADD_PAIR(a11, t1)
        : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5), [a6] "+x"(a6),
          [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9), [a10] "+x"(a10), [a11] "+x"(a11), [t0] "=&x"(t0), [t1] "=&x"(t1)
        : [b] "x"(b), [c] "x"(c));
  }
#undef MM3_MADD_PAIR
  alignas(32) int32_t o[8];
  int64_t s = 0;
  for (const __m256i v : {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11}) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(o), v);
    for (int32_t x : o) s += x;
  }
  return static_cast<float>(s);
}

enum class Peak { F32, Bf16, I8 };

StageRun peak_stage(const BenchContext& ctx, Peak kind) {
  const ThreadPool& pool = ctx.pool();
  // The kernels' own probes, so MM3_ISA caps the peaks as it caps the kernels (a capped run divides by
  // the capped peak; cpuid alone had reported the AVX-512 peak under MM3_ISA=avx2).
  const bool avx512 = kern::detail::cpu_has_avx512();
  const bool dp = kern::detail::cpu_has_avx512bf16();
  const bool vnni = avx512 && __builtin_cpu_supports("avx512vnni");
  const bool avx2 = kern::detail::cpu_has_avx2_fma();
  std::string isa = kind == Peak::Bf16 ? (dp ? "avx512bf16 vdpbf16ps" : "none")
                    : kind == Peak::I8 ? (vnni   ? "avx512vnni vpdpbusd"
                                          : avx2 ? "avx2 vpmaddwd+vpaddd"
                                                 : "none")
                    : avx512           ? "avx512 vfmadd"
                    : avx2             ? "avx2 vfmadd"
                                       : "none";
  // ops per instruction: 2 per fp32 lane (fma), 4 per lane (two bf16 products + adds), 8 per int32
  // lane (four u8 x s8 products + adds); per vpmaddwd + vpaddd pair 4 per int32 lane
  const double per_instr = kind == Peak::I8 ? (vnni ? 128.0 : 32.0) : kind == Peak::Bf16 ? 64.0 : avx512 ? 32.0 : 16.0;
  auto sink = std::make_shared<std::atomic<float>>(0.f);
  StageRun r;
  r.info = {{"isa", isa}, {"available", isa != "none"}, {"chains_per_thread", 12}};
  if (isa == "none") {
    r.run = [] {};
    return r;
  }
  r.run = [&pool, kind, avx512, vnni, sink] {
    pool.parallel_for(
        pool.size(),
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            const float v = kind == Peak::I8     ? (vnni ? peak_dpbusd(kPeakIters) : peak_madd_avx2(kPeakIters))
                            : kind == Peak::Bf16 ? peak_dpbf16(kPeakIters)
                            : avx512             ? peak_fma_avx512(kPeakIters)
                                                 : peak_fma_avx2(kPeakIters);
            sink->store(sink->load() + v);
          }
        },
        1);
  };
  r.flops = per_instr * 12.0 * double(kPeakIters) * pool.size();
  return r;
}

RegisterStage peak_f32{{
    .name = "peak_f32_fma",
    .description = "compute peak: every pool thread runs 12 independent fp32 FMA chains on registers (AVX-512, "
                   "else AVX2; MM3_ISA caps it as it caps the kernels); the fp32 limit the README divides FLOPs by",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return peak_stage(ctx, Peak::F32); },
}};

RegisterStage peak_bf16{{
    .name = "peak_bf16_dot",
    .description = "compute peak: every pool thread runs 12 independent vdpbf16ps chains (AVX512-BF16; 4 flops per "
                   "lane); the bf16 limit without AMX. available=false and no number where the CPU lacks it",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return peak_stage(ctx, Peak::Bf16); },
}};

RegisterStage peak_i8{{
    .name = "peak_i8_dot",
    .description = "compute peak: every pool thread runs 12 independent vpdpbusd chains (AVX512-VNNI; 8 integer "
                   "ops per int32 lane, reported as gflop_per_s), else (AVX2) 12 chains of vpmaddwd + vpaddd pairs "
                   "(4 per lane; what the int8 GEMM runs on there, info isa); the limit of --dit-gemm int8. "
                   "available=false and no number where the CPU has neither",
    .needs_model = false,
    .setup = [](const BenchContext& ctx) { return peak_stage(ctx, Peak::I8); },
}};

RegisterStage mem_bw{{
    .name = "mem_bandwidth",
    .description = "streaming read (sum, 64-byte loads) of a 1 GiB buffer on huge pages, one contiguous piece "
                   "per thread: the memory floor any weight-streaming stage is bounded by; bytes = 2^30",
    .needs_model = false,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          // A Tensor like the weights: 64-byte aligned, huge pages advised (a 1 GiB allocation).
          const int64_t n = (int64_t(1) << 30) / 4;
          const Tensor buf = random_tensor(pool, DType::F32, {n}, 1.f, 13);
          // One contiguous piece per thread (min_chunk = n / threads): each thread streams its own half
          // (quarter, ...) without chunk boundaries or a tail in which one thread reads alone.
          const int64_t per = (n / pool.size() + 63) / 64 * 64;
          auto sink = std::make_shared<std::vector<float>>(pool.size() + 1, 0.f);
          StageRun r;
          r.run = [&pool, buf, sink, n, per] {
            std::vector<float> part(static_cast<size_t>((n + per - 1) / per), 0.f);
            const float* p = static_cast<const float*>(buf.raw());
            pool.parallel_for((n + per - 1) / per,
                              [&](int64_t b, int64_t e) {
                                for (int64_t c = b; c < e; ++c)
                                  part[c] = stream_sum(p + c * per, std::min(per, n - c * per));
                              },
                              1);
            float tot = 0;
            for (float x : part) tot += x;
            (*sink)[0] += tot;  // keeps the reads observable
          };
          r.bytes = double(n) * 4;
          r.info = {{"buffer_bytes", n * 4}};
          return r;
        },
}};

}  // namespace
}  // namespace mm3::bench
