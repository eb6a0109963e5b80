// condition_encoder.cpp — condition mix (condition_encoder.h; MODEL.md §3). Kernels: transpose_2d, conv1d,
// interpolate_nearest.
#include "model/condition_encoder.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"
#include "model/weights.h"

namespace mm3 {

ConditionEncoder::ConditionEncoder(const TensorStore& store, const ConditionConfig& cfg) : cfg_(cfg) {
  const int64_t Lyr = cfg.num_condition_layers, H = cfg.condition_hidden_dim, O = cfg.out_dim;
  if (Lyr <= 0 || H <= 0 || O <= 0)
    throw BadModel(fmt::format("condition_encoder: bad config (layers {}, hidden {}, out {})", Lyr, H, O));
  WeightBinder b(store, "condition_encoder");
  const Tensor logits = b.get_f32("layer_weight_logits", {Lyr});
  const Tensor scale = b.get_f32("layer_scale", {1});
  proj_w_ = b.get_f32("proj.weight", {O, H, 3}).contiguous();
  proj_b_ = b.get_f32("proj.bias", {O}).contiguous();
  b.finish();

  // torch.softmax over the 8 logits in fp32: exp(x − max) / Σ exp(x − max).
  const std::vector<float> lg = logits.to_f32_vector();
  const float mx = *std::max_element(lg.begin(), lg.end());
  layer_weights_.resize(lg.size());
  float sum = 0;
  for (size_t i = 0; i < lg.size(); ++i) sum += layer_weights_[i] = std::exp(lg[i] - mx);
  for (float& w : layer_weights_) w /= sum;
  layer_scale_ = scale.to_f32_vector()[0];
}

LatentRates ConditionEncoder::rates() const {
  return {cfg_.input_sampling_rate, cfg_.input_hop_length, cfg_.output_sampling_rate, cfg_.output_hop_length};
}

int64_t ConditionEncoder::latent_length(int64_t frames) const { return mm3::latent_length(frames, rates()); }

Tensor ConditionEncoder::forward(const ThreadPool& pool, const float* frames, int64_t T, int64_t ld) const {
  const int64_t Lyr = cfg_.num_condition_layers, H = cfg_.condition_hidden_dim, O = cfg_.out_dim;
  if (T < 1) throw InvalidInput("condition encoder: a window needs at least one frame");
  if (ld < Lyr * H) throw InternalError("condition encoder: row stride shorter than layers·hidden");
  const int64_t L = latent_length(T);

  // m[t, h] = layer_scale · Σ_l w_l · frames[t, l·H + h]                          [T, H]
  std::vector<float> m(static_cast<size_t>(T * H));
  pool.parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = frames + t * ld;
      float* out = m.data() + t * H;
      for (int64_t h = 0; h < H; ++h) {
        float s = 0;
        for (int64_t l = 0; l < Lyr; ++l) s += layer_weights_[l] * row[l * H + h];
        out[h] = layer_scale_ * s;
      }
    }
  });
  // [T, H] -> [H, T] (Conv1d layout), Conv1d k=3 p=1 -> [O, T], nearest to [O, L], back to [L, O].
  std::vector<float> mt(static_cast<size_t>(H * T));
  kern::transpose_2d(m.data(), T, H, H, mt.data());
  std::vector<float> c(static_cast<size_t>(O * T));
  kern::conv1d(pool, mt.data(), H, T, proj_w_.data<float>(), proj_b_.data<float>(), O, 3, 1, 1, 1, c.data(),
               DType::F32);
  std::vector<float> ci(static_cast<size_t>(O * L));
  kern::interpolate_nearest(c.data(), O, T, L, ci.data());
  Tensor out = Tensor::empty(DType::F32, {L, O});
  kern::transpose_2d(ci.data(), O, L, L, out.data<float>());
  return out;
}

Tensor ConditionEncoder::forward(const ThreadPool& pool, const Tensor& frame_hiddens) const {
  Tensor x = frame_hiddens;
  if (x.ndim() == 3) {
    if (x.dim(0) != 1) throw InvalidInput(fmt::format("condition encoder: batch must be 1, got {}", x.describe()));
    x = x.select(0, 0);
  }
  const int64_t W = int64_t{cfg_.num_condition_layers} * cfg_.condition_hidden_dim;
  if (x.ndim() != 2 || x.dim(1) != W)
    throw InvalidInput(fmt::format("condition encoder: frame hiddens must be [T, {}], got {}", W, x.describe()));
  if (x.dtype() != DType::F32) x = x.to(DType::F32);
  x = x.contiguous();
  return forward(pool, x.data<float>(), x.dim(0), W).unsqueeze(0);
}

}  // namespace mm3
