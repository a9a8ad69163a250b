// Ceilings at the machine's best, whatever OpenMP wait policy the measured code runs under.
//
// OMP_WAIT_POLICY is read once, when OpenMP starts, and it moves LibTorch's own products: on the
// 2-core development machine a 2048^2 fp32 matmul reaches 32-40 GFLOP/s under PASSIVE against
// 69-74 under the default policy. A figure taken under PASSIVE (as tests run, and as loaded
// comparisons are run) against a ceiling also taken under PASSIVE would read as about twice its
// real share of the machine. So a ceiling is measured in this process and, when the variable is
// set, once more in a child of the same program started without it (the default policy); the
// better of the two is the ceiling, and the lines say which policy each side ran under:
//
//   this process                              child (same executable, OMP_WAIT_POLICY unset)
//   MeasureCeiling(spec) -- fork, execve --> main -> RunCeilingChild: measures, prints the value
//                        <-- one line on a pipe --
//
// The child runs while this process waits on the pipe, so the two never compete for cores.
// Under PASSIVE this process's idle OpenMP threads sleep; under ACTIVE they may spin beside the
// child, which then reads low and the in-process figure is the better one.
//
// Every bench program that prints a ratio against a matmul or copy ceiling (model_bench,
// rollout_bench, pretrain_bench) calls RunCeilingChild first thing in main.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "bench/bench_json.h"
#include "common/status.h"

namespace strider::bench {

enum class CeilingKind {
  kMatmul,  // best at::mm_out of two n x n fp32 matrices, GFLOP/s
  kCopy,    // best Tensor::copy_ of `size` fp32 values, GB/s read plus written
};

struct CeilingSpec {
  CeilingKind kind = CeilingKind::kMatmul;
  int64_t size = 2048;  // kMatmul: n; kCopy: values copied
  int repeats = 5;      // timed runs after one untimed warm-up; the best counts
  int64_t threads = 2;  // the child's ConfigureRuntime
};

struct Ceiling {
  double value = 0;       // the better of the two measurements, GFLOP/s or GB/s
  std::string policy;     // the wait policy `value` was measured under (WaitPolicy's spelling)
  double in_process = 0;  // under this process's policy
  std::optional<double> under_default;  // in the child; absent when the policy is unset
};

// This process's OMP_WAIT_POLICY as set ("PASSIVE", "ACTIVE", ...) or "default" when unset.
std::string WaitPolicy();

// Measures `spec` here and, when OMP_WAIT_POLICY is set, in a child under the default policy.
// Fails when the child cannot be started or does not print a positive number.
Result<Ceiling> MeasureCeiling(const CeilingSpec& spec);

// Best rate of `runs` timed runs of `products` back-to-back (rows x inner) @ (inner x columns)
// fp32 products, in this process, after one untimed product; GFLOP/s. The matmul ceiling is
// the square case; kernels compare against their own tile shapes with it.
double MatmulRateHere(int64_t rows, int64_t inner, int64_t columns, int runs, int products = 1);

// The matmul rate at the latent-attention prefill kernel's own products, the slower of its two:
// 2048 query rows against 512 keys of width `width` (Dc + Dr, the scores), then those scores
// against the keys' `rank` (Dc) latent columns. What a long prefill's attention can reach here.
double LatentPrefillTileRate(int64_t width, int64_t rank);

// The child's side. When argv is the command line MeasureCeiling gives its child, measures,
// prints the value on stdout and returns the exit status for main; otherwise returns nullopt
// and main goes on with its own arguments.
std::optional<int> RunCeilingChild(int argc, char** argv);

// {"policy": WaitPolicy()}, for EveryLineFields of a program whose figures OpenMP runs.
JsonFields RunPolicyFields();

// For a line whose baseline is `ceiling` (and for the ceiling's own line): "ceiling_policy", and
// when a child measured too, both measurements ("ceiling_under_run_policy",
// "ceiling_under_default"), which show what the policy alone costs the ceiling.
JsonFields CeilingFields(const Ceiling& ceiling);

}  // namespace strider::bench
