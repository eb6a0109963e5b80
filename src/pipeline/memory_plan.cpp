#include "pipeline/memory_plan.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/errors.h"
#include "kernels/kernels.h"
#include "model/checkpoint.h"
#include "model/dit.h"

namespace mm3 {

namespace fs = std::filesystem;

namespace {

uint64_t component_file_bytes(const Checkpoint& ckpt, const std::string& component) {
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(ckpt.component_dir(component), ec))
    if (e.path().extension() == ".safetensors") total += fs::file_size(e.path(), ec);
  return total;
}

// The fp32 vocoder's Winograd forms, held beside its packed weights (model/vocoder.cpp): the 7-tap convs'
// (conv_in and each residual unit's conv1; kern::conv_winograd) kWinogradPoints point weights per 7 taps, the
// upsampling convs' (kern::conv_winograd_t) 4 per 2 taps. Nothing when MM3_CONV_WINOGRAD=0 turns them off.
uint64_t vocoder_form_bytes(const VocoderConfig& v) {
  const std::vector<float> w(2 * 7, 0.f);
  if (!kern::conv_winograd(kern::ConvWeight::conv1d(w.data(), nullptr, 1, 2, 7, 3, 1)).winograd) return 0;
  uint64_t ch = uint64_t(v.decoder_hidden_dim), seven = uint64_t(v.decoder_input_dim) * ch, up = 0;
  for (int r : v.upsampling_ratios) {
    const uint64_t out = std::max<uint64_t>(1, ch / 2);
    up += ch * out * 2 * uint64_t(std::max(1, r));  // ConvTranspose1d taps
    seven += 3 * out * out;                         // three residual units' conv1, per tap
    ch = out;
  }
  return 4 * (uint64_t(kern::kWinogradPoints) * seven + 2 * up);
}

constexpr uint64_t kMiB = 1ull << 20, kGiB = 1ull << 30;

// "123", "512M", "8G", "1.5G" -> bytes; 0 on a malformed value.
uint64_t parse_size(const std::string& s) {
  if (s.empty()) return 0;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    return 0;
  }
  std::string suffix = s.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!suffix.empty() && suffix.back() == 'B') suffix.pop_back();
  if (suffix == "I") return 0;
  if (!suffix.empty() && suffix.back() == 'I') suffix.pop_back();  // KiB / MiB / GiB
  double mul = 1;
  if (suffix == "K") mul = 1024.0;
  else if (suffix == "M") mul = double(kMiB);
  else if (suffix == "G") mul = double(kGiB);
  else if (suffix == "T") mul = double(kGiB) * 1024.0;
  else if (!suffix.empty()) return 0;
  return v > 0 ? static_cast<uint64_t>(v * mul) : 0;
}

uint64_t read_first_u64(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return 0;
  try {
    return std::stoull(s);
  } catch (...) {
    return 0;
  }
}

}  // namespace

std::string gib(uint64_t bytes) {
  char buf[32];
  if (bytes >= kGiB)
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(bytes) / double(kGiB));
  else
    std::snprintf(buf, sizeof buf, "%.0f MiB", double(bytes) / double(kMiB));
  return buf;
}

uint64_t memory_limit(std::string* source) {
  if (const char* e = std::getenv("MM3_MEMORY_LIMIT"); e && *e) {
    const uint64_t v = parse_size(e);
    if (!v)
      throw InvalidInput(fmt::format("MM3_MEMORY_LIMIT='{}' is not a size; give bytes or e.g. 16G, 512M", e));
    if (source) *source = "MM3_MEMORY_LIMIT";
    return v;
  }
  uint64_t total = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0;
    while (in >> key >> kb) {
      std::getline(in, unit);
      if (key == "MemTotal:") {
        total = kb * 1024;
        break;
      }
    }
  }
  std::string src = "MemTotal";
  for (const char* p : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t c = read_first_u64(p);
    if (c && (total == 0 || c < total)) total = c, src = "cgroup";
  }
  if (source) *source = src;
  return total;
}

MemoryPlan plan_memory(const Checkpoint& ckpt, int64_t prompt_tokens, int64_t max_frames, DType ar_precision,
                       DType acoustic_precision, DitGemm dit_gemm) {
  MemoryPlan p;
  const ModelConfigs& c = ckpt.configs();
  {
    p.ar_weights = component_file_bytes(ckpt, "language_model") + component_file_bytes(ckpt, "rvq_depth_decoder");
    const uint64_t el = ar_precision == DType::BF16 ? 2 : 4;
    const uint64_t positions = static_cast<uint64_t>(std::max<int64_t>(0, prompt_tokens + max_frames));
    p.ar_cache = 2ull * 2ull * uint64_t(c.lm.num_hidden_layers) * positions * uint64_t(c.lm.num_key_value_heads) *
                     uint64_t(c.lm.head_dim) * el +
                 2ull * 2ull * uint64_t(c.depth.num_layers) * uint64_t(c.depth.num_codebooks) *
                     uint64_t(c.depth.hidden_size) * el;
    // Prefill scratch: 2 rows x a 256-token chunk x (x, norm, q/k/v/o, gate/up) in fp32, plus a base.
    const uint64_t H = uint64_t(c.lm.hidden_size), I = uint64_t(c.lm.intermediate_size),
                   QW = uint64_t(c.lm.num_attention_heads) * uint64_t(c.lm.head_dim);
    p.ar_work = 64 * kMiB + 2ull * 256ull * (4 * H + 2 * I + 3 * QW) * 4ull;
  }
  const uint64_t dit_bytes = component_file_bytes(ckpt, "transformer"), voc_bytes = component_file_bytes(ckpt, "vocoder");
  if (dit_gemm == DitGemm::Int8 && *kern::i8_gemm_engine()) {
    // (With no int8 GEMM on this CPU the profile runs fp32: the branches below.)
    // The block GEMMs' int8 weights (a quarter of their fp32 bytes; their row scales are noise) beside
    // the small fp32 ends (counted at fp32 within the quarter's slack: ~0.1% of the parameters), the
    // fp32 pages they were made from dropped as for the bf16 copies; plus the calling thread's kept
    // scratch for a batch-2 window (M = 2·690 rows; kernels/cpu/gemm_i8.cpp), x as u8 and, where the
    // int32 sums go to memory (oneDNN's GEMM), the sums: q | k | v's [M, D] and [M, 3D] (o's fit in
    // them), and the FF's (kern::ff_glu_add, both held at once) [M, D] and [M, 2F] for ff_in, [M, F]
    // and [M, D] for ff_out. Our VNNI GEMM (kern::i8_gemm_engine() "vnni") keeps no sums: x's bytes, and the
    // GLU's [M, F] floats between ff_in and ff_out. Our AVX2 GEMM (kern::i8_gemm_engine() "avx2") holds
    // the weights as int16 (half the fp32 bytes) and keeps oneDNN's sums plus x widened to int16 (two
    // bytes per byte of x). Each worker's rotated row (F floats) and partial sums (96 KiB) are noise.
    const uint64_t D = uint64_t(c.dit.inner_dim()), F = uint64_t(c.dit.ff_inner_dim);
    const std::string_view engine = kern::i8_gemm_engine();
    uint64_t scratch = engine == "vnni" ? 2ull * 690ull * (D + (D + F * 4) + F)
                                        : 2ull * 690ull * ((D + 3 * D * 4) + (D + 2 * F * 4) + (F + D * 4));
    if (engine == "avx2") scratch += 2ull * 690ull * 2ull * (D + D + F);
    p.acoustic_weights =
        component_file_bytes(ckpt, "condition_encoder") + dit_bytes / (engine == "avx2" ? 2 : 4) + voc_bytes + scratch;
  } else if (acoustic_precision == DType::BF16) {
    // The bf16 profile multiplies bf16 copies of the DiT's weights (half the fp32 files); the fp32 pages
    // they were made from are clean file pages the kernel can drop once copied. The vocoder keeps its
    // fp32 weights (conv_out) beside bf16 copies of the rest: count both.
    p.acoustic_weights = component_file_bytes(ckpt, "condition_encoder") + dit_bytes / 2 + voc_bytes + voc_bytes / 2;
  } else {
    p.acoustic_weights = component_file_bytes(ckpt, "condition_encoder") + dit_bytes + voc_bytes;
    if (DiT::fp32_strassen_requested()) {
      // 3/4 of the FF weights' fp32 bytes (7/4 in all), and the calling thread's scratch for the 7 x halves
      // and 7 products of a batch-2 window (kernels/cpu/gemm_strassen.cpp: ff_in [2F, D] has halves
      // k = D / 2, n = F; ff_out [D, F] k = F / 2, n = D / 2), kept between calls.
      const uint64_t D = uint64_t(c.dit.inner_dim()), F = uint64_t(c.dit.ff_inner_dim);
      const uint64_t ff = 3ull * uint64_t(c.dit.num_layers) * D * F;
      const uint64_t scratch = 7ull * 690ull * (std::max(D / 2, F / 2) + std::max(F, D / 2)) * 4ull;
      p.acoustic_strassen_extra = ff * 3ull + scratch;
      p.acoustic_weights += p.acoustic_strassen_extra;
    }
  }
  p.acoustic_weights += vocoder_form_bytes(c.vocoder);
  // One window (200 frames -> 689 latents): the vocoder's largest stage activation (channels halve as
  // the length multiplies by each ratio) held in ~4 buffers, plus the DiT's batch-2 activations.
  const uint64_t L = 689;
  uint64_t len = L, ch = uint64_t(c.vocoder.decoder_hidden_dim), largest = ch * len;
  for (int r : c.vocoder.upsampling_ratios) {
    len *= uint64_t(std::max(1, r));
    ch = std::max<uint64_t>(1, ch / 2);
    largest = std::max(largest, ch * len);
  }
  const uint64_t dit = 2ull * (L + 1) * (4ull * uint64_t(c.dit.inner_dim()) + 2ull * uint64_t(c.dit.ff_inner_dim)) * 4ull;
  p.acoustic_work = 64 * kMiB + 4ull * largest * 4ull + dit;
  p.limit = memory_limit(&p.limit_source);
  return p;
}

bool check_memory(const MemoryPlan& p) {
  if (p.limit == 0) return false;  // unknown: do not guess
  auto fail = [&](const char* stage, uint64_t need, const std::string& parts) {
    throw OutOfMemory(fmt::format(
        "the {} stage needs about {} ({}) but this machine has {} ({}); use a machine with more memory{}", stage,
        gib(need), parts, gib(p.limit), p.limit_source,
        std::string(stage) == "AR" ? ", or a shorter --duration (the KV cache grows with it)" : ""));
  };
  if (p.ar() > p.limit)
    fail("AR", p.ar(),
         fmt::format("weights {}, KV cache {}, work {}", gib(p.ar_weights), gib(p.ar_cache), gib(p.ar_work)));
  if (p.acoustic() > p.limit)
    fail("acoustic", p.acoustic(), fmt::format("weights {}, work {}", gib(p.acoustic_weights), gib(p.acoustic_work)));
  return p.both() > p.limit;
}

}  // namespace mm3
