// models_acoustic_test.cpp — the acoustic stage's arithmetic and determinism (MODEL.md §3, §4.4, §4.5,
// §5.2): latent lengths, window plan, the §5.2 output-length formula, prefix prompting, the Philox noise
// stream, and (with the golden checkpoint) bitwise determinism of repeated DiT / vocoder forwards and
// golden parity of single forwards. Golden-dependent tests skip loudly when ../shared is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <string_view>

#include "core_test_util.h"
#include "diffusion/noise.h"
#include "diffusion/windows.h"
#include "io/safetensors.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/condition_encoder.h"
#include "model/dit.h"
#include "model/vocoder.h"

namespace mm3 {
namespace {

namespace fs = std::filesystem;

TEST(AcousticWindows, LatentLength) {
  EXPECT_EQ(latent_length(1), 3);
  EXPECT_EQ(latent_length(5), 17);
  EXPECT_EQ(latent_length(100), 344);
  EXPECT_EQ(latent_length(150), 516);
  EXPECT_EQ(latent_length(200), 689);
  EXPECT_EQ(latent_length(0), 1);  // max(1, ...)
  // The reference's double expression equals floor(T·441/128) for every T <= 9000 (MODEL.md §3).
  for (int64_t T = 1; T <= 9000; ++T) ASSERT_EQ(latent_length(T), T * 441 / 128) << T;
}

TEST(AcousticWindows, Starts) {
  EXPECT_EQ(window_starts(1), std::vector<int64_t>({0}));
  EXPECT_EQ(window_starts(200), std::vector<int64_t>({0}));
  EXPECT_EQ(window_starts(201), std::vector<int64_t>({0, 100}));
  EXPECT_EQ(window_starts(450), std::vector<int64_t>({0, 100, 200, 300}));
  EXPECT_EQ(window_starts(300), std::vector<int64_t>({0, 100}));
  EXPECT_EQ(window_starts(301), std::vector<int64_t>({0, 100, 200}));
  EXPECT_THROW(window_starts(0), InvalidInput);
  // The last window always has 101..200 frames.
  for (int64_t T = 201; T <= 3000; ++T) {
    auto s = window_starts(T);
    const int64_t last = T - s.back();
    ASSERT_TRUE(last >= 101 && last <= 200) << T;
  }
}

TEST(AcousticWindows, PlanOverlapCarryCrops) {
  auto p = plan_windows(450);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].overlap, 0);
  EXPECT_EQ(p[0].latents, 689);
  EXPECT_EQ(p[0].carry_begin, 345);
  EXPECT_EQ(p[0].carry_end, 517);
  EXPECT_EQ(p[1].overlap, 172);
  EXPECT_EQ(p[3].start, 300);
  EXPECT_EQ(p[3].end, 450);
  EXPECT_EQ(p[3].latents, 516);
  EXPECT_EQ(p[3].overlap, 172);
  EXPECT_EQ(p[0].crop_left, 0);
  EXPECT_EQ(p[0].crop_right, 258);
  EXPECT_EQ(p[1].crop_left, 86);
  EXPECT_EQ(p[1].crop_right, 258);
  EXPECT_EQ(p[3].crop_left, 86);
  EXPECT_EQ(p[3].crop_right, 0);
  auto one = plan_windows(60);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].latents, 206);
  EXPECT_EQ(one[0].crop_left + one[0].crop_right, 0);
}

// MODEL.md §5.2, unit-tested for the frame counts (WebGPU-measured values for 250, 1743, 7500).
TEST(AcousticWindows, StitchedLengthFormula) {
  EXPECT_EQ(stitched_samples(1), 512 * 3);
  EXPECT_EQ(stitched_samples(199), 512 * (199 * 441 / 128));
  EXPECT_EQ(stitched_samples(200), 512 * 689);
  EXPECT_EQ(stitched_samples(201), 512 * ((689 - 258) + (latent_length(101) - 86)));
  EXPECT_EQ(stitched_samples(250), 440832);
  EXPECT_EQ(stitched_samples(1743), 3078144);
  EXPECT_EQ(stitched_samples(7500), 13247488);
  // Golden lengths: acoustic_T60, acoustic_T450, e2e_p0_s42 (T = 225).
  EXPECT_EQ(stitched_samples(60), 105472);
  EXPECT_EQ(stitched_samples(450), 794112);
  EXPECT_EQ(stitched_samples(225), 396800);
  // The closed form agrees with the sum over the plan's kept spans for every T.
  for (int64_t T : {1, 2, 100, 199, 200, 201, 202, 299, 300, 301, 777, 1743, 7500, 9000}) {
    int64_t s = 0;
    for (const auto& w : plan_windows(T)) s += 512 * w.kept();
    EXPECT_EQ(s, stitched_samples(T)) << T;
  }
}

TEST(AcousticWindows, PrefixPrompt) {
  // x[:, :ov] = (1 − 0.999999·t)·n + t·p over the first ov of each row; the rest untouched.
  const int64_t C = 2, L = 5, ov = 3;
  std::vector<float> x(C * L, 7.0f), n = {1, 2, 3, 4, 5, 6}, p = {10, 20, 30, 40, 50, 60};  // n, p: [C, 3]
  const float t = 0.25f;
  prefix_prompt(x.data(), C, L, n.data(), ov, p.data(), ov, ov, t);
  const float a = 1.0f - static_cast<float>(1.0 - 1e-6) * t;
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t i = 0; i < ov; ++i) EXPECT_EQ(x[c * L + i], a * n[c * ov + i] + t * p[c * ov + i]);
    for (int64_t i = ov; i < L; ++i) EXPECT_EQ(x[c * L + i], 7.0f);
  }
  // t = 0 gives the noise prompt exactly (σ_min path start), t = 1 nearly the previous latents.
  prefix_prompt(x.data(), C, L, n.data(), ov, p.data(), ov, ov, 0.0f);
  EXPECT_EQ(x[0], 1.0f);
}

TEST(AcousticNoise, PhiloxKnownAnswers) {
  // Random123 kat_vectors for philox4x32_10.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(AcousticNoise, DeterministicPrefixStableAndNormal) {
  const int64_t n = 128 * 689;
  std::vector<float> a(n), b(n), c(1001);
  gaussian_noise(1648571301556962109ull, a.data(), n);
  gaussian_noise(1648571301556962109ull, b.data(), n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  gaussian_noise(1648571301556962109ull, c.data(), 1001);  // a prefix of the same stream (odd length)
  EXPECT_EQ(std::memcmp(a.data(), c.data(), 1001 * sizeof(float)), 0);
  gaussian_noise(5080984550091710395ull, b.data(), n);
  EXPECT_NE(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
  double m = 0, v = 0;
  for (float x : a) m += x;
  m /= n;
  for (float x : a) v += (x - m) * (x - m);
  v /= n;
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.02);
  Tensor t = window_noise(7, 16, 33);
  EXPECT_EQ(t.shape(), (Shape{1, 16, 33}));
}

// ---- with the golden checkpoint ----

fs::path golden() { return fs::path(MM3_GOLDEN_DIR); }
bool have_golden() { return fs::exists(golden() / "manifest.json"); }
#define REQUIRE_GOLDEN() \
  if (!have_golden()) GTEST_SKIP() << "golden set not found at " << golden() << " (clone ../shared to run this)"

double rel_rms(const Tensor& a, const Tensor& b) {
  const auto x = a.to_f32_vector(), y = b.to_f32_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (x[i] - y[i]) * double(x[i] - y[i]);
    den += double(y[i]) * y[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

TEST(AcousticGolden, DitForwardTwiceBitwiseEqualAndMatches) {
  REQUIRE_GOLDEN();
  Checkpoint ck((golden() / "checkpoint").string());
  DiT dit(ck.store("transformer"), ck.configs().dit);
  SafetensorsFile f((golden() / "cases/dit_L100_t0.2500.safetensors").string());
  ThreadPool pool(2);
  const Tensor x = f.get("latents"), t = f.get("timestep"), c = f.get("condition");
  // One workspace reused (the bug class of ARCHITECTURE.md habit 11), plus a fresh one.
  const int64_t C = x.dim(1), L = x.dim(2);
  DitWorkspace ws;
  std::vector<float> v1(C * L), u1(C * L), v2(C * L), u2(C * L);
  const float tv = t.to_f32_vector()[0];
  for (int rep = 0; rep < 2; ++rep) {
    float* vo = rep ? v2.data() : v1.data();
    float* uo = rep ? u2.data() : u1.data();
    dit.forward(pool, {DitItem{x.data<float>(), tv, c.data<float>()}, DitItem{x.data<float>(), tv, nullptr}}, L,
                {vo, uo}, DType::F32, ws);
  }
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(u1.data(), u2.data(), u1.size() * 4), 0);
  // A different length in between must not disturb the next forward (workspace regrowth, RoPE cache).
  {
    Tensor xs = x.slice(2, 0, 24).contiguous(), cs = c.slice(1, 0, 24).contiguous();
    std::vector<float> a(C * 24), b(C * 24);
    dit.forward(pool, {DitItem{xs.data<float>(), tv, cs.data<float>()}, DitItem{xs.data<float>(), tv, nullptr}}, 24,
                {a.data(), b.data()}, DType::F32, ws);
  }
  dit.forward(pool, {DitItem{x.data<float>(), tv, c.data<float>()}, DitItem{x.data<float>(), tv, nullptr}}, L,
              {v2.data(), u2.data()}, DType::F32, ws);
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * 4), 0);
  // The Tensor API (fresh workspace, batch 1) agrees bitwise with the batch-2 cond row? Not required —
  // but it must match the golden.
  Tensor v = dit.forward(pool, x, t, c);
  EXPECT_LT(rel_rms(v, f.get("velocity")), 1e-5);
  EXPECT_LT(rel_rms(Tensor::from_f32(u1, {1, C, L}), f.get("velocity_uncond")), 1e-5);
}

// The opt-in int8 GEMMs (DitGemm::Int8, W8A8) against the fp32 goldens: not within the golden rule
// (1e-5; int8 quantization is ~1e-2 per product), but near the error measured when it was built: rel
// RMS 3.0-3.3e-3 on the v1 goldens' four DiT cases (eighteenth session, ff_out's x on two levels; one
// level: 3.9-4.6e-3; the bf16 profile reads 5.9-6.3e-3 there, its every op boundary rounding), under a
// bound of 1.5e-2. RED: the bias lost in the epilogue reads 0.10, the u8 offset's compensation one level
// off (127) 0.025. Also: deterministic.
TEST(AcousticGolden, DitInt8WithinItsErrorOfTheGoldens) {
  REQUIRE_GOLDEN();
  Checkpoint ck((golden() / "checkpoint").string());
  DiT dit(ck.store("transformer"), ck.configs().dit);
  ThreadPool pool(2);
  for (const char* name : {"dit_L24_t0.5000", "dit_L100_t0.2500", "dit_L689_t0.0000", "dit_L689_t0.9667"}) {
    SCOPED_TRACE(name);
    SafetensorsFile f((golden() / "cases" / (std::string(name) + ".safetensors")).string());
    const Tensor x = f.get("latents"), t = f.get("timestep"), c = f.get("condition");
    const Tensor v = dit.forward(pool, x, t, c, DType::F32, DitGemm::Int8);
    if (!dit.int8_active()) {
      // Every CPU with AVX2 and FMA has an exact int8 GEMM (ours on 16-bit pairs, if nothing better);
      // ctest's golden_dit_int8_avx2_vnni and golden_dit_int8_avx2 run this with our kernels capped at
      // AVX2 and oneDNN at AVX2_VNNI / AVX2 (which GEMM is taken there, the kernel tests check:
      // KernelsLinearI8.OfferedOnlyWhereItsSumsAreExact).
      if (std::string_view(kern::detail::isa_name()) != "scalar")
        FAIL() << "this CPU has AVX2 and FMA, yet the int8 profile ran fp32";
      GTEST_SKIP() << "no exact int8 GEMM on this CPU (needs AVX2 and FMA): the profile ran fp32";
    }
    const Tensor v2 = dit.forward(pool, x, t, c, DType::F32, DitGemm::Int8);
    EXPECT_EQ(std::memcmp(v.raw(), v2.raw(), v.nbytes()), 0) << "int8 forward not deterministic";
    const double e = rel_rms(v, f.get("velocity")),
                 e16 = rel_rms(dit.forward(pool, x, t, c, DType::BF16), f.get("velocity"));
    std::printf("[ int8 DiT ] %s: rel RMS vs the fp32 golden %.3g (bf16 profile %.3g)\n", name, e, e16);
    EXPECT_LT(e, 1.5e-2);
    EXPECT_GT(e, 1e-4) << "suspiciously exact for int8: are the int8 weights in use?";
  }
}

TEST(AcousticGolden, VocoderAndConditionMatchAndRepeat) {
  REQUIRE_GOLDEN();
  Checkpoint ck((golden() / "checkpoint").string());
  ThreadPool pool(2);
  Vocoder voc(ck.store("vocoder"), ck.configs().vocoder);
  SafetensorsFile f((golden() / "cases/vocoder_L7.safetensors").string());
  Tensor w1 = voc.decode(pool, f.get("latents"));
  Tensor w2 = voc.decode(pool, f.get("latents"));
  EXPECT_EQ(std::memcmp(w1.raw(), w2.raw(), w1.nbytes()), 0);
  const Tensor ref = f.get("waveform");
  if (!voc.nonfinite_tensors().empty()) {
    // The v1 golden checkpoint's conv_out.weight_g is NaN, so the reference waveform is NaN everywhere;
    // then ours must be non-finite exactly where the reference is (torch propagates NaN the same way).
    std::cout << "[ NOTE     ] vocoder checkpoint has non-finite tensor(s): " << voc.nonfinite_tensors()[0]
              << " — golden waveform not comparable, checking NaN propagation only\n";
    const auto a = w1.to_f32_vector(), b = ref.to_f32_vector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(std::isfinite(a[i]), std::isfinite(b[i])) << i;
  } else {
    EXPECT_LT(rel_rms(w1, ref), 1e-5);
  }
  ConditionEncoder ce(ck.store("condition_encoder"), ck.configs().cond);
  SafetensorsFile g((golden() / "cases/cond_T150.safetensors").string());
  Tensor c = ce.forward(pool, g.get("frame_hiddens"));
  EXPECT_EQ(c.shape(), (Shape{1, 516, ck.configs().cond.out_dim}));
  EXPECT_LT(rel_rms(c, g.get("condition")), 1e-5);
}

// flops(): every conv's multiply-adds as the model defines them; flops_executed(): the 7-tap layers
// (conv_in, every residual unit's conv1) at kWinogradProductShare of theirs when the Winograd form is on.
TEST(AcousticGolden, VocoderFlopsCountTheWinogradLayers) {
  REQUIRE_GOLDEN();
  Checkpoint ck((golden() / "checkpoint").string());
  const VocoderConfig& c = ck.configs().vocoder;
  Vocoder voc(ck.store("vocoder"), c);
  const int64_t L = 7, Din = c.decoder_input_dim, Hd = c.decoder_hidden_dim;
  double k7 = double(Din) * Hd * 7 * L, all = double(c.latent_channels / 2) * Din * L + k7;  // in_proj, conv_in
  double kt = 0;  // the ConvTranspose1d layers that take their Winograd form (conv_winograd_t)
  int64_t len = L, ch = Hd;
  for (int s : c.upsampling_ratios) {
    const double t = double(ch) * (ch / 2) * 2 * s * len;  // ConvTranspose1d: every input times every tap
    const std::vector<float> wt(size_t(2 * 1 * 2 * s), 0.5f);
    if (kern::conv_winograd_t(kern::ConvWeight::conv_transpose1d(wt.data(), nullptr, 2, 1, 2 * s, s, (s + 1) / 2, 0))
            .winograd)
      kt += t;
    all += t;
    ch /= 2;
    len *= s;
    k7 += 3.0 * ch * ch * 7 * len;
    all += 3.0 * ch * ch * 7 * len + 3.0 * ch * ch * len;
  }
  all += double(ch) * 7 * len;  // conv_out
  EXPECT_DOUBLE_EQ(voc.flops(L), 2 * 2 * all);
  const std::vector<float> w(3 * 2 * 7, 0.5f);
  const bool on = bool(kern::conv_winograd(kern::ConvWeight::conv1d(w.data(), nullptr, 3, 2, 7, 3, 1)).winograd);
  std::cout << "[ NOTE     ] Winograd form " << (on ? "on" : "off (MM3_CONV_WINOGRAD=0)") << "\n";
  if (on) {
    EXPECT_GT(kt, 0.0) << "the golden vocoder's upsampling layers should take conv_winograd_t's form";
  }
  EXPECT_NEAR(voc.flops_executed(L),
              2 * 2 * (all - (on ? (1 - kern::kWinogradProductShare) * k7 + (1 - kern::kWinogradTProductShare) * kt : 0.0)),
              1e-9 * voc.flops(L));
}

// A VocoderWorkspace reused across calls of different lengths and precisions gives the bits of a fresh
// one. The golden vocoder's NaN conv_out.weight_g is replaced (in a temporary copy) so that waveforms are
// finite and a stale or undersized buffer would show.
TEST(AcousticGolden, VocoderWorkspaceReuseIsBitExact) {
  REQUIRE_GOLDEN();
  const fs::path src = golden() / "checkpoint" / "vocoder";
  test::TempDir d;
  fs::copy_file(src / "config.json", d.path() / "config.json");
  {
    const TensorStore f = TensorStore::open_dir(src.string());
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const std::string& n : f.names()) {
      Tensor t = f.get(n).clone();
      if (n == "conv_out.weight_g") {
        std::vector<float> ones(static_cast<size_t>(t.numel()), 1.0f);
        t = Tensor::from_f32(ones, t.shape()).to(t.dtype());
      }
      ts.emplace_back(n, std::move(t));
    }
    write_safetensors(d.file("diffusion_pytorch_model.safetensors"), ts);
  }
  Checkpoint ck((golden() / "checkpoint").string());
  Vocoder voc(TensorStore::open_dir(d.path().string()), ck.configs().vocoder);
  ASSERT_TRUE(voc.nonfinite_tensors().empty());
  ThreadPool pool(2);
  const int64_t C = ck.configs().vocoder.latent_channels, hop = voc.hop();
  auto latents = [&](int64_t L) {
    std::vector<float> v(static_cast<size_t>(C * L));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * float(i)) * 1.5f;
    return v;
  };
  auto run = [&](int64_t L, DType dt, VocoderWorkspace* ws) {
    const std::vector<float> lat = latents(L);
    std::vector<float> w(static_cast<size_t>(2 * hop * L), -3.f);
    voc.decode(pool, lat.data(), L, w.data(), hop * L, dt, nullptr, ws);
    return w;
  };
  VocoderWorkspace ws;
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::vector<float> r7 = run(7, dt, nullptr), r20 = run(600, dt, nullptr);  // 600: past one 2 MiB page
    for (float v : r20) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(run(7, dt, &ws), r7);   // first use (F32) / after a larger call (BF16)
    EXPECT_EQ(run(600, dt, &ws), r20);  // the buffers grow
    // ... to the largest activation: channels x length of the widest stage (hidden 32 at L, then each
    // upsampler halves the channels and multiplies the length: 1024·L at L = 600 for the golden dims).
    EXPECT_GE(ws.capacity(), 1024 * 600);
    EXPECT_EQ(run(7, dt, &ws), r7);   // and serve a shorter call again
  }
}

}  // namespace
}  // namespace mm3
