// PRIME's implicit PRM (learner/rl/implicit_prm.h) and its advantages: the cross-entropy loss
// and its gradient against hand values and finite differences, the leave-one-out baseline on a
// hand example, a policy's drift no longer rewarded (two failed trajectories), the checkpoint
// round trip, and the reward model moving with each update.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "learner/checkpoint.h"
#include "learner/rl/advantages.h"
#include "learner/rl/implicit_prm.h"
#include "learner/rl/rl_step.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"
#include "tests/shipped_config.h"

namespace strider::rl {
namespace {

using strider::testing::MakeSegment;

ModelConfig Tiny() { return strider::testing::ShippedModelConfig("tiny"); }

// One segment of 130 tokens (one step, about 100 action tokens) ending with `outcome`.
std::vector<schema::SegmentData> Trajectory(uint64_t seed, float outcome) {
  schema::SegmentData s = MakeSegment(seed, 0, 130, /*policy_version=*/3, /*is_last=*/true);
  s.temperature = 1.0f;
  s.top_p = 0.9f;  // the reward model reads the full distribution whatever the sampler's cut
  s.top_k = 0;
  s.policy_runs = {{0, 3}};
  s.outcome_reward = outcome;
  return {s};
}

PreparedTrajectory Prepare(uint64_t seed, float outcome) {
  Result<PreparedTrajectory> prepared =
      PrepareTrajectory(Trajectory(seed, outcome), /*replay_routing=*/false, Tiny().vocabulary);
  EXPECT_TRUE(prepared.ok()) << prepared.status().ToString();
  return std::move(*prepared);
}

ImplicitPrmOptions Options() {
  ImplicitPrmOptions options;
  options.config.beta = 0.05;
  options.config.optimizer.learning_rate = 1e-2;
  options.chunk_tokens = 512;  // one chunk: the gradient is exact
  options.policy_init_seed = 0;
  return options;
}

std::unique_ptr<ImplicitPrm> MakePrm(const ImplicitPrmOptions& options = Options(),
                                     const std::string& checkpoint = "") {
  Result<std::unique_ptr<ImplicitPrm>> prm = ImplicitPrm::Create(Tiny(), options, checkpoint);
  EXPECT_TRUE(prm.ok()) << prm.status().ToString();
  return prm.ok() ? std::move(*prm) : nullptr;
}

// Two trajectories (labels 1 and 0) with reference log-probs a little off the model's own, so
// the summed log-ratios are not 0.
struct Samples {
  std::vector<PreparedTrajectory> trajectories;
  std::vector<std::vector<float>> reference;
  std::vector<ImplicitPrmSample> samples;

  explicit Samples(const ImplicitPrm& prm) {
    trajectories.push_back(Prepare(0, 1.0f));
    trajectories.push_back(Prepare(1, 0.0f));
    for (size_t m = 0; m < trajectories.size(); ++m) {
      Result<std::vector<float>> own = prm.LogProbs(trajectories[m]);
      EXPECT_TRUE(own.ok()) << own.status().ToString();
      std::vector<float> ref = *own;
      for (size_t i = 0; i < ref.size(); ++i) ref[i] += 0.3f * static_cast<float>(i % 5) - 0.5f;
      reference.push_back(std::move(ref));
    }
    for (size_t m = 0; m < trajectories.size(); ++m) {
      samples.push_back({.trajectory = &trajectories[m],
                         .reference_logprobs = reference[m],
                         .label = m == 0 ? 1.0 : 0.0});
    }
  }
};

TEST(ImplicitPrmLoss, CrossEntropyOfTheSigmoidAndItsSlopeByHand) {
  // beta s = 1: CE = log(1 + e) for a failure, log(1 + e^-1) for a success.
  EXPECT_NEAR(ImplicitPrmLoss(20.0, 0.0, 0.05), std::log(1 + std::exp(1.0)), 1e-12);
  EXPECT_NEAR(ImplicitPrmLoss(20.0, 1.0, 0.05), std::log(1 + std::exp(-1.0)), 1e-12);
  // At s = 0 the model is the reference: log 2 whatever the label.
  EXPECT_NEAR(ImplicitPrmLoss(0.0, 0.0, 0.05), std::log(2.0), 1e-12);
  EXPECT_NEAR(ImplicitPrmLoss(0.0, 1.0, 0.05), std::log(2.0), 1e-12);
  // Large logits stay finite (no log of 0).
  EXPECT_NEAR(ImplicitPrmLoss(-2e4, 1.0, 0.05), 1e3, 1e-9);
  // d CE / d s = beta (sigma(beta s) - y), against central differences.
  for (const double s : {-30.0, -2.0, 0.0, 7.5, 40.0}) {
    for (const double y : {0.0, 0.3, 1.0}) {
      const double h = 1e-5;
      const double numeric =
          (ImplicitPrmLoss(s + h, y, 0.05) - ImplicitPrmLoss(s - h, y, 0.05)) / (2 * h);
      EXPECT_NEAR(ImplicitPrmLossSlope(s, y, 0.05), numeric, 1e-8) << s << " " << y;
    }
  }
  EXPECT_NEAR(ImplicitPrmLossSlope(20.0, 0.0, 0.05), 0.05 / (1 + std::exp(-1.0)), 1e-12);
}

TEST(ImplicitPrm, GradientIsTheLossGradientByFiniteDifferences) {
  std::unique_ptr<ImplicitPrm> prm = MakePrm();
  ASSERT_NE(prm, nullptr);
  Samples data(*prm);
  Result<double> loss = prm->AccumulateGradients(data.samples);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  Result<double> plain = prm->Loss(data.samples);
  ASSERT_TRUE(plain.ok());
  EXPECT_NEAR(*loss, *plain, 1e-9);
  // Directional derivatives of the loss itself, by central differences over every parameter at
  // once (single entries are within fp32 noise of a 100-token sum): along the gradient (it must
  // be |g|^2 / |g| = |g|) and along a random direction r (g . r).
  std::vector<at::Tensor> params, grads;
  for (const auto& [name, tensor] : prm->model().tensors()) {
    if (!tensor.grad().defined()) continue;
    params.push_back(tensor);
    grads.push_back(tensor.grad().detach().clone());
  }
  ASSERT_FALSE(params.empty());
  double norm_squared = 0;
  for (const at::Tensor& g : grads) norm_squared += g.pow(2).sum().item<double>();
  const double norm = std::sqrt(norm_squared);
  ASSERT_GT(norm, 1e-3);
  std::vector<at::Tensor> random;
  double random_norm_squared = 0;
  for (const at::Tensor& g : grads) {
    random.push_back(at::randn_like(g));
    random_norm_squared += random.back().pow(2).sum().item<double>();
  }
  auto shift = [&](const std::vector<at::Tensor>& direction, double scale) {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      const_cast<at::Tensor&>(params[i]).add_(direction[i], scale);
    }
  };
  auto derivative = [&](const std::vector<at::Tensor>& direction, double length) {
    const double h = 1e-2 / length;  // a step of 0.01 in parameter space
    shift(direction, h);
    Result<double> up = prm->Loss(data.samples);
    shift(direction, -2 * h);
    Result<double> down = prm->Loss(data.samples);
    shift(direction, h);
    EXPECT_TRUE(up.ok() && down.ok());
    return (*up - *down) / (2 * h * length);
  };
  EXPECT_NEAR(derivative(grads, norm), norm, 0.02 * norm);
  double projected = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    projected += (grads[i] * random[i]).sum().item<double>();
  }
  const double random_norm = std::sqrt(random_norm_squared);
  EXPECT_NEAR(derivative(random, random_norm), projected / random_norm, 0.02 * norm);
}

TEST(ImplicitPrm, AnUpdateMovesEachTrajectoryTowardsItsLabel) {
  std::unique_ptr<ImplicitPrm> prm = MakePrm();
  ASSERT_NE(prm, nullptr);
  Samples data(*prm);
  // Rewards against the model's own starting weights (the reference of a fresh run) are 0.
  Result<std::vector<float>> start = prm->LogProbs(data.trajectories[0]);
  ASSERT_TRUE(start.ok());
  Result<std::vector<double>> zero = prm->TokenRewards(data.trajectories[0], *start);
  ASSERT_TRUE(zero.ok());
  for (double r : *zero) EXPECT_EQ(r, 0.0);

  auto sum = [&](size_t m) {
    Result<std::vector<double>> r = prm->TokenRewards(data.trajectories[m], data.reference[m]);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    double total = 0;
    for (double x : *r) total += x;
    return total;
  };
  const double success_before = sum(0), failure_before = sum(1);
  const at::Tensor before = prm->model().tensors().begin()->second.detach().clone();
  Result<double> loss_before = prm->Loss(data.samples);
  Result<ImplicitPrmUpdate> update = prm->Update(data.samples);
  ASSERT_TRUE(update.ok()) << update.status().ToString();
  EXPECT_EQ(update->updates, 1);
  EXPECT_EQ(update->skipped, 0);
  EXPECT_NEAR(update->loss, *loss_before, 1e-9);
  EXPECT_GT(update->gradient_norm, 0);
  // The weights moved, the success's implicit return rose, the failure's fell, the loss fell.
  EXPECT_GT((prm->model().tensors().begin()->second - before).abs().max().item<double>(), 0);
  EXPECT_GT(sum(0), success_before);
  EXPECT_LT(sum(1), failure_before);
  EXPECT_LT(*prm->Loss(data.samples), *loss_before);
}

TEST(ImplicitPrm, ACheckpointResumesToTheSameNextStepRewards) {
  std::unique_ptr<ImplicitPrm> prm = MakePrm();
  ASSERT_NE(prm, nullptr);
  Samples data(*prm);
  ASSERT_TRUE(prm->Update(data.samples).ok());
  // Written inside a learner checkpoint, as RlLearner::Checkpoint does.
  strider::testing::TempDir dir;
  const std::string checkpoint = dir.path() + "/latest";
  CheckpointState state;
  state.mode = "rl";
  state.model = Tiny().name;
  const CheckpointExtra extra = [&](const std::string& directory) {
    return prm->WriteCheckpoint(directory + "/" + kImplicitPrmCheckpoint);
  };
  ASSERT_TRUE(WriteCheckpoint(checkpoint, prm->model(), nullptr, state, extra).ok());
  std::unique_ptr<ImplicitPrm> resumed =
      MakePrm(Options(), checkpoint + "/" + kImplicitPrmCheckpoint);
  ASSERT_NE(resumed, nullptr);
  // The next step on both: the same update (weights and AdamW moments), the same rewards.
  Result<ImplicitPrmUpdate> a = prm->Update(data.samples);
  Result<ImplicitPrmUpdate> b = resumed->Update(data.samples);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss, b->loss);
  EXPECT_EQ(a->gradient_norm, b->gradient_norm);
  for (size_t m = 0; m < data.trajectories.size(); ++m) {
    Result<std::vector<double>> ra = prm->TokenRewards(data.trajectories[m], data.reference[m]);
    Result<std::vector<double>> rb =
        resumed->TokenRewards(data.trajectories[m], data.reference[m]);
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ(*ra, *rb) << m;
  }
  // A fresh model from the starting weights, given the same step, does not land there: the
  // checkpoint carried the first update and the optimiser's moments.
  std::unique_ptr<ImplicitPrm> fresh = MakePrm();
  ASSERT_TRUE(fresh->Update(data.samples).ok());
  Result<std::vector<double>> rf = fresh->TokenRewards(data.trajectories[0], data.reference[0]);
  Result<std::vector<double>> ra = prm->TokenRewards(data.trajectories[0], data.reference[0]);
  EXPECT_NE(*rf, *ra);
}

TEST(ImplicitPrm, NormalizeByLargestReturnMakesTheLargestReturnOne) {
  std::vector<std::vector<double>> rewards = {{0.5, -1.0, 2.0}, {-3.0, 0.5}};
  // Returns: (1.5, 1.0, 2.0) and (-2.5, 0.5): the largest |return| is 2.5.
  NormalizeByLargestReturn(rewards);
  const double scale = 1 / (2.5 + 1e-6);
  EXPECT_NEAR(rewards[0][2], 2.0 * scale, 1e-12);
  EXPECT_NEAR(rewards[1][0], -3.0 * scale, 1e-12);
  std::vector<std::vector<double>> zeros = {{0.0, 0.0}};
  NormalizeByLargestReturn(zeros);
  EXPECT_EQ(zeros[0][1], 0.0);
}

// RLOO by hand. Three trajectories of one step, token 0 context, tokens 1-2 actions:
//   implicit rewards (0.3, 0.1), (-0.2, 0.0), (0.4, 0.2): means 0.2, -0.1, 0.3, sum 0.4
//   r' = 1.5 r - 0.4 / 2: (0.25, -0.05), (-0.5, -0.2), (0.4, 0.1)
//   outcomes 1, 0, 0: o' = o - mean of the others = 1, -0.5, -0.5
//   A_t = sum of r' from t on + o': (1.2, 0.95), (-1.2, -0.7), (0.0, -0.4)
GroupInput HandGroup() {
  GroupInput group;
  const std::vector<std::vector<double>> rewards = {
      {0, 0.3, 0.1}, {0, -0.2, 0.0}, {0, 0.4, 0.2}};
  for (size_t i = 0; i < 3; ++i) {
    TrajectoryInput t;
    t.action = {0, 1, 1};
    t.steps = {{.begin = 0, .end = 3, .reward = 5, .value = 9}};
    t.implicit_rewards = rewards[i];
    t.outcome = i == 0 ? 1.0 : 0.0;
    t.bootstrap_value = 100;  // never read
    group.members.push_back(t);
  }
  return group;
}

TEST(ImplicitProcessAdvantages, LeaveOneOutBaselinesOnAHandExample) {
  AdvantageOptions options;
  options.estimator = "implicit_process";
  options.normalize_in_group = false;
  Result<GroupAdvantages> out = ComputeAdvantages(HandGroup(), options);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::vector<std::vector<double>> expected = {{0, 1.2, 0.95}, {0, -1.2, -0.7}, {0, 0, -0.4}};
  for (size_t i = 0; i < 3; ++i) {
    for (size_t t = 0; t < 3; ++t) {
      EXPECT_NEAR(out->members[i].advantages[t], expected[i][t], 1e-6) << i << "," << t;
    }
    EXPECT_NEAR(out->members[i].step_advantages[0], expected[i][1], 1e-6);
  }
  // A truncated member pays its outcome term (0 here), never a value-head bootstrap.
  GroupInput truncated = HandGroup();
  truncated.members[1].end = TrajectoryEnd::kTruncated;
  options.bootstrap_truncated = true;
  Result<GroupAdvantages> cut = ComputeAdvantages(truncated, options);
  ASSERT_TRUE(cut.ok());
  EXPECT_NEAR(cut->members[1].advantages[1], -1.2, 1e-6);
}

TEST(ImplicitProcessAdvantages, NormalisationWhitensTheWholeBatchsActionTokens) {
  AdvantageOptions options;
  options.estimator = "implicit_process";
  options.normalize_in_group = true;
  GroupInput other = HandGroup();
  for (TrajectoryInput& t : other.members) {
    for (double& r : t.implicit_rewards) r *= 3;
    t.outcome = 1 - t.outcome;
  }
  Result<std::vector<GroupAdvantages>> batch =
      ComputeBatchAdvantages({HandGroup(), other}, options);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  std::vector<double> all, first;
  for (size_t g = 0; g < 2; ++g) {
    for (const TrajectoryAdvantages& m : (*batch)[g].members) {
      EXPECT_EQ(m.advantages[0], 0.0f);  // context
      all.push_back(m.advantages[1]);
      all.push_back(m.advantages[2]);
      if (g == 0) first.push_back(m.advantages[1]), first.push_back(m.advantages[2]);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  double squares = 0;
  const double m = mean(all);
  for (double x : all) squares += (x - m) * (x - m);
  EXPECT_NEAR(m, 0.0, 1e-6);
  EXPECT_NEAR(std::sqrt(squares / static_cast<double>(all.size() - 1)), 1.0, 1e-5);
  // Over the batch, not per group: each token is its raw advantage standardised by the batch's
  // mean and sample standard deviation, so the first group alone is not centred.
  AdvantageOptions raw_options = options;
  raw_options.normalize_in_group = false;
  std::vector<double> raw;
  for (const GroupInput& group : {HandGroup(), other}) {
    Result<GroupAdvantages> r = ComputeAdvantages(group, raw_options);
    ASSERT_TRUE(r.ok());
    for (const TrajectoryAdvantages& m : r->members) {
      raw.push_back(m.advantages[1]);
      raw.push_back(m.advantages[2]);
    }
  }
  const double raw_mean = mean(raw);
  double raw_squares = 0;
  for (double x : raw) raw_squares += (x - raw_mean) * (x - raw_mean);
  const double raw_std = std::sqrt(raw_squares / static_cast<double>(raw.size() - 1));
  for (size_t i = 0; i < raw.size(); ++i) {
    EXPECT_NEAR(all[i], (raw[i] - raw_mean) / (raw_std + options.epsilon), 1e-5) << i;
  }
  EXPECT_GT(std::abs(mean(first)), 0.01);
}

// The example: two failed trajectories whose policy has drifted from the reference by
// summed log-ratios that differ. With the policy as its own reward model the more drifted one
// got +0.707; now the rewards come from pi_phi, which the policy's drift does not touch, and
// which learns from the two failures to lower both.
TEST(ImplicitProcessStep, TwoFailedTrajectoriesAreNotRewardedForThePolicysDrift) {
  auto reference = Model::Create(Tiny(), 0);
  auto still = Model::Create(Tiny(), 0);
  auto drifted = Model::Create(Tiny(), 5);  // far from the reference
  ASSERT_TRUE(reference.ok() && still.ok() && drifted.ok());
  SampledGroup group;
  group.group_id = strider::testing::MakeTrajectoryId(77);
  for (uint64_t seed : {0, 1}) {
    std::vector<schema::SegmentData> t = Trajectory(seed, 0.0f);
    t[0].group_id = group.group_id;
    t[0].group_size = 2;
    t[0].group_index = static_cast<uint32_t>(seed);
    group.members.push_back(t);
  }
  StepSettings settings;
  settings.scoring.replay_routing = false;
  settings.scoring.chunk_tokens = 512;
  settings.objective.advantages.estimator = "implicit_process";
  settings.objective.loss.value_coef = 0;
  settings.scoring.full_logprobs = true;  // the policy's drift, to show it is not what is paid
  ImplicitPrmOptions options = Options();
  options.config.normalize = "none";
  std::vector<std::vector<float>> advantages[2];
  std::vector<double> drift;
  for (int run = 0; run < 2; ++run) {
    const Model& policy = run == 0 ? **still : **drifted;
    std::unique_ptr<ImplicitPrm> prm = MakePrm(options);  // from the reference's weights
    settings.implicit_prm = prm.get();
    Result<PreparedBatch> batch = PrepareBatch(policy, reference->get(), {group}, settings);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    ASSERT_EQ(batch->trajectories.size(), 2u);
    // pi_phi started as pi_ref: s = 0, CE = log 2 for both before the update.
    EXPECT_NEAR(batch->implicit_prm.loss, std::log(2.0), 1e-6);
    EXPECT_EQ(batch->implicit_prm.updates, 1);
    for (const TrainingTrajectory& t : batch->trajectories) {
      ASSERT_FALSE(t.excluded) << t.excluded_reason;
      advantages[run].push_back(t.advantages);
      if (run == 1) {
        // The policy's own summed log-ratio: what the old implicit reward was.
        double s = 0;
        for (size_t i = 0; i < t.scores.full_logprobs.size(); ++i) {
          s += t.scores.full_logprobs[i] - t.scores.reference_logprobs[i];
        }
        drift.push_back(s);
      }
      // Both failures lowered pi_phi's log-ratio on their tokens.
      Result<std::vector<double>> r = prm->TokenRewards(t.prepared, t.scores.reference_logprobs);
      ASSERT_TRUE(r.ok());
      double sum = 0;
      for (double x : *r) sum += x;
      EXPECT_LT(sum, 0);
    }
  }
  ASSERT_EQ(drift.size(), 2u);
  EXPECT_GT(std::abs(drift[0] - drift[1]), 0.1);  // the drift differs between the two
  // The advantages do not depend on how far the policy drifted.
  for (size_t m = 0; m < 2; ++m) {
    ASSERT_EQ(advantages[0][m].size(), advantages[1][m].size());
    for (size_t i = 0; i < advantages[0][m].size(); ++i) {
      EXPECT_NEAR(advantages[0][m][i], advantages[1][m][i], 1e-5) << m << "," << i;
    }
  }
}

}  // namespace
}  // namespace strider::rl
