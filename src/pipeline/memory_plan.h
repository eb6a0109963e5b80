// memory_plan.h — how much memory a request needs, per stage, checked before the work starts, so that
// a machine too small gets one clear message (exit 4, "out of memory") instead of the kernel's OOM
// killer or a swap storm hours later. Weights are memory-mapped: they are not allocations, but a
// stage's weights must all stay resident while it runs (each AR frame reads every LM weight), so they
// count as needed memory all the same.
//
// Figures: weights = the component's safetensors bytes on disk; the AR stage adds the LM's KV cache
// (2 CFG rows x prompt + frame budget positions, bf16 in the reference profile) and the depth
// decoder's, and prefill scratch; the acoustic stage adds one window's working set (the vocoder's
// largest stage activation x 4 buffers + the DiT's activations: 0.6 GB at the real shapes, where the
// bench measured a 0.9 GB vocoder peak RSS including its weights), and the fp32 vocoder's Winograd
// forms beside its weights (~350 MB at the real shapes: `vocoder_L689` peak RSS 1.25 GB). Estimates, on
// the safe side.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/dit.h"

namespace mm3 {

class Checkpoint;

struct MemoryPlan {
  uint64_t ar_weights = 0, ar_cache = 0, ar_work = 0;           // LM + depth decoder stage
  uint64_t acoustic_weights = 0, acoustic_work = 0;             // condition encoder + DiT + vocoder
  // Part of acoustic_weights: what the fp32 DiT's FF weights add in Strassen's form (MM3_STRASSEN=1,
  // model/dit.h: 3/4 of their fp32 bytes, plus the form's scratch); 0 otherwise.
  uint64_t acoustic_strassen_extra = 0;
  uint64_t limit = 0;                                           // the machine's (or cgroup's) memory
  std::string limit_source;                                     // "MemTotal", "cgroup", "MM3_MEMORY_LIMIT"
  uint64_t ar() const { return ar_weights + ar_cache + ar_work; }
  uint64_t acoustic() const { return acoustic_weights + acoustic_work; }
  uint64_t both() const { return ar() + acoustic(); }
};

// The plan for a request with `prompt_tokens` and a frame budget `max_frames` (a replay of given codes
// still runs the LM teacher-forced for the frame hiddens, so it needs the same).
// `acoustic_precision` BF16: the DiT counted at its bf16 copies' size; `dit_gemm` Int8: at its int8 block
// weights' (see memory_plan.cpp).
MemoryPlan plan_memory(const Checkpoint& ckpt, int64_t prompt_tokens, int64_t max_frames, DType ar_precision,
                       DType acoustic_precision = DType::F32, DitGemm dit_gemm = DitGemm::Exact);

// Usable memory: MM3_MEMORY_LIMIT (bytes, or with a K/M/G/T suffix, powers of 1024) if set, else the
// smaller of MemTotal and the cgroup v2/v1 limit. Throws InvalidInput on a malformed MM3_MEMORY_LIMIT.
uint64_t memory_limit(std::string* source = nullptr);

// Throws OutOfMemory when a single stage does not fit, saying what it needs and what there is.
// Returns true when both stages do not fit together, i.e. the AR models must be freed before the
// acoustic stage (--low-memory) — the caller does that automatically and says so.
bool check_memory(const MemoryPlan& plan);

std::string gib(uint64_t bytes);  // "16.4 GiB"

}  // namespace mm3
