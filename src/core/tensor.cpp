#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/aligned.h"

namespace mm3 {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

namespace {

// Tensor storage: alloc_storage's rule (core/aligned.h: 4 MiB and up on 2 MiB boundaries, THP advised).
std::shared_ptr<void> alloc_aligned(size_t bytes) {
  void* p = alloc_storage(bytes);
  if (!p)
    throw OutOfMemory(fmt::format("could not allocate {:.1f} MiB for a tensor", bytes / 1048576.0));
  return std::shared_ptr<void>(p, [](void* q) { free_storage(q); });
}

// Iterate every element of a strided tensor in C order, calling f(src_element_offset, linear_index).
template <class F>
void for_each_offset(const Shape& shape, const std::vector<int64_t>& strides, F&& f) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  const int nd = static_cast<int>(shape.size());
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t lin = 0; lin < n; ++lin) {
    f(off, lin);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

}  // namespace

Tensor Tensor::empty(DType dt, Shape shape) {
  for (int64_t d : shape)
    if (d < 0) throw InternalError("Tensor::empty: negative dim in " + shape_str(shape));
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  auto mem = alloc_aligned(t.nbytes());
  t.data_ = mem.get();
  t.owner_ = mem;
  return t;
}

std::vector<Tensor> Tensor::empty_group(const std::vector<std::pair<DType, Shape>>& specs) {
  std::vector<size_t> offset(specs.size());
  size_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int64_t d : specs[i].second)
      if (d < 0) throw InternalError("Tensor::empty_group: negative dim in " + shape_str(specs[i].second));
    offset[i] = total;
    total += (static_cast<size_t>(shape_numel(specs[i].second)) * dtype_size(specs[i].first) + 63) / 64 * 64;
  }
  auto mem = alloc_aligned(total);
  std::vector<Tensor> out(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor& t = out[i];
    t.dtype_ = specs[i].first;
    t.shape_ = specs[i].second;
    t.strides_ = contiguous_strides(t.shape_);
    t.data_ = static_cast<unsigned char*>(mem.get()) + offset[i];
    t.owner_ = mem;
  }
  return out;
}

Tensor Tensor::zeros(DType dt, Shape shape) {
  Tensor t = empty(dt, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::from_f32(const std::vector<float>& v, Shape shape) {
  if (shape_numel(shape) != static_cast<int64_t>(v.size()))
    throw InternalError("Tensor::from_f32: " + std::to_string(v.size()) + " values for shape " +
                        shape_str(shape));
  Tensor t = empty(DType::F32, std::move(shape));
  std::memcpy(t.data_, v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::from_i64(const std::vector<int64_t>& v, Shape shape) {
  if (shape_numel(shape) != static_cast<int64_t>(v.size()))
    throw InternalError("Tensor::from_i64: " + std::to_string(v.size()) + " values for shape " +
                        shape_str(shape));
  Tensor t = empty(DType::I64, std::move(shape));
  std::memcpy(t.data_, v.data(), v.size() * 8);
  return t;
}

Tensor Tensor::borrow(DType dt, Shape shape, const void* data,
                      std::shared_ptr<const void> keepalive) {
  Tensor t;
  t.dtype_ = dt;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  t.data_ = const_cast<void*>(data);
  t.owner_ = std::move(keepalive);
  t.borrowed_ = true;
  return t;
}

int64_t Tensor::dim(int i) const {
  int n = ndim();
  int j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    throw InternalError(fmt::format("dim {} out of range for tensor {}", i, describe()));
  return shape_[j];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_) || numel() <= 1; }

void Tensor::check_type(DType want) const {
  if (want != dtype_)
    throw InternalError(fmt::format("tensor {} accessed as {}", describe(), dtype_name(want)));
}

Tensor Tensor::view(Shape shape) const {
  if (!is_contiguous()) throw InternalError("view() of a non-contiguous tensor " + describe());
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw InternalError("view(): two -1 dims");
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) shape[infer] = known ? numel() / known : 0;
  if (shape_numel(shape) != numel())
    throw InternalError(fmt::format("view {} of {}: element counts differ", shape_str(shape), describe()));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  t.strides_ = contiguous_strides(t.shape_);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  int n = ndim();
  int j = d < 0 ? d + n : d;
  if (j < 0 || j >= n || start < 0 || end < start || end > shape_[j])
    throw InternalError(fmt::format("slice(dim {}, {}, {}) out of range for {}", d, start, end, describe()));
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + start * strides_[j] * static_cast<int64_t>(dtype_size(dtype_));
  t.shape_[j] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  int n = ndim();
  int j = d < 0 ? d + n : d;
  Tensor t = slice(j, index, index + 1);
  t.shape_.erase(t.shape_.begin() + j);
  t.strides_.erase(t.strides_.begin() + j);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  int n = ndim();
  int ja = a < 0 ? a + n : a, jb = b < 0 ? b + n : b;
  if (ja < 0 || ja >= n || jb < 0 || jb >= n) throw InternalError("transpose: dim out of range");
  Tensor t = *this;
  std::swap(t.shape_[ja], t.shape_[jb]);
  std::swap(t.strides_[ja], t.strides_[jb]);
  return t;
}

Tensor Tensor::unsqueeze(int d) const {
  int n = ndim();
  int j = d < 0 ? d + n + 1 : d;
  if (j < 0 || j > n) throw InternalError("unsqueeze: dim out of range");
  Tensor t = *this;
  int64_t st = j < n ? strides_[j] * shape_[j] : 1;
  t.shape_.insert(t.shape_.begin() + j, 1);
  t.strides_.insert(t.strides_.begin() + j, st);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  const size_t es = dtype_size(dtype_);
  if (is_contiguous()) {
    std::memcpy(t.data_, data_, nbytes());
    return t;
  }
  const char* src = static_cast<const char*>(data_);
  char* dst = static_cast<char*>(t.data_);
  for_each_offset(shape_, strides_, [&](int64_t off, int64_t lin) {
    std::memcpy(dst + lin * es, src + off * static_cast<int64_t>(es), es);
  });
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

namespace {

double load_as_double(DType dt, const void* p) {
  switch (dt) {
    case DType::F32: return *static_cast<const float*>(p);
    case DType::BF16: return bf16_bits_to_f32(*static_cast<const uint16_t*>(p));
    case DType::F16: return f16_bits_to_f32(*static_cast<const uint16_t*>(p));
    case DType::I64: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::I32: return *static_cast<const int32_t*>(p);
  }
  return 0;
}

void store_from_double(DType dt, void* p, double v, const void* src, DType src_dt) {
  switch (dt) {
    case DType::F32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::BF16: *static_cast<uint16_t*>(p) = f32_to_bf16_bits(static_cast<float>(v)); break;
    case DType::F16: *static_cast<uint16_t*>(p) = f32_to_f16_bits(static_cast<float>(v)); break;
    case DType::I64:
      *static_cast<int64_t*>(p) = src_dt == DType::I64 ? *static_cast<const int64_t*>(src)
                                                        : static_cast<int64_t>(v);
      break;
    case DType::I32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
  }
}

}  // namespace

Tensor Tensor::to(DType dt) const {
  if (dt == dtype_) return contiguous();
  Tensor t = empty(dt, shape_);
  // The float <-> bf16 casts of whole weight matrices (the bf16 acoustic profile converts ~2.3 G values
  // at load) take the vectorised array conversions: the same bits as the element loop below.
  if (is_contiguous() && dtype_ == DType::F32 && dt == DType::BF16) {
    f32_to_bf16(static_cast<const float*>(data_), static_cast<uint16_t*>(t.data_), static_cast<size_t>(numel()));
    return t;
  }
  if (is_contiguous() && dtype_ == DType::BF16 && dt == DType::F32) {
    bf16_to_f32(static_cast<const uint16_t*>(data_), static_cast<float*>(t.data_), static_cast<size_t>(numel()));
    return t;
  }
  const size_t ses = dtype_size(dtype_), des = dtype_size(dt);
  const char* src = static_cast<const char*>(data_);
  char* dst = static_cast<char*>(t.data_);
  for_each_offset(shape_, strides_, [&](int64_t off, int64_t lin) {
    const void* s = src + off * static_cast<int64_t>(ses);
    store_from_double(dt, dst + lin * des, load_as_double(dtype_, s), s, dtype_);
  });
  return t;
}

std::vector<float> Tensor::to_f32_vector() const {
  if (dtype_ == DType::I64 || dtype_ == DType::I32)
    throw InternalError("to_f32_vector() of integer tensor " + describe());
  Tensor t = to(DType::F32);
  const float* p = static_cast<const float*>(t.data_);
  return std::vector<float>(p, p + t.numel());
}

std::vector<int64_t> Tensor::to_i64_vector() const {
  Tensor t = to(DType::I64);
  const int64_t* p = static_cast<const int64_t*>(t.data_);
  return std::vector<int64_t>(p, p + t.numel());
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

}  // namespace mm3
