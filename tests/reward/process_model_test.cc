// The learned process reward model on steps a real replay server stored: calculator episodes
// whose turns are the scripted solver's with some replaced by random ones, rendered through
// common/transcript.h and cut by the actor's own segmenter (steps span segment cuts), labelled
// by the environment as the actor labels them, sent through an ActorClient. The head, on a
// frozen tiny model with random weights, must beat the majority baseline on held-out
// trajectories; with the training labels shuffled it must not.
//
// The mistakes are random turns (a malformed or unknown call, a wrong result, a guessed answer):
// what a random model's states can tell apart from the solver's turns. A wrong operand in the
// solver's own format needs arithmetic no random model does, so it is not what this measures.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "actors/segmenter.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/transcript.h"
#include "envs/episode.h"
#include "envs/tools.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "reward/process_model.h"
#include "tests/integration/child_process.h"
#include "tests/replay/temp_dir.h"

namespace strider::reward {
namespace {

using std::chrono::milliseconds;
using strider::testing::SourceDir;
using strider::testing::TempDir;

constexpr int kEpisodes = 120;
constexpr double kRandomTurnRate = 0.35;

// The calculator's scripted policy with some turns replaced by random ones
// (envs::MakeRandomPolicy). The solver is shown only the observations that answered its own
// turns, so after a random turn it goes on where it was.
class Distracted : public envs::ScriptedPolicy {
 public:
  Distracted(uint64_t seed, std::vector<envs::ToolSpec> tools)
      : solver_(envs::MakeScriptedPolicy({.name = "calculator"}).value()),
        random_(envs::MakeRandomPolicy(seed, std::move(tools))),
        rng_(seed) {}

  Result<std::string> NextTurn(const std::vector<envs::Observation>& observations) override {
    // observations[0] is the task; observations[i] answered turn i - 1.
    std::vector<envs::Observation> seen = {observations.front()};
    for (size_t i = 1; i < observations.size(); ++i) {
      if (!random_turn_[i - 1]) seen.push_back(observations[i]);
    }
    const bool random = std::uniform_real_distribution<double>(0, 1)(rng_) < kRandomTurnRate;
    random_turn_.push_back(random);
    Result<std::string> turn = random ? random_->NextTurn(observations) : solver_->NextTurn(seen);
    if (turn.ok()) turns.push_back(*turn);
    return turn;
  }

  std::vector<std::string> turns;

 private:
  std::unique_ptr<envs::ScriptedPolicy> solver_;
  std::unique_ptr<envs::ScriptedPolicy> random_;
  std::mt19937_64 rng_;
  std::vector<bool> random_turn_;
};

schema::StepLabel SchemaLabel(envs::StepLabel label) {
  switch (label) {
    case envs::StepLabel::kCorrect: return schema::StepLabel::kCorrect;
    case envs::StepLabel::kIncorrect: return schema::StepLabel::kIncorrect;
    case envs::StepLabel::kUnknown: break;
  }
  return schema::StepLabel::kUnknown;
}

// Plays one episode and cuts it into segments as the actor does.
std::vector<schema::SegmentData> PlayAndSegment(uint64_t seed, LabelCounts* counts) {
  std::unique_ptr<envs::Environment> env =
      envs::MakeEnvironment({.name = "calculator", .options = {{"difficulty", "1"}}}).value();
  const envs::EnvironmentSpec spec = env->Describe();
  Distracted policy(seed, spec.tools);
  std::vector<envs::StepResult> results;
  const envs::EpisodeReport report = envs::PlayEpisode(
      *env, policy, seed, 10, {}, [&](const envs::StepResult& r) { results.push_back(r); });
  EXPECT_FALSE(report.error) << report.end;
  counts->correct += report.correct;
  counts->incorrect += report.incorrect;
  counts->unknown += report.unknown;

  actors::SegmenterOptions options;
  options.segment_tokens = 96;  // a few turns each: steps span cuts
  options.env = "calculator";
  schema::TrajectoryId id;
  std::mt19937_64 id_rng(seed * 7919 + 1);
  for (uint8_t& b : id.bytes) b = static_cast<uint8_t>(id_rng());
  actors::Segmenter segmenter(options, id);
  std::vector<schema::SegmentData> segments;
  transcript::Transcript t;
  auto feed = [&] {
    for (const transcript::Run& run : t.Take()) {
      const auto role = static_cast<schema::Role>(run.role);
      if (schema::IsAction(role)) {
        for (int32_t token : run.tokens) {
          EXPECT_TRUE(segmenter.AddAction(token, role, -1.0f, 1, {}).ok());
        }
      } else {
        EXPECT_TRUE(segmenter.AddContext(run.tokens, role).ok());
      }
    }
    for (schema::SegmentData& s : segmenter.TakeReady()) segments.push_back(std::move(s));
  };
  t.AddSystem(spec.description, envs::RenderToolList(spec.tools));
  const envs::Observation& first = report.observations.front();
  t.AddObservation(envs::TranscriptRole(first.role), first.text);
  t.BeginModelTurn();
  feed();
  for (size_t k = 0; k < results.size(); ++k) {
    const envs::StepResult& r = results[k];
    t.AddModelTurn(policy.turns[k]);
    feed();
    std::optional<float> reward;
    if (r.reward) reward = static_cast<float>(*r.reward);
    EXPECT_TRUE(segmenter.EndStep(reward, SchemaLabel(r.label)).ok());
    if (k + 1 == results.size() && !r.done) break;  // cut: the actor writes nothing more
    t.AddStepResult(envs::TranscriptRole(r.observation.role), r.observation.text, {}, r.done);
    feed();
    segmenter.MarkTurnBoundary(std::nullopt);
  }
  const bool done = !results.empty() && results.back().done;
  Result<std::vector<schema::SegmentData>> rest = segmenter.Finish(
      static_cast<float>(report.outcome.value_or(0.0)),
      done ? schema::EndReason::kFinished : schema::EndReason::kTruncatedTurns,
      {{"status", done ? "done" : "max_turns"}, {"seed", std::to_string(seed)}});
  EXPECT_TRUE(rest.ok()) << rest.status().ToString();
  if (rest.ok()) {
    for (schema::SegmentData& s : *rest) segments.push_back(std::move(s));
  }
  return segments;
}

// One store and one frozen model for every test: playing, storing and the model take seconds.
class ProcessModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    replay::ServerOptions server_options;
    server_options.db_path = dir_->Sub("store");
    server_options.actor_endpoint = "tcp://127.0.0.1:0";
    server_options.learner_endpoint = "tcp://127.0.0.1:0";
    server_options.stats_interval_s = 0;
    Result<std::unique_ptr<replay::ReplayServer>> server =
        replay::ReplayServer::Start(server_options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = server->release();
    replay::ActorClientOptions client_options;
    client_options.endpoint = server_->actor_endpoint();
    Result<std::unique_ptr<replay::ActorClient>> client =
        replay::ActorClient::Connect(client_options);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    played_ = new LabelCounts();
    for (int e = 0; e < kEpisodes; ++e) {
      for (const schema::SegmentData& s : PlayAndSegment(1000 + e, played_)) {
        ASSERT_TRUE((*client)->Send(s).ok());
        ++segments_;
      }
    }
    ASSERT_TRUE((*client)->Flush(milliseconds(20000)).ok());
    ASSERT_TRUE((*client)->TakeErrors().empty());

    Result<ModelConfig> config = LoadModelConfig(ModelConfigPath());
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    Result<std::unique_ptr<Model>> model = Model::Create(*config, 0);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    ASSERT_TRUE((*model)->Save(dir_->Sub("policy.safetensors")).ok());
  }

  static void TearDownTestSuite() {
    delete server_;
    delete played_;
    delete dir_;
  }

  static std::string ModelConfigPath() { return SourceDir() + "/configs/model/tiny.yaml"; }

  static ProcessModelOptions Options() {
    ProcessModelOptions options;
    options.store_path = dir_->Sub("store");
    options.model_config = ModelConfigPath();
    options.model_weights = dir_->Sub("policy.safetensors");
    options.heldout_fraction = 0.3;
    options.steps = 300;
    return options;
  }

  static TempDir* dir_;
  static replay::ReplayServer* server_;
  static LabelCounts* played_;
  static int segments_;
};

TempDir* ProcessModelTest::dir_ = nullptr;
replay::ReplayServer* ProcessModelTest::server_ = nullptr;
LabelCounts* ProcessModelTest::played_ = nullptr;
int ProcessModelTest::segments_ = 0;

TEST_F(ProcessModelTest, ReadsTheLabelsTheEnvironmentGaveFromTheStore) {
  ASSERT_GT(segments_, kEpisodes);  // trajectories span segments
  Result<LabelledStore> store = ReadLabelledStore(dir_->Sub("store"));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->trajectories.size(), static_cast<size_t>(kEpisodes));
  EXPECT_EQ(store->incomplete, 0);
  LabelCounts read;
  for (const LabelledTrajectory& t : store->trajectories) {
    ASSERT_EQ(t.labels.size(), t.trajectory.steps.size());
    for (schema::StepLabel label : t.labels) {
      read.correct += label == schema::StepLabel::kCorrect;
      read.incorrect += label == schema::StepLabel::kIncorrect;
      read.unknown += label == schema::StepLabel::kUnknown;
    }
  }
  EXPECT_EQ(read.correct, played_->correct);
  EXPECT_EQ(read.incorrect, played_->incorrect);
  EXPECT_EQ(read.unknown, played_->unknown);
  // All three kinds occur, so the counts and the exclusion of unknown steps are exercised.
  EXPECT_GT(read.correct, 0);
  EXPECT_GT(read.incorrect, 0);
  EXPECT_GT(read.unknown, 0);
  Result<LabelledStore> capped = ReadLabelledStore(dir_->Sub("store"), {}, 5);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->trajectories.size(), 5u);
}

TEST_F(ProcessModelTest, LabelsFromReplayingTheEnvironmentAreTheStoredOnes) {
  Result<LabelledStore> stored = ReadLabelledStore(dir_->Sub("store"));
  ASSERT_TRUE(stored.ok());
  envs::EnvironmentConfig env{.name = "calculator", .options = {{"difficulty", "1"}}};
  Result<LabelledStore> replayed = ReadLabelledStore(dir_->Sub("store"), {}, 0, &env);
  ASSERT_TRUE(replayed.ok()) << replayed.status().ToString();
  EXPECT_EQ(replayed->unreplayed, 0);
  ASSERT_EQ(replayed->trajectories.size(), stored->trajectories.size());
  for (size_t i = 0; i < stored->trajectories.size(); ++i) {
    EXPECT_EQ(replayed->trajectories[i].labels, stored->trajectories[i].labels) << i;
  }
  // Other options give other problems: no trajectory replays, none is labelled.
  env.options["difficulty"] = "2";
  Result<LabelledStore> other = ReadLabelledStore(dir_->Sub("store"), {}, 0, &env);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_EQ(other->unreplayed, kEpisodes);
  EXPECT_TRUE(other->trajectories.empty());
}

TEST_F(ProcessModelTest, BeatsTheMajorityBaselineOnHeldOutTrajectoriesAndScoresFromItsCheckpoint) {
  ProcessModelOptions options = Options();
  options.output_dir = dir_->Sub("prm");
  Result<ProcessModelReport> report = TrainProcessModel(options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::cout << ProcessModelReportJson(*report) << "\n";
  EXPECT_EQ(report->trajectories, kEpisodes);
  EXPECT_EQ(report->train_trajectories + report->heldout_trajectories, kEpisodes);
  EXPECT_GT(report->heldout_trajectories, kEpisodes / 6);
  EXPECT_EQ(report->train_labels.correct + report->heldout_labels.correct, played_->correct);
  EXPECT_EQ(report->train_labels.incorrect + report->heldout_labels.incorrect,
            played_->incorrect);
  EXPECT_EQ(report->train_labels.unknown + report->heldout_labels.unknown, played_->unknown);
  EXPECT_EQ(report->steps, options.steps);
  EXPECT_LT(report->final_train_loss, report->initial_train_loss);
  // Clearly above the baseline: at most half its errors.
  EXPECT_GT(report->heldout_accuracy, report->majority_baseline);
  EXPECT_LE(1 - report->heldout_accuracy, 0.5 * (1 - report->majority_baseline));

  // The checkpoint scores every step as the trained head did: over all labelled steps its
  // accuracy is the train and held-out accuracies weighted by their counts.
  Result<std::unique_ptr<ProcessRewardModel>> prm = ProcessRewardModel::Load(options.output_dir);
  ASSERT_TRUE(prm.ok()) << prm.status().ToString();
  Result<LabelledStore> store = ReadLabelledStore(dir_->Sub("store"));
  ASSERT_TRUE(store.ok());
  int64_t right = 0, labelled = 0;
  for (const LabelledTrajectory& t : store->trajectories) {
    Result<std::vector<double>> scores = (*prm)->ScoreSteps(t.trajectory);
    ASSERT_TRUE(scores.ok()) << scores.status().ToString();
    ASSERT_EQ(scores->size(), t.trajectory.steps.size());
    for (size_t k = 0; k < scores->size(); ++k) {
      const double p = (*scores)[k];
      ASSERT_TRUE(p >= 0 && p <= 1) << p;
      if (t.labels[k] == schema::StepLabel::kUnknown) continue;
      ++labelled;
      right += (p > 0.5) == (t.labels[k] == schema::StepLabel::kCorrect);
    }
  }
  const double n_train = static_cast<double>(report->train_labels.labelled());
  const double n_held = static_cast<double>(report->heldout_labels.labelled());
  EXPECT_EQ(labelled, report->train_labels.labelled() + report->heldout_labels.labelled());
  EXPECT_NEAR(static_cast<double>(right) / labelled,
              (report->train_accuracy * n_train + report->heldout_accuracy * n_held) /
                  (n_train + n_held),
              1.5 / labelled);  // a score within rounding of 0.5 may fall either side
}

TEST_F(ProcessModelTest, ShuffledTrainingLabelsDoNotBeatTheBaseline) {
  ProcessModelOptions options = Options();
  options.shuffle_labels = true;
  Result<ProcessModelReport> shuffled = TrainProcessModel(options);
  ASSERT_TRUE(shuffled.ok()) << shuffled.status().ToString();
  std::cout << ProcessModelReportJson(*shuffled) << "\n";
  EXPECT_LE(shuffled->heldout_accuracy, shuffled->majority_baseline + 0.03);
  EXPECT_TRUE(shuffled->checkpoint_dir.empty());
}

TEST_F(ProcessModelTest, RefusesSplitsWithoutHeldOutStepsAndMissingCheckpoints) {
  ProcessModelOptions options = Options();
  options.heldout_fraction = 1.0;
  Result<ProcessModelReport> all_held = TrainProcessModel(options);
  EXPECT_EQ(all_held.status().code(), StatusCode::kInvalidArgument);
  // Two trajectories: a split of 1e-6 holds none of them out.
  options.heldout_fraction = 1e-6;
  options.max_trajectories = 2;
  Result<ProcessModelReport> none_held = TrainProcessModel(options);
  EXPECT_EQ(none_held.status().code(), StatusCode::kInvalidArgument)
      << none_held.status().ToString();
  EXPECT_EQ(ProcessRewardModel::Load(dir_->Sub("no-such-dir")).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace strider::reward
