// The actor as a real process (`strider actor`) streaming to a real replay server process:
// on the calculator, stored segments reassemble into whole trajectories whose behaviour
// log-probs the model recomputes, malformed tool calls become visible error results, a replay
// server killed and restarted mid-stream loses nothing, and weights published mid-run stamp
// later tokens; on retrieval, on the Python example over the external protocol, and with
// environment faults (process killed mid-episode, a hanging tool, image observations), episodes
// end with the right recorded status and their segments are stored whole.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/model/model.h"
#include "common/tokenizer.h"
#include "common/transport/weight_stream.h"
#include "envs/environment.h"
#include "envs/tools.h"
#include "replay/inspect.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using std::chrono::milliseconds;
using strider::testing::ChildProcess;
using strider::testing::SourceDir;
using strider::testing::WaitEvent;
using strider::testing::StriderBinary;
using strider::testing::TempDir;

std::string StartServer(ChildProcess& server, const std::string& db, const std::string& bind) {
  EXPECT_TRUE(server.Start({StriderBinary(), "replay", "serve", "--db", db, "--bind", bind,
                            "--sample-bind", "tcp://127.0.0.1:0"}));
  nlohmann::json ready = WaitEvent(server, "ready", 30000);
  EXPECT_TRUE(ready.is_object()) << "no ready line from the replay server";
  return ready.is_object() ? ready["actor_endpoint"].get<std::string>() : "";
}

const char kCalculator[] = "env:\n  name: calculator\n  options: {difficulty: 1}\n";

std::string WriteConfig(const TempDir& dir, const std::string& extra_actor_keys, int64_t episodes,
                        int64_t in_flight, int64_t group,
                        const std::string& env_block = kCalculator) {
  const std::string path = dir.Sub("actor.yaml");
  std::ofstream out(path);
  out << "actor:\n"
      << "  model: " << SourceDir() << "/configs/model/tiny.yaml\n"
      << "  model_seed: 0\n  threads: 2\n"
      << "  episodes: " << episodes << "\n  episodes_in_flight: " << in_flight
      << "\n  group_size: " << group << "\n"
      << "  max_turns: 3\n  max_episode_tokens: 1024\n  seed: 11\n  segment_tokens: 96\n"
      << "  sampling: {temperature: 1.0, max_new_tokens: 40}\n"
      << "  engine: {cache_budget_mb: 64}\n"
      << "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 1000}\n"
      << "  metrics: {interval_s: 0.5, progress: false}\n"
      << extra_actor_keys << env_block;
  return path;
}

struct Trajectory {
  std::vector<int32_t> tokens;
  std::vector<schema::Role> roles;
  std::vector<float> log_probs;
  std::vector<uint64_t> versions;  // per token
  std::map<std::string, std::string> metadata;
  size_t steps = 0;
  std::vector<at::Tensor> images;  // (H, W, C) floats in [0, 1], in stream order
  std::vector<schema::SegmentData> segments;
};

// Every stored trajectory, reassembled; fails the test on gaps, overlaps or a missing end.
std::vector<Trajectory> ReadTrajectories(const std::string& db) {
  std::vector<Trajectory> out;
  auto inspector = replay::Inspector::Open(db);
  EXPECT_TRUE(inspector.ok()) << inspector.status().ToString();
  if (!inspector.ok()) return out;
  auto summaries = (*inspector)->List({});
  EXPECT_TRUE(summaries.ok());
  for (const schema::TrajectorySummary& summary : *summaries) {
    EXPECT_TRUE(summary.complete) << summary.trajectory_id.Hex();
    auto segments = (*inspector)->Trajectory(summary.trajectory_id);
    EXPECT_TRUE(segments.ok());
    Trajectory t;
    for (size_t i = 0; i < segments->size(); ++i) {
      const schema::SegmentData& s = (*segments)[i].segment;
      EXPECT_EQ(s.segment_index, i);
      EXPECT_EQ(s.token_begin, t.tokens.size()) << "gap or overlap in " << s.key().ToString();
      EXPECT_EQ(s.is_last, i + 1 == segments->size());
      EXPECT_LE(s.tokens.size(), 96u);
      for (size_t k = 0; k < s.tokens.size(); ++k) {
        size_t run = 0;
        while (run + 1 < s.policy_runs.size() && s.policy_runs[run + 1].begin <= k) ++run;
        t.versions.push_back(s.policy_runs[run].version);
      }
      t.tokens.insert(t.tokens.end(), s.tokens.begin(), s.tokens.end());
      t.roles.insert(t.roles.end(), s.roles.begin(), s.roles.end());
      t.log_probs.insert(t.log_probs.end(), s.behaviour_logprobs.begin(),
                         s.behaviour_logprobs.end());
      t.steps += s.steps.size();
      for (const schema::Image& image : s.images) {
        EXPECT_EQ(s.tokens.at(image.token_offset), token::kImageStart)
            << "an image's offset points at its run in " << s.key().ToString();
        std::string bytes = image.pixels;
        t.images.push_back(at::tensor(std::vector<uint8_t>(bytes.begin(), bytes.end()), at::kByte)
                               .view({image.height, image.width, image.channels})
                               .to(at::kFloat)
                               .div_(255.0));
      }
      for (const auto& [k, v] : s.metadata) t.metadata[k] = v;
      t.segments.push_back(s);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Largest |behaviour log-prob - recomputed log-prob| over the action tokens of `t`, recomputed
// with the training path on the whole trajectory.
double MaxLogProbError(const Model& model, const Trajectory& t) {
  std::vector<int64_t> ids(t.tokens.begin(), t.tokens.end());
  at::Tensor tokens = at::tensor(ids, at::kLong).view({1, -1});
  ModelInput input{tokens, {}};
  for (const at::Tensor& pixels : t.images) input.images.push_back({0, pixels});
  Result<ForwardOutput> out = model.Forward(input);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return 1e9;
  // The behaviour distribution: temperature 1 without cuts, and the image-patch placeholder
  // never sampled (the engine bans it; only images fill it), so it leaves the normalisation.
  at::Tensor logits = out->logits.to(at::kDouble).clone();
  logits.select(2, token::kImagePatch).fill_(-std::numeric_limits<double>::infinity());
  at::Tensor lp = NextTokenLogProbs(logits, tokens).contiguous();
  const double* p = lp.data_ptr<double>();
  double worst = 0;
  for (size_t i = 1; i < t.tokens.size(); ++i) {
    if (!schema::IsAction(t.roles[i])) continue;
    worst = std::max(worst, std::abs(p[i - 1] - static_cast<double>(t.log_probs[i])));
  }
  return worst;
}

// A stored calculator trajectory as the actor has always written it, spelt out here rather than
// rendered through common/transcript.h: the system turn (description, tool list), the task, then
// per model turn its sampled tokens (tool_call from marker to marker), a closing end-of-turn
// when it was cut at max_new_tokens, and the environment's answer, replayed from the episode's
// seed, as a turn of its role followed by the next model header. The episode ends after its
// last model turn (max_turns). The tokens and roles must match exactly.
void ExpectTheActorsTranscript(const Trajectory& t, const std::string& difficulty) {
  envs::EnvironmentConfig config;
  config.name = "calculator";
  config.options = {{"difficulty", difficulty}};
  Result<std::unique_ptr<envs::Environment>> env = envs::MakeEnvironment(config);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const envs::EnvironmentSpec spec = (*env)->Describe();
  Result<envs::Observation> first = (*env)->Reset(std::stoull(t.metadata.at("seed")), {});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::vector<int32_t> tokens;
  std::vector<schema::Role> roles;
  auto add = [&](int32_t token, schema::Role role) {
    tokens.push_back(token);
    roles.push_back(role);
  };
  auto add_text = [&](const std::string& text, schema::Role role) {
    for (int32_t token : Tokenizer::Encode(text)) add(token, role);
  };
  auto role_of = [](envs::ObservationRole role) {
    return role == envs::ObservationRole::kToolResult ? schema::Role::kToolResult
           : role == envs::ObservationRole::kSystem   ? schema::Role::kSystem
                                                       : schema::Role::kUser;
  };
  auto marker_of = [](envs::ObservationRole role) {
    return role == envs::ObservationRole::kToolResult ? token::kToolResult
           : role == envs::ObservationRole::kSystem   ? token::kSystem
                                                       : token::kUser;
  };
  add(token::kBeginOfText, schema::Role::kSystem);
  add(token::kSystem, schema::Role::kSystem);
  add_text(spec.description + "\n" + envs::RenderToolList(spec.tools), schema::Role::kSystem);
  add(token::kEndOfTurn, schema::Role::kSystem);
  add(marker_of(first->role), role_of(first->role));
  add_text(first->text, role_of(first->role));
  add(token::kEndOfTurn, role_of(first->role));
  add(token::kModel, role_of(first->role));
  // The environment's verdict on each step, from the same replay: (label, reward if any).
  std::vector<std::pair<schema::StepLabel, std::optional<float>>> verdicts;
  size_t at = tokens.size();
  while (at < t.tokens.size()) {
    // The model's turn: every action token from here.
    std::vector<int32_t> turn;
    bool in_call = false;
    while (at < t.tokens.size() && schema::IsAction(t.roles[at])) {
      const int32_t token = t.tokens[at++];
      if (token == token::kToolCall) in_call = true;
      add(token, in_call ? schema::Role::kToolCall : schema::Role::kModel);
      if (token == token::kToolCallEnd) in_call = false;
      turn.push_back(token);
    }
    ASSERT_FALSE(turn.empty()) << "no model turn at position " << at;
    const bool closed = turn.back() == token::kEndOfTurn;
    if (closed || turn.back() == token::kEndOfText) turn.pop_back();
    Result<envs::StepResult> step =
        (*env)->Step(envs::MakeAction(Tokenizer::Decode(turn)));
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    ASSERT_FALSE(step->done) << "a random model never answers";
    const schema::StepLabel label =
        step->label == envs::StepLabel::kCorrect     ? schema::StepLabel::kCorrect
        : step->label == envs::StepLabel::kIncorrect ? schema::StepLabel::kIncorrect
                                                     : schema::StepLabel::kUnknown;
    std::optional<float> reward;
    if (step->reward) reward = static_cast<float>(*step->reward);
    verdicts.emplace_back(label, reward);
    if (at == t.tokens.size()) break;  // the last turn: the episode ended at max_turns
    const schema::Role role = role_of(step->observation.role);
    if (!closed) add(token::kEndOfTurn, role);
    add(marker_of(step->observation.role), role);
    add_text(step->observation.text, role);
    add(token::kEndOfTurn, role);
    add(token::kModel, role);
    at = tokens.size();
    ASSERT_LE(at, t.tokens.size()) << Tokenizer::Decode(t.tokens);
  }
  EXPECT_EQ(Tokenizer::Decode(t.tokens), Tokenizer::Decode(tokens));
  EXPECT_EQ(t.tokens, tokens);
  EXPECT_EQ(t.roles, roles);
  // Each stored step has the environment's label, and a reward exactly when it gave one.
  std::vector<std::pair<schema::StepLabel, std::optional<float>>> stored;
  for (const schema::SegmentData& s : t.segments) {
    for (const schema::Step& step : s.steps) {
      stored.emplace_back(step.label,
                          step.has_reward ? std::optional<float>(step.process_reward) : std::nullopt);
    }
  }
  EXPECT_EQ(stored, verdicts);
}

// The schema 1.2 fields a learner reads: the group and sampling settings on every segment, the
// end reason on the last, steps numbered through the trajectory from their turn's first action,
// and a routing record for every position that agrees with the training path's own routing.
void ExpectTheLearningFields(const Model& model, const Trajectory& t,
                             schema::EndReason end_reason, int64_t group_size) {
  std::vector<uint16_t> experts;
  std::vector<bool> covered;
  uint32_t step_index = 0;
  for (const schema::SegmentData& s : t.segments) {
    SCOPED_TRACE(s.key().ToString());
    EXPECT_EQ(s.schema_minor, schema::kSchemaMinor);
    EXPECT_EQ(s.group_size, static_cast<uint32_t>(group_size));
    EXPECT_EQ(s.group_id.Hex(), t.metadata.at("group"));
    EXPECT_EQ(s.group_index, std::stoul(t.metadata.at("group_index")));
    EXPECT_EQ(s.temperature, 1.0f);
    EXPECT_EQ(s.top_p, 1.0f);
    EXPECT_EQ(s.top_k, 0u);
    EXPECT_EQ(s.end_reason, s.is_last ? end_reason : schema::EndReason::kNone);
    for (const schema::Step& step : s.steps) {
      EXPECT_EQ(step.index, step_index++);
      ASSERT_LT(step.begin, t.tokens.size());
      EXPECT_TRUE(schema::IsAction(t.roles[step.begin])) << "a step begins at its first action";
      EXPECT_FALSE(schema::IsAction(t.roles[step.begin - 1])) << "... the first of its turn";
    }
    std::vector<bool> has_record;
    const std::vector<uint16_t> rows = schema::ExpertsByPosition(s, &has_record);
    experts.insert(experts.end(), rows.begin(), rows.end());
    covered.insert(covered.end(), has_record.begin(), has_record.end());
  }
  EXPECT_EQ(step_index, t.steps);
  ASSERT_EQ(covered.size(), t.tokens.size());
  EXPECT_EQ(std::count(covered.begin(), covered.end(), false), 0)
      << "every position of an episode ended at max_turns was fed, so every one has experts";
  std::vector<int64_t> ids(t.tokens.begin(), t.tokens.end());
  ForwardOptions record;
  record.record_routing = true;
  Result<ForwardOutput> out = model.Forward({at::tensor(ids, at::kLong).view({1, -1}), {}}, record);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const int64_t layers = static_cast<int64_t>(out->routing.layers.size());
  ASSERT_GT(layers, 0);
  const int64_t k = out->routing.layers[0].experts.size(2);
  ASSERT_EQ(experts.size(), t.tokens.size() * layers * k);
  // Chosen sets per (position, layer); batching can flip a near tie, a shift of one position
  // would disagree almost everywhere.
  int64_t same = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    at::Tensor model_experts =
        std::get<0>(out->routing.layers[layer].experts[0].sort(-1)).contiguous();
    const int64_t* m = model_experts.data_ptr<int64_t>();
    for (size_t p = 0; p < t.tokens.size(); ++p) {
      std::vector<int64_t> stored(k);
      for (int64_t j = 0; j < k; ++j) stored[j] = experts[(p * layers + layer) * k + j];
      std::sort(stored.begin(), stored.end());
      same += std::equal(stored.begin(), stored.end(), m + p * k) ? 1 : 0;
    }
  }
  EXPECT_GE(static_cast<double>(same) / static_cast<double>(t.tokens.size() * layers), 0.99);
}

TEST(ActorProcess, CalculatorTrajectoriesReassembleAndLogProbsMatchTheModel) {
  TempDir dir;
  ChildProcess server;
  const std::string endpoint = StartServer(server, dir.Sub("db"), "tcp://127.0.0.1:0");
  ASSERT_FALSE(endpoint.empty());
  const std::string config = WriteConfig(dir, "", 16, 8, 4);
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--replay", endpoint,
                           "--spill-dir", dir.Sub("spill"), "--metrics", dir.Sub("m.jsonl")}));
  nlohmann::json finished = WaitEvent(actor, "finished", 60000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  const nlohmann::json& metrics = finished["metrics"];
  EXPECT_EQ(metrics["episodes"], 16);
  EXPECT_EQ(metrics["acked_segments"], metrics["segments"]);
  EXPECT_EQ(metrics["spill"]["files"], 0);
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("m.jsonl")));
  // The engine's time split: the two parts add up to the whole, every sampled token is a decode
  // token, and a group's shared prompt is fed once for its four episodes.
  EXPECT_NEAR(metrics["prefill_step_seconds"].get<double>() +
                  metrics["decode_step_seconds"].get<double>(),
              metrics["engine_step_seconds"].get<double>(), 1e-6);
  EXPECT_EQ(metrics["decode_tokens"], metrics["generated_tokens"]);
  EXPECT_GT(metrics["prefill_tokens"].get<int64_t>(), 0);
  EXPECT_LT(metrics["prefill_tokens"].get<int64_t>(), metrics["context_tokens"].get<int64_t>());
  EXPECT_GT(metrics["prefill_steps"].get<int64_t>(), 0);
  EXPECT_GT(metrics["env_call_seconds"].get<double>(), 0.0);

  std::vector<Trajectory> trajectories = ReadTrajectories(dir.Sub("db"));
  ASSERT_EQ(trajectories.size(), 16u);
  auto config_model = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config_model.ok());
  auto model = Model::Create(*config_model, 0);
  ASSERT_TRUE(model.ok());
  std::set<std::string> groups;
  int64_t malformed = 0;
  for (const Trajectory& t : trajectories) {
    // The conversation format the model was pretrained on.
    ASSERT_GE(t.tokens.size(), 3u);
    EXPECT_EQ(t.tokens[0], token::kBeginOfText);
    EXPECT_EQ(t.tokens[1], token::kSystem);
    EXPECT_EQ(t.metadata.at("status"), "max_turns") << "a random model never answers";
    ExpectTheActorsTranscript(t, "1");
    EXPECT_EQ(t.steps, 3u);
    ExpectTheLearningFields(**model, t, schema::EndReason::kTruncatedTurns, 4);
    groups.insert(t.metadata.at("group"));
    malformed += std::stoll(t.metadata.at("malformed_tool_calls"));
    EXPECT_LT(MaxLogProbError(**model, t), 1e-4);
  }
  EXPECT_EQ(groups.size(), 4u) << "16 episodes in groups of 4";
  EXPECT_EQ(malformed, metrics["malformed_tool_calls"].get<int64_t>());

  // A malformed call is answered as a tool result the model sees, and the episode goes on.
  auto export_run = strider::testing::RunCommand(
      {StriderBinary(), "replay", "inspect", dir.Sub("db"), "export", "--format", "jsonl"});
  ASSERT_EQ(export_run.exit_code, 0);
  if (malformed > 0) {
    EXPECT_NE(export_run.output.find("error: "), std::string::npos);
  }
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

TEST(ActorProcess, ReplayServerKilledAndRestartedMidStreamLosesNothing) {
  TempDir dir;
  ChildProcess server;
  const std::string endpoint = StartServer(server, dir.Sub("db"), "tcp://127.0.0.1:0");
  ASSERT_FALSE(endpoint.empty());
  const std::string config = WriteConfig(dir, "", 96, 8, 1);
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--replay", endpoint,
                           "--spill-dir", dir.Sub("spill"), "--metrics", dir.Sub("m.jsonl")}));
  ASSERT_TRUE(WaitEvent(actor, "ready", 30000).is_object());
  // Kill the server once segments have been acknowledged and the run is still going.
  int64_t acked = 0;
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(30000);
  while (acked < 20 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));
    std::ifstream in(dir.Sub("m.jsonl"));
    std::string line, last;
    while (std::getline(in, line)) last = line;
    if (!last.empty()) acked = nlohmann::json::parse(last)["acked_segments"].get<int64_t>();
  }
  ASSERT_GE(acked, 20);
  server.Signal(SIGKILL);
  EXPECT_EQ(server.Wait(), 128 + SIGKILL);
  std::this_thread::sleep_for(milliseconds(1500));  // long enough for the actor to spill
  ChildProcess restarted;
  ASSERT_EQ(StartServer(restarted, dir.Sub("db"), endpoint), endpoint);
  nlohmann::json finished = WaitEvent(actor, "finished", 90000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["metrics"]["episodes"], 96);
  EXPECT_EQ(finished["metrics"]["spill"]["files"], 0);
  EXPECT_EQ(finished["metrics"]["acked_segments"], finished["metrics"]["segments"]);
  // Every episode, every segment of it, in the store.
  std::vector<Trajectory> trajectories = ReadTrajectories(dir.Sub("db"));
  EXPECT_EQ(trajectories.size(), 96u);
  restarted.Signal(SIGTERM);
  EXPECT_EQ(restarted.Wait(), 0);
}

// Polls the actor's metrics file until its newest line satisfies `done` (false after 120 s).
bool WaitForMetrics(const std::string& path, const std::function<bool(const nlohmann::json&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    if (!last.empty()) {
      const nlohmann::json metrics = nlohmann::json::parse(last, nullptr, false);
      if (metrics.is_object() && metrics.contains("generated_tokens") && done(metrics)) return true;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  return false;
}

TEST(ActorProcess, PublishedWeightsStampLaterTokens) {
  TempDir dir;
  ChildProcess server;
  const std::string endpoint = StartServer(server, dir.Sub("db"), "tcp://127.0.0.1:0");
  ASSERT_FALSE(endpoint.empty());
  auto config_model = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
  ASSERT_TRUE(config_model.ok());
  auto new_model = Model::Create(*config_model, 7);
  ASSERT_TRUE(new_model.ok());
  Result<std::string> bytes = (*new_model)->SaveToBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto publisher = transport::WeightPublisher::Start({});
  ASSERT_TRUE(publisher.ok());

  const std::string config = WriteConfig(
      dir, "  weight_stream: {endpoint: " + (*publisher)->endpoint() + ", poll_ms: 50}\n", 0, 4, 1);
  ChildProcess actor;
  ASSERT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--replay", endpoint,
                           "--spill-dir", dir.Sub("spill"), "--metrics", dir.Sub("m.jsonl")}));
  ASSERT_TRUE(WaitEvent(actor, "ready", 30000).is_object());
  // Progress is read from the actor's metrics lines rather than waited for by the clock: on a
  // loaded machine one engine step can take seconds.
  const std::string metrics_path = dir.Sub("m.jsonl");
  ASSERT_TRUE(WaitForMetrics(metrics_path, [](const nlohmann::json& m) {
    return m["generated_tokens"].get<int64_t>() > 0;
  })) << "version 0 generated nothing";
  ASSERT_TRUE((*publisher)->Publish(5, *bytes, "tiny").ok());
  int64_t tokens_at_swap = -1;
  ASSERT_TRUE(WaitForMetrics(metrics_path, [&](const nlohmann::json& m) {
    if (m["policy_version"] != 5) return false;
    const int64_t tokens = m["generated_tokens"].get<int64_t>();
    if (tokens_at_swap < 0) tokens_at_swap = tokens;
    return tokens >= tokens_at_swap + 40;  // a turn's worth of tokens under the new weights
  })) << "no tokens under the published weights";
  actor.Signal(SIGTERM);
  nlohmann::json finished = WaitEvent(actor, "finished", 60000);
  ASSERT_EQ(actor.Wait(), 0);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["metrics"]["policy_version"], 5);
  EXPECT_EQ(finished["metrics"]["weight_updates"], 1);

  int64_t old_actions = 0, new_actions = 0;
  for (const Trajectory& t : ReadTrajectories(dir.Sub("db"))) {
    bool all_new = true;
    for (size_t i = 0; i < t.tokens.size(); ++i) {
      if (!schema::IsAction(t.roles[i])) continue;
      (t.versions[i] == 5 ? new_actions : old_actions) += 1;
      all_new = all_new && t.versions[i] == 5;
    }
    // (No log-prob check here: a sequence that lives through a swap keeps the states the old
    // weights computed for its prefix, so neither model alone reproduces its distributions.)
    (void)all_new;
  }
  EXPECT_GT(old_actions, 0);
  EXPECT_GT(new_actions, 0);
  server.Signal(SIGTERM);
  EXPECT_EQ(server.Wait(), 0);
}

// Runs one actor to the end on `env_block` and returns its "finished" metrics.
// Its stderr goes to dir/actor.log.
nlohmann::json RunActor(const TempDir& dir, const std::string& endpoint, int64_t episodes,
                        const std::string& env_block) {
  const std::string config = WriteConfig(dir, "", episodes, 4, 1, env_block);
  ChildProcess actor;
  EXPECT_TRUE(actor.Start({StriderBinary(), "actor", "--config", config, "--replay", endpoint,
                           "--spill-dir", dir.Sub("spill")},
                          dir.Sub("actor.log")));
  nlohmann::json finished = WaitEvent(actor, "finished", 60000);
  EXPECT_EQ(actor.Wait(), 0);
  EXPECT_TRUE(finished.is_object());
  return finished.is_object() ? finished["metrics"] : nlohmann::json::object();
}

class ActorEnvironments : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = StartServer(server_, dir_.Sub("db"), "tcp://127.0.0.1:0");
    ASSERT_FALSE(endpoint_.empty());
    auto config = LoadModelConfig(SourceDir() + "/configs/model/tiny.yaml");
    ASSERT_TRUE(config.ok());
    auto model = Model::Create(*config, 0);
    ASSERT_TRUE(model.ok());
    model_ = std::move(*model);
  }
  void TearDown() override {
    server_.Signal(SIGTERM);
    EXPECT_EQ(server_.Wait(), 0);
  }
  TempDir dir_;
  ChildProcess server_;
  std::string endpoint_;
  std::unique_ptr<Model> model_;
};

TEST_F(ActorEnvironments, RetrievalTrajectoriesReassembleAndMatchTheModel) {
  nlohmann::json m = RunActor(
      dir_, endpoint_, 4, "env:\n  name: retrieval\n  options: {total_tokens: 1024, parts: 2}\n");
  EXPECT_EQ(m["episodes"], 4);
  std::vector<Trajectory> trajectories = ReadTrajectories(dir_.Sub("db"));
  ASSERT_EQ(trajectories.size(), 4u);
  for (const Trajectory& t : trajectories) {
    EXPECT_GT(t.tokens.size(), 96u) << "spans several segments";
    EXPECT_LT(MaxLogProbError(*model_, t), 1e-4);
  }
}

TEST_F(ActorEnvironments, PythonEnvironmentOverTheExternalProtocol) {
  nlohmann::json m = RunActor(
      dir_, endpoint_, 4,
      "env:\n  command: /usr/bin/python3 " + SourceDir() + "/envs/external/example_env.py\n");
  EXPECT_EQ(m["episodes"], 4);
  std::vector<Trajectory> trajectories = ReadTrajectories(dir_.Sub("db"));
  ASSERT_EQ(trajectories.size(), 4u);
  for (const Trajectory& t : trajectories) {
    // A random model writes bytes that are not valid UTF-8; the external client repairs them in
    // the JSON it sends (envs/messages.h, ToWireText), so the episode runs to its turn limit.
    const std::string status = t.metadata.at("status");
    EXPECT_EQ(status, "max_turns") << (t.metadata.count("error") ? t.metadata.at("error") : "");
    EXPECT_NE(Tokenizer::Decode(t.tokens).find("guess(n: integer)"), std::string::npos)
        << "the prompt lists the Python environment's tool";
    EXPECT_LT(MaxLogProbError(*model_, t), 1e-4);
  }
  auto stats = strider::testing::RunCommand(
      {StriderBinary(), "replay", "inspect", dir_.Sub("db"), "stats", "--json"});
  EXPECT_EQ(nlohmann::json::parse(stats.output)["trajectories_by_env"]["guess_number"], 4);
}

// The environment process dies at its first step: those episodes end with a recorded error and
// what they produced is stored whole.
TEST_F(ActorEnvironments, EnvironmentProcessKilledMidEpisodeIsRecorded) {
  nlohmann::json m = RunActor(dir_, endpoint_, 4,
                              "env:\n  command: /usr/bin/python3 " + SourceDir() +
                                  "/tests/envs/faulty_env.py\n  options: {fault: kill_group}\n"
                                  "  step_timeout_ms: 3000\n");
  EXPECT_EQ(m["episodes"], 4);
  EXPECT_EQ(m["errors"]["env_error"], 4) << m.dump();
  std::vector<Trajectory> trajectories = ReadTrajectories(dir_.Sub("db"));
  ASSERT_EQ(trajectories.size(), 4u);
  // Each failure is logged while the actor runs, with its episode and reason.
  std::ifstream log(dir_.Sub("actor.log"));
  std::string line, text;
  int logged = 0;
  while (std::getline(log, line)) {
    text += line + "\n";
    if (line.find("environment faulty: episode") != std::string::npos &&
        line.find("ended env_error") != std::string::npos &&
        line.find("killed by signal 9") != std::string::npos) {
      ++logged;
    }
  }
  EXPECT_EQ(logged, 4) << text;
  for (const Trajectory& t : trajectories) {
    EXPECT_EQ(t.metadata.at("status"), "env_error");
    EXPECT_FALSE(t.metadata.at("error").empty());
    EXPECT_EQ(t.steps, 1u);
  }
}

// A tool that never answers: the episode ends at the time limit, the actor goes on.
TEST_F(ActorEnvironments, HangingToolEndsItsEpisodeAtTheTimeLimit) {
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json m = RunActor(dir_, endpoint_, 4,
                              "env:\n  command: /usr/bin/python3 " + SourceDir() +
                                  "/tests/envs/faulty_env.py\n  options: {fault: hang}\n"
                                  // Also the limit on starting the process and its reset,
                                  // which takes seconds on a loaded machine.
                                  "  step_timeout_ms: 5000\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(50));
  EXPECT_EQ(m["episodes"], 4);
  std::vector<Trajectory> trajectories = ReadTrajectories(dir_.Sub("db"));
  ASSERT_EQ(trajectories.size(), 4u);
  // One timer decides: the environment client's, every time (the actor's waits 2 s longer).
  EXPECT_EQ(m["errors"]["env_timeout"], 4) << m.dump();
  for (const Trajectory& t : trajectories) {
    EXPECT_EQ(t.metadata.at("status"), "env_timeout");
    EXPECT_NE(t.metadata.at("error").find("timed by the environment client"), std::string::npos)
        << t.metadata.at("error");
  }
}

// Images reach the model through the engine and travel with the segments: the recomputation
// with the stored images gives the behaviour log-probs.
TEST_F(ActorEnvironments, VisionObservationsAreFedAndStoredWithTheirImages) {
  nlohmann::json m = RunActor(dir_, endpoint_, 4, "env:\n  name: vision_count\n");
  EXPECT_EQ(m["episodes"], 4);
  EXPECT_FALSE(m["errors"].contains("bad_image")) << m.dump();
  std::vector<Trajectory> trajectories = ReadTrajectories(dir_.Sub("db"));
  ASSERT_EQ(trajectories.size(), 4u);
  for (const Trajectory& t : trajectories) {
    ASSERT_FALSE(t.images.empty()) << "the first observation holds the grid image";
    const int64_t placeholders = std::count(t.tokens.begin(), t.tokens.end(), token::kImagePatch);
    EXPECT_GT(placeholders, 0);
    EXPECT_LT(MaxLogProbError(*model_, t), 1e-4);
  }
}

}  // namespace
}  // namespace strider
