#include "model/weights.h"

#include <cmath>

namespace mm3 {

WeightBinder::WeightBinder(const TensorStore& store, std::string component)
    : store_(store), component_(std::move(component)) {}

Tensor WeightBinder::get(const std::string& key, const Shape& expected, std::vector<DType> dtypes) {
  if (!store_.contains(key)) {
    problems_.push_back(fmt::format("missing tensor '{}' (expected shape {})", key, shape_str(expected)));
    return Tensor::zeros(DType::F32, expected);
  }
  bound_.insert(key);
  const TensorInfo& ti = store_.info(key);
  if (ti.shape != expected) {
    problems_.push_back(fmt::format("tensor '{}' in {} has shape {}, expected {}", key, store_.file_of(key),
                                    shape_str(ti.shape), shape_str(expected)));
    return Tensor::zeros(DType::F32, expected);
  }
  if (dtypes.empty()) dtypes = {DType::F32, DType::BF16, DType::F16};
  bool ok = false;
  for (DType d : dtypes) ok |= d == ti.dtype;
  if (!ok) {
    std::string want;
    for (DType d : dtypes) want += std::string(want.empty() ? "" : "/") + dtype_name(d);
    problems_.push_back(fmt::format("tensor '{}' in {} is {}, expected {}", key, store_.file_of(key),
                                    dtype_name(ti.dtype), want));
    return Tensor::zeros(DType::F32, expected);
  }
  return store_.get(key);
}

Tensor WeightBinder::get_f32(const std::string& key, const Shape& expected) {
  Tensor t = get(key, expected);
  return t.dtype() == DType::F32 ? t : t.to(DType::F32);
}

void fold_weight_norm(const float* g, const float* v, float* w, int64_t d0, int64_t rest) {
  for (int64_t i = 0; i < d0; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < rest; ++j) ss += static_cast<double>(v[i * rest + j]) * v[i * rest + j];
    const double scale = static_cast<double>(g[i]) / std::sqrt(ss);
    for (int64_t j = 0; j < rest; ++j) w[i * rest + j] = static_cast<float>(v[i * rest + j] * scale);
  }
}

Tensor WeightBinder::get_weight_norm(const std::string& prefix, const Shape& shape_v) {
  Shape shape_g(shape_v.size(), 1);
  shape_g[0] = shape_v[0];
  Tensor g = get_f32(prefix + ".weight_g", shape_g).contiguous();
  Tensor v = get_f32(prefix + ".weight_v", shape_v).contiguous();
  Tensor w = Tensor::empty(DType::F32, shape_v);
  const int64_t d0 = shape_v[0];
  fold_weight_norm(g.data<float>(), v.data<float>(), w.data<float>(), d0, d0 ? v.numel() / d0 : 0);
  return w;
}

std::vector<std::string> WeightBinder::unused() const {
  std::vector<std::string> r;
  for (const std::string& n : store_.names())
    if (!bound_.count(n)) r.push_back(n);
  return r;
}

void WeightBinder::finish() const {
  std::vector<std::string> all = problems_;
  for (const std::string& u : unused()) all.push_back(fmt::format("tensor '{}' is not used by mm3", u));
  if (all.empty()) return;
  std::string msg = fmt::format("{} ({}): {} problem(s) binding weights:", component_, store_.dir(), all.size());
  for (size_t i = 0; i < all.size() && i < 20; ++i) msg += "\n  " + all[i];
  if (all.size() > 20) msg += fmt::format("\n  ... and {} more", all.size() - 20);
  throw BadModel(msg);
}

}  // namespace mm3
