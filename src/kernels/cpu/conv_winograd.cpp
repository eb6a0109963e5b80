// conv_winograd.cpp — kern::conv_winograd (kernels.h): a stride-1, 7-tap Conv1d (any dilation d,
// padding 3d: the vocoder's conv_in and residual-unit conv1) as Winograd F(4,7), for fp32 compute.
//
// Four outputs y[t + e·d], e < 4, of a 7-tap filter g read the 10 inputs x[t + (i−3)d], i < 10.
// Winograd's minimal filtering algorithm (Toom-Cook at the points 0, ±1, ±2, ±1/2, ±3/2 and ∞)
// computes them with 10 products instead of 28:
//     (y[t + e·d])_e = AT · [ (G g) ⊙ (BT x) ],
// BT 10×10, G 10×7, AT 4×10 (built below in double). Over channels the products become 10 independent
// matrix products, one per point p: V_p[co, n] = sum_ci Gw_p[co, ci] · U_p[ci, n], where U_p = BT_p x
// (the input transform of tile n, per input channel) and Gw_p = G_p g (the weights, transformed once
// at load). 2.8× fewer multiply-adds than the direct kernel, plus transforms that cost O(Cin + Cout)
// per tile against the products' O(Cin·Cout).
//
// Tiles. Outputs go in blocks of 4d: block b holds t = 4db + j + e·d for j < d, e < 4; tile k = b·d + j.
// Seen from a task's first block b0, input i = 4q + r of tile k is H_r[k + q·d], where the H_r are the
// task's (Snake'd, zero-padded) input deinterleaved by runs of d: H_r[b'·d + j] =
// x[4d(b0 + b') + r·d + j − 3d]. So every input transform is a sum of shifted contiguous rows.
//
// Work split: a task is a run of blocks, taken by whichever thread is free; it builds its H rows (all
// input channels), then goes through its tiles in strips of 64 (the direct kernel's register tile
// width): per point, U_p of the strip, then V_p by the direct kernel's one-tap tiles
// (conv_onetap_strip), then the output transform of the strip into y. One synchronisation per call.
//
// Numerics. Not the direct kernel's bits: the transforms add rounding, and the cancellation in AT
// amplifies the products' rounding. To keep the error near the direct kernel's, each V_p sums its input
// channels in chunks of 64 (each chunk one FMA chain from 0, the chunks added in order) instead of one
// chain. Measured (rel RMS against an fp64 evaluation): one 192-channel layer 4.2e-6 with chunks, 5.0e-6
// without, the direct kernel 6.5e-7; the whole full-size vocoder (random weights, L = 120) 1.75e-5
// (4.9e-5 unchunked; the direct kernel 8.2e-6, torch's fp32 2.3e-6; F(2,7) chunked 6.2e-6 but ~1.2 s
// slower per window); the golden vocoder cases (vocoder_crosscheck.py) 3.0e-7 against a rule of 1e-5.
// The transforms are fixed sequences of fp32 multiplies and adds, so bits depend neither on the thread
// count nor on the ISA path. Store BF16 ignores the form (it would round the transformed values);
// MM3_CONV_WINOGRAD=0 turns it off.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "kernels/cpu/conv_detail.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

constexpr int kTaps = 7;
constexpr int kM = 4;                             // outputs per tile
constexpr int kPts = kM + kTaps - 1;              // points (products per tile)
constexpr int64_t kStrip = 64;                    // tiles per strip: the direct kernel's tile width
constexpr int64_t kChunk = 64;                    // input channels per FMA chain of a product (see Numerics)
constexpr int64_t kTaskBytes = int64_t(2) << 20;  // a task's H rows

// F(4,7) at the finite points below plus ∞, from Toom-Cook. BT's rows are scaled so their smallest
// entry is ±1, times the least integer that makes every entry a multiple of 1/256 (rows with ninths
// become integers); the scale moves into G, applied in double at load. So every BT and AT entry is
// exact in fp32.
struct Transform {
  float BT[kPts][kPts] = {};   // [point][input]
  float AT[kM][kPts] = {};     // [output][point]
  double G[kPts][kTaps] = {};  // [point][tap]
};

Transform make_transform() {
  static const double a[kPts - 1] = {0, 1, -1, 2, -2, 0.5, -0.5, 1.5, -1.5};
  constexpr int f = kPts - 1;  // finite points
  Transform T;
  double C[kPts][kPts] = {};  // [coefficient][point]: Lagrange bases of the finite points; M(z) for ∞
  for (int j = 0; j < f; ++j) {
    double poly[kPts] = {1}, den = 1;
    int deg = 0;
    for (int k = 0; k < f; ++k) {
      if (k == j) continue;
      for (int i = deg + 1; i > 0; --i) poly[i] = poly[i - 1] - a[k] * poly[i];
      poly[0] = -a[k] * poly[0];
      ++deg;
      den *= a[j] - a[k];
    }
    for (int i = 0; i <= deg; ++i) C[i][j] = poly[i] / den;
  }
  {
    double poly[kPts] = {1};
    for (int k = 0; k < f; ++k) {
      for (int i = k + 1; i > 0; --i) poly[i] = poly[i - 1] - a[k] * poly[i];
      poly[0] = -a[k] * poly[0];
    }
    for (int i = 0; i < kPts; ++i) C[i][f] = poly[i];
  }
  for (int p = 0; p < kPts; ++p) {
    double s = 0;  // smallest entry, then divided by the least q making every entry a multiple of 1/256
    for (int i = 0; i < kPts; ++i)
      if (C[i][p] != 0 && (s == 0 || std::fabs(C[i][p]) < s)) s = std::fabs(C[i][p]);
    for (int q = 1; q <= 64; ++q) {
      bool exact = true;
      for (int i = 0; i < kPts; ++i) {
        const double v = C[i][p] / s * q * 256;
        exact = exact && std::fabs(v - std::nearbyint(v)) < 1e-6;
      }
      if (exact) {
        s /= q;
        break;
      }
    }
    for (int i = 0; i < kPts; ++i) T.BT[p][i] = static_cast<float>(std::nearbyint(C[i][p] / s * 256) / 256);
    for (int k = 0; k < kTaps; ++k) T.G[p][k] = (p < f ? std::pow(a[p], k) : (k == kTaps - 1 ? 1.0 : 0.0)) * s;
  }
  for (int e = 0; e < kM; ++e)
    for (int p = 0; p < kPts; ++p) T.AT[e][p] = static_cast<float>(p < f ? std::pow(a[p], e) : (e == kM - 1 ? 1 : 0));
  return T;
}

const Transform& transform() {
  static const Transform t = make_transform();
  return t;
}

struct WinoForm {
  std::vector<ConvWeight> pts;  // one-tap [Cout, Cin] weight of each point (G applied), no bias
  std::vector<float> bias;      // [Cout], empty without
};

bool winograd_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MM3_CONV_WINOGRAD");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

// Blocks (of 4d outputs) per task: the task's H rows (4·Cin floats per tile) about kTaskBytes, and at
// least 4 tasks per thread where the layer is long enough (balance on a shared host).
int64_t task_blocks(int64_t Cin, int64_t d, int64_t nblocks, int workers) {
  const int64_t tiles = std::clamp<int64_t>(kTaskBytes / (4 * kM * Cin), 64, 4096);
  const int64_t by_size = std::max<int64_t>(1, tiles / d);
  const int64_t by_balance = std::max<int64_t>(1, (nblocks + 4 * workers - 1) / (4 * workers));
  return std::min(by_size, std::max<int64_t>(by_balance, std::max<int64_t>(1, 64 / d)));
}

}  // namespace

ConvWeight conv_winograd(const ConvWeight& w) {
  MM3_CHECK(!w.empty(), "conv_winograd on an empty weight");
  if (!winograd_enabled() || w.transposed() || w.kernel_size() != kTaps || w.pad() != 3 * w.dilation()) return w;
  const int64_t Cin = w.in_channels(), Cout = w.out_channels();
  std::vector<float> wt, bias;
  detail::conv_unpack(w, wt, bias);  // [Cout, Cin, 7]
  auto f = std::make_shared<WinoForm>();
  const Transform& T = transform();
  std::vector<float> wp(static_cast<size_t>(Cout * Cin));
  for (int p = 0; p < kPts; ++p) {
    for (int64_t i = 0; i < Cout * Cin; ++i) {
      double s = 0;
      for (int k = 0; k < kTaps; ++k) s += T.G[p][k] * double(wt[static_cast<size_t>(i * kTaps + k)]);
      wp[static_cast<size_t>(i)] = static_cast<float>(s);
    }
    f->pts.push_back(ConvWeight::conv1d(wp.data(), nullptr, Cout, Cin, 1, 0, 1));
  }
  f->bias = std::move(bias);
  ConvWeight r = w;
  r.winograd = std::move(f);
  return r;
}

namespace detail {

void winograd_run(const ThreadPool& pool, const ConvWeight& cw, const float* x, int64_t L, float* y,
                  const ConvFusion& fusion) {
  const WinoForm& f = *static_cast<const WinoForm*>(cw.winograd.get());
  const Transform& T = transform();
  constexpr int m = kM, np = kPts, qmax = (np - 1) / m;
  const int64_t Cin = cw.in_channels(), Cout = cw.out_channels();
  const int64_t D = cw.dilation(), MD = m * D, nblocks = (L + MD - 1) / MD;
  const int64_t bpt = task_blocks(Cin, D, nblocks, pool.size());
  const int64_t n_tasks = (nblocks + bpt - 1) / bpt;
  std::vector<float> inv;
  if (fusion.snake_alpha) {
    inv.resize(static_cast<size_t>(Cin));
    for (int64_t c = 0; c < Cin; ++c) inv[static_cast<size_t>(c)] = snake_inv(fusion.snake_alpha[c], DType::F32);
  }
  const float* bias = f.bias.empty() ? nullptr : f.bias.data();
  // Rows of H (one phase of one channel): the task's tiles rounded up to whole strips, plus the
  // reach of the last input (qmax·d), so a strip's 64 columns are always readable (zeros past the end).
  auto row_len = [&](int64_t n) { return (n + kStrip - 1) / kStrip * kStrip + (qmax + 1) * D; };
  std::atomic<int64_t> next{0};
  pool.parallel_for(std::min<int64_t>(pool.size(), n_tasks), [&](int64_t, int64_t) {
    thread_local aligned_vector<float> H, U, V, seg;
    auto grow = [](aligned_vector<float>& v, int64_t n) {
      if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    };
    const int64_t rl_max = row_len(bpt * D);
    grow(H, Cin * m * rl_max);
    grow(U, Cin * kStrip);
    grow(V, np * Cout * kStrip);
    grow(seg, (rl_max / D + 1) * MD);
    for (int64_t task; (task = next.fetch_add(1)) < n_tasks;) {
      const int64_t b0 = task * bpt, nb = std::min(bpt, nblocks - b0), n = nb * D;
      const int64_t rowlen = row_len(n);
      const int64_t lo = MD * b0 - 3 * D, len = (rowlen / D + 1) * MD;  // input positions [lo, lo + len)
      const int64_t a = std::clamp<int64_t>(-lo, 0, len), b = std::clamp<int64_t>(L - lo, a, len);
      // 1. H[ci][r][k] = (Snake'd, zero-padded) x[ci, lo + m·d·(k / d) + r·d + k % d]: input i = m·q + r of
      //    tile k is H[ci][r][k + q·d].
      for (int64_t ci = 0; ci < Cin; ++ci) {
        float* s = seg.data();
        std::fill(s, s + a, 0.f);
        if (b > a) {
          if (fusion.snake_alpha)
            snake_row(x + ci * L + lo + a, fusion.snake_alpha[ci], inv[static_cast<size_t>(ci)], s + a, b - a,
                      DType::F32);
          else
            std::memcpy(s + a, x + ci * L + lo + a, static_cast<size_t>(b - a) * sizeof(float));
        }
        std::fill(s + b, s + len, 0.f);
        float* h = H.data() + ci * m * rowlen;
        if (D == 1) {
          for (int r = 0; r < m; ++r)
            for (int64_t k = 0; k < rowlen; ++k) h[r * rowlen + k] = s[k * m + r];
        } else {
          for (int64_t bb = 0; bb * D < rowlen; ++bb)
            for (int r = 0; r < m; ++r)
              for (int64_t j = 0; j < D && bb * D + j < rowlen; ++j)
                h[r * rowlen + bb * D + j] = s[bb * MD + r * D + j];
        }
      }
      // 2. Strips of 64 tiles: per point U = BT_p · inputs, V_p = Gw_p · U (the direct kernel's tiles);
      //    then y = AT · V (+ bias, + residual), back to interleaved positions.
      for (int64_t s0 = 0; s0 < n; s0 += kStrip) {
        const int cols = static_cast<int>(std::min<int64_t>(kStrip, n - s0));
        for (int p = 0; p < np; ++p) {
          for (int64_t ci = 0; ci < Cin; ++ci) {
            const float* h = H.data() + ci * m * rowlen + s0;
            float* u = U.data() + ci * kStrip;
            bool first = true;
            for (int i = 0; i < np; ++i) {
              const float c = T.BT[p][i];
              if (c == 0.f) continue;
              const float* r = h + (i % m) * rowlen + (i / m) * D;
              if (first)
                for (int k = 0; k < kStrip; ++k) u[k] = c * r[k];
              else
                for (int k = 0; k < kStrip; ++k) u[k] = u[k] + c * r[k];
              first = false;
            }
          }
          conv_onetap_strip(f.pts[static_cast<size_t>(p)], U.data(), kStrip, cols, V.data() + p * Cout * kStrip, kStrip,
                            kChunk);
        }
        for (int64_t co = 0; co < Cout; ++co) {
          const float bc = bias ? bias[co] : 0.f;
          float* yr = y + co * L;
          const float* res = fusion.residual ? fusion.residual + co * L : nullptr;
          for (int e = 0; e < m; ++e) {
            float out[kStrip];
            bool first = true;
            for (int p = 0; p < np; ++p) {
              const float c = T.AT[e][p];
              if (c == 0.f) continue;
              const float* v = V.data() + (p * Cout + co) * kStrip;
              if (first)
                for (int k = 0; k < kStrip; ++k) out[k] = c * v[k];
              else
                for (int k = 0; k < kStrip; ++k) out[k] = out[k] + c * v[k];
              first = false;
            }
            int64_t t = MD * (b0 + s0 / D) + e * D + s0 % D, j = s0 % D;  // tile s0's output e
            for (int k = 0; k < cols; ++k) {
              if (t < L) {
                float val = out[k];
                if (bias) val = val + bc;
                if (res) val = res[t] + val;
                yr[t] = val;
              }
              if (++j == D) {
                j = 0;
                t += MD - D + 1;
              } else {
                ++t;
              }
            }
          }
        }
      }
    }
  });
}

}  // namespace detail

}  // namespace mm3::kern
