// cmd_verify.cpp — `mm3 verify GOLDEN_DIR [--kind K]... [--case NAME]...`
#include "commands.h"
#include "core/thread_pool.h"
#include "core/errors.h"
#include "verify/quant_quality.h"
#include "verify/verify.h"

namespace mm3::cli {
namespace {

struct VerifyArgs {
  std::string dir;
  std::vector<std::string> kinds, cases;
  bool verbose = false;
  int threads = 0;
  std::string dump;
  std::vector<std::string> quant;
};

RegisterCommand reg{{"verify", 20,
                     [](CLI::App& sub) -> std::function<int()> {
                       auto a = std::make_shared<VerifyArgs>();
                       sub.add_option("GOLDEN_DIR", a->dir, "golden set directory (holds manifest.json)")->required();
                       sub.add_option("--kind", a->kinds,
                                      "only cases of this kind (repeatable): scheduler, tokenizer, language_model, "
                                      "rvq_depth_decoder, condition_encoder, transformer, vocoder, acoustic, e2e");
                       sub.add_option("--case", a->cases, "only the case with this name (repeatable)");
                       sub.add_flag("-v,--verbose", a->verbose, "print notes of passing cases too");
                       sub.add_option("-t,--threads", a->threads, "threads (default: all cores)");
                       sub.add_option("--dump", a->dump,
                                      "write every output we computed to DIR/<case>/<output>.npy (for analysis "
                                      "next to the golden's own tensors)");
                       sub.add_option("--quant", a->quant,
                                      "after the gated run, report (informational, not gated) how the LM + depth "
                                      "decoder with int8 / q4 weights compare with the bf16 goldens (repeatable)");
                       sub.footer(
                           "Runs each case of GOLDEN_DIR/manifest.json and applies its checks with the rules of\n"
                           "golden/README.md. Prints one line per case (PASS/FAIL name kind metrics), then\n"
                           "'N passed, N failed'. Exit 0 only when nothing failed. A check whose golden tensor is itself\n"
                           "unusable (NaN/inf) is marked '?' and reported as a golden defect: it counts as neither;\n"
                           "a case with only such checks is UNVERIFIABLE.\n"
                           "--quant int8|q4 then prints INFO lines for the bf16 LM / depth / e2e cases run with quantized\n"
                           "weights (bit-identical fraction, rel RMS, argmax / top-50 agreement, free-running code\n"
                           "agreement); they never change the exit code.\n\n"
                           "Example:\n  mm3 verify ../shared/golden/v1 --kind scheduler --kind vocoder");
                       return [a]() {
                         std::vector<kern::QuantType> quant;
                         for (const auto& q : a->quant) {
                           const auto t = kern::quant_from_name(q);
                           if (!t || *t == kern::QuantType::None)
                             throw InvalidInput(fmt::format("verify: --quant '{}': use int8 or q4", q));
                           quant.push_back(*t);
                         }
                         ThreadPool pool(a->threads);
                         verify::VerifyOptions opt{a->kinds, a->cases, a->verbose, a->dump};
                         auto reports = verify::run_verify(a->dir, opt, pool, stdout);
                         int passed = 0, failed = 0, unverifiable = 0, defect_checks = 0;
                         std::string names;
                         for (const auto& r : reports) {
                           if (r.unverifiable) {
                             ++unverifiable;
                             names += (names.empty() ? "" : ", ") + r.name;
                           } else {
                             (r.pass ? passed : failed)++;
                           }
                           for (const auto& c : r.checks) defect_checks += c.unverifiable;
                         }
                         if (defect_checks)
                           std::printf("%d check(s) could not be verified because the golden tensor itself is "
                                       "defective (marked '?'); %d case(s) had nothing else to check%s%s\n",
                                       defect_checks, unverifiable, names.empty() ? "" : ": ", names.c_str());
                         std::printf("%d passed, %d failed\n", passed, failed);
                         for (kern::QuantType t : quant) {  // informational: never changes the exit code
                           verify::run_quant_quality(a->dir, opt, t, pool, stdout);
                           std::printf("quant=%s: informational only (a quantized run is not the reference "
                                       "computation; no pass/fail)\n",
                                       kern::quant_name(t));
                         }
                         if (reports.empty()) {
                           std::fprintf(stderr, "mm3 verify: no case matched the filters\n");
                           return 1;
                         }
                         return failed ? 1 : 0;
                       };
                     },
                     "run a golden set and compare (PASS/FAIL per case)"}};

}  // namespace
}  // namespace mm3::cli
