// Learner pieces with LibTorch: the optimiser and its saved state, checkpoints (also a write
// killed part-way), chunked training through the inference path against the training path, and
// pretraining stage transitions and resume.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/durable_file.h"
#include "common/model/model.h"
#include "common/model/tensor_pool.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "learner/checkpoint.h"
#include "learner/language_model_loss.h"
#include "learner/learner.h"
#include "learner/optimizer.h"
#include "learner/pretrain/pretrain.h"
#include "learner/pretrain/pretrain_config.h"
#include "learner/pretrain/token_batch.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

namespace fs = std::filesystem;

std::string SourceDir() {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  return source ? source : ".";
}

std::string TempDir(const std::string& name) {
  return strider::testing::ScratchDir("strider_learner_test_" + name);
}

ModelConfig TinyConfig() {
  Result<ModelConfig> config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return *config;
}

TEST(AdamW, MatchesTheUpdateRuleAndResumesFromSavedState) {
  ConfigureRuntime(1);
  AdamWOptions options;
  options.learning_rate = 0.1;
  options.weight_decay = 0.5;
  options.clip_norm = 0;
  at::Tensor w = at::full({2, 2}, 1.0, at::kDouble).requires_grad_(true);
  at::Tensor b = at::full({2}, 1.0, at::kDouble).requires_grad_(true);
  AdamW adam({{"w", w}, {"b", b}}, options);
  auto step = [&](double lr) {
    adam.ZeroGrad();
    ((w * w).sum() + (b * 3).sum()).backward();
    return adam.Step(lr);
  };
  ASSERT_TRUE(step(0.1).ok());
  // First step: m = (1-b1) g, v = (1-b2) g^2, corrected m/sqrt(v) = sign(g); w also decays.
  EXPECT_NEAR(w[0][0].item<double>(), 1.0 * (1 - 0.1 * 0.5) - 0.1 * (1 / (1 + 1e-8 / 2)), 1e-9);
  EXPECT_NEAR(b[0].item<double>(), 1.0 - 0.1, 1e-7);  // vectors are not decayed

  const std::string dir = TempDir("adamw");
  ASSERT_TRUE(adam.Save(dir + "/opt.safetensors").ok());
  at::Tensor w2 = w.detach().clone().requires_grad_(true);
  at::Tensor b2 = b.detach().clone().requires_grad_(true);
  AdamW restored({{"w", w2}, {"b", b2}}, options);
  ASSERT_TRUE(restored.Load(dir + "/opt.safetensors").ok());
  EXPECT_EQ(restored.step(), 1);
  ASSERT_TRUE(step(0.05).ok());
  restored.ZeroGrad();
  ((w2 * w2).sum() + (b2 * 3).sum()).backward();
  ASSERT_TRUE(restored.Step(0.05).ok());
  EXPECT_TRUE(at::allclose(w, w2, 0, 1e-12));
  EXPECT_TRUE(at::allclose(b, b2, 0, 1e-12));
  // The state opens as plain safetensors with the documented names.
  Result<SafetensorsContents> contents = ReadSafetensors(dir + "/opt.safetensors");
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(contents->tensors.count("w.exp_avg_sq"), 1u);
  EXPECT_EQ(contents->metadata.at("step"), "1");
}

TEST(AdamW, ClipsTheGlobalNorm) {
  AdamWOptions options;
  options.clip_norm = 1.0;
  options.weight_decay = 0;
  at::Tensor w = at::zeros({3}, at::kDouble).requires_grad_(true);
  AdamW adam({{"w", w}}, options);
  (w * at::tensor({30.0, 40.0, 0.0}, at::kDouble)).sum().backward();
  Result<double> norm = adam.Step(0.01);
  ASSERT_TRUE(norm.ok());
  EXPECT_NEAR(*norm, 50.0, 1e-9);  // the norm before clipping is reported
}

TEST(AdamW, LearningRateScaleSlowsOneParameter) {
  AdamWOptions options;
  options.weight_decay = 0;
  options.clip_norm = 0;
  at::Tensor fast = at::zeros({2}, at::kDouble).requires_grad_(true);
  at::Tensor slow = at::zeros({2}, at::kDouble).requires_grad_(true);
  AdamW adam({{"fast", fast}, {"slow", slow}}, options);
  ASSERT_TRUE(adam.SetLearningRateScale("slow", 0.1).ok());
  EXPECT_FALSE(adam.SetLearningRateScale("missing", 0.1).ok());
  EXPECT_FALSE(adam.SetLearningRateScale("fast", -1).ok());
  ((fast + slow) * at::tensor({1.0, -2.0}, at::kDouble)).sum().backward();
  ASSERT_TRUE(adam.Step(0.01).ok());
  // The first Adam step moves every coordinate by the rate against its gradient's sign.
  EXPECT_TRUE(at::allclose(fast.detach(), at::tensor({-0.01, 0.01}, at::kDouble), 0, 1e-9));
  EXPECT_TRUE(at::allclose(slow.detach(), at::tensor({-0.001, 0.001}, at::kDouble), 0, 1e-9));
}

// Every tensor of `loaded` equals the model tensor of the same name, in value and dtype.
void ExpectSameWeights(const Model& loaded,
                       const std::vector<std::pair<std::string, at::Tensor>>& expected) {
  ASSERT_EQ(loaded.tensors().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(loaded.tensors()[i].first, expected[i].first);
    EXPECT_TRUE(at::equal(loaded.tensors()[i].second, expected[i].second))
        << "tensor " << expected[i].first << " differs";
  }
}

// The two files hold the same tensors, byte for byte, and the same metadata.
void ExpectSameFileContents(const std::string& path, const SafetensorsContents& expected) {
  Result<SafetensorsContents> read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->metadata, expected.metadata);
  ASSERT_EQ(read->tensors.size(), expected.tensors.size()) << path;
  for (const auto& [name, tensor] : expected.tensors) {
    auto it = read->tensors.find(name);
    ASSERT_NE(it, read->tensors.end()) << name << " missing from " << path;
    EXPECT_EQ(it->second.dtype, tensor.dtype) << name;
    EXPECT_EQ(it->second.shape, tensor.shape) << name;
    EXPECT_TRUE(it->second.bytes == tensor.bytes) << name << " differs in " << path;
  }
}

// Copies of a model's tensors as they are now.
std::vector<std::pair<std::string, at::Tensor>> CloneTensors(const Model& model) {
  std::vector<std::pair<std::string, at::Tensor>> copies;
  for (const auto& [name, tensor] : model.tensors()) {
    copies.emplace_back(name, tensor.detach().clone());
  }
  return copies;
}

// A model with an optimiser that has taken steps, so both files of a checkpoint hold values that
// a later step changes.
struct Trained {
  std::unique_ptr<Model> model;
  std::unique_ptr<AdamW> optimizer;

  explicit Trained(uint64_t seed) {
    Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), seed);
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    model = std::move(created).value();
    model->SetRequiresGrad(true);
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const at::Tensor& t : model->TrainableParameters()) {
      named.emplace_back(std::to_string(named.size()), t);
    }
    optimizer = std::make_unique<AdamW>(named, AdamWOptions{});
  }

  void Step() {
    optimizer->ZeroGrad();
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (const at::Tensor& t : model->TrainableParameters()) loss = loss + (t * t).sum();
    loss.backward();
    EXPECT_TRUE(optimizer->Step(1e-3).ok());
  }
};

CheckpointState StateAtStep(int64_t step) {
  CheckpointState state;
  state.pretrain.stage = "s1";
  state.pretrain.stage_index = 2;
  state.step = step;
  state.pretrain.data_position = 99;
  state.seed = 5;
  state.model = "tiny";
  return state;
}

TEST(Checkpoint, ReplacesThePreviousOneAndReadsBackEveryTensor) {
  ConfigureRuntime(1);
  const std::string dir = TempDir("checkpoint");
  Trained trained(3);
  trained.Step();
  ASSERT_TRUE(
      WriteCheckpoint(dir + "/ck", *trained.model, trained.optimizer.get(), StateAtStep(17)).ok());
  trained.Step();
  // Replaces the first.
  ASSERT_TRUE(
      WriteCheckpoint(dir + "/ck", *trained.model, trained.optimizer.get(), StateAtStep(18)).ok());
  EXPECT_FALSE(fs::exists(dir + "/ck.tmp"));
  EXPECT_FALSE(fs::exists(dir + "/ck.old"));
  Result<CheckpointState> read = ReadCheckpointState(dir + "/ck");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->step, 18);
  EXPECT_EQ(read->pretrain.data_position, 99);
  EXPECT_EQ(read->pretrain.stage_index, 2);
  Result<std::unique_ptr<Model>> loaded = Model::Load(TinyConfig(), CheckpointModelPath(dir + "/ck"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameWeights(**loaded, CloneTensors(*trained.model));
  Trained restored(4);
  ASSERT_TRUE(restored.optimizer->Load(CheckpointOptimizerPath(dir + "/ck")).ok());
  EXPECT_EQ(restored.optimizer->step(), 2);
  EXPECT_FALSE(ReadCheckpointState(dir + "/missing").ok());
}

// A write killed part-way through a file, as a crash or a full disk would end it, leaves the
// previous checkpoint as it was. The writer runs in a child process whose file-size limit
// (RLIMIT_FSIZE) lies inside the model file or inside the optimiser file of the new checkpoint:
// the kernel kills it with SIGXFSZ at the write that crosses the limit, mid-file.
TEST(Checkpoint, AWriteKilledMidFileLeavesThePreviousOneWhole) {
  ConfigureRuntime(1);  // the child forks from here: no OpenMP region may run in it
  const std::string dir = TempDir("checkpoint_killed");
  const std::string checkpoint = dir + "/ck";
  Trained trained(3);
  trained.Step();
  ASSERT_TRUE(
      WriteCheckpoint(checkpoint, *trained.model, trained.optimizer.get(), StateAtStep(17)).ok());
  const std::vector<std::pair<std::string, at::Tensor>> old_weights = CloneTensors(*trained.model);
  Result<SafetensorsContents> old_model = ReadSafetensors(CheckpointModelPath(checkpoint));
  Result<SafetensorsContents> old_optimizer = ReadSafetensors(CheckpointOptimizerPath(checkpoint));
  ASSERT_TRUE(old_model.ok() && old_optimizer.ok());
  const int64_t model_bytes = fs::file_size(CheckpointModelPath(checkpoint));
  const int64_t optimizer_bytes = fs::file_size(CheckpointOptimizerPath(checkpoint));
  // The optimiser file holds two moments per trainable value, so it is the larger one, and a
  // limit between the two sizes lets the model file complete before the kill.
  ASSERT_GT(optimizer_bytes, model_bytes);
  trained.Step();  // every value of the next checkpoint differs from the one on disk

  for (const int64_t limit : {model_bytes / 2, (model_bytes + optimizer_bytes) / 2}) {
    SCOPED_TRACE("file size limit " + std::to_string(limit));
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const rlimit no_core = {0, 0};
      const rlimit file_size = {static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
      ::setrlimit(RLIMIT_CORE, &no_core);
      ::signal(SIGXFSZ, SIG_DFL);
      ::setrlimit(RLIMIT_FSIZE, &file_size);
      const Status status =
          WriteCheckpoint(checkpoint, *trained.model, trained.optimizer.get(), StateAtStep(18));
      ::_exit(status.ok() ? 0 : 1);  // either way the test fails: the write was not killed
    }
    int wait_status = 0;
    ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(wait_status)) << "the writer exited with wait status " << wait_status;
    EXPECT_EQ(WTERMSIG(wait_status), SIGXFSZ);
    EXPECT_TRUE(fs::exists(checkpoint + ".tmp")) << "the kill came before the new files";

    Result<CheckpointState> state = ReadCheckpointState(checkpoint);
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    EXPECT_EQ(state->step, 17);
    ExpectSameFileContents(CheckpointModelPath(checkpoint), *old_model);
    ExpectSameFileContents(CheckpointOptimizerPath(checkpoint), *old_optimizer);
    Result<std::unique_ptr<Model>> loaded =
        Model::Load(TinyConfig(), CheckpointModelPath(checkpoint));
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ExpectSameWeights(**loaded, old_weights);
  }

  // The next write after the kills replaces the old checkpoint and clears what they left.
  ASSERT_TRUE(
      WriteCheckpoint(checkpoint, *trained.model, trained.optimizer.get(), StateAtStep(18)).ok());
  EXPECT_FALSE(fs::exists(checkpoint + ".tmp"));
  EXPECT_EQ(ReadCheckpointState(checkpoint)->step, 18);
  Result<std::unique_ptr<Model>> loaded =
      Model::Load(TinyConfig(), CheckpointModelPath(checkpoint));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameWeights(**loaded, CloneTensors(*trained.model));
}

// A crash between the swap's two renames leaves only "<dir>.old": readers restore it, and the
// next write must not delete it before its own files are whole.
TEST(Checkpoint, ACrashBetweenTheSwapsRenamesLeavesThePreviousOneReadable) {
  ConfigureRuntime(1);
  const std::string dir = TempDir("checkpoint_swap");
  const std::string checkpoint = dir + "/ck";
  Trained trained(5);
  trained.Step();
  ASSERT_TRUE(
      WriteCheckpoint(checkpoint, *trained.model, trained.optimizer.get(), StateAtStep(7)).ok());
  const std::vector<std::pair<std::string, at::Tensor>> old_weights = CloneTensors(*trained.model);
  // The state right after the first rename.
  ASSERT_TRUE(RenameDurably(checkpoint, checkpoint + ".old").ok());

  Result<CheckpointState> state = ReadCheckpointState(checkpoint);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->step, 7);
  Result<std::unique_ptr<Model>> loaded =
      Model::Load(TinyConfig(), CheckpointModelPath(checkpoint));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSameWeights(**loaded, old_weights);

  ASSERT_TRUE(RenameDurably(checkpoint, checkpoint + ".old").ok());
  trained.Step();
  ASSERT_TRUE(
      WriteCheckpoint(checkpoint, *trained.model, trained.optimizer.get(), StateAtStep(8)).ok());
  EXPECT_EQ(ReadCheckpointState(checkpoint)->step, 8);
  EXPECT_FALSE(fs::exists(checkpoint + ".old"));
}

// Gradients of every trainable tensor after one backward of `options`' loss.
std::vector<at::Tensor> Gradients(Model& model, const TokenBatch& batch,
                                  const LossOptions& options, double* loss) {
  for (at::Tensor& t : model.TrainableParameters()) t.mutable_grad() = at::Tensor();
  Result<LossResult> result = LanguageModelLoss(model, batch, options);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  *loss = result->loss;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& t : model.TrainableParameters()) {
    grads.push_back(t.grad().defined() ? t.grad().clone() : at::zeros_like(t));
  }
  return grads;
}

TEST(ChunkedTraining, EqualsTheTrainingPathInLossAndGradients) {
  ConfigureRuntime(1);
  Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), 11);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  ASSERT_TRUE(model.ConvertTo(at::kDouble).ok());
  model.SetRequiresGrad(true);
  at::Generator generator = at::detail::createCPUGenerator(12);
  at::Tensor tokens = at::randint(0, token::kByteCount, {2, 150}, generator, at::kLong);
  std::vector<std::vector<int32_t>> rows(2);
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 150; ++i) rows[b].push_back(static_cast<int32_t>(tokens[b][i].item<int64_t>()));
  }
  rows[1][40] = token::kPad;  // a masked target inside the second chunk
  Result<TokenBatch> batch = MakeTokenBatch(rows, model.config());
  ASSERT_TRUE(batch.ok());

  LossOptions whole;
  double whole_loss = 0;
  std::vector<at::Tensor> expected = Gradients(model, *batch, whole, &whole_loss);

  LossOptions chunked;
  chunked.path = TrainingPath::kInference;
  chunked.chunk_tokens = 32;  // 150 = 4 x 32 + 22: an uneven last chunk
  double chunked_loss = 0;
  std::vector<at::Tensor> actual = Gradients(model, *batch, chunked, &chunked_loss);
  EXPECT_NEAR(chunked_loss, whole_loss, 1e-10);
  double max_diff = 0, max_grad = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_diff = std::max(max_diff, (expected[i] - actual[i]).abs().max().item<double>());
    max_grad = std::max(max_grad, expected[i].abs().max().item<double>());
  }
  EXPECT_GT(max_grad, 1e-4);
  EXPECT_LT(max_diff, 1e-9 * std::max(1.0, max_grad)) << "max grad " << max_grad;

  // Truncated backpropagation: the same loss, but gradients that stop at chunk boundaries.
  chunked.truncated = true;
  double truncated_loss = 0;
  std::vector<at::Tensor> truncated = Gradients(model, *batch, chunked, &truncated_loss);
  EXPECT_NEAR(truncated_loss, whole_loss, 1e-10);
  double truncated_diff = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    truncated_diff = std::max(truncated_diff, (expected[i] - truncated[i]).abs().max().item<double>());
  }
  EXPECT_GT(truncated_diff, 1e-8);
}

TEST(Checkpoint, ModeNeutralFieldsRoundTripAndFormatOneStillReads) {
  ConfigureRuntime(1);
  const std::string dir = TempDir("checkpoint_format");
  Trained trained(5);
  CheckpointState state;
  state.mode = "rl";
  state.model = "tiny";
  state.seed = 9;
  state.step = 41;
  state.policy_version = 12;
  state.sample_step = 40;
  state.total_tokens = 123456;
  state.sampler_cursor = "table=rl;key=77";
  state.rng_state = std::string("\x00\x01\x7f\x80\xff", 5);
  ASSERT_TRUE(WriteCheckpoint(dir + "/rl", *trained.model, nullptr, state).ok());
  Result<CheckpointState> read = ReadCheckpointState(dir + "/rl");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->mode, "rl");
  EXPECT_EQ(read->seed, 9u);
  EXPECT_EQ(read->step, 41);
  EXPECT_EQ(read->policy_version, 12u);
  EXPECT_EQ(read->sample_step, 40);
  EXPECT_EQ(read->total_tokens, 123456);
  EXPECT_EQ(read->sampler_cursor, "table=rl;key=77");
  EXPECT_EQ(read->rng_state, state.rng_state);
  EXPECT_FALSE(fs::exists(CheckpointOptimizerPath(dir + "/rl")));

  // A state.json as format 1 wrote it (pretraining's fields at the top level).
  ASSERT_TRUE(WriteCheckpoint(dir + "/old", *trained.model, trained.optimizer.get(),
                              StateAtStep(17)).ok());
  std::ofstream(dir + "/old/state.json")
      << R"({"data_position": 99, "format": 1, "model": "tiny", "seed": 5, "stage": "s1",)"
      << R"( "stage_complete": true, "stage_index": 2, "stage_tokens": 512, "step": 17,)"
      << R"( "total_tokens": 2048})" << "\n";
  Result<CheckpointState> old = ReadCheckpointState(dir + "/old");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->mode, "pretrain");
  EXPECT_EQ(old->model, "tiny");
  EXPECT_EQ(old->step, 17);
  EXPECT_EQ(old->total_tokens, 2048);
  EXPECT_EQ(old->pretrain.stage, "s1");
  EXPECT_EQ(old->pretrain.stage_index, 2);
  EXPECT_TRUE(old->pretrain.stage_complete);
  EXPECT_EQ(old->pretrain.stage_tokens, 512);
  EXPECT_EQ(old->pretrain.data_position, 99);
  EXPECT_TRUE(old->rng_state.empty());

  std::ofstream(dir + "/old/state.json") << R"({"format": 3, "model": "tiny"})" << "\n";
  EXPECT_FALSE(ReadCheckpointState(dir + "/old").ok());
}

TEST(LearningRateSchedule, WarmsUpLinearlyThenDecaysToTheFloor) {
  LearningRateSchedule schedule;
  schedule.peak = 0.01;
  schedule.warmup_steps = 4;
  schedule.total_steps = 14;
  schedule.min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(schedule.At(0), 0.0025);
  EXPECT_DOUBLE_EQ(schedule.At(3), 0.01);
  EXPECT_DOUBLE_EQ(schedule.At(4), 0.01);
  EXPECT_NEAR(schedule.At(9), 0.01 * (0.1 + 0.9 * 0.5), 1e-15);  // half way: cos = 0
  EXPECT_NEAR(schedule.At(14), 0.001, 1e-15);
  EXPECT_NEAR(schedule.At(100), 0.001, 1e-15);
}

// `count` steps of next-token training on fixed tokens, from step `first`.
void TrainSteps(Trainer& trainer, const LearningRateSchedule& schedule, const TokenBatch& batch,
                int64_t first, int64_t count) {
  LossOptions options;
  for (int64_t step = first; step < first + count; ++step) {
    trainer.ZeroGrad();
    ASSERT_TRUE(LanguageModelLoss(trainer.model(), batch, options).ok());
    Result<TrainerStep> done = trainer.Step(step);
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    EXPECT_TRUE(done->applied);
    EXPECT_DOUBLE_EQ(done->learning_rate, schedule.At(step));
  }
}

TEST(Trainer, ResumedFromItsCheckpointContinuesExactlyAsAnUninterruptedRun) {
  ConfigureRuntime(1);
  const std::string dir = TempDir("trainer_resume");
  TrainerOptions options;
  options.seed = 21;
  options.schedule.peak = 3e-3;
  options.schedule.warmup_steps = 2;
  options.schedule.total_steps = 6;
  options.router_learning_rate_scale = 0.5;
  std::vector<std::vector<int32_t>> rows(2);
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 48; ++i) rows[b].push_back((b * 37 + i * 11) % token::kByteCount);
  }
  Result<TokenBatch> batch = MakeTokenBatch(rows, TinyConfig());
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();

  Result<std::unique_ptr<Trainer>> straight = Trainer::Create(TinyConfig(), options);
  ASSERT_TRUE(straight.ok()) << straight.status().ToString();
  TrainSteps(**straight, options.schedule, *batch, 0, 3);
  at::randn({4}, (*straight)->generator());  // the mode's draws before the checkpoint
  CheckpointState state;
  state.mode = "rl";
  state.step = 3;
  state.policy_version = 3;
  ASSERT_TRUE((*straight)->WriteCheckpoint(dir + "/ck", state).ok());
  TrainSteps(**straight, options.schedule, *batch, 3, 3);
  const at::Tensor expected_draw = at::randn({8}, (*straight)->generator());

  Result<std::unique_ptr<Trainer>> resumed = Trainer::Create(TinyConfig(), options, dir + "/ck");
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ((*resumed)->optimizer().step(), 3);
  TrainSteps(**resumed, options.schedule, *batch, 3, 3);
  EXPECT_TRUE(at::equal(at::randn({8}, (*resumed)->generator()), expected_draw));
  ExpectSameWeights((*resumed)->model(), CloneTensors((*straight)->model()));

  // Another model's checkpoint is refused by name.
  ModelConfig other = TinyConfig();
  other.name = "not-tiny";
  EXPECT_TRUE(Trainer::Create(other, options, dir + "/ck").status().IsInvalidArgument());
}

// Tokens (2, length) of bytes, deterministic in `seed`.
at::Tensor RandomTokens(int64_t length, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return at::randint(0, token::kByteCount, {2, length}, generator, at::kLong);
}

// Logits of every chunk of a pass, joined along T.
Result<at::Tensor> PassLogits(const Model& model, const at::Tensor& tokens,
                              const ChunkedPassOptions& options, ChunkedPassResult* result) {
  std::vector<at::Tensor> logits;
  auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
    logits.push_back(chunk.logits.detach());
    return at::Tensor();
  };
  ModelInput input;
  input.tokens = tokens;
  STRIDER_ASSIGN_OR_RETURN(*result, RunChunkedPass(model, input, options, objective));
  return at::cat(logits, 1);
}

TEST(ChunkedPass, ContinuesFromAnInitialStateAsOnePassWould) {
  ConfigureRuntime(1);
  Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), 31);
  ASSERT_TRUE(created.ok());
  const Model& model = **created;
  const at::Tensor tokens = RandomTokens(96, 32);
  ChunkedPassOptions options;
  options.backward = false;
  options.chunk_tokens = 32;
  ChunkedPassResult whole_result;
  Result<at::Tensor> whole = PassLogits(model, tokens, options, &whole_result);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ASSERT_EQ(whole->size(1), 96);

  options.keep_final_state = true;
  ChunkedPassResult prefix;
  ASSERT_TRUE(PassLogits(model, tokens.narrow(1, 0, 64), options, &prefix).ok());
  EXPECT_EQ(prefix.final_state.length(), 64);
  options.initial_state = &prefix.final_state;
  ChunkedPassResult rest;
  Result<at::Tensor> tail = PassLogits(model, tokens.narrow(1, 64, 32), options, &rest);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_EQ(prefix.final_state.length(), 64);  // the caller's state is left as it was
  EXPECT_EQ(rest.final_state.length(), 96);
  EXPECT_LT((*tail - whole->narrow(1, 64, 32)).abs().max().item<double>(), 1e-6);

  // The training path has no state to start from.
  options.path = TrainingPath::kTraining;
  EXPECT_FALSE(PassLogits(model, tokens, options, &rest).ok());
}

// Truncation cuts the graph after every chunk, those whose objective returns no loss (context
// before an RL trajectory's first action) included: the gradients of a loss in the last chunk
// are those of a pass over that chunk alone from the earlier chunks' state, taken as a constant.
TEST(ChunkedPass, TruncationCutsAfterChunksWithoutALoss) {
  ConfigureRuntime(1);
  Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), 41);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  ASSERT_TRUE(model.ConvertTo(at::kDouble).ok());
  model.SetRequiresGrad(true);
  const at::Tensor tokens = RandomTokens(96, 42);
  auto last_chunk_gradients = [&](const ModelInput& input, const ChunkedPassOptions& options,
                                  int64_t loss_from) {
    for (const at::Tensor& p : model.TrainableParameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
      if (chunk.begin < loss_from) return at::Tensor();
      return chunk.logits.pow(2).mean();
    };
    Result<ChunkedPassResult> pass = RunChunkedPass(model, input, options, objective);
    EXPECT_TRUE(pass.ok()) << pass.status().ToString();
    std::vector<at::Tensor> gradients;
    for (const at::Tensor& p : model.TrainableParameters()) {
      gradients.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    }
    return gradients;
  };
  auto max_difference = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    double most = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      most = std::max(most, (a[i] - b[i]).abs().max().item<double>());
    }
    return most;
  };
  ChunkedPassOptions options;
  options.chunk_tokens = 32;
  options.truncated = true;
  ModelInput whole;
  whole.tokens = tokens;
  const std::vector<at::Tensor> truncated = last_chunk_gradients(whole, options, 64);

  // The last chunk alone, from the state after the first 64 tokens.
  ChunkedPassOptions prefix_options;
  prefix_options.backward = false;
  prefix_options.chunk_tokens = 32;
  prefix_options.keep_final_state = true;
  ChunkedPassResult prefix;
  ASSERT_TRUE(PassLogits(model, tokens.narrow(1, 0, 64), prefix_options, &prefix).ok());
  ChunkedPassOptions tail_options = options;
  tail_options.initial_state = &prefix.final_state;
  ModelInput tail;
  tail.tokens = tokens.narrow(1, 64, 32);
  const std::vector<at::Tensor> alone = last_chunk_gradients(tail, tail_options, 0);
  EXPECT_LT(max_difference(truncated, alone), 1e-12);

  // Declared loss-free, the context chunks run without a graph: the same gradients.
  ChunkedPassOptions declared = options;
  int64_t recorded_chunks = 0;
  declared.chunk_has_loss = [&](int64_t begin, int64_t) {
    recorded_chunks += begin >= 64 ? 1 : 0;
    return begin >= 64;
  };
  const std::vector<at::Tensor> skipped = last_chunk_gradients(whole, declared, 64);
  EXPECT_EQ(recorded_chunks, 1);
  EXPECT_LT(max_difference(truncated, skipped), 1e-12);
  // A chunk declared loss-free whose objective returns a loss is an error, not a lost gradient.
  declared.chunk_has_loss = [](int64_t, int64_t) { return false; };
  auto lying = [&](const ChunkView& chunk) -> Result<at::Tensor> {
    return chunk.logits.pow(2).mean();
  };
  Result<ChunkedPassResult> refused = RunChunkedPass(model, whole, declared, lying);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("declared loss-free"), std::string::npos)
      << refused.status().ToString();

  // Full backpropagation reaches the earlier chunks through the state, so the two differ there.
  options.truncated = false;
  const std::vector<at::Tensor> full = last_chunk_gradients(whole, options, 64);
  EXPECT_GT(max_difference(full, alone), 1e-8);
}

// A chunk that records after chunks that did not starts from an empty tensor-pool cache (the
// earlier chunks' sizes are given back, not lent to the graph at up to twice a request), and
// the pass reports the largest recording chunk's live tensors: one chunk's activations.
TEST(ChunkedPass, ARecordingChunkAfterContextStartsFromAnEmptyPoolCacheAndIsMeasured) {
  ConfigureRuntime(1);  // installs the tensor pool
  Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), 43);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  model.SetRequiresGrad(true);
  ModelInput input;
  input.tokens = RandomTokens(2048, 44);  // two rows: a chunk's tensors are pool-sized
  auto objective = [](const ChunkView& chunk) -> Result<at::Tensor> {
    if (chunk.begin < 1024) return at::Tensor();
    return chunk.logits.pow(2).mean();
  };
  ChunkedPassOptions options;
  options.chunk_tokens = 1024;
  options.truncated = true;
  options.chunk_has_loss = [](int64_t begin, int64_t) { return begin >= 1024; };
  const TensorPoolStats before = GetTensorPoolStats();
  Result<ChunkedPassResult> pass = RunChunkedPass(model, input, options, objective);
  ASSERT_TRUE(pass.ok()) << pass.status().ToString();
  const TensorPoolStats after = GetTensorPoolStats();
  EXPECT_GT(after.unmapped_bytes, before.unmapped_bytes)
      << "the context chunk's cached buffers go back before the recording chunk";
  // Two rows of 1,024 tokens of a 64-wide model with a 288-token vocabulary: each (2, 1024, 64)
  // float tensor is 512 KiB, the logits 2.25 MiB; the graph holds dozens of them.
  EXPECT_GT(pass->chunk_activation_bytes, int64_t{8} << 20);
  EXPECT_LT(pass->chunk_activation_bytes, int64_t{1} << 30);

  // Nothing recorded, nothing measured.
  options.backward = false;
  options.chunk_has_loss = nullptr;
  Result<ChunkedPassResult> scoring =
      RunChunkedPass(model, input, options, [](const ChunkView&) -> Result<at::Tensor> {
        return at::Tensor();
      });
  ASSERT_TRUE(scoring.ok()) << scoring.status().ToString();
  EXPECT_EQ(scoring->chunk_activation_bytes, 0);
}

TEST(ChunkedPass, RoutingReplayForcesTheRecordedExpertsInEveryChunk) {
  ConfigureRuntime(1);
  Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), 41);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  const at::Tensor tokens = RandomTokens(80, 42);
  ChunkedPassOptions options;
  options.backward = false;
  options.chunk_tokens = 24;  // 80 = 3 x 24 + 8
  options.record_routing = true;
  ChunkedPassResult recorded;
  Result<at::Tensor> before = PassLogits(model, tokens, options, &recorded);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_FALSE(recorded.routing.layers.empty());
  EXPECT_EQ(recorded.routing.layers[0].experts.size(1), 80);

  // Large random router biases move the choices; the replay puts them back.
  for (auto& [name, tensor] : model.tensors()) {
    if (name.find("router_bias") == std::string::npos) continue;
    at::NoGradGuard no_grad;
    tensor.copy_(at::randn(tensor.sizes(), tensor.options()) * 10);
  }
  options.record_routing = false;
  ChunkedPassResult free_result;
  Result<at::Tensor> moved = PassLogits(model, tokens, options, &free_result);
  ASSERT_TRUE(moved.ok());
  EXPECT_GT((*moved - *before).abs().max().item<double>(), 1e-3);
  options.replay_routing = &recorded.routing;
  ChunkedPassResult replay_result;
  Result<at::Tensor> replayed = PassLogits(model, tokens, options, &replay_result);
  ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
  EXPECT_LT((*replayed - *before).abs().max().item<double>(), 1e-5);

  // A record that does not cover every position is refused.
  RoutingRecord short_record = recorded.routing;
  for (auto& layer : short_record.layers) layer.experts = layer.experts.narrow(1, 0, 40);
  options.replay_routing = &short_record;
  EXPECT_FALSE(PassLogits(model, tokens, options, &replay_result).ok());
}

TEST(ChunkedPass, ValuesAndHiddenStatesAreTheModelsAndTheObjectiveGetsGradients) {
  ConfigureRuntime(1);
  Result<std::unique_ptr<Model>> created = Model::Create(TinyConfig(), 51);
  ASSERT_TRUE(created.ok());
  Model& model = **created;
  model.SetRequiresGrad(true);
  const at::Tensor tokens = RandomTokens(40, 52);
  ModelInput input;
  input.tokens = tokens;
  ForwardOptions forward;
  forward.compute_values = true;
  Result<ForwardOutput> reference = model.Forward(input, forward);
  ASSERT_TRUE(reference.ok());

  ChunkedPassOptions options;
  options.chunk_tokens = 16;
  options.values = true;
  options.hidden = true;
  std::vector<at::Tensor> values;
  std::vector<int64_t> begins;
  // A value-style objective: the gradient reaches the value head only through the values.
  auto objective = [&](const ChunkView& chunk) -> Result<at::Tensor> {
    begins.push_back(chunk.begin);
    EXPECT_EQ(chunk.hidden.size(1), chunk.count);
    EXPECT_EQ(chunk.hidden.size(2), model.config().width);
    values.push_back(chunk.values.detach());
    return (chunk.values * chunk.values).sum();
  };
  for (at::Tensor& t : model.TrainableParameters()) t.mutable_grad() = at::Tensor();
  Result<ChunkedPassResult> pass = RunChunkedPass(model, input, options, objective);
  ASSERT_TRUE(pass.ok()) << pass.status().ToString();
  EXPECT_EQ(begins, (std::vector<int64_t>{0, 16, 32}));
  EXPECT_LT((at::cat(values, 1) - reference->values.detach()).abs().max().item<double>(), 1e-5);
  bool value_head_grad = false;
  for (const auto& [name, tensor] : model.tensors()) {
    if (name.rfind("value_head.", 0) == 0 && tensor.grad().defined()) {
      value_head_grad = value_head_grad || tensor.grad().abs().sum().item<double>() > 0;
    }
  }
  EXPECT_TRUE(value_head_grad);

  // An objective's error ends the pass and comes back.
  auto failing = [](const ChunkView&) -> Result<at::Tensor> {
    return Status::InvalidArgument("objective refused the chunk");
  };
  Result<ChunkedPassResult> failed = RunChunkedPass(model, input, options, failing);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("objective refused"), std::string::npos);
}

std::string WriteRunConfig(const std::string& dir, int64_t checkpoint_every) {
  std::ostringstream yaml;
  yaml << "mode: pretrain\n"
       << "model_config: " << SourceDir() << "/configs/model/tiny.yaml\n"
       << "seed: 3\nthreads: 1\n"
       << "optimizer: {learning_rate: 0.003, warmup_steps: 2}\n"
       << "balance: {enabled: true, warmup_steps: 1}\n"
       << "evaluation: {documents: 2, batch: 2, chunk_tokens: 64}\n"
       << "checkpoint: {every_steps: " << checkpoint_every << "}\n"
       << "stages:\n"
       << "  - {name: a, context: 64, tokens: 1024, batch_tokens: 256, objective: modality_alignment}\n"
       << "  - {name: b, context: 128, tokens: 1024, batch_tokens: 256,"
       << " objective: long_context_adaptation, paths: inference, chunk_tokens: 32}\n";
  const std::string path = dir + "/run.yaml";
  std::ofstream(path) << yaml.str();
  return path;
}

bool SameWeights(const std::string& a, const std::string& b, double tolerance) {
  Result<SafetensorsContents> x = ReadSafetensors(CheckpointModelPath(a));
  Result<SafetensorsContents> y = ReadSafetensors(CheckpointModelPath(b));
  if (!x.ok() || !y.ok() || x->tensors.size() != y->tensors.size()) return false;
  for (const auto& [name, tensor] : x->tensors) {
    const auto& other = y->tensors.at(name).bytes;
    const float* p = reinterpret_cast<const float*>(tensor.bytes.data());
    const float* q = reinterpret_cast<const float*>(other.data());
    for (size_t i = 0; i < tensor.bytes.size() / 4; ++i) {
      if (std::abs(p[i] - q[i]) > tolerance) return false;
    }
  }
  return true;
}

TEST(Pretrain, ConfigErrorsNameTheKey) {
  const std::string dir = TempDir("config");
  std::ofstream(dir + "/bad.yaml") << "model_config: " << SourceDir()
                                   << "/configs/model/tiny.yaml\nstages:\n  - {name: a, context: 64,"
                                      " tokens: 10, objective: modality_alignment, colour: red}\n";
  Result<PretrainConfig> config = LoadPretrainConfig(dir + "/bad.yaml");
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("colour"), std::string::npos)
      << config.status().message();
  // Retrieval and balance options name the key they reject.
  const std::string head = "model_config: " + SourceDir() + "/configs/model/tiny.yaml\n";
  const std::string stage =
      "stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment}\n";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"retrieval: {key_letters: 3}\n" + stage, "key_letters"},
      {"retrieval: {key_letters: 1, facts: 27}\n" + stage, "facts"},
      {"retrieval: {answer_weight: 0}\n" + stage, "answer_weight"},
      {"tool_use: {flawed_fraction: 1.5}\n" + stage, "flawed_fraction"},
      {"tool_use: {flaws: [no_tool, typo]}\n" + stage, "typo"},
      {"tool_use: {flaws: []}\n" + stage, "flaws"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: retrieval, flawed_fraction: 0.5}]}\n",
       "flawed_fraction"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: tool_use, flawed_fraction: -0.5}]}\n",
       "flawed_fraction"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " action_weight: 0}\n",
       "action_weight"},
      {"balance: {window_steps: 0}\n" + stage, "window_steps"},
      {"balance: {prepass_sweeps: 0}\n" + stage, "prepass_sweeps"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: tool_use, min_tokens: 8}]}\n",
       "min_tokens"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: retrieval, max_tokens: 65}]}\n",
       "max_tokens"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: retrieval, env: {name: calculator}}]}\n",
       "env"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: tool_use, env: {name: abacus}}]}\n",
       "abacus"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: tool_use, env: {name: retrieval, options: {parts: 0}}}]}\n",
       "parts"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " data: [{generator: tool_use, env: {name: vision_count}}]}\n",
       "images"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " curriculum: [{context: 128, tokens: 10, data: [{generator: retrieval}]}]}\n",
       "context"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " curriculum: [{context: 32, tokens: 10}]}\n",
       "data"},
      {"stages:\n  - {name: a, context: 64, tokens: 10, objective: modality_alignment,"
       " curriculum: [{context: 32, tokens: 10, data: [{generator: retrieval, max_tokens: 40}]}]}\n",
       "max_tokens"}};
  for (const auto& [text, key] : bad) {
    std::ofstream(dir + "/bad2.yaml") << head << text;
    Result<PretrainConfig> rejected = LoadPretrainConfig(dir + "/bad2.yaml");
    ASSERT_FALSE(rejected.ok()) << text;
    EXPECT_NE(rejected.status().message().find(key), std::string::npos)
        << rejected.status().message();
  }
  std::ofstream(dir + "/rl.yaml") << "mode: rl\n";
  Result<std::string> mode = ReadLearnerMode(dir + "/rl.yaml");
  ASSERT_TRUE(mode.ok());
  EXPECT_EQ(*mode, "rl");
  for (const char* name : {"tiny", "small", "reference"}) {
    Result<PretrainConfig> shipped =
        LoadPretrainConfig(SourceDir() + "/configs/pretrain/" + name + ".yaml");
    EXPECT_TRUE(shipped.ok()) << name << ": " << shipped.status().ToString();
    if (shipped.ok()) EXPECT_EQ(shipped->stages.size(), 4u);
  }
  // A stage's action_weight replaces tool_use.action_weight for that stage only.
  Result<PretrainConfig> retrieval =
      LoadPretrainConfig(SourceDir() + "/configs/pretrain/retrieval.yaml");
  ASSERT_TRUE(retrieval.ok()) << retrieval.status().ToString();
  EXPECT_EQ(retrieval->tool_use_action_weight, 4.0);
  EXPECT_LT(retrieval->stages.front().action_weight, 0.0);
  EXPECT_EQ(retrieval->stages.back().action_weight, 20.0);
}

TEST(Pretrain, NextStageStartsFromThePreviousStagesCheckpoint) {
  const std::string dir = TempDir("stages");
  Result<PretrainConfig> config = LoadPretrainConfig(WriteRunConfig(dir, 0));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  PretrainOptions options;
  options.run_dir = dir + "/run";
  options.stages = 1;
  options.bar = 0;
  Result<std::vector<StageSummary>> first = RunPretraining(*config, options);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].steps, 4);  // 1024 tokens in batches of 4 x 64
  // Stage b with no steps: its final checkpoint must be exactly what it loaded.
  options.resume = options.run_dir + "/checkpoints/a/final";
  options.stages = 2;
  options.max_steps_per_stage = 0;
  Result<std::vector<StageSummary>> second = RunPretraining(*config, options);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].stage, "b");
  EXPECT_TRUE(SameWeights(options.run_dir + "/checkpoints/a/final",
                          options.run_dir + "/checkpoints/b/final", 0.0));
  // eval.jsonl: stage a at 64, stage b at 64 and 128.
  std::ifstream eval(options.run_dir + "/eval.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(eval, line)) {
    ++lines;
    EXPECT_NE(line.find("\"retrieval_accuracy\""), std::string::npos);
    for (const char* key : {"\"correct\"", "\"ci_low\"", "\"ci_high\""}) {
      EXPECT_NE(line.find(key), std::string::npos) << key << " missing: " << line;
    }
  }
  EXPECT_EQ(lines, 3);
}

TEST(Pretrain, ResumeMidStageContinuesTheSameDataOrder) {
  const std::string dir = TempDir("resume");
  Result<PretrainConfig> config = LoadPretrainConfig(WriteRunConfig(dir, 2));
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  PretrainOptions options;
  options.run_dir = dir + "/whole";
  options.stages = 1;
  options.bar = 0;
  options.evaluate = false;
  ASSERT_TRUE(RunPretraining(*config, options).ok());
  Result<CheckpointState> latest = ReadCheckpointState(options.run_dir + "/checkpoints/a/latest");
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 2);
  EXPECT_EQ(latest->pretrain.data_position, 8);  // two steps of four sequences
  EXPECT_FALSE(latest->pretrain.stage_complete);

  PretrainOptions resumed = options;
  resumed.run_dir = dir + "/resumed";
  resumed.resume = options.run_dir + "/checkpoints/a/latest";
  Result<std::vector<StageSummary>> rest = RunPretraining(*config, resumed);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ((*rest)[0].steps, 2);
  EXPECT_TRUE(SameWeights(options.run_dir + "/checkpoints/a/final",
                          resumed.run_dir + "/checkpoints/a/final", 1e-6));
}

// A stage with a curriculum phase: 5 steps of 8 x 32 tokens, then 2 of 4 x 64.
std::string WriteCurriculumConfig(const std::string& dir, int64_t checkpoint_every) {
  std::ostringstream yaml;
  yaml << "mode: pretrain\n"
       << "model_config: " << SourceDir() << "/configs/model/tiny.yaml\n"
       << "seed: 5\nthreads: 1\n"
       << "optimizer: {learning_rate: 0.003, warmup_steps: 2}\n"
       << "checkpoint: {every_steps: " << checkpoint_every << "}\n"
       << "stages:\n"
       << "  - name: a\n    context: 64\n    tokens: 512\n    batch_tokens: 256\n"
       << "    objective: modality_alignment\n"
       << "    curriculum:\n"
       << "      - context: 32\n        tokens: 1280\n"
       << "        data: [{generator: retrieval, min_tokens: 20, max_tokens: 32, facts: 1}]\n";
  const std::string path = dir + "/run" + std::to_string(checkpoint_every) + ".yaml";
  std::ofstream(path) << yaml.str();
  return path;
}

TEST(Pretrain, CurriculumPhasesRunFirstAndResumeInsideAndAcrossThem) {
  const std::string dir = TempDir("curriculum");
  std::string reference;
  // A checkpoint inside the phase, at the boundary (the stage's own context not started) and
  // after it; each resumed run must end with the weights of the uninterrupted one.
  for (const auto& [every, position] :
       std::vector<std::pair<int64_t, int64_t>>{{4, 32}, {5, 0}, {6, 4}}) {
    Result<PretrainConfig> config = LoadPretrainConfig(WriteCurriculumConfig(dir, every));
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    ASSERT_EQ(config->stages[0].curriculum.size(), 1u);
    PretrainOptions options;
    options.run_dir = dir + "/whole" + std::to_string(every);
    options.bar = 0;
    options.evaluate = false;
    Result<std::vector<StageSummary>> whole = RunPretraining(*config, options);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ((*whole)[0].steps, 7);
    EXPECT_EQ((*whole)[0].tokens, 1280 + 512);
    EXPECT_TRUE(std::filesystem::exists(options.run_dir + "/data/a/phase0-0-retrieval/COMPLETE"));
    const std::string final_checkpoint = options.run_dir + "/checkpoints/a/final";
    if (reference.empty()) reference = final_checkpoint;
    EXPECT_TRUE(SameWeights(reference, final_checkpoint, 1e-6)) << every;

    Result<CheckpointState> latest =
        ReadCheckpointState(options.run_dir + "/checkpoints/a/latest");
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(latest->step, every);
    EXPECT_EQ(latest->pretrain.data_position, position) << every;
    PretrainOptions resumed = options;
    resumed.run_dir = dir + "/resumed" + std::to_string(every);
    resumed.resume = options.run_dir + "/checkpoints/a/latest";
    Result<std::vector<StageSummary>> rest = RunPretraining(*config, resumed);
    ASSERT_TRUE(rest.ok()) << rest.status().ToString();
    EXPECT_EQ((*rest)[0].steps, 7 - every);
    EXPECT_TRUE(SameWeights(reference, resumed.run_dir + "/checkpoints/a/final", 1e-6)) << every;
  }
  // A capped smoke run still reaches the stage's own context: the cap is shared.
  Result<PretrainConfig> config = LoadPretrainConfig(WriteCurriculumConfig(dir, 0));
  ASSERT_TRUE(config.ok());
  PretrainOptions capped;
  capped.run_dir = dir + "/capped";
  capped.bar = 0;
  capped.evaluate = false;
  capped.max_steps_per_stage = 2;
  Result<std::vector<StageSummary>> two = RunPretraining(*config, capped);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ((*two)[0].steps, 2);
  EXPECT_EQ((*two)[0].tokens, 256 + 256);
}

}  // namespace
}  // namespace strider
