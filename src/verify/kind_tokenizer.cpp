// kind_tokenizer.cpp — the `tokenizer` pseudo-kind (issue 3). Not implemented yet: reports a FAIL for
// each tokenizer file present in the golden directory.
#include "verify/kinds.h"

namespace mm3::verify {

std::vector<CaseReport> run_tokenizer_files(const VerifyContext& ctx, const VerifyOptions& opt) {
  std::vector<CaseReport> r;
  for (const char* f : {"tokenize.jsonl", "prompts.jsonl", "prompt_errors.jsonl"}) {
    if (!std::filesystem::exists(ctx.golden_dir() / f)) continue;
    if (!opt.cases.empty()) continue;
    CaseReport c;
    c.name = f;
    c.kind = "tokenizer";
    c.error = "not implemented";
    r.push_back(c);
  }
  return r;
}

}  // namespace mm3::verify

namespace mm3::verify {
void e2e_text_part(const CaseInput&, CaseOutputs& out) {
  out.extra.push_back({"text_ids", "exact", false, "", "not implemented"});
}
}  // namespace mm3::verify
