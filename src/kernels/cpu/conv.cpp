// conv.cpp — kern::conv1d and kern::conv_transpose1d (kernels.h), the CPU backend.
//
// torch Conv1d / ConvTranspose1d semantics (zero padding, groups = 1; MODEL.md §3 step 5, §4.1 steps
// 2 and 9, §5.1). Stride-1 Conv1d and the ConvTranspose1d shapes ConvWeight::transpose_packable
// accepts pack the weight and run the direct kernel (conv_direct.cpp). The rest are lowered to the
// backend's own GEMM (gemm_nt.h), not OpenBLAS, whose sgemm bits change with the thread count
// (tests/unit/kernels_conv.cpp checks 1 vs 2 threads):
// * conv1d (stride > 1): im2col of a tile of output columns, col[(ci, k), t] =
//   x[ci, t*stride - pad + k*dilation], then y[:, tile] = W[Cout, Cin*K] @ col.
// * conv_transpose1d: cols[(co, k), t] = sum_ci W[ci, co, k] x[ci, t] for a tile of input columns
//   (W^T @ x), then col2im scatters cols into y[co, t*stride - pad + k].
// Tiles bound the scratch to ~4 MiB. Each output sums its full reduction inside one sgemm (conv1d:
// one sequential FMA chain over (ci, k), the direct kernel's order too) or in a fixed tile/tap order
// (conv_transpose1d), so results do not depend on the thread count. Bias is added to the fp32 sum,
// then one rounding. On these paths a fused Snake runs first into a scratch copy of x and a fused
// residual is added after the convolution (the same bits as the separate kernels).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/conv_detail.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

constexpr int64_t kScratchFloats = int64_t(1) << 20;  // 4 MiB

void bias_round(const ThreadPool& pool, float* y, int64_t Cout, int64_t Lout, const float* bias, DType store) {
  if (!bias && store != DType::BF16) return;
  pool.parallel_for(
      Cout,
      [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          float* yr = y + c * Lout;
          const float b = bias ? bias[c] : 0.f;
          if (bias)
            for (int64_t t = 0; t < Lout; ++t) yr[t] = round_store(yr[t] + b, store);
          else
            for (int64_t t = 0; t < Lout; ++t) yr[t] = round_bf16(yr[t]);
        }
      },
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, Lout)));
}

// Fallback-path fusions. Snake: returns x, or snake(x) in `buf`.
const float* fused_input(const float* x, int64_t Cin, int64_t L, const ConvFusion& f, DType store,
                         std::vector<float>& buf) {
  if (!f.snake_alpha) return x;
  buf.resize(static_cast<size_t>(Cin * L));
  snake(x, f.snake_alpha, buf.data(), Cin, L, store);
  return buf.data();
}

}  // namespace

void conv1d(const ThreadPool& pool, const float* x, int64_t Cin, int64_t L, const float* w, const float* bias,
            int64_t Cout, int K, int stride, int pad, int dilation, float* y, DType store, const ConvFusion& fusion) {
  MM3_CHECK(Cin > 0 && Cout > 0 && L > 0 && K > 0 && stride > 0 && pad >= 0 && dilation > 0,
            "conv1d: Cin={} Cout={} L={} K={} stride={} pad={} dilation={}", Cin, Cout, L, K, stride, pad, dilation);
  const int64_t Lout = conv1d_out_len(L, K, stride, pad, dilation);
  MM3_CHECK(Lout > 0, "conv1d: output length {} for L={} K={} stride={} pad={} dilation={}", Lout, L, K, stride,
            pad, dilation);
  if (stride == 1) {
    conv_packed(pool, ConvWeight::conv1d(w, bias, Cout, Cin, K, pad, dilation), x, L, y, store, fusion);
    return;
  }
  // The residual may be y itself: compute the convolution apart first.
  std::vector<float> xbuf, ybuf;
  x = fused_input(x, Cin, L, fusion, store, xbuf);
  float* yout = y;
  if (fusion.residual) {
    ybuf.resize(static_cast<size_t>(Cout * Lout));
    y = ybuf.data();
  }
  const int64_t CK = Cin * K;
  {
    const int64_t T = std::clamp<int64_t>(kScratchFloats / CK, 64, Lout);
    std::vector<float> col(static_cast<size_t>(CK * std::min(T, Lout)));
    for (int64_t t0 = 0; t0 < Lout; t0 += T) {
      const int64_t nt = std::min(T, Lout - t0);
      pool.parallel_for(
          CK,
          [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              const int64_t ci = r / K, kk = r % K;
              const float* xr = x + ci * L;
              float* cr = col.data() + r * nt;
              const int64_t base = t0 * stride - pad + kk * dilation;  // input index of column t0
              for (int64_t t = 0; t < nt; ++t) {
                const int64_t src = base + t * stride;
                cr[t] = (src >= 0 && src < L) ? xr[src] : 0.f;
              }
            }
          },
          std::max<int64_t>(1, 16384 / std::max<int64_t>(1, nt)));
      // y[:, t0:t0+nt] = W[Cout, CK] @ col[CK, nt]
      detail::gemm_ex(pool, w, CK, 1, Cout, col.data(), DType::F32, nt, true, nt, CK, nullptr, y + t0, Lout,
                      DType::F32, false);
    }
  }
  bias_round(pool, y, Cout, Lout, bias, store);
  if (fusion.residual) add(fusion.residual, y, yout, Cout * Lout, store);
}

void conv_transpose1d(const ThreadPool& pool, const float* x, int64_t Cin, int64_t L, const float* w,
                      const float* bias, int64_t Cout, int K, int stride, int pad, int output_padding, float* y,
                      DType store, const ConvFusion& fusion) {
  MM3_CHECK(Cin > 0 && Cout > 0 && L > 0 && K > 0 && stride > 0 && pad >= 0 && output_padding >= 0,
            "conv_transpose1d: Cin={} Cout={} L={} K={} stride={} pad={} output_padding={}", Cin, Cout, L, K, stride,
            pad, output_padding);
  const int64_t Lout = conv_transpose1d_out_len(L, K, stride, pad, output_padding);
  MM3_CHECK(Lout > 0, "conv_transpose1d: output length {} for L={} K={} stride={} pad={}", Lout, L, K, stride, pad);
  if (ConvWeight::transpose_packable(K, stride)) {
    conv_packed(pool, ConvWeight::conv_transpose1d(w, bias, Cin, Cout, K, stride, pad, output_padding), x, L, y,
                store, fusion);
    return;
  }
  std::vector<float> xbuf, ybuf;
  x = fused_input(x, Cin, L, fusion, store, xbuf);
  float* yout = y;
  if (fusion.residual) {
    ybuf.resize(static_cast<size_t>(Cout * Lout));
    y = ybuf.data();
  }
  const int64_t CoK = Cout * K;
  std::memset(y, 0, static_cast<size_t>(Cout * Lout) * sizeof(float));
  const int64_t T = std::clamp<int64_t>(kScratchFloats / CoK, 16, L);
  std::vector<float> cols(static_cast<size_t>(CoK * std::min(T, L)));
  for (int64_t t0 = 0; t0 < L; t0 += T) {
    const int64_t nt = std::min(T, L - t0);
    // cols[CoK, nt] = W^T @ x[:, t0:t0+nt], W viewed as [Cin, Cout*K].
    // A = W^T: element ((co, k), ci) sits at w[ci * CoK + co * K + k].
    detail::gemm_ex(pool, w, 1, CoK, CoK, x + t0, DType::F32, L, true, nt, Cin, nullptr, cols.data(), nt, DType::F32,
                    false);
    pool.parallel_for(
        Cout,
        [&](int64_t c0, int64_t c1) {
          for (int64_t co = c0; co < c1; ++co) {
            float* yr = y + co * Lout;
            for (int64_t kk = 0; kk < K; ++kk) {
              const float* cr = cols.data() + (co * K + kk) * nt;
              const int64_t base = t0 * stride - pad + kk;  // output index of input column t0
              // valid t: 0 <= base + t*stride < Lout
              int64_t tb = base >= 0 ? 0 : (-base + stride - 1) / stride;
              int64_t te = base >= Lout ? 0 : std::min<int64_t>(nt, (Lout - 1 - base) / stride + 1);
              for (int64_t t = tb; t < te; ++t) yr[base + t * stride] += cr[t];
            }
          }
        },
        std::max<int64_t>(1, 4096 / std::max<int64_t>(1, K * nt)));
  }
  bias_round(pool, y, Cout, Lout, bias, store);
  if (fusion.residual) add(fusion.residual, y, yout, Cout * Lout, store);
}

}  // namespace mm3::kern
