#include "diffusion/scheduler.h"

#include <map>

#include "core/errors.h"

namespace mm3 {

std::vector<float> flow_time_grid(int num_steps) {
  if (num_steps < 1) throw InvalidInput(fmt::format("steps must be >= 1 (got {})", num_steps));
  const int N = num_steps;
  std::vector<float> t(N + 1);
  // numpy linspace(start=1, stop=1/N, num=N) in float64: start + i * step, step = (stop - start)/(N-1),
  // with the last element set to stop exactly.
  const double start = 1.0, stop = 1.0 / N;
  for (int i = 0; i < N; ++i) {
    double s;
    if (N == 1) s = start;
    else if (i == N - 1) s = stop;
    else s = start + i * ((stop - start) / (N - 1));
    const float sigma = static_cast<float>(s);
    t[i] = 1.0f - sigma;  // fp32 subtraction, as torch inverts the fp32 sigmas
  }
  t[N] = 1.0f;
  return t;
}

void euler_step(float* x, const float* v, int64_t n, float t0, float t1) {
  const float dt = t1 - t0;
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + dt * v[i];
}

namespace {
const std::map<std::string, SolverStep>& solvers() {
  static const std::map<std::string, SolverStep> s = {{"euler", euler_step}};
  return s;
}
}  // namespace

SolverStep find_solver(const std::string& name) {
  auto it = solvers().find(name);
  if (it == solvers().end()) {
    std::string known;
    for (const auto& [k, v] : solvers()) known += (known.empty() ? "" : ", ") + k;
    throw InvalidInput(fmt::format("unknown solver '{}' (known: {})", name, known));
  }
  return it->second;
}

std::vector<std::string> solver_names() {
  std::vector<std::string> r;
  for (const auto& [k, v] : solvers()) r.push_back(k);
  return r;
}

}  // namespace mm3
