// tokenizer_prompt_test.cpp — unit tests of the Music3 prompt contract (MODEL.md §2.1, §2.2, §1.7):
// the published examples, the Python-semantics corners (Unicode whitespace, splitlines, str.lower),
// the refusals and the token limit boundary. Prompt-id tests need the golden tokenizer and skip
// loudly without it; the cleaning tests need nothing.
#include <chrono>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/errors.h"
#include "tokenizer/prompt.h"

namespace {

namespace fs = std::filesystem;
using mm3::PromptRefusal;

const fs::path kCheckpoint = fs::path(MM3_GOLDEN_DIR) / "checkpoint";

const mm3::Tokenizer* golden_tokenizer() {
  static const std::unique_ptr<mm3::Tokenizer> t = []() -> std::unique_ptr<mm3::Tokenizer> {
    if (!fs::exists(kCheckpoint / "tokenizer" / "tokenizer.json")) return nullptr;
    return std::make_unique<mm3::Tokenizer>(mm3::load_music3_tokenizer(kCheckpoint));
  }();
  return t.get();
}

#define NEED_GOLDEN()                                       \
  const mm3::Tokenizer* gt = golden_tokenizer();            \
  if (!gt) GTEST_SKIP() << "golden tokenizer not found under " << kCheckpoint << " (needs ../shared)"

PromptRefusal refusal_of(const mm3::Tokenizer& t, const std::string& caption, const std::string& lyrics,
                         std::string* msg = nullptr, int64_t limit = mm3::music3::kMaxPromptTokens) {
  try {
    mm3::build_prompt(t, caption, lyrics, limit);
  } catch (const mm3::PromptRefused& e) {
    if (msg) *msg = e.what();
    return e.reason();
  }
  ADD_FAILURE() << "not refused: caption=" << caption.substr(0, 40) << " lyrics=" << lyrics.substr(0, 40);
  return PromptRefusal::too_long;
}

TEST(PromptClean, CaptionExampleOfModelMd) {
  EXPECT_EQ(mm3::clean_caption("# Global\n- Warm **pop**\n---\n<|bpm 92|>"), "Global\nWarm pop\nbpm is 92");
}

TEST(PromptClean, LyricsExamplesOfModelMd) {
  EXPECT_EQ(mm3::normalize_lyrics("[Verse]\nHello\n[CHORUS]\nWorld"), "[start]\n[verse]\nHello\n[chorus]\nWorld");
  EXPECT_EQ(mm3::normalize_lyrics("[Verse] This is dropped"), "[start]\n[verse]");
  EXPECT_EQ(mm3::normalize_lyrics("[Verse] [Chorus]\nLine"), "[start]\n[verse]\n[chorus]\nLine");
}

TEST(PromptClean, CaptionTags) {
  EXPECT_EQ(mm3::clean_caption("<|  genre   rock  pop |>"), "genre is rock  pop");
  EXPECT_EQ(mm3::clean_caption("<|mood|>"), "mood");
  EXPECT_EQ(mm3::clean_caption("<||>x"), "x");
  EXPECT_EQ(mm3::clean_caption("<|a|b|>"), "<|a|b|>");  // [^|]* stops at the first '|', then needs '>'
  EXPECT_EQ(mm3::clean_caption("<|a\nb|>"), "a is b");   // [^|] spans newlines, split(None) too
}

TEST(PromptClean, CaptionMarkdown) {
  EXPECT_EQ(mm3::clean_caption("#### four\n####### seven\n    # indented four"),
            "four\n####### seven\n# indented four");  // the 4-space run is removed by step 5, after step a
  EXPECT_EQ(mm3::clean_caption("* * double bullet"), "double bullet");
  EXPECT_EQ(mm3::clean_caption("***bold* x**"), "***bold* x**");  // neither pattern matches anywhere
  EXPECT_EQ(mm3::clean_caption("a *it* b **c** *d**"), "a it b c *d**");
  EXPECT_EQ(mm3::clean_caption("• dotted    indented"), "dottedindented");
}

TEST(PromptClean, CaptionRulesSpanBlankLines) {
  // ^\s* starts after the first "\n" and swallows the blank line; $ backtracks to the last "\n".
  EXPECT_EQ(mm3::clean_caption("a\n\n---\n\nb"), "a\nb");
  EXPECT_EQ(mm3::clean_caption("---\n\n***"), "");
  EXPECT_EQ(mm3::clean_caption("a\n --- x"), "a\n --- x");
}

TEST(PromptClean, CaptionUsesPythonWhitespaceAndSplitlines) {
  // U+001C..U+001E split lines; U+001F is whitespace (rstrip) but not a line break; NBSP is \s.
  EXPECT_EQ(mm3::clean_caption("a\x1c" "b\x1d" "c\xe2\x80\xa8" "d"), "a\nb\nc\nd");
  EXPECT_EQ(mm3::clean_caption("a\x1f\r\nb\xc2\xa0"), "a\nb");
  EXPECT_EQ(mm3::clean_caption("\xc2\xa0#\xc2\xa0title"), "title");
  EXPECT_EQ(mm3::clean_caption("x\n"), "x");  // splitlines keeps no trailing empty line
  EXPECT_EQ(mm3::clean_caption("   padded   \n\n\n   "), "   padded\n");
}

TEST(PromptClean, LyricsPythonLower) {
  EXPECT_EQ(mm3::normalize_lyrics("[\xc4\xb0]"), "[start]\n[i\xcc\x87]");  // U+0130 -> i + U+0307
  EXPECT_EQ(mm3::normalize_lyrics("[\xce\x9f\xce\x94\xce\x9f\xce\xa3]"),
            "[start]\n[\xce\xbf\xce\xb4\xce\xbf\xcf\x82]");  // ΟΔΟΣ -> οδος (final sigma)
  EXPECT_EQ(mm3::normalize_lyrics("[\xce\xa3\xce\x91]"), "[start]\n[\xcf\x83\xce\xb1]");  // ΣΑ -> σα
  EXPECT_EQ(mm3::normalize_lyrics("[\xce\xa3]"), "[start]\n[\xcf\x83]");                  // lone Σ -> σ
  EXPECT_EQ(mm3::normalize_lyrics("[CAFÉ Ärger]"), "[start]\n[café ärger]");
}

TEST(PromptClean, LyricsTagRules) {
  EXPECT_EQ(mm3::normalize_lyrics("  [A][B]\t x"), "[start]\n[a][b]");
  EXPECT_EQ(mm3::normalize_lyrics("[] text"), "[start]\n[]\ntext");      // "[]" is no tag
  EXPECT_EQ(mm3::normalize_lyrics("la [Multi\nLine] x"), "[start]\nla\n[multi\nline]\nx");
  EXPECT_EQ(mm3::normalize_lyrics("a ^ b ^ c"), "[start]\na\nb\nc");
  EXPECT_EQ(mm3::normalize_lyrics("x\n"), "[start]\nx\n");  // split("\n") keeps the empty last line
  EXPECT_EQ(mm3::normalize_lyrics("[[Nested]"), "[start]\n[[nested]");
}

TEST(PromptIds, FortyIdExampleOfModelMd) {
  NEED_GOLDEN();
  const mm3::Prompt p = mm3::build_prompt(*gt, "Global\nbpm is 96\nWarm female vocal",
                                          "[verse]\nHello\n[chorus]\nStay\nTogether\n[bridge][solo]");
  const std::vector<int32_t> want = {151644, 151671, 11646, 198,   65,    5187,  374,    220,    24,    21,
                                     198,    95275,  8778,  25407, 151672, 151673, 28463, 921,    58,    4450,
                                     921,    9707,   198,   58,    6150,  355,   921,    38102,  198,   80987,
                                     198,    58,     13709, 1457,  82,    10011, 60,     151674, 151645, 151669};
  EXPECT_EQ(p.cond_ids, want);
  std::vector<int32_t> uncond(40, 151654);
  uncond[0] = 151644, uncond[38] = 151645, uncond[39] = 151669;
  EXPECT_EQ(p.uncond_ids, uncond);
  const mm3::Tensor t = p.ids_tensor();
  EXPECT_EQ(t.shape(), (mm3::Shape{2, 40}));
  EXPECT_EQ(t.data<int64_t>()[40], 151644);
  EXPECT_EQ(t.data<int64_t>()[41], 151654);
}

TEST(PromptIds, Refusals) {
  NEED_GOLDEN();
  EXPECT_EQ(refusal_of(*gt, "", "la"), PromptRefusal::empty_caption);
  EXPECT_EQ(refusal_of(*gt, " \n\t\xe3\x80\x80", "la"), PromptRefusal::blank_caption);  // U+3000 is blank
  EXPECT_EQ(refusal_of(*gt, "\x1c", "la"), PromptRefusal::blank_caption);  // Python strips U+001C
  EXPECT_EQ(refusal_of(*gt, "pop", ""), PromptRefusal::empty_lyrics);
  EXPECT_EQ(refusal_of(*gt, "pop", "\n\t"), PromptRefusal::blank_lyrics);
  std::string msg;
  refusal_of(*gt, "pop", "", &msg);
  EXPECT_NE(msg.find("lyrics"), std::string::npos) << msg;
  // Caption is checked first.
  EXPECT_EQ(refusal_of(*gt, "", ""), PromptRefusal::empty_caption);
  try {
    mm3::build_prompt(*gt, "pop", "la \xff");
    FAIL() << "accepted invalid UTF-8 lyrics";
  } catch (const mm3::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("lyrics: not valid UTF-8 at byte offset 3"), std::string::npos) << e.what();
  }
}

TEST(PromptIds, LimitBoundaryIsExact) {
  NEED_GOLDEN();
  const mm3::Prompt p = mm3::build_prompt(*gt, "pop", "la la la la la la");
  const int64_t n = static_cast<int64_t>(p.cond_ids.size());
  EXPECT_NO_THROW(mm3::build_prompt(*gt, "pop", "la la la la la la", n));
  std::string msg;
  EXPECT_EQ(refusal_of(*gt, "pop", "la la la la la la", &msg, n - 1), PromptRefusal::too_long);
  EXPECT_NE(msg.find(fmt::format("prompt has {} tokens > {}", n, n - 1)), std::string::npos) << msg;
}

TEST(PromptIds, TextLengthCapMatchesTheGoldenRefusal) {
  NEED_GOLDEN();
  // prompt_errors.jsonl row 4: 2470 tokens, refused; its text is over 5000 code points.
  const std::string base(100, 'a');
  const int64_t fixed = static_cast<int64_t>(mm3::build_prompt(*gt, "x", base).text.size()) - 100;
  const std::string fits(static_cast<size_t>(mm3::music3::kMaxPromptChars - fixed), 'a');
  EXPECT_EQ(static_cast<int64_t>(mm3::build_prompt(*gt, "x", fits).text.size()), mm3::music3::kMaxPromptChars);
  std::string msg;
  EXPECT_EQ(refusal_of(*gt, "x", fits + "a", &msg), PromptRefusal::too_long);
  EXPECT_NE(msg.find("characters > 5000"), std::string::npos) << msg;
  // Code points, not bytes: 1600 x "我" is 4800 bytes of lyrics but 1600 characters.
  std::string cjk;
  for (int i = 0; i < 1600; ++i) cjk += "\xe6\x88\x91";
  EXPECT_NO_THROW(mm3::build_prompt(*gt, "x", cjk));
}

TEST(PromptIds, HundredKilobyteLyricIsRefusedQuickly) {
  NEED_GOLDEN();
  std::string lyrics;
  while (lyrics.size() < 100 * 1024) lyrics += "[Verse]\nwalking down the avenue tonight, 我爱你 ^ 2024\n";
  // Best of three: the cost of the code, not of whoever else shares the cores.
  const auto best_ms = [&](const std::string& text, std::string& msg) {
    double best = 1e30;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_EQ(refusal_of(*gt, "pop", text, &msg), PromptRefusal::too_long);
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  std::string msg;
  const double ms = best_ms(lyrics, msg);
  std::printf("[ timing ] %zu-byte lyric refused in %.2f ms: %s\n", lyrics.size(), ms, msg.c_str());
  EXPECT_NE(msg.find("> 5000"), std::string::npos) << msg;
  EXPECT_LT(ms, 100.0);
  // A 2 MB lyric: tokenization stops past 10x the limit; cleaning and NFC stay linear in its size.
  std::string huge;
  while (huge.size() < 2 * 1024 * 1024) huge += lyrics;
  const double ms2 = best_ms(huge, msg);
  std::printf("[ timing ] %zu-byte lyric refused in %.2f ms: %s\n", huge.size(), ms2, msg.c_str());
  EXPECT_NE(msg.find("(not tokenized)"), std::string::npos) << msg;
  EXPECT_LT(ms2, 1000.0);
  // Past the token limit but under 10x the text cap: counted up to 50000 tokens, then stopped.
  std::string dense;
  while (dense.size() < 40000) dense += "1 2 3 4 5 6 7 8 9 ";  // 2 tokens per 2 characters
  const double ms3 = best_ms(dense, msg);
  std::printf("[ timing ] %zu-byte lyric refused in %.2f ms: %s\n", dense.size(), ms3, msg.c_str());
  EXPECT_NE(msg.find("prompt has"), std::string::npos) << msg;
  EXPECT_LT(ms3, 100.0);
  // A 100 KB run of spaces is one BPE word; it is refused without tokenizing it.
  const double ms4 = best_ms("la" + std::string(100 * 1024, ' ') + "la", msg);
  std::printf("[ timing ] 100 KB whitespace lyric refused in %.2f ms: %s\n", ms4, msg.c_str());
  EXPECT_LT(ms4, 100.0);
}

}  // namespace
