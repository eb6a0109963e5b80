// noise.cpp — Philox4x32-10 + Box–Muller Gaussian stream (noise.h; MODEL.md §4.5). No kernels.
#include "diffusion/noise.h"

#include <cmath>
#include <numbers>

namespace mm3 {

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // multipliers
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += W0;
    k[1] += W1;
  }
  return c;
}

void gaussian_noise(uint64_t seed, float* out, int64_t n) {
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  constexpr double k53 = 1.0 / 9007199254740992.0;  // 2^-53
  for (int64_t j = 0; 2 * j < n; ++j) {
    const uint64_t uj = static_cast<uint64_t>(j);
    const auto x = philox4x32_10({static_cast<uint32_t>(uj), static_cast<uint32_t>(uj >> 32), 0u, 0u}, key);
    const uint64_t a = (static_cast<uint64_t>(x[0]) << 32) | x[1];
    const uint64_t b = (static_cast<uint64_t>(x[2]) << 32) | x[3];
    const double u1 = 1.0 - static_cast<double>(a >> 11) * k53;  // (0, 1]: log never sees 0
    const double u2 = static_cast<double>(b >> 11) * k53;        // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double th = kTwoPi * u2;
    out[2 * j] = static_cast<float>(r * std::cos(th));
    if (2 * j + 1 < n) out[2 * j + 1] = static_cast<float>(r * std::sin(th));
  }
}

Tensor window_noise(uint64_t seed, int64_t channels, int64_t length) {
  Tensor t = Tensor::empty(DType::F32, {1, channels, length});
  gaussian_noise(seed, t.data<float>(), t.numel());
  return t;
}

}  // namespace mm3
