// The rollout engine against the model's training path, determinism across batch compositions,
// budget and refusal, fork, snapshot, weight swap and request errors.
#include "rollout_engine/engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "common/model/config.h"
#include "common/model/model.h"
#include "common/tokenizer.h"
#include "rollout_engine/engine_testing.h"
#include "rollout_engine/snapshot.h"
#include "tests/shipped_config.h"

namespace strider::rollout {
namespace {

ModelConfig TinyConfig() { return testing::ShippedModelConfig("tiny"); }

std::shared_ptr<const Model> TinyModel(uint64_t seed) {
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model = Model::Create(TinyConfig(), seed);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return std::shared_ptr<const Model>(std::move(model).value());
}

std::unique_ptr<Engine> MakeEngine(std::shared_ptr<const Model> model, EngineOptions options = {}) {
  options.threads = 2;
  Result<std::unique_ptr<Engine>> engine = Engine::Create(options, std::move(model), 1);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return std::move(engine).value();
}

std::vector<int64_t> Tokens(int64_t count, uint64_t seed) {
  std::vector<int64_t> tokens;
  uint64_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < count; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    tokens.push_back(static_cast<int64_t>((x >> 33) % token::kByteCount));
  }
  return tokens;
}

SamplingParams Turn(int64_t max_new, uint64_t seed) {
  SamplingParams params;
  params.max_new_tokens = max_new;
  params.seed = seed;
  return params;
}

// What the test knows about a sequence: every token, the engine's log-prob of each sampled
// token by position, and the routing of every token.
struct History {
  std::vector<int64_t> tokens;
  std::map<int64_t, double> log_probs;
  std::vector<CompactRouting> routing;
};

// Applies a step's results to the histories (pending tokens were added at submit/append time).
void Record(const StepResult& result, std::map<SequenceId, History>* histories) {
  for (const SequenceStep& step : result.sequences) {
    History& history = (*histories)[step.id];
    if (step.routing.tokens > 0) history.routing.push_back(step.routing);
    if (step.sampled) {
      EXPECT_EQ(step.position, static_cast<int64_t>(history.tokens.size()));
      history.tokens.push_back(step.token);
      history.log_probs[step.position] = step.model_log_prob;
    }
  }
}

void RunUntilIdle(Engine* engine, std::map<SequenceId, History>* histories) {
  for (int i = 0; i < 1000; ++i) {
    Result<StepResult> result = engine->Step();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    Record(*result, histories);
    if (result->prefill_tokens == 0 && result->decode_tokens == 0) return;
  }
  FAIL() << "sequences never finished";
}

// Checks a history against Model::Forward: log-probs with the engine's routing replayed, and
// how often the training path routes the same way on its own.
void ExpectEqualsTrainingPath(const Model& model, const History& history, int64_t* agree,
                              int64_t* decisions, const std::vector<at::Tensor>& images = {}) {
  const int64_t length = static_cast<int64_t>(history.tokens.size());
  Result<CompactRouting> routing = CompactRouting::Concatenate(history.routing);
  ASSERT_TRUE(routing.ok()) << routing.status().ToString();
  ASSERT_EQ(routing->first_position, 0);
  ASSERT_EQ(routing->tokens, length);
  RoutingRecord replay = routing->ToRoutingRecord();
  at::Tensor tokens = at::tensor(history.tokens, at::kLong).view({1, length});
  at::NoGradGuard no_grad;
  ModelInput input{tokens, {}};
  for (const at::Tensor& pixels : images) input.images.push_back({0, pixels});
  ForwardOptions options;
  options.replay_routing = &replay;
  Result<ForwardOutput> replayed = model.Forward(input, options);
  ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
  at::Tensor log_probs = NextTokenLogProbs(replayed->logits, tokens)[0];
  ASSERT_FALSE(history.log_probs.empty());
  for (const auto& [position, log_prob] : history.log_probs) {
    EXPECT_NEAR(log_probs[position - 1].item<double>(), log_prob, 1e-5) << "position " << position;
  }
  ForwardOptions record;
  record.record_routing = true;
  Result<ForwardOutput> alone = model.Forward(input, record);
  ASSERT_TRUE(alone.ok());
  for (size_t layer = 0; layer < alone->routing.layers.size(); ++layer) {
    at::Tensor a = std::get<0>(alone->routing.layers[layer].experts.sort(-1));
    at::Tensor b = std::get<0>(replay.layers[layer].experts.sort(-1));
    at::Tensor same = (a == b).all(-1);
    *agree += same.sum().item<int64_t>();
    *decisions += same.numel();
  }
}

TEST(Engine, EqualsTrainingPathForMixedLengthsAppendsForksAndRestoredSnapshots) {
  std::shared_ptr<const Model> model = TinyModel(11);
  EngineOptions options;
  options.block_tokens = 16;
  options.prefill_chunk_tokens = 50;  // appended turns span several calls and blocks
  std::unique_ptr<Engine> engine = MakeEngine(model, options);
  std::map<SequenceId, History> histories;
  std::vector<SequenceId> ids;
  const std::vector<int64_t> prompt_lengths = {5, 37, 120, 37};
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    Request request;
    request.tokens = Tokens(prompt_lengths[i], i);
    request.sampling = Turn(8 + 3 * static_cast<int64_t>(i), 100 + i);
    Result<SequenceId> id = engine->Submit(request);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    histories[*id].tokens = request.tokens;
    ids.push_back(*id);
  }
  RunUntilIdle(engine.get(), &histories);

  // A tool result appended to one sequence, a short observation to another, then new turns.
  for (auto [index, length] : {std::pair<int, int64_t>{0, 130}, {2, 3}}) {
    Request append;
    append.tokens = Tokens(length, 50 + index);
    append.sampling = Turn(6, 7 + index);
    ASSERT_TRUE(engine->Append(ids[index], append).ok());
    History& history = histories[ids[index]];
    history.tokens.insert(history.tokens.end(), append.tokens.begin(), append.tokens.end());
  }
  // A group of three continuations of sequence 1.
  Result<std::vector<SequenceId>> forks = engine->Fork(ids[1], 3, Turn(9, 77));
  ASSERT_TRUE(forks.ok()) << forks.status().ToString();
  for (SequenceId child : *forks) histories[child] = histories[ids[1]];
  RunUntilIdle(engine.get(), &histories);

  // A snapshot restored into a second engine continues there, with a further appended turn.
  Result<std::string> snapshot = engine->Snapshot((*forks)[1]);
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().ToString();
  std::unique_ptr<Engine> other = MakeEngine(model, options);
  Result<SequenceId> restored = other->Restore(*snapshot);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(*other->StateDigest(*restored), *engine->StateDigest((*forks)[1]));
  std::map<SequenceId, History> other_histories;
  other_histories[*restored] = histories[(*forks)[1]];
  Request more;
  more.tokens = Tokens(21, 99);
  more.sampling = Turn(5, 3);
  ASSERT_TRUE(other->Append(*restored, more).ok());
  History& restored_history = other_histories[*restored];
  restored_history.tokens.insert(restored_history.tokens.end(), more.tokens.begin(),
                                 more.tokens.end());
  RunUntilIdle(other.get(), &other_histories);

  int64_t agree = 0, decisions = 0;
  for (const auto& [id, history] : histories) {
    SCOPED_TRACE("sequence " + std::to_string(id));
    ExpectEqualsTrainingPath(*model, history, &agree, &decisions);
  }
  ExpectEqualsTrainingPath(*model, restored_history, &agree, &decisions);
  EXPECT_GT(decisions, 1000);
  // Identical expert choices except at exact near-ties (docs/model_math.md#whole-model-invariants).
  EXPECT_GE(static_cast<double>(agree) / static_cast<double>(decisions), 0.999)
      << agree << " of " << decisions;
}

std::vector<int64_t> SampledTokens(const History& history, int64_t prompt) {
  return std::vector<int64_t>(history.tokens.begin() + prompt, history.tokens.end());
}

// Image-start, one placeholder per 4 x 4 patch of the tiny config, image-end.
std::vector<int64_t> ImageRun(int64_t patches) {
  std::vector<int64_t> run = {token::kImageStart};
  for (int64_t i = 0; i < patches; ++i) run.push_back(token::kImagePatch);
  run.push_back(token::kImageEnd);
  return run;
}

TEST(Engine, ImageTurnsEqualTheTrainingPathWithTheSameImages) {
  std::shared_ptr<const Model> model = TinyModel(31);
  std::unique_ptr<Engine> engine = MakeEngine(model);
  at::manual_seed(7);
  const std::vector<at::Tensor> images = {at::rand({8, 12, 3}), at::rand({4, 8, 3})};
  std::map<SequenceId, History> histories;
  // A prompt with a 2 x 3-patch image between text, then a turn.
  std::vector<int64_t> prompt = Tokens(5, 1);
  for (int64_t t : ImageRun(6)) prompt.push_back(t);
  for (int64_t t : Tokens(4, 2)) prompt.push_back(t);
  Request first{prompt, Turn(6, 3), false};
  first.images = {images[0]};
  Result<SequenceId> id = engine->Submit(first);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  histories[*id].tokens = prompt;
  RunUntilIdle(engine.get(), &histories);
  // An observation with a second image (1 x 2 patches) appended to the live sequence.
  std::vector<int64_t> observation = ImageRun(2);
  for (int64_t t : Tokens(3, 4)) observation.push_back(t);
  Request second{observation, Turn(5, 5), false};
  second.images = {images[1]};
  ASSERT_TRUE(engine->Append(*id, second).ok());
  History& history = histories[*id];
  history.tokens.insert(history.tokens.end(), observation.begin(), observation.end());
  RunUntilIdle(engine.get(), &histories);
  int64_t agree = 0, decisions = 0;
  ExpectEqualsTrainingPath(*model, histories[*id], &agree, &decisions, images);
  EXPECT_GT(decisions, 0);

  // Placeholders without their image, or an image without placeholders, are refused up front.
  Request missing{prompt, Turn(2, 1), false};
  Result<SequenceId> refused = engine->Submit(missing);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("image-patch"), std::string::npos)
      << refused.status().ToString();
  Request extra{Tokens(4, 9), Turn(2, 1), false};
  extra.images = {images[1]};
  EXPECT_FALSE(engine->Submit(extra).ok());
}

TEST(Engine, SameSeedGivesTheSameSamplesWhateverTheBatch) {
  std::shared_ptr<const Model> model = TinyModel(12);
  Request target;
  target.tokens = Tokens(30, 1);
  target.sampling = Turn(24, 4242);
  target.sampling->temperature = 1.3;
  target.sampling->top_p = 0.95;

  std::unique_ptr<Engine> alone = MakeEngine(model);
  std::map<SequenceId, History> alone_histories;
  SequenceId alone_id = *alone->Submit(target);
  alone_histories[alone_id].tokens = target.tokens;
  RunUntilIdle(alone.get(), &alone_histories);

  std::unique_ptr<Engine> crowded = MakeEngine(model);
  std::map<SequenceId, History> histories;
  for (int i = 0; i < 5; ++i) {
    Request other;
    other.tokens = Tokens(10 + 17 * i, 10 + i);
    other.sampling = Turn(5 + 7 * i, i);
    histories[*crowded->Submit(other)].tokens = other.tokens;
  }
  // The target joins after two steps, others join and leave while it runs.
  for (int i = 0; i < 2; ++i) Record(*crowded->Step(), &histories);
  SequenceId target_id = *crowded->Submit(target);
  histories[target_id].tokens = target.tokens;
  for (int i = 0; i < 6; ++i) Record(*crowded->Step(), &histories);
  Request late;
  late.tokens = Tokens(64, 5);
  late.sampling = Turn(10, 9);
  histories[*crowded->Submit(late)].tokens = late.tokens;
  RunUntilIdle(crowded.get(), &histories);

  EXPECT_EQ(SampledTokens(histories[target_id], 30), SampledTokens(alone_histories[alone_id], 30));
  EXPECT_EQ(SampledTokens(histories[target_id], 30).size(), 24u);
}

TEST(Engine, ALongRunSpansStepsWithinThePrefillBudgetAndSamplesTheSame) {
  std::shared_ptr<const Model> model = TinyModel(12);
  Request long_run;
  long_run.tokens = Tokens(500, 3);
  long_run.sampling = Turn(8, 77);

  EngineOptions whole;
  whole.prefill_chunk_tokens = 64;
  std::unique_ptr<Engine> reference = MakeEngine(model, whole);
  std::map<SequenceId, History> reference_histories;
  const SequenceId reference_id = *reference->Submit(long_run);
  reference_histories[reference_id].tokens = long_run.tokens;
  RunUntilIdle(reference.get(), &reference_histories);

  EngineOptions budgeted = whole;
  budgeted.prefill_tokens_per_step = 128;  // two chunks a step
  std::unique_ptr<Engine> engine = MakeEngine(model, budgeted);
  std::map<SequenceId, History> histories;
  Request other;
  other.tokens = Tokens(20, 4);
  other.sampling = Turn(6, 5);
  const SequenceId other_id = *engine->Submit(other);
  histories[other_id].tokens = other.tokens;
  Record(*engine->Step(), &histories);  // the short prompt's prefill and first sample
  const SequenceId id = *engine->Submit(long_run);
  histories[id].tokens = long_run.tokens;
  // 500 tokens at 128 a step: four steps, each returning the routing of what it fed, while the
  // other sequence decodes in every one of them.
  int64_t fed = 0;
  for (int step = 0; step < 4; ++step) {
    Result<StepResult> result = engine->Step();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    Record(*result, &histories);
    const int64_t expected = std::min<int64_t>(128, 500 - fed);
    EXPECT_EQ(result->prefill_tokens, expected) << "step " << step;
    bool other_sampled = false, long_seen = false;
    for (const SequenceStep& s : result->sequences) {
      if (s.id == other_id) other_sampled = s.sampled;
      if (s.id != id) continue;
      long_seen = true;
      EXPECT_EQ(s.routing.first_position, fed) << "step " << step;
      // The last step also feeds the token it samples: its record covers that one too.
      EXPECT_EQ(s.routing.tokens, expected + (step == 3 ? 1 : 0)) << "step " << step;
      EXPECT_EQ(s.sampled, step == 3) << "step " << step;
      if (s.sampled) EXPECT_EQ(s.position, 500);
    }
    EXPECT_TRUE(long_seen) << "step " << step;
    EXPECT_TRUE(other_sampled) << "step " << step;
    fed += expected;
    if (step < 3) {
      Result<SequenceInfo> info = engine->Info(id);
      ASSERT_TRUE(info.ok());
      EXPECT_EQ(info->pending_tokens, 500 - fed);
      EXPECT_EQ(info->status, SequenceStatus::kPrefill);
    }
  }
  RunUntilIdle(engine.get(), &histories);
  EXPECT_EQ(SampledTokens(histories[id], 500), SampledTokens(reference_histories[reference_id], 500));
  EXPECT_EQ(SampledTokens(histories[id], 500).size(), 8u);
  int64_t agree = 0, decisions = 0;
  ExpectEqualsTrainingPath(*model, histories[id], &agree, &decisions);

  EngineOptions negative;
  negative.prefill_tokens_per_step = -1;
  Result<std::unique_ptr<Engine>> refused = Engine::Create(negative, model, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("prefill_tokens_per_step"), std::string::npos);
}

TEST(Engine, StopTokensAndStopStringsEndTheTurn) {
  std::shared_ptr<const Model> model = TinyModel(13);
  std::unique_ptr<Engine> engine = MakeEngine(model);
  Request request;
  request.tokens = Tokens(12, 3);
  request.sampling = Turn(30, 5);
  request.sampling->temperature = 0;  // greedy: the same turn every time
  std::map<SequenceId, History> histories;
  SequenceId id = *engine->Submit(request);
  histories[id].tokens = request.tokens;
  RunUntilIdle(engine.get(), &histories);
  const std::vector<int64_t> turn = SampledTokens(histories[id], 12);
  ASSERT_EQ(turn.size(), 30u);

  // Stop at the third sampled token.
  request.sampling->stop_tokens = {turn[2]};
  SequenceId stopped = *engine->Submit(request);
  FinishReason reason = FinishReason::kNone;
  int64_t count = 0;
  for (int i = 0; i < 40 && reason == FinishReason::kNone; ++i) {
    StepResult result = *engine->Step();
    for (const SequenceStep& step : result.sequences) {
      if (step.id != stopped || !step.sampled) continue;
      ++count;
      reason = step.finish;
    }
  }
  EXPECT_EQ(reason, FinishReason::kStopToken);
  EXPECT_LE(count, 3);
  // A stop string of the first byte-valued token.
  size_t first_byte = 0;
  while (first_byte < turn.size() && turn[first_byte] >= token::kByteCount) ++first_byte;
  if (first_byte < turn.size()) {
    request.sampling->stop_tokens.clear();
    request.sampling->stop_strings = {std::string(1, static_cast<char>(turn[first_byte]))};
    SequenceId by_string = *engine->Submit(request);
    reason = FinishReason::kNone;
    for (int i = 0; i < 40 && reason == FinishReason::kNone; ++i) {
      StepResult result = *engine->Step();
      for (const SequenceStep& step : result.sequences) {
        if (step.id == by_string && step.sampled) reason = step.finish;
      }
    }
    EXPECT_EQ(reason, FinishReason::kStopString);
  }
  EXPECT_EQ(engine->Info(stopped)->status, SequenceStatus::kIdle);
}

// With a real tokenizer's token bytes, stop strings are matched on the turn's text: here the
// stop string is an emoji and a tag split over three tokens, the emoji cut in half, and it ends
// inside a token that carries a CJK character after it. The turn ends at the first token whose
// text completes it, and only there.
TEST(Engine, StopStringsMatchTheTextOfMultiByteTokens) {
  std::shared_ptr<const Model> model = TinyModel(17);
  static const std::vector<std::string> kPieces = {"\xe5\xa5\xbd", "\xf0\x9f",
                                                   "\x99\x82</", "s>\xe4\xb8\x96"};
  EngineOptions options;
  options.token_bytes = [](int64_t id) {
    return kPieces[static_cast<size_t>(id) % kPieces.size()];
  };
  std::unique_ptr<Engine> engine = MakeEngine(model, options);
  const std::string stop = "\xf0\x9f\x99\x82</s>";  // U+1F642 then </s>
  int stopped = 0;
  for (uint64_t i = 0; i < 8; ++i) {
    Request request;
    request.tokens = Tokens(5, i);
    request.sampling = Turn(200, i);
    request.sampling->stop_tokens.clear();
    request.sampling->stop_strings = {stop};
    const SequenceId id = *engine->Submit(request);
    std::string text;
    FinishReason reason = FinishReason::kNone;
    for (int k = 0; k < 400 && reason == FinishReason::kNone; ++k) {
      StepResult result = *engine->Step();
      for (const SequenceStep& step : result.sequences) {
        if (step.id != id || !step.sampled) continue;
        text += kPieces[static_cast<size_t>(step.token) % kPieces.size()];
        reason = step.finish;
        EXPECT_EQ(reason == FinishReason::kStopString, text.find(stop) != std::string::npos)
            << "after " << text.size() << " bytes";
      }
    }
    if (reason == FinishReason::kStopString) ++stopped;
  }
  EXPECT_GT(stopped, 0);
}

TEST(Engine, BlocksReturnOnFinishAndCancelWithNoLeakOverTenThousandSequences) {
  std::shared_ptr<const Model> model = TinyModel(14);
  EngineOptions options;
  options.block_tokens = 16;
  options.max_batch = 128;
  std::unique_ptr<Engine> engine = MakeEngine(model, options);
  for (int round = 0; round < 100; ++round) {
    std::vector<SequenceId> ids;
    for (int i = 0; i < 100; ++i) {
      Request request;
      request.tokens = Tokens(3, round * 100 + i);
      request.sampling = Turn(2, i);
      request.release_on_finish = i % 2 == 0;
      Result<SequenceId> id = engine->Submit(request);
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      ids.push_back(*id);
    }
    Result<StepResult> first = engine->Step();
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    // Half are cancelled mid-turn, the other half finish and release themselves.
    for (size_t i = 1; i < ids.size(); i += 2) ASSERT_TRUE(engine->Cancel(ids[i]).ok());
    ASSERT_TRUE(engine->Step().ok());
    ASSERT_EQ(engine->Stats().live_sequences, 0) << "round " << round;
    ASSERT_EQ(engine->Stats().used_blocks, 0);
    ASSERT_EQ(engine->Stats().reserved_blocks, 0);
  }
  // 100 sequences of at most 5 tokens at a time: 100 blocks at most, reused every round.
  EXPECT_LE(engine->Stats().allocated_blocks, 100);
}

TEST(Engine, RefusedRequestLeavesRunningSequencesUntouchedAndQueueAdmitsLater) {
  std::shared_ptr<const Model> model = TinyModel(15);
  EngineOptions options;
  options.block_tokens = 16;
  // Ten blocks: 160 tokens of tiny's one latent layer (24 fp32 values per token).
  options.cache_budget_bytes = 10 * 16 * 24 * 4;
  Request a;
  a.tokens = Tokens(40, 1);
  a.sampling = Turn(40, 2);  // 80 tokens: 5 blocks reserved
  Request big;
  big.tokens = Tokens(70, 3);
  big.sampling = Turn(20, 4);  // 90 tokens: 6 blocks

  std::unique_ptr<Engine> reference = MakeEngine(model, options);
  std::map<SequenceId, History> reference_histories;
  SequenceId reference_id = *reference->Submit(a);
  reference_histories[reference_id].tokens = a.tokens;
  RunUntilIdle(reference.get(), &reference_histories);

  std::unique_ptr<Engine> engine = MakeEngine(model, options);
  std::map<SequenceId, History> histories;
  SequenceId id = *engine->Submit(a);
  histories[id].tokens = a.tokens;
  for (int i = 0; i < 5; ++i) Record(*engine->Step(), &histories);
  Result<SequenceId> refused = engine->Submit(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("budget"), std::string::npos)
      << refused.status().message();
  Request huge;
  huge.tokens = Tokens(200, 5);
  Result<SequenceId> never = engine->Submit(huge);
  ASSERT_FALSE(never.ok());
  EXPECT_NE(never.status().message().find("whole budget"), std::string::npos);
  RunUntilIdle(engine.get(), &histories);
  EXPECT_EQ(histories[id].tokens, reference_histories[reference_id].tokens);
  EXPECT_EQ(histories[id].log_probs, reference_histories[reference_id].log_probs);
  EXPECT_LE(engine->Stats().used_blocks, 10);

  // Queue policy: the same request waits until the first sequence is released.
  options.admission = AdmissionPolicy::kQueue;
  std::unique_ptr<Engine> queueing = MakeEngine(model, options);
  SequenceId first = *queueing->Submit(a);
  Result<SequenceId> queued = queueing->Submit(big);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queueing->Info(*queued)->status, SequenceStatus::kQueued);
  std::map<SequenceId, History> queue_histories;
  queue_histories[first].tokens = a.tokens;
  queue_histories[*queued].tokens = big.tokens;
  RunUntilIdle(queueing.get(), &queue_histories);
  EXPECT_EQ(queueing->Info(*queued)->status, SequenceStatus::kQueued);
  ASSERT_TRUE(queueing->Release(first).ok());
  RunUntilIdle(queueing.get(), &queue_histories);
  EXPECT_EQ(queueing->Info(*queued)->status, SequenceStatus::kIdle);
  EXPECT_EQ(queueing->Info(*queued)->length, 90);
}

TEST(Engine, SnapshotRestoreContinuesExactlyAndRejectsBadBytes) {
  std::shared_ptr<const Model> model = TinyModel(16);
  EngineOptions options;
  options.block_tokens = 8;
  std::unique_ptr<Engine> engine = MakeEngine(model, options);
  Request request;
  request.tokens = Tokens(45, 2);
  request.sampling = Turn(30, 8);
  request.sampling->stop_strings = {"\x01\x02"};
  SequenceId id = *engine->Submit(request);
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(engine->Step().ok());
  Result<std::string> bytes = engine->Snapshot(id);  // mid-turn
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  // The digest, streamed from the cache's blocks (6 of them here, the last one partly filled),
  // is the hash of the snapshot's state section.
  Result<SnapshotRecord> record =
      DecodeSnapshot(*bytes, model->config(), ConfigFingerprint(model->config()));
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  Hasher state_hash;
  state_hash.Update(record->state.data(), record->state.size());
  EXPECT_EQ(*engine->StateDigest(id), state_hash.Digest());
  std::unique_ptr<Engine> other = MakeEngine(model, options);
  SequenceId restored = *other->Restore(*bytes);
  EXPECT_EQ(other->Info(restored)->status, SequenceStatus::kGenerating);
  EXPECT_EQ(*other->StateDigest(restored), *engine->StateDigest(id));
  for (int i = 0; i < 30; ++i) {
    StepResult a = *engine->Step();
    StepResult b = *other->Step();
    ASSERT_EQ(a.sequences.size(), b.sequences.size());
    if (a.sequences.empty()) break;
    EXPECT_EQ(a.sequences[0].token, b.sequences[0].token);
    EXPECT_NEAR(a.sequences[0].log_prob, b.sequences[0].log_prob, 1e-6);
  }
  EXPECT_EQ(*other->StateDigest(restored), *engine->StateDigest(id));

  std::string corrupt = *bytes;
  corrupt[corrupt.size() / 2] ^= 0x40;
  Result<SequenceId> bad = other->Restore(corrupt);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  Result<SequenceId> cut = other->Restore(bytes->substr(0, bytes->size() - 100));
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kCorruption);
  EXPECT_FALSE(other->Restore("not a snapshot").ok());

  ModelConfig wider = TinyConfig();
  wider.name = "wider";
  wider.width = 96;
  Result<std::unique_ptr<Model>> wide_model = Model::Create(wider, 1);
  ASSERT_TRUE(wide_model.ok());
  std::unique_ptr<Engine> wide =
      MakeEngine(std::shared_ptr<const Model>(std::move(wide_model).value()));
  Result<SequenceId> mismatch = wide->Restore(*bytes);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("tiny"), std::string::npos);
}

TEST(Engine, WeightSwapKeepsSequencesAndReportsTheVersion) {
  std::shared_ptr<const Model> model = TinyModel(17);
  std::unique_ptr<Engine> engine = MakeEngine(model);
  Request request;
  request.tokens = Tokens(20, 2);
  request.sampling = Turn(10, 1);
  SequenceId id = *engine->Submit(request);
  for (int i = 0; i < 3; ++i) {
    StepResult result = *engine->Step();
    ASSERT_EQ(result.sequences.size(), 1u);
    EXPECT_EQ(result.sequences[0].policy_version, 1u);
  }
  ASSERT_TRUE(engine->SwapWeights(TinyModel(18), 7).ok());
  EXPECT_EQ(engine->policy_version(), 7u);
  // The first token after the swap was drawn from the distribution the old weights computed.
  std::vector<uint64_t> versions;
  for (int i = 0; i < 3; ++i) {
    StepResult result = *engine->Step();
    EXPECT_EQ(result.policy_version, 7u);
    for (const SequenceStep& step : result.sequences) versions.push_back(step.policy_version);
  }
  EXPECT_EQ(versions, (std::vector<uint64_t>{1, 7, 7}));
  EXPECT_EQ(engine->Info(id)->length, 26);

  ModelConfig other = TinyConfig();
  other.feed_forward.routed_experts = 4;
  Result<std::unique_ptr<Model>> mismatched = Model::Create(other, 1);
  ASSERT_TRUE(mismatched.ok());
  Status refused =
      engine->SwapWeights(std::shared_ptr<const Model>(std::move(mismatched).value()), 8);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine->policy_version(), 7u);
}

TEST(Engine, FillForBenchmarkLengthensAnIdleSequenceWithinTheBudget) {
  EngineOptions options;
  options.block_tokens = 64;
  options.cache_budget_bytes = 0;  // set below from the block size
  std::shared_ptr<const Model> model = TinyModel(23);
  const ModelConfig& config = model->config();
  const int64_t block_bytes = (config.latent.kv_rank + config.latent.rope_dim) * 4 * 64;
  options.cache_budget_bytes = 40 * block_bytes;  // 2560 tokens
  std::unique_ptr<Engine> engine = MakeEngine(model, options);
  const SequenceId id = *engine->Submit({Tokens(10, 1), std::nullopt});
  EXPECT_EQ(FillForBenchmark(engine.get(), id, 100, 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(FillForBenchmark(engine.get(), 999, 100, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(FillForBenchmark(engine.get(), id, 0, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(FillForBenchmark(engine.get(), id, config.context, 1).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(FillForBenchmark(engine.get(), id, 2600, 1).code(), StatusCode::kResourceExhausted);
  ASSERT_TRUE(FillForBenchmark(engine.get(), id, 2000, 1).ok());
  EXPECT_EQ(engine->Info(id)->length, 2010);
  EXPECT_EQ(engine->Info(id)->blocks, (2010 + 63) / 64);
  // Decoding over the filled context works and attends to the synthetic rows.
  ASSERT_TRUE(engine->Append(id, {{}, Turn(4, 5)}).ok());
  for (int i = 0; i < 4; ++i) {
    Result<StepResult> step = engine->Step();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ASSERT_EQ(step->decode_tokens, 1);
    EXPECT_TRUE(std::isfinite(step->sequences[0].model_log_prob));
  }
  EXPECT_EQ(engine->Info(id)->length, 2014);
}

TEST(Engine, BadRequestsReturnErrorsNamingTheProblem) {
  std::shared_ptr<const Model> model = TinyModel(19);
  std::unique_ptr<Engine> engine = MakeEngine(model);
  auto message = [](const Status& status) { return status.message(); };
  EXPECT_NE(message(engine->Append(999, {Tokens(3, 1), Turn(2, 1)})).find("unknown sequence 999"),
            std::string::npos);
  EXPECT_TRUE(engine->Cancel(999).IsNotFound());
  EXPECT_TRUE(engine->Snapshot(999).status().IsNotFound());
  EXPECT_TRUE(engine->Fork(999, 2, std::nullopt).status().IsNotFound());

  Request empty;
  EXPECT_NE(message(engine->Submit(empty).status()).find("at least one token"), std::string::npos);
  Request outside;
  outside.tokens = {1, 2, 5000};
  EXPECT_NE(message(engine->Submit(outside).status()).find("token 5000 at index 2"),
            std::string::npos);
  Request bad_sampling;
  bad_sampling.tokens = {1, 2};
  bad_sampling.sampling = Turn(4, 1);
  bad_sampling.sampling->top_p = 1.5;
  EXPECT_NE(message(engine->Submit(bad_sampling).status()).find("top_p"), std::string::npos);
  bad_sampling.sampling = Turn(4, 1);
  bad_sampling.sampling->temperature = -0.5;
  EXPECT_NE(message(engine->Submit(bad_sampling).status()).find("temperature"), std::string::npos);

  Request ok;
  ok.tokens = Tokens(10, 1);
  ok.sampling = Turn(2, 1);
  SequenceId id = *engine->Submit(ok);
  Status busy = engine->Append(id, {Tokens(3, 1), std::nullopt});
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition);
  std::map<SequenceId, History> histories;
  histories[id].tokens = ok.tokens;
  RunUntilIdle(engine.get(), &histories);
  Request oversize;
  oversize.tokens = Tokens(300000, 1);  // past tiny's context of 262,144
  Status too_long = engine->Append(id, oversize);
  EXPECT_EQ(too_long.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_long.message().find("model.context"), std::string::npos);
  // The sequence is still usable after the refusals.
  EXPECT_EQ(engine->Info(id)->length, 12);
  ASSERT_TRUE(engine->Append(id, {Tokens(3, 2), Turn(2, 2)}).ok());
  const std::vector<int64_t> appended = Tokens(3, 2);
  histories[id].tokens.insert(histories[id].tokens.end(), appended.begin(), appended.end());
  RunUntilIdle(engine.get(), &histories);
  EXPECT_EQ(engine->Info(id)->length, 17);
  EXPECT_EQ(engine->Release(999).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace strider::rollout
