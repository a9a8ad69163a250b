// Expert parallelism (common/model/expert_parallel.h) over real Gloo ranks on loopback, one
// thread per rank: each rank holds its shard of the routed experts and its own tokens; the
// layer's outputs and every gradient equal the unsharded layer's over the same tokens (fp64,
// so the comparison is to rounding, not to a loose tolerance).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/model/expert_parallel.h"
#include "common/model/model.h"
#include "common/model/parameters.h"
#include "common/model/sparse_experts.h"
#include "common/model/torch_status.h"
#include "learner/distributed.h"
#include "tests/free_port.h"

namespace strider {
namespace {

using model::SparseExpertWeights;

// Rank `rank` of a group meeting at 127.0.0.1:port.
Result<std::unique_ptr<LearnerGroup>> JoinLoopback(int rank, int world, uint16_t port) {
  LearnerGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout_s = 60;
  return LearnerGroup::Join(options);
}

FeedForwardConfig Config() {
  FeedForwardConfig c;
  c.routed_experts = 8;
  c.experts_per_token = 2;
  c.latent_width = 6;
  c.expert_hidden = 10;
  c.shared_experts = 1;
  c.shared_hidden = 12;
  return c;
}

constexpr int64_t kWidth = 16;

// Every tensor of the layer, from one seed, fp64.
std::map<std::string, at::Tensor> FullWeights(const FeedForwardConfig& c) {
  at::manual_seed(11);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  const int64_t n = c.routed_experts, l = c.latent_width, e = c.expert_hidden;
  const int64_t s = c.shared_hidden;
  return {{"router", at::randn({n, kWidth}, o) * 0.5},
          {"router_bias", at::randn({n}, o) * 0.1},
          {"latent_down", at::randn({l, kWidth}, o) * 0.3},
          {"latent_norm", at::ones({l}, o) + at::randn({l}, o) * 0.1},
          {"latent_up", at::randn({kWidth, l}, o) * 0.3},
          {"routed_gate", at::randn({n, e, l}, o) * 0.4},
          {"routed_up", at::randn({n, e, l}, o) * 0.4},
          {"routed_down", at::randn({n, l, e}, o) * 0.4},
          {"shared_gate", at::randn({1, s, kWidth}, o) * 0.3},
          {"shared_up", at::randn({1, s, kWidth}, o) * 0.3},
          {"shared_down", at::randn({1, kWidth, s}, o) * 0.3}};
}

bool IsRouted(const std::string& name) { return name.rfind("routed_", 0) == 0; }

// Leaves requiring gradients: whole tensors, or this rank's experts of the routed ones.
std::map<std::string, at::Tensor> Leaves(const std::map<std::string, at::Tensor>& full,
                                         const ExpertShard* shard) {
  std::map<std::string, at::Tensor> leaves;
  for (const auto& [name, tensor] : full) {
    at::Tensor t = shard != nullptr && IsRouted(name)
                       ? tensor.narrow(0, shard->first, shard->count).clone()
                       : tensor.clone();
    leaves[name] = name == "router_bias" ? t : t.requires_grad_(true);
  }
  return leaves;
}

SparseExpertWeights Bind(const std::map<std::string, at::Tensor>& t) {
  SparseExpertWeights w;
  w.router = t.at("router");
  w.router_bias = t.at("router_bias");
  w.latent_down = t.at("latent_down");
  w.latent_norm = t.at("latent_norm");
  w.latent_up = t.at("latent_up");
  w.routed_gate = t.at("routed_gate");
  w.routed_up = t.at("routed_up");
  w.routed_down = t.at("routed_down");
  w.shared_gate = t.at("shared_gate");
  w.shared_up = t.at("shared_up");
  w.shared_down = t.at("shared_down");
  return w;
}

struct RankInputs {
  at::Tensor x;           // (B, T, d), requires grad
  at::Tensor projection;  // the loss is sum(y * projection)
};

// From a generator of its own: rank threads call this at the same time, and draws from the
// global generator would interleave, giving a rank other inputs than the reference's.
RankInputs InputsOf(int rank, int64_t length) {
  at::Generator generator = at::detail::createCPUGenerator(100 + rank);
  const auto o = at::TensorOptions().dtype(at::kDouble);
  at::Tensor x = at::randn({2, length, kWidth}, generator, o).requires_grad_(true);
  at::Tensor projection = at::randn({2, length, kWidth}, generator, o);
  return {x, projection};
}

void ExpectClose(const at::Tensor& a, const at::Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined()) << what;
  ASSERT_TRUE(b.defined()) << what;
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-10) << what;
}

void CheckAgainstUnsharded(int world, const std::vector<int64_t>& lengths) {
  const FeedForwardConfig c = Config();
  const std::map<std::string, at::Tensor> full = FullWeights(c);

  // The unsharded layer over every rank's tokens: one loss, gradients summed over the ranks.
  std::map<std::string, at::Tensor> reference = Leaves(full, nullptr);
  std::vector<at::Tensor> reference_y, reference_dx;
  {
    at::Tensor loss = at::zeros({}, at::kDouble);
    std::vector<RankInputs> inputs;
    for (int r = 0; r < world; ++r) {
      inputs.push_back(InputsOf(r, lengths[r]));
      at::Tensor y = model::SparseExpertForward(Bind(reference), c, inputs[r].x, at::Tensor(),
                                                nullptr, 1e-6);
      reference_y.push_back(y.detach());
      loss = loss + (y * inputs[r].projection).sum();
    }
    loss.backward();
    for (int r = 0; r < world; ++r) reference_dx.push_back(inputs[r].x.grad());
  }

  const uint16_t port = strider::testing::FreeLoopbackPort();
  std::vector<std::map<std::string, at::Tensor>> leaves(world);
  std::vector<at::Tensor> ys(world), dxs(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto group = JoinLoopback(r, world, port);
      if (!group.ok()) {
        errors[r] = group.status().ToString();
        return;
      }
      const ExpertShard shard = ExpertShardOf(c.routed_experts, r, world);
      leaves[r] = Leaves(full, &shard);
      RankInputs in = InputsOf(r, lengths[r]);
      const Status ran = model::Guarded("expert forward and backward", [&] {
        at::Tensor y = model::SparseExpertForward(Bind(leaves[r]), c, in.x, at::Tensor(), nullptr,
                                                  1e-6, &(*group)->experts());
        (y * in.projection).sum().backward();
        ys[r] = y.detach();
        dxs[r] = in.x.grad();
      });
      if (!ran.ok()) errors[r] = ran.ToString();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];

  for (int r = 0; r < world; ++r) {
    const std::string rank = "rank " + std::to_string(r) + " of " + std::to_string(world);
    ExpectClose(ys[r], reference_y[r], rank + ": output");
    ExpectClose(dxs[r], reference_dx[r], rank + ": input gradient");
    const ExpertShard shard = ExpertShardOf(c.routed_experts, r, world);
    for (const char* name : {"routed_gate", "routed_up", "routed_down"}) {
      // The shard's experts collected gradients from every rank's tokens.
      ExpectClose(leaves[r].at(name).grad(),
                  reference.at(name).grad().narrow(0, shard.first, shard.count),
                  rank + ": " + name + " gradient");
    }
  }
  // Replicated weights: each rank's gradient is its own tokens'; their sum is the whole batch's
  // (what the data-parallel all-reduce adds).
  for (const char* name : {"router", "latent_down", "latent_norm", "latent_up", "shared_gate",
                           "shared_up", "shared_down"}) {
    at::Tensor sum = at::zeros_like(reference.at(name));
    for (int r = 0; r < world; ++r) sum = sum + leaves[r].at(name).grad();
    ExpectClose(sum, reference.at(name).grad(), std::string(name) + " gradient summed over ranks");
  }
}

TEST(ExpertParallel, TwoRanksEqualTheUnshardedLayerForwardAndBackward) {
  CheckAgainstUnsharded(2, {7, 5});
}

TEST(ExpertParallel, FourRanksEqualTheUnshardedLayerForwardAndBackward) {
  // One rank with a single token: most ranks send it nothing.
  CheckAgainstUnsharded(4, {6, 1, 9, 4});
}

// The whole model: each rank holds its shard of every sparse layer's experts and its own
// sequence; training-path logits and every gradient, and inference-path logits, equal the
// unsharded model's (fp64).
TEST(ExpertParallel, ShardedModelsEqualTheWholeModelForwardAndBackward) {
  constexpr int kWorld = 2;
  auto config = LoadModelConfig(std::string(STRIDER_SOURCE_DIR) + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto make = [&]() {
    auto model = Model::Create(*config, 3);
    EXPECT_TRUE(model.ok());
    EXPECT_TRUE((*model)->ConvertTo(at::kDouble).ok());
    (*model)->SetRequiresGrad(true);
    return std::move(*model);
  };
  std::vector<at::Tensor> tokens;
  for (int r = 0; r < kWorld; ++r) {
    at::manual_seed(40 + r);
    tokens.push_back(at::randint(config->vocabulary, {1, 10 + 3 * r}, at::kLong));
  }
  auto loss_of = [](const at::Tensor& logits, const at::Tensor& t) {
    return NextTokenLogProbs(logits, t).sum();
  };

  std::unique_ptr<Model> whole = make();
  std::vector<at::Tensor> whole_logits, whole_inference;
  {
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int r = 0; r < kWorld; ++r) {
      auto out = whole->Forward({tokens[r]});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      whole_logits.push_back(out->logits.detach());
      loss = loss + loss_of(out->logits, tokens[r]);
      at::NoGradGuard no_grad;
      auto state = whole->NewState(1);
      ASSERT_TRUE(state.ok());
      auto appended = whole->Append(&*state, {tokens[r]});
      ASSERT_TRUE(appended.ok()) << appended.status().ToString();
      whole_inference.push_back(appended->logits);
    }
    loss.backward();
  }

  const uint16_t port = strider::testing::FreeLoopbackPort();
  std::vector<std::unique_ptr<Model>> shards(kWorld);
  std::vector<at::Tensor> logits(kWorld), inference(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    shards[r] = make();
    threads.emplace_back([&, r] {
      auto group = JoinLoopback(r, kWorld, port);
      if (!group.ok()) {
        errors[r] = group.status().ToString();
        return;
      }
      Status sharded = shards[r]->ShardExperts(r, kWorld);
      if (!sharded.ok()) {
        errors[r] = sharded.ToString();
        return;
      }
      ForwardOptions forward;
      forward.expert_exchange = &(*group)->experts();
      auto out = shards[r]->Forward({tokens[r]}, forward);
      if (!out.ok()) {
        errors[r] = out.status().ToString();
        return;
      }
      const Status backward =
          model::Guarded("backward", [&] { loss_of(out->logits, tokens[r]).backward(); });
      if (!backward.ok()) {
        errors[r] = backward.ToString();
        return;
      }
      logits[r] = out->logits.detach();
      at::NoGradGuard no_grad;
      auto state = shards[r]->NewState(1);
      auto appended = shards[r]->Append(&*state, {tokens[r]}, forward);
      if (!appended.ok()) {
        errors[r] = appended.status().ToString();
        return;
      }
      inference[r] = appended->logits;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];

  for (int r = 0; r < kWorld; ++r) {
    ExpectClose(logits[r], whole_logits[r], "rank " + std::to_string(r) + ": training logits");
    ExpectClose(inference[r], whole_inference[r],
                "rank " + std::to_string(r) + ": inference logits");
  }
  const auto& reference = whole->tensors();
  for (size_t i = 0; i < reference.size(); ++i) {
    const std::string& name = reference[i].first;
    if (!reference[i].second.grad().defined()) continue;  // the router biases, the value head
    const bool routed = name.find(".experts.routed_") != std::string::npos;
    at::Tensor sum;
    for (int r = 0; r < kWorld; ++r) {
      const at::Tensor grad = shards[r]->tensors()[i].second.grad();
      ASSERT_TRUE(grad.defined()) << name << " on rank " << r;
      if (routed) {
        const ExpertShard shard = shards[r]->expert_shard();
        ExpectClose(grad, reference[i].second.grad().narrow(0, shard.first, shard.count),
                    name + " on rank " + std::to_string(r));
      } else {
        sum = sum.defined() ? sum + grad : grad.clone();
      }
    }
    if (!routed) ExpectClose(sum, reference[i].second.grad(), name + " summed over ranks");
  }
  // A sharded model without the exchange, and a whole one given one, are refused.
  auto refused = shards[0]->Forward({tokens[0]});
  EXPECT_FALSE(refused.ok());
  EXPECT_FALSE(shards[0]->ShardExperts(0, 2).ok()) << "sharded twice";
  EXPECT_FALSE(make()->ShardExperts(0, 3).ok()) << "3 does not divide 8 experts";
}

// A rank's checkpoint holds its shard and loads back as that shard; the shards' experts joined
// make the whole weights an actor loads.
TEST(ExpertParallel, ShardCheckpointsLoadAsShardsAndJoinIntoWholeWeights) {
  auto config = LoadModelConfig(std::string(STRIDER_SOURCE_DIR) + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto whole = Model::Create(*config, 5);
  ASSERT_TRUE(whole.ok());
  std::map<std::string, std::vector<at::Tensor>> parts;
  std::vector<std::unique_ptr<Model>> shards;
  for (int r = 0; r < 2; ++r) {
    auto model = Model::Create(*config, 5);
    ASSERT_TRUE(model.ok());
    ASSERT_TRUE((*model)->ShardExperts(r, 2).ok());
    auto bytes = (*model)->SaveToBytes();
    ASSERT_TRUE(bytes.ok());
    auto loaded = Model::LoadFromBytes(*config, *bytes, "shard");
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_TRUE((*loaded)->sharded());
    EXPECT_EQ((*loaded)->expert_shard().first, r * 4);
    EXPECT_EQ((*loaded)->expert_shard().count, 4);
    for (const auto& [name, tensor] : (*loaded)->tensors()) {
      if (IsRoutedExpertTensor(name)) parts[name].push_back(tensor);
    }
    shards.push_back(std::move(*loaded));
  }
  std::map<std::string, at::Tensor> joined;
  for (const auto& [name, list] : parts) joined[name] = at::cat(list, 0);
  auto bytes = shards[1]->SaveWholeToBytes(joined);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto loaded = Model::LoadFromBytes(*config, *bytes, "whole");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_FALSE((*loaded)->sharded());
  for (size_t i = 0; i < (*whole)->tensors().size(); ++i) {
    EXPECT_TRUE((*loaded)->tensors()[i].second.equal((*whole)->tensors()[i].second))
        << (*whole)->tensors()[i].first;
  }
  // Missing experts are an error, not a shard published as whole weights.
  joined.erase(joined.begin());
  EXPECT_FALSE(shards[0]->SaveWholeToBytes(joined).ok());
}

TEST(ExpertParallel, ShardsAndPerRankFootprint) {
  EXPECT_EQ(ExpertShardOf(896, 3, 8).first, 336);
  EXPECT_EQ(ExpertShardOf(896, 3, 8).count, 112);
  ModelConfig config;
  config.feed_forward.routed_experts = 8;
  const ExpertParallelFootprint one = ExpertParallelFootprintOf(config, 1);
  const ExpertParallelFootprint four = ExpertParallelFootprintOf(config, 4);
  EXPECT_GT(one.routed_parameters_total, 0);
  EXPECT_DOUBLE_EQ(four.routed_parameters_per_rank, one.routed_parameters_total / 4);
  EXPECT_DOUBLE_EQ(four.replicated_parameters, one.replicated_parameters);
  EXPECT_DOUBLE_EQ(one.parameters_per_rank,
                   one.replicated_parameters + one.routed_parameters_total);
  EXPECT_DOUBLE_EQ(four.training_bytes_per_rank, 16 * four.parameters_per_rank);
}

}  // namespace
}  // namespace strider
