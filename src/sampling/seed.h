// seed.h — seed derivation of the official server (MODEL.md §2.6 AR sampling seed, §4.5 per-window DiT
// noise seed), built on BLAKE2b (RFC 7693). No kernels.
//
// Reference vectors (golden/README.md): ar_sampling_seed(0) = 411363039, (3) = 122074423,
// (42) = 1153769322; derive_seed(3, "dit", 0) = 1648571301556962109, derive_seed(3, "dit", 1) =
// 5080984550091710395.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mm3 {

// BLAKE2b with no key, digest length `out_len` (1..64), optional 16-byte personalization (shorter
// strings are zero-padded, longer ones are an InvalidInput error).
std::vector<uint8_t> blake2b(const void* data, size_t n, size_t out_len, std::string_view person = {});

// The AR sampler's seed: u64_le(blake2b(utf8("minimax-ttm-ar:" + decimal(seed)), 8 bytes)) & 0x7FFFFFFF.
uint64_t ar_sampling_seed(uint64_t seed);

// The generic derivation: u64_le(blake2b(person "minimax-ttm", digest 8, data = u64_le(seed) ‖ for each
// part: u32_le(len(utf8(part))) ‖ utf8(part))) & (2^63 − 1).
uint64_t derive_seed(uint64_t seed, const std::vector<std::string>& parts);
// The acoustic stage's per-window noise seed: derive_seed(seed, {"dit", decimal(chunk_idx)}).
uint64_t derive_seed(uint64_t seed, std::string_view stage, int64_t chunk_idx);

}  // namespace mm3
