// vocoder.cpp — Flow-VAE decoder forward (vocoder.h; MODEL.md §5.1). Kernels: conv_packed (Conv1d and
// ConvTranspose1d with the Snake before each and the residual add fused in), tanh_inplace.
//
// Per stream the forward keeps three buffers of the largest stage (channels × length): x (the
// residual stream), t (the upsampler's output, swapped with x) and u (conv1's output). Each residual
// unit is two calls, u = conv1(snake1(x)) and x = x + conv2(snake2(u)); each block's upsampler is
// t = conv_t1(snake1(x)). The fused ops round where the separate kernels round (kernels.h ConvFusion),
// so the bits equal snake → conv → add run one after another.
#include "model/vocoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "core/aligned.h"
#include "kernels/kernels.h"
#include "model/weights.h"

namespace mm3 {

struct Vocoder::Weights {
  struct ResUnit {
    std::vector<float> alpha1, alpha2;  // [ch]
    kern::ConvWeight conv1, conv2;      // WN-Conv1d k7 dilation d pad 3d; k1
  };
  struct Block {
    std::vector<float> alpha;  // [cin]
    kern::ConvWeight up;       // WN-ConvTranspose1d cin -> cout, k 2s, stride s, pad ceil(s/2)
    ResUnit res[3];
  };
  kern::ConvWeight in_proj, conv_in, conv_out;  // k1 (not weight-normed); WN k7 pad 3; WN k7 pad 3
  std::vector<Block> blocks;
  std::vector<float> alpha_out;
};

namespace {

using W = Vocoder::Weights;

std::vector<float> rounded(std::vector<float> v) {
  round_to_store(v.data(), v.size(), DType::BF16);
  return v;
}

// One decode's activation buffer, uninitialised (every stage writes its whole output before anything
// reads it), from alloc_storage: 2 MiB aligned and advised to transparent huge pages. Fresh 4 KiB pages cost this kind
// of VM microseconds each to fault in: three value-initialised 135 MB vectors (L = 689) took 1.4 s of a ~9 s decode.
// Huge pages still cost the kernel's zeroing on first touch (1.1 s of an 8 s bf16 decode on Zen 4), hence
// VocoderWorkspace, which keeps the buffers from one decode to the next.
class Activations {
 public:
  explicit Activations(int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    p_ = static_cast<float*>(alloc_storage(bytes));  // large: on huge pages (core/aligned.h)
    if (!p_) throw OutOfMemory(fmt::format("vocoder: cannot allocate {} MB of activations", bytes >> 20));
  }
  ~Activations() { free_storage(p_); }
  Activations(const Activations&) = delete;
  Activations& operator=(const Activations&) = delete;
  float* data() const { return p_; }
  void swap(Activations& o) { std::swap(p_, o.p_); }

 private:
  float* p_ = nullptr;
};

}  // namespace

struct VocoderWorkspace::Buffers {
  int64_t cap = 0;
  std::unique_ptr<Activations> x, t, u;
  void ensure(int64_t n) {
    if (n <= cap) return;
    x.reset(), t.reset(), u.reset();  // free before allocating the larger ones
    cap = 0;
    x = std::make_unique<Activations>(n);
    t = std::make_unique<Activations>(n);
    u = std::make_unique<Activations>(n);
    cap = n;
  }
};

VocoderWorkspace::VocoderWorkspace() : b_(std::make_unique<Buffers>()) {}
VocoderWorkspace::~VocoderWorkspace() = default;
int64_t VocoderWorkspace::capacity() const { return b_->cap; }

namespace {

// Per-layer wall clock for VocoderProfile: the second stream revisits the first stream's entries in
// the same order and adds to them. Without a profile it only runs the layer.
class LayerClock {
 public:
  explicit LayerClock(VocoderProfile* p) : p_(p) {}
  bool on() const { return p_ != nullptr; }
  void next_stream() { i_ = 0; }
  template <class F>
  void time(const std::string& name, const char* op, double flops, double elements, F&& f) {
    if (!p_) {
      f();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    f();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double cpu = cpu_now() - c0;
    if (i_ == p_->size()) p_->push_back(VocoderLayerTime{name, op, 0, 0, 0, 0});
    VocoderLayerTime& e = (*p_)[i_++];
    e.flops += flops;
    e.elements += elements;
    e.seconds += sec;
    e.cpu_seconds += cpu;
  }

 private:
  static double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }

  VocoderProfile* p_;
  size_t i_ = 0;
};

}  // namespace

Vocoder::Vocoder(const TensorStore& store, const VocoderConfig& cfg) : cfg_(cfg) {
  const int64_t C = cfg.latent_channels, Din = cfg.decoder_input_dim, Hd = cfg.decoder_hidden_dim;
  const int nb = static_cast<int>(cfg.upsampling_ratios.size());
  if (C <= 0 || C % 2 || Din <= 0 || Hd <= 0 || nb == 0 || Hd % (int64_t{1} << nb))
    throw BadModel(fmt::format("vocoder: inconsistent config (latent {}, input {}, hidden {}, {} ratios)", C, Din,
                               Hd, nb));
  hop_ = 1;
  for (int s : cfg.upsampling_ratios) {
    if (s <= 0) throw BadModel("vocoder: upsampling ratios must be positive");
    hop_ *= s;
  }
  WeightBinder b(store, "vocoder");
  auto vec = [&](const std::string& key, const Shape& shape) { return b.get_f32(key, shape).to_f32_vector(); };
  // Weight norm folded at load (get_weight_norm), then packed for the direct kernel.
  auto conv = [&](const std::string& p, int64_t cin, int64_t cout, int k, int dil, bool wn) {
    const std::vector<float> w =
        wn ? b.get_weight_norm(p, {cout, cin, k}).to_f32_vector() : vec(p + ".weight", {cout, cin, k});
    const std::vector<float> bias = vec(p + ".bias", {cout});
    return kern::ConvWeight::conv1d(w.data(), bias.data(), cout, cin, k, (k - 1) * dil / 2, dil);
  };

  f32_ = std::make_unique<Weights>();
  Weights& w = *f32_;
  w.in_proj = conv("dec_in_proj", C / 2, Din, 1, 1, false);
  // The 7-tap layers (but conv_out, one output channel) also get the fp32 Winograd form (kernels.h
  // conv_winograd: 12 products per 6 outputs instead of 42).
  w.conv_in = kern::conv_winograd(conv("conv_in", Din, Hd, 7, 1, true));
  int64_t ch = Hd;
  for (int i = 0; i < nb; ++i) {
    const int s = cfg.upsampling_ratios[static_cast<size_t>(i)];
    const int64_t in = Hd >> i, out = Hd >> (i + 1);
    const std::string p = fmt::format("blocks.{}.", i);
    W::Block bl;
    bl.alpha = vec(p + "snake1.alpha", {1, in, 1});
    {
      const std::vector<float> v = b.get_weight_norm(p + "conv_t1", {in, out, 2 * s}).to_f32_vector();  // per input ch
      const std::vector<float> bias = vec(p + "conv_t1.bias", {out});
      // conv_winograd_t: 4 products per 3 input positions and phase instead of 6.
      bl.up = kern::conv_winograd_t(
          kern::ConvWeight::conv_transpose1d(v.data(), bias.data(), in, out, 2 * s, s, (s + 1) / 2, 0));
    }
    const int dil[3] = {1, 3, 9};
    for (int r = 0; r < 3; ++r) {
      const std::string q = p + fmt::format("res_unit{}.", r + 1);
      bl.res[r].alpha1 = vec(q + "snake1.alpha", {1, out, 1});
      bl.res[r].alpha2 = vec(q + "snake2.alpha", {1, out, 1});
      bl.res[r].conv1 = kern::conv_winograd(conv(q + "conv1", out, out, 7, dil[r], true));
      bl.res[r].conv2 = conv(q + "conv2", out, out, 1, 1, true);
    }
    w.blocks.push_back(std::move(bl));
    ch = out;
  }
  w.alpha_out = vec("snake_out.alpha", {1, ch, 1});
  w.conv_out = conv("conv_out", ch, 1, 7, 1, true);
  b.finish();
  for (const std::string& name : store.names()) {
    const Tensor t = store.get(name);
    for (float v : t.to_f32_vector())
      if (!std::isfinite(v)) {
        nonfinite_.push_back(name);
        break;
      }
  }
}

Vocoder::~Vocoder() = default;

double Vocoder::flops(int64_t L) const {
  const Weights& w = *f32_;
  double f = w.in_proj.flops(L) + w.conv_in.flops(L);
  int64_t len = L;
  for (const auto& bl : w.blocks) {
    f += bl.up.flops(len);  // every input times every tap
    len = bl.up.out_len(len);
    for (const auto& r : bl.res) f += r.conv1.flops(len) + r.conv2.flops(len);
  }
  return 2.0 * (f + w.conv_out.flops(len));  // two stereo streams
}

double Vocoder::flops_executed(int64_t L) const {
  const Weights& w = *f32_;
  auto f = [](const kern::ConvWeight& c, int64_t len) {
    if (!c.winograd) return c.flops(len);
    return c.flops(len) * (c.transposed() ? kern::kWinogradTProductShare : kern::kWinogradProductShare);
  };
  double total = f(w.in_proj, L) + f(w.conv_in, L);
  int64_t len = L;
  for (const auto& bl : w.blocks) {
    total += f(bl.up, len);
    len = bl.up.out_len(len);
    for (const auto& r : bl.res) total += f(r.conv1, len) + f(r.conv2, len);
  }
  return 2.0 * (total + f(w.conv_out, len));
}

const Vocoder::Weights& Vocoder::weights(DType compute) const {
  if (compute == DType::F32) return *f32_;
  if (compute != DType::BF16)
    throw InvalidInput(fmt::format("vocoder: compute dtype must be F32 or BF16, not {}", dtype_name(compute)));
  std::call_once(bf16_once_, [this] {
    auto w = std::make_unique<Weights>(*f32_);
    auto rc = [](kern::ConvWeight& c) { c = c.rounded(DType::BF16); };
    // Every layer but conv_out (one output channel) also gets the CPU's faster bf16 form (kernels.h
    // conv_bf16_form: oneDNN GEMMs on AMX, the direct kernel on bf16 pairs with AVX512-BF16).
    auto rg = [](kern::ConvWeight& c) { c = kern::conv_bf16_form(c.rounded(DType::BF16)); };
    rg(w->in_proj);
    rg(w->conv_in);
    rc(w->conv_out);
    w->alpha_out = rounded(std::move(w->alpha_out));
    for (auto& bl : w->blocks) {
      bl.alpha = rounded(std::move(bl.alpha));
      rg(bl.up);
      for (auto& r : bl.res) {
        r.alpha1 = rounded(std::move(r.alpha1));
        r.alpha2 = rounded(std::move(r.alpha2));
        rg(r.conv1);
        rg(r.conv2);
      }
    }
    bf16_ = std::move(w);
  });
  return *bf16_;
}

void Vocoder::decode(const ThreadPool& pool, const float* latents, int64_t L, float* wave, int64_t ldw,
                     DType compute, VocoderProfile* profile, VocoderWorkspace* ws) const {
  const Weights& w = weights(compute);
  const DType st = compute;
  const int64_t C = cfg_.latent_channels, half = C / 2;
  if (L < 1) throw InvalidInput("vocoder: need at least one latent");
  if (ldw < hop_ * L) throw InternalError("vocoder: output row stride shorter than hop·L");
  // The largest activation: max over stages of channels × length.
  int64_t cap = std::max(cfg_.decoder_input_dim, cfg_.decoder_hidden_dim) * L;
  {
    int64_t len = L;
    for (const auto& bl : w.blocks) {
      len = bl.up.out_len(len);
      cap = std::max(cap, bl.up.out_channels() * len);
    }
  }
  VocoderWorkspace local;
  VocoderWorkspace::Buffers& buf = *(ws ? ws : &local)->b_;
  buf.ensure(cap);
  Activations &x = *buf.x, &t = *buf.t, &u = *buf.u;
  LayerClock clk(profile);

  for (int64_t s = 0; s < 2; ++s) {
    clk.next_stream();
    // Stereo fold: stream s decodes latent channels [s·C/2, (s+1)·C/2)                  [C/2, L]
    clk.time("fold", "fold", 0, double(half * L), [&] {
      for (int64_t c = 0; c < half; ++c)
        for (int64_t l = 0; l < L; ++l) t.data()[c * L + l] = round_store(latents[(s * half + c) * L + l], st);
    });
    clk.time("dec_in_proj", "conv1d", w.in_proj.flops(L), 0,
             [&] { kern::conv_packed(pool, w.in_proj, t.data(), L, u.data(), st); });  // [Din, L]
    clk.time("conv_in", "conv1d", w.conv_in.flops(L), 0,
             [&] { kern::conv_packed(pool, w.conv_in, u.data(), L, x.data(), st); });  // [Hd, L]
    int64_t len = L;
    for (size_t b = 0; b < w.blocks.size(); ++b) {
      const auto& bl = w.blocks[b];
      const std::string p = clk.on() ? fmt::format("blocks.{}.", b) : std::string();
      // t = ConvTranspose1d(Snake(x)): [cin, len] -> [cout, stride·len]; then x <-> t.
      clk.time(p + "snake1+conv_t1", "conv_transpose1d", bl.up.flops(len), 0, [&] {
        kern::conv_packed(pool, bl.up, x.data(), len, t.data(), st, {.snake_alpha = bl.alpha.data()});
      });
      x.swap(t);
      len = bl.up.out_len(len);
      for (int r = 0; r < 3; ++r) {  // x = x + conv2(snake2(conv1(snake1(x))))
        const auto& ru = bl.res[r];
        const std::string q = clk.on() ? fmt::format("{}res_unit{}.", p, r + 1) : std::string();
        if (st == DType::F32 && kern::conv_residual_unit_fuses(pool, ru.conv1, ru.conv2, len)) {
          // The unit in one pass (conv1's outputs stay in cache; same bits), into t, then x <-> t.
          clk.time(q + "snake1+conv1+snake2+conv2+add", "conv1d", ru.conv1.flops(len) + ru.conv2.flops(len), 0, [&] {
            kern::conv_residual_unit(pool, ru.conv1, ru.alpha1.data(), ru.conv2, ru.alpha2.data(), x.data(), len,
                                     t.data());
          });
          x.swap(t);
          continue;
        }
        clk.time(q + "snake1+conv1", "conv1d", ru.conv1.flops(len), 0, [&] {
          kern::conv_packed(pool, ru.conv1, x.data(), len, u.data(), st, {.snake_alpha = ru.alpha1.data()});
        });
        clk.time(q + "snake2+conv2+add", "conv1d", ru.conv2.flops(len), 0, [&] {
          kern::conv_packed(pool, ru.conv2, u.data(), len, x.data(), st,
                            {.snake_alpha = ru.alpha2.data(), .residual = x.data()});
        });
      }
    }
    if (len != hop_ * L) throw InternalError(fmt::format("vocoder: produced {} samples, expected {}", len, hop_ * L));
    float* out = wave + s * ldw;
    clk.time("snake_out+conv_out", "conv1d", w.conv_out.flops(len), 0, [&] {
      kern::conv_packed(pool, w.conv_out, x.data(), len, out, st, {.snake_alpha = w.alpha_out.data()});
    });  // [1, hop·L]
    clk.time("tanh", "tanh", 0, double(len), [&] { kern::tanh_inplace(out, len, st); });
  }
}

Tensor Vocoder::decode(const ThreadPool& pool, const Tensor& latents, DType compute) const {
  Tensor x = latents;
  if (x.ndim() == 3) {
    if (x.dim(0) != 1) throw InvalidInput(fmt::format("vocoder: batch must be 1, got {}", x.describe()));
    x = x.select(0, 0);
  }
  if (x.ndim() != 2 || x.dim(0) != cfg_.latent_channels)
    throw InvalidInput(fmt::format("vocoder: latents must be [{}, L], got {}", cfg_.latent_channels, x.describe()));
  x = x.to(DType::F32).contiguous();
  const int64_t L = x.dim(1);
  Tensor wave = Tensor::empty(DType::F32, {1, 2, hop_ * L});
  decode(pool, x.data<float>(), L, wave.data<float>(), hop_ * L, compute);
  return wave;
}

}  // namespace mm3
