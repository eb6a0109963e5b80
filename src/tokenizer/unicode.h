// unicode.h — the Unicode helpers the tokenizer (MODEL.md §1.7) and the prompt contract (§2.1) share:
// strict UTF-8 validation with the offending byte offset, UTF-8 <-> code points, NFC (utf8proc), and
// the exact Python `str` semantics the reference's prompt cleaning depends on (`str.isspace`,
// `str.splitlines` boundaries, `str.lower` with its two multi-code-point / contextual rules).
//
// Why hand-written Python semantics instead of a regex engine's: Python's `\s` / `str.strip()` count
// U+001C..U+001F as whitespace and PCRE2's `\s` does not, and `str.lower()` maps U+0130 to two code
// points and applies Final_Sigma, which utf8proc_tolower (a simple mapping) does not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mm3::unicode {

// Byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates, > U+10FFFF, truncated
// sequences and stray continuation bytes are all invalid, as in Python and Rust), or npos if valid.
size_t find_invalid_utf8(std::string_view s);

// Throws InvalidInput "<what>: not valid UTF-8 at byte offset N (bytes 0x.. 0x..)" when invalid.
void require_utf8(std::string_view s, std::string_view what);

// Lossy conversion: each invalid sequence becomes U+FFFD (what Rust's from_utf8_lossy does, so
// `decode` prints what the Hugging Face ByteLevel decoder would).
std::string utf8_lossy(std::string_view bytes);

// Code points of valid UTF-8 (call require_utf8 first), and back.
std::u32string to_u32(std::string_view s);
std::string to_utf8(std::u32string_view s);
void append_utf8(std::string& out, char32_t c);

// Unicode NFC / NFD of valid UTF-8 (utf8proc). ASCII-only input is returned unchanged without a call.
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);

// Python `str.isspace()` (what `\s`, `str.strip()` and `str.split()` use for `str` in Python 3).
bool py_isspace(char32_t c);
// A line boundary of Python `str.splitlines()` (the \r\n pair is handled by the caller).
bool py_is_line_break(char32_t c);
// Python `str.strip()` / `str.rstrip()` with no arguments.
std::u32string_view py_strip(std::u32string_view s);
std::u32string_view py_rstrip(std::u32string_view s);
// Python `str.lower()`: full lowercase mapping (U+0130 -> "i\u0307"), Final_Sigma for U+03A3.
std::u32string py_lower(std::u32string_view s);

}  // namespace mm3::unicode
