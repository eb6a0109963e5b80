// gemm_dnnl.cpp — kern::gemm_only_bf16 (kernels.h), gemm_only_f32's oneDNN form, and their GEMM:
// oneDNN's matmul on weights packed once into oneDNN's blocked layout (the CPU backend's fastest GEMMs
// on this hardware, bf16 and fp32 alike).
//
// Measured on 2 Zen 5 cores (AVX512-BF16, no AMX), M = 689, bf16 x bf16 -> fp32:
//   N x K           oneDNN packed   oneDNN plain [N, K]   gemm_nt bf16
//   2048 x 8192     708 GFLOP/s     531                   ~480-515
//   6144 x 2048     707             517
//   2048 x 2048     792             586
// so the weights are reordered once at load (the packed copy replaces the plain one: no extra
// memory). oneDNN picks its kernel per shape; only a "brg" (brgemm) implementation is taken, so a
// CPU without AVX512-BF16 / AMX keeps the plain weight and gemm_nt.
// fp32 (fourteenth session, the same machine, one process, the two alternating run by run, medians of
// 9, GFLOP/s): gemm_nt on its pre-packed panels against oneDNN's brgemm (brg:avx512_core) on its packed
// layout, at the DiT's shapes, M = 1380 (an Euler step's batch of 2) / 690:
//   N x K           gemm_nt panels   oneDNN packed   (oneDNN on the plain [N, K] layout: 273 at M 689)
//   6144 x 2048     315 / 333        362 / 373
//   2048 x 2048     330 / 314        372 / 377
//   16384 x 2048    320 / 332        366 / 369
//   2048 x 8192     298 / 316        366 / 375
//
// Numerics: y = store(sum_k x[m, k] w[n, k] + bias[n]), the sum in fp32 (bf16: over exact bf16
// products) in oneDNN's order, the bias added in fp32 by oneDNN, at most one rounding here.
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
  Tensor storage;         // the packed weights' bytes (huge pages, core/tensor.cpp)
  dnnl::memory mem;       // the packed weights (bf16 or f32), a view of storage
  dt type = dt::bf16;     // of the weights and of x
  int64_t N = 0, K = 0;
  bool bias = false;
};

// x's and y's types for weights of type w: bf16 / f32 -> the same and f32; s8 -> u8 (x offset by 128)
// and s32 (the exact integer sums; gemm_i8.cpp scales them).
dt src_type_for(dt w) { return w == dt::s8 ? dt::u8 : w; }
dt dst_type_for(dt w) { return w == dt::s8 ? dt::s32 : dt::f32; }

dnnl::matmul::primitive_desc make_pd(int64_t M, int64_t N, int64_t K, bool bias, const dnnl::memory::desc& w_md,
                                     int64_t ldy, int64_t ldx, dt w_type) {
  const dnnl::memory::desc src({M, K}, src_type_for(w_type), dnnl::memory::dims{ldx, 1});
  const dnnl::memory::desc dst({M, N}, dst_type_for(w_type), dnnl::memory::dims{ldy, 1});
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

// `plain` (a contiguous [N, K] of type `type`) reordered into the layout oneDNN's brgemm wants for
// [kPackM, K] x [K, N]; null where oneDNN offers no brgemm kernel for the shape. jit_gemm_ok: its
// "gemm:jit" implementation (a JIT GEMM kernel, not brgemm; the layout it asks for) is taken too.
std::shared_ptr<DnnlForm> pack_dnnl(const void* plain, int64_t N, int64_t K, dt type, bool bias,
                                    bool jit_gemm_ok = false) {
  try {
    const dnnl::memory::desc any({K, N}, type, tag::any);
    const auto pd = make_pd(kPackM, N, K, bias, any, N, K, type);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("brg", 0) != 0 && !(jit_gemm_ok && impl.rfind("gemm:jit", 0) == 0)) return nullptr;
    auto f = std::make_shared<DnnlForm>();
    f->md = pd.weights_desc();
    // Our allocation, not oneDNN's: Tensor::empty puts a large one on transparent huge pages, which
    // oneDNN's 64-byte-aligned malloc does not get where THP is "madvise" (Debian's default). 4 KiB pages
    // made the fp32 DiT's first-forward packing mostly page faults and page clearing (9.7 GB:
    // ~2.4 M faults; perf: clear_page + the hypervisor's fault path ~47% of its samples).
    const size_t bytes = f->md.get_size();
    const size_t es = type == dt::f32 ? 4 : 2;  // s8 bytes are held in a BF16 tensor's storage
    f->storage =
        Tensor::empty(type == dt::f32 ? DType::F32 : DType::BF16, {static_cast<int64_t>((bytes + es - 1) / es)});
    f->mem = dnnl::memory(f->md, cpu_engine(), f->storage.raw());
    f->type = type;
    f->N = N;
    f->K = K;
    f->bias = bias;
    // W [N, K] row-major is the [K, N] matrix in column-major ("ba") order.
    const dnnl::memory src(dnnl::memory::desc({K, N}, type, tag::ba), cpu_engine(), const_cast<void*>(plain));
    dnnl::stream s(cpu_engine());
    dnnl::reorder(src, f->mem).execute(s, const_cast<dnnl::memory&>(src), f->mem);
    s.wait();
    return f;
  } catch (const dnnl::error&) {
    return nullptr;  // no oneDNN kernel for this shape
  }
}

// yd [M, N] dense (f32, or s32 for s8 weights) = x · W^T (+ bias) on a packed form; x rows of stride
// ldx in the form's source type.
void exec_dnnl(const ThreadPool& pool, const void* x, int64_t M, int64_t ldx, const DnnlForm& f, const float* bias,
               void* yd) {
  const int64_t N = f.N, K = f.K;
  omp_threads(pool);
  try {
    const auto pd = make_pd(M, N, K, f.bias, dnnl::memory::desc({K, N}, f.type, tag::any), N, ldx, f.type);
    const dnnl::engine& eng = cpu_engine();
    dnnl::stream s(eng);
    dnnl::memory wmem = f.mem;
    if (pd.weights_desc() != f.md) {  // this M wants another layout: reorder a temporary copy
      wmem = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(f.mem, wmem).execute(s, const_cast<dnnl::memory&>(f.mem), wmem);
    }
    dnnl::memory src(pd.src_desc(), eng, const_cast<void*>(x)), dst(pd.dst_desc(), eng, yd);
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wmem}, {DNNL_ARG_DST, dst}};
    if (f.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(pd.bias_desc(), eng, const_cast<float*>(bias)));
    dnnl::matmul(pd).execute(s, args);
    s.wait();
  } catch (const dnnl::error& e) {
    throw InternalError(fmt::format("linear: oneDNN {} matmul [{}, {}] x [{}, {}] failed: {}",
                                    f.type == dt::f32  ? "fp32"
                                    : f.type == dt::s8 ? "int8"
                                                       : "bf16",
                                    M, K, N, K, e.what()));
  }
}

// y = store(x · W^T + bias) on a packed form; x rows of stride ldx in the form's type.
void run_dnnl(const ThreadPool& pool, const void* x, int64_t M, int64_t ldx, const DnnlForm& f, const float* bias,
              float* y, int64_t ldy, bool round_y) {
  const int64_t N = f.N;
  // A strided destination (the DiT's q/k/v into [tokens, 3·D]): oneDNN 2.6's brgemm takes only a dense
  // one and otherwise falls back to gemm:jit with the packed weights reordered to plain on every call
  // (measured on Zen 4 at M = 1380, N = K = 2048: 33.9 + 2.7 ms against brgemm's 32.4). So the GEMM writes
  // a dense scratch and the rounding pass below moves the rows into place.
  thread_local aligned_vector<float> ybuf;
  const bool dense = ldy == N;
  if (!dense && ybuf.size() < static_cast<size_t>(M * N)) ybuf.resize(static_cast<size_t>(M * N));
  float* const yd = dense ? y : ybuf.data();
  exec_dnnl(pool, x, M, ldx, f, bias, yd);
  if (dense && !round_y) return;
  pool.parallel_for(M, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      if (!dense) std::memcpy(y + m * ldy, yd + m * N, static_cast<size_t>(N) * sizeof(float));
      if (round_y) round_to_store(y + m * ldy, static_cast<size_t>(N), DType::BF16);
    }
  });
}

}  // namespace

LinearWeight gemm_only_bf16(const LinearWeight& w) {
  MM3_CHECK(!w.quantized() && !w.gemm_packed() && w.weight().ndim() == 2,
            "gemm_only_bf16: needs a plain F32 / BF16 weight");
  const Tensor plain = w.weight().to(DType::BF16).contiguous();
  const Tensor bias = w.has_bias() ? w.bias().to(DType::BF16) : Tensor();
  const int64_t N = w.out_features(), K = w.in_features();
  if (!detail::cpu_has_avx512bf16() || onednn_disabled()) return LinearWeight(plain, bias);
  // Without AMX oneDNN's bf16 kernels run VDPBF16PS; where that is slow, gemm_ex's tile on two FMAs a
  // pair is faster. Thirty-eighth session, 2-core Xeon family 6 model 207: dit_forward_L689_bf16
  // 22.0 s (oneDNN, 159 GFLOP/s) against 14.2 s (MM3_ONEDNN=0, 246 GFLOP/s), one process each.
  // The knob bf16_dot (detail::bf16_dot_fma) decides as the weight is packed: 1 keeps oneDNN's form.
  if (detail::bf16_dot_fma() && !detail::cpu_has_amx_bf16()) return LinearWeight(plain, bias);
  auto f = pack_dnnl(plain.raw(), N, K, dt::bf16, w.has_bias());
  if (!f) return LinearWeight(plain, bias);
  const size_t bytes = f->md.get_size();
  return LinearWeight(N, K, std::move(f), bytes, bias, GemmKind::Bf16Dnnl);
}

namespace detail {

void dnnl_linear_bf16_in(const ThreadPool& pool, const uint16_t* xb, int64_t M, int64_t ldx, const void* form,
                         const float* bias, float* y, int64_t ldy, bool round_y) {
  run_dnnl(pool, xb, M, ldx, *static_cast<const DnnlForm*>(form), bias, y, ldy, round_y);
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

std::shared_ptr<const void> dnnl_pack_f32(const Tensor& plain, bool bias, size_t& bytes) {
  if (onednn_disabled()) return nullptr;
  // Without AVX-512 oneDNN has no fp32 brgemm; its gemm:jit (the JIT sgemm) then beats gemm_nt's AVX2
  // panels: Zen 5 capped to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2, MM3_ISA=avx2), [1380, 8192] x [8192, 2048]
  // 195 against 157 GFLOP/s, the batch-1 DiT forward 18.5 / 18.7 s against 23.2 / 21.3 (alternating);
  // on Zen 3 (fourth session) OpenBLAS's sgemm had run 11% faster than our tile, torch's DiT 8%.
  auto f = pack_dnnl(plain.raw(), plain.dim(0), plain.dim(1), dt::f32, bias, /*jit_gemm_ok=*/!cpu_has_avx512());
  if (f) bytes = f->md.get_size();
  return f;
}

void dnnl_linear_f32(const ThreadPool& pool, const float* x, int64_t M, int64_t ldx, const void* form,
                     const float* bias, float* y, int64_t ldy, DType store) {
  run_dnnl(pool, x, M, ldx, *static_cast<const DnnlForm*>(form), bias, y, ldy, store == DType::BF16);
}

// Whether oneDNN's u8 x s8 -> s32 matmul sums exactly on this CPU, found out once by products whose
// exact sums are known. With VPDPBUSD (AVX512-VNNI: brgemm; AVX-VNNI, e.g. Intel's client cores from
// Alder Lake on: gemm:jit) every product is added into int32. Without VNNI, oneDNN 2.6 multiplies with
// VPMADDUBSW, which adds each pair of u8 x s8 products into an int16 that saturates (255 · 127 · 2 >
// 2^15 - 1): on Zen 5 under ONEDNN_MAX_CPU_ISA=AVX2, every one of 15580 sampled sums of a [1380, 2048]
// x [2048, 2048] product with half its bytes extreme came out wrong (under AVX2_VNNI none, gemm:jit at
// 504 GOP/s against brgemm's 1184 uncapped, plain layouts, in the same test). The probe runs a single
// row (oneDNN may take a GEMV for it) and a block of rows, with u8 255 against s8 ±127 pairs (the worst
// for the int16 pair sums) among random bytes; any wrong sum, or an error, means no int8 GEMM.
bool dnnl_i8_exact() {
  static const bool exact = [] {
    try {
      const dnnl::engine& eng = cpu_engine();
      dnnl::stream s(eng);
      uint32_t r = 12345u;
      auto next = [&r] { return r = r * 1664525u + 1013904223u; };
      for (const int64_t M : {int64_t{1}, int64_t{37}}) {
        const int64_t N = 67, K = 515;
        std::vector<uint8_t> x(static_cast<size_t>(M * K));
        std::vector<int8_t> w(static_cast<size_t>(N * K));
        std::vector<int32_t> y(static_cast<size_t>(M * N));
        for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 3) ? 255 : static_cast<uint8_t>(next() >> 24);
        for (size_t i = 0; i < w.size(); ++i) {
          const uint32_t v = next() >> 24;
          w[i] = static_cast<int8_t>((i / 5) % 2 ? ((i / 7) % 2 ? 127 : -127) : static_cast<int>(v % 255) - 127);
        }
        const dnnl::memory::desc src({M, K}, dt::u8, tag::ab), wt({K, N}, dt::s8, tag::ba),
            dst({M, N}, dt::s32, tag::ab);
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wt, dst), eng);
        dnnl::memory xm(src, eng, x.data()), wm(wt, eng, w.data()), ym(dst, eng, y.data());
        dnnl::matmul(pd).execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
        s.wait();
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            int64_t sum = 0;
            for (int64_t k = 0; k < K; ++k) sum += int64_t{x[size_t(m * K + k)]} * w[size_t(n * K + k)];
            if (sum != y[size_t(m * N + n)]) return false;
          }
      }
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return exact;
}

bool dnnl_i8_offered() { return !onednn_disabled() && dnnl_i8_exact(); }

std::shared_ptr<const void> dnnl_pack_i8(const int8_t* plain, int64_t N, int64_t K, size_t& bytes) {
  if (!dnnl_i8_offered()) return nullptr;
  // brgemm or gemm:jit: the probe found its sums exact, and there is no other int8 GEMM to fall back to
  // (a CPU with AVX-VNNI but not AVX512-VNNI gets oneDNN's gemm:jit).
  auto f = pack_dnnl(plain, N, K, dt::s8, /*bias=*/false, /*jit_gemm_ok=*/true);
  if (f) bytes = f->md.get_size();
  return f;
}

void dnnl_matmul_i8(const ThreadPool& pool, const uint8_t* xq, int64_t M, int64_t ldx, const void* form, int32_t* acc) {
  exec_dnnl(pool, xq, M, ldx, *static_cast<const DnnlForm*>(form), nullptr, acc);
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
