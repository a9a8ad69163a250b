// `strider reward train-prm` and `strider reward score-prm`: the learned process reward model
// (learner/prm/process_model.h, docs/rewards.md). Both read a replay store directory read-only, so
// they run beside a live server.
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "envs/environment.h"
#include "learner/prm/process_model.h"

namespace strider::cli {
namespace {

using Json = nlohmann::ordered_json;

struct TrainFlags {
  reward::ProcessModelOptions options;
  int64_t threads = -1;  // -1: the model config's
  std::string relabel_env;
  std::vector<std::string> relabel_options;
};

int TrainPrm(TrainFlags flags) {
  if (!flags.relabel_env.empty() || !flags.relabel_options.empty()) {
    envs::EnvironmentConfig env;
    env.name = flags.relabel_env;
    for (const std::string& option : flags.relabel_options) {
      const size_t eq = option.find('=');
      if (eq == std::string::npos || eq == 0) {
        return ReportError(
            Status::InvalidArgument("--relabel-option: expected key=value, got '" + option + "'"));
      }
      env.options[option.substr(0, eq)] = option.substr(eq + 1);
    }
    flags.options.relabel = std::move(env);
  }
  if (!flags.options.device.empty()) {
    if (Result<c10::Device> device = ResolveDevice(flags.options.device); !device.ok()) {
      return ReportError(device.status().WithContext("--device"));
    }
  }
  if (flags.threads >= 0) {
    ConfigureRuntime(flags.threads);
  } else {
    Result<ModelConfig> config = LoadModelConfig(flags.options.model_config);
    if (!config.ok()) return ReportError(config.status());
    ConfigureRuntime(config->threads);
  }
  Result<reward::ProcessModelReport> report = reward::TrainProcessModel(flags.options);
  if (!report.ok()) return ReportError(report.status());
  std::cout << reward::ProcessModelReportJson(*report) << std::endl;
  return kExitOk;
}

struct ScoreFlags {
  std::string checkpoint;
  std::string store;
  replay::ListFilter filter;
  int64_t max_trajectories = 0;
  int64_t threads = 2;
  std::string device;  // empty: the policy model config's device:
};

// One line per trajectory (its scores beside the stored labels), then a summary with the
// accuracy on the labelled steps among them.
int ScorePrm(const ScoreFlags& flags) {
  ConfigureRuntime(flags.threads);
  if (!flags.device.empty()) {
    if (Result<c10::Device> device = ResolveDevice(flags.device); !device.ok()) {
      return ReportError(device.status().WithContext("--device"));
    }
  }
  Result<std::unique_ptr<reward::ProcessRewardModel>> prm =
      reward::ProcessRewardModel::Load(flags.checkpoint, flags.device);
  if (!prm.ok()) return ReportError(prm.status());
  Result<reward::LabelledStore> store =
      reward::ReadLabelledStore(flags.store, flags.filter, flags.max_trajectories);
  if (!store.ok()) return ReportError(store.status());
  int64_t steps = 0, labelled = 0, right = 0;
  for (const reward::LabelledTrajectory& t : store->trajectories) {
    Result<std::vector<double>> scores = (*prm)->ScoreSteps(t.trajectory);
    if (!scores.ok()) {
      return ReportError(scores.status().WithContext("trajectory " + t.trajectory.id.Hex()));
    }
    Json labels = Json::array();
    for (size_t k = 0; k < scores->size(); ++k) {
      labels.push_back(schema::StepLabelName(t.labels[k]));
      if (t.labels[k] == schema::StepLabel::kUnknown) continue;
      ++labelled;
      right += ((*scores)[k] > 0.5) == (t.labels[k] == schema::StepLabel::kCorrect);
    }
    steps += static_cast<int64_t>(scores->size());
    std::cout << Json({{"trajectory", t.trajectory.id.Hex()},
                       {"env", t.trajectory.env},
                       {"scores", *scores},
                       {"labels", labels}})
                     .dump()
              << "\n";
  }
  Json summary = {
      {"summary", "score-prm"},
      {"trajectories", store->trajectories.size()},
      {"steps", steps},
      {"labelled_steps", labelled},
      {"accuracy", labelled > 0 ? Json(static_cast<double>(right) / labelled) : Json(nullptr)}};
  std::cout << summary.dump() << std::endl;
  return kExitOk;
}

}  // namespace

void AddRewardCommands(CLI::App& app, int& exit_code) {
  CLI::App* reward = app.add_subcommand("reward", "Rewards: the learned process reward model");
  reward->require_subcommand(1);

  auto train = std::make_shared<TrainFlags>();
  reward::ProcessModelOptions& o = train->options;
  CLI::App* train_prm = reward->add_subcommand(
      "train-prm",
      "Train a process reward model head on the labelled steps of a replay store; prints one "
      "JSON line with the held-out accuracy and the majority baseline");
  train_prm->add_option("--store", o.store_path, "Replay store directory (read-only)")
      ->required()
      ->check(CLI::ExistingDirectory);
  train_prm->add_option("--model", o.model_config, "Policy model config YAML (frozen)")
      ->required()
      ->check(CLI::ExistingFile);
  train_prm->add_option("--weights", o.model_weights, "Policy model weights (.safetensors)")
      ->required()
      ->check(CLI::ExistingFile);
  train_prm->add_option("--out", o.output_dir,
                        "Checkpoint directory (head.safetensors, process_model.json)");
  train_prm->add_option("--env", o.filter.env, "Only trajectories of this environment");
  train_prm->add_option("--max-trajectories", o.max_trajectories,
                        "Read at most N complete trajectories (0: all)");
  train_prm
      ->add_option("--heldout-fraction", o.heldout_fraction,
                   "Fraction of trajectories held out for the accuracy")
      ->capture_default_str();
  train_prm->add_option("--split-seed", o.split_seed, "Seed of the train / held-out split");
  train_prm->add_option("--hidden-units", o.hidden_units, "Hidden layer width (0: linear head)")
      ->capture_default_str();
  train_prm->add_option("--steps", o.steps, "AdamW steps")->capture_default_str();
  train_prm->add_option("--batch-size", o.batch_size, "Labelled steps per AdamW step (0: all)")
      ->capture_default_str();
  train_prm->add_option("--learning-rate", o.learning_rate, "AdamW learning rate")
      ->capture_default_str();
  train_prm->add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  train_prm->add_option("--seed", o.seed, "Seed of the head's initialisation and batches");
  train_prm
      ->add_option("--chunk-tokens", o.chunk_tokens,
                   "Positions per inference-path chunk when reading hidden states")
      ->capture_default_str();
  train_prm->add_option("--relabel-env", train->relabel_env,
                        "Label steps by replaying each trajectory against this environment "
                        "instead of the stored labels");
  train_prm->add_option("--relabel-option", train->relabel_options,
                        "KEY=VALUE option of the replaying environment (repeatable; the stored "
                        "env_option.* metadata wins)");
  train_prm->add_flag("--shuffle-labels", o.shuffle_labels,
                      "Control run: permute the training labels (held-out ones stay true)");
  train_prm->add_option("--device", o.device,
                        "cpu, cuda or cuda:N for the policy model (default: its config's device:)");
  train_prm->add_option("--threads", train->threads,
                        "Intra-op threads (0: all cores; default: the model config's)");
  train_prm->callback([train, &exit_code] { exit_code = TrainPrm(*train); });

  auto score = std::make_shared<ScoreFlags>();
  CLI::App* score_prm = reward->add_subcommand(
      "score-prm",
      "Score every step of a store's complete trajectories with a trained process reward model; "
      "one JSON line per trajectory, then a summary with the accuracy on labelled steps");
  score_prm->add_option("--checkpoint", score->checkpoint, "Directory written by train-prm")
      ->required()
      ->check(CLI::ExistingDirectory);
  score_prm->add_option("--store", score->store, "Replay store directory (read-only)")
      ->required()
      ->check(CLI::ExistingDirectory);
  score_prm->add_option("--env", score->filter.env, "Only trajectories of this environment");
  score_prm->add_option("--trajectory", score->filter.trajectory_id,
                        "Only trajectories whose id starts with this hex prefix");
  score_prm->add_option("--max-trajectories", score->max_trajectories,
                        "Score at most N trajectories (0: all)");
  score_prm->add_option("--device", score->device,
                        "cpu, cuda or cuda:N for the policy model (default: its config's device:)");
  score_prm->add_option("--threads", score->threads, "Intra-op threads (0: all cores)")
      ->capture_default_str();
  score_prm->callback([score, &exit_code] { exit_code = ScorePrm(*score); });
}

}  // namespace strider::cli
