// unicode.cpp — see unicode.h. The whitespace, line-break and casing tables below are CPython 3's
// (Objects/unicodeobject.c, Tools/unicode/makeunicodedata.py) restated from the Unicode data files:
// isspace = bidi class WS/B/S or category Zs; lower = UnicodeData simple mapping plus SpecialCasing's
// one unconditional multi-code-point lowercase (U+0130) plus the Final_Sigma context rule.
#include "tokenizer/unicode.h"

#include <cstdlib>
#include <memory>

#include <utf8proc.h>

#include "core/errors.h"

namespace mm3::unicode {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid.
size_t valid_seq_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    const unsigned char c1 = b(i + 1);
    if (c == 0xE0 && c1 < 0xA0) return 0;  // overlong
    if (c == 0xED && c1 > 0x9F) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    const unsigned char c1 = b(i + 1);
    if (c == 0xF0 && c1 < 0x90) return 0;  // overlong
    if (c == 0xF4 && c1 > 0x8F) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;  // continuation byte, C0/C1 (overlong 2-byte), F5..FF
}

// Length of the maximal prefix of an invalid sequence at s[i] (at least 1): the bytes one U+FFFD
// replaces, per the Unicode "maximal subpart" practice that Rust's from_utf8_lossy follows.
size_t invalid_prefix_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) need = 1;
  else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else return 1;
  size_t n = 1;
  for (size_t k = 0; k < need && i + n < s.size(); ++k) {
    const unsigned char x = b(i + n);
    if (k == 0 ? (x < lo || x > hi) : (x & 0xC0) != 0x80) break;
    ++n;
  }
  return n;
}

bool in_ranges(char32_t c, const char32_t (*r)[2], size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (c >= r[i][0] && c <= r[i][1]) return true;
  return false;
}

// PropList.txt Other_Lowercase / Other_Uppercase (Unicode 15): part of Python's "cased".
constexpr char32_t kOtherLower[][2] = {
    {0x00AA, 0x00AA}, {0x00BA, 0x00BA}, {0x02B0, 0x02B8}, {0x02C0, 0x02C1}, {0x02E0, 0x02E4},
    {0x0345, 0x0345}, {0x037A, 0x037A}, {0x10FC, 0x10FC}, {0x1D2C, 0x1D6A}, {0x1D78, 0x1D78},
    {0x1D9B, 0x1DBF}, {0x2071, 0x2071}, {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2170, 0x217F},
    {0x24D0, 0x24E9}, {0x2C7C, 0x2C7D}, {0xA69C, 0xA69D}, {0xA770, 0xA770}, {0xA7F2, 0xA7F4},
    {0xA7F8, 0xA7F9}, {0xAB5C, 0xAB5F}, {0xAB69, 0xAB69}, {0x10780, 0x10780}, {0x10783, 0x10785},
    {0x10787, 0x107B0}, {0x107B2, 0x107BA}, {0x1E030, 0x1E06D}};
constexpr char32_t kOtherUpper[][2] = {
    {0x2160, 0x216F}, {0x24B6, 0x24CF}, {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189}};
// WordBreakProperty.txt MidLetter, MidNumLet, Single_Quote: part of Python's "case-ignorable".
constexpr char32_t kWordBreakIgnorable[][2] = {
    {0x0027, 0x0027}, {0x002E, 0x002E}, {0x003A, 0x003A}, {0x00B7, 0x00B7}, {0x0387, 0x0387},
    {0x055F, 0x055F}, {0x05F4, 0x05F4}, {0x2018, 0x2019}, {0x2024, 0x2024}, {0x2027, 0x2027},
    {0xFE13, 0xFE13}, {0xFE52, 0xFE52}, {0xFE55, 0xFE55}, {0xFF07, 0xFF07}, {0xFF0E, 0xFF0E},
    {0xFF1A, 0xFF1A}};

template <size_t N>
bool in_table(char32_t c, const char32_t (&t)[N][2]) {
  return in_ranges(c, t, N);
}

bool is_cased(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         in_table(c, kOtherLower) || in_table(c, kOtherUpper);
}

bool is_case_ignorable(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF ||
         cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK || in_table(c, kWordBreakIgnorable);
}

// CPython's handle_capital_sigma: U+03A3 lowers to final sigma when preceded by a cased letter
// (skipping case-ignorables) and not followed by one.
char32_t lower_capital_sigma(std::u32string_view s, size_t i) {
  size_t j = i;
  char32_t c = 0;
  bool seen = false;
  while (j > 0) {
    c = s[--j];
    if (!is_case_ignorable(c)) {
      seen = true;
      break;
    }
  }
  bool final_sigma = seen && is_cased(c);
  if (final_sigma && i + 1 < s.size()) {
    size_t k = i + 1;
    for (; k < s.size(); ++k)
      if (!is_case_ignorable(s[k])) break;
    final_sigma = k == s.size() || !is_cased(s[k]);
  }
  return final_sigma ? 0x3C2 : 0x3C3;
}

}  // namespace

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = valid_seq_len(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void require_utf8(std::string_view s, std::string_view what) {
  const size_t at = find_invalid_utf8(s);
  if (at == std::string_view::npos) return;
  std::string bytes;
  for (size_t k = at; k < s.size() && k < at + 4; ++k)
    bytes += fmt::format("{}0x{:02X}", bytes.empty() ? "" : " ", static_cast<unsigned char>(s[k]));
  throw InvalidInput(fmt::format("{}: not valid UTF-8 at byte offset {} of {} (bytes {}); text must be UTF-8",
                                 what, at, s.size(), bytes));
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = valid_seq_len(s, i);
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += invalid_prefix_len(s, i);
    }
  }
  return out;
}

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    MM3_CHECK(n > 0, "to_u32 on invalid UTF-8 at byte {}", i);
    out.push_back(static_cast<char32_t>(cp));
    i += static_cast<size_t>(n);
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

namespace {
std::string utf8proc_normalize(std::string_view s, int options) {
  bool ascii = true;
  for (char ch : s) ascii &= static_cast<unsigned char>(ch) < 0x80;
  if (ascii) return std::string(s);  // ASCII is invariant under every normalization form
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out, static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(out, &std::free);
  if (n < 0) throw InternalError(fmt::format("Unicode normalization failed: {}", utf8proc_errmsg(n)));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}
}  // namespace

std::string nfc(std::string_view s) { return utf8proc_normalize(s, UTF8PROC_STABLE | UTF8PROC_COMPOSE); }
std::string nfd(std::string_view s) { return utf8proc_normalize(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE); }

bool py_isspace(char32_t c) {
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool py_is_line_break(char32_t c) {
  return c == 0x0A || c == 0x0D || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::u32string_view py_rstrip(std::u32string_view s) {
  size_t e = s.size();
  while (e > 0 && py_isspace(s[e - 1])) --e;
  return s.substr(0, e);
}

std::u32string_view py_strip(std::u32string_view s) {
  s = py_rstrip(s);
  size_t b = 0;
  while (b < s.size() && py_isspace(s[b])) ++b;
  return s.substr(b);
}

std::u32string py_lower(std::u32string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE -> i + COMBINING DOT ABOVE
      out.push_back(0x69);
      out.push_back(0x307);
    } else if (c == 0x3A3) {
      out.push_back(lower_capital_sigma(s, i));
    } else {
      out.push_back(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

}  // namespace mm3::unicode
