// quant_weights.cpp — see quant_weights.h.
#include "model/quant_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "io/mmap_file.h"

namespace mm3 {

namespace fs = std::filesystem;

QuantPlan quant_plan(QuantType t) {
  if (t == QuantType::None) return {};
  return {t, QuantType::Int8};
}

std::string quant_sidecar_path(const std::string& ckpt_dir, const std::string& component, QuantType t) {
  return (fs::path(ckpt_dir) / kQuantDirName / kern::quant_name(t) / (component + ".safetensors")).string();
}

QuantType checkpoint_default_quant(const std::string& ckpt_dir) {
  const fs::path p = fs::path(ckpt_dir) / kQuantDirName / "default.json";
  if (!fs::exists(p)) return QuantType::None;
  std::ifstream in(p);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw BadModel(fmt::format("{}: not valid JSON ({})", p.string(), e.what()));
  }
  const std::string name = j.value("type", "");
  const auto t = kern::quant_from_name(name);
  if (!t) throw BadModel(fmt::format("{}: unknown quantization type '{}' (int8, q4 or none)", p.string(), name));
  return *t;
}

std::shared_ptr<const SafetensorsFile> open_quant_sidecar(const std::string& ckpt_dir, const std::string& component,
                                                          QuantType t) {
  if (t == QuantType::None) return nullptr;
  const std::string path = quant_sidecar_path(ckpt_dir, component, t);
  if (!fs::exists(path)) return nullptr;
  auto f = std::make_shared<const SafetensorsFile>(path);
  const auto& md = f->metadata();
  auto get = [&](const std::string& k) {
    auto it = md.find(k);
    return it == md.end() ? std::string() : it->second;
  };
  if (get("mm3_quant_format") != kQuantFormatVersion)
    throw BadModel(fmt::format("{}: mm3_quant_format '{}' (this build reads '{}'; rerun mm3 quantize)", path,
                               get("mm3_quant_format"), kQuantFormatVersion));
  if (get("mm3_quant_type") != kern::quant_name(t))
    throw BadModel(fmt::format("{}: holds '{}' weights, expected '{}'", path, get("mm3_quant_type"), kern::quant_name(t)));
  return f;
}

// Chunks in which a mapped weight is faulted in (and copied) by the pool's threads: 2 threads faulting 8 MiB
// pieces read a cold 2.4 GB shard at ~3.8 GB/s (one request stream: ~1.3).
constexpr size_t kPopulateChunk = size_t(8) << 20;

// A source that is not read again (a weight quantized or copied at load): its mapped pages leave this
// process (they stay in the page cache, reclaimable), so the resident set is what is used.
void release_mapped_pages(const Tensor& w) {
  if (!w.is_borrowed()) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(w.raw()), e = b + w.nbytes();
  const uintptr_t pb = (b + page - 1) / page * page, pe = e / page * page;  // whole pages inside only
  if (pe > pb) ::madvise(reinterpret_cast<void*>(pb), pe - pb, MADV_DONTNEED);
}

void populate_mapped_pages(const Tensor& w, const ThreadPool* pool) {
  if (!w.is_borrowed() || w.nbytes() == 0) return;
  const auto* p = static_cast<const unsigned char*>(w.raw());
  const size_t n = w.nbytes();
  const int64_t parts = static_cast<int64_t>((n + kPopulateChunk - 1) / kPopulateChunk);
  auto run = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const size_t o = static_cast<size_t>(i) * kPopulateChunk;
      populate_read(p + o, std::min(n - o, kPopulateChunk));
    }
  };
  if (pool)
    pool->parallel_for(parts, run, 1);
  else
    run(0, parts);
}

bool weights_stay_mapped() {
  const char* e = std::getenv("MM3_MMAP_WEIGHTS");
  return e && *e && std::string(e) != "0";
}

namespace {

// A bf16 weight streamed at every decode step is copied out of the file mapping into huge-page
// memory (core/tensor.cpp alloc_aligned) and its mapped pages released: same bytes, same resident
// size, but the stream no longer walks 4 KiB file pages (full size: ar_frame 1.21 s -> 0.57 s,
// depth_frame 0.21 s -> 0.16 s; loading costs more, the fresh pages being zeroed).
// MM3_MMAP_WEIGHTS=1 keeps the zero-copy views (fast load, slow frames; for comparison).
// A mapped source is faulted in chunk by chunk just before its copy (populate_read).
void copy_bytes(void* dst, const void* src, size_t n, const ThreadPool* pool, bool mapped) {
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  const size_t chunk = kPopulateChunk;
  const int64_t parts = static_cast<int64_t>((n + chunk - 1) / chunk);
  auto copy = [&](int64_t i) {
    const size_t b = static_cast<size_t>(i) * chunk, e = std::min(n, b + chunk);
    if (mapped) populate_read(s + b, e - b);
    std::memcpy(d + b, s + b, e - b);
  };
  if (pool) {
    pool->parallel_for(parts, [&](int64_t b, int64_t e) { for (int64_t i = b; i < e; ++i) copy(i); }, 1);
  } else {
    for (int64_t i = 0; i < parts; ++i) copy(i);
  }
}

Tensor resident_copy(const Tensor& w, const ThreadPool* pool) {
  if (!w.is_borrowed() || w.nbytes() < (size_t(4) << 20) || weights_stay_mapped()) return w;
  Tensor src = w.contiguous();
  Tensor dst = Tensor::empty(w.dtype(), w.shape());
  copy_bytes(dst.raw(), src.raw(), w.nbytes(), pool, src.is_borrowed());
  release_mapped_pages(w);
  return dst;
}

std::shared_ptr<const kern::QuantMatrix> with_strips(const kern::QuantMatrix& q, const ThreadPool* pool) {
  if (pool) return kern::with_strips(*pool, q);
  ThreadPool local(0);
  return kern::with_strips(local, q);
}

// A sidecar's codes and scales, copied out of the file mapping into one huge-page allocation (as
// quantize_weight allocates them) for the reason resident_copy gives. Mapped zero-copy, the sidecar's
// 4 KiB pages made every quantized frame far slower than quantizing at load did (full size, Zen 5, the
// same binary and hour: ar_frame_int8 0.287 s quantized at load, 0.639 s mapped; q4 0.264 / 0.390 s).
// Where quant_strips_for(K), the strip form is built instead, and the row form stays a mapped view.
std::shared_ptr<const kern::QuantMatrix> resident_quant(QuantType t, int64_t N, int64_t K, const Tensor& qs,
                                                        const Tensor& sc, const ThreadPool* pool) {
  if (weights_stay_mapped()) return std::make_shared<const kern::QuantMatrix>(t, N, K, qs, sc);
  const bool strips = quant_strips_for(K);
  if (strips && !quant_strips_keep_rows()) {
    populate_mapped_pages(qs, pool);
    populate_mapped_pages(sc, pool);
    auto q = with_strips(kern::QuantMatrix(t, N, K, qs, sc), pool);
    release_mapped_pages(qs);
    release_mapped_pages(sc);
    return q;
  }
  std::vector<Tensor> g = Tensor::empty_group({{qs.dtype(), qs.shape()}, {sc.dtype(), sc.shape()}});
  copy_bytes(g[0].raw(), qs.raw(), qs.nbytes(), pool, qs.is_borrowed());
  copy_bytes(g[1].raw(), sc.raw(), sc.nbytes(), pool, sc.is_borrowed());
  release_mapped_pages(qs);
  release_mapped_pages(sc);
  const kern::QuantMatrix rows(t, N, K, std::move(g[0]), std::move(g[1]));
  if (strips) return with_strips(rows, pool);  // MM3_QUANT_STRIPS=2: both forms resident
  return std::make_shared<const kern::QuantMatrix>(rows);
}
}  // namespace

namespace {
std::string quant_strips_env() {
  const char* e = std::getenv("MM3_QUANT_STRIPS");
  return e ? std::string(e) : std::string();
}
}  // namespace

bool quant_strips_keep_rows() { return quant_strips_env() == "2"; }

bool quant_strips_for(int64_t K) {
  if (weights_stay_mapped() || !kern::quant_strips_offered()) return false;
  const std::string e = quant_strips_env();
  if (e == "0") return false;
  return e == "3" || kern::quant_strips_pay(K);
}

// Whether a plain BF16 weight is held in the strip form (kern::bf16_strips): where the CPU offers its
// GEMV, unless MM3_BF16_STRIPS=0 (the row-major copy, for comparison) or MM3_MMAP_WEIGHTS=1.
// Thirty-second session, Zen 4 (docs/performance-history.md): the strip GEMV streams at a plain
// sum's rate where the row-major one loses ~1/6 to the L1 fills of x.
namespace {
bool use_bf16_strips(const Tensor& w) {
  if (w.dtype() != DType::BF16 || w.ndim() != 2 || weights_stay_mapped() || !kern::bf16_strips_offered()) return false;
  const char* e = std::getenv("MM3_BF16_STRIPS");
  return !(e && std::string(e) == "0");
}
}  // namespace

kern::LinearWeight make_linear(const Tensor& w, const std::string& key, QuantType t, const QuantLoad& q) {
  if (t == QuantType::None && use_bf16_strips(w)) {
    const Tensor src = w.contiguous();
    populate_mapped_pages(src, q.pool);
    kern::LinearWeight lw =
        kern::bf16_strips(static_cast<const uint16_t*>(src.raw()), w.dim(1), w.dim(0), w.dim(1), q.pool);
    release_mapped_pages(w);
    return lw;
  }
  if (t == QuantType::None) return kern::LinearWeight(resident_copy(w, q.pool));
  const int64_t N = w.dim(0), K = w.dim(1);
  if (q.sidecar) {
    const SafetensorsFile& f = *q.sidecar;
    const std::string kq = key + ".qs", ks = key + ".scales";
    const auto& md = f.metadata();
    auto it = md.find("mm3.type." + key);
    if (!f.contains(kq) || !f.contains(ks) || it == md.end())
      throw BadModel(fmt::format("{}: no quantized tensors for '{}' (rerun mm3 quantize)", f.path(), key));
    if (it->second != kern::quant_name(t))
      throw BadModel(fmt::format("{}: '{}' is stored as {}, expected {}", f.path(), key, it->second, kern::quant_name(t)));
    const Shape want_q = {N, kern::quant_row_qs_bytes(t, K) / 4}, want_s = {N, kern::quant_row_scales(t, K)};
    const TensorInfo &iq = f.info(kq), &is = f.info(ks);
    if (iq.dtype != DType::I32 || iq.shape != want_q || is.dtype != DType::F16 || is.shape != want_s)
      throw BadModel(fmt::format("{}: '{}' is {}{} / {}{}, expected I32{} / F16{} for a [{}, {}] {} weight", f.path(),
                                 key, dtype_name(iq.dtype), shape_str(iq.shape), dtype_name(is.dtype),
                                 shape_str(is.shape), shape_str(want_q), shape_str(want_s), N, K, kern::quant_name(t)));
    return kern::LinearWeight(resident_quant(t, N, K, f.get(kq), f.get(ks), q.pool));
  }
  std::shared_ptr<const kern::QuantMatrix> qm;
  populate_mapped_pages(w, q.pool);
  if (q.pool) {
    qm = kern::quantize_weight(*q.pool, w, t);
  } else {
    ThreadPool local(0);
    qm = kern::quantize_weight(local, w, t);
  }
  release_mapped_pages(w);
  return kern::LinearWeight(std::move(qm));
}

void append_quant_tensors(const std::string& key, const kern::LinearWeight& w,
                          std::vector<std::pair<std::string, Tensor>>& tensors,
                          std::map<std::string, std::string>& metadata) {
  MM3_CHECK(w.quantized(), "append_quant_tensors: '{}' is not quantized", key);
  tensors.emplace_back(key + ".qs", w.quant()->qs());
  tensors.emplace_back(key + ".scales", w.quant()->scales());
  metadata["mm3.type." + key] = kern::quant_name(w.quant_type());
}

}  // namespace mm3
