// The learned process reward model on steps a real replay server stored (labelled_episodes.h:
// calculator episodes with random turns among the solver's, labelled by the environment, sent
// through an ActorClient). The head, on a frozen tiny model with random weights, must beat the
// majority baseline on held-out trajectories; with the training labels shuffled it must not.
#include "learner/prm/process_model.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model/config.h"
#include "common/model/model.h"
#include "replay/replay.h"
#include "tests/integration/child_process.h"
#include "tests/learner/prm/labelled_episodes.h"
#include "tests/scratch_dir.h"

namespace strider::reward {
namespace {

using strider::testing::PlayAndSegment;
using strider::testing::SourceDir;
using strider::testing::StoreEpisodes;
using strider::testing::TempDir;

constexpr int kEpisodes = 120;

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
    played_ = new LabelCounts();
    segments_ = StoreEpisodes(server_->actor_endpoint(), 1000, kEpisodes, played_);
    ASSERT_GT(segments_, 0);

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

  // The checkpoint scores the held-out steps as the trained head did: the same accuracy on
  // the trajectories HeldOut names.
  Result<std::unique_ptr<ProcessRewardModel>> prm = ProcessRewardModel::Load(options.output_dir);
  ASSERT_TRUE(prm.ok()) << prm.status().ToString();
  Result<LabelledStore> store = ReadLabelledStore(dir_->Sub("store"));
  ASSERT_TRUE(store.ok());
  int64_t right = 0, labelled = 0, held = 0;
  for (const LabelledTrajectory& t : store->trajectories) {
    if (!HeldOut(t.trajectory.id, options.split_seed, options.heldout_fraction)) continue;
    ++held;
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
  EXPECT_EQ(held, report->heldout_trajectories);
  ASSERT_EQ(labelled, report->heldout_labels.labelled());
  // A score within rounding of 0.5 may fall either side.
  EXPECT_NEAR(static_cast<double>(right) / labelled, report->heldout_accuracy, 1.5 / labelled);
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

  std::vector<schema::StoredTrajectory> trajectories;
  Result<LabelledStore> store = ReadLabelledStore(dir_->Sub("store"), {}, 5);
  ASSERT_TRUE(store.ok());
  for (LabelledTrajectory& t : store->trajectories) trajectories.push_back(t.trajectory);
  LabelCounts ignored;
  const envs::EnvironmentConfig vision{.name = "vision_count"};
  Result<schema::StoredTrajectory> pictured =
      schema::JoinSegments(PlayAndSegment(7, &ignored, vision, 0.0));
  ASSERT_TRUE(pictured.ok()) << pictured.status().ToString();
  ASSERT_FALSE(pictured->images.empty());
  trajectories.push_back(*pictured);
  schema::StoredTrajectory stepless = trajectories.front();
  stepless.steps.clear();
  Result<std::vector<double>> none = (*whole)->ScoreSteps(stepless);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
  for (const schema::StoredTrajectory& t : trajectories) {
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
