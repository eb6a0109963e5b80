// kv_cache.h — per-request key/value cache of a causal transformer (MODEL.md §2.4: the LM's cache holds
// prompt + max_frames positions for the two CFG rows; §2.7: the depth decoder's holds 8 positions).
// Preallocated once; appending never allocates. Kernels: none (attention reads it through kern::attention
// with kv_dtype = dtype()).
//
// Layout, one buffer: [layers, 2 (k, v), batch, kv_heads, capacity, head_dim]: head-major, so a decode
// step's attention streams each KV head's keys as one contiguous run (kern::attention with
// ldkv = key_stride(), ldh = head_stride()). Token-major rows ([capacity, kv_heads * head_dim], torch's
// order) put one head's keys 2 KiB apart in the LM's cache, 256 B used of each: a decode step's
// attention read them at ~20 GB/s where the rows streamed at ~55 (attention_lm_decode_513, Zen 5).
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
  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }
  // Element strides for kern::attention: between consecutive keys of a head, and between heads.
  int64_t key_stride() const { return head_dim_; }
  int64_t head_stride() const { return capacity_ * head_dim_; }
  DType dtype() const { return dtype_; }
  // Tokens stored per row (all rows advance together).
  int64_t length() const { return length_; }

  // Stores S tokens of `layer`, row `b`, at positions [pos, pos + S): k, v are float rows [S, width]
  // ([S, kv_heads, head_dim]) with row stride ld (bf16-valued when dtype() is BF16; converting them is
  // then exact).
  void write(int layer, int b, int64_t pos, int64_t S, const float* k, const float* v, int64_t ld);
  // Marks positions [0, n) as valid (after every layer wrote them).
  void set_length(int64_t n);
  void reset() { length_ = 0; }

  // Start of the k / v of (layer, b): [kv_heads, capacity, head_dim], element type dtype().
  const void* k(int layer, int b) const { return at(layer, 0, b); }
  const void* v(int layer, int b) const { return at(layer, 1, b); }

  size_t bytes() const { return buf_.nbytes(); }

 private:
  const void* at(int layer, int kv, int b) const;

  int layers_ = 0, batch_ = 0, kv_heads_ = 0, head_dim_ = 0;
  int64_t capacity_ = 0, width_ = 0, length_ = 0;
  DType dtype_ = DType::BF16;
  Tensor buf_;  // [layers, 2, batch, kv_heads, capacity, head_dim]
};

}  // namespace mm3
