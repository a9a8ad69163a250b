#include "bench/ceiling.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/model/model.h"

extern char** environ;

namespace strider::bench {
namespace {

constexpr char kChildFlag[] = "--ceiling-child";
constexpr char kPolicyVariable[] = "OMP_WAIT_POLICY";
constexpr char kDefaultPolicy[] = "default";

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* KindName(CeilingKind kind) { return kind == CeilingKind::kMatmul ? "matmul" : "copy"; }

// In GFLOP/s or GB/s; the best run counts, since the ceiling is what the machine does when the
// neighbours are quiet.
double MeasureHere(const CeilingSpec& spec) {
  at::NoGradGuard no_grad;
  double best = 0;
  if (spec.kind == CeilingKind::kMatmul) {
    best = MatmulRateHere(spec.size, spec.size, spec.size, spec.repeats);
  } else {
    at::Tensor source = at::rand({spec.size});
    at::Tensor target = at::empty_like(source);
    target.copy_(source);
    for (int i = 0; i < spec.repeats; ++i) {
      const double start = Seconds();
      target.copy_(source);
      best = std::max(best, 2.0 * source.nbytes() / (Seconds() - start) / 1e9);
    }
  }
  return best;
}

}  // namespace

double MatmulRateHere(int64_t rows, int64_t inner, int64_t columns, int runs, int products) {
  at::NoGradGuard no_grad;
  at::Tensor a = at::randn({rows, inner});
  at::Tensor b = at::randn({inner, columns});
  at::Tensor c = at::mm(a, b);  // warm-up: thread pool and BLAS buffers
  double best = 0;
  for (int i = 0; i < runs; ++i) {
    const double start = Seconds();
    for (int k = 0; k < products; ++k) at::mm_out(c, a, b);
    best = std::max(best, 2.0 * rows * inner * columns * products / (Seconds() - start) / 1e9);
  }
  return best;
}

double LatentPrefillTileRate(int64_t width, int64_t rank) {
  return std::min(MatmulRateHere(2048, width, 512, 5, 20), MatmulRateHere(2048, 512, rank, 5, 20));
}

namespace {

// This environment without OMP_WAIT_POLICY, as execve takes it. The strings stay owned by
// `environ`; nothing here runs between fork and exec.
std::vector<char*> EnvironmentWithoutPolicy() {
  std::vector<char*> kept;
  const size_t prefix = std::strlen(kPolicyVariable);
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, kPolicyVariable, prefix) == 0 && (*entry)[prefix] == '=') continue;
    kept.push_back(*entry);
  }
  kept.push_back(nullptr);
  return kept;
}

// Runs this executable as a ceiling child under the default policy and returns its value.
Result<double> MeasureInChild(const CeilingSpec& spec) {
  char self[4096];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) return Status::IoError("cannot find this program's executable");
  self[length] = '\0';
  std::vector<std::string> arguments = {self,
                                        kChildFlag,
                                        KindName(spec.kind),
                                        std::to_string(spec.size),
                                        std::to_string(spec.repeats),
                                        std::to_string(spec.threads)};
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  std::vector<char*> envp = EnvironmentWithoutPolicy();

  int pipe_ends[2];
  if (::pipe(pipe_ends) != 0) return Status::IoError("pipe: " + std::string(strerror(errno)));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(pipe_ends[0]);
    ::close(pipe_ends[1]);
    return Status::IoError("fork: " + std::string(strerror(errno)));
  }
  if (pid == 0) {
    ::dup2(pipe_ends[1], STDOUT_FILENO);
    ::close(pipe_ends[0]);
    ::close(pipe_ends[1]);
    ::execve(self, argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(pipe_ends[1]);
  std::string output;
  char buffer[256];
  for (;;) {
    const ssize_t got = ::read(pipe_ends[0], buffer, sizeof(buffer));
    if (got > 0) {
      output.append(buffer, static_cast<size_t>(got));
    } else if (got == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(pipe_ends[0]);
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  const std::string what = std::string("ceiling child (") + KindName(spec.kind) + ")";
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return Status::Internal(what + " failed (wait status " + std::to_string(wait_status) + ")");
  }
  char* end = nullptr;
  const double value = std::strtod(output.c_str(), &end);
  if (end == output.c_str() || !std::isfinite(value) || value <= 0) {
    return Status::Internal(what + " printed '" + output + "', not a positive number");
  }
  return value;
}

}  // namespace

std::string WaitPolicy() {
  const char* policy = std::getenv(kPolicyVariable);
  return policy != nullptr && *policy != '\0' ? policy : kDefaultPolicy;
}

Result<Ceiling> MeasureCeiling(const CeilingSpec& spec) {
  Ceiling ceiling;
  ceiling.in_process = MeasureHere(spec);
  ceiling.value = ceiling.in_process;
  ceiling.policy = WaitPolicy();
  if (ceiling.policy != kDefaultPolicy) {
    STRIDER_ASSIGN_OR_RETURN(const double under_default, MeasureInChild(spec));
    ceiling.under_default = under_default;
    if (under_default > ceiling.value) {
      ceiling.value = under_default;
      ceiling.policy = kDefaultPolicy;
    }
  }
  return ceiling;
}

std::optional<int> RunCeilingChild(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], kChildFlag) != 0) return std::nullopt;
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s %s matmul|copy SIZE REPEATS THREADS\n", argv[0], kChildFlag);
    return 2;
  }
  const std::string_view kind = argv[2];
  CeilingSpec spec;
  spec.kind = kind == "copy" ? CeilingKind::kCopy : CeilingKind::kMatmul;
  spec.size = std::atoll(argv[3]);
  spec.repeats = std::atoi(argv[4]);
  spec.threads = std::atoll(argv[5]);
  if ((kind != "matmul" && kind != "copy") || spec.size <= 0 || spec.repeats <= 0 ||
      spec.threads <= 0) {
    std::fprintf(stderr, "%s: bad ceiling child arguments\n", argv[0]);
    return 2;
  }
  ConfigureRuntime(spec.threads);
  std::printf("%.9g\n", MeasureHere(spec));
  return 0;
}

JsonFields RunPolicyFields() { return {{"policy", JsonString(WaitPolicy())}}; }

JsonFields CeilingFields(const Ceiling& ceiling) {
  JsonFields fields = {{"ceiling_policy", JsonString(ceiling.policy)}};
  if (ceiling.under_default) {
    fields.emplace_back("ceiling_under_run_policy", JsonNumber(ceiling.in_process));
    fields.emplace_back("ceiling_under_default", JsonNumber(*ceiling.under_default));
  }
  return fields;
}

}  // namespace strider::bench
