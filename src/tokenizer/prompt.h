// prompt.h — the Music3 prompt contract, MODEL.md §2.1 (caption cleaning, lyrics normalization,
// template, refusals) and §2.2 (the unconditional CFG row), plus the §1.7 special-token check.
//
// The cleaning functions reproduce the reference's Python (`re` with Unicode `\s`, `str.splitlines`,
// `str.strip`, `str.lower`) string for string; they are hand-written scanners, not a regex engine,
// because each pattern's backtracking resolves deterministically and PCRE2's `\s` is not Python's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.h"
#include "core/tensor.h"
#include "tokenizer/tokenizer.h"

namespace mm3 {

// MODEL.md §1.7: the ids the model was trained with.
namespace music3 {
inline constexpr int32_t kImStart = 151644;       // <|im_start|>
inline constexpr int32_t kImEnd = 151645;         // <|im_end|>
inline constexpr int32_t kAudioCfg = 151654;      // <|audio_cfg|> (the unconditional filler)
inline constexpr int32_t kAudioStart = 151669;    // <|audio_start|>
inline constexpr int32_t kAudioEnd = 151670;      // <|audio_end|> (the AR stop token)
inline constexpr int32_t kCaptionStart = 151671;  // <|caption_start|>
inline constexpr int32_t kCaptionEnd = 151672;    // <|caption_end|>
inline constexpr int32_t kLyricsStart = 151673;   // <|lyrics_start|>
inline constexpr int32_t kLyricsEnd = 151674;     // <|lyrics_end|>
inline constexpr int32_t kAudioCodeOffset = 151675;  // c0 code c is LM row 151675 + c (a number, not a token)
inline constexpr int64_t kMaxPromptTokens = 5000;    // _MAX_PROMPT_TOKENS
// The golden set (prompt_errors.jsonl row 4) records the reference refusing a 2470-token prompt whose
// text is ~7400 code points, so it also caps the prompt text's length: see build_prompt.
inline constexpr int64_t kMaxPromptChars = 5000;
}  // namespace music3

// The nine special tokens with their required ids (MODEL.md §1.7 table, in table order).
struct SpecialTokenId {
  const char* token;
  int32_t id;
};
const std::vector<SpecialTokenId>& music3_special_tokens();

// BadModel naming the token when `tok` does not map each of the nine to its id (as an added token
// that is matched literally and never split).
void validate_music3_tokenizer(const Tokenizer& tok);

// Tokenizer::from_file(dir/tokenizer/tokenizer.json) + validate_music3_tokenizer.
Tokenizer load_music3_tokenizer(const std::filesystem::path& checkpoint_dir);

// §2.1 `_clean_caption` and `_normalize_lyrics` on UTF-8 (InvalidInput on invalid UTF-8).
std::string clean_caption(std::string_view caption);
std::string normalize_lyrics(std::string_view lyrics);

// Why a prompt was refused. The golden set's wording for each is reason_text().
enum class PromptRefusal { empty_caption, blank_caption, empty_lyrics, blank_lyrics, too_long };
const char* reason_text(PromptRefusal r);  // "empty caption", ..., "too long"

// An InvalidInput that also says which rule refused the prompt; for too_long, the prompt's token
// count (-1 when counting stopped early, see build_prompt) and its length in code points.
class PromptRefused : public InvalidInput {
 public:
  PromptRefused(PromptRefusal r, const std::string& msg, int64_t tokens = -1, int64_t chars = -1)
      : InvalidInput(msg), reason_(r), tokens_(tokens), chars_(chars) {}
  PromptRefusal reason() const { return reason_; }
  int64_t tokens() const { return tokens_; }
  int64_t chars() const { return chars_; }

 private:
  PromptRefusal reason_;
  int64_t tokens_, chars_;
};

struct Prompt {
  std::string clean_caption;
  std::string normalized_lyrics;
  std::string text;                 // the template filled in
  std::vector<int32_t> cond_ids;    // [n], starts <|im_start|>, ends <|im_end|><|audio_start|>
  std::vector<int32_t> uncond_ids;  // [n], cond_ids with [1, n-2) replaced by <|audio_cfg|>
  // The LM input batch [2, n] I64: row 0 cond, row 1 uncond.
  Tensor ids_tensor() const;
};

// The whole contract. Throws PromptRefused for an empty or blank caption or lyrics (checked in that
// order, before cleaning), and (too_long) for a prompt of more than max_tokens tokens (MODEL.md §2.1)
// or whose text has more than max_chars code points (the golden's refusal of a 2470-token, ~7400
// code-point prompt; no accepted golden prompt is near either limit). Tokens are counted exactly up
// to 10 x max_tokens and counting stops there; a text over 10 x max_chars is refused untokenized.
// So a huge lyric costs time bounded by the limits (plus the linear cleaning), not by its size.
// InvalidInput for invalid UTF-8, naming the input and the byte offset.
Prompt build_prompt(const Tokenizer& tok, std::string_view caption, std::string_view lyrics,
                    int64_t max_tokens = music3::kMaxPromptTokens, int64_t max_chars = music3::kMaxPromptChars);

// The §2.2 unconditional row of any cond row (n >= 3).
std::vector<int32_t> make_uncond_ids(const std::vector<int32_t>& cond_ids);

}  // namespace mm3
