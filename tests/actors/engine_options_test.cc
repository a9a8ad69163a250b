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

// A fleet's share of a shared GPU (`--cache-budget-mb`): the page pool is sized by the cap
// when it is below the actor's own budget, by the budget otherwise.
TEST(EngineOptionsFor, ACacheCapSizesThePagePool) {
  const char* source = std::getenv("STRIDER_SOURCE_DIR");
  Result<ModelConfig> config =
      LoadModelConfig(std::string(source ? source : ".") + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ConfigureRuntime(2);
  Result<std::unique_ptr<Model>> created = Model::Create(*config, 1);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const std::shared_ptr<const Model> model(std::move(created).value());
  ActorOptions options;
  options.threads = 2;
  options.block_tokens = 16;
  const int64_t block_bytes = config->CountLayers('G') * options.block_tokens *
                              (config->latent.kv_rank + config->latent.rope_dim) *
                              config->CacheDtypeBytes();
  options.cache_budget_bytes = 64 * block_bytes;
  const auto capacity = [&]() -> int64_t {
    Result<std::unique_ptr<rollout::Engine>> engine =
        rollout::Engine::Create(EngineOptionsFor(options), model, 0);
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    return engine.ok() ? (*engine)->Stats().capacity_blocks : -1;
  };
  EXPECT_EQ(capacity(), 64);
  options.cache_budget_cap_bytes = 10 * block_bytes + block_bytes / 2;
  EXPECT_EQ(EngineOptionsFor(options).cache_budget_bytes, options.cache_budget_cap_bytes);
  EXPECT_EQ(capacity(), 10);
  options.cache_budget_cap_bytes = 100 * block_bytes;  // above the budget: the budget stands
  EXPECT_EQ(capacity(), 64);
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
