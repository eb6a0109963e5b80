// commands.h — how `mm3` subcommands plug in. Each cmd_*.cpp registers itself with a static
// RegisterCommand object; main.cpp builds the CLI11 app from the registry, runs the chosen command
// and turns exceptions into exit codes:
//   0 ok · 1 verification failed · 2 invalid input · 3 bad/missing model · 4 out of memory
//   · 5 internal error · 130 cancelled
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace mm3::cli {

struct Command {
  std::string name;
  int order;  // position in --help
  // Adds the subcommand's options to `sub`; returns the function that runs it (returns exit code).
  std::function<std::function<int()>(CLI::App& sub)> setup;
  std::string description;
};

std::vector<Command>& registry();

struct RegisterCommand {
  explicit RegisterCommand(Command c) { registry().push_back(std::move(c)); }
};

}  // namespace mm3::cli
