// kind_scheduler.cpp — golden kind `scheduler`: the time grid (exact) and an Euler trajectory with a
// constant velocity (fp32), MODEL.md §4.2.
#include <cstring>

#include "diffusion/scheduler.h"
#include "verify/kinds.h"

namespace mm3::verify {

CaseOutputs run_scheduler_case(const CaseInput& in) {
  const int N = in.spec.at("meta").at("steps").get<int>();
  const std::vector<float> grid = flow_time_grid(N);
  CaseOutputs out;
  out.outputs["timesteps"] = Tensor::from_f32(std::vector<float>(grid.begin(), grid.end() - 1), {N});
  out.outputs["sigmas"] = Tensor::from_f32(grid, {N + 1});

  Tensor x0 = in.file.get("x0").to(DType::F32);
  Tensor v = in.file.get("velocity").to(DType::F32);
  const int64_t n = x0.numel();
  Shape traj_shape = {N};
  for (int64_t d : x0.shape()) traj_shape.push_back(d);
  Tensor traj = Tensor::empty(DType::F32, traj_shape);
  std::vector<float> x = x0.to_f32_vector();
  const SolverStep step = find_solver("euler");
  for (int i = 0; i < N; ++i) {
    step(x.data(), v.data<float>(), n, grid[i], grid[i + 1]);
    std::memcpy(traj.data<float>() + i * n, x.data(), n * sizeof(float));
  }
  out.outputs["trajectory"] = traj;
  return out;
}

}  // namespace mm3::verify
