// kernels_tuning.cpp — the same-bits kernel knobs (kernels/tuning.h): forcing and releasing a knob,
// refusing values and names it does not know. (That each form gives the same bits is the kernels'
// own tests': KernelsLinear.Bf16GemvRowsSideBySideSameBitsAsAlone, and the ctest entries
// kernels_quant_gemv_prefetch_0 / _1.)
#include <gtest/gtest.h>

#include "core/errors.h"
#include "kernels/tuning.h"

namespace mm3 {
namespace {

using kern::tuning::Knob;

TEST(KernelsTuning, ForceAndRelease) {
  for (const auto& k : kern::tuning::knobs()) {
    SCOPED_TRACE(k.name);
    EXPECT_EQ(kern::tuning::knob_from_name(k.name), k.knob);
    const int before = kern::tuning::forced(k.knob);
    for (int v : k.values) {
      kern::tuning::force(k.knob, v);
      EXPECT_EQ(kern::tuning::forced(k.knob), v);
    }
    kern::tuning::force(k.knob, -1);
    EXPECT_EQ(kern::tuning::forced(k.knob), -1);
    kern::tuning::force(k.knob, before);
  }
}

// RED: a force() without the value check accepts gemv_rows = 2 (a row count the GEMV has no body for).
TEST(KernelsTuning, RefusesUnknownValuesAndNames) {
  const int before = kern::tuning::forced(Knob::GemvRows);
  EXPECT_THROW(kern::tuning::force(Knob::GemvRows, 2), InvalidInput);
  EXPECT_THROW(kern::tuning::force(Knob::QuantPrefetch, 4), InvalidInput);
  EXPECT_EQ(kern::tuning::forced(Knob::GemvRows), before) << "a refused value must not stick";
  try {
    kern::tuning::knob_from_name("gemv_row");
    ADD_FAILURE() << "an unknown knob name was accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("gemv_rows"), std::string::npos) << "the error lists the knobs: " << e.what();
  }
}

}  // namespace
}  // namespace mm3
