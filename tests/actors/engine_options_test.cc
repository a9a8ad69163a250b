// The engine an actor builds from its options (EngineOptionsFor, actors/actor.h), which the
// actor benchmark's engine-alone baseline shares: what the actor relies on of it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "actors/actor.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "rollout_engine/engine.h"

namespace strider::actors {
namespace {

TEST(EngineOptionsFor, CarriesTheEngineKeysAndRoomForEveryEpisodeAndItsGroupPrompt) {
  ActorOptions options;
  options.cache_budget_bytes = int64_t{96} << 20;
  options.block_tokens = 128;
  options.max_batch = 24;
  options.prefill_chunk_tokens = 2048;
  options.threads = 3;
  for (int64_t in_flight : {1, 8, 64, 512}) {
    options.episodes_in_flight = in_flight;
    const rollout::EngineOptions engine = EngineOptionsFor(options);
    EXPECT_EQ(engine.cache_budget_bytes, options.cache_budget_bytes);
    EXPECT_EQ(engine.block_tokens, options.block_tokens);
    EXPECT_EQ(engine.max_batch, options.max_batch);
    EXPECT_EQ(engine.prefill_chunk_tokens, options.prefill_chunk_tokens);
    EXPECT_EQ(engine.threads, options.threads);
    // Each live episode holds a sequence, and each group's prompt one more while it forks.
    EXPECT_GE(engine.max_sequences, 2 * in_flight) << in_flight;
    EXPECT_TRUE(engine.record_routing);  // segments carry every token's experts
  }
}

TEST(EngineOptionsFor, ATurnThatDoesNotFitTheCacheWaitsInsteadOfFailing) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  Result<ModelConfig> config =
      LoadModelConfig(std::string(source ? source : ".") + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> model = Model::Create(*config, 1);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  ActorOptions options;
  options.threads = 2;
  options.block_tokens = 16;
  // Room for one sequence of 64 tokens (four blocks of the one latent layer), not two.
  options.cache_budget_bytes = 4 * options.block_tokens *
                               (config->latent.kv_rank + config->latent.rope_dim) *
                               config->CacheDtypeBytes();
  Result<std::unique_ptr<rollout::Engine>> engine = rollout::Engine::Create(
      EngineOptionsFor(options), std::shared_ptr<const Model>(std::move(model).value()), 0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  rollout::SamplingParams turn;
  turn.max_new_tokens = 16;
  const rollout::Request request{std::vector<int64_t>(48, 65), turn, true};
  Result<rollout::SequenceId> first = (*engine)->Submit(request);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<rollout::SequenceId> second = (*engine)->Submit(request);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ((*engine)->Info(*second)->status, rollout::SequenceStatus::kQueued);
  // The first turn ends and is released; the second is admitted and runs.
  bool second_sampled = false;
  for (int step = 0; step < 64 && !second_sampled; ++step) {
    Result<rollout::StepResult> result = (*engine)->Step();
    ASSERT_TRUE(result.ok()) << result.status().ToString();
    for (const rollout::SequenceStep& s : result->sequences) {
      second_sampled |= s.id == *second && s.sampled;
    }
  }
  EXPECT_TRUE(second_sampled);
}

}  // namespace
}  // namespace strider::actors
