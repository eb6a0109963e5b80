// linear_weight.cpp — LinearWeight construction (kernels.h).
// A default-constructed Tensor (no storage) means "no bias"; note its numel() is 1 (a 0-d shape), so
// presence is decided by storage, not by numel.
#include "kernels/kernels.h"

namespace mm3::kern {

LinearWeight::LinearWeight(Tensor weight, Tensor bias) : w_(std::move(weight)) {
  if (w_.ndim() != 2 || !w_.is_contiguous() || (w_.dtype() != DType::F32 && w_.dtype() != DType::BF16))
    throw InternalError("LinearWeight: weight must be a contiguous 2-D F32 or BF16 tensor, got " + w_.describe());
  out_ = w_.dim(0);
  in_ = w_.dim(1);
  set_bias(std::move(bias));
}

LinearWeight::LinearWeight(std::shared_ptr<const QuantMatrix> quant, Tensor bias) : quant_(std::move(quant)) {
  if (!quant_) throw InternalError("LinearWeight: null quantized weight");
  out_ = quant_->rows();
  in_ = quant_->cols();
  set_bias(std::move(bias));
}

LinearWeight::LinearWeight(int64_t out, int64_t in, std::shared_ptr<const void> gemm_form, size_t bytes, Tensor bias,
                           GemmKind kind)
    : gemm_(std::move(gemm_form)), gemm_bytes_(bytes), kind_(kind), out_(out), in_(in) {
  if (!gemm_ || out <= 0 || in <= 0 || kind == GemmKind::None)
    throw InternalError("LinearWeight: empty blocked GEMM form");
  set_bias(std::move(bias));
}

void LinearWeight::set_bias(Tensor bias) {
  b_ = std::move(bias);
  if (b_.raw() == nullptr) b_ = Tensor();
  if (b_.raw() != nullptr) {
    if (b_.ndim() != 1 || b_.dim(0) != out_)
      throw InternalError(fmt::format("LinearWeight: bias {} does not match weight [{}, {}]", b_.describe(), out_, in_));
    bias_f32_ = b_.to_f32_vector();
  }
}

}  // namespace mm3::kern
