// ref_kernels.cpp — the scalar double-accumulating twins declared in ref_kernels.h (tests only).
//
// Each function is the torch definition quoted in kernels.h, transcribed loop by loop. Compiled with
// fp-contract off so that "a * b + c" here means two roundings, like the torch ops it mirrors.
#pragma GCC optimize("fp-contract=off")

#include "kernels/ref/ref_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace mm3::ref {

namespace {

// double -> float -> store dtype (the twin's only rounding points).
float st(double v, DType store) { return round_store(static_cast<float>(v), store); }

float weight_at(const Tensor& w, int64_t i) {
  return w.dtype() == DType::BF16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(w.raw())[i])
                                  : static_cast<const float*>(w.raw())[i];
}

float kv_at(const void* p, DType dt, int64_t i) {
  return dt == DType::BF16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

}  // namespace

void linear(const ThreadPool&, const float* x, int64_t M, int64_t ldx, const LinearWeight& w, float* y, int64_t ldy,
            DType store) {
  const int64_t N = w.out_features(), K = w.in_features();
  const float* bias = w.bias_f32();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * ldx + k]) * double(weight_at(w.weight(), n * K + k));
      if (bias) acc += bias[n];
      y[m * ldy + n] = st(acc, store);
    }
}

namespace {

// One row on 127 symmetric levels: q[k] = clamp(rint(v[k] · (127 / a)), ±127), a = max |v|; returns
// a / 127 (0 for a zero row, NaN for a row with a non-finite value, whose q are then 0).
float quantize_127(const std::vector<float>& v, std::vector<int>& q) {
  float a = 0.0f;
  bool finite = true;
  for (float e : v) {
    finite = finite && std::isfinite(e);
    a = std::max(a, std::fabs(e));
  }
  q.assign(v.size(), 0);
  if (!finite) return NAN;
  if (a == 0.0f) return 0.0f;
  const float inv = 127.0f / a;
  for (size_t k = 0; k < v.size(); ++k)
    q[k] = static_cast<int>(std::clamp(std::nearbyint(v[k] * inv), -127.0f, 127.0f));
  return a / 127.0f;
}

}  // namespace

void rotate_row(float* v, int64_t n) {
  for (int64_t k = 0; k < n; ++k)
    if (kern::rotation_sign(k) < 0) v[k] = -v[k];
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

void linear_i8(const float* x, int64_t M, int64_t ldx, const Tensor& weight, const Tensor& bias, float* y, int64_t ldy,
               DType store, kern::I8Options opt) {
  const bool x_two_level = opt.x_two_level;
  const int64_t N = weight.dim(0), K = weight.dim(1);
  // Rotated rows (power-of-two K): their product is K times x·Wᵀ, so each weight scale carries 1/K.
  const bool rot = opt.rotate && kern::rotation_applies(K);
  std::vector<float> w = weight.to_f32_vector();
  if (rot)
    for (int64_t n = 0; n < N; ++n) rotate_row(w.data() + n * K, K);
  const std::vector<float> b = bias.raw() ? bias.to_f32_vector() : std::vector<float>();
  std::vector<std::vector<int>> qw(static_cast<size_t>(N));
  std::vector<float> sw(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    sw[n] = quantize_127(std::vector<float>(w.begin() + n * K, w.begin() + (n + 1) * K), qw[n]);
    if (rot) sw[n] *= 1.0f / static_cast<float>(K);
  }
  std::vector<int> qx, qx2;
  for (int64_t m = 0; m < M; ++m) {
    std::vector<float> row(x + m * ldx, x + m * ldx + K);
    if (rot) rotate_row(row.data(), K);
    const float sx = quantize_127(row, qx);
    // Second level: the first level's rounding error r − q1 (r = x · 127 / a), on 128 steps a level.
    qx2.assign(static_cast<size_t>(K), 0);
    if (x_two_level && std::isfinite(sx) && sx != 0.0f) {
      float a = 0.0f;
      for (float e : row) a = std::max(a, std::fabs(e));
      const float inv = 127.0f / a;
      for (int64_t k = 0; k < K; ++k) {
        const float r = row[k] * inv;
        qx2[k] =
            static_cast<int>(std::clamp(std::nearbyint((r - static_cast<float>(qx[k])) * 128.0f), -127.0f, 127.0f));
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      int64_t acc = 0, acc2 = 0;  // signed products: the kernel's u8 offset and its compensation cancel exactly
      for (int64_t k = 0; k < K; ++k) {
        acc += int64_t{qx[k]} * qw[n][k];
        acc2 += int64_t{qx2[k]} * qw[n][k];
      }
      const float s = sx * sw[n], bn = b.empty() ? 0.0f : b[n];
      const float v = x_two_level ? std::fma(static_cast<float>(acc), s,
                                             std::fma(static_cast<float>(acc2), s * (1.0f / 128.0f), bn))
                                  : std::fma(static_cast<float>(acc), s, bn);
      y[m * ldy + n] = store == DType::BF16 ? round_bf16(v) : v;
    }
  }
}

void gemm_f32(const ThreadPool&, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
              const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[k * lda + m] : A[m * lda + k];
        const double b = trans_b ? B[n * ldb + k] : B[k * ldb + n];
        acc += a * b;
      }
      // BLAS: beta == 0 means C is not read (it may hold NaN).
      const double c = beta == 0.f ? 0.0 : double(beta) * double(C[m * ldc + n]);
      C[m * ldc + n] = static_cast<float>(double(alpha) * acc + c);
    }
}

void embedding(const Tensor& table, const int64_t* ids, int64_t n, float* out, int64_t ldo) {
  const int64_t V = table.dim(0), H = table.dim(1);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V) throw InvalidInput("ref::embedding: id out of range");
    for (int64_t j = 0; j < H; ++j) out[i * ldo + j] = weight_at(table, ids[i] * H + j);
  }
}

void rms_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, float eps, float* y,
              int64_t ldy, DType store) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * ldx + i]) * double(x[r * ldx + i]);
    const double rs = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    for (int64_t i = 0; i < dim; ++i) {
      const float xn = st(double(x[r * ldx + i]) * rs, store);  // hidden_states.to(input_dtype)
      y[r * ldy + i] = weight ? st(double(weight[i]) * double(xn), store) : xn;
    }
  }
}

void layer_norm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* weight, const float* bias,
                float eps, float* y, int64_t ldy, DType store) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    double mean = 0;
    for (int64_t i = 0; i < dim; ++i) mean += xr[i];
    mean /= double(dim);
    double var = 0;
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= double(dim);
    const double rstd = 1.0 / std::sqrt(var + double(eps));
    for (int64_t i = 0; i < dim; ++i) {
      double v = (xr[i] - mean) * rstd;
      if (weight) v *= weight[i];
      if (bias) v += bias[i];
      y[r * ldy + i] = st(v, store);
    }
  }
}

void rope_tables(const int64_t* positions, int64_t n_pos, int rot_dim, double theta, float* cos, float* sin,
                 DType store) {
  const int half = rot_dim / 2;
  for (int64_t s = 0; s < n_pos; ++s)
    for (int j = 0; j < rot_dim; ++j) {
      const int i = j % half;  // emb = cat(freqs, freqs)
      // torch: inv_freq = 1.0 / (theta ** (arange(0, dim, 2).float() / dim)), fp32 tensors.
      const float expo = float(2 * i) / float(rot_dim);
      const float inv = 1.0f / static_cast<float>(std::pow(double(float(theta)), double(expo)));
      const float f = float(positions[s]) * inv;  // fp32 outer product
      cos[s * rot_dim + j] = st(std::cos(double(f)), store);
      sin[s * rot_dim + j] = st(std::sin(double(f)), store);
    }
}

void rope_apply(float* x, int64_t S, int H, int head_dim, int64_t ld, const float* cos, const float* sin,
                int rot_dim, DType store) {
  const int half = rot_dim / 2;
  std::vector<float> r(static_cast<size_t>(rot_dim)), rot(static_cast<size_t>(rot_dim));
  for (int64_t s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h) {
      float* p = x + s * ld + int64_t(h) * head_dim;
      for (int j = 0; j < rot_dim; ++j) r[j] = p[j];
      for (int j = 0; j < rot_dim; ++j) rot[j] = j < half ? -r[j + half] : r[j - half];  // rotate_half
      for (int j = 0; j < rot_dim; ++j) {
        const float a = st(double(r[j]) * cos[s * rot_dim + j], store);
        const float b = st(double(rot[j]) * sin[s * rot_dim + j], store);
        p[j] = st(double(a) + double(b), store);
      }
    }
}

void attention(const ThreadPool&, const float* q, int64_t ldq, const void* k, const void* v, int64_t ldkv,
               DType kv_dtype, float* out, int64_t ldo, int64_t Sq, int64_t Skv, int Hq, int Hkv, int D, float scale,
               bool causal, int64_t q_pos0, DType store, int64_t /*kv_span: blocking only*/, int64_t ldh) {
  if (ldh == 0) ldh = D;
  // Exact softmax in double with one row max; with store BF16 the probabilities are rounded to
  // bf16 (as floats) before P.V while the sum keeps the unrounded values, as the kernel contract says.
  const int group = Hq / Hkv;
  std::vector<double> s(static_cast<size_t>(Skv)), p(static_cast<size_t>(Skv));
  for (int64_t i = 0; i < Sq; ++i)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / group;
      const int64_t nk = causal ? std::min<int64_t>(Skv, q_pos0 + i + 1) : Skv;
      double mx = -INFINITY;
      for (int64_t j = 0; j < nk; ++j) {
        double d = 0;
        for (int e = 0; e < D; ++e)
          d += double(q[i * ldq + h * D + e]) * double(kv_at(k, kv_dtype, j * ldkv + hk * ldh + e));
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < nk; ++j) {
        sum += (s[j] = std::exp(s[j] - mx));
        p[j] = store == DType::BF16 ? double(round_bf16(float(s[j]))) : s[j];
      }
      for (int e = 0; e < D; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < nk; ++j) acc += p[j] * double(kv_at(v, kv_dtype, j * ldkv + hk * ldh + e));
        out[i * ldo + h * D + e] = st(acc / sum, store);
      }
    }
}

void softmax_rows(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * cols;
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, double(xr[j]));
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(xr[j] - mx);
    for (int64_t j = 0; j < cols; ++j) xr[j] = static_cast<float>(std::exp(xr[j] - mx) / sum);
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n, DType store) {
  for (int64_t i = 0; i < n; ++i) {
    const float sg = st(gate[i] / (1.0 + std::exp(-double(gate[i]))), store);
    out[i] = st(double(sg) * up[i], store);
  }
}

void silu(const float* x, float* out, int64_t n, DType store) {
  for (int64_t i = 0; i < n; ++i) out[i] = st(x[i] / (1.0 + std::exp(-double(x[i]))), store);
}

void add(const float* a, const float* b, float* out, int64_t n, DType store) {
  for (int64_t i = 0; i < n; ++i) out[i] = st(double(a[i]) + double(b[i]), store);
}

void tanh_inplace(float* x, int64_t n, DType store) {
  for (int64_t i = 0; i < n; ++i) x[i] = st(std::tanh(double(x[i])), store);
}

void snake(const float* x, const float* alpha, float* y, int64_t C, int64_t L, DType store) {
  for (int64_t c = 0; c < C; ++c) {
    const float a = alpha[c];
    const float inv = st(1.0 / double(st(double(a) + 1e-9, store)), store);  // (alpha + 1e-9).reciprocal()
    for (int64_t t = 0; t < L; ++t) {
      const float xv = x[c * L + t];
      const float ax = st(double(a) * xv, store);
      const float sn = st(std::sin(double(ax)), store);
      const float sq = st(double(sn) * sn, store);
      const float tm = st(double(inv) * sq, store);
      y[c * L + t] = st(double(xv) + tm, store);
    }
  }
}

namespace {

// The fused Snake input (a copy) or x itself.
const float* conv_input(const float* x, int64_t Cin, int64_t L, const kern::ConvFusion& f, DType store,
                        std::vector<float>& buf) {
  if (!f.snake_alpha) return x;
  buf.resize(static_cast<size_t>(Cin * L));
  snake(x, f.snake_alpha, buf.data(), Cin, L, store);
  return buf.data();
}

// One output: st(sum), then the fused residual st(residual + it).
float conv_out(double acc, const float* bias, int64_t co, const kern::ConvFusion& f, int64_t idx, DType store) {
  if (bias) acc += bias[co];
  const float v = st(acc, store);
  return f.residual ? st(double(f.residual[idx]) + double(v), store) : v;
}

}  // namespace

void conv1d(const ThreadPool&, const float* x, int64_t Cin, int64_t L, const float* w, const float* bias,
            int64_t Cout, int K, int stride, int pad, int dilation, float* y, DType store,
            const kern::ConvFusion& fusion) {
  const int64_t Lout = kern::conv1d_out_len(L, K, stride, pad, dilation);
  std::vector<float> buf, out(static_cast<size_t>(Cout * Lout));  // y may be the residual
  x = conv_input(x, Cin, L, fusion, store, buf);
  for (int64_t co = 0; co < Cout; ++co)
    for (int64_t t = 0; t < Lout; ++t) {
      double acc = 0;
      for (int64_t ci = 0; ci < Cin; ++ci)
        for (int k = 0; k < K; ++k) {
          const int64_t src = t * stride - pad + int64_t(k) * dilation;
          if (src >= 0 && src < L) acc += double(w[(co * Cin + ci) * K + k]) * x[ci * L + src];
        }
      out[co * Lout + t] = conv_out(acc, bias, co, fusion, co * Lout + t, store);
    }
  std::copy(out.begin(), out.end(), y);
}

void conv_transpose1d(const ThreadPool&, const float* x, int64_t Cin, int64_t L, const float* w, const float* bias,
                      int64_t Cout, int K, int stride, int pad, int output_padding, float* y, DType store,
                      const kern::ConvFusion& fusion) {
  // Gather form (each output sums the inputs that scatter onto it), unlike the GEMM path's scatter form.
  const int64_t Lout = kern::conv_transpose1d_out_len(L, K, stride, pad, output_padding);
  std::vector<float> buf, out(static_cast<size_t>(Cout * Lout));
  x = conv_input(x, Cin, L, fusion, store, buf);
  for (int64_t co = 0; co < Cout; ++co)
    for (int64_t o = 0; o < Lout; ++o) {
      double acc = 0;
      for (int k = 0; k < K; ++k) {
        const int64_t num = o + pad - k;  // = t * stride
        if (num < 0 || num % stride != 0) continue;
        const int64_t t = num / stride;
        if (t >= L) continue;
        for (int64_t ci = 0; ci < Cin; ++ci) acc += double(w[(ci * Cout + co) * K + k]) * x[ci * L + t];
      }
      out[co * Lout + o] = conv_out(acc, bias, co, fusion, co * Lout + o, store);
    }
  std::copy(out.begin(), out.end(), y);
}

int64_t nearest_src_index(int64_t dst, int64_t in_len, int64_t out_len) {
  if (out_len == in_len) return dst;
  if (out_len == 2 * in_len) return dst >> 1;
  const float scale = float(in_len) / float(out_len);  // ATen: float32, on purpose
  return std::min<int64_t>(static_cast<int64_t>(std::floor(float(dst) * scale)), in_len - 1);
}

void interpolate_nearest(const float* x, int64_t C, int64_t Lin, int64_t Lout, float* y) {
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < Lout; ++j) y[c * Lout + j] = x[c * Lin + nearest_src_index(j, Lin, Lout)];
}

void transpose_2d(const float* x, int64_t rows, int64_t cols, int64_t ldx, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * ldx + c];
}

}  // namespace mm3::ref
