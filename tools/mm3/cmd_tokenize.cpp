// cmd_tokenize.cpp — `mm3 tokenize MODEL_DIR ...`: the tokenizer (MODEL.md §1.7) and the Music3 prompt
// contract (§2.1, §2.2) from the command line: encode text, decode ids, assemble a prompt, time it.
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/errors.h"
#include "tokenizer/prompt.h"
#include "tokenizer/tokenizer.h"

namespace mm3::cli {
namespace {

namespace fs = std::filesystem;

struct TokenizeArgs {
  std::string dir, text, file, decode, caption, lyrics;
  bool ids_only = false;
  int time_iters = 0;
};

// MODEL_DIR may be a checkpoint folder (tokenizer/tokenizer.json inside, Music3 ids validated), a
// tokenizer folder, or a tokenizer.json file.
Tokenizer load(const std::string& dir, bool need_music3) {
  const fs::path p(dir);
  if (fs::is_directory(p / "tokenizer")) return load_music3_tokenizer(p);
  const fs::path file = fs::is_directory(p) ? p / "tokenizer.json" : p;
  if (!fs::exists(file))
    throw InvalidInput(fmt::format("{}: neither a checkpoint folder (with tokenizer/tokenizer.json), a folder with "
                                   "tokenizer.json, nor a tokenizer.json file",
                                   dir));
  Tokenizer t = Tokenizer::from_file(file);
  if (need_music3) validate_music3_tokenizer(t);
  return t;
}

std::string read_file(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidInput(fmt::format("--file {}: cannot open", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "1,2,3", "1 2 3" or "[1, 2, 3]".
std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(cur, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != cur.size() || v < 0 || v > INT32_MAX)
      throw InvalidInput(fmt::format("--decode: \"{}\" is not a token id (expected non-negative integers like "
                                     "\"151644,151671,11646\")",
                                     cur));
    ids.push_back(static_cast<int32_t>(v));
    cur.clear();
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '[' || c == ']') flush();
    else cur += c;
  }
  flush();
  return ids;
}

std::string id_list(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int run_tokenize(const TokenizeArgs& a) {
  const int modes = !a.text.empty() + !a.file.empty() + !a.decode.empty() + (!a.caption.empty() || !a.lyrics.empty());
  if (modes != 1)
    throw InvalidInput("mm3 tokenize: give exactly one of --text, --file, --decode, or --caption with --lyrics");
  const bool prompt_mode = !a.caption.empty() || !a.lyrics.empty();
  const Tokenizer tok = load(a.dir, prompt_mode);

  if (!a.decode.empty()) {
    const std::string text = tok.decode(parse_ids(a.decode));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (prompt_mode) {
    const Prompt p = build_prompt(tok, a.caption, a.lyrics);
    if (a.ids_only) {
      std::printf("%s\n%s\n", id_list(p.cond_ids).c_str(), id_list(p.uncond_ids).c_str());
      return 0;
    }
    std::printf("clean_caption:     %s\n", quoted(p.clean_caption).c_str());
    std::printf("normalized_lyrics: %s\n", quoted(p.normalized_lyrics).c_str());
    std::printf("prompt_text:       %s\n", quoted(p.text).c_str());
    std::printf("tokens:            %zu (limit %lld)\n", p.cond_ids.size(),
                static_cast<long long>(music3::kMaxPromptTokens));
    std::printf("cond_ids:          %s\n", id_list(p.cond_ids).c_str());
    std::printf("uncond_ids:        %s\n", id_list(p.uncond_ids).c_str());
    return 0;
  }
  const std::string text = a.text.empty() ? read_file(a.file) : a.text;
  const std::vector<int32_t> ids = tok.encode(text, EncodeOptions{-1, a.text.empty() ? "--file" : "--text"});
  if (a.time_iters > 0) {
    const TokenizeTiming t = time_encode(tok, text, a.time_iters);
    std::printf("{\"tokens\": %lld, \"bytes\": %lld, \"iters\": %d, \"median_ms\": %.4f, \"min_ms\": %.4f, "
                "\"max_ms\": %.4f}\n",
                static_cast<long long>(t.tokens), static_cast<long long>(t.bytes), t.iters, t.median_ms, t.min_ms,
                t.max_ms);
    return 0;
  }
  if (a.ids_only) {
    std::printf("%s\n", id_list(ids).c_str());
    return 0;
  }
  for (int32_t id : ids) std::printf("%8d  %s\n", id, quoted(tok.token_bytes(id)).c_str());
  std::printf("%zu tokens\n", ids.size());
  return 0;
}

RegisterCommand reg{{"tokenize", 30,
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<TokenizeArgs>();
                       sub.add_option("MODEL_DIR", a->dir,
                                      "checkpoint folder (uses tokenizer/tokenizer.json), or a tokenizer.json")
                           ->required();
                       sub.add_option("--text", a->text, "text to encode (special tokens like <|im_start|> are matched)");
                       sub.add_option("--file", a->file, "encode this file's bytes (UTF-8; '-' reads stdin)");
                       sub.add_option("--decode", a->decode, "ids to turn back into text: \"151644,151671,11646\"");
                       sub.add_option("--caption", a->caption, "build the Music3 prompt from this caption (with --lyrics)");
                       sub.add_option("--lyrics", a->lyrics, "the lyrics of the prompt (with --caption)");
                       sub.add_flag("--ids", a->ids_only, "print only the id list (prompts: cond row, then uncond row)");
                       sub.add_option("--time", a->time_iters, "encode N times and print timing JSON (medians)");
                       sub.footer(
                           "Encodes exactly as the Hugging Face tokenizers library does (no BOS/EOS), decodes ids,\n"
                           "or assembles the full Music3 prompt (caption cleaning, lyrics normalization, template,\n"
                           "the unconditional row, the 5000-token and 5000-character limits).\n\n"
                           "Examples:\n"
                           "  mm3 tokenize ../shared/golden/v1/checkpoint --text 'Hello, my dog is cute'\n"
                           "      one line per token: id and its text\n"
                           "  mm3 tokenize ../shared/golden/v1/checkpoint --text '<|im_start|>pop' --ids\n"
                           "      [151644, 8374]\n"
                           "  mm3 tokenize ../shared/golden/v1/checkpoint --decode 9707,11,847,5562\n"
                           "      Hello, my dog\n"
                           "  mm3 tokenize ../shared/golden/v1/checkpoint --caption $'# Pop\\n- **warm**' \\\n"
                           "      --lyrics $'[Verse] dropped\\nla la'\n"
                           "      the cleaned caption, normalized lyrics, prompt text and both id rows\n"
                           "  mm3 tokenize ../shared/golden/v1/checkpoint --file lyrics.txt --time 50\n"
                           "      {\"tokens\": ..., \"median_ms\": ...}\n\n"
                           "Exit codes: 0 ok, 2 invalid input (bad UTF-8 names the byte offset; a refused prompt\n"
                           "says why), 3 bad tokenizer file (names the field or special token).");
                       return [a]() { return run_tokenize(*a); };
                     },
                     "encode / decode text, or assemble a Music3 prompt, with the checkpoint's tokenizer"}};

}  // namespace
}  // namespace mm3::cli
