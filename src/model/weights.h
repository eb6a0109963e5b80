// weights.h — binding checkpoint tensors to model fields by key AND expected shape
// (ARCHITECTURE.md habit 1). A binder collects every defect (missing key, wrong shape, wrong dtype)
// and `finish()` reports them all at once, naming key, file and both shapes; it also lists the
// checkpoint tensors nobody bound, because a silently ignored tensor is a parity bug.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace mm3 {

class WeightBinder {
 public:
  WeightBinder(const TensorStore& store, std::string component);

  // Zero-copy view of `key`, which must have exactly `expected` shape. `dtypes` lists the acceptable
  // stored dtypes (empty: any float dtype). On a defect, records it and returns a zero tensor.
  Tensor get(const std::string& key, const Shape& expected, std::vector<DType> dtypes = {});
  // Same, converted to F32 (an owned copy unless it is already F32).
  Tensor get_f32(const std::string& key, const Shape& expected);

  // Folds torch weight_norm (dim 0) at load: W = g * V / ||V||, the norm over every dim but 0.
  // `prefix` + ".weight_g" has shape [shape_v[0], 1, ...]; `prefix` + ".weight_v" has shape_v.
  // For Conv1d V is [out, in, k]; for ConvTranspose1d V is [in, out, k] — dim 0 in both cases.
  // Returns an owned F32 tensor of shape shape_v.
  Tensor get_weight_norm(const std::string& prefix, const Shape& shape_v);

  // Keys of the store that no get*() call bound.
  std::vector<std::string> unused() const;
  // Throws BadModel listing every defect and every unused key; no-op when all is well.
  void finish() const;

 private:
  const TensorStore& store_;
  std::string component_;
  std::set<std::string> bound_;
  std::vector<std::string> problems_;
};

// The scalar fold, exposed for tests: v is [d0, rest] row-major, g is [d0].
void fold_weight_norm(const float* g, const float* v, float* w, int64_t d0, int64_t rest);

}  // namespace mm3
