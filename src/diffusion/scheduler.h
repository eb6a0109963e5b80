// scheduler.h — the flow-matching time grid and the solver contract (MODEL.md §4.2).
//
// The grid is diffusers' FlowMatchEulerDiscreteScheduler with num_train_timesteps 1, shift 1 and
// invert_sigmas, fed sigmas = linspace(1, 1/N, N): t_i = f32(1 - f32(linspace(1, 1/N, N)[i])) for
// i < N, then t_N = 1. t = 0 is noise, t = 1 is data.
//
// A solver is a pure step function x <- step(x, v, t_i, t_{i+1}); solvers are looked up by name so
// others (Heun, ...) can be added behind the same contract.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mm3 {

// N + 1 times: t_0 = 0, ..., t_{N-1} = 1 - 1/N (fp32, as the reference rounds), t_N = 1.
std::vector<float> flow_time_grid(int num_steps);

// x[0..n) <- x + (t1 - t0) * v, all in fp32 (dt computed in fp32 from the grid values).
using SolverStep = std::function<void(float* x, const float* v, int64_t n, float t0, float t1)>;

void euler_step(float* x, const float* v, int64_t n, float t0, float t1);

// "euler" -> euler_step. Throws InvalidInput listing the known names for an unknown one.
SolverStep find_solver(const std::string& name);
std::vector<std::string> solver_names();

}  // namespace mm3
