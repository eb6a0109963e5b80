// npy.h — NumPy .npy v1/v2/v3 read and write for F32, F16, I64, I32 (and F64 read, converted to F32).
//
// C order is the default. A Fortran-order file is refused unless the caller opts in with
// `allow_fortran`, because reading it as C order yields the right element count and the wrong tensor;
// when allowed, it is transposed into a C-order tensor of the same logical shape.
#pragma once

#include <string>

#include "core/tensor.h"

namespace mm3 {

struct NpyReadOptions {
  bool allow_fortran = false;
};

Tensor read_npy(const std::string& path, NpyReadOptions opt = {});
void write_npy(const std::string& path, const Tensor& t);  // C order; BF16 is written as F32

}  // namespace mm3
