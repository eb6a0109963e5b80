// segments.h — output rows of several weights laid end to end (kern::linear_multi): one parallel
// pass over the concatenation, each chunk split back into the weights' own row ranges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mm3::kern::detail {

// starts[i] = rows before weight i; starts.back() = the total. Calls f(i, lo, hi) for each weight i
// that the concatenated rows [b, e) overlap, with rows [lo, hi) of weight i.
template <class F>
void for_segments(const std::vector<int64_t>& starts, int64_t b, int64_t e, F&& f) {
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    const int64_t lo = std::max(b, starts[i]), hi = std::min(e, starts[i + 1]);
    if (lo < hi) f(i, lo - starts[i], hi - starts[i]);
  }
}

}  // namespace mm3::kern::detail
