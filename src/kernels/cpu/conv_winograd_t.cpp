// conv_winograd_t.cpp — kern::conv_winograd_t (kernels.h): a ConvTranspose1d with kernel 2s, stride s and
// padding below s (the vocoder's upsampling convs, s = 8, 8, 4, 2) as Winograd F(3,2), for fp32 compute.
//
// Output t of such a layer has phase l = (t + pad) mod s and reads two inputs: with i = (t + pad − l) / s,
//     y[t] = A_l x[i] + B_l x[i − 1],   A_l = w[:, :, l], B_l = w[:, :, l + s]   ([Cout, Cin] matrices)
// (torch weight w [Cin, Cout, 2s]). Per phase that is a 2-tap correlation along i, so three outputs of a
// phase, at i0 = 3n + j for j < 3 (tile n), take 4 products over the input channels instead of 6
// (Winograd's minimal filtering at the points 0, 1, −1, ∞), with d_j = x[3n − 1 + j]:
//     U_0 = d0 − d2   U_1 = d1 + d2   U_2 = d2 − d1   U_3 = d3 − d1          (input transform)
//     Gw_0 = B_l      Gw_1 = (B_l + A_l)/2   Gw_2 = (B_l − A_l)/2   Gw_3 = A_l   (weights, at load, in double)
//     m_p = Gw_p · U_p
//     y_0 = (m_0 + m_1) + m_2   y_1 = m_1 − m_2   y_2 = (m_1 + m_2) + m_3      (output transform)
// (y_0 = B d0 + A d1, y_1 = B d1 + A d2, y_2 = B d2 + A d3 exactly.) Over the s phases the products
// share their U, so each point p is one one-tap product with the [s·Cout, Cin] weight whose row co·s + l
// is phase l's Gw_p[co, ·]: 4·s·Cout·Cin multiply-adds per three input positions where the direct kernel
// does 6·s·Cout·Cin, a third fewer.
//
// Tiles and work split. Tile n covers inputs i = 3n .. 3n + 2, so every input transform reads the task's
// (Snake'd, zero-padded) input deinterleaved into three rows R_r[k] = x[3(n0 − 1 + k) + r], where n0 is
// the task's first tile: d0 = R_2[k], d1 = R_0[k + 1], d2 = R_1[k + 1], d3 = R_2[k + 1] for tile n0 + k.
// A task is a run of whole 64-tile strips taken by whichever thread is free. Per strip: U_p for every
// point (all input channels), then per group of output channels (96 weight rows: the products' V stays
// in L2) the four products (conv_detail.h conv_onetap_strip, chunks of 64 input channels as in
// conv_winograd.cpp) and the output transform, whose 3·s values per tile and channel are contiguous
// outputs t = s·(3n + j) − pad + l.
//
// Numerics. Not the direct kernel's bits: the transforms add a rounding on each side and the products
// sum their input channels in chunks of 64. Every coefficient is ±1 or 1/2, so the error stays near
// the direct kernel's (tests/unit/kernels_conv_winograd_t.cpp measures both against an exact sum).
// Bits depend neither on the thread count nor on the ISA path. Store BF16 ignores the form;
// MM3_CONV_WINOGRAD=0 turns it off (with conv_winograd's).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/conv_detail.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

constexpr int kPts = 4;                           // products per tile and phase
constexpr int kOut = 3;                           // outputs per tile and phase
constexpr int64_t kStrip = 64;                    // tiles per strip: the products' register tile width
constexpr int64_t kChunk = 64;                    // input channels per FMA chain of a product
constexpr int64_t kGroupRows = 96;                // weight rows (channel, phase) per product group
constexpr int64_t kTaskBytes = int64_t(2) << 20;  // a task's R rows

struct WinoTForm {
  int64_t group_channels = 0;   // output channels per group: kGroupRows / s (at least 1)
  std::vector<ConvWeight> pts;  // [group][point]: one-tap [(co − group's first)·s + l, Cin], no bias
  std::vector<float> bias;      // [Cout], empty without
};

#pragma GCC diagnostic ignored "-Wpsabi"
typedef float v16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

// Row q < 3 of the stride-3 deinterleave of 48 consecutive floats a|b|c: lanes i = 3i + q. Two
// two-source shuffles (vpermt2ps with AVX-512): the lanes from a|b, then those from c.
typedef int32_t i16v __attribute__((vector_size(64)));
template <int Q>
inline v16 deinterleave3(v16 a, v16 b, v16 c) {
  constexpr int from_ab = (32 - Q + 2) / 3;  // lanes whose source 3i + Q lies in a|b
  i16v m1, m2;
  for (int i = 0; i < 16; ++i) {
    m1[i] = i < from_ab ? 3 * i + Q : 0;
    m2[i] = i < from_ab ? i : 16 + 3 * i + Q - 32;
  }
  return __builtin_shuffle(__builtin_shuffle(a, b, m1), c, m2);
}

// Tiles per task: whole strips, the task's R rows (3·Cin floats per tile) about kTaskBytes, and at
// least 4 tasks per thread where the layer is long enough.
int64_t task_tiles(int64_t Cin, int64_t ntiles, int workers) {
  const int64_t by_size = std::clamp<int64_t>(kTaskBytes / (int64_t(sizeof(float)) * kOut * Cin), kStrip, 4096);
  const int64_t by_balance = (ntiles + 4 * workers - 1) / (4 * workers);
  const int64_t t = std::min(by_size, std::max(by_balance, kStrip));
  return std::max<int64_t>(1, (t + kStrip / 2) / kStrip) * kStrip;
}

}  // namespace

ConvWeight conv_winograd_t(const ConvWeight& w) {
  MM3_CHECK(!w.empty(), "conv_winograd_t on an empty weight");
  if (!detail::winograd_enabled() || !w.transposed()) return w;
  const int s = w.stride();
  if (w.kernel_size() != 2 * s || w.pad() >= s || w.output_padding() != 0) return w;
  const int64_t Cin = w.in_channels(), Cout = w.out_channels();
  std::vector<float> wt, bias;
  detail::conv_unpack(w, wt, bias);  // [Cin, Cout, 2s]
  if (wt.empty()) return w;
  auto f = std::make_shared<WinoTForm>();
  f->group_channels = std::max<int64_t>(1, kGroupRows / s);
  for (int64_t co0 = 0; co0 < Cout; co0 += f->group_channels) {
    const int64_t gc = std::min(f->group_channels, Cout - co0), rows = gc * s;
    std::vector<float> wp(static_cast<size_t>(kPts * rows * Cin));  // [point][row][Cin]
    for (int64_t c = 0; c < gc; ++c)
      for (int64_t ci = 0; ci < Cin; ++ci) {
        const float* src = wt.data() + (ci * Cout + co0 + c) * 2 * s;  // taps l (A) and l + s (B)
        for (int l = 0; l < s; ++l) {
          const double a = src[l], b = src[l + s];
          float* dst = wp.data() + (c * s + l) * Cin + ci;
          dst[0] = static_cast<float>(b);
          dst[rows * Cin] = static_cast<float>((b + a) / 2);
          dst[2 * rows * Cin] = static_cast<float>((b - a) / 2);
          dst[3 * rows * Cin] = static_cast<float>(a);
        }
      }
    for (int p = 0; p < kPts; ++p)
      f->pts.push_back(ConvWeight::conv1d(wp.data() + p * rows * Cin, nullptr, rows, Cin, 1, 0, 1));
  }
  f->bias = std::move(bias);
  ConvWeight r = w;
  r.winograd = std::move(f);
  return r;
}

namespace detail {

void winograd_t_run(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y,
                    const ConvFusion& fusion) {
  const WinoTForm& f = *static_cast<const WinoTForm*>(cw.winograd.get());
  const int64_t Cin = cw.in_channels(), Cout = cw.out_channels(), Lout = cw.out_len(L);
  const int64_t s = cw.stride(), pad = cw.pad();
  const int64_t ntiles = ((Lout - 1 + pad) / s) / kOut + 1;  // inputs i = 0 .. (Lout − 1 + pad) / s
  const int64_t tpt = task_tiles(Cin, ntiles, pool.size());
  const int64_t n_tasks = (ntiles + tpt - 1) / tpt;
  const int64_t gch = f.group_channels, ngroups = (Cout + gch - 1) / gch;
  std::vector<float> inv;
  if (fusion.snake_alpha) {
    inv.resize(static_cast<size_t>(Cin));
    for (int64_t c = 0; c < Cin; ++c) inv[static_cast<size_t>(c)] = snake_inv(fusion.snake_alpha[c], DType::F32);
  }
  const float* bias = f.bias.empty() ? nullptr : f.bias.data();
  // R rows: one column before the task's first tile (its d0), then through the last strip's 64th.
  const int64_t rl_max = tpt + 1;
  std::atomic<int64_t> next{0};
  pool.parallel_for(std::min<int64_t>(pool.size(), n_tasks), [&](int64_t, int64_t) {
    thread_local aligned_vector<float> R, U, V, seg, O, T;
    auto grow = [](aligned_vector<float>& v, int64_t n) {
      if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    };
    grow(R, Cin * kOut * rl_max);
    grow(U, kPts * Cin * kStrip);
    grow(V, kPts * gch * s * kStrip);
    grow(seg, kOut * rl_max);
    grow(O, kOut * s * kStrip);
    grow(T, kOut * s * kStrip);
    for (int64_t task; (task = next.fetch_add(1)) < n_tasks;) {
      const int64_t n0 = task * tpt, n = std::min(tpt, ntiles - n0);
      const int64_t rowlen = (n + kStrip - 1) / kStrip * kStrip + 1;
      const int64_t lo = kOut * (n0 - 1), len = kOut * rowlen;  // input positions [lo, lo + len)
      const int64_t a = std::clamp<int64_t>(-lo, 0, len), b = std::clamp<int64_t>(L - lo, a, len);
      // 1. R[ci][r][k] = (Snake'd, zero-padded) x[ci, lo + 3k + r].
      for (int64_t ci = 0; ci < Cin; ++ci) {
        float* sg = seg.data();
        std::fill(sg, sg + a, 0.f);
        if (b > a) {
          if (fusion.snake_alpha)
            snake_row(x + ci * L + lo + a, fusion.snake_alpha[ci], inv[static_cast<size_t>(ci)], sg + a, b - a,
                      DType::F32);
          else
            std::memcpy(sg + a, x + ci * L + lo + a, static_cast<size_t>(b - a) * sizeof(float));
        }
        std::fill(sg + b, sg + len, 0.f);
        float* r = R.data() + ci * kOut * rowlen;
        int64_t k = 0;
        for (; k + 16 <= rowlen; k += 16) {
          const v16 va = load16(sg + kOut * k), vb = load16(sg + kOut * k + 16), vc = load16(sg + kOut * k + 32);
          store16(r + k, deinterleave3<0>(va, vb, vc));
          store16(r + rowlen + k, deinterleave3<1>(va, vb, vc));
          store16(r + 2 * rowlen + k, deinterleave3<2>(va, vb, vc));
        }
        for (; k < rowlen; ++k)
          for (int q = 0; q < kOut; ++q) r[q * rowlen + k] = sg[kOut * k + q];
      }
      // 2. Strips of 64 tiles: U for every point, then per channel group the products and y.
      for (int64_t s0 = 0; s0 < n; s0 += kStrip) {
        const int cols = static_cast<int>(std::min<int64_t>(kStrip, n - s0));
        for (int64_t ci = 0; ci < Cin; ++ci) {
          const float* r = R.data() + ci * kOut * rowlen + s0;
          const float *r0 = r + 1, *r1 = r + rowlen + 1, *r2 = r + 2 * rowlen;  // d1, d2, d0 (d3 = r2 + 1)
          float* u = U.data() + ci * kStrip;
          for (int k = 0; k < kStrip; k += 16) {
            const v16 d0 = load16(r2 + k), d1 = load16(r0 + k), d2 = load16(r1 + k), d3 = load16(r2 + 1 + k);
            store16(u + k, d0 - d2);
            store16(u + Cin * kStrip + k, d1 + d2);
            store16(u + 2 * Cin * kStrip + k, d2 - d1);
            store16(u + 3 * Cin * kStrip + k, d3 - d1);
          }
        }
        for (int64_t g = 0; g < ngroups; ++g) {
          const int64_t co0 = g * gch, gc = std::min(gch, Cout - co0), rows = gc * s;
          for (int p = 0; p < kPts; ++p)
            conv_onetap_strip(f.pts[static_cast<size_t>(g * kPts + p)], U.data() + p * Cin * kStrip, kStrip, cols,
                              V.data() + p * rows * kStrip, kStrip, kChunk);
          for (int64_t c = 0; c < gc; ++c) {
            // O[j][l][k]: output j of phase l of tile s0 + k.
            for (int64_t l = 0; l < s; ++l) {
              const float* v = V.data() + (c * s + l) * kStrip;
              const int64_t vp = rows * kStrip;  // point stride
              for (int k = 0; k < kStrip; k += 16) {
                const v16 m0 = load16(v + k), m1 = load16(v + vp + k), m2 = load16(v + 2 * vp + k),
                          m3 = load16(v + 3 * vp + k);
                store16(O.data() + (0 * s + l) * kStrip + k, (m0 + m1) + m2);
                store16(O.data() + (1 * s + l) * kStrip + k, m1 - m2);
                store16(O.data() + (2 * s + l) * kStrip + k, (m1 + m2) + m3);
              }
            }
            // The strip's outputs of channel co are contiguous: t = base + p, p = 3s·k + j·s + l, so
            // T[p] = O[j][l][k] is a transpose; then + bias and the residual 16 at a time.
            const int64_t co = co0 + c, w3 = kOut * s, base = w3 * (n0 + s0) - pad;
            for (int k = 0; k < cols; ++k)
              for (int64_t q = 0; q < w3; ++q)
                T[static_cast<size_t>(k * w3 + q)] = O[static_cast<size_t>(q * kStrip + k)];
            const float bc = bias ? bias[co] : 0.f;
            float* yr = y + co * Lout;
            const float* res = fusion.residual ? fusion.residual + co * Lout : nullptr;
            int64_t p = std::max<int64_t>(0, -base);  // T[p] is output base + p
            const int64_t pe = std::min<int64_t>(w3 * cols, Lout - base);
            for (; p + 16 <= pe; p += 16) {
              v16 v = load16(T.data() + p);
              if (bias) v = v + bc;
              if (res) v = load16(res + base + p) + v;
              store16(yr + base + p, v);
            }
            for (; p < pe; ++p) {
              float val = T[static_cast<size_t>(p)];
              if (bias) val = val + bc;
              if (res) val = res[base + p] + val;
              yr[base + p] = val;
            }
          }
        }
      }
    }
  });
}

}  // namespace detail

}  // namespace mm3::kern
