// main.cpp — the `mm3` command line: dispatches to the registered subcommands (commands.h) and maps
// errors to exit codes. Exceptions stop here.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "commands.h"
#include "core/errors.h"

namespace mm3::cli {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace mm3::cli

namespace {

int exit_code_for(mm3::ErrorKind k) {
  switch (k) {
    case mm3::ErrorKind::invalid_input: return 2;
    case mm3::ErrorKind::bad_model: return 3;
    case mm3::ErrorKind::out_of_memory: return 4;
    case mm3::ErrorKind::cancelled: return 130;
    default: return 5;
  }
}

// oneDNN (the bf16 GEMMs) runs on libgomp's threads, and libgomp's default lets them spin for
// milliseconds after every call, on the cores our own pool's workers need next: the bf16 DiT forward
// (216 oneDNN calls) ran 5% slower than with OMP_WAIT_POLICY=PASSIVE (dit_forward_L689_bf16, Zen 5,
// alternating processes: 5.56 / 5.70 s against 5.27 / 5.41). libgomp reads the variable once, when it
// is loaded, before main() (and an ELF preinit function's setenv is undone by libc's own start-up), so
// when it is unset the process sets it and executes itself again, once. A value the user set stands;
// if the exec fails the run carries on with libgomp's default. Nothing has been read or written yet.
void passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  execv("/proc/self/exe", argv);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mm3::cli;
  passive_openmp(argv);
  CLI::App app{
      "mm3 — native inference engine for MiniMax-Music3 (lyrics + style -> stereo song).\n\n"
      "Examples:\n"
      "  mm3 inspect ../shared/golden/v1/checkpoint      describe a checkpoint\n"
      "  mm3 verify ../shared/golden/v1                  run every golden case\n"
      "  mm3 verify ../shared/golden/v1 --kind scheduler run one kind\n",
      "mm3"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "mm3 0.1.0");
  auto& cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  std::map<CLI::App*, std::function<int()>> runs;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
    return 2;
  } catch (const mm3::Error& e) {
    if (e.kind() == mm3::ErrorKind::cancelled) {
      std::fprintf(stderr, "mm3: cancelled\n");
    } else {
      std::fprintf(stderr, "mm3: error (%s): %s\n", mm3::error_kind_name(e.kind()), e.what());
    }
    return exit_code_for(e.kind());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mm3: error (out of memory): an allocation failed\n");
    return 4;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mm3: error (internal): %s\n", e.what());
    return 5;
  }
}
