// ref_quant.cpp — see ref_quant.h. No FMA contraction: the quantizer's sums and errors must be the
// plain double operations quant.h describes.
#pragma GCC optimize("fp-contract=off")

#include "kernels/ref/ref_quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/errors.h"

namespace mm3::ref {

namespace {

constexpr int64_t kB = 32, kS = 512;

// Address of element e of block b in the unpacked (byte per weight) row: superblock b / 16, lane b % 16.
int64_t unpacked_addr(int64_t b, int64_t e) { return (b / 16) * kS + 64 * (e / 4) + 4 * (b % 16) + (e % 4); }

float f16r(float v) { return f16_bits_to_f32(f32_to_f16_bits(v)); }

int round_clamp(float v, int lo, int hi) {
  const float r = std::nearbyint(v);
  return static_cast<int>(std::min(std::max(r, float(lo)), float(hi)));
}

}  // namespace

std::shared_ptr<const QuantMatrix> quantize_weight(const Tensor& w, QuantType type) {
  MM3_CHECK(w.ndim() == 2 && w.strides()[1] == 1, "ref::quantize_weight: {}", w.describe());
  const int64_t N = w.dim(0), K = w.dim(1), Kp = (K + kS - 1) / kS * kS, nblk = Kp / kB;
  const std::vector<float> wf = w.contiguous().to_f32_vector();
  const bool i8 = type == QuantType::Int8;
  const int64_t rq = i8 ? Kp : Kp / 2, rs = i8 ? nblk : 2 * nblk;
  Tensor qs = Tensor::zeros(DType::I32, {N, rq / 4});
  Tensor sc = Tensor::zeros(DType::F16, {N, rs});
  for (int64_t n = 0; n < N; ++n) {
    uint8_t* qrow = static_cast<uint8_t*>(qs.raw()) + n * rq;
    uint16_t* srow = static_cast<uint16_t*>(sc.raw()) + n * rs;
    std::vector<int> codes(static_cast<size_t>(Kp), i8 ? 0 : 0);
    for (int64_t b = 0; b < nblk; ++b) {
      std::vector<float> v;
      for (int64_t k = b * kB; k < std::min(K, b * kB + kB); ++k) v.push_back(wf[size_t(n * K + k)]);
      const int64_t s = b / 16, l = b % 16;
      if (i8) {
        float amax = 0.f;
        for (float t : v) amax = std::max(amax, std::fabs(t));
        const float d = f16r(amax / 127.f);
        srow[16 * s + l] = f32_to_f16_bits(d);
        for (size_t e = 0; e < v.size(); ++e) codes[size_t(unpacked_addr(b, int64_t(e)))] = d == 0.f ? 0 : round_clamp(v[e] / d, -127, 127);
      } else {
        float lo = v.empty() ? 0.f : *std::min_element(v.begin(), v.end());
        float hi = v.empty() ? 0.f : *std::max_element(v.begin(), v.end());
        auto code = [](float x, float d, float m) { return d == 0.f ? 0 : round_clamp((x - m) / d, 0, 15); };
        auto err = [&](float d, float m) {
          double e2 = 0;
          for (float x : v) {
            const float val = d * float(code(x, d, m)) + m;  // two fp32 roundings (no contraction)
            e2 += (double(x) - double(val)) * (double(x) - double(val));
          }
          return e2;
        };
        float cm = f16r(lo), cd = f16r((hi - cm) / 15.f);
        float d = cd, m = cm;
        double best = err(cd, cm);
        for (int it = 0; it < 2 && cd != 0.f; ++it) {  // least-squares refits of (d, m) to the codes
          double sq = 0, sqq = 0, sw = 0, sqw = 0;
          for (float x : v) {
            const double q = code(x, cd, cm);
            sq += q, sqq += q * q, sw += x, sqw += q * x;
          }
          const double n = double(v.size()), den = n * sqq - sq * sq;
          if (!(den > 0)) break;
          const double nd = (n * sqw - sq * sw) / den, nm = (sw - nd * sq) / n;
          if (!(nd > 0)) break;
          cd = f16r(float(nd));
          cm = f16r(float(nm));
          const double e = err(cd, cm);
          if (e < best) best = e, d = cd, m = cm;
        }
        srow[32 * s + l] = f32_to_f16_bits(d);
        srow[32 * s + 16 + l] = f32_to_f16_bits(m);
        for (size_t e = 0; e < v.size(); ++e) codes[size_t(unpacked_addr(b, int64_t(e)))] = d == 0.f ? 0 : round_clamp((v[e] - m) / d, 0, 15);
      }
    }
    // Pack: Int8 stores q + 128 per byte; Q4 pairs unpacked vector c (low nibble) with c + 4 (high).
    for (int64_t u = 0; u < Kp; ++u) {
      if (i8) {
        qrow[u] = static_cast<uint8_t>(codes[size_t(u)] + 128);
      } else {
        const int64_t s = u / kS, within = u % kS, v = within / 64, j = within % 64;
        uint8_t& byte = qrow[s * (kS / 2) + 64 * (v % 4) + j];
        byte = static_cast<uint8_t>(byte | (v < 4 ? codes[size_t(u)] : codes[size_t(u)] << 4));
      }
    }
  }
  return std::make_shared<const QuantMatrix>(type, N, K, std::move(qs), std::move(sc));
}

float quant_value(const QuantMatrix& q, int64_t n, int64_t k) {
  if (k >= q.cols()) return 0.f;
  const int64_t b = k / kB, e = k % kB, s = b / 16, l = b % 16, u = unpacked_addr(b, e);
  const uint16_t* sc = q.scales_row(n);
  if (q.type() == QuantType::Int8) {
    const int code = int(q.qs_row(n)[u]) - 128;
    return f16_bits_to_f32(sc[16 * s + l]) * float(code);
  }
  const int64_t v = (u % kS) / 64, j = u % 64;
  const uint8_t byte = q.qs_row(n)[s * (kS / 2) + 64 * (v % 4) + j];
  const int code = v < 4 ? (byte & 15) : (byte >> 4);
  const float dq = f16_bits_to_f32(sc[32 * s + l]) * float(code);
  return dq + f16_bits_to_f32(sc[32 * s + 16 + l]);
}

void quant_linear(const float* x, int64_t M, int64_t ldx, const QuantMatrix& w, const float* bias, float* y,
                  int64_t ldy, DType store) {
  const int64_t N = w.rows(), K = w.cols();
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * ldx;
    if (M <= 4) {
      // Activation quantization per 32-block (the decode op's definition).
      const int64_t nblk = (K + kB - 1) / kB;
      std::vector<int> xq(static_cast<size_t>(K));
      std::vector<float> dx(static_cast<size_t>(nblk));
      for (int64_t b = 0; b < nblk; ++b) {
        float amax = 0.f;
        for (int64_t k = b * kB; k < std::min(K, b * kB + kB); ++k) amax = std::max(amax, std::fabs(xr[k]));
        dx[size_t(b)] = amax == 0.f ? 0.f : amax / 127.f;
        for (int64_t k = b * kB; k < std::min(K, b * kB + kB); ++k)
          xq[size_t(k)] = amax == 0.f ? 0 : round_clamp(xr[k] * (127.f / amax), -127, 127);
      }
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += double(quant_value(w, n, k)) * double(dx[size_t(k / kB)]) * double(xq[size_t(k)]);
        if (bias) acc += bias[n];
        y[m * ldy + n] = round_store(static_cast<float>(acc), store);
      }
    } else {
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          float v = quant_value(w, n, k);
          if (store == DType::BF16) v = round_bf16(v);
          acc += double(v) * double(xr[k]);
        }
        if (bias) acc += bias[n];
        y[m * ldy + n] = round_store(static_cast<float>(acc), store);
      }
    }
  }
}

}  // namespace mm3::ref
