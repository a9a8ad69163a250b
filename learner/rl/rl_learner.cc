#include "learner/rl/rl_learner.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/durable_file.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "common/transport/weight_stream.h"
#include "learner/checkpoint.h"
#include "learner/distributed.h"
#include "learner/rl/implicit_prm.h"
#include "learner/prm/process_model.h"
#include "learner/rl/step_dump.h"
#include "replay/client.h"

namespace strider::rl {
namespace {

namespace fs = std::filesystem;

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
  return WriteFileDurably(PublishedVersionPath(run_dir), std::to_string(version) + "\n");
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
  // Where the other ranks' records are, for the gather's joins.
  const at::TensorOptions options = at::TensorOptions().device(model.device());
  RoutingRecord record;
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    if (!c.IsMoeLayer(layer)) continue;
    record.layers.push_back(
        {at::zeros({1, 0, c.feed_forward.experts_per_token}, options.dtype(at::kLong)),
         at::zeros({1, 0, c.feed_forward.routed_experts}, options.dtype(model.dtype()))});
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
  STRIDER_RETURN_IF_ERROR(model::Guarded("expert load", [&] {
    for (const RoutingRecord::Layer& layer : record.layers) {
      const at::Tensor counts =
          at::bincount(layer.experts.reshape({-1}).to(at::kLong), {}, experts)
              .to(at::kCPU)
              .contiguous();
      load.emplace_back(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
    }
  }));
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
  // A learner on a GPU reduces gradients and exchanges experts over NCCL on that GPU, unless
  // its ranks share the GPU (collectives: gloo).
  STRIDER_ASSIGN_OR_RETURN(const c10::Device device, ResolveDevice(config.model.device));
  if (dist.collectives == "nccl" && !device.is_cuda()) {
    return Status::InvalidArgument("distributed.collectives is nccl but the model's device is " +
                                   device.str() + ": NCCL carries CUDA tensors only");
  }
  if (device.is_cuda() && dist.collectives != "gloo") {
    group_options.cuda_device = device.has_index() ? device.index() : 0;
  }
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<LearnerGroup> group, LearnerGroup::Join(group_options));
  // One config for the whole group: ranks that disagree on what a step is would pair their
  // collectives wrongly or train different models, so the settings that shape a step must
  // match rank 0's.
  const std::string shape =
      config.model.name + "|" + std::to_string(config.replay.units_per_step) + "|" +
      config.replay.table + "|" + config.replay.learner_id + "|" +
      std::to_string(config.train.ppo_epochs) + "|" + std::to_string(config.train.minibatches) +
      "|" + std::to_string(config.train.chunk_tokens) + "|" + config.train.backprop + "|" +
      std::to_string(config.trainer.optimizer.learning_rate) + "|" +
      std::to_string(config.trainer.balance) +
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
  STRIDER_RETURN_IF_ERROR(trainer.SyncComputeWeights());
  return group;
}

}  // namespace

struct RlLearner::PreparedStep {
  PreparedBatch batch;  // this rank's; it trains on the trajectories not excluded
  // The group's step in one set of figures: the batch is the union of the ranks' slices.
  double reward_sum = 0;
  double staleness_sum = 0;
  int64_t successes = 0;
  int64_t finished = 0;
  double trajectories = 0;
  int64_t kept_total = 0;
  int64_t tokens = 0;
  int64_t action_tokens = 0;
};

struct RlLearner::StepUpdate {
  UpdateMetrics metrics;  // summed over the updates
  TrainerStep last;
  double violation = -1;
  std::vector<std::vector<int64_t>> expert_load;  // (sparse layers, routed experts)
  int64_t updates = 0;
  // Updates not applied (the parameters left as they were), and why the last one was not.
  int64_t skipped = 0;
  std::string skipped_reason;
  LearnerGroupStats group_before;
  double seconds = 0;
};

RlLearner::RlLearner(const RlLearnerConfig& config, const RlRunOptions& options)
    : config_(config),
      options_(options),
      distributed_(config.distributed.world_size > 1),
      expert_parallel_(distributed_ && config.distributed.expert_parallel),
      started_(Clock::now()) {}

RlLearner::~RlLearner() = default;

Result<std::unique_ptr<RlLearner>> RlLearner::Create(const RlLearnerConfig& config,
                                                     const RlRunOptions& options) {
  ConfigureRuntime(config.threads > 0 ? config.threads : config.model.threads);
  std::unique_ptr<RlLearner> learner(new RlLearner(config, options));
  STRIDER_RETURN_IF_ERROR(learner->Open());
  STRIDER_RETURN_IF_ERROR(learner->CreateTrainer());
  STRIDER_RETURN_IF_ERROR(learner->JoinGroup());
  STRIDER_RETURN_IF_ERROR(learner->ConfigureSteps());
  STRIDER_RETURN_IF_ERROR(learner->StartPublishing());
  STRIDER_RETURN_IF_ERROR(learner->ConnectReplay());
  return learner;
}

Status RlLearner::Open() {
  const RlDistributedConfig& dist = config_.distributed;
  // Rank 0 owns the run directory (published versions, the metrics the launcher reads); the
  // other ranks keep their metrics and checkpoints beside it.
  const std::string run_dir = distributed_ && dist.rank > 0
                                  ? options_.run_dir + "/rank-" + std::to_string(dist.rank)
                                  : options_.run_dir;
  STRIDER_ASSIGN_OR_RETURN(RunDirectory run, RunDirectory::Open(run_dir, "rl", /*display=*/0));
  run_.emplace(std::move(run));
  if (!options_.resume.empty()) {
    STRIDER_ASSIGN_OR_RETURN(start_, run_->ReadResumeState(options_.resume, config_.model.name));
  }
  for (int64_t dump : options_.dump_steps) {
    if (dump <= start_.step) {
      return Status::InvalidArgument("--dump-step " + std::to_string(dump) + ": the run resumes " +
                                     "after step " + std::to_string(start_.step) +
                                     ", so that step will not run again");
    }
  }
  return Status::Ok();
}

Status RlLearner::CreateTrainer() {
  const RlDistributedConfig& dist = config_.distributed;
  const int64_t updates_per_step = config_.train.ppo_epochs * config_.train.minibatches;
  const LearningRateSchedule schedule = {
      .peak = config_.trainer.optimizer.learning_rate,
      .warmup_steps = config_.train.warmup_steps,
      .total_steps = std::max<int64_t>(1, config_.train.steps * updates_per_step),
      .min_ratio = config_.train.min_learning_rate_ratio};
  TrainerStart start;
  start.initial_weights = config_.init;
  start.init_seed = config_.init_seed;
  if (expert_parallel_) {
    start.expert_rank = dist.rank;
    start.expert_world_size = dist.world_size;
  }
  STRIDER_ASSIGN_OR_RETURN(
      trainer_, Trainer::Create(config_.model, MakeTrainerOptions(config_.trainer, schedule, start),
                                options_.resume));
  STRIDER_ASSIGN_OR_RETURN(reference_, LoadReference(config_));
  if (expert_parallel_ && reference_ != nullptr) {
    STRIDER_RETURN_IF_ERROR(reference_->ShardExperts(dist.rank, dist.world_size));
  }
  if (UsesImplicitRewards(config_)) {
    ImplicitPrmOptions prm;
    prm.config = config_.implicit_prm;
    prm.chunk_tokens = config_.train.chunk_tokens;
    prm.truncated_backprop = config_.train.backprop == "truncated";
    prm.minibatches = config_.train.minibatches;
    prm.seed = config_.trainer.seed;
    prm.policy_init = config_.init;
    prm.policy_init_seed = config_.init_seed;
    prm.router_learning_rate_scale = config_.trainer.router_learning_rate_scale;
    // A resumed run continues the reward model it checkpointed, never a fresh one.
    const std::string saved =
        options_.resume.empty() ? "" : options_.resume + "/" + kImplicitPrmCheckpoint;
    if (!saved.empty() && !fs::exists(saved)) {
      return Status::FailedPrecondition("checkpoint " + options_.resume +
                                        " holds no implicit PRM (" + saved +
                                        "): it was written without implicit rewards");
    }
    STRIDER_ASSIGN_OR_RETURN(implicit_prm_, ImplicitPrm::Create(config_.model, prm, saved));
  }
  return Status::Ok();
}

Status RlLearner::JoinGroup() {
  if (distributed_ && config_.trainer.precision == Precision::kBFloat16) {
    // The gradient buckets learn which parameters have a gradient from the masters' grad
    // accumulators, which the bf16 passes never reach (their gradients come by hooks).
    return Status::InvalidArgument(
        "precision: bfloat16 with learner ranks (world size > 1) is not supported yet; use "
        "float32 or one rank (docs/cuda.md, \"Precision\")");
  }
  if (distributed_) {
    STRIDER_ASSIGN_OR_RETURN(group_, JoinLearnerGroup(config_, &start_, *trainer_));
    for (const auto& [name, tensor] : trainer_->optimizer().parameters()) {
      if (!(expert_parallel_ && IsRoutedExpertTensor(name))) reduced_.push_back(tensor);
    }
  }
  if (expert_parallel_) {
    rounds_ = group_->ExpertRounds({&trainer_->compute_model(), reference_.get()});
    // Clipping's global norm adds every rank's experts.
    LearnerGroup* group = group_.get();
    trainer_->optimizer().ShardNorm(IsRoutedExpertTensor, [group](double own) -> Result<double> {
      std::vector<double> sum = {own};
      STRIDER_RETURN_IF_ERROR(group->AllReduceSum(sum));
      return sum[0];
    });
  }
  return Status::Ok();
}

Status RlLearner::ConfigureSteps() {
  if (config_.reward.UsesProcessModel()) {
    // Beside the policy: the learner's device, not the one the reward model was trained on.
    STRIDER_ASSIGN_OR_RETURN(process_model_, reward::ProcessRewardModel::Load(
                                                 config_.process_model, config_.model.device));
  }
  settings_.process_model = process_model_.get();
  settings_.implicit_prm = implicit_prm_.get();
  settings_.scoring = config_.scoring;  // the scoring pass's options, without `reference`
  settings_.scoring.rounds = rounds_.get();
  settings_.objective = config_.objective;
  settings_.reward = config_.reward;
  settings_.scoring.chunk_tokens = config_.train.chunk_tokens;
  settings_.truncated_backprop = config_.train.backprop == "truncated";
  // A fresh run starts from the weights its actors were given (version 0); a resumed one
  // publishes its own at once below, and until then they are no published version.
  if (options_.resume.empty()) settings_.weights_version = start_.policy_version;
  return Status::Ok();
}

Status RlLearner::StartPublishing() {
  const RlDistributedConfig& dist = config_.distributed;
  // Versions: above every one this run directory published, whatever the checkpoint says.
  STRIDER_ASSIGN_OR_RETURN(const uint64_t published_before, ReadPublishedVersion(run_->path()));
  version_ = std::max(start_.policy_version, published_before);
  const std::string publish_endpoint =
      options_.publish_endpoint.empty() ? config_.publish.endpoint : options_.publish_endpoint;
  bool initial_publish = false;
  if (!publish_endpoint.empty() && (!distributed_ || dist.rank == 0)) {
    transport::WeightPublisherOptions publisher_options;
    publisher_options.endpoint = publish_endpoint;
    publisher_options.chunk_bytes = static_cast<uint32_t>(config_.publish.chunk_bytes);
    publisher_options.keep_versions = static_cast<int>(config_.publish.keep_versions);
    publisher_options.auth = config_.publish.auth;
    STRIDER_ASSIGN_OR_RETURN(publisher_, transport::WeightPublisher::Start(publisher_options));
    summary_.publish_endpoint = publisher_->endpoint();
    // A resumed learner's weights are older than what the actors may hold: move them onto it
    // (expert-parallel ranks below, all together, as the experts are gathered).
    initial_publish = !options_.resume.empty() || published_before > start_.policy_version;
    if (initial_publish && !expert_parallel_) STRIDER_RETURN_IF_ERROR(Publish());
  }
  if (group_ != nullptr) {
    // Rank 0's versions are the group's: it alone knows what its run directory published.
    STRIDER_ASSIGN_OR_RETURN(
        std::vector<std::vector<int64_t>> versions,
        group_->AllGather({static_cast<int64_t>(version_),
                           settings_.weights_version
                               ? static_cast<int64_t>(*settings_.weights_version)
                               : int64_t{-1},
                           initial_publish ? 1 : 0}));
    version_ = static_cast<uint64_t>(versions[0][0]);
    if (versions[0][1] >= 0) {
      settings_.weights_version = static_cast<uint64_t>(versions[0][1]);
    } else {
      settings_.weights_version.reset();
    }
    if (expert_parallel_ && versions[0][2] != 0) STRIDER_RETURN_IF_ERROR(Publish());
  }
  return Status::Ok();
}

Status RlLearner::ConnectReplay() {
  const RlDistributedConfig& dist = config_.distributed;
  replay::LearnerClientOptions client_options;
  client_options.endpoint =
      options_.replay_endpoint.empty() ? config_.replay.endpoint : options_.replay_endpoint;
  client_options.learner_id = config_.replay.learner_id;
  client_options.table = config_.replay.table;
  client_options.auth = config_.replay.auth;
  client_options.rank = static_cast<uint32_t>(dist.rank);
  client_options.world_size = static_cast<uint32_t>(dist.world_size);
  replay_endpoint_ = client_options.endpoint;
  STRIDER_ASSIGN_OR_RETURN(client_, replay::LearnerClient::Connect(client_options));
  spdlog::info("learner: mode rl, model {}, replay {} table '{}', weights {}, from step {}",
               config_.model.name, client_options.endpoint, config_.replay.table,
               summary_.publish_endpoint.empty() ? "not published" : summary_.publish_endpoint,
               start_.step);
  if (options_.on_ready) options_.on_ready(summary_.publish_endpoint);
  step_ = start_.step;
  total_tokens_ = start_.total_tokens;
  last_step_ = options_.max_steps >= 0
                   ? std::min(config_.train.steps, step_ + options_.max_steps)
                   : config_.train.steps;
  return Status::Ok();
}

bool RlLearner::StopRequested() const {
  return options_.stop != nullptr && options_.stop->load();
}

Result<RlRunSummary> RlLearner::Run() {
  while (!done()) {
    STRIDER_ASSIGN_OR_RETURN(const bool stepped, Step());
    if (!stepped) break;
  }
  STRIDER_RETURN_IF_ERROR(Checkpoint("final"));
  return Summary();
}

Result<bool> RlLearner::Step() {
  // A group stops together (Sample), at the step one of its ranks was asked to stop at.
  if (StopRequested() && group_ == nullptr) return false;
  const auto step_started = Clock::now();
  // 1. Sample.
  STRIDER_ASSIGN_OR_RETURN(std::optional<replay::SampleBatch> batch, Sample(step_started));
  if (!batch.has_value()) return false;
  const double sample_seconds = Seconds(step_started);
  const auto compute_started = Clock::now();
  // 2-3. Score, shape, advantages.
  STRIDER_ASSIGN_OR_RETURN(const PreparedStep prepared, Prepare(std::move(*batch)));
  // 4. Epochs and mini-batches; on a dumped step, recording what the loss saw.
  StepRecorder recorder;
  const bool dumping = std::binary_search(options_.dump_steps.begin(), options_.dump_steps.end(),
                                          step_ + 1);
  settings_.recorder = dumping ? &recorder : nullptr;
  Result<StepUpdate> updated = Update(prepared);
  settings_.recorder = nullptr;
  STRIDER_ASSIGN_OR_RETURN(const StepUpdate update, std::move(updated));
  ++step_;
  total_tokens_ += prepared.tokens;

  // 5. Publish.
  publish_seconds_ = 0;
  // Weights no update changed are the version already out: nothing new to publish, except in
  // sync mode, where the actors wait for a new version before their next round.
  if (step_ % config_.publish.every_steps == 0 &&
      (!settings_.weights_version.has_value() || config_.train.sync)) {
    STRIDER_RETURN_IF_ERROR(Publish());
  }
  const double compute_seconds = Seconds(compute_started);
  const double step_seconds = Seconds(step_started);

  // 6. Metrics and checkpoints.
  const double reward_mean =
      prepared.trajectories > 0 ? prepared.reward_sum / prepared.trajectories : 0;
  reward_means_.push_back(reward_mean);
  const std::string written = MetricsLine(prepared, update, sample_seconds, compute_seconds,
                                          step_seconds, reward_mean);
  run_->metrics().WriteLine(written);
  if (dumping) {
    STRIDER_RETURN_IF_ERROR(WriteStepDump(
        StepDumpPath(options_.dump_dir, step_, group_ != nullptr ? group_->rank() : -1), step_,
        prepared.batch, recorder, settings_.objective.loss, written));
  }
  if (options_.on_step) options_.on_step(written);
  spdlog::info(
      "learner step {}/{}: v{} reward {:.3f} success {:.2f} kept {}/{} mismatch {:.2e} "
      "clip {:.3f} entropy {:.3f} {:.1f} s",
      step_, config_.train.steps, version_, reward_mean,
      prepared.finished > 0 ? static_cast<double>(prepared.successes) / prepared.finished : 0.0,
      prepared.kept_total, static_cast<int64_t>(prepared.trajectories),
      prepared.batch.mismatch_max, update.metrics.metrics.clip_fraction(),
      update.metrics.metrics.entropy(), step_seconds);
  if (config_.checkpoint_every_steps > 0 && step_ % config_.checkpoint_every_steps == 0 &&
      step_ < last_step_) {
    STRIDER_RETURN_IF_ERROR(Checkpoint("latest"));
  }
  return true;
}

// In short waits, so a stop request is seen. Empty: the step stops (this rank or another of its
// group was asked to).
Result<std::optional<replay::SampleBatch>> RlLearner::Sample(Clock::time_point step_started) {
  Result<replay::SampleBatch> batch = Status::ResourceExhausted("not sampled");
  const auto deadline =
      step_started + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(config_.replay.sample_timeout_s));
  while (!StopRequested()) {
    batch = client_->Sample(static_cast<uint64_t>(step_ + 1),
                            static_cast<uint32_t>(config_.replay.units_per_step), version_,
                            std::chrono::milliseconds(1000));
    if (batch.ok()) break;
    // Not ready yet, or the server busy or restarting: both pass, up to the step's deadline.
    const StatusCode code = batch.status().code();
    if (code != StatusCode::kResourceExhausted && code != StatusCode::kUnavailable) break;
    if (Clock::now() >= deadline || StopRequested()) break;
    if (code == StatusCode::kUnavailable) {
      spdlog::warn("learner step {}: {}; retrying", step_ + 1, batch.status().ToString());
    }
  }
  const bool stopping = !batch.ok() && StopRequested();
  if (!batch.ok() && !stopping) {
    return batch.status().WithContext("learner step " + std::to_string(step_ + 1) +
                                      ": sampling from " + replay_endpoint_);
  }
  if (group_ != nullptr) {
    // The ranks that sampled leave their draws unused: the server keeps each step's draw, so
    // a resumed group trains on exactly these units.
    std::vector<double> anyone_stopping = {stopping ? 1.0 : 0.0};
    STRIDER_RETURN_IF_ERROR(group_->AllReduceSum(anyone_stopping));
    if (anyone_stopping[0] > 0) return std::optional<replay::SampleBatch>();
  } else if (stopping) {
    return std::optional<replay::SampleBatch>();
  }
  return std::optional<replay::SampleBatch>(std::move(*batch));
}

Result<RlLearner::PreparedStep> RlLearner::Prepare(replay::SampleBatch sampled) {
  std::vector<schema::SegmentData> segments;
  for (replay::SampledItem& item : sampled.items) segments.push_back(std::move(item.segment));
  std::vector<SampledGroup> groups = SplitBatch(std::move(segments));
  OrderByProvenance(groups);

  PreparedStep out;
  STRIDER_ASSIGN_OR_RETURN(
      out.batch, PrepareBatch(trainer_->compute_model(), reference_.get(), groups, settings_));
  if (rounds_ != nullptr) STRIDER_RETURN_IF_ERROR(rounds_->Drain());
  double reward_sum = 0, staleness_sum = 0;
  int64_t successes = 0, finished = 0, kept = 0;
  for (const TrainingTrajectory& t : out.batch.trajectories) {
    reward_sum += t.outcome;
    staleness_sum += static_cast<double>(version_ - std::min(version_, t.min_version));
    if (t.finished) {
      ++finished;
      successes += t.outcome > 0;
    }
    if (t.excluded) {
      spdlog::warn("learner step {}: trajectory {} excluded: {}", step_ + 1,
                   t.prepared.joined.id.Hex(), t.excluded_reason);
      ++summary_.excluded_trajectories;
      continue;
    }
    ++kept;
  }
  // The group's step in one set of figures: the batch is the union of the ranks' slices.
  std::vector<double> totals = {reward_sum,
                                staleness_sum,
                                static_cast<double>(successes),
                                static_cast<double>(finished),
                                static_cast<double>(out.batch.trajectories.size()),
                                static_cast<double>(kept),
                                static_cast<double>(out.batch.tokens),
                                static_cast<double>(out.batch.action_tokens)};
  if (group_ != nullptr) STRIDER_RETURN_IF_ERROR(group_->AllReduceSum(totals));
  out.reward_sum = totals[0];
  out.staleness_sum = totals[1];
  out.successes = static_cast<int64_t>(totals[2]);
  out.finished = static_cast<int64_t>(totals[3]);
  out.trajectories = totals[4];
  out.kept_total = static_cast<int64_t>(totals[5]);
  out.tokens = static_cast<int64_t>(totals[6]);
  out.action_tokens = static_cast<int64_t>(totals[7]);
  return out;
}

Result<RlLearner::StepUpdate> RlLearner::Update(const PreparedStep& prepared) {
  const auto started = Clock::now();
  StepUpdate update;
  if (group_ != nullptr) update.group_before = group_->stats();
  std::vector<const TrainingTrajectory*> kept;
  for (const TrainingTrajectory& t : prepared.batch.trajectories) {
    if (!t.excluded) kept.push_back(&t);
  }
  if (prepared.kept_total > 0) {
    RoutingRecord routing;
    // Every rank runs the same number of updates (collectives pair up), some of them perhaps
    // on an empty share.
    const int64_t minibatches =
        group_ != nullptr
            ? config_.train.minibatches
            : std::min<int64_t>(config_.train.minibatches, static_cast<int64_t>(kept.size()));
    for (int64_t epoch = 0; epoch < config_.train.ppo_epochs; ++epoch) {
      std::vector<const TrainingTrajectory*> order = kept;
      if (kept.size() > 1) {
        // randperm takes the generator's lock itself.
        STRIDER_RETURN_IF_ERROR(model::Guarded("mini-batch order", [&] {
          const at::Tensor perm = at::randperm(static_cast<int64_t>(kept.size()),
                                               trainer_->generator(),
                                               at::TensorOptions().dtype(at::kLong));
          const int64_t* p = perm.data_ptr<int64_t>();
          for (size_t i = 0; i < kept.size(); ++i) order[i] = kept[p[i]];
        }));
      }
      for (int64_t m = 0; m < minibatches; ++m) {
        const size_t begin = order.size() * m / minibatches;
        const size_t end = order.size() * (m + 1) / minibatches;
        std::span<const TrainingTrajectory* const> part(order.data() + begin, end - begin);
        STRIDER_RETURN_IF_ERROR(UpdateMinibatch(part, epoch, &routing, &update).status());
      }
    }
    STRIDER_RETURN_IF_ERROR(Balance(std::move(routing), &update));
  }
  update.seconds = Seconds(started);
  return update;
}

Result<bool> RlLearner::UpdateMinibatch(std::span<const TrainingTrajectory* const> part,
                                        int64_t epoch, RoutingRecord* routing,
                                        StepUpdate* update) {
  trainer_->ZeroGrad();
  std::function<void(const at::Tensor&)> overlap;
  if (group_ != nullptr) {
    STRIDER_RETURN_IF_ERROR(group_->PrepareGradients(reduced_));
    LearnerGroup* group = group_.get();
    overlap = [group](const at::Tensor& loss) { group->OverlapNextBackward(loss); };
  }
  // The loss is aggregated over the group's mini-batch: every rank weighs its share by the
  // action-token counts of all of it (rank order).
  std::vector<int64_t> all_counts;
  size_t offset = 0;
  if (group_ != nullptr) {
    std::vector<int64_t> own;
    for (const TrainingTrajectory* t : part) {
      own.push_back(static_cast<int64_t>(t->prepared.positions.size()));
    }
    STRIDER_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> counts, group_->AllGather(own));
    for (int r = 0; r < group_->world_size(); ++r) {
      if (r < group_->rank()) offset += counts[r].size();
      all_counts.insert(all_counts.end(), counts[r].begin(), counts[r].end());
    }
    if (all_counts.empty()) return false;  // an empty share on every rank
  }
  if (settings_.recorder != nullptr) settings_.recorder->BeginUpdate(epoch, update->updates);
  STRIDER_ASSIGN_OR_RETURN(
      UpdateMetrics metrics,
      AccumulateGradients(trainer_->compute_model(), part, settings_,
                          config_.trainer.balance && epoch == 0 ? routing : nullptr,
                          group_ != nullptr ? &all_counts : nullptr, offset, overlap));
  if (rounds_ != nullptr) STRIDER_RETURN_IF_ERROR(rounds_->Drain());
  bool loss_finite = std::isfinite(metrics.loss);
  if (group_ != nullptr) {
    STRIDER_RETURN_IF_ERROR(group_->AllReduceGradients(reduced_));
    // The reduction may have sent this rank's gradients before AccumulateGradients poisoned
    // them: the ranks agree on the loss instead, so none applies an update another skips.
    std::vector<double> non_finite = {loss_finite ? 0.0 : 1.0};
    STRIDER_RETURN_IF_ERROR(group_->AllReduceSum(non_finite));
    loss_finite = non_finite[0] == 0;
    if (!loss_finite) PoisonGradients(trainer_->model());
  }
  STRIDER_ASSIGN_OR_RETURN(update->last, trainer_->Step(trainer_->optimizer().step()));
  if (!update->last.applied) {
    ++update->skipped;
    update->skipped_reason = loss_finite ? "non-finite gradient norm" : "non-finite loss";
  }
  settings_.weights_version.reset();
  ++update->updates;
  UpdateMetrics& sum = update->metrics;
  sum.loss += metrics.loss;
  sum.policy_loss += metrics.policy_loss;
  sum.kl_loss += metrics.kl_loss;
  sum.entropy_loss += metrics.entropy_loss;
  sum.value_loss += metrics.value_loss;
  sum.metrics.Add(metrics.metrics);
  sum.tokens += metrics.tokens;
  return true;
}

// The routing balance of the step's first epoch: the expert load and MaxVio of its routing, and
// the router biases' update (over the group's record when there is a group).
Status RlLearner::Balance(RoutingRecord routing, StepUpdate* update) {
  if (!config_.trainer.balance) return Status::Ok();
  const int64_t experts = trainer_->model().config().feed_forward.routed_experts;
  if (group_ != nullptr) {
    STRIDER_ASSIGN_OR_RETURN(RoutingRecord joined,
                             GatherRouting(*group_, trainer_->compute_model(), std::move(routing)));
    STRIDER_ASSIGN_OR_RETURN(update->expert_load, ExpertLoad(joined, experts));
    STRIDER_ASSIGN_OR_RETURN(update->violation, trainer_->BalanceRouting(std::move(joined)));
  } else if (!routing.layers.empty()) {
    STRIDER_ASSIGN_OR_RETURN(update->expert_load, ExpertLoad(routing, experts));
    STRIDER_ASSIGN_OR_RETURN(update->violation, trainer_->BalanceRouting(std::move(routing)));
  }
  return Status::Ok();
}

Status RlLearner::Publish() {
  // Expert-parallel ranks gather the experts to rank 0, which publishes whole weights.
  const Model& model = trainer_->model();
  std::map<std::string, at::Tensor> whole_experts;
  if (expert_parallel_) {
    const auto started = Clock::now();
    for (const auto& [name, tensor] : model.tensors()) {
      if (!IsRoutedExpertTensor(name)) continue;
      STRIDER_ASSIGN_OR_RETURN(whole_experts[name], group_->GatherTo(tensor, 0));
    }
    gather_seconds_ = Seconds(started);
  }
  if (publisher_ == nullptr) {
    // The other ranks of a group count the versions rank 0 publishes, so their samples ask
    // for the same version and their mismatch checks compare the same policy.
    if (distributed_ && config_.distributed.rank > 0) {
      ++version_;
      settings_.weights_version = version_;
    }
    return Status::Ok();
  }
  const auto started = Clock::now();
  STRIDER_ASSIGN_OR_RETURN(std::string bytes, expert_parallel_
                                                  ? model.SaveWholeToBytes(whole_experts)
                                                  : model.SaveToBytes());
  STRIDER_RETURN_IF_ERROR(WritePublishedVersion(run_->path(), version_ + 1));
  ++version_;
  STRIDER_RETURN_IF_ERROR(publisher_->Publish(version_, std::move(bytes), config_.model.name));
  settings_.weights_version = version_;
  publish_seconds_ = Seconds(started);
  spdlog::info("learner: published version {} in {:.3f} s", version_, publish_seconds_);
  return Status::Ok();
}

std::string RlLearner::MetricsLine(const PreparedStep& prepared, const StepUpdate& update,
                                   double sample_seconds, double compute_seconds,
                                   double step_seconds, double reward_mean) const {
  const PreparedBatch& batch = prepared.batch;
  const UpdateMetrics& sum = update.metrics;
  const double trajectories = prepared.trajectories;
  const double per_update = update.updates > 0 ? 1.0 / static_cast<double>(update.updates) : 0;
  nlohmann::ordered_json line = {
      {"time", UnixSeconds()},
      {"role", "learner"},
      {"step", step_},
      {"policy_version", version_},
      {"reward_mean", reward_mean},
      {"success_rate", prepared.finished > 0
                           ? static_cast<double>(prepared.successes) / prepared.finished
                           : 0.0},
      {"trajectories", static_cast<int64_t>(trajectories)},
      {"trained_trajectories", prepared.kept_total},
      {"excluded_trajectories", static_cast<int64_t>(trajectories) - prepared.kept_total},
      {"mismatch_excluded", batch.mismatch_excluded},
      {"filtered_groups", batch.filtered_groups},
      {"logprob_mismatch_max", batch.mismatch_max},
      {"logprob_mismatch_p99", batch.mismatch_p99},
      {"mismatch_measured", batch.mismatch_measured},
      {"loss", sum.loss * per_update},
      {"policy_loss", sum.policy_loss * per_update},
      {"kl", sum.metrics.kl()},
      {"approx_kl", sum.metrics.approx_kl()},
      {"clip_fraction", sum.metrics.clip_fraction()},
      {"importance_mean", sum.metrics.importance_mean()},
      {"mismatch_kl", sum.metrics.mismatch_kl()},
      {"token_masked_fraction", sum.metrics.token_masked_fraction()},
      {"sequence_masked_fraction", sum.metrics.sequence_masked_fraction()},
      {"entropy", sum.metrics.entropy()},
      {"value_loss", sum.value_loss * per_update},
      {"staleness_mean", trajectories > 0 ? prepared.staleness_sum / trajectories : 0.0},
      {"max_violation", update.violation},
      {"learning_rate", update.last.learning_rate},
      {"gradient_norm", update.last.gradient_norm},
      {"updates", update.updates},
      {"updates_skipped", update.skipped},
      {"skipped_reason", update.skipped_reason},
      {"tokens", prepared.tokens},
      {"action_tokens", prepared.action_tokens},
      {"tokens_per_second", prepared.tokens / std::max(step_seconds, 1e-9)},
      {"sample_seconds", sample_seconds},
      {"score_seconds", batch.score_seconds},
      {"update_seconds", update.seconds},
      {"publish_seconds", publish_seconds_},
      {"step_seconds", step_seconds},
      {"busy_fraction", compute_seconds / std::max(step_seconds, 1e-9)},
  };
  if (group_ != nullptr) {
    // Counts above are the group's; mismatch, loss and timing figures this rank's.
    const LearnerGroupStats& now = group_->stats();
    const LearnerGroupStats& before = update.group_before;
    line["rank"] = group_->rank();
    line["world_size"] = group_->world_size();
    line["allreduce_seconds"] = now.allreduce_seconds - before.allreduce_seconds;
    line["allreduce_buckets"] = now.buckets - before.buckets;
    line["allreduce_buckets_during_backward"] =
        now.buckets_during_backward - before.buckets_during_backward;
    if (expert_parallel_) {
      line["expert_parallel"] = group_->world_size();
      line["expert_rounds"] = now.rounds - before.rounds;
      line["expert_rounds_served"] = now.rounds_served - before.rounds_served;
      line["expert_gather_seconds"] = gather_seconds_;
    }
  }
  if (implicit_prm_ != nullptr) {
    const ImplicitPrmUpdate& prm = batch.implicit_prm;
    line["implicit_prm_loss"] = prm.loss;
    line["implicit_prm_accuracy"] = prm.accuracy;
    line["implicit_prm_gradient_norm"] = prm.gradient_norm;
    line["implicit_prm_updates_skipped"] = prm.skipped;
    line["implicit_prm_seconds"] = prm.seconds;
    if (prm.trajectories == 0 || !std::isfinite(prm.loss)) line["implicit_prm_loss"] = nullptr;
    if (prm.trajectories == 0) line["implicit_prm_accuracy"] = nullptr;
    if (prm.updates == 0 || !std::isfinite(prm.gradient_norm)) {
      line["implicit_prm_gradient_norm"] = nullptr;
    }
  }
  if (!std::isfinite(update.last.gradient_norm)) line["gradient_norm"] = nullptr;
  // Nothing measured is not a measured zero.
  if (sum.metrics.kl_tokens == 0) line["kl"] = nullptr;  // the reference was not scored
  if (update.skipped == 0) line["skipped_reason"] = nullptr;
  if (batch.mismatch_measured == 0) {
    line["logprob_mismatch_max"] = nullptr;
    line["logprob_mismatch_p99"] = nullptr;
  }
  if (update.updates == 0) {
    for (const char* key : {"loss", "policy_loss", "kl", "approx_kl", "clip_fraction",
                            "importance_mean", "mismatch_kl", "token_masked_fraction",
                            "sequence_masked_fraction", "entropy", "value_loss",
                            "learning_rate", "gradient_norm"}) {
      line[key] = nullptr;
    }
  }
  if (update.violation < 0) line["max_violation"] = nullptr;
  line["expert_load"] = update.expert_load;
  if (update.expert_load.empty()) line["expert_load"] = nullptr;
  return line.dump();
}

Status RlLearner::Checkpoint(const std::string& name) {
  CheckpointState state;
  state.model = config_.model.name;
  state.seed = config_.trainer.seed;
  state.step = step_;
  state.policy_version = version_;
  state.sample_step = step_;
  state.total_tokens = total_tokens_;
  state.sampler_cursor = config_.replay.learner_id;
  CheckpointExtra extra;
  if (implicit_prm_ != nullptr) {
    extra = [this](const std::string& directory) {
      return implicit_prm_->WriteCheckpoint(directory + "/" + kImplicitPrmCheckpoint);
    };
  }
  return run_->WriteCheckpoint(*trainer_, name, std::move(state), extra);
}

RlRunSummary RlLearner::Summary() const {
  RlRunSummary summary = summary_;
  summary.total_steps = step_;
  summary.steps = static_cast<int64_t>(reward_means_.size());
  summary.policy_version = version_;
  const size_t tenth = std::max<size_t>(1, reward_means_.size() / 10);
  summary.first_reward_mean = Mean(reward_means_, 0, std::min(tenth, reward_means_.size()));
  summary.last_reward_mean =
      Mean(reward_means_, reward_means_.size() - std::min(tenth, reward_means_.size()),
           reward_means_.size());
  summary.seconds = Seconds(started_);
  return summary;
}

Result<RlRunSummary> RunRlLearner(const RlLearnerConfig& config, const RlRunOptions& options) {
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<RlLearner> learner,
                           RlLearner::Create(config, options));
  return learner->Run();
}

}  // namespace strider::rl
