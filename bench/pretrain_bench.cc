// Pretraining throughput and memory per stage length (docs/design.md#benchmark-protocol, issue
// "staged pretraining").
//
// For every stage of a pretraining config (default configs/pretrain/small.yaml): one sequence of
// the stage's length from the retrieval generator, trained with the stage's path (training path,
// or inference path in chunks with full or truncated backpropagation) and an AdamW step.
// Reports, per stage: training tokens per second, the model FLOP rate (6 x active parameters per
// token, plus the latent layers' attention) against LibTorch's fp32 matmul peak measured in the
// same run (at the better OpenMP wait policy, bench/ceiling.h), and the peak resident memory above
// the trained model's (weights, gradients, AdamW moments, after one warm-up step). Finally the
// exponent of memory growth between the first and the last stage length (1 = linear).
//
// Each stage runs in a fresh process (the bench runs itself with --stage I): memory freed by one
// stage stays in the heap, so a later stage that needs less would read as the earlier peak.
//
//   pretrain_bench [--config F] [--steps N] [--quick] [--stage I]
#include <ATen/ATen.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_json.h"
#include "bench/ceiling.h"
#include "common/clock.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/process_memory.h"
#include "learner/pretrain/data/generators.h"
#include "learner/language_model_loss.h"
#include "learner/optimizer.h"
#include "learner/pretrain/pretrain_config.h"
#include "learner/pretrain/token_batch.h"

namespace strider {
namespace {

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Runs every stage in a child process (this program with --stage I), passes its lines through
// (the matmul peak once) and prints the memory growth exponent from the children's figures.
int RunStagesInChildren(const std::string& config_path, int64_t steps, size_t stages) {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length <= 0) {
    std::fprintf(stderr, "pretrain_bench: cannot find its own executable\n");
    return 1;
  }
  self[length] = '\0';
  double first_memory = 0, last_memory = 0;
  int64_t first_length = 0, last_length = 0;
  std::string bench_name;
  bool printed_peak = false;
  for (size_t stage = 0; stage < stages; ++stage) {
    const std::string command = std::string("'") + self + "' --config '" + config_path +
                                "' --steps " + std::to_string(steps) + " --stage " +
                                std::to_string(stage);
    FILE* child = popen(command.c_str(), "r");
    if (child == nullptr) return 1;
    char buffer[4096];
    while (std::fgets(buffer, sizeof(buffer), child) != nullptr) {
      const std::string line = buffer;
      const bool is_peak = line.find("\"matmul_peak_fp32\"") != std::string::npos;
      if (!is_peak || !printed_peak) std::fputs(buffer, stdout);
      printed_peak = printed_peak || is_peak;
      const size_t at = line.find("\"metric\":\"peak_memory_");
      if (at != std::string::npos) {
        const int64_t context = std::atoll(line.c_str() + at + 22);
        const size_t value = line.find("\"value\":");
        const double mib = std::atof(line.c_str() + value + 8);
        if (first_length == 0 && mib >= 1.0) first_length = context, first_memory = mib;
        last_length = context, last_memory = mib;
      }
      const size_t name = line.find("\"bench\":\"");
      if (bench_name.empty() && name != std::string::npos) {
        bench_name = line.substr(name + 9, line.find('"', name + 9) - name - 9);
      }
    }
    std::fflush(stdout);
    if (pclose(child) != 0) {
      std::fprintf(stderr, "pretrain_bench: stage %zu failed\n", stage);
      return 1;
    }
  }
  // The exponent starts at the first stage whose footprint the resident set can see: a tiny
  // model's short step fits in heap the warm-up already holds and reads as ~0 bytes.
  if (last_length > first_length && first_memory > 0) {
    const double exponent = std::log(last_memory / first_memory) /
                            std::log(static_cast<double>(last_length) / first_length);
    bench::PrintResult(bench_name, "memory_growth_exponent_" + std::to_string(first_length) +
                                       "_to_" + std::to_string(last_length),
                       exponent, "exponent", 1.0);
  }
  return 0;
}

int Run(int argc, char** argv) {
  std::string config_path = std::string(STRIDER_SOURCE_DIR) + "/configs/pretrain/small.yaml";
  int64_t steps = 1;
  int64_t only_stage = -1;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc) config_path = argv[++i];
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::stoll(argv[++i]);
    if (!std::strcmp(argv[i], "--stage") && i + 1 < argc) only_stage = std::stoll(argv[++i]);
    if (!std::strcmp(argv[i], "--quick")) {
      config_path = std::string(STRIDER_SOURCE_DIR) + "/configs/pretrain/tiny.yaml";
    }
  }
  Result<PretrainConfig> config = LoadPretrainConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "pretrain_bench: %s\n", config.status().ToString().c_str());
    return 2;
  }
  if (only_stage < 0) return RunStagesInChildren(config_path, steps, config->stages.size());
  if (only_stage >= static_cast<int64_t>(config->stages.size())) {
    std::fprintf(stderr, "pretrain_bench: --stage %lld: the config has %zu stages\n",
                 static_cast<long long>(only_stage), config->stages.size());
    return 2;
  }
  const int64_t threads = config->threads > 0 ? config->threads : config->model.threads;
  ConfigureRuntime(threads);
  const std::string bench = "pretrain_" + config->model.name;
  bench::CeilingSpec spec;  // 2048^2 fp32 products, best of 5, at the better wait policy
  spec.threads = threads;
  Result<bench::Ceiling> ceiling = bench::MeasureCeiling(spec);
  if (!ceiling.ok()) {
    std::fprintf(stderr, "pretrain_bench: %s\n", ceiling.status().ToString().c_str());
    return 1;
  }
  const double peak = ceiling->value * 1e9;
  bench::PrintResult(bench, "matmul_peak_fp32", peak / 1e9, "GFLOP/s", std::nullopt,
                     bench::CeilingFields(*ceiling));

  Result<std::unique_ptr<Model>> model = Model::Create(config->model, 1);
  if (!model.ok()) return 1;
  (*model)->SetRequiresGrad(true);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const at::Tensor& t : (*model)->TrainableParameters()) named.emplace_back(std::to_string(named.size()), t);
  AdamW optimizer(named, config->trainer.optimizer);
  const double active = static_cast<double>(CountParameters(config->model).active);
  const ModelConfig& m = config->model;
  const double latent_layers = static_cast<double>(m.CountLayers('G'));

  // One untimed step on a 64-token sequence first: gradients, optimizer temporaries and the
  // allocator's pools exist afterwards, so the memory below is what the stage's length adds, not
  // one-off allocations. This process runs only this stage, so the peak resident set after it
  // minus this baseline is the stage's peak footprint.
  {
    data::GeneratorOptions generator;
    generator.length = 64;  // shorter than any stage, so the first stage's activations count
    generator.facts = 1;
    Result<TokenBatch> batch = MakeTokenBatch(
        {data::Generate(data::GeneratorKind::kRetrieval, generator, 7, 1).tokens}, m);
    if (!batch.ok()) return 1;
    LossOptions options;
    options.record_routing = config->trainer.balance;
    optimizer.ZeroGrad();
    Result<LossResult> loss = LanguageModelLoss(**model, *batch, options);
    if (!loss.ok() || !optimizer.Step(1e-4).ok()) return 1;
  }
  const int64_t baseline = ResidentBytes();
  {
    const PretrainStage& stage = config->stages[only_stage];
    data::GeneratorOptions generator;
    generator.length = stage.context;
    generator.facts = config->retrieval_facts;
    generator.key_letters = config->retrieval_key_letters;
    std::vector<std::vector<int32_t>> rows = {
        data::Generate(data::GeneratorKind::kRetrieval, generator, 7, 0).tokens};
    Result<TokenBatch> batch = MakeTokenBatch(rows, m);
    if (!batch.ok()) return 1;
    LossOptions options;
    options.path = stage.paths == "inference" ? TrainingPath::kInference : TrainingPath::kTraining;
    options.chunk_tokens = stage.chunk_tokens;
    options.truncated = stage.backprop == "truncated";
    options.record_routing = config->trainer.balance;
    ResetPeakResident();
    double seconds = 0;
    for (int64_t step = 0; step < steps; ++step) {
      const auto start = Clock::now();
      optimizer.ZeroGrad();
      Result<LossResult> loss = LanguageModelLoss(**model, *batch, options);
      if (!loss.ok()) {
        std::fprintf(stderr, "pretrain_bench: %s\n", loss.status().ToString().c_str());
        return 1;
      }
      if (!optimizer.Step(1e-4).ok()) return 1;
      if (config->trainer.balance && !(*model)->UpdateRoutingBalance(loss->routing).ok()) return 1;
      seconds += Seconds(start);
    }
    const double memory = static_cast<double>(PeakResidentBytes() - baseline);
    const double tokens_per_second = stage.context * steps / seconds;
    // Attention over the latent cache: scores and weighted sums, forward and backward (x3), per
    // head over Dc + Dr (scores) and Dc (values), causal (half the pairs).
    const double attention_flops = latent_layers * 3 * 2 * m.latent.heads *
                                   (2.0 * m.latent.kv_rank + m.latent.rope_dim) * stage.context / 2;
    const double flops = tokens_per_second * (6 * active + attention_flops);
    const std::string suffix = "_" + std::to_string(stage.context);
    bench::PrintResult(bench, "train_tokens_per_second" + suffix, tokens_per_second, "tokens/s");
    bench::PrintResult(bench, "train_flops" + suffix, flops / 1e9, "GFLOP/s", peak / 1e9,
                       bench::CeilingFields(*ceiling));
    bench::PrintResult(bench, "peak_memory" + suffix, memory / (1 << 20), "MiB");
  }
  return 0;
}

}  // namespace
}  // namespace strider

int main(int argc, char** argv) {
  if (std::optional<int> child = strider::bench::RunCeilingChild(argc, argv)) return *child;
  strider::bench::EveryLineFields() = strider::bench::RunPolicyFields();
  return strider::Run(argc, argv);
}
