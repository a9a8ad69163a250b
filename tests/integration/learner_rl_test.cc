// The RL learner as a real process (`strider learner` with mode: rl) against a real replay server
// process holding trajectories a real actor process played: it trains, publishes versions a
// subscriber can load, writes the metrics it documents, resumes from a checkpoint to exactly the
// weights of an uninterrupted run while publishing above every version it published before, and
// never trains on trajectories whose log-probs its weights do not reproduce.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/model/model.h"
#include "common/transport/weight_stream.h"
#include "tests/integration/child_process.h"
#include "tests/integration/rl_fixture.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::PlayEpisodes;
using strider::testing::ReadFile;
using strider::testing::ReadMetrics;
using strider::testing::WaitEvent;
using strider::testing::WriteLearnerConfig;

// A group table that keeps everything sampleable (no staleness bound): these tests replay a
// fixed set of version-0 trajectories.
constexpr char kReplayConfig[] =
    "server: {stats_interval_s: 0}\n"
    "tables:\n  - name: groups\n    unit: group\n    sampler: fifo\n"
    "    capacity: 1000\n    rate_limiter: {min_fill: 1, max_times_sampled: 1}\n";

struct LearnerRun {
  int exit_code = -1;
  nlohmann::json finished;
  std::vector<uint64_t> fetched_versions;  // what a subscriber got while it ran
};

LearnerRun RunLearner(const std::vector<std::string>& args, bool subscribe) {
  LearnerRun run;
  ChildProcess learner;
  std::vector<std::string> argv = {StriderBinary(), "learner"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--publish", "tcp://127.0.0.1:0"});
  EXPECT_TRUE(learner.Start(argv));
  nlohmann::json ready = WaitEvent(learner, "ready", 60000);
  EXPECT_TRUE(ready.is_object()) << "no ready line from the learner";
  if (!ready.is_object()) return run;
  std::atomic<bool> done{false};
  std::thread subscriber;
  if (subscribe) {
    subscriber = std::thread([&] {
      auto model_config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
      transport::WeightSubscriberOptions options;
      options.endpoint = ready["weights"];
      options.reply_timeout = milliseconds(500);
      auto client = transport::WeightSubscriber::Connect(options);
      if (!client.ok() || !model_config.ok()) return;
      uint64_t have = 0;
      while (!done.load()) {
        auto update = (*client)->FetchNewer(have);
        if (update.ok() && update->has_value()) {
          have = (*update)->version;
          // What an actor does with it: the bytes load as the model.
          if (Model::LoadFromBytes(*model_config, (*update)->bytes).ok()) {
            run.fetched_versions.push_back(have);
          }
        }
        std::this_thread::sleep_for(milliseconds(20));
      }
    });
  }
  run.finished = WaitEvent(learner, "finished", 240000);
  run.exit_code = learner.Wait();
  done.store(true);
  if (subscriber.joinable()) subscriber.join();
  return run;
}

class LearnerProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoints_ =
        strider::testing::StartReplayServer(server_, dir_.Sub("db"), dir_.Sub("replay.yaml"),
                                            kReplayConfig);
    ASSERT_FALSE(endpoints_.actor.empty());
    ASSERT_NO_FATAL_FAILURE(PlayEpisodes(dir_, endpoints_.actor, 48));
  }
  void TearDown() override {
    server_.Signal(SIGTERM);
    EXPECT_EQ(server_.Wait(), 0);
  }

  TempDir dir_;
  ChildProcess server_;
  strider::testing::ReplayEndpoints endpoints_;
};

TEST_F(LearnerProcess, TrainsPublishesAndResumesToTheSameWeights) {
  const std::string config = WriteLearnerConfig(dir_, "learner.yaml");
  const std::string run_dir = dir_.Sub("run");
  LearnerRun first = RunLearner(
      {"--config", config, "--run-dir", run_dir, "--replay", endpoints_.learner}, true);
  ASSERT_EQ(first.exit_code, 0);
  ASSERT_TRUE(first.finished.is_object());
  EXPECT_EQ(first.finished["total_steps"], 4);
  EXPECT_EQ(first.finished["policy_version"], 4);
  EXPECT_FALSE(first.fetched_versions.empty()) << "no published version reached a subscriber";
  for (size_t i = 1; i < first.fetched_versions.size(); ++i) {
    EXPECT_GT(first.fetched_versions[i], first.fetched_versions[i - 1]);
  }

  std::vector<nlohmann::json> metrics = ReadMetrics(run_dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 4u);
  for (size_t i = 0; i < metrics.size(); ++i) {
    const nlohmann::json& m = metrics[i];
    for (const char* key :
         {"time", "role", "step", "policy_version", "reward_mean", "success_rate",
          "logprob_mismatch_max", "kl", "clip_fraction", "entropy", "value_loss",
          "staleness_mean", "max_violation", "tokens_per_second", "publish_seconds"}) {
      EXPECT_TRUE(m.contains(key)) << "metrics line " << i << " lacks " << key;
    }
    EXPECT_EQ(m["role"], "learner");
    EXPECT_EQ(m["step"], i + 1);
    EXPECT_EQ(m["policy_version"], i + 1);
    EXPECT_EQ(m["trained_trajectories"], 8) << "two groups of four, none excluded";
    EXPECT_EQ(m["updates"], 4) << "two epochs of two mini-batches";
    EXPECT_GT(m["entropy"].get<double>(), 0);
  }
  // Step 1 scores version-0 trajectories with the version-0 weights: the check is measured
  // and passes; later steps' trajectories are older than the weights and are not compared.
  ASSERT_TRUE(metrics[0]["logprob_mismatch_max"].is_number());
  EXPECT_LE(metrics[0]["logprob_mismatch_max"].get<double>(), 1e-5);
  EXPECT_EQ(metrics[0]["staleness_mean"], 0);
  EXPECT_EQ(metrics[3]["staleness_mean"], 3);
  EXPECT_EQ(ReadFile(run_dir + "/published_version"), "4\n");

  const std::string uninterrupted = ReadFile(run_dir + "/checkpoints/final/model.safetensors");
  ASSERT_FALSE(uninterrupted.empty());

  // Resume from the step-2 checkpoint: the server answers steps 3 and 4 with what it answered
  // before, and the generator and optimiser continue from where they were saved.
  LearnerRun resumed =
      RunLearner({"--config", config, "--run-dir", run_dir, "--replay", endpoints_.learner,
                  "--resume", run_dir + "/checkpoints/latest"},
                 false);
  ASSERT_EQ(resumed.exit_code, 0);
  EXPECT_EQ(resumed.finished["steps"], 2);
  EXPECT_EQ(resumed.finished["total_steps"], 4);
  EXPECT_EQ(ReadFile(run_dir + "/checkpoints/final/model.safetensors"), uninterrupted)
      << "a resumed run ended on other weights than the uninterrupted one";
  // Versions above everything published before: its own weights at once (5), then one per step.
  metrics = ReadMetrics(run_dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 6u);
  EXPECT_EQ(metrics[4]["step"], 3);
  EXPECT_EQ(metrics[4]["policy_version"], 6);
  EXPECT_EQ(metrics[5]["policy_version"], 7);
  EXPECT_EQ(resumed.finished["policy_version"], 7);
  EXPECT_EQ(ReadFile(run_dir + "/published_version"), "7\n");
}

TEST_F(LearnerProcess, TrajectoriesItsWeightsDoNotReproduceAreExcludedNotTrained) {
  // Weights from another seed than the actor's: every version-0 trajectory fails the check.
  const std::string config = WriteLearnerConfig(dir_, "other.yaml", "", /*init_seed=*/5);
  const std::string run_dir = dir_.Sub("run-other");
  LearnerRun run = RunLearner({"--config", config, "--run-dir", run_dir, "--replay",
                               endpoints_.learner, "--max-steps", "2"},
                              false);
  ASSERT_EQ(run.exit_code, 0);
  EXPECT_EQ(run.finished["excluded_trajectories"], 16);
  for (const nlohmann::json& m : ReadMetrics(run_dir + "/metrics.jsonl")) {
    EXPECT_EQ(m["trained_trajectories"], 0);
    EXPECT_EQ(m["mismatch_excluded"], 8);
    EXPECT_GT(m["logprob_mismatch_max"].get<double>(), 1e-3);
    EXPECT_EQ(m["updates"], 0);
    EXPECT_EQ(m["policy_version"], 0) << "nothing trained, nothing new to publish";
  }
}

// The lines of a step dump, parsed.
std::vector<nlohmann::json> ReadDump(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// A number of the dump, or NaN for null (not finite, not measured).
double Value(const nlohmann::json& value) {
  return value.is_number() ? value.get<double>() : std::nan("");
}

// One step's dump recomputed from its per-token lines alone, with the clipped policy loss,
// truncated importance weights, k3 KL, entropy and value loss written out as
// docs/rl_objective.md states them: every figure must match the dump's totals, and those the
// step's metrics line `m`, within 1e-6.
void CheckDump(const std::string& path, const nlohmann::json& m, int64_t step) {
  SCOPED_TRACE("step " + std::to_string(step));
  const std::vector<nlohmann::json> dump = ReadDump(path);
  ASSERT_EQ(dump.size(), 9u) << "eight trajectories and the totals";
  const nlohmann::json& totals = dump.back();
  ASSERT_EQ(totals["type"], "totals");
  ASSERT_EQ(totals["step"], step);
  const nlohmann::json& objective = totals["objective"];
  ASSERT_EQ(objective["aggregation"], "token_mean");
  ASSERT_EQ(objective["kl_estimator"], "k3+");
  ASSERT_EQ(objective["sequence_ratio"], "off");
  ASSERT_FALSE(objective["token_mask"].get<bool>());
  ASSERT_TRUE(objective["truncated_importance"].get<bool>());
  ASSERT_EQ(objective["dual_clip"], 0.0);
  ASSERT_EQ(objective["value_clip"], 0.0);
  const double eps_low = objective["eps_low"], eps_high = objective["eps_high"];
  const double cap = objective["importance_cap"], kl_coef = objective["kl_coef"];
  const double entropy_coef = objective["entropy_coef"], value_coef = objective["value_coef"];

  // One token's terms in one pass.
  struct Term {
    int64_t update;
    double current, proximal, behaviour, reference, advantage, ret, importance, mask, weight,
        entropy, value;
  };
  std::vector<Term> terms;
  int64_t action_tokens = 0;
  for (size_t l = 0; l + 1 < dump.size(); ++l) {
    const nlohmann::json& t = dump[l];
    ASSERT_EQ(t["type"], "trajectory");
    ASSERT_EQ(t["step"], step);
    ASSERT_FALSE(t["excluded"].get<bool>()) << t["excluded_reason"];
    const nlohmann::json& tokens = t["tokens"];
    const nlohmann::json& passes = t["passes"];
    ASSERT_EQ(passes.size(), 2u) << "one pass per epoch";
    ASSERT_EQ(tokens.size(), t["action_tokens"].get<size_t>());
    ASSERT_FALSE(tokens.empty());
    action_tokens += static_cast<int64_t>(tokens.size());
    for (size_t p = 0; p < passes.size(); ++p) {
      EXPECT_EQ(passes[p]["epoch"], p);
      for (size_t i = 0; i < tokens.size(); ++i) {
        const nlohmann::json& token = tokens[i];
        // Later passes carry their own per-token columns; the first is in the tokens.
        auto pick = [&](const char* key) {
          return p == 0 ? Value(token[key]) : Value(passes[p][key][i]);
        };
        Term term{passes[p]["update"], pick("current"), Value(token["proximal"]),
                  Value(token["behaviour"]), Value(token["reference"]),
                  Value(token["advantage"]), Value(token["return"]),
                  pick("importance_weight"), pick("mask"), pick("loss_weight"),
                  pick("entropy"), pick("current_value")};
        for (double v : {term.current, term.proximal, term.behaviour, term.reference,
                         term.advantage, term.ret, term.importance, term.weight, term.entropy,
                         term.value}) {
          ASSERT_TRUE(std::isfinite(v)) << "trajectory " << l << " token " << i;
        }
        EXPECT_EQ(token["version"], 0);
        EXPECT_LT(token["position"].get<int64_t>(), t["length"].get<int64_t>());
        // The truncated importance weight of the proximal over the behaviour policy.
        EXPECT_NEAR(term.importance, std::min(std::exp(term.proximal - term.behaviour), cap),
                    1e-6);
        EXPECT_EQ(term.mask, 1.0) << "nothing masked without IcePop or MIS";
        terms.push_back(term);
      }
    }
  }
  EXPECT_EQ(action_tokens, m["action_tokens"].get<int64_t>());
  EXPECT_EQ(totals["dumped_action_tokens"], action_tokens);

  // Token-mean aggregation: every token of an update weighs 1 / that update's action tokens.
  std::map<int64_t, int64_t> tokens_of;
  for (const Term& term : terms) ++tokens_of[term.update];
  ASSERT_EQ(static_cast<int64_t>(tokens_of.size()), m["updates"].get<int64_t>());
  std::map<int64_t, double> policy, kl, entropy, value;
  double clipped = 0, approx_kl = 0, kl_sum = 0, entropy_sum = 0, importance_sum = 0;
  for (const Term& term : terms) {
    EXPECT_NEAR(term.weight, 1.0 / static_cast<double>(tokens_of[term.update]), 1e-9);
    const double ratio = std::exp(term.current - term.proximal);
    const double unclipped = -term.advantage * ratio;
    const double clipped_term =
        -term.advantage * std::clamp(ratio, 1.0 - eps_low, 1.0 + eps_high);
    policy[term.update] +=
        term.weight * term.mask * term.importance * std::max(unclipped, clipped_term);
    clipped += clipped_term > unclipped;
    approx_kl += ratio - 1 - std::log(ratio);
    const double d = term.reference - term.current;
    const double k3 = std::exp(d) - d - 1;
    kl[term.update] += term.weight * k3;
    kl_sum += k3;
    entropy[term.update] += term.weight * term.entropy;
    entropy_sum += term.entropy;
    value[term.update] += term.weight * 0.5 * (term.value - term.ret) * (term.value - term.ret);
    importance_sum += term.importance;
  }
  const double updates = static_cast<double>(tokens_of.size());
  double policy_loss = 0, value_loss = 0, loss = 0;
  for (const auto& [update, count] : tokens_of) {
    policy_loss += policy[update] / updates;
    value_loss += value[update] / updates;
    loss += (policy[update] + kl_coef * kl[update] - entropy_coef * entropy[update] +
             value_coef * value[update]) / updates;
  }
  const double n = static_cast<double>(terms.size());
  const std::map<std::string, double> recomputed = {
      {"policy_loss", policy_loss},          {"value_loss", value_loss},
      {"loss", loss},                        {"kl", kl_sum / n},
      {"entropy", entropy_sum / n},          {"importance_mean", importance_sum / n},
      {"clip_fraction", clipped / n},        {"approx_kl", approx_kl / n}};
  for (const auto& [key, expected] : recomputed) {
    ASSERT_TRUE(m[key].is_number()) << key;
    EXPECT_EQ(totals[key], m[key]) << key;
    EXPECT_NEAR(m[key].get<double>(), expected, 1e-6) << key;
  }
  for (const char* key : {"updates", "trajectories", "trained_trajectories", "tokens",
                          "action_tokens", "policy_version"}) {
    EXPECT_EQ(totals[key], m[key]) << key;
  }
  // Not a recomputation of zeros: the step has a policy gradient, clipped tokens and (past the
  // first epoch) a KL.
  EXPECT_GT(std::abs(policy_loss), 1e-4);
  EXPECT_GT(clipped, 0);
  EXPECT_GT(kl_sum, 0);
}

// The step dump of the real binary against replay, recomputed (CheckDump) for step 1, where
// the weights are the actor's, and for step 2, whose version-0 trajectories the learner scores
// with version-1 weights: there proximal and behaviour differ, and a cap of 1.01 truncates some
// importance weights. Two epochs of two mini-batches, so four updates' passes and their
// averaging are checked too; process GAE for advantages on every token.
TEST_F(LearnerProcess, TheStepDumpRecomputesToTheMetricsLine) {
  strider::testing::LearnerConfigText text;
  text.train = "{steps: 2, ppo_epochs: 2, minibatches: 2, chunk_tokens: 64}";
  text.advantages = "{estimator: process_gae, gamma: 0.9, lambda: 0.95}";
  text.policy =
      "{entropy_coef: 0.001, kl_coef: 0.05, eps_low: 0.02, eps_high: 0.02, importance_cap: 1.01}";
  const std::string config = WriteLearnerConfig(dir_, "dump.yaml", text);
  const std::string run_dir = dir_.Sub("run-dump");
  const std::string dump_dir = dir_.Sub("dump");
  LearnerRun run = RunLearner({"--config", config, "--run-dir", run_dir, "--replay",
                               endpoints_.learner, "--dump-step", "1", "--dump-step", "2",
                               "--dump-dir", dump_dir},
                              false);
  ASSERT_EQ(run.exit_code, 0);
  const std::vector<nlohmann::json> metrics = ReadMetrics(run_dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  CheckDump(dump_dir + "/step-1.jsonl", metrics[0], 1);
  CheckDump(dump_dir + "/step-2.jsonl", metrics[1], 2);
  // Step 2 trains on trajectories of the version before: the weights move off 1.
  const std::vector<nlohmann::json> second = ReadDump(dump_dir + "/step-2.jsonl");
  int64_t capped = 0;
  for (size_t l = 0; l + 1 < second.size(); ++l) {
    for (const nlohmann::json& token : second[l]["tokens"]) {
      capped += std::abs(Value(token["importance_weight"]) - 1.01) < 1e-6;
    }
  }
  EXPECT_GT(capped, 0) << "no importance weight reached the cap";
  EXPECT_NE(metrics[1]["importance_mean"].get<double>(), 1.0);
}

TEST(LearnerCli, ABadDumpStepOrDirIsRefused) {
  TempDir dir;
  const std::string config = WriteLearnerConfig(dir, "learner.yaml");
  std::ofstream(dir.Sub("file")) << "not a directory";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--dump-step 0 --dump-dir " + dir.Sub("d"), "--dump-step '0'"},
      {"--dump-step 1,x --dump-dir " + dir.Sub("d"), "--dump-step '1,x'"},
      {"--dump-step 5 --dump-dir " + dir.Sub("d"), "the run has 4 steps"},
      {"--dump-step 1", "--dump-step needs --dump-dir"},
      {"--dump-dir " + dir.Sub("d"), "--dump-dir needs --dump-step"},
      {"--dump-step 1 --dump-dir " + dir.Sub("file"), "not a writable directory"},
  };
  for (const auto& [flags, message] : refused) {
    strider::testing::RunResult run = strider::testing::RunCommand(
        {"/bin/sh", "-c", StriderBinary() + " learner --config " + config + " " + flags + " 2>&1"});
    EXPECT_EQ(run.exit_code, 2) << flags << ": " << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << flags << ": " << run.output;
  }
}

TEST(LearnerCli, ABrokenRlConfigIsRefusedNamingTheKey) {
  TempDir dir;
  const std::string config =
      WriteLearnerConfig(dir, "bad.yaml", "scoring: {mismatch_treshold: 0.001}\n");
  strider::testing::RunResult run = strider::testing::RunCommand(
      {"/bin/sh", "-c", StriderBinary() + " learner --config " + config + " 2>&1"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("scoring.mismatch_treshold"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("mismatch_threshold"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("bad.yaml"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace strider
