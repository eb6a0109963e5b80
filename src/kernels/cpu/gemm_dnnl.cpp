// gemm_dnnl.cpp — kern::gemm_only_bf16 (kernels.h) and its GEMM, oneDNN's matmul on weights packed
// once into oneDNN's blocked bf16 layout (the CPU backend's fastest bf16 GEMM on this hardware).
//
// Measured on 2 Zen 5 cores (AVX512-BF16, no AMX), M = 689, bf16 x bf16 -> fp32:
//   N x K           oneDNN packed   oneDNN plain [N, K]   gemm_nt bf16
//   2048 x 8192     708 GFLOP/s     531                   ~480-515
//   6144 x 2048     707             517
//   2048 x 2048     792             586
// so the weights are reordered once at load (the packed copy replaces the plain one: no extra
// memory). oneDNN picks its kernel per shape; only a "brg" (brgemm) implementation is taken, so a
// CPU without AVX512-BF16 / AMX keeps the plain weight and gemm_nt.
//
// Numerics: y = round_bf16(sum_k x[m, k] w[n, k] + bias[n]), the sum in fp32 over exact bf16
// products (oneDNN's order), the bias added in fp32 by oneDNN, one rounding here.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/aligned.h"
#include "core/errors.h"
#include "kernels/cpu/gemm_nt.h"
#include "kernels/cpu/simd.h"
#include "kernels/kernels.h"

namespace mm3::kern {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Rows of the primitive the weights are packed for. brgemm's weights layout depends on N and K (and
// the ISA), not on M; a call whose primitive wants another layout reorders on the fly (slow path).
constexpr int64_t kPackM = 512;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

struct DnnlForm {
  dnnl::memory::desc md;  // the packed layout
  dnnl::memory mem;       // owns the packed bf16 weights
  int64_t N = 0, K = 0;
  bool bias = false;
};

dnnl::matmul::primitive_desc make_pd(int64_t M, int64_t N, int64_t K, bool bias, const dnnl::memory::desc& w_md,
                                     int64_t ldy, int64_t ldx) {
  const dnnl::memory::desc src({M, K}, dt::bf16, dnnl::memory::dims{ldx, 1});
  const dnnl::memory::desc dst({M, N}, dt::f32, dnnl::memory::dims{ldy, 1});
  if (bias) {
    const dnnl::memory::desc b({1, N}, dt::f32, tag::ab);
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, w_md, b, dst), cpu_engine());
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, w_md, dst), cpu_engine());
}

// The oneDNN calls run on OpenMP threads: as many as the pool has (another pool may have changed it).
void omp_threads(const ThreadPool& pool) {
  if (omp_get_max_threads() != pool.size()) omp_set_num_threads(pool.size());
}

// MM3_ONEDNN=0 keeps the plain weights and gemm_nt (for comparisons and as an escape hatch).
bool onednn_disabled() {
  const char* e = std::getenv("MM3_ONEDNN");
  return e && std::string(e) == "0";
}

}  // namespace

LinearWeight gemm_only_bf16(const LinearWeight& w) {
  MM3_CHECK(!w.quantized() && !w.gemm_packed() && w.weight().ndim() == 2,
            "gemm_only_bf16: needs a plain F32 / BF16 weight");
  const Tensor plain = w.weight().to(DType::BF16).contiguous();
  const Tensor bias = w.has_bias() ? w.bias().to(DType::BF16) : Tensor();
  const int64_t N = w.out_features(), K = w.in_features();
  if (!detail::cpu_has_avx512bf16() || onednn_disabled()) return LinearWeight(plain, bias);
  try {
    const dnnl::memory::desc any({K, N}, dt::bf16, tag::any);
    const auto pd = make_pd(kPackM, N, K, w.has_bias(), any, N, K);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("brg", 0) != 0) return LinearWeight(plain, bias);
    auto f = std::make_shared<DnnlForm>();
    f->md = pd.weights_desc();
    f->mem = dnnl::memory(f->md, cpu_engine());
    f->N = N;
    f->K = K;
    f->bias = w.has_bias();
    // W [N, K] row-major is the [K, N] matrix in column-major ("ba") order.
    const dnnl::memory src(dnnl::memory::desc({K, N}, dt::bf16, tag::ba), cpu_engine(),
                           const_cast<void*>(plain.raw()));
    dnnl::stream s(cpu_engine());
    dnnl::reorder(src, f->mem).execute(s, const_cast<dnnl::memory&>(src), f->mem);
    s.wait();
    const size_t bytes = f->md.get_size();
    return LinearWeight(N, K, std::move(f), bytes, bias);
  } catch (const dnnl::error&) {
    return LinearWeight(plain, bias);  // no oneDNN kernel for this shape: the plain bf16 weight
  }
}

namespace detail {

void dnnl_linear_bf16_in(const ThreadPool& pool, const uint16_t* xb, int64_t M, int64_t ldx, const void* form,
                         const float* bias, float* y, int64_t ldy, bool round_y) {
  const DnnlForm& f = *static_cast<const DnnlForm*>(form);
  const int64_t N = f.N, K = f.K;
  omp_threads(pool);
  // A strided destination (the DiT's q/k/v into [tokens, 3·D]): oneDNN 2.6's brgemm takes only a dense
  // one and otherwise falls back to gemm:jit with the packed weights reordered to plain on every call
  // (measured on Zen 4 at M = 1380, N = K = 2048: 33.9 + 2.7 ms against brgemm's 32.4). So the GEMM writes
  // a dense scratch and the rounding pass below moves the rows into place.
  thread_local aligned_vector<float> ybuf;
  const bool dense = ldy == N;
  if (!dense && ybuf.size() < static_cast<size_t>(M * N)) ybuf.resize(static_cast<size_t>(M * N));
  float* const yd = dense ? y : ybuf.data();
  try {
    const auto pd = make_pd(M, N, K, f.bias, dnnl::memory::desc({K, N}, dt::bf16, tag::any), N, ldx);
    const dnnl::engine& eng = cpu_engine();
    dnnl::stream s(eng);
    dnnl::memory wmem = f.mem;
    if (pd.weights_desc() != f.md) {  // this M wants another layout: reorder a temporary copy
      wmem = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(f.mem, wmem).execute(s, const_cast<dnnl::memory&>(f.mem), wmem);
    }
    dnnl::memory src(pd.src_desc(), eng, const_cast<uint16_t*>(xb)), dst(pd.dst_desc(), eng, yd);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, dst}};
    if (f.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(pd.bias_desc(), eng, const_cast<float*>(bias)));
    dnnl::matmul(pd).execute(s, args);
    s.wait();
  } catch (const dnnl::error& e) {
    throw InternalError(fmt::format("linear: oneDNN bf16 matmul [{}, {}] x [{}, {}] failed: {}", M, K, N, K, e.what()));
  }
  if (dense && !round_y) return;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      if (!dense) std::memcpy(y + m * ldy, yd + m * N, static_cast<size_t>(N) * sizeof(float));
      if (round_y) round_to_store(y + m * ldy, static_cast<size_t>(N), DType::BF16);
    }
  });
}

void dnnl_linear_bf16(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const void* form,
                      const float* bias, float* y, int64_t ldy) {
  const int64_t K = static_cast<const DnnlForm*>(form)->K;
  // x is bf16-valued by the bf16 convention, so the bf16 copy is exact.
  // The caller's buffer, reused across calls (a fresh one per call would fault its pages in again);
  // the workers get its address, not their own thread_local.
  thread_local aligned_vector<uint16_t> xbuf;
  if (xbuf.size() < static_cast<size_t>(M * K)) xbuf.resize(static_cast<size_t>(M * K));
  uint16_t* const xb = xbuf.data();
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) f32_to_bf16(x + m * ldx, xb + m * K, static_cast<size_t>(K));
  });
  dnnl_linear_bf16_in(pool, xb, M, K, form, bias, y, ldy, /*round_y=*/true);
}

bool dnnl_bf16_available() { return cpu_has_avx512bf16() && !onednn_disabled(); }

bool dnnl_matmul_bf16(const ThreadPool& pool, int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B,
                      float* C) {
  if (!dnnl_bf16_available()) return false;
  const dnnl::engine& eng = cpu_engine();
  try {
    const dnnl::memory::desc a_md({M, K}, dt::bf16, tag::ab), b_md({K, N}, dt::bf16, tag::ab),
        c_md({M, N}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
    if (std::string(pd.impl_info_str()).rfind("brg", 0) != 0) return false;
    omp_threads(pool);
    dnnl::stream s(eng);
    dnnl::memory a(a_md, eng, const_cast<uint16_t*>(A)), b(b_md, eng, const_cast<uint16_t*>(B)), c(c_md, eng, C);
    dnnl::matmul(pd).execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

}  // namespace detail

}  // namespace mm3::kern
