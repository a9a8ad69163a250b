// The RL step's pieces on the tiny model: batches split into groups of whole trajectories, the
// update pass's chunks adding up to the aggregated loss and to the gradient of one pass over the
// whole trajectory, truncation cutting exactly the cross-chunk gradient, and exclusion by the
// mismatch check only where the weights are the trajectory's version.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/model/model.h"
#include "learner/rl/rl_step.h"
#include "tests/replay/test_segments.h"
#include "tests/shipped_config.h"

namespace strider::rl {
namespace {

using strider::testing::MakeSegment;
using strider::testing::MakeTrajectoryId;

// Trajectory `seed` in `segments` segments of `tokens` tokens, at temperature 1 without cuts.
std::vector<schema::SegmentData> Trajectory(uint64_t seed, uint32_t segments, size_t tokens) {
  std::vector<schema::SegmentData> out;
  for (uint32_t i = 0; i < segments; ++i) {
    schema::SegmentData s = MakeSegment(seed, i, tokens, /*policy_version=*/3, i + 1 == segments);
    s.temperature = 1.0f;
    s.top_p = 1.0f;
    s.top_k = 0;
    s.policy_runs = {{0, 3}};
    out.push_back(std::move(s));
  }
  return out;
}

std::unique_ptr<Model> TinyModel() {
  auto model = Model::Create(strider::testing::ShippedModelConfig("tiny"), 0);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return model.ok() ? std::move(*model) : nullptr;
}

StepSettings Settings(int64_t chunk, bool truncated) {
  StepSettings settings;
  settings.scoring.replay_routing = false;  // the synthetic experts are not the model's
  settings.scoring.chunk_tokens = chunk;
  settings.truncated_backprop = truncated;
  settings.objective.loss.value_coef = 0.5;
  return settings;
}

// Every parameter's gradient, concatenated.
at::Tensor Gradient(const Model& model) {
  std::vector<at::Tensor> parts;
  for (const auto& [name, tensor] : model.tensors()) {
    if (tensor.grad().defined()) parts.push_back(tensor.grad().reshape({-1}).clone());
  }
  return at::cat(parts);
}

void ZeroGradients(Model& model) {
  for (const auto& [name, tensor] : model.tensors()) {
    if (tensor.grad().defined()) const_cast<at::Tensor&>(tensor).mutable_grad().zero_();
  }
}

TEST(SplitBatch, GroupsWholeTrajectoriesInSegmentOrder) {
  std::vector<schema::SegmentData> segments;
  // Seeds 0-2 share a group (groups of 4 consecutive seeds); 5 is in the next one.
  for (uint64_t seed : {0, 5, 1, 2}) {
    for (schema::SegmentData& s : Trajectory(seed, 3, 32)) segments.push_back(std::move(s));
  }
  std::swap(segments[0], segments[2]);  // out of order within trajectory 0
  schema::SegmentData alone = MakeSegment(9, 0, 32, 3, true);
  alone.group_size = 0;  // a 1.1 segment: a group of its own
  segments.push_back(alone);
  const std::vector<SampledGroup> groups = SplitBatch(std::move(segments));
  ASSERT_EQ(groups.size(), 3u);
  ASSERT_EQ(groups[0].members.size(), 3u);
  EXPECT_EQ(groups[0].members[1].front().trajectory_id, MakeTrajectoryId(1));
  for (const auto& member : groups[0].members) {
    ASSERT_EQ(member.size(), 3u);
    for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(member[i].segment_index, i);
  }
  EXPECT_EQ(groups[1].members.size(), 1u);
  EXPECT_EQ(groups[2].group_id, MakeTrajectoryId(9));
}

// The same round in any order reaches the update in one order: by (actor, episode) from the last
// segment's metadata, members by their index in the group, whatever the (random) ids.
TEST(OrderByProvenance, TheSameRoundInAnyOrderComesOutInOne) {
  auto round = [](uint64_t id_salt, bool reversed) {
    std::vector<schema::SegmentData> segments;
    // Two groups of two from actor-0 (episodes 4-5 and 6-7), one group from actor-1 (episode 0).
    const std::vector<std::tuple<std::string, uint64_t, uint32_t, uint64_t>> members = {
        {"actor-0", 6, 0, 1}, {"actor-0", 4, 1, 0}, {"actor-1", 0, 0, 2},
        {"actor-0", 7, 1, 1}, {"actor-0", 5, 0, 0}};
    for (const auto& [actor, episode, index, group] : members) {
      std::vector<schema::SegmentData> t = Trajectory(id_salt * 100 + episode, 2, 32);
      for (schema::SegmentData& s : t) {
        s.group_id = MakeTrajectoryId(id_salt * 1000 + group);
        s.group_index = index;
        s.group_size = group == 2 ? 1 : 2;
      }
      t.back().metadata = {{"actor", actor}, {"episode", std::to_string(episode)}};
      for (schema::SegmentData& s : t) segments.push_back(std::move(s));
    }
    if (reversed) std::reverse(segments.begin(), segments.end());
    std::vector<SampledGroup> groups = SplitBatch(std::move(segments));
    OrderByProvenance(groups);
    std::vector<std::string> order;
    for (const SampledGroup& g : groups) {
      for (const auto& member : g.members) {
        for (const auto& [key, value] : member.back().metadata) {
          if (key == "episode") order.push_back(member.back().metadata[0].second + "/" + value);
        }
      }
    }
    return order;
  };
  const std::vector<std::string> expected = {"actor-0/5", "actor-0/4", "actor-0/6", "actor-0/7",
                                             "actor-1/0"};
  EXPECT_EQ(round(1, false), expected);
  EXPECT_EQ(round(2, true), expected);  // other ids, segments arriving the other way round
}

class UpdatePass : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TinyModel();
    ASSERT_NE(model_, nullptr);
    model_->SetRequiresGrad(true);
    // A group of two trajectories of 3 x 130 tokens (a step each); their behaviour log-probs are replaced by
    // the model's own (scored here), as an actor with these weights would have stored.
    SampledGroup group;
    for (uint64_t seed : {0, 1}) group.members.push_back(Trajectory(seed, 3, 130));
    StepSettings settings = Settings(512, true);
    Result<PreparedBatch> scored = PrepareBatch(*model_, nullptr, {group}, settings);
    ASSERT_TRUE(scored.ok()) << scored.status().ToString();
    for (size_t m = 0; m < 2; ++m) {
      const TrainingTrajectory& t = scored->trajectories[m];
      size_t next = 0;
      for (schema::SegmentData& s : group.members[m]) {
        for (size_t offset = 0; offset < s.tokens.size(); ++offset) {
          const int64_t position = static_cast<int64_t>(s.token_begin + offset);
          if (next < t.prepared.positions.size() && t.prepared.positions[next] == position) {
            s.behaviour_logprobs[offset] = t.scores.logprobs[next++];
          }
        }
      }
    }
    settings.weights_version = 3;
    Result<PreparedBatch> batch = PrepareBatch(*model_, nullptr, {group}, settings);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    batch_ = std::move(*batch);
  }

  std::vector<const TrainingTrajectory*> Kept() const {
    std::vector<const TrainingTrajectory*> kept;
    for (const TrainingTrajectory& t : batch_.trajectories) kept.push_back(&t);
    return kept;
  }

  std::unique_ptr<Model> model_;
  PreparedBatch batch_;
};

TEST_F(UpdatePass, OwnLogProbsPassTheMismatchCheckAndTheGroupGetsOppositeAdvantages) {
  EXPECT_EQ(batch_.mismatch_measured, 2);
  EXPECT_EQ(batch_.mismatch_excluded, 0);
  EXPECT_LE(batch_.mismatch_max, 1e-6);
  ASSERT_EQ(batch_.trajectories.size(), 2u);
  for (const TrainingTrajectory& t : batch_.trajectories) {
    ASSERT_FALSE(t.excluded) << t.excluded_reason;
    ASSERT_FALSE(t.advantages.empty());
  }
  // Outcomes 1 and 2 (test_segments.h): outcome_group gives -s and +s to the two members.
  const float low = batch_.trajectories[0].advantages.front();
  const float high = batch_.trajectories[1].advantages.front();
  EXPECT_LT(low, 0);
  EXPECT_NEAR(low, -high, 1e-6);
  for (const TrainingTrajectory& t : batch_.trajectories) {
    EXPECT_FALSE(t.excluded) << t.excluded_reason;
    for (float a : t.advantages) EXPECT_FLOAT_EQ(a, t.advantages.front());
  }
}

TEST_F(UpdatePass, ChunksAddUpToOnePassOverTheWholeTrajectory) {
  const std::vector<const TrainingTrajectory*> kept = Kept();
  ZeroGradients(*model_);
  Result<UpdateMetrics> whole = AccumulateGradients(*model_, kept, Settings(4096, false));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const at::Tensor reference = Gradient(*model_);
  ZeroGradients(*model_);
  Result<UpdateMetrics> chunked = AccumulateGradients(*model_, kept, Settings(17, false));
  ASSERT_TRUE(chunked.ok()) << chunked.status().ToString();
  const at::Tensor gradient = Gradient(*model_);
  EXPECT_NEAR(chunked->loss, whole->loss, 1e-5);
  EXPECT_EQ(chunked->metrics.tokens, whole->metrics.tokens);
  EXPECT_GT(reference.abs().max().item<double>(), 1e-4);
  EXPECT_LE((gradient - reference).abs().max().item<double>(),
            1e-5 * std::max(1.0, reference.abs().max().item<double>()));

  // At ratio 1 nothing is clipped and the policy term is -(token mean of the advantages).
  double sum = 0, count = 0;
  for (const TrainingTrajectory* t : kept) {
    for (float a : t->advantages) sum += a, ++count;
  }
  EXPECT_EQ(whole->metrics.clipped, 0);
  EXPECT_NEAR(whole->policy_loss, -sum / count, 1e-5);
}

TEST_F(UpdatePass, TruncationCutsOnlyTheGradientAcrossChunks) {
  const std::vector<const TrainingTrajectory*> kept = Kept();
  ZeroGradients(*model_);
  ASSERT_TRUE(AccumulateGradients(*model_, kept, Settings(17, false)).ok());
  const at::Tensor full = Gradient(*model_);
  ZeroGradients(*model_);
  Result<UpdateMetrics> truncated = AccumulateGradients(*model_, kept, Settings(17, true));
  ASSERT_TRUE(truncated.ok());
  const at::Tensor cut = Gradient(*model_);
  // Same forward values (the loss), a different gradient: the state carries no graph.
  EXPECT_GT((cut - full).abs().max().item<double>(), 1e-6);
  ZeroGradients(*model_);
  ASSERT_TRUE(AccumulateGradients(*model_, kept, Settings(4096, true)).ok());
  // One chunk: nothing to cut.
  EXPECT_LE((Gradient(*model_) - full).abs().max().item<double>(),
            1e-5 * std::max(1.0, full.abs().max().item<double>()));
}

TEST_F(UpdatePass, ZeroAdvantagesGiveNoPolicyGradient) {
  std::vector<TrainingTrajectory> zeroed = batch_.trajectories;
  for (TrainingTrajectory& t : zeroed) std::fill(t.advantages.begin(), t.advantages.end(), 0.0f);
  std::vector<const TrainingTrajectory*> kept;
  for (const TrainingTrajectory& t : zeroed) kept.push_back(&t);
  StepSettings settings = Settings(17, true);
  settings.objective.loss.value_coef = 0;
  ZeroGradients(*model_);
  ASSERT_TRUE(AccumulateGradients(*model_, kept, settings).ok());
  EXPECT_EQ(Gradient(*model_).abs().max().item<double>(), 0.0);
}

TEST_F(UpdatePass, BehaviourProximalAndCurrentLogProbsEachGoWhereTheyBelong) {
  // The stored behaviour log-probs 0.1 below the learner's proximal ones (an engine that put
  // less mass on every sampled token); the current weights are the proximal ones. The ratio is
  // current / proximal = 1 (no approx KL, nothing clipped) and the truncated weight proximal /
  // behaviour = e^0.1 on every token: swapping behaviour and proximal, or inverting the
  // weight, changes each of these.
  std::vector<TrainingTrajectory> stale = batch_.trajectories;
  for (TrainingTrajectory& t : stale) {
    for (float& lp : t.prepared.behaviour_logprobs) lp -= 0.1f;
  }
  std::vector<const TrainingTrajectory*> kept;
  for (const TrainingTrajectory& t : stale) kept.push_back(&t);
  StepSettings settings = Settings(64, true);
  settings.objective.loss.value_coef = 0;
  ZeroGradients(*model_);
  Result<UpdateMetrics> update = AccumulateGradients(*model_, kept, settings);
  ASSERT_TRUE(update.ok()) << update.status().ToString();
  const PolicyLossMetrics& m = update->metrics;
  EXPECT_NEAR(m.approx_kl(), 0.0, 1e-9);
  EXPECT_EQ(m.clipped, 0);
  EXPECT_NEAR(m.importance_mean(), std::exp(0.1), 1e-5);
  EXPECT_NEAR(m.mismatch_kl(), std::exp(0.1) - 1 - 0.1, 1e-5);
  double sum = 0, count = 0;
  for (const TrainingTrajectory& t : stale) {
    for (float a : t.advantages) sum += a, ++count;
  }
  EXPECT_NEAR(update->policy_loss, -std::exp(0.1) * sum / count, 1e-5);
}

TEST_F(UpdatePass, TheKlIsMeasuredWheneverTheReferenceWasScored) {
  // A reference 0.3 nats below the policy on every action token, with kl_coef 0: the KL is
  // reported (k3 of d = -0.3) and the loss is the same as without a reference.
  std::vector<TrainingTrajectory> with_reference = batch_.trajectories;
  for (TrainingTrajectory& t : with_reference) {
    t.scores.reference_logprobs = t.scores.logprobs;
    for (float& lp : t.scores.reference_logprobs) lp -= 0.3f;
  }
  std::vector<const TrainingTrajectory*> kept;
  for (const TrainingTrajectory& t : with_reference) kept.push_back(&t);
  StepSettings settings = Settings(64, true);
  ASSERT_EQ(settings.objective.loss.kl_coef, 0);
  ZeroGradients(*model_);
  Result<UpdateMetrics> measured = AccumulateGradients(*model_, kept, settings);
  ASSERT_TRUE(measured.ok()) << measured.status().ToString();
  EXPECT_NEAR(measured->metrics.kl(), std::exp(-0.3) + 0.3 - 1, 1e-4);
  ZeroGradients(*model_);
  Result<UpdateMetrics> plain = AccumulateGradients(*model_, Kept(), settings);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->metrics.kl_tokens, 0.0);  // not measured: the metrics line reports null
  EXPECT_EQ(measured->metrics.kl_tokens, measured->metrics.tokens);
  EXPECT_NEAR(measured->loss, plain->loss, 1e-6);
}

TEST_F(UpdatePass, ANonFiniteLossIsNeverApplied) {
  // A reference log-prob of -inf: k3's value is infinite while its gradient, 1 - e^d, is
  // finite. The update must still not be applied: its gradient norm is made non-finite.
  std::vector<TrainingTrajectory> broken = batch_.trajectories;
  for (TrainingTrajectory& t : broken) t.scores.reference_logprobs = t.scores.logprobs;
  broken[0].scores.reference_logprobs[0] = -std::numeric_limits<float>::infinity();
  std::vector<const TrainingTrajectory*> kept;
  for (const TrainingTrajectory& t : broken) kept.push_back(&t);
  StepSettings settings = Settings(64, true);
  settings.objective.loss.kl_coef = 0.1;
  settings.objective.loss.kl_estimator = KlEstimator::kK3;
  ZeroGradients(*model_);
  Result<UpdateMetrics> update = AccumulateGradients(*model_, kept, settings);
  ASSERT_TRUE(update.ok()) << update.status().ToString();
  EXPECT_FALSE(std::isfinite(update->loss));
  EXPECT_FALSE(std::isfinite(Gradient(*model_).norm().item<double>()));
  // A finite loss keeps its finite gradient.
  ZeroGradients(*model_);
  ASSERT_TRUE(AccumulateGradients(*model_, Kept(), Settings(64, true)).ok());
  EXPECT_TRUE(std::isfinite(Gradient(*model_).norm().item<double>()));
}

TEST(PrepareBatch, OtherWeightsAreExcludedOnlyWhenTheyClaimTheTrajectorysVersion) {
  auto model = TinyModel();
  ASSERT_NE(model, nullptr);
  SampledGroup group;
  for (uint64_t seed : {0, 1}) group.members.push_back(Trajectory(seed, 2, 130));
  StepSettings settings = Settings(64, true);
  // The stored log-probs are the builder's, not this model's.
  settings.weights_version = 3;
  Result<PreparedBatch> same = PrepareBatch(*model, nullptr, {group}, settings);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->mismatch_excluded, 2);
  for (const TrainingTrajectory& t : same->trajectories) {
    EXPECT_TRUE(t.excluded);
    EXPECT_NE(t.excluded_reason.find("mismatch"), std::string::npos) << t.excluded_reason;
  }
  EXPECT_EQ(same->action_tokens, 0);
  // Weights of version 4 scoring version-3 trajectories: not comparable, not excluded.
  settings.weights_version = 4;
  Result<PreparedBatch> newer = PrepareBatch(*model, nullptr, {group}, settings);
  ASSERT_TRUE(newer.ok());
  EXPECT_EQ(newer->mismatch_measured, 0);
  EXPECT_EQ(newer->mismatch_excluded, 0);
  EXPECT_GT(newer->action_tokens, 0);
}

TEST(PrepareBatch, TheTasksTurnLimitIsNeverBootstrapped) {
  auto model = TinyModel();
  ASSERT_NE(model, nullptr);
  SampledGroup group;
  for (uint64_t seed : {0, 1, 2}) group.members.push_back(Trajectory(seed, 1, 130));
  // Member 1 stalled until the task's turn limit; member 2 was cut by its token limit.
  group.members[1].back().end_reason = schema::EndReason::kTruncatedTurns;
  group.members[2].back().end_reason = schema::EndReason::kTruncatedLength;
  StepSettings settings = Settings(64, true);
  settings.objective.advantages.estimator = "outcome_group";
  settings.objective.advantages.bootstrap_truncated = true;
  Result<PreparedBatch> batch = PrepareBatch(*model, nullptr, {group}, settings);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  ASSERT_EQ(batch->trajectories.size(), 3u);
  for (const TrainingTrajectory& t : batch->trajectories) {
    ASSERT_FALSE(t.excluded) << t.excluded_reason;
    ASSERT_FALSE(t.returns.empty());
  }
  // outcome_group's returns are the members' scores: the turn-limited member failed (no outcome
  // paid), the length-cut one is scored by its value at the cut.
  const TrainingTrajectory& turns = batch->trajectories[1];
  const TrainingTrajectory& length = batch->trajectories[2];
  ASSERT_NE(turns.scores.final_value, 0.0f);
  EXPECT_EQ(turns.returns.front(), 0.0f);
  EXPECT_FLOAT_EQ(length.returns.front(), length.scores.final_value);
}

// A routing record of every position (coverage all) in the model's shape: experts routing
// replay can force, though not the ones the model would choose.
void RouteEveryPosition(schema::SegmentData& s, const ModelConfig& config) {
  int64_t layers = 0;
  for (int64_t layer = 0; layer < config.layers; ++layer) layers += config.IsMoeLayer(layer);
  const int64_t k = config.feed_forward.experts_per_token;
  const int64_t experts = config.feed_forward.routed_experts;
  s.routing.layers = static_cast<uint16_t>(layers);
  s.routing.top_k = static_cast<uint16_t>(k);
  s.routing.coverage = schema::RoutingCoverage::kAll;
  s.routing.mask.clear();
  s.routing.experts.clear();
  s.routing.context_experts.clear();
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const int64_t position = static_cast<int64_t>(s.token_begin + i);
    std::vector<uint16_t>& to =
        schema::IsAction(s.roles[i]) ? s.routing.experts : s.routing.context_experts;
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int64_t j = 0; j < k; ++j) {
        to.push_back(static_cast<uint16_t>((position * 3 + layer + j) % experts));
      }
    }
  }
}

// The value head at every position of the joined trajectory, from one Model::Forward over all of
// it (the training path, not the scoring pass's chunks), with the stored experts forced or not.
std::vector<double> ForwardValues(const Model& model, const std::vector<schema::SegmentData>& t,
                                  bool replay) {
  std::vector<int64_t> tokens;
  std::vector<std::vector<int64_t>> rows;  // per layer, (position, j) flattened
  const int64_t layers = t.front().routing.layers, k = t.front().routing.top_k;
  rows.resize(layers);
  for (const schema::SegmentData& s : t) {
    tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    const std::vector<uint16_t> experts = schema::ExpertsByPosition(s, nullptr);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      for (int64_t layer = 0; layer < layers; ++layer) {
        for (int64_t j = 0; j < k; ++j) rows[layer].push_back(experts[(i * layers + layer) * k + j]);
      }
    }
  }
  const int64_t length = static_cast<int64_t>(tokens.size());
  at::NoGradGuard no_grad;
  ModelInput input;
  input.tokens = at::tensor(tokens, at::kLong).view({1, length});
  RoutingRecord record;
  for (const std::vector<int64_t>& layer : rows) {
    record.layers.push_back({at::tensor(layer, at::kLong).view({1, length, k}), at::Tensor()});
  }
  ForwardOptions options;
  options.compute_values = true;
  if (replay) options.replay_routing = &record;
  Result<ForwardOutput> out = model.Forward(input, options);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return {};
  const at::Tensor values = out->values[0].to(at::kDouble).contiguous();
  return std::vector<double>(values.data_ptr<double>(), values.data_ptr<double>() + length);
}

// Scoring and the estimator together, against a value function computed outside the scoring
// pass: process GAE bootstraps a trajectory its token limit cut from the value of the state after
// its last step (read at the step's last token), with routing replay and without. The trajectory
// ends in two tool-call tokens of a turn no step closed: the value after them (where both modes
// read it before) is another state, and would move every step's advantage and return.
TEST(PrepareBatch, TheBootstrapIsTheValueAfterTheLastStepWithOrWithoutReplay) {
  auto model = TinyModel();
  ASSERT_NE(model, nullptr);
  // Steps end at 128 and 258 (test_segments.h); positions 258 and 259 are tool-call tokens.
  SampledGroup group;
  group.members.push_back(Trajectory(0, 2, 130));
  std::vector<schema::SegmentData>& t = group.members[0];
  t.back().end_reason = schema::EndReason::kTruncatedLength;
  for (schema::SegmentData& s : t) RouteEveryPosition(s, model->config());
  StepSettings settings = Settings(64, true);
  settings.objective.advantages.estimator = "process_gae";
  settings.objective.advantages.gamma = 0.9;
  settings.objective.advantages.lambda = 0.8;
  settings.objective.advantages.normalize_in_group = false;
  settings.objective.advantages.bootstrap_truncated = true;
  settings.reward.step_weight = 0;  // rewards 0: the returns are the values' alone
  for (bool replay : {false, true}) {
    SCOPED_TRACE(replay ? "routing replay" : "own routing");
    settings.scoring.replay_routing = replay;
    Result<PreparedBatch> batch = PrepareBatch(*model, nullptr, {group}, settings);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    const TrainingTrajectory& scored = batch->trajectories.at(0);
    ASSERT_FALSE(scored.excluded) << scored.excluded_reason;
    EXPECT_EQ(scored.prepared.replaying, replay);
    const schema::StoredTrajectory& joined = scored.prepared.joined;
    ASSERT_EQ(joined.steps.size(), 2u);
    ASSERT_EQ(joined.steps.back().end, 258u);
    ASSERT_EQ(joined.tokens.size(), 260u);
    ASSERT_TRUE(schema::IsAction(joined.roles[259]));

    const std::vector<double> v = ForwardValues(*model, t, replay);
    ASSERT_EQ(v.size(), 260u);
    // The state after the last step, and the one after the unclosed turn, differ.
    ASSERT_GT(std::abs(v[257] - v[259]), 1e-3);
    EXPECT_NEAR(scored.scores.final_value, v[257], 1e-4);
    // V_k at the position step k's first action was sampled from.
    std::vector<double> step_value;
    for (const schema::StoredStep& step : joined.steps) {
      uint64_t first = step.begin;
      while (!schema::IsAction(joined.roles[first])) ++first;
      step_value.push_back(v[first - 1]);
    }
    const double gamma = 0.9, lambda = 0.8;
    const double delta1 = gamma * v[257] - step_value[1];
    const double delta0 = gamma * step_value[1] - step_value[0];
    const std::vector<double> advantage = {delta0 + gamma * lambda * delta1, delta1};
    ASSERT_EQ(scored.advantages.size(), scored.prepared.positions.size());
    for (size_t i = 0; i < scored.prepared.positions.size(); ++i) {
      const uint64_t p = static_cast<uint64_t>(scored.prepared.positions[i]);
      const size_t k = p < joined.steps[0].end ? 0 : 1;
      if (p >= joined.steps[1].end) {  // no step: no advantage
        EXPECT_EQ(scored.advantages[i], 0.0f) << p;
        continue;
      }
      EXPECT_NEAR(scored.advantages[i], advantage[k], 1e-4) << p;
      EXPECT_NEAR(scored.returns[i], advantage[k] + step_value[k], 1e-4) << p;
    }
  }
}

TEST(ScoreTrajectory, TheReferenceIsScoredOnTheFullDistribution) {
  auto model = TinyModel();
  ASSERT_NE(model, nullptr);
  // The same tokens sampled under a tight truncation (top_k 2, top_p 0.5) and untruncated, both
  // at temperature 0.8: the stored tokens are mostly outside the truncated support.
  std::vector<schema::SegmentData> truncated = Trajectory(0, 2, 130);
  std::vector<schema::SegmentData> untruncated = truncated;
  for (schema::SegmentData& s : truncated) {
    s.temperature = 0.8f;
    s.top_k = 2;
    s.top_p = 0.5f;
  }
  for (schema::SegmentData& s : untruncated) s.temperature = 0.8f;
  ScoringOptions options;
  options.replay_routing = false;
  options.values = false;
  options.full_logprobs = true;
  Result<TrajectoryScores> cut = ScoreTrajectory(*model, truncated, options, model.get());
  Result<TrajectoryScores> full = ScoreTrajectory(*model, untruncated, options, nullptr);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_EQ(cut->reference_logprobs.size(), full->logprobs.size());
  ASSERT_FALSE(full->logprobs.empty());
  int64_t outside = 0;
  for (size_t i = 0; i < full->logprobs.size(); ++i) {
    // The policy's own log-probs keep the actor's truncation...
    if (std::isinf(cut->logprobs[i])) ++outside;
    // ...the reference's are the whole temperature-scaled distribution's.
    ASSERT_TRUE(std::isfinite(cut->reference_logprobs[i])) << i;
    EXPECT_NEAR(cut->reference_logprobs[i], full->logprobs[i], 1e-6) << i;
    // The policy's full log-probs (the implicit rewards' side) are the same distribution's.
    EXPECT_NEAR(cut->full_logprobs[i], full->logprobs[i], 1e-6) << i;
  }
  EXPECT_GT(outside, 0);
}

TEST(PrepareBatch, SegmentsThatDoNotJoinAreAnError) {
  auto model = TinyModel();
  ASSERT_NE(model, nullptr);
  SampledGroup group;
  std::vector<schema::SegmentData> broken = Trajectory(0, 3, 130);
  broken.erase(broken.begin() + 1);  // a gap
  group.members.push_back(broken);
  Result<PreparedBatch> batch = PrepareBatch(*model, nullptr, {group}, Settings(64, true));
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kInvalidArgument) << batch.status().ToString();
}

}  // namespace
}  // namespace strider::rl
