// gemm_strassen.cpp — kern::gemm_strassen_f32 (kernels.h): an fp32 GEMM weight held as one level of
// Strassen's scheme, and `linear` on it (detail::strassen_linear).
//
// y = x W^T with x [M, K], W [N, K]. Split x into row halves (t, b) and column halves (1, 2), and W
// into row halves (output halves 1, 2) and column halves: x_t1 = x[top, :K/2], W_21 = W[N/2:, :K/2],
// and so on. With B = W^T the textbook quadrants are B11 = W_11^T, B12 = W_21^T, B21 = W_12^T,
// B22 = W_22^T, and Strassen's seven products P_c = a_c · w_c^T (each [M/2, K/2] x [K/2, N/2]) are
//   c  a_c (built per call)       w_c (built once, packed by gemm_only_f32)
//   0  x_t1 + x_b2                 W_11 + W_22
//   1  x_b1 + x_b2                 W_11
//   2  x_t1                        W_21 - W_22
//   3  x_b2                        W_12 - W_11
//   4  x_t1 + x_t2                 W_22
//   5  x_b1 - x_t1                 W_11 + W_21
//   6  x_t2 - x_b2                 W_12 + W_22
// and y_t1 = ((P0 + P3) - P4) + P6, y_t2 = P2 + P4, y_b1 = P1 + P3, y_b2 = ((P0 - P1) + P2) + P5 (these
// orders, then + bias, rounded once to `store`). 7 GEMMs of 1/8 the work instead of 8: measured on
// 2 Zen 5 cores with oneDNN's fp32 brgemm under each product (a standalone harness, M = 1380, medians
// of 7, including the combination passes): [16384, 2048] 242-253 -> 222-230 ms, [2048, 8192]
// 120-125 -> 111-115 ms (8-10% faster), [6144, 2048] 4%, [2048, 2048] 5%. The products' x halves are
// copied to contiguous buffers: oneDNN's matmul on a row stride of K instead of K/2 ran 3.5x slower
// (gemm_dnnl.cpp: the packed weights reordered on every call). Inside the DiT's batch-2 fp32 forward
// (dit_forward_L689_b2, MM3_STRASSEN=1 against 0, 2 + 2 alternating processes) the gain shrinks to
// 2-3%: 18.07 / 18.28 s against 18.64 s, 19.96 / 19.88 against 20.23 / 20.59 s. The passes here that
// add x's blocks and combine the products stream ~15 GB a forward (perf: 2.1% of its samples), and
// the products run at M = 690 where the plain GEMMs run at 1380.
//
// Numerics: the same product in another association. The sums and differences of x and W blocks are
// rounded once each, so the error bound grows by a small constant factor over a plain fp32 GEMM's
// (random data, K = 2048-8192: rel RMS 0.8-1.2e-6 against 5.8e-7 for oneDNN's plain GEMM; the
// reference GPU run uses TF32, ~1e-3). The cost: the seven [N/2, K/2] weights take 7/4 of the plain
// weight's memory, and each call needs scratch for 7 x halves and 7 products (thread-local, kept).
// An odd M pads the bottom half with a zero row (its outputs are not written).
#include <algorithm>
#include <memory>

#include "core/aligned.h"
#include "core/errors.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

struct StrassenForm {
  LinearWeight w[7];  // [N/2, K/2] each, gemm_only_f32 forms, no bias
};

}  // namespace

LinearWeight gemm_strassen_f32(const LinearWeight& w, const ThreadPool& pool, bool onednn) {
  MM3_CHECK(!w.quantized() && !w.gemm_form() && w.weight().ndim() == 2 && w.weight().dtype() == DType::F32,
            "gemm_strassen_f32: needs a plain F32 weight");
  const int64_t N = w.out_features(), K = w.in_features();
  if (N % 2 != 0 || K % 2 != 0) return gemm_only_f32(w, pool, onednn);
  const int64_t n = N / 2, k = K / 2;
  const Tensor plain = w.weight().contiguous();
  const float* W = static_cast<const float*>(plain.raw());
  auto f = std::make_shared<StrassenForm>();
  size_t bytes = 0;
  for (int c = 0; c < 7; ++c) {
    Tensor t = Tensor::empty(DType::F32, {n, k});
    float* dst = static_cast<float*>(t.raw());
    pool.parallel_for(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* w11 = W + r * K;        // W_11 row r: output r, inputs [0, k)
        const float* w12 = w11 + k;          // W_12
        const float* w21 = W + (n + r) * K;  // W_21: output n + r
        const float* w22 = w21 + k;          // W_22
        float* d = dst + r * k;
        switch (c) {
          case 0:
            for (int64_t j = 0; j < k; ++j) d[j] = w11[j] + w22[j];
            break;
          case 1:
            std::copy(w11, w11 + k, d);
            break;
          case 2:
            for (int64_t j = 0; j < k; ++j) d[j] = w21[j] - w22[j];
            break;
          case 3:
            for (int64_t j = 0; j < k; ++j) d[j] = w12[j] - w11[j];
            break;
          case 4:
            std::copy(w22, w22 + k, d);
            break;
          case 5:
            for (int64_t j = 0; j < k; ++j) d[j] = w11[j] + w21[j];
            break;
          default:
            for (int64_t j = 0; j < k; ++j) d[j] = w12[j] + w22[j];
            break;
        }
      }
    });
    f->w[c] = gemm_only_f32(LinearWeight(std::move(t)), pool, onednn);
    bytes += f->w[c].weight_bytes();
  }
  return LinearWeight(N, K, std::move(f), bytes, w.has_bias() ? w.bias() : Tensor(), GemmKind::F32Strassen);
}

namespace detail {

void strassen_linear(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y,
                     int64_t ldy, DType store) {
  const auto* f = static_cast<const StrassenForm*>(w.gemm_form());
  const int64_t N = w.out_features(), K = w.in_features(), n = N / 2, k = K / 2;
  const int64_t mt = (M + 1) / 2, mb = M - mt;  // top rows; bottom rows (mb < mt: a zero row pads them)
  // Scratch of the calling thread, grown and kept (the DiT calls this 72 times a forward; fresh
  // buffers would cost their page faults every call).
  thread_local aligned_vector<float> A, P;
  if (A.size() < static_cast<size_t>(7 * mt * k)) A.resize(static_cast<size_t>(7 * mt * k));
  if (P.size() < static_cast<size_t>(7 * mt * n)) P.resize(static_cast<size_t>(7 * mt * n));
  float* const a = A.data();
  float* const p = P.data();
  const int64_t as = mt * k, ps = mt * n;  // stride between the 7 a_c / P_c
  pool.parallel_for(mt, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* t1 = x + r * ldx;
      const float* t2 = t1 + k;
      const bool has_b = r < mb;
      const float* b1 = has_b ? x + (mt + r) * ldx : nullptr;
      const float* b2 = has_b ? b1 + k : nullptr;
      float* d[7];
      for (int c = 0; c < 7; ++c) d[c] = a + c * as + r * k;
      if (has_b) {
#pragma GCC ivdep
        for (int64_t j = 0; j < k; ++j) {
          d[0][j] = t1[j] + b2[j];
          d[1][j] = b1[j] + b2[j];
          d[2][j] = t1[j];
          d[3][j] = b2[j];
          d[4][j] = t1[j] + t2[j];
          d[5][j] = b1[j] - t1[j];
          d[6][j] = t2[j] - b2[j];
        }
      } else {  // the padding row of an odd M: x_b1 = x_b2 = 0 (the same values as the formulas give)
#pragma GCC ivdep
        for (int64_t j = 0; j < k; ++j) {
          d[0][j] = t1[j];
          d[1][j] = 0.f;
          d[2][j] = t1[j];
          d[3][j] = 0.f;
          d[4][j] = t1[j] + t2[j];
          d[5][j] = 0.f - t1[j];
          d[6][j] = t2[j];
        }
      }
    }
  });
  for (int c = 0; c < 7; ++c) linear(pool, a + c * as, mt, k, f->w[c], p + c * ps, n, DType::F32);
  const float* bias = w.bias_f32();
  // Each output: its products combined in the order above, then + bias, then rounded (the passes after
  // the first only touch the row just written, in cache).
  auto finish = [&](float* yr, const float* b) {
    if (b)
#pragma GCC ivdep
      for (int64_t j = 0; j < n; ++j) yr[j] += b[j];
    if (store != DType::F32)
      for (int64_t j = 0; j < n; ++j) yr[j] = round_store(yr[j], store);
  };
  pool.parallel_for(mt, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* q0 = p + r * n;
      const float *q1 = q0 + ps, *q2 = q1 + ps, *q3 = q2 + ps, *q4 = q3 + ps, *q5 = q4 + ps, *q6 = q5 + ps;
      float* yt1 = y + r * ldy;
      float* yt2 = yt1 + n;
#pragma GCC ivdep
      for (int64_t j = 0; j < n; ++j) {
        yt1[j] = ((q0[j] + q3[j]) - q4[j]) + q6[j];
        yt2[j] = q2[j] + q4[j];
      }
      finish(yt1, bias);
      finish(yt2, bias ? bias + n : nullptr);
      if (r < mb) {
        float* yb1 = y + (mt + r) * ldy;
        float* yb2 = yb1 + n;
#pragma GCC ivdep
        for (int64_t j = 0; j < n; ++j) {
          yb1[j] = q1[j] + q3[j];
          yb2[j] = ((q0[j] - q1[j]) + q2[j]) + q5[j];
        }
        finish(yb1, bias);
        finish(yb2, bias ? bias + n : nullptr);
      }
    }
  });
}

}  // namespace detail
}  // namespace mm3::kern
