// prompt.cpp — MODEL.md §2.1 / §2.2 prompt contract; see prompt.h. Each scanner below restates one
// `re` pattern of the reference and notes why its backtracking has a single outcome, so a plain
// left-to-right scan over code points gives exactly Python's result.
#include "tokenizer/prompt.h"

#include "tokenizer/unicode.h"

namespace mm3 {

using unicode::py_isspace;
using U32 = std::u32string;
using U32View = std::u32string_view;

const std::vector<SpecialTokenId>& music3_special_tokens() {
  static const std::vector<SpecialTokenId> t = {
      {"<|im_start|>", music3::kImStart},         {"<|im_end|>", music3::kImEnd},
      {"<|audio_cfg|>", music3::kAudioCfg},       {"<|audio_start|>", music3::kAudioStart},
      {"<|audio_end|>", music3::kAudioEnd},       {"<|caption_start|>", music3::kCaptionStart},
      {"<|caption_end|>", music3::kCaptionEnd},   {"<|lyrics_start|>", music3::kLyricsStart},
      {"<|lyrics_end|>", music3::kLyricsEnd},
  };
  return t;
}

void validate_music3_tokenizer(const Tokenizer& tok) {
  for (const auto& st : music3_special_tokens()) {
    const AddedToken* found = nullptr;
    for (const auto& a : tok.added_tokens())
      if (a.content == st.token) found = &a;
    if (!found)
      throw BadModel(fmt::format("{}: special token {} is not an added token; Music3 needs it at id {} (MODEL.md §1.7)",
                                 tok.source(), st.token, st.id));
    if (found->id != st.id)
      throw BadModel(fmt::format("{}: special token {} has id {}; Music3 needs id {} (MODEL.md §1.7)", tok.source(),
                                 st.token, found->id, st.id));
    if (found->normalized)
      throw BadModel(fmt::format("{}: special token {} is marked normalized:true; Music3 matches it on the raw text",
                                 tok.source(), st.token));
  }
}

Tokenizer load_music3_tokenizer(const std::filesystem::path& checkpoint_dir) {
  Tokenizer t = Tokenizer::from_file(checkpoint_dir / "tokenizer" / "tokenizer.json");
  validate_music3_tokenizer(t);
  return t;
}

namespace {

// `<\|([^|]*)\|>` -> parts = group(1).strip().split(None, 1); "a is b" or the stripped inner.
// [^|]* can only end at the first '|' after "<|", so a start either matches there or not at all.
U32 replace_tags(U32View s) {
  U32 out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == U'<' && i + 1 < s.size() && s[i + 1] == U'|') {
      size_t j = i + 2;
      while (j < s.size() && s[j] != U'|') ++j;
      if (j + 1 < s.size() && s[j + 1] == U'>') {
        const U32View inner = unicode::py_strip(s.substr(i + 2, j - i - 2));
        size_t k = 0;
        while (k < inner.size() && !py_isspace(inner[k])) ++k;
        if (k < inner.size()) {  // two parts: str.split(None, 1) drops the whitespace run between
          size_t r = k;
          while (r < inner.size() && py_isspace(inner[r])) ++r;
          out.append(inner.substr(0, k));
          out.append(U" is ");
          out.append(inner.substr(r));
        } else {
          out.append(inner);
        }
        i = j + 2;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// str.splitlines(): \r\n counts once; no trailing empty element.
std::vector<U32> splitlines(U32View s) {
  std::vector<U32> lines;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    if (unicode::py_is_line_break(s[i])) {
      lines.emplace_back(s.substr(start, i - start));
      i += (s[i] == U'\r' && i + 1 < s.size() && s[i + 1] == U'\n') ? 2 : 1;
      start = i;
    } else {
      ++i;
    }
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

size_t skip_space(U32View s, size_t i) {
  while (i < s.size() && py_isspace(s[i])) ++i;
  return i;
}

// `^\s{0,3}#{1,6}\s+`: \s and # are disjoint, so the leading run must be <= 3 long and the # run
// (maximal) 1..6 long and followed by whitespace.
void strip_header(U32& line) {
  const size_t k = skip_space(line, 0);
  if (k > 3) return;
  size_t m = k;
  while (m < line.size() && line[m] == U'#') ++m;
  if (m == k || m - k > 6 || m >= line.size() || !py_isspace(line[m])) return;
  line.erase(0, skip_space(line, m));
}

// `^\s*[chars]\s+` with chars one of the given markers.
void strip_bullet(U32& line, U32View markers) {
  const size_t k = skip_space(line, 0);
  if (k >= line.size() || markers.find(line[k]) == U32View::npos) return;
  if (k + 1 >= line.size() || !py_isspace(line[k + 1])) return;
  line.erase(0, skip_space(line, k + 1));
}

// One re.sub(r"\*\*([^*]+)\*\*", r"\1"): [^*]+ ends at the first '*', which must start "**".
U32 sub_bold(U32View s) {
  U32 out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == U'*' && i + 1 < s.size() && s[i + 1] == U'*') {
      size_t k = i + 2;
      while (k < s.size() && s[k] != U'*') ++k;
      if (k > i + 2 && k + 1 < s.size() && s[k + 1] == U'*') {
        out.append(s.substr(i + 2, k - i - 2));
        i = k + 2;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// re.sub(r"(?<!\*)\*([^*\n]+)\*(?!\*)", r"\1"): the body ends at the first '*' or '\n'; the
// look-behind reads the original string, as Python's does.
U32 sub_italic(U32View s) {
  U32 out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == U'*' && (i == 0 || s[i - 1] != U'*')) {
      size_t k = i + 1;
      while (k < s.size() && s[k] != U'*' && s[k] != U'\n') ++k;
      if (k > i + 1 && k < s.size() && s[k] == U'*' && (k + 1 >= s.size() || s[k + 1] != U'*')) {
        out.append(s.substr(i + 1, k - i - 1));
        i = k + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

// re.sub(r"^\s*[-*_]{3,}\s*$", "", text, flags=re.MULTILINE). ^ is the start or after '\n'; both
// \s* runs are greedy and disjoint from [-*_], so only the trailing one backtracks: to the end of
// the text, or else to the last '\n' inside it ($ before a newline). \s spans newlines.
U32 remove_rules(U32View s) {
  const auto is_rule = [](char32_t c) { return c == U'-' || c == U'*' || c == U'_'; };
  U32 out;
  size_t i = 0;
  while (i <= s.size()) {
    if (i == 0 || s[i - 1] == U'\n') {
      const size_t r = skip_space(s, i);
      size_t q = r;
      while (q < s.size() && is_rule(s[q])) ++q;
      if (q - r >= 3) {
        const size_t w = skip_space(s, q);
        size_t end = U32View::npos;
        if (w == s.size()) {
          end = w;
        } else {
          for (size_t x = w; x > q; --x)
            if (s[x - 1] == U'\n') {
              end = x - 1;
              break;
            }
        }
        if (end != U32View::npos) {
          i = end;  // the match [i, end) is removed; the search resumes at its end (where ^ may match again)
          continue;
        }
      }
    }
    if (i == s.size()) break;
    out.push_back(s[i++]);
  }
  return out;
}

U32 replace_all(U32View s, U32View from, U32View to) {
  U32 out;
  size_t i = 0;
  while (true) {
    const size_t f = s.find(from, i);
    if (f == U32View::npos) break;
    out.append(s.substr(i, f - i));
    out.append(to);
    i = f + from.size();
  }
  out.append(s.substr(i));
  return out;
}

// re.sub(r"\n{2,}", "\n")
U32 squeeze_newlines(U32View s) {
  U32 out;
  for (size_t i = 0; i < s.size(); ++i)
    if (!(s[i] == U'\n' && i > 0 && s[i - 1] == U'\n')) out.push_back(s[i]);
  return out;
}

U32 clean_caption_u32(U32View caption) {
  const U32 tagged = replace_tags(caption);
  U32 joined;
  bool first = true;
  for (U32 line : splitlines(tagged)) {
    strip_header(line);
    strip_bullet(line, U"*+-");
    strip_bullet(line, U"*");
    while (line.find(U"**") != U32::npos) {
      U32 next = sub_bold(line);
      if (next == line) break;
      line = std::move(next);
    }
    line = sub_italic(line);
    if (!first) joined.push_back(U'\n');
    joined.append(unicode::py_rstrip(line));
    first = false;
  }
  U32 t = remove_rules(joined);
  t = replace_all(t, U"\u2022 ", U"");
  t = replace_all(t, U"    ", U"");
  return squeeze_newlines(t);
}

// `^[ \t]*((?:\[[^\]]+\][ \t]*)+)` at the start of a line: each tag's body runs to the first ']'
// and must be non-empty, so the repetition has one possible extent.
U32 keep_leading_tags(U32View line) {
  size_t k = 0;
  while (k < line.size() && (line[k] == U' ' || line[k] == U'\t')) ++k;
  const size_t g = k;
  size_t tags = 0;
  while (k < line.size() && line[k] == U'[') {
    const size_t close = line.find(U']', k + 1);
    if (close == U32View::npos || close == k + 1) break;
    k = close + 1;
    while (k < line.size() && (line[k] == U' ' || line[k] == U'\t')) ++k;
    ++tags;
  }
  if (!tags) return U32(line);
  return U32(unicode::py_strip(line.substr(g, k - g)));
}

// re.sub(r"\[([^\]]+)\]", lambda m: "[" + m.group(1).lower() + "]"): bodies may hold '[' and '\n'.
U32 lower_tags(U32View s) {
  U32 out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == U'[') {
      const size_t close = s.find(U']', i + 1);
      if (close != U32View::npos && close > i + 1) {
        out.push_back(U'[');
        out.append(unicode::py_lower(s.substr(i + 1, close - i - 1)));
        out.push_back(U']');
        i = close + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

U32 normalize_lyrics_u32(U32View lyrics) {
  U32 joined;
  size_t start = 0;
  while (true) {  // str.split("\n") keeps empty pieces, the last one too
    const size_t nl = lyrics.find(U'\n', start);
    const U32View line = lyrics.substr(start, nl == U32View::npos ? U32View::npos : nl - start);
    joined.append(keep_leading_tags(line));
    if (nl == U32View::npos) break;
    joined.push_back(U'\n');
    start = nl + 1;
  }
  U32 t = replace_all(joined, U"] ", U"]\n");
  t = replace_all(t, U" [", U"\n[");
  t = replace_all(t, U" ^ ", U"\n");
  t = lower_tags(t);
  return U"[start]\n" + t;
}

}  // namespace

std::string clean_caption(std::string_view caption) {
  unicode::require_utf8(caption, "caption");
  return unicode::to_utf8(clean_caption_u32(unicode::to_u32(caption)));
}

std::string normalize_lyrics(std::string_view lyrics) {
  unicode::require_utf8(lyrics, "lyrics");
  return unicode::to_utf8(normalize_lyrics_u32(unicode::to_u32(lyrics)));
}

const char* reason_text(PromptRefusal r) {
  switch (r) {
    case PromptRefusal::empty_caption: return "empty caption";
    case PromptRefusal::blank_caption: return "blank caption";
    case PromptRefusal::empty_lyrics: return "empty lyrics";
    case PromptRefusal::blank_lyrics: return "blank lyrics";
    case PromptRefusal::too_long: return "too long";
  }
  return "?";
}

std::vector<int32_t> make_uncond_ids(const std::vector<int32_t>& cond) {
  MM3_CHECK(cond.size() >= 3, "a prompt row has at least 3 ids, got {}", cond.size());
  std::vector<int32_t> u = cond;
  for (size_t i = 1; i + 2 < u.size(); ++i) u[i] = music3::kAudioCfg;
  return u;
}

Tensor Prompt::ids_tensor() const {
  const int64_t n = static_cast<int64_t>(cond_ids.size());
  std::vector<int64_t> v;
  v.reserve(2 * cond_ids.size());
  for (int32_t id : cond_ids) v.push_back(id);
  for (int32_t id : uncond_ids) v.push_back(id);
  return Tensor::from_i64(v, {2, n});
}

Prompt build_prompt(const Tokenizer& tok, std::string_view caption, std::string_view lyrics, int64_t max_tokens,
                    int64_t max_chars) {
  const auto check = [](std::string_view s, const char* what, PromptRefusal empty, PromptRefusal blank) {
    if (s.empty())
      throw PromptRefused(empty, fmt::format("{} is empty ({}); the reference refuses an empty {}", what,
                                             reason_text(empty), what));
    unicode::require_utf8(s, what);
    if (unicode::py_strip(unicode::to_u32(s)).empty())
      throw PromptRefused(blank, fmt::format("{} is only whitespace ({}, {} bytes); the reference refuses a blank {}",
                                             what, reason_text(blank), s.size(), what));
  };
  check(caption, "caption", PromptRefusal::empty_caption, PromptRefusal::blank_caption);
  check(lyrics, "lyrics", PromptRefusal::empty_lyrics, PromptRefusal::blank_lyrics);

  Prompt p;
  p.clean_caption = clean_caption(caption);
  p.normalized_lyrics = normalize_lyrics(lyrics);
  p.text = "<|im_start|><|caption_start|>" + p.clean_caption + "<|caption_end|><|lyrics_start|>" +
           p.normalized_lyrics + "<|lyrics_end|><|im_end|><|audio_start|>";
  int64_t chars = 0;  // Python len(): code points
  for (char c : p.text) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  // Far past the text cap, refuse without tokenizing: one huge pre-token (a megabyte of spaces is a
  // single BPE word) would otherwise cost time proportional to the input.
  if (chars > max_chars && chars / 10 > max_chars)
    throw PromptRefused(PromptRefusal::too_long,
                        fmt::format("prompt text has {} characters > {} (not tokenized); caption {} bytes, lyrics {} "
                                    "bytes: shorten the lyrics or the caption",
                                    chars, max_chars, caption.size(), lyrics.size()),
                        -1, chars);
  // Count exactly up to 10x the limit (a few ms), so the usual over-long prompt gets its exact
  // count; beyond that stop, so a huge lyric costs time bounded by the limit, not by its size.
  const int64_t count_to = max_tokens * 10;
  p.cond_ids = tok.encode(p.text, EncodeOptions{count_to, "prompt"});
  const int64_t n = static_cast<int64_t>(p.cond_ids.size());
  if (n > max_tokens || chars > max_chars) {
    const bool counted = n <= count_to;
    const std::string count = counted ? std::to_string(n) : fmt::format("more than {}", count_to);
    const std::string why =
        n > max_tokens
            ? fmt::format("prompt has {} tokens > {} (the prompt token limit)", count, max_tokens)
            : fmt::format("prompt text has {} characters > {} (the reference also refuses a prompt this long; it "
                          "has {} tokens, limit {})",
                          chars, max_chars, count, max_tokens);
    throw PromptRefused(PromptRefusal::too_long,
                        fmt::format("{}; caption {} bytes, lyrics {} bytes: shorten the lyrics or the caption", why,
                                    caption.size(), lyrics.size()),
                        counted ? n : -1, chars);
  }
  MM3_CHECK(n >= 3 && p.cond_ids.front() == music3::kImStart && p.cond_ids[n - 2] == music3::kImEnd &&
                p.cond_ids[n - 1] == music3::kAudioStart,
            "prompt ids do not start with <|im_start|> and end with <|im_end|><|audio_start|> (n={})", n);
  p.uncond_ids = make_uncond_ids(p.cond_ids);
  return p;
}

}  // namespace mm3
