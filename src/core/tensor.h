// tensor.h — a dtype-tagged, strided view over owned or borrowed (mmap) storage.
//
// Dim order is PyTorch's everywhere: shape[0] is the outermost dim, strides are in *elements*, and a
// contiguous tensor has C (row-major) strides. Model code documents shapes as torch does, e.g.
// `[B, C, L]` for a Conv1d activation and `[out, in]` for a Linear weight.
//
// A Tensor is a cheap handle: copying it shares the storage (like torch). `clone()` copies the data.
// Borrowed storage (a safetensors mmap) is kept alive by a shared owner pointer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/errors.h"

namespace mm3 {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2, 64, 16]"
int64_t shape_numel(const Shape& s);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::F32; }
template <>
constexpr DType dtype_of<bf16_t>() { return DType::BF16; }
template <>
constexpr DType dtype_of<f16_t>() { return DType::F16; }
template <>
constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <>
constexpr DType dtype_of<int32_t>() { return DType::I32; }

class Tensor {
 public:
  Tensor() = default;

  // Owning, uninitialized / zero-filled storage (64-byte aligned).
  static Tensor empty(DType dt, Shape shape);
  static Tensor zeros(DType dt, Shape shape);
  // Owning, uninitialized: contiguous tensors of these dtypes and shapes placed one after another
  // (each start 64-byte aligned) in ONE allocation, which takes huge pages when it is large (as
  // empty() does for a large tensor). For data streamed together, e.g. a quantized weight's codes and
  // its scales: a small tensor of the group then sits on huge pages too, not on 4 KiB ones.
  static std::vector<Tensor> empty_group(const std::vector<std::pair<DType, Shape>>& specs);
  // Owning copy of `n` floats / other values.
  static Tensor from_f32(const std::vector<float>& v, Shape shape);
  static Tensor from_i64(const std::vector<int64_t>& v, Shape shape);
  // Zero-copy view of memory owned by `keepalive` (e.g. an mmap'd file). Contiguous.
  static Tensor borrow(DType dt, Shape shape, const void* data, std::shared_ptr<const void> keepalive);

  bool defined() const { return data_ != nullptr || numel() == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;  // negative i counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const;
  bool is_borrowed() const { return borrowed_; }

  // Typed access; throws InternalError when T does not match dtype().
  template <class T>
  T* data() {
    check_type(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(data_);
  }
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // Views (share storage).
  Tensor view(Shape shape) const;                              // contiguous only; one dim may be -1
  Tensor slice(int dim, int64_t start, int64_t end) const;     // [start, end) along dim
  Tensor select(int dim, int64_t index) const;                 // drops dim
  Tensor transpose(int a, int b) const;
  Tensor unsqueeze(int dim) const;

  // Copies.
  Tensor contiguous() const;  // itself when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dt) const;  // converts (float<->bf16 with torch rounding, ints to float, ...)

  // Convenience: contiguous float copy of any float-typed tensor (F32, BF16, F16).
  std::vector<float> to_f32_vector() const;
  std::vector<int64_t> to_i64_vector() const;

  std::string describe() const;  // "BF16[2, 64]"

 private:
  void check_type(DType want) const;

  DType dtype_ = DType::F32;
  Shape shape_;
  std::vector<int64_t> strides_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;
  bool borrowed_ = false;
};

std::vector<int64_t> contiguous_strides(const Shape& s);

}  // namespace mm3
