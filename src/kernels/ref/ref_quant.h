// ref_quant.h — scalar twins of the quantized-weight kernels (kernels/quant.h), tests only.
//
// Written straight from quant.h's definitions, independently of cpu/quant.cpp: the quantizer builds
// the byte layout element by element from its address formula; the products sum in double, with the
// activation quantization of the decode path (it is part of that op) and the bf16 rounding of the
// dequantized weights on the prefill path for a bf16 store.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/quant.h"

namespace mm3::ref {

using kern::QuantMatrix;
using kern::QuantType;

// The format of quant.h for a 2-D F32 / BF16 weight (rows contiguous); same bytes as kern::quantize_weight.
std::shared_ptr<const QuantMatrix> quantize_weight(const Tensor& w, QuantType type);

// w[n, k] as the format stores it, decoded from the layout description (0 for k >= K).
float quant_value(const QuantMatrix& q, int64_t n, int64_t k);

// Decode product (M <= 4: quantized activations, double sums) or prefill product (M > 4: x times the
// dequantized values, rounded to bf16 first with a BF16 store), + bias, rounded to store.
void quant_linear(const float* x, int64_t M, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                  int64_t ldy, DType store);

}  // namespace mm3::ref
