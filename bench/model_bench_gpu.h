// model_bench's GPU sections (`model_bench --device cuda`, docs/cuda.md "Baseline figures"):
// the model, the rollout engine and a training step on a CUDA device, each figure beside a
// ceiling measured in the same run on the same device.
#pragma once

#include <string>
#include <vector>

namespace strider::bench {

struct GpuBenchOptions {
  std::string device = "cuda";
  // Configs under configs/model/ (stems) for decode and prefill; the first is the large one the
  // training step, the weight publish and the profile use.
  std::vector<std::string> configs = {"gpu_1b", "small"};
  // Sections to run: any of ceilings, decode, prefill, train, publish (ceilings always run).
  std::vector<std::string> sections = {"decode", "prefill", "train", "publish"};
  bool quick = false;  // fewer timed steps and only the shortest context per batch
};

// Runs the sections; returns the process exit status (0, or 2 without a CUDA device).
int RunGpuSections(const GpuBenchOptions& options);

}  // namespace strider::bench
