#include "learner/rl/rl_learner.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/model/model.h"
#include "common/transport/weight_stream.h"
#include "learner/checkpoint.h"
#include "learner/distributed.h"
#include "learner/learner.h"
#include "learner/progress.h"
#include "learner/rl/rl_step.h"
#include "replay/client.h"
#include "learner/prm/process_model.h"

namespace strider::rl {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string PublishedVersionPath(const std::string& run_dir) {
  return run_dir + "/published_version";
}

// The highest version this run directory ever published (0: none).
Result<uint64_t> ReadPublishedVersion(const std::string& run_dir) {
  const std::string path = PublishedVersionPath(run_dir);
  if (!fs::exists(path)) return uint64_t{0};
  std::ifstream in(path);
  uint64_t version = 0;
  if (!(in >> version)) {
    return Status::Corruption(path + ": not a version number; it records the highest version "
                              "this run published (delete it only if no actor holds one)");
  }
  return version;
}

// Durable before the version is served, so no crash can make a later run reuse it.
Status WritePublishedVersion(const std::string& run_dir, uint64_t version) {
  const std::string path = PublishedVersionPath(run_dir);
  const std::string tmp = path + ".tmp";
  const std::string text = std::to_string(version) + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::IoError("cannot write " + tmp);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!written || !synced) return Status::IoError("cannot write " + tmp + " (disk full?)");
  std::error_code error;
  fs::rename(tmp, path, error);
  if (error) return Status::IoError("cannot rename " + tmp + ": " + error.message());
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadReference(const RlLearnerConfig& config) {
  const std::string& reference = config.scoring.reference;
  if (reference == "none") return std::unique_ptr<Model>();
  std::unique_ptr<Model> model;
  if (reference == "initial") {
    if (config.init.empty()) {
      STRIDER_ASSIGN_OR_RETURN(model,
                               Model::Create(config.model, static_cast<uint64_t>(config.init_seed)));
    } else {
      STRIDER_ASSIGN_OR_RETURN(model, Model::Load(config.model, config.init));
    }
  } else {
    STRIDER_ASSIGN_OR_RETURN(model, Model::Load(config.model, reference));
  }
  model->SetRequiresGrad(false);
  return model;
}

// The router's record of a rank that trained nothing this step: every sparse layer with no
// positions, so the rank still takes part in gathering the group's record.
RoutingRecord EmptyRouting(const Model& model) {
  const ModelConfig& c = model.config();
  RoutingRecord record;
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    if (!c.IsMoeLayer(layer)) continue;
    record.layers.push_back(
        {at::zeros({1, 0, c.feed_forward.experts_per_token}, at::kLong),
         at::zeros({1, 0, c.feed_forward.routed_experts}, at::TensorOptions(model.dtype()))});
  }
  return record;
}

// Every rank's routing record joined along the positions, so each rank fits the router
// biases on the same statistics and the weights stay identical.
Result<RoutingRecord> GatherRouting(LearnerGroup& group, const Model& model,
                                    RoutingRecord record) {
  if (record.layers.empty()) record = EmptyRouting(model);
  RoutingRecord joined;
  for (RoutingRecord::Layer& layer : record.layers) {
    RoutingRecord::Layer out;
    STRIDER_ASSIGN_OR_RETURN(out.experts, group.AllGatherAlong(layer.experts.reshape(
                                              {1, -1, layer.experts.size(-1)}), 1));
    STRIDER_ASSIGN_OR_RETURN(out.scores, group.AllGatherAlong(layer.scores.reshape(
                                             {1, -1, layer.scores.size(-1)}), 1));
    joined.layers.push_back(std::move(out));
  }
  return joined;
}

// Tokens routed to each expert, per sparse layer, from the record the balance already keeps:
// the metrics line's expert_load, which the launcher's status page draws as a heat map.
Result<std::vector<std::vector<int64_t>>> ExpertLoad(const RoutingRecord& record,
                                                     int64_t experts) {
  std::vector<std::vector<int64_t>> load;
  try {
    for (const RoutingRecord::Layer& layer : record.layers) {
      const at::Tensor counts =
          at::bincount(layer.experts.reshape({-1}).to(at::kLong), {}, experts).contiguous();
      load.emplace_back(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
    }
  } catch (const c10::Error& error) {
    return Status::Internal(std::string("expert load: ") + error.what_without_backtrace());
  }
  return load;
}

double Mean(const std::vector<double>& values, size_t begin, size_t end) {
  if (end <= begin) return 0;
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += values[i];
  return sum / static_cast<double>(end - begin);
}

// Joins the learner ranks of config.distributed and makes this rank start where rank 0 does:
// the same config (what a step is), rank 0's position, weights and optimiser moments.
Result<std::unique_ptr<LearnerGroup>> JoinLearnerGroup(const RlLearnerConfig& config,
                                                       CheckpointState* state, Trainer& trainer) {
  const RlDistributedConfig& dist = config.distributed;
  STRIDER_ASSIGN_OR_RETURN(Rendezvous rendezvous, ParseRendezvous(dist.rendezvous));
  LearnerGroupOptions group_options;
  group_options.rank = static_cast<int>(dist.rank);
  group_options.world_size = static_cast<int>(dist.world_size);
  group_options.host = rendezvous.host;
  group_options.port = rendezvous.port;
  group_options.interface = dist.interface;
  group_options.timeout_s = dist.timeout_s;
  group_options.bucket_bytes = static_cast<int64_t>(dist.bucket_mb * (1 << 20));
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<LearnerGroup> group, LearnerGroup::Join(group_options));
  // One config for the whole group: ranks that disagree on what a step is would pair their
  // collectives wrongly or train different models, so the settings that shape a step must
  // match rank 0's.
  const std::string shape =
      config.model.name + "|" + std::to_string(config.replay.units_per_step) + "|" +
      config.replay.table + "|" + config.replay.learner_id + "|" +
      std::to_string(config.train.ppo_epochs) + "|" + std::to_string(config.train.minibatches) +
      "|" + std::to_string(config.train.chunk_tokens) + "|" + config.train.backprop + "|" +
      std::to_string(config.optimizer.learning_rate) + "|" + std::to_string(config.balance) +
      "|" + std::to_string(config.train.steps) + "|" + std::to_string(config.train.sync) + "|" +
      std::to_string(dist.expert_parallel);
  const int64_t fingerprint =
      static_cast<int64_t>(std::hash<std::string>{}(shape) & 0x7fffffffffffffffULL);
  STRIDER_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> fingerprints,
                           group->AllGather({fingerprint}));
  for (size_t r = 1; r < fingerprints.size(); ++r) {
    if (fingerprints[r].front() != fingerprints[0].front()) {
      return Status::FailedPrecondition(
          "learner rank " + std::to_string(r) + "'s config differs from rank 0's in what a "
          "step is (model, replay table, learner id, units_per_step, train or optimizer "
          "settings, expert_parallel): every rank runs the same config");
    }
  }
  // Resumed together, from rank 0's checkpoint: its weights, optimiser moments and position
  // are the group's. A rank whose own checkpoint is of another step (it was killed between
  // two checkpoints, or has none) takes them all and says so; only its mini-batch order
  // then differs from an uninterrupted run's.
  STRIDER_ASSIGN_OR_RETURN(
      std::vector<std::vector<int64_t>> positions,
      group->AllGather({state->step, static_cast<int64_t>(state->policy_version),
                        state->sample_step, state->total_tokens, trainer.optimizer().step()}));
  const std::vector<int64_t>& lead = positions[0];
  if (dist.expert_parallel) {
    // Each rank's experts come from its own checkpoint only: they must all be of one step.
    for (size_t r = 1; r < positions.size(); ++r) {
      if (positions[r][0] != lead[0]) {
        return Status::FailedPrecondition(
            "expert-parallel learner rank " + std::to_string(r) + " resumes from step " +
            std::to_string(positions[r][0]) + ", rank 0 from step " + std::to_string(lead[0]) +
            ": each rank's experts are only in its own checkpoint, so the ranks resume from "
            "checkpoints of one step (RUN_DIR/checkpoints/latest and RUN_DIR/rank-r/"
            "checkpoints/latest of the same run)");
      }
    }
  }
  if (lead[0] != state->step) {
    spdlog::warn("learner rank {}: its checkpoint is at step {}, rank 0's at step {}; taking "
                 "rank 0's weights, optimiser state and position",
                 dist.rank, state->step, lead[0]);
  }
  state->step = lead[0];
  state->policy_version = static_cast<uint64_t>(lead[1]);
  state->sample_step = lead[2];
  state->total_tokens = lead[3];
  trainer.optimizer().set_step(lead[4]);
  // Expert-parallel ranks each hold their own experts (and their moments): those stay.
  auto replicated = [&](const std::string& name) {
    return !dist.expert_parallel || !IsRoutedExpertTensor(name);
  };
  std::vector<at::Tensor> tensors;
  for (const auto& [name, tensor] : trainer.model().tensors()) {
    if (replicated(name)) tensors.push_back(tensor);
  }
  const std::vector<at::Tensor> moments = trainer.optimizer().MomentTensors();
  const auto& named = trainer.optimizer().parameters();
  for (size_t i = 0; i < moments.size(); ++i) {
    if (replicated(named[i % named.size()].first)) tensors.push_back(moments[i]);
  }
  STRIDER_RETURN_IF_ERROR(group->Broadcast(tensors, 0));
  return group;
}

}  // namespace

Result<RlRunSummary> RunRlLearner(const RlLearnerConfig& config, const RlRunOptions& options) {
  ConfigureRuntime(config.threads > 0 ? config.threads : config.model.threads);
  const auto run_started = Clock::now();
  const RlDistributedConfig& dist = config.distributed;
  const bool distributed = dist.world_size > 1;
  // Rank 0 owns the run directory (published versions, the metrics the launcher reads); the
  // other ranks keep their metrics and checkpoints beside it.
  const std::string run_dir =
      distributed && dist.rank > 0 ? options.run_dir + "/rank-" + std::to_string(dist.rank)
                                   : options.run_dir;
  std::error_code error;
  fs::create_directories(run_dir, error);
  if (error) return Status::IoError("cannot create run directory " + run_dir);
  STRIDER_ASSIGN_OR_RETURN(Progress progress,
                           Progress::Open(run_dir + "/metrics.jsonl", /*bar=*/0));

  // Where to start.
  CheckpointState state;
  if (!options.resume.empty()) {
    STRIDER_ASSIGN_OR_RETURN(state, ReadCheckpointState(options.resume));
    if (state.mode != "rl") {
      return Status::InvalidArgument("checkpoint " + options.resume + " was written by mode '" +
                                     state.mode + "', not rl");
    }
  }
  const int64_t updates_per_step = config.train.ppo_epochs * config.train.minibatches;
  TrainerOptions trainer_options;
  trainer_options.seed = config.seed;
  trainer_options.init_seed = config.init_seed;
  trainer_options.initial_weights = config.init;
  trainer_options.optimizer = config.optimizer;
  trainer_options.schedule.peak = config.optimizer.learning_rate;
  trainer_options.schedule.warmup_steps = config.train.warmup_steps;
  trainer_options.schedule.total_steps = std::max<int64_t>(1, config.train.steps * updates_per_step);
  trainer_options.schedule.min_ratio = config.train.min_learning_rate_ratio;
  trainer_options.router_learning_rate_scale = config.router_learning_rate_scale;
  trainer_options.balance = config.balance;
  const bool expert_parallel = distributed && dist.expert_parallel;
  if (expert_parallel) {
    trainer_options.expert_rank = dist.rank;
    trainer_options.expert_world_size = dist.world_size;
  }
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                           Trainer::Create(config.model, trainer_options, options.resume));
  Model& model = trainer->model();
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Model> reference, LoadReference(config));
  if (expert_parallel && reference != nullptr) {
    STRIDER_RETURN_IF_ERROR(reference->ShardExperts(dist.rank, dist.world_size));
  }

  std::unique_ptr<LearnerGroup> group;
  std::unique_ptr<ChunkRounds> rounds;
  // The parameters whose gradients the ranks sum: all but an expert-parallel rank's experts.
  std::vector<at::Tensor> reduced;
  if (distributed) {
    STRIDER_ASSIGN_OR_RETURN(group, JoinLearnerGroup(config, &state, *trainer));
    for (const auto& [name, tensor] : trainer->optimizer().parameters()) {
      if (!(expert_parallel && IsRoutedExpertTensor(name))) reduced.push_back(tensor);
    }
  }
  if (expert_parallel) {
    rounds = group->ExpertRounds({&model, reference.get()});
    // Clipping's global norm adds every rank's experts.
    trainer->optimizer().ShardNorm(IsRoutedExpertTensor, [&group](double own) -> Result<double> {
      std::vector<double> sum = {own};
      STRIDER_RETURN_IF_ERROR(group->AllReduceSum(sum));
      return sum[0];
    });
  }

  std::unique_ptr<reward::ProcessRewardModel> process_model;
  if (config.reward.UsesProcessModel()) {
    STRIDER_ASSIGN_OR_RETURN(process_model, reward::ProcessRewardModel::Load(config.process_model));
  }
  StepSettings settings;
  settings.process_model = process_model.get();
  settings.scoring.replay_routing = config.scoring.replay_routing;
  settings.scoring.mismatch_threshold = config.scoring.mismatch_threshold;
  settings.scoring.rounds = rounds.get();
  settings.objective = config.objective;
  settings.reward = config.reward;
  settings.chunk_tokens = config.train.chunk_tokens;
  settings.truncated_backprop = config.train.backprop == "truncated";
  // A fresh run starts from the weights its actors were given (version 0); a resumed one
  // publishes its own at once below, and until then they are no published version.
  if (options.resume.empty()) settings.weights_version = state.policy_version;

  // Versions: above every one this run directory published, whatever the checkpoint says.
  STRIDER_ASSIGN_OR_RETURN(const uint64_t published_before, ReadPublishedVersion(run_dir));
  uint64_t version = std::max(state.policy_version, published_before);
  RlRunSummary summary;
  const std::string publish_endpoint =
      options.publish_endpoint.empty() ? config.publish.endpoint : options.publish_endpoint;
  std::unique_ptr<transport::WeightPublisher> publisher;
  double publish_seconds = 0;
  double gather_seconds = 0;  // expert-parallel: gathering the experts for a publish
  bool initial_publish = false;
  auto publish = [&]() -> Status {
    // Expert-parallel ranks gather the experts to rank 0, which publishes whole weights.
    std::map<std::string, at::Tensor> whole_experts;
    if (expert_parallel) {
      const auto started = Clock::now();
      for (const auto& [name, tensor] : model.tensors()) {
        if (!IsRoutedExpertTensor(name)) continue;
        STRIDER_ASSIGN_OR_RETURN(whole_experts[name], group->GatherTo(tensor, 0));
      }
      gather_seconds = Seconds(started);
    }
    if (publisher == nullptr) {
      // The other ranks of a group count the versions rank 0 publishes, so their samples ask
      // for the same version and their mismatch checks compare the same policy.
      if (distributed && dist.rank > 0) {
        ++version;
        settings.weights_version = version;
      }
      return Status::Ok();
    }
    const auto started = Clock::now();
    STRIDER_ASSIGN_OR_RETURN(std::string bytes, expert_parallel
                                                    ? model.SaveWholeToBytes(whole_experts)
                                                    : model.SaveToBytes());
    STRIDER_RETURN_IF_ERROR(WritePublishedVersion(run_dir, version + 1));
    ++version;
    STRIDER_RETURN_IF_ERROR(publisher->Publish(version, std::move(bytes), config.model.name));
    settings.weights_version = version;
    publish_seconds = Seconds(started);
    spdlog::info("learner: published version {} in {:.3f} s", version, publish_seconds);
    return Status::Ok();
  };
  if (!publish_endpoint.empty() && (!distributed || dist.rank == 0)) {
    transport::WeightPublisherOptions publisher_options;
    publisher_options.endpoint = publish_endpoint;
    publisher_options.chunk_bytes = static_cast<uint32_t>(config.publish.chunk_bytes);
    publisher_options.keep_versions = static_cast<int>(config.publish.keep_versions);
    publisher_options.auth = config.publish.auth;
    STRIDER_ASSIGN_OR_RETURN(publisher, transport::WeightPublisher::Start(publisher_options));
    summary.publish_endpoint = publisher->endpoint();
    // A resumed learner's weights are older than what the actors may hold: move them onto it
    // (expert-parallel ranks below, all together, as the experts are gathered).
    initial_publish = !options.resume.empty() || published_before > state.policy_version;
    if (initial_publish && !expert_parallel) STRIDER_RETURN_IF_ERROR(publish());
  }
  if (group != nullptr) {
    // Rank 0's versions are the group's: it alone knows what its run directory published.
    STRIDER_ASSIGN_OR_RETURN(
        std::vector<std::vector<int64_t>> versions,
        group->AllGather({static_cast<int64_t>(version),
                          settings.weights_version ? static_cast<int64_t>(*settings.weights_version)
                                                   : int64_t{-1},
                          initial_publish ? 1 : 0}));
    version = static_cast<uint64_t>(versions[0][0]);
    if (versions[0][1] >= 0) {
      settings.weights_version = static_cast<uint64_t>(versions[0][1]);
    } else {
      settings.weights_version.reset();
    }
    if (expert_parallel && versions[0][2] != 0) STRIDER_RETURN_IF_ERROR(publish());
  }

  replay::LearnerClientOptions client_options;
  client_options.endpoint =
      options.replay_endpoint.empty() ? config.replay.endpoint : options.replay_endpoint;
  client_options.learner_id = config.replay.learner_id;
  client_options.table = config.replay.table;
  client_options.auth = config.replay.auth;
  client_options.rank = static_cast<uint32_t>(dist.rank);
  client_options.world_size = static_cast<uint32_t>(dist.world_size);
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::LearnerClient> client,
                           replay::LearnerClient::Connect(client_options));
  spdlog::info("learner: mode rl, model {}, replay {} table '{}', weights {}, from step {}",
               config.model.name, client_options.endpoint, config.replay.table,
               summary.publish_endpoint.empty() ? "not published" : summary.publish_endpoint,
               state.step);
  if (options.on_ready) options.on_ready(summary.publish_endpoint);

  int64_t step = state.step;
  int64_t total_tokens = state.total_tokens;
  const int64_t last_step =
      options.max_steps >= 0 ? std::min(config.train.steps, step + options.max_steps)
                             : config.train.steps;
  std::vector<double> reward_means;
  auto checkpoint = [&](const std::string& name) {
    CheckpointState out;
    out.mode = "rl";
    out.model = config.model.name;
    out.seed = config.seed;
    out.step = step;
    out.policy_version = version;
    out.sample_step = step;
    out.total_tokens = total_tokens;
    out.sampler_cursor = config.replay.learner_id;
    return trainer->WriteCheckpoint(run_dir + "/checkpoints/" + name, out);
  };

  auto stop_requested = [&] { return options.stop != nullptr && options.stop->load(); };
  while (step < last_step) {
    // A group stops together (below), at the step one of its ranks was asked to stop at.
    if (stop_requested() && group == nullptr) break;
    const auto step_started = Clock::now();
    // 1. Sample, in short waits so a stop request is seen.
    Result<replay::SampleBatch> batch = Status::ResourceExhausted("not sampled");
    const auto deadline =
        step_started + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(config.replay.sample_timeout_s));
    while (!stop_requested()) {
      batch = client->Sample(static_cast<uint64_t>(step + 1),
                             static_cast<uint32_t>(config.replay.units_per_step), version,
                             std::chrono::milliseconds(1000));
      if (batch.ok()) break;
      // Not ready yet, or the server busy or restarting: both pass, up to the step's deadline.
      const StatusCode code = batch.status().code();
      if (code != StatusCode::kResourceExhausted && code != StatusCode::kUnavailable) break;
      if (Clock::now() >= deadline || (options.stop != nullptr && options.stop->load())) break;
      if (code == StatusCode::kUnavailable) {
        spdlog::warn("learner step {}: {}; retrying", step + 1, batch.status().ToString());
      }
    }
    const bool stopping = !batch.ok() && stop_requested();
    if (!batch.ok() && !stopping) {
      return batch.status().WithContext("learner step " + std::to_string(step + 1) +
                                        ": sampling from " + client_options.endpoint);
    }
    if (group != nullptr) {
      // The ranks that sampled leave their draws unused: the server keeps each step's draw, so
      // a resumed group trains on exactly these units.
      std::vector<double> anyone_stopping = {stopping ? 1.0 : 0.0};
      STRIDER_RETURN_IF_ERROR(group->AllReduceSum(anyone_stopping));
      if (anyone_stopping[0] > 0) break;
    } else if (stopping) {
      break;
    }
    const double sample_seconds = Seconds(step_started);
    const auto compute_started = Clock::now();
    std::vector<schema::SegmentData> segments;
    for (replay::SampledItem& item : batch->items) segments.push_back(std::move(item.segment));
    std::vector<SampledGroup> groups = SplitBatch(std::move(segments));
    OrderByProvenance(groups);

    // 2-3. Score, shape, advantages.
    STRIDER_ASSIGN_OR_RETURN(PreparedBatch prepared,
                             PrepareBatch(model, reference.get(), groups, settings));
    if (rounds != nullptr) STRIDER_RETURN_IF_ERROR(rounds->Drain());
    std::vector<const TrainingTrajectory*> kept;
    double reward_sum = 0, staleness_sum = 0;
    int64_t successes = 0, finished = 0;
    for (const TrainingTrajectory& t : prepared.trajectories) {
      reward_sum += t.outcome;
      staleness_sum += static_cast<double>(version - std::min(version, t.min_version));
      if (t.finished) {
        ++finished;
        successes += t.outcome > 0;
      }
      if (t.excluded) {
        spdlog::warn("learner step {}: trajectory {} excluded: {}", step + 1,
                     t.prepared.joined.id.Hex(), t.excluded_reason);
        ++summary.excluded_trajectories;
        continue;
      }
      kept.push_back(&t);
    }
    // The group's step in one set of figures: the batch is the union of the ranks' slices.
    std::vector<double> totals = {reward_sum,
                                  staleness_sum,
                                  static_cast<double>(successes),
                                  static_cast<double>(finished),
                                  static_cast<double>(prepared.trajectories.size()),
                                  static_cast<double>(kept.size()),
                                  static_cast<double>(prepared.tokens),
                                  static_cast<double>(prepared.action_tokens)};
    if (group != nullptr) STRIDER_RETURN_IF_ERROR(group->AllReduceSum(totals));
    reward_sum = totals[0];
    staleness_sum = totals[1];
    successes = static_cast<int64_t>(totals[2]);
    finished = static_cast<int64_t>(totals[3]);
    const double trajectories = totals[4];
    const int64_t kept_total = static_cast<int64_t>(totals[5]);
    const int64_t batch_tokens = static_cast<int64_t>(totals[6]);
    const int64_t batch_action_tokens = static_cast<int64_t>(totals[7]);

    // 4. Epochs and mini-batches.
    const auto update_started = Clock::now();
    UpdateMetrics update;
    TrainerStep last;
    double violation = -1;
    std::vector<std::vector<int64_t>> expert_load;  // (sparse layers, routed experts)
    int64_t updates = 0;
    const LearnerGroupStats group_before =
        group != nullptr ? group->stats() : LearnerGroupStats{};
    if (kept_total > 0) {
      RoutingRecord routing;
      // Every rank runs the same number of updates (collectives pair up), some of them perhaps
      // on an empty share.
      const int64_t minibatches =
          group != nullptr
              ? config.train.minibatches
              : std::min<int64_t>(config.train.minibatches, static_cast<int64_t>(kept.size()));
      for (int64_t epoch = 0; epoch < config.train.ppo_epochs; ++epoch) {
        std::vector<const TrainingTrajectory*> order = kept;
        if (kept.size() > 1) {
          // randperm takes the generator's lock itself.
          const at::Tensor perm = at::randperm(static_cast<int64_t>(kept.size()),
                                               trainer->generator(),
                                               at::TensorOptions().dtype(at::kLong));
          const int64_t* p = perm.data_ptr<int64_t>();
          for (size_t i = 0; i < kept.size(); ++i) order[i] = kept[p[i]];
        }
        for (int64_t m = 0; m < minibatches; ++m) {
          const size_t begin = order.size() * m / minibatches;
          const size_t end = order.size() * (m + 1) / minibatches;
          std::span<const TrainingTrajectory* const> part(order.data() + begin, end - begin);
          trainer->ZeroGrad();
          std::function<void(const at::Tensor&)> overlap;
          if (group != nullptr) {
            STRIDER_RETURN_IF_ERROR(group->PrepareGradients(reduced));
            overlap = [&group](const at::Tensor& loss) { group->OverlapNextBackward(loss); };
          }
          // The loss is aggregated over the group's mini-batch: every rank weighs its share by
          // the action-token counts of all of it (rank order).
          std::vector<int64_t> all_counts;
          size_t offset = 0;
          if (group != nullptr) {
            std::vector<int64_t> own;
            for (const TrainingTrajectory* t : part) {
              own.push_back(static_cast<int64_t>(t->prepared.positions.size()));
            }
            STRIDER_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> counts,
                                     group->AllGather(own));
            for (int r = 0; r < group->world_size(); ++r) {
              if (r < group->rank()) offset += counts[r].size();
              all_counts.insert(all_counts.end(), counts[r].begin(), counts[r].end());
            }
            if (all_counts.empty()) continue;  // an empty share on every rank
          }
          STRIDER_ASSIGN_OR_RETURN(
              UpdateMetrics metrics,
              AccumulateGradients(model, part, settings,
                                  config.balance && epoch == 0 ? &routing : nullptr,
                                  group != nullptr ? &all_counts : nullptr, offset,
                                  overlap));
          if (rounds != nullptr) STRIDER_RETURN_IF_ERROR(rounds->Drain());
          if (group != nullptr) STRIDER_RETURN_IF_ERROR(group->AllReduceGradients(reduced));
          STRIDER_ASSIGN_OR_RETURN(last, trainer->Step(trainer->optimizer().step()));
          settings.weights_version.reset();
          ++updates;
          update.loss += metrics.loss;
          update.policy_loss += metrics.policy_loss;
          update.kl_loss += metrics.kl_loss;
          update.entropy_loss += metrics.entropy_loss;
          update.value_loss += metrics.value_loss;
          update.metrics.Add(metrics.metrics);
          update.tokens += metrics.tokens;
        }
      }
      if (config.balance && group != nullptr) {
        STRIDER_ASSIGN_OR_RETURN(RoutingRecord joined,
                                 GatherRouting(*group, model, std::move(routing)));
        STRIDER_ASSIGN_OR_RETURN(expert_load,
                                 ExpertLoad(joined, model.config().feed_forward.routed_experts));
        STRIDER_ASSIGN_OR_RETURN(violation, trainer->BalanceRouting(std::move(joined)));
      } else if (config.balance && !routing.layers.empty()) {
        STRIDER_ASSIGN_OR_RETURN(expert_load,
                                 ExpertLoad(routing, model.config().feed_forward.routed_experts));
        STRIDER_ASSIGN_OR_RETURN(violation, trainer->BalanceRouting(std::move(routing)));
      }
    }
    const double update_seconds = Seconds(update_started);
    ++step;
    total_tokens += batch_tokens;

    // 5. Publish.
    publish_seconds = 0;
    // Weights no update changed are the version already out: nothing new to publish, except in
    // sync mode, where the actors wait for a new version before their next round.
    if (step % config.publish.every_steps == 0 &&
        (!settings.weights_version.has_value() || config.train.sync)) {
      STRIDER_RETURN_IF_ERROR(publish());
    }
    const double compute_seconds = Seconds(compute_started);
    const double step_seconds = Seconds(step_started);

    // 6. Metrics and checkpoints.
    const double reward_mean = trajectories > 0 ? reward_sum / trajectories : 0;
    reward_means.push_back(reward_mean);
    const double per_update = updates > 0 ? 1.0 / static_cast<double>(updates) : 0;
    nlohmann::ordered_json line = {
        {"time", UnixSeconds()},
        {"role", "learner"},
        {"step", step},
        {"policy_version", version},
        {"reward_mean", reward_mean},
        {"success_rate", finished > 0 ? static_cast<double>(successes) / finished : 0.0},
        {"trajectories", static_cast<int64_t>(trajectories)},
        {"trained_trajectories", kept_total},
        {"excluded_trajectories", static_cast<int64_t>(trajectories) - kept_total},
        {"mismatch_excluded", prepared.mismatch_excluded},
        {"filtered_groups", prepared.filtered_groups},
        {"logprob_mismatch_max", prepared.mismatch_max},
        {"logprob_mismatch_p99", prepared.mismatch_p99},
        {"mismatch_measured", prepared.mismatch_measured},
        {"loss", update.loss * per_update},
        {"policy_loss", update.policy_loss * per_update},
        {"kl", update.metrics.kl()},
        {"approx_kl", update.metrics.approx_kl()},
        {"clip_fraction", update.metrics.clip_fraction()},
        {"importance_mean", update.metrics.importance_mean()},
        {"entropy", update.metrics.entropy()},
        {"value_loss", update.value_loss * per_update},
        {"staleness_mean", trajectories > 0 ? staleness_sum / trajectories : 0.0},
        {"max_violation", violation},
        {"learning_rate", last.learning_rate},
        {"gradient_norm", last.gradient_norm},
        {"updates", updates},
        {"tokens", batch_tokens},
        {"action_tokens", batch_action_tokens},
        {"tokens_per_second", batch_tokens / std::max(step_seconds, 1e-9)},
        {"sample_seconds", sample_seconds},
        {"score_seconds", prepared.score_seconds},
        {"update_seconds", update_seconds},
        {"publish_seconds", publish_seconds},
        {"step_seconds", step_seconds},
        {"busy_fraction", compute_seconds / std::max(step_seconds, 1e-9)},
    };
    if (group != nullptr) {
      // Counts above are the group's; mismatch, loss and timing figures this rank's.
      line["rank"] = group->rank();
      line["world_size"] = group->world_size();
      line["allreduce_seconds"] = group->stats().allreduce_seconds - group_before.allreduce_seconds;
      line["allreduce_buckets"] = group->stats().buckets - group_before.buckets;
      line["allreduce_buckets_during_backward"] =
          group->stats().buckets_during_backward - group_before.buckets_during_backward;
      if (expert_parallel) {
        line["expert_parallel"] = group->world_size();
        line["expert_rounds"] = group->stats().rounds - group_before.rounds;
        line["expert_rounds_served"] = group->stats().rounds_served - group_before.rounds_served;
        line["expert_gather_seconds"] = gather_seconds;
      }
    }
    if (!std::isfinite(last.gradient_norm)) line["gradient_norm"] = nullptr;
    // Nothing measured is not a measured zero.
    if (prepared.mismatch_measured == 0) {
      line["logprob_mismatch_max"] = nullptr;
      line["logprob_mismatch_p99"] = nullptr;
    }
    if (updates == 0) {
      for (const char* key : {"loss", "policy_loss", "kl", "approx_kl", "clip_fraction",
                              "importance_mean", "entropy", "value_loss", "learning_rate",
                              "gradient_norm"}) {
        line[key] = nullptr;
      }
    }
    if (violation < 0) line["max_violation"] = nullptr;
    line["expert_load"] = expert_load;
    if (expert_load.empty()) line["expert_load"] = nullptr;
    const std::string written = line.dump();
    progress.WriteLine(written);
    if (options.on_step) options.on_step(written);
    spdlog::info(
        "learner step {}/{}: v{} reward {:.3f} success {:.2f} kept {}/{} mismatch {:.2e} "
        "clip {:.3f} entropy {:.3f} {:.1f} s",
        step, config.train.steps, version, reward_mean,
        finished > 0 ? static_cast<double>(successes) / finished : 0.0, kept_total,
        static_cast<int64_t>(trajectories), prepared.mismatch_max, update.metrics.clip_fraction(),
        update.metrics.entropy(), step_seconds);
    if (config.checkpoint_every_steps > 0 && step % config.checkpoint_every_steps == 0 &&
        step < last_step) {
      STRIDER_RETURN_IF_ERROR(checkpoint("latest"));
    }
  }
  STRIDER_RETURN_IF_ERROR(checkpoint("final"));
  summary.total_steps = step;
  summary.steps = static_cast<int64_t>(reward_means.size());
  summary.policy_version = version;
  const size_t tenth = std::max<size_t>(1, reward_means.size() / 10);
  summary.first_reward_mean = Mean(reward_means, 0, std::min(tenth, reward_means.size()));
  summary.last_reward_mean =
      Mean(reward_means, reward_means.size() - std::min(tenth, reward_means.size()),
           reward_means.size());
  summary.seconds = Seconds(run_started);
  return summary;
}

}  // namespace strider::rl
