// core_npy_test.cpp — .npy round trips, C order by default, Fortran order only by opt-in.
#include <gtest/gtest.h>

#include "core_test_util.h"
#include "io/npy.h"

namespace mm3 {
namespace {

// A v1 .npy with the given header dict and raw data.
std::string npy_bytes(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string s = "\x93NUMPY\x01";
  s += '\0';
  s += static_cast<char>(h.size() & 0xFF);
  s += static_cast<char>(h.size() >> 8);
  return s + h + data;
}

std::string f32s(std::initializer_list<float> v) {
  std::string s;
  for (float f : v) s.append(reinterpret_cast<const char*>(&f), 4);
  return s;
}

TEST(Npy, RoundTripF32AndI64) {
  test::TempDir d;
  Tensor a = Tensor::from_f32({1, 2, 3, 4, 5, 6}, {2, 3});
  write_npy(d.file("a.npy"), a);
  Tensor r = read_npy(d.file("a.npy"));
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.to_f32_vector(), a.to_f32_vector());
  Tensor c = Tensor::from_i64({5, -1, 1ll << 50}, {3, 1});
  write_npy(d.file("c.npy"), c);
  EXPECT_EQ(read_npy(d.file("c.npy")).to_i64_vector(), c.to_i64_vector());
  // A transposed view is written in logical (C) order.
  write_npy(d.file("t.npy"), a.transpose(0, 1));
  EXPECT_EQ(read_npy(d.file("t.npy")).to_f32_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST(Npy, FortranOrderRefusedUnlessOptedIn) {
  test::TempDir d;
  // numpy.asfortranarray([[1,2,3],[4,5,6]], float32) stores columns: 1 4 2 5 3 6.
  test::write_bytes(d.file("f.npy"),
              npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f32s({1, 4, 2, 5, 3, 6})));
  try {
    read_npy(d.file("f.npy"));
    FAIL() << "Fortran order accepted silently";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("Fortran"), std::string::npos);
  }
  Tensor t = read_npy(d.file("f.npy"), {.allow_fortran = true});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_f32_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Npy, RejectsBadFiles) {
  test::TempDir d;
  test::write_bytes(d.file("x.npy"), "not numpy at all");
  EXPECT_THROW(read_npy(d.file("x.npy")), InvalidInput);
  test::write_bytes(d.file("t.npy"), npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", f32s({1})));
  EXPECT_THROW(read_npy(d.file("t.npy")), InvalidInput);  // truncated
  test::write_bytes(d.file("u.npy"), npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", "a"));
  EXPECT_THROW(read_npy(d.file("u.npy")), InvalidInput);  // unsupported dtype
  EXPECT_THROW(read_npy(d.file("missing.npy")), InvalidInput);
}

}  // namespace
}  // namespace mm3
