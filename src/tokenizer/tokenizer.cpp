// tokenizer.cpp — byte-level BPE from tokenizer.json (MODEL.md §1.7, §6); see tokenizer.h for the
// pipeline. Kernels: PCRE2 (JIT) for the Split regex, utf8proc for NFC; the BPE is a per-word merge
// loop over a doubly linked symbol list driven by a min-heap of (rank, position), the same order the
// Rust library uses (`Word::merge_all`), so ties and stale entries resolve identically.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/unicode.h"

namespace mm3 {

using nlohmann::json;

namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order. The vocab is spelled in this alphabet.
std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> m{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return m;
}

// Spelled token (byte-level alphabet, UTF-8) -> raw bytes; nullopt when a character is outside it.
// (Runs 151k times at load, so it decodes the at-most-2-byte alphabet inline.)
std::optional<std::string> spelled_to_bytes(std::string_view spelled) {
  static const auto inverse = [] {
    std::array<int16_t, 324> inv;
    inv.fill(-1);
    const auto fwd = byte_to_char();
    for (int b = 0; b < 256; ++b) inv[fwd[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  std::string out;
  out.reserve(spelled.size());
  for (size_t i = 0; i < spelled.size();) {
    const auto c0 = static_cast<unsigned char>(spelled[i]);
    char32_t cp;
    if (c0 < 0x80) {
      cp = c0, i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < spelled.size() &&
               (static_cast<unsigned char>(spelled[i + 1]) & 0xC0) == 0x80) {
      cp = (static_cast<char32_t>(c0 & 0x1F) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F), i += 2;
    } else {
      return std::nullopt;  // 3- and 4-byte characters are all outside the alphabet
    }
    if (cp >= inverse.size() || inverse[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(inverse[cp]));
  }
  return out;
}

// Raw bytes -> spelling (for id_to_token).
std::string bytes_to_spelled(std::string_view bytes) {
  static const auto fwd = byte_to_char();
  std::string out;
  for (unsigned char b : bytes) unicode::append_utf8(out, fwd[b]);
  return out;
}

// Open-addressing map (left id, right id) -> (rank, merged id). The hot lookup of the BPE loop.
class MergeTable {
 public:
  struct Value {
    int32_t rank, new_id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  // Later entries overwrite earlier ones, as the Rust library's HashMap collect does.
  void put(int32_t a, int32_t b, Value v) {
    const uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & mask_;
    if (keys_[i] == kEmpty) ++size_;
    keys_[i] = k;
    vals_[i] = v;
  }
  const Value* get(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (true) {
      if (keys_[i] == k) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0, size_ = 0;
};

// Literal matcher for added tokens: leftmost match, longest at that position (the Rust library's
// aho-corasick LeftmostLongest).
class AddedMatcher {
 public:
  void build(const std::vector<AddedToken>& all, bool normalized) {
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i].normalized == normalized) by_first_[static_cast<unsigned char>(all[i].content[0])].push_back(i);
    for (auto& v : by_first_)
      std::stable_sort(v.begin(), v.end(), [&](size_t a, size_t b) { return all[a].content.size() > all[b].content.size(); });
    tokens_ = &all;
    for (const auto& v : by_first_) empty_ &= v.empty();
  }
  bool empty() const { return empty_; }
  // Calls on_text(piece) for text between matches and on_token(id) for each match, in order;
  // stops early when a callback returns false.
  template <class OnText, class OnToken>
  bool split(std::string_view s, OnText&& on_text, OnToken&& on_token) const {
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      const auto& cands = by_first_[static_cast<unsigned char>(s[i])];
      if (cands.empty()) continue;
      for (size_t c : cands) {
        const std::string& t = (*tokens_)[c].content;
        if (s.compare(i, t.size(), t) != 0) continue;
        if (i > start && !on_text(s.substr(start, i - start))) return false;
        if (!on_token((*tokens_)[c].id)) return false;
        start = i + t.size();
        i = start - 1;
        break;
      }
    }
    if (start < s.size()) return on_text(s.substr(start));
    return true;
  }

 private:
  std::array<std::vector<size_t>, 256> by_first_;
  const std::vector<AddedToken>* tokens_ = nullptr;
  bool empty_ = true;
};

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};

// The library's Oniguruma gives `\s` the Unicode White_Space property; PCRE2 with UCP also counts
// U+180E. Spelling the set out makes both engines agree.
constexpr const char* kWhiteSpaceSet =
    "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

std::string rewrite_whitespace_classes(const std::string& pat, const std::string& where) {
  std::string out;
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char n = pat[++i];
      if (n == 's') {
        // (appended piecewise: GCC 12 warns falsely on `"[" + std::string(...)` under -Werror=restrict)
        if (!in_class) out.push_back('[');
        out.append(kWhiteSpaceSet);
        if (!in_class) out.push_back(']');
      } else if (n == 'S') {
        if (in_class) throw BadModel(fmt::format("{}: regex uses \\S inside a character class (unsupported)", where));
        out.append("[^");
        out.append(kWhiteSpaceSet);
        out.push_back(']');
      } else {
        out += c;
        out += n;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = i + 1;
      if (class_start < pat.size() && pat[class_start] == '^') ++class_start;
    } else if (in_class && c == ']' && i != class_start) {
      in_class = false;
    }
    out += c;
  }
  return out;
}

// A member or null, by reference (the vocab and merges are large; never copy them).
const json& field(const json& obj, const char* key) {
  static const json null_json;
  if (!obj.is_object()) return null_json;
  auto it = obj.find(key);
  return it == obj.end() ? null_json : *it;
}

bool is_null_or(const json& v, const json& allowed) { return v.is_null() || v == allowed; }

// The two big members of model, read apart from the rest of the file so that loading need not build
// a 150k-key JSON object (from_file streams them through a SAX reader straight into these vectors).
struct VocabMerges {
  bool has_vocab = false, has_merges = false;
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
};

bool valid_id(int64_t v) { return v >= 0 && v <= INT32_MAX; }

// "a b" -> (a, b): exactly one space (a byte-level token never holds a literal space).
std::pair<std::string, std::string> split_merge(const std::string& s, size_t r, const std::string& src) {
  const size_t sp = s.find(' ');
  if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
    throw BadModel(fmt::format("{}: model.merges[{}] \"{}\" is not two tokens separated by one space", src, r, s));
  return {s.substr(0, sp), s.substr(sp + 1)};
}

[[noreturn]] void bad_merge(size_t r, const std::string& src) {
  throw BadModel(fmt::format("{}: model.merges[{}] is neither [\"a\", \"b\"] nor \"a b\"", src, r));
}

[[noreturn]] void bad_vocab(const std::string& key, const std::string& src) {
  throw BadModel(fmt::format("{}: model.vocab[\"{}\"] is not a valid id", src, key));
}

VocabMerges vocab_merges_from_dom(const json& model, const std::string& src) {
  VocabMerges vm;
  const json& vocab = field(model, "vocab");
  if (vocab.is_object()) {
    vm.has_vocab = true;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || !valid_id(it.value().get<int64_t>())) bad_vocab(it.key(), src);
      vm.vocab.emplace_back(it.key(), it.value().get<int64_t>());
    }
  }
  const json& merges = field(model, "merges");
  if (merges.is_array()) {
    vm.has_merges = true;
    for (size_t r = 0; r < merges.size(); ++r) {
      const json& m = merges[r];
      if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
        vm.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      else if (m.is_string())
        vm.merges.push_back(split_merge(m.get<std::string>(), r, src));
      else
        bad_merge(r, src);
    }
  }
  return vm;
}

// SAX reader: model.vocab and model.merges go into a VocabMerges; everything else becomes a DOM.
class TokenizerSax final : public nlohmann::json_sax<json> {
 public:
  TokenizerSax(json& rest, VocabMerges& vm, const std::string& src) : rest_(rest), vm_(vm), src_(src) {}

  bool null() override { return scalar(json()); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::vocab) return vocab_value(v);
    return scalar(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::vocab)
      return vocab_value(v > static_cast<number_unsigned_t>(INT32_MAX) ? -1 : static_cast<int64_t>(v));
    return scalar(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return scalar(json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::merges) {
      vm_.merges.push_back(split_merge(v, vm_.merges.size(), src_));
      return true;
    }
    if (mode_ == Mode::merge_pair) {
      if (pair_.size() == 2) bad_merge(vm_.merges.size(), src_);
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar(json(std::move(v)));
  }
  bool binary(binary_t&) override { return scalar(json()); }
  bool start_object(std::size_t) override {
    not_in_lists();
    if (in_model() && key_ == "vocab") {
      mode_ = Mode::vocab;
      vm_.has_vocab = true;
      return true;
    }
    return open(json::object());
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::vocab) mode_ = Mode::dom;
    else stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::merges) {
      mode_ = Mode::merge_pair;
      pair_.clear();
      return true;
    }
    not_in_lists();
    if (in_model() && key_ == "merges") {
      mode_ = Mode::merges;
      vm_.has_merges = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::merge_pair) {
      if (pair_.size() != 2) bad_merge(vm_.merges.size(), src_);
      vm_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::merges;
    } else if (mode_ == Mode::merges) {
      mode_ = Mode::dom;
    } else {
      stack_.pop_back();
    }
    return true;
  }
  bool parse_error(std::size_t pos, const std::string&, const nlohmann::detail::exception& e) override {
    throw BadModel(fmt::format("{}: not valid JSON at byte {} ({})", src_, pos, e.what()));
  }

 private:
  enum class Mode { dom, vocab, merges, merge_pair };
  // Directly inside the top-level "model" object.
  bool in_model() const { return stack_.size() == 2 && model_open_; }
  // A container or scalar where the vocab wants an id or the merges want a pair.
  void not_in_lists() const {
    if (mode_ == Mode::vocab) bad_vocab(key_, src_);
    if (mode_ != Mode::dom) bad_merge(vm_.merges.size(), src_);
  }
  bool vocab_value(int64_t v) {
    if (!valid_id(v)) bad_vocab(key_, src_);
    vm_.vocab.emplace_back(std::move(key_), v);
    return true;
  }
  json* place(json v) {
    if (stack_.empty()) {
      rest_ = std::move(v);
      return &rest_;
    }
    json& parent = *stack_.back();
    if (parent.is_object()) {
      json& slot = parent[key_];
      slot = std::move(v);
      return &slot;
    }
    parent.push_back(std::move(v));
    return &parent.back();
  }
  bool scalar(json v) {
    not_in_lists();
    place(std::move(v));
    return true;
  }
  bool open(json v) {
    const bool model = stack_.size() == 1 && key_ == "model" && v.is_object();
    stack_.push_back(place(std::move(v)));
    if (stack_.size() == 2) model_open_ = model;
    return true;
  }

  json& rest_;
  VocabMerges& vm_;
  const std::string& src_;
  std::vector<json*> stack_;  // the open DOM containers (stable: only the innermost one grows)
  std::string key_;
  std::vector<std::string> pair_;
  Mode mode_ = Mode::dom;
  bool model_open_ = false;
};

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::vector<std::string> bytes_of;    // id -> raw bytes
  std::vector<uint8_t> kind_of;         // id -> 0 none, 1 vocab, 2 added
  std::unordered_map<std::string, int32_t> vocab_spelled, added_content;
  std::unordered_map<std::string, int32_t> vocab_bytes;  // raw bytes -> id; only built for ignore_merges
  std::array<int32_t, 256> byte_id{};
  MergeTable merges;
  size_t num_merges = 0;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, norm_matcher;
  std::unique_ptr<pcre2_code, CodeDeleter> re;
  bool jit = false;
  bool nfc = false;
  bool ignore_merges = false;

  static std::shared_ptr<const Impl> build(const json& j, VocabMerges vm, const std::string& src);
  void encode_normal(std::string_view piece, std::vector<int32_t>& ids, int64_t max) const;
  void pretokenize(std::string_view s, std::vector<int32_t>& ids, int64_t max) const;
  void bpe(std::string_view word, std::vector<int32_t>& ids) const;
};

// ---- loading ----

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  const std::string src = path.string();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw BadModel(fmt::format("{}: cannot open the tokenizer file", src));
  std::string text(static_cast<size_t>(in.tellg()), '\0');
  in.seekg(0);
  if (!in.read(text.data(), static_cast<std::streamsize>(text.size())))
    throw BadModel(fmt::format("{}: cannot read the tokenizer file", src));
  json rest;
  VocabMerges vm;
  TokenizerSax sax(rest, vm, src);
  try {
    json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    throw BadModel(fmt::format("{}: not valid JSON ({})", src, e.what()));
  }
  if (!rest.is_object()) throw BadModel(fmt::format("{}: the top level is not a JSON object", src));
  return Tokenizer(Impl::build(rest, std::move(vm), src));
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& src) {
  if (!j.is_object()) throw BadModel(fmt::format("{}: the top level is not a JSON object", src));
  return Tokenizer(Impl::build(j, vocab_merges_from_dom(field(j, "model"), src), src));
}

std::shared_ptr<const Tokenizer::Impl> Tokenizer::Impl::build(const json& j, VocabMerges vm, const std::string& src) {
  auto impl = std::make_shared<Impl>();
  Impl& t = *impl;
  t.source = src;
  // -- normalizer: NFC or none
  const json& norm = field(j, "normalizer");
  if (norm.is_null()) {
    t.nfc = false;
  } else if (norm.value("type", "") == "NFC") {
    t.nfc = true;
  } else if (norm.value("type", "") == "Sequence" && field(norm, "normalizers").is_array() &&
             norm["normalizers"].size() == 1 && norm["normalizers"][0].value("type", "") == "NFC") {
    t.nfc = true;
  } else {
    throw BadModel(fmt::format("{}: normalizer {} is not supported (mm3 implements NFC or none)", src, norm.dump()));
  }

  // -- pre-tokenizer: Sequence[Split(Regex, Isolated), ByteLevel(no prefix space, no regex)]
  const json& pre = field(j, "pre_tokenizer");
  const std::string pre_msg = fmt::format(
      "{}: pre_tokenizer {} is not supported (mm3 implements Sequence[Split(Regex, Isolated), "
      "ByteLevel(add_prefix_space false, use_regex false)], the Qwen2/Qwen3 form)",
      src, pre.dump().substr(0, 300));
  if (pre.value("type", "") != "Sequence" || !field(pre, "pretokenizers").is_array() || pre["pretokenizers"].size() != 2)
    throw BadModel(pre_msg);
  const json& split = pre["pretokenizers"][0];
  const json& bl = pre["pretokenizers"][1];
  if (split.value("type", "") != "Split" || split.value("behavior", "") != "Isolated" ||
      split.value("invert", false) || !field(split, "pattern").is_object() || !split["pattern"].contains("Regex") ||
      !split["pattern"]["Regex"].is_string())
    throw BadModel(pre_msg);
  if (bl.value("type", "") != "ByteLevel" || bl.value("add_prefix_space", false) || bl.value("use_regex", true))
    throw BadModel(pre_msg);
  {
    const std::string pattern = rewrite_whitespace_classes(split["pattern"]["Regex"].get<std::string>(), src);
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw BadModel(fmt::format("{}: pre_tokenizer Split regex does not compile at offset {}: {}", src, off,
                                 reinterpret_cast<const char*>(msg)));
    }
    t.re.reset(code);
    t.jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }

  // -- post-processor / decoder: nothing that adds ids
  const json& post = field(j, "post_processor");
  if (!post.is_null() && post.value("type", "") != "ByteLevel")
    throw BadModel(fmt::format("{}: post_processor {} is not supported (mm3 adds no BOS/EOS; null or ByteLevel)", src,
                               post.dump().substr(0, 200)));
  const json& dec = field(j, "decoder");
  if (!dec.is_null() && dec.value("type", "") != "ByteLevel")
    throw BadModel(fmt::format("{}: decoder {} is not supported (null or ByteLevel)", src, dec.dump().substr(0, 200)));

  // -- model
  const json& model = field(j, "model");
  if (!model.is_object() || model.value("type", "") != "BPE")
    throw BadModel(fmt::format("{}: model.type must be \"BPE\"", src));
  const json& dropout = field(model, "dropout");
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0))
    throw BadModel(fmt::format("{}: model.dropout {} is not supported (inference uses none)", src, dropout.dump()));
  if (field(model, "byte_fallback") == json(true))
    throw BadModel(fmt::format("{}: model.byte_fallback true is not supported", src));
  if (!is_null_or(field(model, "continuing_subword_prefix"), "") || !is_null_or(field(model, "end_of_word_suffix"), ""))
    throw BadModel(fmt::format("{}: model.continuing_subword_prefix / end_of_word_suffix are not supported", src));
  t.ignore_merges = field(model, "ignore_merges") == json(true);

  if (!vm.has_vocab || vm.vocab.empty()) throw BadModel(fmt::format("{}: model.vocab is missing or empty", src));
  int64_t max_id = -1;
  for (const auto& [tok, id] : vm.vocab) max_id = std::max(max_id, id);
  const json& added = field(j, "added_tokens");
  if (!added.is_null() && !added.is_array()) throw BadModel(fmt::format("{}: added_tokens is not an array", src));
  for (const json& a : added.is_array() ? added : json::array()) {
    if (!a.is_object() || !field(a, "id").is_number_integer() || a["id"].get<int64_t>() < 0 ||
        a["id"].get<int64_t>() > INT32_MAX || !field(a, "content").is_string() || a["content"].get<std::string>().empty())
      throw BadModel(fmt::format("{}: added token {} needs an id >= 0 and a non-empty content", src, a.dump()));
    max_id = std::max(max_id, a["id"].get<int64_t>());
  }
  const size_t n_ids = static_cast<size_t>(max_id + 1);
  t.bytes_of.resize(n_ids);
  t.kind_of.assign(n_ids, 0);
  t.vocab_spelled.reserve(vm.vocab.size() * 2);
  t.byte_id.fill(-1);
  for (auto& [spelled, id64] : vm.vocab) {
    const auto id = static_cast<int32_t>(id64);
    auto bytes = spelled_to_bytes(spelled);
    if (!bytes || bytes->empty())
      throw BadModel(fmt::format("{}: model.vocab token \"{}\" (id {}) is not in the byte-level alphabet", src,
                                 spelled, id));
    if (t.kind_of[id]) throw BadModel(fmt::format("{}: model.vocab uses id {} twice", src, id));
    if (!t.vocab_spelled.emplace(std::move(spelled), id).second)
      throw BadModel(fmt::format("{}: model.vocab lists token id {} under a spelling used twice", src, id));
    t.kind_of[id] = 1;
    if (bytes->size() == 1) t.byte_id[static_cast<unsigned char>((*bytes)[0])] = id;
    if (t.ignore_merges) t.vocab_bytes.emplace(*bytes, id);
    t.bytes_of[id] = std::move(*bytes);
  }
  for (int b = 0; b < 256; ++b) {
    if (t.byte_id[b] < 0)
      throw BadModel(fmt::format("{}: model.vocab lacks the single-byte token for byte 0x{:02X}; a byte-level BPE "
                                 "needs all 256",
                                 src, b));
  }

  // Merges: [["a","b"], ...] or the older ["a b", ...]; rank = position.
  if (!vm.has_merges) throw BadModel(fmt::format("{}: model.merges is missing or not an array", src));
  t.merges.reserve(vm.merges.size());
  t.num_merges = vm.merges.size();
  for (size_t r = 0; r < vm.merges.size(); ++r) {
    const std::string& a = vm.merges[r].first;
    const std::string& b = vm.merges[r].second;
    auto ia = t.vocab_spelled.find(a), ib = t.vocab_spelled.find(b), im = t.vocab_spelled.find(a + b);
    if (ia == t.vocab_spelled.end() || ib == t.vocab_spelled.end() || im == t.vocab_spelled.end())
      throw BadModel(fmt::format("{}: model.merges[{}] (\"{}\", \"{}\") uses a token missing from model.vocab", src, r,
                                 a, b));
    t.merges.put(ia->second, ib->second, {static_cast<int32_t>(r), im->second});
  }

  // Added tokens.
  for (const json& a : added.is_array() ? added : json::array()) {
    AddedToken at;
    at.id = a["id"].get<int32_t>();
    at.content = a["content"].get<std::string>();
    at.special = a.value("special", false);
    at.normalized = a.value("normalized", !at.special);
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
      throw BadModel(fmt::format("{}: added token \"{}\" (id {}) uses lstrip/rstrip/single_word, not supported", src,
                                 at.content, at.id));
    if (unicode::find_invalid_utf8(at.content) != std::string_view::npos)
      throw BadModel(fmt::format("{}: added token id {} is not valid UTF-8", src, at.id));
    if (t.kind_of[at.id] == 2) throw BadModel(fmt::format("{}: added_tokens uses id {} twice", src, at.id));
    t.kind_of[at.id] = 2;  // an added token's content wins over a vocab entry at the same id
    t.bytes_of[at.id] = at.content;
    t.added_content[at.content] = at.id;
    t.added.push_back(std::move(at));
  }
  t.raw_matcher.build(t.added, false);
  t.norm_matcher.build(t.added, true);
  return impl;
}

// ---- encoding ----

void Tokenizer::Impl::bpe(std::string_view w, std::vector<int32_t>& ids) const {
  const size_t n = w.size();
  if (n == 1) {
    ids.push_back(byte_id[static_cast<unsigned char>(w[0])]);
    return;
  }
  if (ignore_merges) {
    auto f = vocab_bytes.find(std::string(w));
    if (f != vocab_bytes.end()) {
      ids.push_back(f->second);
      return;
    }
  }
  struct Cand {
    int32_t rank, pos, new_id;
  };
  // min-heap on (rank, pos): std heaps are max-heaps, so "less" means "later".
  const auto later = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  // Small words (the vast majority) stay on the stack.
  constexpr size_t kStack = 64;
  int32_t sid_s[kStack], prev_s[kStack], next_s[kStack];
  std::vector<int32_t> sid_v, prev_v, next_v;
  int32_t *sid = sid_s, *prev = prev_s, *next = next_s;
  if (n > kStack) {
    sid_v.resize(n), prev_v.resize(n), next_v.resize(n);
    sid = sid_v.data(), prev = prev_v.data(), next = next_v.data();
  }
  std::vector<Cand> heap;
  heap.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    sid[i] = byte_id[static_cast<unsigned char>(w[i])];
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  for (size_t i = 0; i + 1 < n; ++i)
    if (const auto* m = merges.get(sid[i], sid[i + 1])) heap.push_back({m->rank, static_cast<int32_t>(i), m->new_id});
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Cand top = heap.back();
    heap.pop_back();
    const int32_t p = top.pos;
    if (sid[p] < 0) continue;  // merged into its left neighbour
    const int32_t q = next[p];
    if (q < 0) continue;
    const auto* m = merges.get(sid[p], sid[q]);
    if (!m || m->new_id != top.new_id) continue;  // stale entry (same test as the Rust library)
    sid[p] = top.new_id;
    sid[q] = -1;
    next[p] = next[q];
    if (next[q] >= 0) prev[next[q]] = p;
    if (prev[p] >= 0)
      if (const auto* l = merges.get(sid[prev[p]], sid[p])) {
        heap.push_back({l->rank, prev[p], l->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
    if (next[p] >= 0)
      if (const auto* r = merges.get(sid[p], sid[next[p]])) {
        heap.push_back({r->rank, p, r->new_id});
        std::push_heap(heap.begin(), heap.end(), later);
      }
  }
  for (int32_t i = 0; i >= 0; i = next[i]) ids.push_back(sid[i]);
}

void Tokenizer::Impl::pretokenize(std::string_view s, std::vector<int32_t>& ids, int64_t max) const {
  const auto over = [&] { return max >= 0 && static_cast<int64_t>(ids.size()) > max; };
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(re.get(), nullptr), &pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> mctx(nullptr, &pcre2_match_context_free);
  std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> jstack(nullptr, &pcre2_jit_stack_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;     // start of the text not yet emitted (a pending gap)
  size_t search = 0;  // where the next match is searched from
  while (pos < s.size() && search < s.size() && !over()) {
    const int rc = jit ? pcre2_jit_match(re.get(), subject, s.size(), search, 0, md.get(), mctx.get())
                       : pcre2_match(re.get(), subject, s.size(), search, PCRE2_NO_UTF_CHECK, md.get(), mctx.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !jstack) {
      // Pathological input: give the JIT a larger stack and retry this position.
      jstack.reset(pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr));
      mctx.reset(pcre2_match_context_create(nullptr));
      if (!jstack || !mctx) throw OutOfMemory("tokenizer: cannot allocate the regex JIT stack (64 MiB)");
      pcre2_jit_stack_assign(mctx.get(), nullptr, jstack.get());
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw InternalError(
          fmt::format("tokenizer regex failed at byte {}: {}", search, reinterpret_cast<const char*>(msg)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e == b) {
      // An empty match yields no piece (the Qwen regex cannot match empty; other files might).
      // Step over one code point; it stays in the pending gap.
      search = b + 1;
      while (search < s.size() && (static_cast<unsigned char>(s[search]) & 0xC0) == 0x80) ++search;
      continue;
    }
    if (b > pos) bpe(s.substr(pos, b - pos), ids);  // Isolated: text between matches is a piece too
    bpe(s.substr(b, e - b), ids);
    pos = search = e;
  }
  if (pos < s.size() && !over()) bpe(s.substr(pos), ids);
}

void Tokenizer::Impl::encode_normal(std::string_view piece, std::vector<int32_t>& ids, int64_t max) const {
  const std::string normalized = nfc ? unicode::nfc(piece) : std::string(piece);
  if (norm_matcher.empty()) {
    pretokenize(normalized, ids, max);
    return;
  }
  norm_matcher.split(
      normalized,
      [&](std::string_view p) {
        pretokenize(p, ids, max);
        return !(max >= 0 && static_cast<int64_t>(ids.size()) > max);
      },
      [&](int32_t id) {
        ids.push_back(id);
        return !(max >= 0 && static_cast<int64_t>(ids.size()) > max);
      });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  unicode::require_utf8(text, opt.what);
  const Impl& t = *impl_;
  const int64_t max = opt.max_tokens;
  const auto under = [&](const std::vector<int32_t>& v) { return !(max >= 0 && static_cast<int64_t>(v.size()) > max); };
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  t.raw_matcher.split(
      text,
      [&](std::string_view p) {
        t.encode_normal(p, ids, max);
        return under(ids);
      },
      [&](int32_t id) {
        ids.push_back(id);
        return under(ids);
      });
  if (!under(ids)) ids.resize(static_cast<size_t>(max + 1));
  return ids;
}

// ---- decoding and lookups ----

std::string Tokenizer::token_bytes(int32_t id) const {
  if (!has_id(id))
    throw InvalidInput(fmt::format("token id {} has no token in {} (ids 0..{})", id, impl_->source, vocab_size() - 1));
  return impl_->bytes_of[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) bytes += token_bytes(id);
  return unicode::utf8_lossy(bytes);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (!has_id(id))
    throw InvalidInput(fmt::format("token id {} has no token in {} (ids 0..{})", id, impl_->source, vocab_size() - 1));
  const size_t i = static_cast<size_t>(id);
  return impl_->kind_of[i] == 2 ? impl_->bytes_of[i] : bytes_to_spelled(impl_->bytes_of[i]);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  const std::string k(token);
  if (auto f = impl_->added_content.find(k); f != impl_->added_content.end()) return f->second;
  if (auto f = impl_->vocab_spelled.find(k); f != impl_->vocab_spelled.end()) return f->second;
  return std::nullopt;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->kind_of.size()); }
bool Tokenizer::has_id(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->kind_of.size() && impl_->kind_of[static_cast<size_t>(id)] != 0;
}
size_t Tokenizer::num_merges() const { return impl_->num_merges; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::source() const { return impl_->source; }

TokenizeTiming time_encode(const Tokenizer& tok, std::string_view text, int iters) {
  using clock = std::chrono::steady_clock;
  TokenizeTiming r;
  r.bytes = static_cast<int64_t>(text.size());
  r.iters = std::max(1, iters);
  r.tokens = static_cast<int64_t>(tok.encode(text).size());  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < r.iters; ++i) {
    const auto t0 = clock::now();
    const auto ids = tok.encode(text);
    ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
    MM3_CHECK(static_cast<int64_t>(ids.size()) == r.tokens, "encode is not deterministic");
  }
  std::sort(ms.begin(), ms.end());
  r.min_ms = ms.front();
  r.max_ms = ms.back();
  r.median_ms = ms[ms.size() / 2];
  return r;
}

}  // namespace mm3
