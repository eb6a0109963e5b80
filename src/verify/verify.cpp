#include "verify/verify.h"
#include "io/npy.h"

#include <fstream>

#include "core/errors.h"
#include "verify/kinds.h"

namespace mm3::verify {

namespace fs = std::filesystem;
using nlohmann::json;

VerifyContext::VerifyContext(fs::path golden_dir, json manifest, const ThreadPool& pool)
    : dir_(std::move(golden_dir)), manifest_(std::move(manifest)), pool_(pool) {}

fs::path VerifyContext::checkpoint_dir() const { return dir_ / manifest_.value("checkpoint", "checkpoint"); }

const Checkpoint& VerifyContext::checkpoint() const {
  if (!ckpt_) ckpt_ = std::make_unique<Checkpoint>(checkpoint_dir().string());
  return *ckpt_;
}

json VerifyContext::find_check(const std::string& kind, const std::string& dtype, const std::string& output) const {
  for (const json& c : manifest_.value("cases", json::array())) {
    if (c.value("kind", "") != kind) continue;
    if (!dtype.empty() && c.value("meta", json::object()).value("dtype", "") != dtype) continue;
    for (const json& ch : c.value("checks", json::array()))
      if (ch.value("output", "") == output) return ch;
  }
  return json();
}

namespace {

const std::map<std::string, KindRunner>& runners() {
  static const std::map<std::string, KindRunner> r = {
      {"scheduler", run_scheduler_case},
      {"language_model", run_language_model_case},
      {"rvq_depth_decoder", run_rvq_depth_decoder_case},
      {"condition_encoder", run_condition_encoder_case},
      {"transformer", run_transformer_case},
      {"vocoder", run_vocoder_case},
      {"acoustic", run_acoustic_case},
      {"e2e", run_e2e_case},
  };
  return r;
}

bool selected(const std::vector<std::string>& filter, const std::string& v) {
  if (filter.empty()) return true;
  for (const auto& f : filter)
    if (f == v) return true;
  return false;
}

CaseReport run_one(const json& spec, const VerifyContext& ctx, const fs::path& dump_dir) {
  CaseReport rep;
  rep.name = spec.value("name", "?");
  rep.kind = spec.value("kind", "?");
  auto it = runners().find(rep.kind);
  if (it == runners().end()) {
    rep.error = "not implemented (no runner for this kind)";
    return rep;
  }
  try {
    const fs::path file = ctx.golden_dir() / spec.value("file", "");
    SafetensorsFile st(file.string());
    CaseOutputs out = it->second(CaseInput{spec, st, ctx});
    if (!dump_dir.empty()) {
      const fs::path d = dump_dir / rep.name;
      fs::create_directories(d);
      for (const auto& [name, t] : out.outputs) write_npy((d / (name + ".npy")).string(), t);
    }
    for (const json& check : spec.value("checks", json::array())) {
      const std::string name = check.value("output", "");
      const std::string rule = check.value("rule", "");
      auto o = out.outputs.find(name);
      if (o == out.outputs.end()) {
        // A runner may have handled this check itself (e.g. bf16_forced); then it is in `extra`.
        bool handled = false;
        for (const auto& e : out.extra) handled |= e.output == name;
        if (!handled) rep.checks.push_back({name, rule, false, "", "the runner produced no such output"});
        continue;
      }
      if (!st.contains(name)) {
        rep.checks.push_back({name, rule, false, "", "the golden file has no such tensor"});
        continue;
      }
      rep.checks.push_back(apply_check(check, o->second, st.get(name)));
    }
    for (auto& e : out.extra) rep.checks.push_back(std::move(e));
    rep.notes = std::move(out.notes);
  } catch (const NotImplemented& e) {
    rep.error = std::string("not implemented: ") + e.what();
  } catch (const std::exception& e) {
    rep.error = e.what();
  }
  return rep;
}

}  // namespace

void finalize_report(CaseReport& r) {
  if (r.error.empty() && r.checks.empty()) r.error = "case has no checks";
  int verifiable = 0;
  bool all = true;
  for (const auto& c : r.checks) {
    if (c.unverifiable) continue;
    ++verifiable;
    all &= c.pass;
  }
  r.pass = r.error.empty() && verifiable > 0 && all;
  r.unverifiable = r.error.empty() && verifiable == 0 && !r.checks.empty();
}

void print_report(const CaseReport& r, std::FILE* out, bool verbose) {
  std::string metrics;
  for (const auto& c : r.checks)
    metrics += fmt::format(" {}:{}[{}]{}", c.output, c.rule, c.metrics, c.pass ? "" : c.unverifiable ? "?" : "!");
  if (!r.error.empty()) metrics += " error: " + r.error;
  std::fprintf(out, "%s %s %s%s\n", r.pass ? "PASS" : r.unverifiable ? "UNVERIFIABLE" : "FAIL", r.name.c_str(), r.kind.c_str(), metrics.c_str());
  for (const auto& c : r.checks)
    if (!c.pass && !c.reason.empty()) std::fprintf(out, "    %s: %s\n", c.output.c_str(), c.reason.c_str());
  if (verbose || !r.pass)
    for (const auto& n : r.notes) std::fprintf(out, "    note: %s\n", n.c_str());
  std::fflush(out);
}

std::vector<CaseReport> run_verify(const fs::path& golden_dir, const VerifyOptions& opt, const ThreadPool& pool,
                                   std::FILE* out) {
  const fs::path mpath = golden_dir / "manifest.json";
  std::ifstream in(mpath);
  if (!in) throw InvalidInput(fmt::format("{}: missing (is {} a golden directory?)", mpath.string(), golden_dir.string()));
  json manifest;
  try {
    manifest = json::parse(in);
  } catch (const json::exception& e) {
    throw InvalidInput(fmt::format("{}: not valid JSON ({})", mpath.string(), e.what()));
  }
  if (!manifest.contains("cases") || !manifest["cases"].is_array())
    throw InvalidInput(fmt::format("{}: no 'cases' array", mpath.string()));
  VerifyContext ctx(golden_dir, manifest, pool);
  std::vector<CaseReport> reports;
  for (const json& spec : manifest["cases"]) {
    if (!selected(opt.kinds, spec.value("kind", "")) || !selected(opt.cases, spec.value("name", ""))) continue;
    CaseReport r = run_one(spec, ctx, opt.dump_dir);
    finalize_report(r);
    print_report(r, out, opt.verbose);
    reports.push_back(std::move(r));
  }
  if (selected(opt.kinds, "tokenizer")) {
    for (CaseReport& r : run_tokenizer_files(ctx, opt)) {
      finalize_report(r);
      print_report(r, out, opt.verbose);
      reports.push_back(std::move(r));
    }
  }
  return reports;
}

}  // namespace mm3::verify
