// `strider eval` as a real process on the tiny model (random weights from `strider model init`)
// and the calculator: the JSON line's fields and ranges, exact agreement of two greedy runs with
// one seed, the same result from the same weights fetched from a real WeightPublisher, pass@k
// with samples, and usage errors that exit 2 naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/transport/weight_stream.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::RunCommand;
using strider::testing::RunResult;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

constexpr int kEpisodes = 20;

class EvalCommand : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    weights_ = dir_->Sub("tiny.safetensors");
    RunResult init =
        RunCommand({StriderBinary(), "model", "init", "--config",
                    SourceDir() + "/configs/model/tiny.yaml", "--out", weights_, "--seed", "3"});
    ASSERT_EQ(init.exit_code, 0) << init.output;
    // The actor config as training would use it, replay section included: eval ignores it.
    config_ = dir_->Sub("actor.yaml");
    std::ofstream(config_) << "actor:\n"
                           << "  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
                           << "  threads: 2\n  episodes: 32\n  episodes_in_flight: 20\n"
                           << "  group_size: 4\n  max_turns: 2\n  max_episode_tokens: 1024\n"
                           << "  seed: 11\n"
                           << "  sampling: {temperature: 1.0, max_new_tokens: 32}\n"
                           << "  engine: {cache_budget_mb: 64}\n"
                           << "  replay: {endpoint: tcp://127.0.0.1:1, spill_dir: /nonexistent}\n"
                           << "  metrics: {interval_s: 100, progress: false}\n"
                           << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // `strider eval --config <config> ARGS` with stderr folded into the output.
  static RunResult Eval(const std::vector<std::string>& args, const std::string& config = "") {
    std::string command = StriderBinary() + " eval --config " + (config.empty() ? config_ : config);
    for (const std::string& a : args) command += " '" + a + "'";
    return RunCommand({"/bin/sh", "-c", command + " 2>&1"});
  }

  // The one line of a --json run, parsed; fails the test unless stdout is exactly one line.
  static nlohmann::json Line(const RunResult& run) {
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
    nlohmann::json j = nlohmann::json::parse(run.output, nullptr, false);
    EXPECT_TRUE(j.is_object()) << run.output;
    return j.is_object() ? j : nlohmann::json::object();
  }

  // What two runs of the same policy on the same problems must share exactly.
  static void ExpectSameOutcome(const nlohmann::json& a, const nlohmann::json& b) {
    for (const char* key : {"episodes", "samples", "success_rate", "ci_low", "ci_high",
                            "reward_mean", "mean_turns", "seed", "endings", "digest"}) {
      EXPECT_EQ(a[key], b[key]) << key << ": " << a.dump() << " vs " << b.dump();
    }
  }

  static TempDir* dir_;
  static std::string weights_;
  static std::string config_;
};

TempDir* EvalCommand::dir_ = nullptr;
std::string EvalCommand::weights_;
std::string EvalCommand::config_;

TEST_F(EvalCommand, GreedyRunReportsTheContractLineAndRepeatsExactly) {
  const std::string out = dir_->Sub("eval.jsonl");
  const auto started = std::chrono::steady_clock::now();
  RunResult first = Eval({"--weights", weights_, "--episodes", std::to_string(kEpisodes), "--seed",
                          "5", "--json", "--out", out});
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const nlohmann::json j = Line(first);
  EXPECT_EQ(j["event"], "eval");
  EXPECT_EQ(j["env"], "calculator");
  EXPECT_EQ(j["policy_version"], 0);
  EXPECT_EQ(j["weights"], weights_);
  EXPECT_EQ(j["episodes"], kEpisodes);
  EXPECT_EQ(j["samples"], 1);
  EXPECT_EQ(j["seed"], 5);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_FALSE(j.contains("pass_at_k")) << "pass@k only with samples > 1";
  const double p = j["success_rate"], lo = j["ci_low"], hi = j["ci_high"];
  EXPECT_GE(p, 0.0);
  EXPECT_LE(p, 1.0);
  EXPECT_GE(lo, 0.0);
  EXPECT_LE(lo, p);
  EXPECT_GE(hi, p);
  EXPECT_LE(hi, 1.0);
  // 20 trials: even with no success the 95% upper end is above 0.13.
  EXPECT_GT(hi - lo, 0.1);
  EXPECT_GE(j["reward_mean"].get<double>(), 0.0);
  EXPECT_LE(j["reward_mean"].get<double>(), 1.0);
  EXPECT_GE(j["mean_turns"].get<double>(), 1.0);  // every episode plays at least one turn
  EXPECT_LE(j["mean_turns"].get<double>(), 2.0);  // max_turns
  EXPECT_GT(j["seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["digest"].get<std::string>().size(), 16u);
  int64_t ended = 0;
  for (const auto& [status, count] : j["endings"].items()) ended += count.get<int64_t>();
  EXPECT_EQ(ended, kEpisodes);
  std::printf("eval: %d episodes in %.2f s playing (%.2f episodes/s), %.2f s for the process\n",
              kEpisodes, j["seconds"].get<double>(), kEpisodes / j["seconds"].get<double>(), wall);

  // --out appended the same line.
  std::ifstream file(out);
  std::string stored;
  ASSERT_TRUE(std::getline(file, stored));
  EXPECT_EQ(nlohmann::json::parse(stored), j);

  // Greedy decoding on the same problems: the same episodes again.
  const nlohmann::json again = Line(Eval(
      {"--weights", weights_, "--episodes", std::to_string(kEpisodes), "--seed", "5", "--json"}));
  ExpectSameOutcome(j, again);
  // The digest tells runs apart: other problems, other episodes.
  const nlohmann::json other = Line(Eval(
      {"--weights", weights_, "--episodes", std::to_string(kEpisodes), "--seed", "6", "--json"}));
  EXPECT_NE(other["digest"], j["digest"]);
}

TEST_F(EvalCommand, EpisodesOutHoldsEveryEpisodeAsText) {
  const std::string episodes = dir_->Sub("episodes.jsonl");
  const nlohmann::json j = Line(Eval({"--weights", weights_, "--episodes", "6", "--seed", "5",
                                      "--json", "--episodes-out", episodes}));
  std::ifstream file(episodes);
  std::string line;
  int64_t count = 0, successes = 0;
  std::map<std::string, int64_t> endings;
  while (std::getline(file, line)) {
    const nlohmann::json e = nlohmann::json::parse(line);
    EXPECT_EQ(e["event"], "episode");
    EXPECT_EQ(e["problem"], count) << "episodes in order, one sample each";
    EXPECT_EQ(e["sample"], 0);
    ++endings[e["status"].get<std::string>()];
    successes += e["status"] == "done" && e["outcome_reward"].get<double>() >= 1.0;
    // The problem first, then a model turn and its observation per turn played.
    const nlohmann::json& exchange = e["exchange"];
    ASSERT_TRUE(exchange.is_array());
    ASSERT_GE(exchange.size(), 1u);
    EXPECT_NE(exchange[0].get<std::string>().find("How many"), std::string::npos)
        << "the calculator's problem opens the exchange: " << exchange[0];
    EXPECT_EQ(exchange.size(), 1 + 2 * e["turns"].get<size_t>());
    ++count;
  }
  EXPECT_EQ(count, 6);
  EXPECT_EQ(successes, std::llround(j["success_rate"].get<double>() * 6));
  for (const auto& [status, n] : j["endings"].items()) EXPECT_EQ(endings[status], n.get<int64_t>());
}

TEST_F(EvalCommand, EvaluatesTheNewestVersionOfAWeightPublisher) {
  std::ifstream file(weights_, std::ios::binary);
  std::stringstream bytes;
  bytes << file.rdbuf();
  auto publisher = transport::WeightPublisher::Start({});
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  ASSERT_TRUE((*publisher)->Publish(3, "not a safetensors file", "tiny").ok());
  ASSERT_TRUE((*publisher)->Publish(7, bytes.str(), "tiny").ok());  // the newest: this one
  const std::string endpoint = (*publisher)->endpoint();
  const nlohmann::json fetched =
      Line(Eval({"--weights-endpoint", endpoint, "--episodes", "8", "--seed", "5", "--json"}));
  EXPECT_EQ(fetched["policy_version"], 7);
  EXPECT_EQ(fetched["weights"], endpoint);
  EXPECT_GT((*publisher)->chunks_served(), 0u);
  // The same bytes from the file, on the same problems: the same result.
  const nlohmann::json from_file =
      Line(Eval({"--weights", weights_, "--episodes", "8", "--seed", "5", "--json"}));
  ExpectSameOutcome(fetched, from_file);

  // Published bytes that are not weights for the config: a runtime failure (1), not usage.
  auto bad = transport::WeightPublisher::Start({});
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  ASSERT_TRUE((*bad)->Publish(1, "not a safetensors file", "tiny").ok());
  RunResult refused = Eval({"--weights-endpoint", (*bad)->endpoint(), "--episodes", "2"});
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("weights version 1"), std::string::npos) << refused.output;
}

TEST_F(EvalCommand, SamplesReportPassAtK) {
  const nlohmann::json j = Line(Eval({"--weights", weights_, "--episodes", "5", "--samples", "4",
                                      "--temperature", "1", "--seed", "9", "--json"}));
  EXPECT_EQ(j["samples"], 4);
  EXPECT_EQ(j["episodes"], 5);
  EXPECT_EQ(j["temperature"], 1.0);
  ASSERT_TRUE(j.contains("pass_at_k")) << j.dump();
  const double pass = j["pass_at_k"], p = j["success_rate"];
  EXPECT_GE(pass, p);
  EXPECT_LE(pass, 1.0);
  int64_t ended = 0;
  for (const auto& [status, count] : j["endings"].items()) ended += count.get<int64_t>();
  EXPECT_EQ(ended, 20);
}

TEST_F(EvalCommand, HumanSummaryWithoutJson) {
  RunResult run = Eval({"--weights", weights_, "--episodes", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("calculator, policy version 0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("95% CI"), std::string::npos) << run.output;
}

TEST_F(EvalCommand, BadUsageExitsTwoAndSaysWhy) {
  RunResult mismatch = Eval({"--weights", weights_, "--env", "retrieval", "--json"});
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.output;
  EXPECT_NE(mismatch.output.find("--env retrieval does not match the config's env 'calculator'"),
            std::string::npos)
      << mismatch.output;

  const std::string bad = dir_->Sub("bad.yaml");
  std::ofstream(bad) << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
                     << "  max_turnz: 2\nenv:\n  name: calculator\n";
  RunResult unknown = Eval({"--weights", weights_, "--json"}, bad);
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_NE(unknown.output.find(bad + ":3"), std::string::npos) << unknown.output;
  EXPECT_NE(unknown.output.find("max_turnz"), std::string::npos) << unknown.output;

  RunResult greedy_samples = Eval({"--weights", weights_, "--samples", "4", "--temperature", "0"});
  EXPECT_EQ(greedy_samples.exit_code, 2) << greedy_samples.output;
  EXPECT_NE(greedy_samples.output.find("temperature 0"), std::string::npos)
      << greedy_samples.output;

  RunResult no_weights = Eval({"--episodes", "2"});
  EXPECT_EQ(no_weights.exit_code, 2) << no_weights.output;
  EXPECT_NE(no_weights.output.find("--weights"), std::string::npos) << no_weights.output;

  // No env: section: --env picks a built-in with its default options; without it, an error.
  const std::string bare = dir_->Sub("bare.yaml");
  std::ofstream(bare) << "actor:\n  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
                      << "  threads: 2\n  max_turns: 1\n  sampling: {max_new_tokens: 8}\n";
  RunResult no_env = Eval({"--weights", weights_, "--episodes", "1"}, bare);
  EXPECT_EQ(no_env.exit_code, 2) << no_env.output;
  EXPECT_NE(no_env.output.find("no env"), std::string::npos) << no_env.output;
  const nlohmann::json picked =
      Line(Eval({"--weights", weights_, "--episodes", "1", "--env", "calculator", "--json"}, bare));
  EXPECT_EQ(picked["env"], "calculator");
}

}  // namespace
}  // namespace strider
