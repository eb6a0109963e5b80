// kv_cache.cpp — KvCache (kv_cache.h).
#include "model/kv_cache.h"

#include <cstring>

namespace mm3 {

KvCache::KvCache(int layers, int batch, int64_t capacity, int kv_heads, int head_dim, DType dtype)
    : layers_(layers),
      batch_(batch),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      capacity_(capacity),
      width_(int64_t(kv_heads) * head_dim),
      dtype_(dtype) {
  if (dtype != DType::BF16 && dtype != DType::F32)
    throw InvalidInput(fmt::format("KV cache dtype must be BF16 or F32, got {}", dtype_name(dtype)));
  if (layers <= 0 || batch <= 0 || capacity <= 0 || kv_heads <= 0 || head_dim <= 0)
    throw InternalError(fmt::format("KV cache: bad geometry layers={} batch={} capacity={} width={}", layers, batch,
                                    capacity, width_));
  const double bytes = double(layers) * 2 * batch * capacity * width_ * dtype_size(dtype);
  try {
    buf_ = Tensor::empty(dtype, {layers, 2, batch, kv_heads, capacity, head_dim});
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(fmt::format("KV cache of {:.1f} MiB ({} layers x 2 x {} rows x {} positions x {} values)",
                                  bytes / (1 << 20), layers, batch, capacity, width_));
  }
}

const void* KvCache::at(int layer, int kv, int b) const {
  const int64_t off = (((int64_t(layer) * 2 + kv) * batch_ + b) * capacity_) * width_;
  return static_cast<const char*>(buf_.raw()) + off * static_cast<int64_t>(dtype_size(dtype_));
}

void KvCache::write(int layer, int b, int64_t pos, int64_t S, const float* k, const float* v, int64_t ld) {
  MM3_CHECK(layer >= 0 && layer < layers_ && b >= 0 && b < batch_, "KV write layer {} row {}", layer, b);
  if (pos < 0 || pos + S > capacity_)
    throw InvalidInput(fmt::format("KV cache full: positions [{}, {}) exceed its capacity of {}", pos, pos + S,
                                   capacity_));
  for (int kv = 0; kv < 2; ++kv) {
    const float* src = kv == 0 ? k : v;
    char* base = static_cast<char*>(const_cast<void*>(at(layer, kv, b)));
    for (int64_t s = 0; s < S; ++s)
      for (int h = 0; h < kv_heads_; ++h) {
        const float* piece = src + s * ld + int64_t(h) * head_dim_;
        const int64_t dst = (int64_t(h) * capacity_ + pos + s) * head_dim_;
        if (dtype_ == DType::BF16)
          f32_to_bf16(piece, reinterpret_cast<uint16_t*>(base) + dst, static_cast<size_t>(head_dim_));
        else
          std::memcpy(reinterpret_cast<float*>(base) + dst, piece, static_cast<size_t>(head_dim_) * 4);
      }
  }
}

void KvCache::set_length(int64_t n) {
  MM3_CHECK(n >= 0 && n <= capacity_, "KV length {} outside [0, {}]", n, capacity_);
  length_ = n;
}

}  // namespace mm3
