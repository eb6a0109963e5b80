// verify.h — `mm3 verify GOLDEN_DIR`: runs a golden set in the ../shared/golden format.
//
// Cases come from GOLDEN_DIR/manifest.json; each is run by the runner registered for its `kind`
// (kinds.h), which returns its computed tensors by output name; the driver then applies the case's
// `checks` (compare.h) and prints one line per case. The tokenizer files (tokenize.jsonl,
// prompts.jsonl, prompt_errors.jsonl) form the pseudo-kind `tokenizer`. A kind without a runner is a
// FAIL "not implemented", never a skip.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "verify/compare.h"

namespace mm3::verify {

// Shared by all cases of one run.
class VerifyContext {
 public:
  VerifyContext(std::filesystem::path golden_dir, nlohmann::json manifest, const ThreadPool& pool);
  const std::filesystem::path& golden_dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const ThreadPool& pool() const { return pool_; }
  std::filesystem::path checkpoint_dir() const;
  const Checkpoint& checkpoint() const;  // loaded on first use
  // The manifest check object {"output": output, ...} of the first case with this kind and meta.dtype;
  // null json when absent. Used by rules that borrow another case's bounds (bf16_forced).
  nlohmann::json find_check(const std::string& kind, const std::string& dtype, const std::string& output) const;
  // Lazily loaded, cached per run so that several cases share one model load. Runners key by name.
  std::map<std::string, std::shared_ptr<void>>& cache() const { return cache_; }

 private:
  std::filesystem::path dir_;
  nlohmann::json manifest_;
  const ThreadPool& pool_;
  mutable std::unique_ptr<Checkpoint> ckpt_;
  mutable std::map<std::string, std::shared_ptr<void>> cache_;
};

struct CaseInput {
  const nlohmann::json& spec;  // the manifest case object (name, kind, file, meta, checks)
  const SafetensorsFile& file; // its tensors
  const VerifyContext& ctx;
};

struct CaseOutputs {
  std::map<std::string, Tensor> outputs;  // by the checks' `output` names
  std::vector<CheckResult> extra;         // additional gated checks a runner computed itself
  std::vector<std::string> notes;         // reported, not gated
};

using KindRunner = std::function<CaseOutputs(const CaseInput&)>;

// One printed line: PASS/FAIL name kind metrics, plus detail lines.
struct CaseReport {
  std::string name, kind;
  bool pass = false;          // every verifiable check passed (and there was at least one)
  bool unverifiable = false;  // no verifiable check: every check hit a golden defect (not a pass)
  std::vector<CheckResult> checks;
  std::vector<std::string> notes;
  std::string error;  // set when the runner threw
};

struct VerifyOptions {
  std::vector<std::string> kinds;  // empty: all
  std::vector<std::string> cases;  // empty: all
  bool verbose = false;
  // When set, every output a runner produced is written as DIR/<case>/<output>.npy (ours; the
  // golden's own tensors are in the case file) for offline analysis.
  std::filesystem::path dump_dir;
};

// Runs the set, printing as it goes (to `out`). Returns the reports; the caller decides the exit code.
std::vector<CaseReport> run_verify(const std::filesystem::path& golden_dir, const VerifyOptions& opt,
                                   const ThreadPool& pool, std::FILE* out);

void print_report(const CaseReport& r, std::FILE* out, bool verbose);

// Sets pass / unverifiable from the checks and the error (the one place the case verdict is made).
void finalize_report(CaseReport& r);

}  // namespace mm3::verify
