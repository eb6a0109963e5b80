// stage_tokenizer.cpp — `mm3 bench` stage that times Tokenizer::encode (MODEL.md §1.7, §6) of a long
// lyric of ~5000 tokens (the prompt limit, music3::kMaxPromptTokens), with the checkpoint's
// tokenizer/tokenizer.json. The lyric is deterministic synthetic text: section tags, English lines and
// Chinese lines (the two scripts the golden prompts use), grown line by line in setup until it
// encodes to >= 5000 tokens. Raw encode is timed, not build_prompt, whose 5000-code-point cap
// (music3::kMaxPromptChars) refuses a 5000-token text in most scripts.
#include <cctype>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench_stages.h"
#include "core/errors.h"
#include "tokenizer/prompt.h"
#include "tokenizer/tokenizer.h"

namespace mm3::bench {
namespace {

constexpr int64_t kTargetTokens = 5000;

// One synthetic lyric line from a small deterministic generator (an LCG picking words).
std::string lyric_line(uint64_t& state, int line_no) {
  static const char* const en[] = {"night", "river", "light",  "we",     "run",   "through", "the",   "city",
                                   "and",   "I",     "hold",   "your",   "hand",  "under",   "falling", "stars",
                                   "never", "let",   "go",     "dancing", "in",   "silver",  "rain",  "heart",
                                   "beats", "like",  "a",      "drum",   "oh",    "yeah",    "tonight", "forever"};
  static const char* const zh[] = {"夜", "空", "星", "光", "我", "们", "一", "起", "走", "过", "城", "市",
                                   "的", "雨", "心", "跳", "像", "鼓", "声", "永", "远", "不", "放", "手"};
  static const char* const tags[] = {"[Verse]", "[Chorus]", "[Bridge]", "[Pre-Chorus]", "[Outro]"};
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  std::string s;
  if (line_no % 8 == 0) return std::string(tags[next() % 5]) + "\n";
  const int words = 5 + static_cast<int>(next() % 6);
  if (line_no % 3 == 2) {
    for (int w = 0; w < words * 2; ++w) s += zh[next() % (sizeof(zh) / sizeof(zh[0]))];
  } else {
    for (int w = 0; w < words; ++w) {
      if (w) s += ' ';
      std::string word = en[next() % (sizeof(en) / sizeof(en[0]))];
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      s += word;
    }
    if (next() % 4 == 0) s += ",";
  }
  return s + "\n";
}

RegisterStage reg_tokenize{{
    .name = "tokenize_5000",
    .description = "Tokenizer::encode of a ~5000-token synthetic lyric (tags, English and Chinese lines) with the "
                   "checkpoint's tokenizer.json; bytes = UTF-8 input bytes",
    .needs_model = true,
    .setup =
        [](const BenchContext& ctx) {
          auto tok = std::make_shared<Tokenizer>(load_music3_tokenizer(ctx.checkpoint().dir()));
          auto text = std::make_shared<std::string>();
          uint64_t state = 12345;
          int64_t n = 0;
          for (int line = 0; n < kTargetTokens; ++line) {
            // Add lines in batches of 20 and count each time (encoding is fast; setup is untimed).
            for (int i = 0; i < 20; ++i) *text += lyric_line(state, line * 20 + i);
            n = static_cast<int64_t>(tok->encode(*text).size());
            if (line > 10000) throw InternalError("tokenize_5000: the lyric generator does not reach 5000 tokens");
          }
          int64_t cps = 0;
          for (unsigned char ch : *text) cps += (ch & 0xC0) != 0x80;
          StageRun r;
          auto sink = std::make_shared<int64_t>(0);
          r.run = [tok, text, sink] {
            EncodeOptions opt;
            opt.what = "lyrics";
            *sink += static_cast<int64_t>(tok->encode(*text, opt).size());
          };
          r.bytes = static_cast<double>(text->size());
          r.info = {{"tokens", n},
                    {"utf8_bytes", text->size()},
                    {"code_points", cps},
                    {"tokens_per_s", "tokens / median_s (info is fixed at setup)"}};
          return r;
        },
}};

}  // namespace
}  // namespace mm3::bench
