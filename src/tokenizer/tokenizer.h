// tokenizer.h — the Hugging Face byte-level BPE tokenizer of MODEL.md §1.7 / §6, read from a
// `tokenizer.json`, reproducing the Rust `tokenizers` library id for id.
//
// Encoding pipeline (the order matters and is the library's):
//   1. added tokens with normalized:false are matched literally on the raw text, leftmost-longest,
//      and never split (the Music3 special tokens are all of this kind);
//   2. each remaining piece is NFC-normalized (utf8proc); added tokens with normalized:true are then
//      matched on the normalized piece;
//   3. the Split pre-tokenizer cuts it with the file's regex (PCRE2, UTF + UCP + JIT; `\s` rewritten
//      to the Unicode White_Space set that the library's Oniguruma uses), behaviour Isolated;
//   4. ByteLevel maps bytes to the vocab's printable alphabet — done once at load, by converting the
//      vocab and merges to raw bytes, so encoding works on bytes directly;
//   5. BPE merges each pre-token by merge rank (lowest rank first, leftmost on ties), with a heap.
// No BOS/EOS, no post-processing. Anything in the file this engine does not implement (another
// normalizer or pre-tokenizer, dropout, byte fallback, lstrip/rstrip tokens, ...) is a BadModel at load
// naming the field, never a silently different tokenization.
//
// A Tokenizer is immutable after loading and cheap to copy (shared state); it is safe to use from
// several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mm3 {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
};

struct EncodeOptions {
  // Stop once more than this many ids were produced (-1: no limit). The result then holds exactly
  // max_tokens + 1 ids, each one right: a caller enforcing a limit learns "over" without tokenizing
  // a huge input to the end.
  int64_t max_tokens = -1;
  // Names the input in error messages ("lyrics: not valid UTF-8 at byte offset 12 ...").
  std::string_view what = "text";
};

class Tokenizer {
 public:
  // Loads and validates a tokenizer.json; BadModel naming the file and field on any defect.
  static Tokenizer from_file(const std::filesystem::path& path);
  // Same from parsed JSON; `source` names it in messages (tests build small tokenizers this way).
  static Tokenizer from_json(const nlohmann::json& j, const std::string& source);

  // UTF-8 text -> ids. InvalidInput (naming opt.what and the byte offset) on invalid UTF-8.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;
  // ids -> text: token bytes concatenated, invalid UTF-8 replaced by U+FFFD (as the ByteLevel
  // decoder does). InvalidInput naming the id when an id has no token.
  std::string decode(std::span<const int32_t> ids) const;
  // The raw bytes of one token (no U+FFFD replacement); InvalidInput when the id has no token.
  std::string token_bytes(int32_t id) const;
  // The token as the file spells it (byte-level alphabet for vocab tokens, content for added ones).
  std::string id_to_token(int32_t id) const;
  // Inverse of id_to_token: a vocab token in the byte-level alphabet, or an added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  int32_t vocab_size() const;  // 1 + the highest id of any token
  bool has_id(int32_t id) const;
  size_t num_merges() const;
  const std::vector<AddedToken>& added_tokens() const;
  const std::string& source() const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// For `mm3 bench` and the unit tests: encodes `text` `iters` times (after one warm-up) and reports
// the token count and per-call wall times.
struct TokenizeTiming {
  int64_t tokens = 0;
  int64_t bytes = 0;
  int iters = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;
};
TokenizeTiming time_encode(const Tokenizer& tok, std::string_view text, int iters);

}  // namespace mm3
