// kv_cache.h — per-request key/value cache of a causal transformer (MODEL.md §2.4: the LM's cache holds
// prompt + max_frames positions for the two CFG rows; §2.7: the depth decoder's holds 8 positions).
// Preallocated once; appending never allocates. Kernels: none (attention reads it through kern::attention
// with kv_dtype = dtype()).
//
// Layout, one buffer: [layers, 2 (k, v), batch, capacity, kv_heads * head_dim] in torch dim order; one
// row (`batch` index) is one sequence, token-major, so kern::attention reads it with ldkv = row_width().
// Storage dtype: BF16 (bits; the reference profile's k/v are bf16 tensors, so storing them is exact) or
// F32 (fp32 debugging profile).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mm3 {

class KvCache {
 public:
  KvCache() = default;
  KvCache(int layers, int batch, int64_t capacity, int kv_heads, int head_dim, DType dtype);

  int layers() const { return layers_; }
  int batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t row_width() const { return width_; }  // kv_heads * head_dim
  DType dtype() const { return dtype_; }
  // Tokens stored per row (all rows advance together).
  int64_t length() const { return length_; }

  // Stores S tokens of `layer`, row `b`, at positions [pos, pos + S): k, v are float rows [S, width]
  // with row stride ld (bf16-valued when dtype() is BF16; converting them is then exact).
  void write(int layer, int b, int64_t pos, int64_t S, const float* k, const float* v, int64_t ld);
  // Marks positions [0, n) as valid (after every layer wrote them).
  void set_length(int64_t n);
  void reset() { length_ = 0; }

  // Start of the k / v rows of (layer, b): [capacity, width], element type dtype().
  const void* k(int layer, int b) const { return at(layer, 0, b); }
  const void* v(int layer, int b) const { return at(layer, 1, b); }

  size_t bytes() const { return buf_.nbytes(); }

 private:
  const void* at(int layer, int kv, int b) const;

  int layers_ = 0, batch_ = 0;
  int64_t capacity_ = 0, width_ = 0, length_ = 0;
  DType dtype_ = DType::BF16;
  Tensor buf_;  // [layers, 2, batch, capacity, width]
};

}  // namespace mm3
