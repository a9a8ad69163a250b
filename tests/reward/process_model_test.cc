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
#include "reward/process_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "actors/segmenter.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/transcript.h"
#include "envs/episode.h"
#include "envs/tools.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "tests/integration/child_process.h"
#include "tests/replay/temp_dir.h"

namespace strider::reward {
namespace {

using std::chrono::milliseconds;
using strider::testing::SourceDir;
using strider::testing::TempDir;

constexpr int kEpisodes = 120;
constexpr double kRandomTurnRate = 0.35;

// An environment's scripted policy with some turns replaced by random ones
// (envs::MakeRandomPolicy). The solver is shown only the observations that answered its own
// turns, so after a random turn it goes on where it was.
class Distracted : public envs::ScriptedPolicy {
 public:
  Distracted(const envs::EnvironmentConfig& env, double rate, uint64_t seed,
             std::vector<envs::ToolSpec> tools)
      : solver_(envs::MakeScriptedPolicy(env).value()),
        random_(envs::MakeRandomPolicy(seed, std::move(tools))),
        rate_(rate),
        rng_(seed) {}

  Result<std::string> NextTurn(const std::vector<envs::Observation>& observations) override {
    // observations[0] is the task; observations[i] answered turn i - 1.
    std::vector<envs::Observation> seen = {observations.front()};
    for (size_t i = 1; i < observations.size(); ++i) {
      if (!random_turn_[i - 1]) seen.push_back(observations[i]);
    }
    const bool random = std::uniform_real_distribution<double>(0, 1)(rng_) < rate_;
    random_turn_.push_back(random);
    Result<std::string> turn = random ? random_->NextTurn(observations) : solver_->NextTurn(seen);
    if (turn.ok()) turns.push_back(*turn);
    return turn;
  }

  std::vector<std::string> turns;

 private:
  std::unique_ptr<envs::ScriptedPolicy> solver_;
  std::unique_ptr<envs::ScriptedPolicy> random_;
  double rate_;
  std::mt19937_64 rng_;
  std::vector<bool> random_turn_;
};

schema::StepLabel SchemaLabel(envs::StepLabel label) {
  switch (label) {
    case envs::StepLabel::kCorrect:
      return schema::StepLabel::kCorrect;
    case envs::StepLabel::kIncorrect:
      return schema::StepLabel::kIncorrect;
    case envs::StepLabel::kUnknown:
      break;
  }
  return schema::StepLabel::kUnknown;
}

const envs::EnvironmentConfig kCalculator{.name = "calculator", .options = {{"difficulty", "1"}}};

// Plays one episode and cuts it into segments as the actor does. Images get as many patch
// placeholders as a model with `patch_size` gives them.
std::vector<schema::SegmentData> PlayAndSegment(
    uint64_t seed, LabelCounts* counts, const envs::EnvironmentConfig& env_config = kCalculator,
    double random_turn_rate = kRandomTurnRate, int64_t patch_size = 4) {
  std::unique_ptr<envs::Environment> env = envs::MakeEnvironment(env_config).value();
  const envs::EnvironmentSpec spec = env->Describe();
  Distracted policy(env_config, random_turn_rate, seed, spec.tools);
  std::vector<envs::StepResult> results;
  const envs::EpisodeReport report = envs::PlayEpisode(
      *env, policy, seed, 10, {}, [&](const envs::StepResult& r) { results.push_back(r); });
  EXPECT_FALSE(report.error) << report.end;
  counts->correct += report.correct;
  counts->incorrect += report.incorrect;
  counts->unknown += report.unknown;

  actors::SegmenterOptions options;
  options.segment_tokens = 96;  // a few turns each: steps span cuts
  options.env = env_config.name;
  schema::TrajectoryId id;
  std::mt19937_64 id_rng(seed * 7919 + 1);
  for (uint8_t& b : id.bytes) b = static_cast<uint8_t>(id_rng());
  actors::Segmenter segmenter(options, id);
  std::vector<schema::SegmentData> segments;
  transcript::Transcript t;
  std::vector<const envs::Image*> shown;  // images added and not yet fed, in stream order
  auto patches = [&](const envs::Observation& o) {
    std::vector<int64_t> counts;
    for (const envs::Image& image : o.images) {
      counts.push_back((image.height / patch_size) * (image.width / patch_size));
      shown.push_back(&image);
    }
    return counts;
  };
  auto feed = [&] {
    size_t image = 0;
    for (const transcript::Run& run : t.Take()) {
      const auto role = static_cast<schema::Role>(run.role);
      if (role == schema::Role::kImage) {
        const envs::Image& picture = *shown.at(image++);
        EXPECT_TRUE(segmenter
                        .AddImage({0, static_cast<uint32_t>(picture.width),
                                   static_cast<uint32_t>(picture.height),
                                   static_cast<uint8_t>(picture.channels), picture.pixels})
                        .ok());
      }
      if (schema::IsAction(role)) {
        for (int32_t token : run.tokens) {
          EXPECT_TRUE(segmenter.AddAction(token, role, -1.0f, 1, {}).ok());
        }
      } else {
        EXPECT_TRUE(segmenter.AddContext(run.tokens, role).ok());
      }
    }
    shown.clear();
    for (schema::SegmentData& s : segmenter.TakeReady()) segments.push_back(std::move(s));
  };
  t.AddSystem(spec.description, envs::RenderToolList(spec.tools));
  const envs::Observation& first = report.observations.front();
  t.AddObservation(envs::TranscriptRole(first.role), first.text, patches(first));
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
    t.AddStepResult(envs::TranscriptRole(r.observation.role), r.observation.text,
                    patches(r.observation), r.done);
    feed();
    segmenter.MarkTurnBoundary(std::nullopt);
  }
  const bool done = !results.empty() && results.back().done;
  Result<std::vector<schema::SegmentData>> rest =
      segmenter.Finish(static_cast<float>(report.outcome.value_or(0.0)),
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
  EXPECT_EQ(report->train_labels.incorrect + report->heldout_labels.incorrect, played_->incorrect);
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
  EXPECT_NEAR(
      static_cast<double>(right) / labelled,
      (report->train_accuracy * n_train + report->heldout_accuracy * n_held) / (n_train + n_held),
      1.5 / labelled);  // a score within rounding of 0.5 may fall either side
}

// The scores do not depend on how the trajectory is cut into chunks, and a trajectory with
// images (which may not straddle a chunk) is scored too.
TEST_F(ProcessModelTest, ScoresDoNotDependOnTheChunkLengthAndTrajectoriesWithImagesScore) {
  ProcessModelOptions options = Options();
  options.max_trajectories = 30;
  options.steps = 20;
  options.output_dir = dir_->Sub("prm-512");
  ASSERT_TRUE(TrainProcessModel(options).ok());
  const std::string short_chunks = dir_->Sub("prm-16");
  std::filesystem::create_directories(short_chunks);
  std::filesystem::copy_file(options.output_dir + "/head.safetensors",
                             short_chunks + "/head.safetensors");
  nlohmann::json info =
      nlohmann::json::parse(std::ifstream(options.output_dir + "/process_model.json"));
  info["chunk_tokens"] = 16;
  std::ofstream(short_chunks + "/process_model.json") << info.dump();
  Result<std::unique_ptr<ProcessRewardModel>> whole = ProcessRewardModel::Load(options.output_dir);
  Result<std::unique_ptr<ProcessRewardModel>> chunked = ProcessRewardModel::Load(short_chunks);
  ASSERT_TRUE(whole.ok() && chunked.ok());

  std::vector<StoredTrajectory> trajectories;
  Result<LabelledStore> store = ReadLabelledStore(dir_->Sub("store"), {}, 5);
  ASSERT_TRUE(store.ok());
  for (LabelledTrajectory& t : store->trajectories) trajectories.push_back(t.trajectory);
  LabelCounts ignored;
  const envs::EnvironmentConfig vision{.name = "vision_count"};
  Result<StoredTrajectory> pictured = JoinSegments(PlayAndSegment(7, &ignored, vision, 0.0));
  ASSERT_TRUE(pictured.ok()) << pictured.status().ToString();
  ASSERT_FALSE(pictured->images.empty());
  trajectories.push_back(*pictured);
  StoredTrajectory stepless = trajectories.front();
  stepless.steps.clear();
  Result<std::vector<double>> none = (*whole)->ScoreSteps(stepless);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
  for (const StoredTrajectory& t : trajectories) {
    Result<std::vector<double>> a = (*whole)->ScoreSteps(t);
    Result<std::vector<double>> b = (*chunked)->ScoreSteps(t);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_EQ(a->size(), t.steps.size());
    ASSERT_EQ(b->size(), t.steps.size());
    for (size_t k = 0; k < a->size(); ++k) EXPECT_NEAR((*a)[k], (*b)[k], 1e-4) << k;
  }
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
