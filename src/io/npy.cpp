#include "io/npy.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

namespace mm3 {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InvalidInput(fmt::format("{}: {}", path, what));
}

}  // namespace

Tensor read_npy(const std::string& path, NpyReadOptions opt) {
  std::ifstream in(path, std::ios::binary);
  if (!in) bad(path, "cannot open");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() < 10 || std::memcmp(all.data(), "\x93NUMPY", 6) != 0) bad(path, "not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(all[6]);
  size_t hlen, hstart;
  if (major == 1) {
    hlen = static_cast<unsigned char>(all[8]) | (static_cast<unsigned char>(all[9]) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (all.size() < 12) bad(path, "truncated header");
    hlen = 0;
    for (int i = 3; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(all[8 + i]);
    hstart = 12;
  } else {
    bad(path, fmt::format("unsupported .npy version {}", major));
  }
  if (hstart + hlen > all.size()) bad(path, "truncated header");
  const std::string header = all.substr(hstart, hlen);
  std::smatch m;
  static const std::regex re_descr("'descr'\\s*:\\s*'([^']*)'");
  static const std::regex re_fortran("'fortran_order'\\s*:\\s*(True|False)");
  static const std::regex re_shape("'shape'\\s*:\\s*\\(([^)]*)\\)");
  if (!std::regex_search(header, m, re_descr)) bad(path, "header has no 'descr'");
  const std::string descr = m[1];
  if (!std::regex_search(header, m, re_fortran)) bad(path, "header has no 'fortran_order'");
  const bool fortran = m[1] == "True";
  if (!std::regex_search(header, m, re_shape)) bad(path, "header has no 'shape'");
  Shape shape;
  {
    std::string s = m[1];
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (item.empty()) continue;
      try {
        shape.push_back(std::stoll(item));
      } catch (...) {
        bad(path, fmt::format("bad shape entry '{}'", item));
      }
    }
  }
  DType dt;
  bool f64 = false;
  if (descr == "<f4") dt = DType::F32;
  else if (descr == "<f2") dt = DType::F16;
  else if (descr == "<i8") dt = DType::I64;
  else if (descr == "<i4") dt = DType::I32;
  else if (descr == "<f8") { dt = DType::F32; f64 = true; }
  else bad(path, fmt::format("unsupported dtype '{}' (expected <f4, <f8, <f2, <i8 or <i4)", descr));
  if (fortran && !opt.allow_fortran)
    bad(path, "array is in Fortran order; re-save it in C order (np.ascontiguousarray) or opt in");
  const size_t esz = f64 ? 8 : dtype_size(dt);
  const size_t n = static_cast<size_t>(shape_numel(shape));
  const size_t data_off = hstart + hlen;
  if (all.size() - data_off < n * esz)
    bad(path, fmt::format("truncated: {} elements need {} bytes, file has {}", n, n * esz, all.size() - data_off));
  // Read in file order into a tensor whose shape matches the storage order.
  Shape storage_shape = shape;
  if (fortran) std::reverse(storage_shape.begin(), storage_shape.end());
  Tensor t = Tensor::empty(dt, storage_shape);
  if (f64) {
    const char* p = all.data() + data_off;
    float* o = t.data<float>();
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      o[i] = static_cast<float>(d);
    }
  } else {
    std::memcpy(t.raw(), all.data() + data_off, n * esz);
  }
  if (fortran) {
    // Storage is C order of the reversed shape: reverse the dims back with transposed views.
    Tensor v = t;
    const int nd = v.ndim();
    for (int i = 0; i < nd / 2; ++i) v = v.transpose(i, nd - 1 - i);
    return v.contiguous();
  }
  return t;
}

void write_npy(const std::string& path, const Tensor& t0) {
  Tensor t = t0.dtype() == DType::BF16 ? t0.to(DType::F32) : t0.contiguous();
  const char* descr = nullptr;
  switch (t.dtype()) {
    case DType::F32: descr = "<f4"; break;
    case DType::F16: descr = "<f2"; break;
    case DType::I64: descr = "<i8"; break;
    case DType::I32: descr = "<i4"; break;
    default: throw InternalError("write_npy: unsupported dtype");
  }
  std::string shape;
  for (size_t i = 0; i < t.shape().size(); ++i) shape += std::to_string(t.shape()[i]) + ",";
  if (t.shape().size() > 1) shape.pop_back();
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  const std::string tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InvalidInput(fmt::format("cannot write {}", tmp));
    out.write("\x93NUMPY\x01\x00", 8);
    const uint16_t hl = static_cast<uint16_t>(header.size());
    const char lb[2] = {static_cast<char>(hl & 0xFF), static_cast<char>(hl >> 8)};
    out.write(lb, 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
    if (!out) throw InvalidInput(fmt::format("write to {} failed (disk full?)", tmp));
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace mm3
