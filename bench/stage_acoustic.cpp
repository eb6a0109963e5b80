// stage_acoustic.cpp — `mm3 bench` stages that time the acoustic models over one window (MODEL.md §4.1,
// §5.1) at the window shapes the golden cases use: L = 689 latents (690 DiT tokens with the time token).
//   dit_forward_L689        DiT::forward, batch 1 (one CFG branch, the conditional one), F32 compute;
//   dit_forward_L689_bf16   the same with BF16 compute (bf16 weight copies built in setup, untimed), and its
//                           velocity against the exact F32 forward's (info rel_rms_vs_f32);
//   dit_forward_L689_b2     batch 2, [condition | all-zero condition], as run_acoustic's Euler step runs it;
//   dit_forward_L689_b2_bf16  the same with BF16 compute;
//   dit_forward_L689_int8   batch 1, F32 compute with the block GEMMs W8A8 (DitGemm::Int8; weights prepared in
//                           setup), and its velocity against the exact F32 forward's (info rel_rms_vs_f32);
//   dit_forward_L689_b2_int8  batch 2 with the int8 GEMMs (the Euler step of --dit-gemm int8);
//   vocoder_L689            Vocoder::decode of one 689-latent window (≈ 8 s of stereo 44.1 kHz audio), F32;
//   vocoder_L689_bf16       the same with the BF16 compute option (and its waveform against F32's);
//   vocoder_L689_layers     the same with the per-layer profile (seconds, flops, GFLOP/s of each layer);
//   vocoder_L689_bf16_layers  the profile of the BF16 option.
// Inputs are deterministic random values (model/synth_checkpoint.h generator).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_stages.h"
#include "core/errors.h"
#include "kernels/cpu/simd.h"
#include "model/dit.h"
#include "model/synth_checkpoint.h"
#include "model/vocoder.h"

namespace mm3::bench {
namespace {

constexpr int64_t kL = 689;

std::vector<float> random_vec(const ThreadPool& pool, int64_t n, float std, uint64_t key) {
  std::vector<float> v(static_cast<size_t>(n));
  synth::fill(pool, synth::Init::normal(0.f, std), key, 0, n, DType::F32, v.data());
  return v;
}

struct DitBench {
  std::unique_ptr<DiT> dit;
  std::vector<float> x, cond;         // [C, L], [L, Dc]
  std::vector<std::vector<float>> out;
  std::vector<DitItem> items;
  std::vector<float*> outp;
  DitWorkspace ws;
  DType compute = DType::F32;
  DitGemm gemm = DitGemm::Exact;
  void run(const ThreadPool& pool) { dit->forward(pool, items, kL, outp, compute, ws, gemm); }
};

double rel_rms(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

StageRun dit_stage(const BenchContext& ctx, int batch, DType compute, DitGemm gemm = DitGemm::Exact) {
  const ThreadPool& pool = ctx.pool();
  const Checkpoint& ck = ctx.checkpoint();
  const TensorStore& st = ck.store("transformer");
  const DitConfig& c = ck.configs().dit;
  auto b = std::make_shared<DitBench>();
  b->dit = std::make_unique<DiT>(st, c);
  b->compute = compute;
  b->x = random_vec(pool, int64_t(c.in_channels) * kL, 1.f, 11);
  b->cond = random_vec(pool, kL * int64_t(c.condition_dim), 1.f, 12);
  b->out.assign(size_t(batch), std::vector<float>(size_t(c.in_channels) * kL));
  for (int i = 0; i < batch; ++i) {
    // Item 0: the conditional branch; item 1: the all-zero condition (CFG unconditional), t = 0.5.
    b->items.push_back(DitItem{b->x.data(), 0.5f, i == 0 ? b->cond.data() : nullptr});
    b->outp.push_back(b->out[size_t(i)].data());
  }
  b->gemm = gemm;
  // bf16 / int8, batch 1: the exact fp32 velocity, from a DiT of its own (freed after), to compare with
  std::vector<float> exact;
  if ((gemm == DitGemm::Int8 || compute == DType::BF16) && batch == 1) {
    DiT f32(st, c);
    std::vector<float> v(size_t(c.in_channels) * kL);
    DitWorkspace ws;
    f32.forward(pool, b->items, kL, {v.data()}, DType::F32, ws);
    exact = std::move(v);
  }
  // builds the bf16 copies / the int8 weights once (setup, not timed)
  if (compute == DType::BF16 || gemm == DitGemm::Int8) b->run(pool);
  const double err = exact.empty() ? -1.0 : rel_rms(b->out[0], exact);
  const double S = double(kL + 1);
  const double D = c.inner_dim();
  const double params = static_cast<double>(st.total_params());
  StageRun r;
  r.run = [b, &pool] { b->run(pool); };
  // weights read once per forward (4 bytes F32, 2 bytes for the bf16 copies).
  // (int8: the block GEMMs' 1 byte, their ends' 4: ~1 byte a parameter)
  r.bytes = params * (gemm == DitGemm::Int8 ? 1.0 : compute == DType::BF16 ? 2.0 : 4.0);
  // 2 · params · tokens (every weight is a matmul/conv weight applied to each token, apart from the
  // tiny time-embedding MLP) + attention QK^T and PV: 4 · S² · D per layer (bidirectional).
  r.flops = batch * (2.0 * params * S + 4.0 * S * S * D * c.num_layers);
  r.info = {{"L", kL},
            {"tokens", kL + 1},
            {"batch", batch},
            {"compute", dtype_name(compute)},
            {"dit_gemm", dit_gemm_name(gemm)},
            {"params", params},
            {"bytes_counts", "weights once"},
            {"flops_counts", "2*params*tokens + 4*S^2*D*layers, per batch item"}};
  if (gemm == DitGemm::Int8) {
    // The limit's parts: the integer work (q | k | v, o, ff_in, ff_out, each input on one level) at the
    // int8 rate; attention at the bf16 rate where it takes bf16 pair dots (AVX512-BF16; else it stays
    // in the fp32 part); the rest at the fp32 rate: the fp32 ends, and the Hadamard rotation of each
    // GEMM input row (K log2 K adds: three rows of D, one of F, per token and layer). Widths that are not
    // powers of two are not rotated, and ff_out's input then goes on two levels (model/dit.cpp): its
    // weights count twice.
    const double F = static_cast<double>(c.ff_inner_dim), blocks = (4.0 * D * D + 3.0 * F * D) * c.num_layers;
    const bool rot_d = kern::rotation_applies(c.inner_dim()), rot_f = kern::rotation_applies(c.ff_inner_dim);
    const double i8_ops = batch * 2.0 * S * (blocks + (rot_f ? 0.0 : F * D * c.num_layers));
    const double att = kern::detail::cpu_has_avx512bf16() ? batch * 4.0 * S * S * D * c.num_layers : 0.0;
    const double rot =
        batch * S * ((rot_d ? 3.0 * D * std::log2(D) : 0.0) + (rot_f ? F * std::log2(F) : 0.0)) * c.num_layers;
    r.info["int8_rotated"] = rot_d && rot_f;  // else some GEMM inputs unrotated (ff_out's: on two levels)
    r.info["int8_ops"] = i8_ops;
    r.info["bf16_flops_attention"] = att;
    r.info["f32_flops_rest"] = r.flops - batch * 2.0 * S * blocks - att + rot;
  }
  // The form the fp32 weights took when the warmup forward packed them (MM3_STRASSEN=1: Strassen's).
  r.finish = [b, gemm, err](double, nlohmann::json& info) {
    info["fp32_strassen"] = b->dit->fp32_strassen();
    if (gemm == DitGemm::Int8) info["int8_active"] = b->dit->int8_active();
    if (err >= 0) info["rel_rms_vs_f32"] = err;
  };
  return r;
}

RegisterStage reg_dit_f32{{
    .name = "dit_forward_L689",
    .description = "DiT::forward over one 689-latent window (690 tokens), batch 1 (one CFG branch), F32 "
                   "(MM3_STRASSEN=1: the FF weights in Strassen's form, info fp32_strassen); bytes = F32 weights once; "
                   "flops = 2*params*tokens + attention (the plain product's count)",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return dit_stage(ctx, 1, DType::F32); },
}};

RegisterStage reg_dit_bf16{{
    .name = "dit_forward_L689_bf16",
    .description = "DiT::forward over one 689-latent window, batch 1, BF16 compute (bf16 weight copies built in "
                   "setup; info rel_rms_vs_f32: the velocity against an exact F32 forward run in setup); bytes = BF16 "
                   "weights once; flops = 2*params*tokens + attention",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return dit_stage(ctx, 1, DType::BF16); },
}};

RegisterStage reg_dit_b2_bf16{{
    .name = "dit_forward_L689_b2_bf16",
    .description = "dit_forward_L689_b2 with BF16 compute (the Euler step of --acoustic-precision bf16); bytes = "
                   "BF16 weights once; flops = both items",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return dit_stage(ctx, 2, DType::BF16); },
}};

RegisterStage reg_dit_int8{{
    .name = "dit_forward_L689_int8",
    .description =
        "DiT::forward over one 689-latent window, batch 1, F32 compute with the block GEMMs W8A8 (int8 "
        "weights prepared in setup; info int8_active, and rel_rms_vs_f32: the velocity against an exact "
        "F32 forward run in setup; int8_rotated: every GEMM input Hadamard-rotated (widths powers of two); "
        "int8_ops, bf16_flops_attention and f32_flops_rest: the work its limit divides by "
        "peak_i8_dot, peak_bf16_dot and peak_f32_fma); bytes = ~1 byte a parameter; flops = 2*params*tokens + "
        "attention",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return dit_stage(ctx, 1, DType::F32, DitGemm::Int8); },
}};

RegisterStage reg_dit_b2_int8{{
    .name = "dit_forward_L689_b2_int8",
    .description = "dit_forward_L689_b2 with the block GEMMs W8A8 (the Euler step of --dit-gemm int8); bytes = ~1 "
                   "byte a parameter; flops = both items",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return dit_stage(ctx, 2, DType::F32, DitGemm::Int8); },
}};

RegisterStage reg_dit_b2{{
    .name = "dit_forward_L689_b2",
    .description = "DiT::forward over one 689-latent window, batch 2 [condition | zero condition] as the Euler "
                   "step runs it, F32; bytes = F32 weights once; flops = both items",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return dit_stage(ctx, 2, DType::F32); },
}};

struct VocBench {
  std::unique_ptr<Vocoder> voc;
  std::vector<float> lat, wave;
  int64_t hop = 0;
  double audio_s = 0;
  std::vector<VocoderProfile> profiles;  // one per call (layers stage)
  VocoderWorkspace ws;                   // kept across runs, as the acoustic stage keeps it across windows
};

std::shared_ptr<VocBench> vocoder_bench(const BenchContext& ctx) {
  const ThreadPool& pool = ctx.pool();
  const Checkpoint& ck = ctx.checkpoint();
  auto b = std::make_shared<VocBench>();
  b->voc = std::make_unique<Vocoder>(ck.store("vocoder"), ck.configs().vocoder);
  const int64_t C = ck.configs().vocoder.latent_channels;
  b->hop = b->voc->hop();
  b->lat = random_vec(pool, C * kL, 1.f, 13);
  b->wave.resize(size_t(2 * b->hop * kL));
  b->audio_s = double(b->hop * kL) / ck.configs().vocoder.sampling_rate;
  return b;
}

nlohmann::json vocoder_info(const BenchContext& ctx, const VocBench& b) {
  return {{"L", kL},
          {"samples_per_channel", b.hop * kL},
          {"sample_rate", ctx.checkpoint().configs().vocoder.sampling_rate},
          {"audio_seconds", b.audio_s},
          {"nonfinite_weight_tensors", b.voc->nonfinite_tensors().size()}};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// vocoder_L689 (F32) and vocoder_L689_bf16 (the bf16 compute option: its Conv1d layers on oneDNN's bf16
// GEMMs, kernels.h conv_gemm_bf16); the bf16 one also reports its waveform against the F32 one.
StageRun vocoder_run(const BenchContext& ctx, DType compute) {
  const ThreadPool& pool = ctx.pool();
  auto b = vocoder_bench(ctx);
  StageRun r;
  r.run = [b, &pool, compute] {
    b->voc->decode(pool, b->lat.data(), kL, b->wave.data(), b->hop * kL, compute, nullptr, &b->ws);
  };
  r.flops = b->voc->flops(kL);
  r.info = vocoder_info(ctx, *b);
  r.info["compute"] = dtype_name(compute);
  if (compute != DType::F32) {
    std::vector<float> ref(b->wave.size()), got(b->wave.size());
    b->voc->decode(pool, b->lat.data(), kL, ref.data(), b->hop * kL, DType::F32);
    b->voc->decode(pool, b->lat.data(), kL, got.data(), b->hop * kL, compute);
    double d2 = 0, r2 = 0, mx = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = double(got[i]) - ref[i];
      d2 += d * d, r2 += double(ref[i]) * ref[i], mx = std::max(mx, std::fabs(d));
    }
    r.info["rel_rms_vs_f32"] = r2 > 0 ? std::sqrt(d2 / r2) : 0.0;
    r.info["max_abs_vs_f32"] = mx;
  }
  const double audio_s = b->audio_s;
  r.finish = [audio_s](double median_s, nlohmann::json& info) {
    info["audio_s_per_s"] = median_s > 0 ? audio_s / median_s : 0.0;
  };
  return r;
}

RegisterStage reg_vocoder_bf16{{
    .name = "vocoder_L689_bf16",
    .description = "vocoder_L689 with the BF16 compute option (bf16 weights, every op rounded to bf16, the Conv1d "
                   "layers as oneDNN bf16 GEMMs where the CPU has them); info: rel_rms_vs_f32, max_abs_vs_f32 of "
                   "its waveform against the F32 decode",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return vocoder_run(ctx, DType::BF16); },
}};

RegisterStage reg_vocoder{{
    .name = "vocoder_L689",
    .description = "Vocoder::decode of one 689-latent window (hop 512: 352768 stereo samples, 8.0 s at 44.1 kHz), "
                   "F32; flops = 2 per multiply-add of every conv as the model defines it (both streams), so "
                   "gflop_per_s is a direct-equivalent rate: the 7-tap convs run as Winograd F(6,7) (12 of their 42 "
                   "multiply-adds per 6 outputs), the transposed convs as F(3,2) (4 of 6 per 3 inputs and phase; "
                   "MM3_CONV_WINOGRAD=0 runs both direct); info: flops_executed "
                   "(the multiply-adds actually run, x 2); audio_s_per_s = audio seconds per wall second at the "
                   "median",
    .needs_model = true,
    .setup =
        [](const BenchContext& ctx) {
          const ThreadPool& pool = ctx.pool();
          auto b = vocoder_bench(ctx);
          StageRun r;
          r.run = [b, &pool] {
            b->voc->decode(pool, b->lat.data(), kL, b->wave.data(), b->hop * kL, DType::F32, nullptr, &b->ws);
          };
          r.flops = b->voc->flops(kL);
          r.info = vocoder_info(ctx, *b);
          r.info["flops_executed"] = b->voc->flops_executed(kL);
          const double audio_s = b->audio_s;
          r.finish = [audio_s](double median_s, nlohmann::json& info) {
            info["audio_s_per_s"] = median_s > 0 ? audio_s / median_s : 0.0;
          };
          return r;
        },
}};

// vocoder_L689_layers / _bf16_layers: the decode with Vocoder::decode's per-layer profile.
StageRun vocoder_layers_run(const BenchContext& ctx, DType compute) {
  const ThreadPool& pool = ctx.pool();
  auto b = vocoder_bench(ctx);
  StageRun r;
  r.run = [b, &pool, compute] {
    b->profiles.emplace_back();
    b->voc->decode(pool, b->lat.data(), kL, b->wave.data(), b->hop * kL, compute, &b->profiles.back(), &b->ws);
  };
  r.flops = b->voc->flops(kL);
  r.info = vocoder_info(ctx, *b);
  r.info["compute"] = dtype_name(compute);
  r.finish = [b](double median_s, nlohmann::json& info) {
    info["audio_s_per_s"] = median_s > 0 ? b->audio_s / median_s : 0.0;
    // Drop the warm-up call's profile; per-layer medians over the timed calls.
    std::vector<VocoderProfile> ps(b->profiles.begin() + (b->profiles.size() > 1 ? 1 : 0), b->profiles.end());
    nlohmann::json layers = nlohmann::json::array();
    std::map<std::string, std::array<double, 3>> by_op;  // op -> (seconds, cpu seconds, flops)
    for (size_t i = 0; i < ps.front().size(); ++i) {
      std::vector<double> t, c;
      for (const auto& p : ps) t.push_back(p[i].seconds), c.push_back(p[i].cpu_seconds);
      const VocoderLayerTime& e = ps.front()[i];
      const double sec = median_of(t), cpu = median_of(c);
      nlohmann::json j = {{"name", e.name}, {"op", e.op}, {"seconds", sec}, {"cpu_seconds", cpu}};
      if (e.flops > 0) {
        j["flops"] = e.flops;
        j["gflop_per_s"] = sec > 0 ? e.flops / sec / 1e9 : 0.0;
        j["gflop_per_cpu_s"] = cpu > 0 ? e.flops / cpu / 1e9 : 0.0;
      }
      if (e.elements > 0) j["elements"] = e.elements;
      layers.push_back(j);
      auto& o = by_op[e.op];
      o[0] += sec, o[1] += cpu, o[2] += e.flops;
    }
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& [op, v] : by_op) {
      ops[op] = {{"seconds", v[0]}, {"cpu_seconds", v[1]}};
      if (v[2] > 0) {
        ops[op]["flops"] = v[2];
        ops[op]["gflop_per_s"] = v[0] > 0 ? v[2] / v[0] / 1e9 : 0.0;
        ops[op]["gflop_per_cpu_s"] = v[1] > 0 ? v[2] / v[1] / 1e9 : 0.0;
      }
    }
    info["by_op"] = ops;
    info["layers"] = layers;
  };
  return r;
}

RegisterStage reg_vocoder_layers{{
    .name = "vocoder_L689_layers",
    .description = "vocoder_L689 with per-layer wall times (Vocoder::decode's profile, both streams summed): "
                   "`layers` lists each (fused) conv / transposed conv with its median seconds, cpu_seconds (all "
                   "threads), flops, gflop_per_s and gflop_per_cpu_s; `by_op` sums them per op",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return vocoder_layers_run(ctx, DType::F32); },
}};

RegisterStage reg_vocoder_bf16_layers{{
    .name = "vocoder_L689_bf16_layers",
    .description = "vocoder_L689_layers with the BF16 compute option (as vocoder_L689_bf16)",
    .needs_model = true,
    .setup = [](const BenchContext& ctx) { return vocoder_layers_run(ctx, DType::BF16); },
}};

}  // namespace
}  // namespace mm3::bench
