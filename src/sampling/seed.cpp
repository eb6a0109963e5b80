// seed.cpp — BLAKE2b (RFC 7693, written from the RFC's description) and the seed derivations of
// MODEL.md §2.6 / §4.5.
#include "sampling/seed.h"

#include <cstring>

#include "core/errors.h"

namespace mm3 {

namespace {

constexpr uint64_t kIv[8] = {0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
                             0xa54ff53a5f1d36f1ull, 0x510e527fade682d1ull, 0x9b05688c2b3e6c1full,
                             0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull};

constexpr uint8_t kSigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

inline uint64_t rotr64(uint64_t x, int r) { return (x >> r) | (x << (64 - r)); }

inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void compress(uint64_t h[8], const uint8_t block[128], uint64_t t_lo, uint64_t t_hi, bool last) {
  uint64_t m[16], v[16];
  for (int i = 0; i < 16; ++i) m[i] = load_le64(block + 8 * i);
  for (int i = 0; i < 8; ++i) {
    v[i] = h[i];
    v[i + 8] = kIv[i];
  }
  v[12] ^= t_lo;
  v[13] ^= t_hi;
  if (last) v[14] = ~v[14];
  auto g = [&](int a, int b, int c, int d, uint64_t x, uint64_t y) {
    v[a] = v[a] + v[b] + x;
    v[d] = rotr64(v[d] ^ v[a], 32);
    v[c] = v[c] + v[d];
    v[b] = rotr64(v[b] ^ v[c], 24);
    v[a] = v[a] + v[b] + y;
    v[d] = rotr64(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = rotr64(v[b] ^ v[c], 63);
  };
  for (int r = 0; r < 12; ++r) {
    const uint8_t* s = kSigma[r];
    g(0, 4, 8, 12, m[s[0]], m[s[1]]);
    g(1, 5, 9, 13, m[s[2]], m[s[3]]);
    g(2, 6, 10, 14, m[s[4]], m[s[5]]);
    g(3, 7, 11, 15, m[s[6]], m[s[7]]);
    g(0, 5, 10, 15, m[s[8]], m[s[9]]);
    g(1, 6, 11, 12, m[s[10]], m[s[11]]);
    g(2, 7, 8, 13, m[s[12]], m[s[13]]);
    g(3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i) h[i] ^= v[i] ^ v[i + 8];
}

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t first_u64_le(const std::vector<uint8_t>& d) { return load_le64(d.data()); }

}  // namespace

std::vector<uint8_t> blake2b(const void* data, size_t n, size_t out_len, std::string_view person) {
  if (out_len < 1 || out_len > 64) throw InvalidInput(fmt::format("blake2b: digest length {} not in 1..64", out_len));
  if (person.size() > 16) throw InvalidInput(fmt::format("blake2b: personalization of {} bytes (at most 16)", person.size()));
  uint64_t h[8];
  for (int i = 0; i < 8; ++i) h[i] = kIv[i];
  // Parameter block word 0: digest length, key length 0, fanout 1, depth 1; words 6..7: personalization.
  h[0] ^= 0x01010000ull ^ static_cast<uint64_t>(out_len);
  uint8_t pers[16] = {0};
  std::memcpy(pers, person.data(), person.size());
  h[6] ^= load_le64(pers);
  h[7] ^= load_le64(pers + 8);

  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t t = 0;  // bytes compressed so far (messages here are far below 2^64 bytes)
  uint8_t block[128];
  while (n > 128) {
    t += 128;
    compress(h, p, t, 0, false);
    p += 128;
    n -= 128;
  }
  std::memset(block, 0, sizeof block);
  if (n) std::memcpy(block, p, n);
  t += n;
  compress(h, block, t, 0, true);

  std::vector<uint8_t> out(out_len);
  for (size_t i = 0; i < out_len; ++i) out[i] = static_cast<uint8_t>((h[i / 8] >> (8 * (i % 8))) & 0xFF);
  return out;
}

uint64_t ar_sampling_seed(uint64_t seed) {
  const std::string msg = "minimax-ttm-ar:" + std::to_string(seed);
  return first_u64_le(blake2b(msg.data(), msg.size(), 8)) & 0x7FFFFFFFull;
}

uint64_t derive_seed(uint64_t seed, const std::vector<std::string>& parts) {
  std::string data;
  put_le(data, seed, 8);
  for (const std::string& part : parts) {
    put_le(data, static_cast<uint64_t>(part.size()), 4);
    data += part;
  }
  return first_u64_le(blake2b(data.data(), data.size(), 8, "minimax-ttm")) & 0x7FFFFFFFFFFFFFFFull;
}

uint64_t derive_seed(uint64_t seed, std::string_view stage, int64_t chunk_idx) {
  return derive_seed(seed, {std::string(stage), std::to_string(chunk_idx)});
}

}  // namespace mm3
