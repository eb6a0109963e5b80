// kernels_resample.cpp — kern::nearest_src_index against torch's F.interpolate(mode="nearest") index
// map (embedded constants) and the ref twin; interpolate_nearest and transpose_2d against their twins.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels_util.h"

namespace mm3 {
namespace {

using test::Guarded;
using test::Rng;

// Made with torch 1.13 (CPU): for each T, L = max(1, int(T * 44100 / 24000 * 960 / 512)) (MODEL.md §3
// step 6), y = F.interpolate(torch.arange(T).float().view(1, 1, T), size=L, mode="nearest");
// first_T<T>[s] is the first output index whose value is s. With T = 150 a double-precision scale
// would give a different map; torch's float32 one is what these record.
// T=1 L=3
const int64_t first_T1[] = {
    0,
};
// T=5 L=17
const int64_t first_T5[] = {
    0, 4, 7, 11, 14,
};
// T=150 L=516
const int64_t first_T150[] = {
    0, 4, 7, 11, 14, 18, 21, 25, 28, 31, 35, 38, 42, 45, 49, 52,
    56, 59, 62, 66, 69, 73, 76, 80, 83, 86, 90, 93, 97, 100, 104, 107,
    111, 114, 117, 121, 124, 128, 131, 135, 138, 142, 145, 148, 152, 155, 159, 162,
    166, 169, 172, 176, 179, 183, 186, 190, 193, 197, 200, 203, 207, 210, 214, 217,
    221, 224, 228, 231, 234, 238, 241, 245, 248, 252, 255, 258, 262, 265, 269, 272,
    276, 279, 283, 286, 289, 293, 296, 300, 303, 307, 310, 314, 317, 320, 324, 327,
    331, 334, 338, 341, 344, 348, 351, 355, 358, 362, 365, 369, 372, 375, 379, 382,
    386, 389, 393, 396, 400, 403, 406, 410, 413, 417, 420, 424, 427, 431, 434, 437,
    441, 444, 448, 451, 455, 458, 461, 465, 468, 472, 475, 479, 482, 486, 489, 492,
    496, 499, 503, 506, 510, 513,
};
// T=200 L=689
const int64_t first_T200[] = {
    0, 4, 7, 11, 14, 18, 21, 25, 28, 32, 35, 38, 42, 45, 49, 52,
    56, 59, 63, 66, 69, 73, 76, 80, 83, 87, 90, 94, 97, 100, 104, 107,
    111, 114, 118, 121, 125, 128, 131, 135, 138, 142, 145, 149, 152, 156, 159, 162,
    166, 169, 173, 176, 180, 183, 187, 190, 193, 197, 200, 204, 207, 211, 214, 218,
    221, 224, 228, 231, 235, 238, 242, 245, 249, 252, 255, 259, 262, 266, 269, 273,
    276, 280, 283, 286, 290, 293, 297, 300, 304, 307, 311, 314, 317, 321, 324, 328,
    331, 335, 338, 342, 345, 348, 352, 355, 359, 362, 366, 369, 373, 376, 379, 383,
    386, 390, 393, 397, 400, 404, 407, 410, 414, 417, 421, 424, 428, 431, 435, 438,
    441, 445, 448, 452, 455, 459, 462, 466, 469, 472, 476, 479, 483, 486, 490, 493,
    497, 500, 503, 507, 510, 514, 517, 521, 524, 528, 531, 534, 538, 541, 545, 548,
    552, 555, 559, 562, 565, 569, 572, 576, 579, 583, 586, 590, 593, 596, 600, 603,
    607, 610, 614, 617, 621, 624, 627, 631, 634, 638, 641, 645, 648, 652, 655, 658,
    662, 665, 669, 672, 676, 679, 683, 686,
};

void check_map(int64_t T, const int64_t* first) {
  const int64_t L = T * 441 / 128;
  std::vector<int64_t> src(static_cast<size_t>(L));
  for (int64_t j = 0; j < L; ++j) src[j] = kern::nearest_src_index(j, T, L);
  // Rebuild torch's map from the first-occurrence table: output j reads the last s with first[s] <= j.
  int64_t s = 0;
  for (int64_t j = 0; j < L; ++j) {
    while (s + 1 < T && first[s + 1] <= j) ++s;
    ASSERT_EQ(src[j], s) << "T=" << T << " L=" << L << " dst=" << j;
  }
}

TEST(KernelsResample, NearestIndexMatchesTorch) {
  check_map(1, first_T1);
  check_map(5, first_T5);
  check_map(150, first_T150);
  check_map(200, first_T200);
}

TEST(KernelsResample, NearestIndexSpecialCasesAndRef) {
  for (int64_t j = 0; j < 7; ++j) EXPECT_EQ(kern::nearest_src_index(j, 7, 7), j);
  for (int64_t j = 0; j < 14; ++j) EXPECT_EQ(kern::nearest_src_index(j, 7, 14), j >> 1);
  for (int64_t T = 1; T <= 300; T += 7)
    for (int64_t L : {T, 2 * T, T * 441 / 128, T + 1, 3 * T + 2})
      for (int64_t j = 0; j < L; ++j)
        ASSERT_EQ(kern::nearest_src_index(j, T, L), ref::nearest_src_index(j, T, L)) << T << " " << L << " " << j;
}

TEST(KernelsResample, InterpolateNearestMatchesRef) {
  Rng rng(51);
  for (auto [C, Lin, Lout] : {std::tuple<int64_t, int64_t, int64_t>{3, 5, 17}, {2, 1, 3}, {4, 150, 516}, {1, 9, 4}}) {
    std::vector<float> x = rng.vec(size_t(C * Lin), -1, 1), ref(size_t(C * Lout));
    Guarded y(1, C * Lout, C * Lout);
    kern::interpolate_nearest(x.data(), C, Lin, Lout, y.data());
    ref::interpolate_nearest(x.data(), C, Lin, Lout, ref.data());
    EXPECT_EQ(y.touched_outside(), 0);
    EXPECT_EQ(test::count_bit_diffs(y.data(), C * Lout, ref.data(), 1, C * Lout), 0) << C << " " << Lin << " " << Lout;
  }
}

TEST(KernelsResample, TransposeMatchesRef) {
  Rng rng(52);
  for (auto [rows, cols, ldx] : {std::tuple<int64_t, int64_t, int64_t>{7, 13, 16}, {1, 1, 1}, {70, 33, 40}, {33, 70, 70}}) {
    std::vector<float> x = rng.vec(size_t(rows * ldx), -1, 1), ref(size_t(rows * cols));
    Guarded y(1, rows * cols, rows * cols);
    kern::transpose_2d(x.data(), rows, cols, ldx, y.data());
    ref::transpose_2d(x.data(), rows, cols, ldx, ref.data());
    EXPECT_EQ(y.touched_outside(), 0);
    EXPECT_EQ(test::count_bit_diffs(y.data(), rows * cols, ref.data(), 1, rows * cols), 0) << rows << "x" << cols;
  }
}

}  // namespace
}  // namespace mm3
