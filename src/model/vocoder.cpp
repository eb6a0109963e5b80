// vocoder.cpp — Flow-VAE decoder forward (vocoder.h; MODEL.md §5.1). Kernels: conv1d, conv_transpose1d,
// snake, add, tanh_inplace.
#include "model/vocoder.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "model/weights.h"

namespace mm3 {

struct Vocoder::Weights {
  struct Conv {  // Conv1d: w [cout, cin, k] (weight norm folded), b [cout]
    std::vector<float> w, b;
    int64_t cin = 0, cout = 0;
    int k = 1, dilation = 1, pad = 0;
  };
  struct ConvT {  // ConvTranspose1d: w [cin, cout, 2·stride] (folded), b [cout]
    std::vector<float> w, b;
    int64_t cin = 0, cout = 0;
    int k = 2, stride = 1, pad = 0;
  };
  struct ResUnit {
    std::vector<float> alpha1, alpha2;  // [ch]
    Conv conv1, conv2;                  // k7 dilation d pad 3d; k1
  };
  struct Block {
    std::vector<float> alpha;  // [cin]
    ConvT up;
    ResUnit res[3];
  };
  Conv in_proj, conv_in, conv_out;
  std::vector<Block> blocks;
  std::vector<float> alpha_out;
};

namespace {

using W = Vocoder::Weights;

std::vector<float> rounded(std::vector<float> v) {
  round_to_store(v.data(), v.size(), DType::BF16);
  return v;
}

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// y [cout, len] = conv(x [cin, len]) ("same" length for every conv of this model).
void run_conv(const ThreadPool& pool, const W::Conv& c, const float* x, int64_t len, float* y, DType st) {
  kern::conv1d(pool, x, c.cin, len, c.w.data(), c.b.data(), c.cout, c.k, 1, c.pad, c.dilation, y, st);
}

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
  auto conv = [&](const std::string& p, int64_t cin, int64_t cout, int k, int dil, bool wn) {
    W::Conv c;
    c.cin = cin;
    c.cout = cout;
    c.k = k;
    c.dilation = dil;
    c.pad = (k - 1) * dil / 2;
    c.w = wn ? b.get_weight_norm(p, {cout, cin, k}).to_f32_vector() : vec(p + ".weight", {cout, cin, k});
    c.b = vec(p + ".bias", {cout});
    return c;
  };

  f32_ = std::make_unique<Weights>();
  Weights& w = *f32_;
  w.in_proj = conv("dec_in_proj", C / 2, Din, 1, 1, false);
  w.conv_in = conv("conv_in", Din, Hd, 7, 1, true);
  int64_t ch = Hd;
  for (int i = 0; i < nb; ++i) {
    const int s = cfg.upsampling_ratios[static_cast<size_t>(i)];
    const int64_t in = Hd >> i, out = Hd >> (i + 1);
    const std::string p = fmt::format("blocks.{}.", i);
    W::Block bl;
    bl.alpha = vec(p + "snake1.alpha", {1, in, 1});
    bl.up.cin = in;
    bl.up.cout = out;
    bl.up.k = 2 * s;
    bl.up.stride = s;
    bl.up.pad = (s + 1) / 2;  // ceil(s / 2)
    bl.up.w = b.get_weight_norm(p + "conv_t1", {in, out, 2 * s}).to_f32_vector();  // norm per input channel
    bl.up.b = vec(p + "conv_t1.bias", {out});
    const int dil[3] = {1, 3, 9};
    for (int r = 0; r < 3; ++r) {
      const std::string q = p + fmt::format("res_unit{}.", r + 1);
      bl.res[r].alpha1 = vec(q + "snake1.alpha", {1, out, 1});
      bl.res[r].alpha2 = vec(q + "snake2.alpha", {1, out, 1});
      bl.res[r].conv1 = conv(q + "conv1", out, out, 7, dil[r], true);
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

const Vocoder::Weights& Vocoder::weights(DType compute) const {
  if (compute == DType::F32) return *f32_;
  if (compute != DType::BF16)
    throw InvalidInput(fmt::format("vocoder: compute dtype must be F32 or BF16, not {}", dtype_name(compute)));
  std::call_once(bf16_once_, [this] {
    auto w = std::make_unique<Weights>(*f32_);
    auto rc = [](W::Conv& c) {
      c.w = rounded(std::move(c.w));
      c.b = rounded(std::move(c.b));
    };
    rc(w->in_proj);
    rc(w->conv_in);
    rc(w->conv_out);
    w->alpha_out = rounded(std::move(w->alpha_out));
    for (auto& bl : w->blocks) {
      bl.alpha = rounded(std::move(bl.alpha));
      bl.up.w = rounded(std::move(bl.up.w));
      bl.up.b = rounded(std::move(bl.up.b));
      for (auto& r : bl.res) {
        r.alpha1 = rounded(std::move(r.alpha1));
        r.alpha2 = rounded(std::move(r.alpha2));
        rc(r.conv1);
        rc(r.conv2);
      }
    }
    bf16_ = std::move(w);
  });
  return *bf16_;
}

void Vocoder::decode(const ThreadPool& pool, const float* latents, int64_t L, float* wave, int64_t ldw,
                     DType compute) const {
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
      len = kern::conv_transpose1d_out_len(len, bl.up.k, bl.up.stride, bl.up.pad, 0);
      cap = std::max(cap, bl.up.cout * len);
    }
  }
  std::vector<float> x, t1, t2;
  grow(x, cap);
  grow(t1, cap);
  grow(t2, cap);

  for (int64_t s = 0; s < 2; ++s) {
    // Stereo fold: stream s decodes latent channels [s·C/2, (s+1)·C/2)                  [C/2, L]
    for (int64_t c = 0; c < half; ++c)
      for (int64_t l = 0; l < L; ++l) t1[c * L + l] = round_store(latents[(s * half + c) * L + l], st);
    run_conv(pool, w.in_proj, t1.data(), L, t2.data(), st);  // [Din, L]
    run_conv(pool, w.conv_in, t2.data(), L, x.data(), st);   // [Hd, L]
    int64_t len = L;
    for (const auto& bl : w.blocks) {
      // Snake -> ConvTranspose1d: [cin, len] -> [cout, stride·len]
      kern::snake(x.data(), bl.alpha.data(), t1.data(), bl.up.cin, len, st);
      const int64_t nlen = kern::conv_transpose1d_out_len(len, bl.up.k, bl.up.stride, bl.up.pad, 0);
      kern::conv_transpose1d(pool, t1.data(), bl.up.cin, len, bl.up.w.data(), bl.up.b.data(), bl.up.cout, bl.up.k,
                             bl.up.stride, bl.up.pad, 0, x.data(), st);
      len = nlen;
      const int64_t ch = bl.up.cout;
      for (const auto& r : bl.res) {  // x = x + conv2(snake2(conv1(snake1(x))))
        kern::snake(x.data(), r.alpha1.data(), t1.data(), ch, len, st);
        run_conv(pool, r.conv1, t1.data(), len, t2.data(), st);
        kern::snake(t2.data(), r.alpha2.data(), t1.data(), ch, len, st);
        run_conv(pool, r.conv2, t1.data(), len, t2.data(), st);
        kern::add(x.data(), t2.data(), x.data(), ch * len, st);
      }
    }
    const int64_t ch = w.conv_out.cin;
    kern::snake(x.data(), w.alpha_out.data(), t1.data(), ch, len, st);
    if (len != hop_ * L) throw InternalError(fmt::format("vocoder: produced {} samples, expected {}", len, hop_ * L));
    float* out = wave + s * ldw;
    run_conv(pool, w.conv_out, t1.data(), len, out, st);  // [1, hop·L]
    kern::tanh_inplace(out, len, st);
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
