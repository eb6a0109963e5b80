// models_quant_test.cpp — quantized LM / depth-decoder weights (model/quant_weights.h, issue 8):
// QuantType::None is the unchanged model bit for bit; int8 / q4 models stay close to the bf16 one; a
// sidecar written from a model's linears() loads back (copied out of the mapping) to bitwise the same outputs as
// quantizing at load; defects of a sidecar are BadModel errors naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "models_ar_util.h"
#include "model/quant_weights.h"

namespace mm3 {
namespace {

using artest::TempDir;

struct Stores {
  TempDir dir;
  LmConfig lc = artest::tiny_lm_config();
  DepthConfig dc = artest::tiny_depth_config();
  std::string ld, dd;
  std::unique_ptr<TensorStore> lm, depth;
  Stores() {
    ld = dir.sub("language_model");
    dd = dir.sub("rvq_depth_decoder");
    write_safetensors(ld + "/model.safetensors", artest::lm_tensors(lc, artest::random_maker(11)));
    write_safetensors(dd + "/diffusion_pytorch_model.safetensors", artest::depth_tensors(dc, artest::random_maker(12)));
    lm = std::make_unique<TensorStore>(TensorStore::open_dir(ld));
    depth = std::make_unique<TensorStore>(TensorStore::open_dir(dd));
  }
};

// Prefill of 5 tokens + 2 decode steps for both rows; returns [hiddens..., logits...] concatenated.
std::vector<float> lm_outputs(const Qwen3Lm& lm, const ThreadPool& pool) {
  const int64_t H = lm.hidden(), n = 5;
  std::vector<int64_t> ids = {1, 7, 151669, 20, 151675, 3, 9, 151669, 21, 151676};
  std::vector<float> x(size_t(2 * n * H)), out(size_t(2 * n * H)), h(size_t(2 * H));
  lm.embed(ids.data(), 2 * n, x.data(), H);
  KvCache cache = lm.make_cache(2, n + 2, DType::BF16);
  LmScratch scr = lm.make_scratch(2);
  lm.forward(pool, x.data(), 2, n, cache, scr, out.data(), true, DType::BF16);  // M = 10: prefill path
  std::vector<float> all = out;
  std::vector<float> lg(size_t(2 * kSampleableColumns));
  for (int s = 0; s < 2; ++s) {
    lm.forward(pool, x.data() + s * H, 2, 1, cache, scr, h.data(), false, DType::BF16);  // M = 2: GEMV
    all.insert(all.end(), h.begin(), h.end());
    lm.sampleable_logits(pool, h.data(), 2, H, lg.data(), DType::BF16);
    all.insert(all.end(), lg.begin(), lg.end());
  }
  return all;
}

std::vector<float> depth_outputs(const RvqDepth& d, const Qwen3Lm& lm, const ThreadPool& pool) {
  const int64_t H = d.hidden();
  std::vector<float> h(size_t(2 * H));
  for (int64_t i = 0; i < 2 * H; ++i) h[size_t(i)] = round_bf16(std::sin(0.37f * float(i)));
  DepthState st = d.make_state(2, DType::BF16);
  std::vector<int64_t> codes(8, 0);
  codes[0] = 5;
  std::vector<float> rows(size_t(7 * H)), all;
  auto choose = [&](int j, const float* g, int64_t n) -> int64_t {
    all.insert(all.end(), g, g + n);
    return (j * 37) % n;
  };
  d.decode_frame(pool, lm.embed_table(), h.data(), 1.5f, st, choose, codes.data(), rows.data(), DType::BF16);
  all.insert(all.end(), rows.begin(), rows.end());
  return all;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double se = 0, sr = 0;
  for (size_t i = 0; i < a.size(); ++i) se += double(a[i] - b[i]) * (a[i] - b[i]), sr += double(b[i]) * b[i];
  return std::sqrt(se / std::max(sr, 1e-30));
}

TEST(ModelsQuant, NoneIsTheUnchangedModel) {
  Stores s;
  ThreadPool pool(2);
  const Qwen3Lm a(*s.lm, s.lc), b(*s.lm, s.lc, QuantLoad{});
  EXPECT_EQ(b.quant_type(), QuantType::None);
  const auto oa = lm_outputs(a, pool), ob = lm_outputs(b, pool);
  EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0);
  for (const auto& [key, w] : b.linears()) EXPECT_FALSE(w->quantized()) << key;
}

TEST(ModelsQuant, QuantizedModelsStayClose) {
  Stores s;
  ThreadPool pool(2);
  const Qwen3Lm ref(*s.lm, s.lc);
  const RvqDepth dref(*s.depth, s.dc);
  const auto lo = lm_outputs(ref, pool), dout = depth_outputs(dref, ref, pool);
  for (QuantType t : {QuantType::Int8, QuantType::Q4}) {
    SCOPED_TRACE(kern::quant_name(t));
    const Qwen3Lm q(*s.lm, s.lc, QuantLoad{t, &pool, nullptr});
    const RvqDepth dq(*s.depth, s.dc, QuantLoad{t, &pool, nullptr});
    EXPECT_EQ(q.quant_type(), t);
    for (const auto& [key, w] : q.linears()) {
      EXPECT_TRUE(w->quantized()) << key;
      const bool head = key.rfind("lm_head", 0) == 0;
      EXPECT_EQ(w->quant_type(), head ? QuantType::Int8 : t) << key;
    }
    for (const auto& [key, w] : dq.linears())
      EXPECT_EQ(w->quant_type(), key.rfind("audio_heads", 0) == 0 ? QuantType::Int8 : t) << key;
    const double rl = rel_rms(lm_outputs(q, pool), lo), rd = rel_rms(depth_outputs(dq, q, pool), dout);
    std::printf("[          ] %s: LM outputs rel_rms %.4g, depth outputs rel_rms %.4g vs bf16\n", kern::quant_name(t), rl, rd);
    // Smoke bounds (unrelated outputs give ~1.4): these 16-wide random models, uniform weights and
    // 1 partial block per row, are a worst case; the golden-model figures are in README (mm3 verify --quant).
    EXPECT_LT(rl, t == QuantType::Int8 ? 0.1 : 0.5);
    EXPECT_LT(rd, t == QuantType::Int8 ? 0.1 : 0.5);
  }
}

// Writes the sidecar of `lin` as mm3 quantize does.
template <class M>
std::string write_sidecar(const M& m, const std::string& path, QuantType t, const std::string& drop = "") {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> md = {{"mm3_quant_format", kQuantFormatVersion}, {"mm3_quant_type", kern::quant_name(t)}};
  for (const auto& [key, w] : m.linears())
    if (key != drop) append_quant_tensors(key, *w, tensors, md);
  write_safetensors(path, tensors, md);
  return path;
}

// The sidecar's codes and scales are copied out of the mapping into one allocation (make_linear; RED:
// the zero-copy views of before fail the is_borrowed / same-allocation checks), and the copies give
// bitwise the outputs of quantizing at load; MM3_MMAP_WEIGHTS=1 keeps the views.
TEST(ModelsQuant, SidecarRoundTripIsBitwiseAndResident) {
  Stores s;
  ThreadPool p1(1), p2(2);
  for (QuantType t : {QuantType::Int8, QuantType::Q4}) {
    SCOPED_TRACE(kern::quant_name(t));
    const Qwen3Lm a(*s.lm, s.lc, QuantLoad{t, &p2, nullptr});
    const RvqDepth da(*s.depth, s.dc, QuantLoad{t, &p2, nullptr});
    const std::string dir = s.dir.sub(std::string("q_") + kern::quant_name(t));
    auto lf = std::make_shared<const SafetensorsFile>(write_sidecar(a, dir + "/language_model.safetensors", t));
    auto df = std::make_shared<const SafetensorsFile>(write_sidecar(da, dir + "/rvq_depth_decoder.safetensors", t));
    ::unsetenv("MM3_MMAP_WEIGHTS");
    const Qwen3Lm b(*s.lm, s.lc, QuantLoad{t, nullptr, lf});
    const RvqDepth db(*s.depth, s.dc, QuantLoad{t, nullptr, df});
    for (const auto& [key, w] : b.linears()) {
      const kern::QuantMatrix& q = *w->quant();
      EXPECT_FALSE(q.qs().is_borrowed() || q.scales().is_borrowed()) << key << " still maps the sidecar";
      const auto* qb = static_cast<const unsigned char*>(q.qs().raw());
      EXPECT_EQ(static_cast<const unsigned char*>(q.scales().raw()), qb + (q.qs().nbytes() + 63) / 64 * 64)
          << key << ": codes and scales not in one allocation";
    }
    ::setenv("MM3_MMAP_WEIGHTS", "1", 1);
    const Qwen3Lm mapped(*s.lm, s.lc, QuantLoad{t, nullptr, lf});
    ::unsetenv("MM3_MMAP_WEIGHTS");
    for (const auto& [key, w] : mapped.linears()) EXPECT_TRUE(w->quant()->qs().is_borrowed()) << key << " was copied";
    const auto oa = lm_outputs(a, p2), ob = lm_outputs(b, p1);
    EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0) << "LM: sidecar != quantize-at-load";
    const auto qa = depth_outputs(da, a, p2), qb = depth_outputs(db, b, p1);
    EXPECT_EQ(std::memcmp(qa.data(), qb.data(), qa.size() * 4), 0) << "depth: sidecar != quantize-at-load";
  }
}

// The strip form (kern::with_strips) at load: MM3_QUANT_STRIPS=3 gives every sidecar weight one (the
// tiny model's widths are below where it pays by default, kern::quant_strips_pay, so the default, 2 and
// 0 give none) with the row form left a view of the sidecar; each load's LM (prefill on the row form,
// decode GEMVs on the strips) and depth frame are bitwise the outputs of quantizing at load.
// RED: building the strips from a resident row copy (both forms resident: twice the memory) fails the
// residency check.
TEST(ModelsQuant, SidecarStripFormIsBitwiseTheRowForm) {
  if (!kern::quant_strips_offered()) GTEST_SKIP() << "no AVX512-VNNI on this CPU: no strip form to load";
  Stores s;
  ThreadPool p2(2);
  for (QuantType t : {QuantType::Int8, QuantType::Q4}) {
    SCOPED_TRACE(kern::quant_name(t));
    const Qwen3Lm a(*s.lm, s.lc, QuantLoad{t, &p2, nullptr});
    const RvqDepth da(*s.depth, s.dc, QuantLoad{t, &p2, nullptr});
    for (const auto& [key, w] : a.linears()) EXPECT_EQ(w->quant()->strips(), nullptr) << key << ": quantized at load";
    const std::string dir = s.dir.sub(std::string("qs_") + kern::quant_name(t));
    auto lf = std::make_shared<const SafetensorsFile>(write_sidecar(a, dir + "/language_model.safetensors", t));
    auto df = std::make_shared<const SafetensorsFile>(write_sidecar(da, dir + "/rvq_depth_decoder.safetensors", t));
    const auto oa = lm_outputs(a, p2), qa = depth_outputs(da, a, p2);
    for (const char* mode : {"3", "2", "0", ""}) {
      SCOPED_TRACE(std::string("MM3_QUANT_STRIPS=") + mode);
      if (*mode) ::setenv("MM3_QUANT_STRIPS", mode, 1);
      const Qwen3Lm b(*s.lm, s.lc, QuantLoad{t, &p2, lf});
      const RvqDepth db(*s.depth, s.dc, QuantLoad{t, &p2, df});
      ::unsetenv("MM3_QUANT_STRIPS");
      for (const auto* m : {static_cast<const void*>(&b), static_cast<const void*>(&db)}) {
        const auto linears = m == &b ? b.linears() : db.linears();
        for (const auto& [key, w] : linears) {
          const kern::QuantMatrix& q = *w->quant();
          EXPECT_EQ(q.strips() != nullptr, std::string(mode) == "3") << key;
          EXPECT_EQ(q.qs().is_borrowed(), std::string(mode) == "3") << key << ": the row form's residency";
        }
      }
      const auto ob = lm_outputs(b, p2), qb = depth_outputs(db, b, p2);
      EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0) << "LM: sidecar != quantize-at-load";
      EXPECT_EQ(std::memcmp(qa.data(), qb.data(), qa.size() * 4), 0) << "depth: sidecar != quantize-at-load";
    }
  }
}

TEST(ModelsQuant, SidecarDefectsAreBadModel) {
  Stores s;
  ThreadPool pool(1);
  const Qwen3Lm a(*s.lm, s.lc, QuantLoad{QuantType::Int8, &pool, nullptr});
  const std::string dir = s.dir.sub("bad");
  // A missing key.
  auto missing = std::make_shared<const SafetensorsFile>(
      write_sidecar(a, dir + "/missing.safetensors", QuantType::Int8, "model.layers.1.mlp.up_proj.weight"));
  try {
    Qwen3Lm(*s.lm, s.lc, QuantLoad{QuantType::Int8, nullptr, missing});
    FAIL() << "no error for a missing key";
  } catch (const BadModel& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << e.what();
  }
  // int8 tensors read as q4.
  auto wrong = std::make_shared<const SafetensorsFile>(write_sidecar(a, dir + "/wrong.safetensors", QuantType::Int8));
  EXPECT_THROW(Qwen3Lm(*s.lm, s.lc, QuantLoad{QuantType::Q4, nullptr, wrong}), BadModel);
  // The checkpoint-level lookups: no sidecar -> null; a sidecar of another format version -> BadModel.
  EXPECT_EQ(open_quant_sidecar(s.dir.sub("ck"), "language_model", QuantType::Int8), nullptr);
  EXPECT_EQ(checkpoint_default_quant(s.dir.sub("ck")), QuantType::None);
  const std::string qd = s.dir.sub("ck/mm3-quant/int8");
  write_safetensors(qd + "/language_model.safetensors", {{"x", Tensor::zeros(DType::F32, {1})}},
                    {{"mm3_quant_format", "0"}, {"mm3_quant_type", "int8"}});
  EXPECT_THROW(open_quant_sidecar(s.dir.sub("ck"), "language_model", QuantType::Int8), BadModel);
  std::ofstream(s.dir.sub("ck/mm3-quant") + "/default.json") << "{\"type\": \"q4\"}";
  EXPECT_EQ(checkpoint_default_quant(s.dir.sub("ck")), QuantType::Q4);
  std::ofstream(s.dir.sub("ck/mm3-quant") + "/default.json") << "{\"type\": \"q3\"}";
  EXPECT_THROW(checkpoint_default_quant(s.dir.sub("ck")), BadModel);
}

}  // namespace
}  // namespace mm3

namespace mm3 {
namespace {

// A bf16 weight mapped from its file leaves the mapping (quant_weights.h make_linear). Where the CPU
// offers the strip form (kern::bf16_strips) it is held as that form, any size: the plain tensor is
// gone and `linear` on it computes what the GEMM on the file's weight computes (M = 6, the GEMM's
// path on both sides: the same bits only if every element made it). With MM3_BF16_STRIPS=0, or where
// the form is not offered, a weight of >= 4 MiB is copied out of the mapping (huge-page memory): the
// LinearWeight no longer borrows the file and holds the same bytes; smaller weights stay views.
// MM3_MMAP_WEIGHTS=1 keeps the zero-copy view. RED: a copy that skipped its last partial 8 MiB chunk
// failed the byte comparison (5 MiB + 2 rows: chunking is exercised); a strip packing that skipped the
// last strip failed the GEMM comparison.
TEST(ModelsQuant, LargeMappedWeightsAreResidentCopies) {
  TempDir dir;
  const int64_t N = 1284, K = 2048;  // 5.01 MiB of bf16
  std::vector<float> v(size_t(N * K));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 2654435761u) % 1000) / 997.0f - 0.5f;
  const std::string path = dir.sub("w") + "/w.safetensors";
  write_safetensors(path, {{"big", Tensor::from_f32(v, {N, K}).to(DType::BF16)},
                           {"small", Tensor::from_f32(std::vector<float>(64 * 32, 0.25f), {64, 32}).to(DType::BF16)}});
  SafetensorsFile f(path);
  const Tensor big = f.get("big"), small = f.get("small");
  ASSERT_TRUE(big.is_borrowed());

  ::unsetenv("MM3_MMAP_WEIGHTS");
  if (kern::bf16_strips_offered()) {
    ThreadPool pool(2);
    const kern::LinearWeight st = make_linear(big, "big", QuantType::None, {QuantType::None, &pool, nullptr});
    EXPECT_EQ(st.gemm_kind(), kern::GemmKind::Bf16Strips);
    EXPECT_TRUE(st.weight().raw() == nullptr);
    const int64_t M = 6;
    std::vector<float> x(size_t(M * K)), want(size_t(M * N)), got(size_t(M * N), -7.f);
    for (size_t i = 0; i < x.size(); ++i) x[i] = round_bf16(static_cast<float>(int(i % 13) - 6) / 8.f);
    kern::linear(pool, x.data(), M, K, kern::LinearWeight(big), want.data(), N, DType::BF16);
    kern::linear(pool, x.data(), M, K, st, got.data(), N, DType::BF16);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
    EXPECT_EQ(make_linear(small, "small", QuantType::None, {}).gemm_kind(), kern::GemmKind::Bf16Strips);
  } else {
    GTEST_LOG_(INFO) << "the strip form is not offered here (no AVX512-BF16): only the plain copies are checked";
  }
  ::setenv("MM3_BF16_STRIPS", "0", 1);
  const kern::LinearWeight w = make_linear(big, "big", QuantType::None, {});
  EXPECT_FALSE(w.weight().is_borrowed());
  EXPECT_NE(w.weight().raw(), big.raw());
  EXPECT_EQ(w.weight().shape(), big.shape());
  EXPECT_EQ(w.weight().dtype(), DType::BF16);
  ASSERT_EQ(w.weight().nbytes(), big.nbytes());
  EXPECT_EQ(std::memcmp(w.weight().raw(), big.raw(), big.nbytes()), 0);
  EXPECT_EQ(make_linear(small, "small", QuantType::None, {}).weight().raw(), small.raw());

  ::unsetenv("MM3_BF16_STRIPS");
  ::setenv("MM3_MMAP_WEIGHTS", "1", 1);
  EXPECT_EQ(make_linear(big, "big", QuantType::None, {}).weight().raw(), big.raw());
  ::unsetenv("MM3_MMAP_WEIGHTS");
}

}  // namespace
}  // namespace mm3
