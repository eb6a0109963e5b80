// noise.h — the engine's own seeded Gaussian generator for the initial DiT noise (MODEL.md §4.5, §1.8).
//
// Bit-exact CUDA torch.randn is not reproducible on a CPU (MODEL.md §4.5), so the engine defines its own
// stream and tests inject the recorded noise instead. The stream is counter-based, hence identical for any
// thread count or machine:
//   for the flat element pair j (elements 2j and 2j+1 of the C-order tensor),
//     (x0, x1, x2, x3) = Philox4x32-10(counter = (j mod 2^32, j >> 32, 0, 0), key = (seed mod 2^32, seed >> 32)),
//     u1 = 1 − ((x0·2^32 + x1) >> 11)·2^−53  ∈ (0, 1],   u2 = ((x2·2^32 + x3) >> 11)·2^−53  ∈ [0, 1),
//     r = sqrt(−2·ln u1),  element 2j = f32(r·cos(2π·u2)),  element 2j+1 = f32(r·sin(2π·u2))   (Box–Muller, double).
// The per-window seed is derive_seed(request_seed, "dit", window_index) (MODEL.md §4.5, sampling/seed.h).
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace mm3 {

// One Philox4x32-10 block (Salmon et al., Random123).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Fills out[0..n) with the stream above, starting at flat element 0.
void gaussian_noise(uint64_t seed, float* out, int64_t n);
// [1, channels, length] F32 noise of one window.
Tensor window_noise(uint64_t seed, int64_t channels, int64_t length);

}  // namespace mm3
