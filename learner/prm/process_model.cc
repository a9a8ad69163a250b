#include "learner/prm/process_model.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "common/clock.h"
#include "common/durable_file.h"
#include "common/model/config.h"
#include "common/model/model.h"
#include "common/model/torch_status.h"
#include "common/random.h"
#include "common/safetensors.h"
#include "common/tokenizer/chat_format.h"
#include "learner/learner.h"
#include "learner/optimizer.h"
#include "reward/verifiers.h"

namespace strider::reward {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kFormat = "strider-prm/1";
constexpr const char* kFeatures = "last_and_mean";
constexpr const char* kHeadFile = "head.safetensors";
constexpr const char* kInfoFile = "process_model.json";

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void Count(schema::StepLabel label, LabelCounts* counts) {
  switch (label) {
    case schema::StepLabel::kCorrect:
      ++counts->correct;
      break;
    case schema::StepLabel::kIncorrect:
      ++counts->incorrect;
      break;
    case schema::StepLabel::kUnknown:
      ++counts->unknown;
      break;
  }
}

// (K, 2D) features of every step (h_last ; h_mean, see the header), in fp32, from one pass
// along the inference path without gradient.
Result<at::Tensor> StepFeatures(const Model& model, const schema::StoredTrajectory& trajectory,
                                int64_t chunk_tokens) {
  const int64_t width = model.config().width;
  const size_t steps = trajectory.steps.size();
  if (steps == 0) return at::empty({0, 2 * width}, at::kFloat);
  return model::Guarded("process model features", [&]() -> Result<at::Tensor> {
    ModelInput input;
    std::vector<int64_t> ids(trajectory.tokens.begin(), trajectory.tokens.end());
    input.tokens = at::tensor(ids, at::kLong).view({1, -1});
    for (const schema::Image& image : trajectory.images) {
      std::vector<uint8_t> bytes(image.pixels.begin(), image.pixels.end());
      input.images.push_back({0, at::tensor(bytes, at::kByte)
                                     .view({image.height, image.width, image.channels})
                                     .to(at::kFloat)
                                     .div_(255.0)});
    }
    std::vector<float> last(steps * width, 0.0f), sum(steps * width, 0.0f);
    std::vector<int64_t> actions(steps, 0);
    size_t k = 0;  // the step the next position belongs to; steps are contiguous and in order
    ChunkedPassOptions pass;
    // An image's patches may not straddle a chunk, and image trajectories are short (the
    // vision grid bounds each image): they go through in one Forward, equal to the chunked
    // inference path by the model's two-path contract.
    pass.path = trajectory.images.empty() ? TrainingPath::kInference : TrainingPath::kTraining;
    pass.chunk_tokens = chunk_tokens;
    pass.backward = false;
    pass.hidden = true;
    auto gather = [&](const ChunkView& chunk) -> Result<at::Tensor> {
      // (count, D) on the host, where the features are pooled (docs/cuda.md).
      const at::Tensor hidden = chunk.hidden[0].to(at::kCPU, at::kFloat).contiguous();
      const float* h = hidden.data_ptr<float>();
      for (int64_t i = 0; i < chunk.count; ++i) {
        const uint64_t position = static_cast<uint64_t>(chunk.begin + i);
        while (k < steps && trajectory.steps[k].end <= position) ++k;
        if (k == steps) break;
        if (position < trajectory.steps[k].begin) continue;
        const float* row = h + i * width;
        if (schema::IsAction(trajectory.roles[position])) {
          float* s = sum.data() + k * width;
          for (int64_t j = 0; j < width; ++j) s[j] += row[j];
          ++actions[k];
        }
        if (position + 1 == trajectory.steps[k].end) {
          std::memcpy(last.data() + k * width, row, width * sizeof(float));
        }
      }
      return at::Tensor();
    };
    STRIDER_RETURN_IF_ERROR(RunChunkedPass(model, input, pass, gather).status());
    at::Tensor features = at::empty({static_cast<int64_t>(steps), 2 * width}, at::kFloat);
    float* out = features.data_ptr<float>();
    for (size_t s = 0; s < steps; ++s) {
      const float* l = last.data() + s * width;
      std::memcpy(out + s * 2 * width, l, width * sizeof(float));
      // A step without action tokens (nothing the turn wrote) reads its last state twice.
      for (int64_t j = 0; j < width; ++j) {
        out[s * 2 * width + width + j] =
            actions[s] > 0 ? sum[s * width + j] / static_cast<float>(actions[s]) : l[j];
      }
    }
    return features;
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The head
// ---------------------------------------------------------------------------------------------

struct ProcessModelHead {
  at::Tensor mean;   // (F) feature means over the training steps
  at::Tensor scale;  // (F) their standard deviations (floored)
  // (H, F), (H), (1, H), (1) with a hidden layer; (1, F), (1) without.
  std::vector<std::pair<std::string, at::Tensor>> layers;

  int64_t feature_dim() const { return mean.size(0); }
  int64_t hidden_units() const { return layers.size() == 4 ? layers[0].second.size(0) : 0; }

  // Logits (N) of P(correct) for features (N, F).
  at::Tensor Logits(const at::Tensor& features) const {
    at::Tensor x = (features - mean) / scale;
    if (layers.size() == 4) {
      x = at::relu(at::linear(x, layers[0].second, layers[1].second));
      x = at::linear(x, layers[2].second, layers[3].second);
    } else {
      x = at::linear(x, layers[0].second, layers[1].second);
    }
    return x.squeeze(1);
  }

  // Random layers, N(0, 1/fan_in), the last bias at the log-odds of `positive_rate` so the
  // first step starts from the base rate rather than from 0.5.
  static ProcessModelHead Init(int64_t features, int64_t hidden, double positive_rate,
                               uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto normal = [&](std::vector<int64_t> shape, int64_t fan_in) {
      std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(fan_in)));
      at::Tensor t = at::empty(shape, at::kFloat);
      float* p = t.data_ptr<float>();
      for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
      return t;
    };
    const double p = std::clamp(positive_rate, 1e-3, 1.0 - 1e-3);
    const float log_odds = static_cast<float>(std::log(p / (1.0 - p)));
    ProcessModelHead head;
    if (hidden > 0) {
      head.layers = {{"layer0.weight", normal({hidden, features}, features)},
                     {"layer0.bias", at::zeros({hidden}, at::kFloat)},
                     {"layer1.weight", normal({1, hidden}, hidden)},
                     {"layer1.bias", at::full({1}, log_odds, at::kFloat)}};
    } else {
      head.layers = {{"layer0.weight", normal({1, features}, features)},
                     {"layer0.bias", at::full({1}, log_odds, at::kFloat)}};
    }
    return head;
  }

  Status Save(const std::string& path) const {
    std::vector<std::pair<std::string, at::Tensor>> all = {{"feature_mean", mean},
                                                           {"feature_scale", scale}};
    for (const auto& layer : layers) all.push_back({layer.first, layer.second.detach()});
    std::vector<at::Tensor> keep;
    std::vector<TensorView> views;
    for (const auto& [name, tensor] : all) {
      keep.push_back(tensor.to(at::kFloat).contiguous());
      views.push_back({name, DType::kF32, keep.back().sizes().vec(), keep.back().data_ptr(),
                       keep.back().nbytes()});
    }
    return WriteSafetensors(path, views, {{"format", kFormat}});
  }

  static Result<ProcessModelHead> Load(const std::string& path) {
    STRIDER_ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(path));
    auto take = [&](const std::string& name, size_t dims) -> Result<at::Tensor> {
      auto it = contents.tensors.find(name);
      if (it == contents.tensors.end()) {
        return Status::InvalidArgument(path + ": no tensor '" + name + "'");
      }
      if (it->second.dtype != DType::kF32 || it->second.shape.size() != dims) {
        return Status::InvalidArgument(path + ": tensor '" + name + "' must be F32 with " +
                                       std::to_string(dims) + " dimensions");
      }
      at::Tensor t = at::empty(it->second.shape, at::kFloat);
      std::memcpy(t.data_ptr(), it->second.bytes.data(), it->second.bytes.size());
      return t;
    };
    ProcessModelHead head;
    STRIDER_ASSIGN_OR_RETURN(head.mean, take("feature_mean", 1));
    STRIDER_ASSIGN_OR_RETURN(head.scale, take("feature_scale", 1));
    const bool hidden = contents.tensors.count("layer1.weight") > 0;
    const std::vector<std::pair<std::string, size_t>> names =
        hidden
            ? std::vector<std::pair<std::string, size_t>>{{"layer0.weight", 2},
                                                          {"layer0.bias", 1},
                                                          {"layer1.weight", 2},
                                                          {"layer1.bias", 1}}
            : std::vector<std::pair<std::string, size_t>>{{"layer0.weight", 2}, {"layer0.bias", 1}};
    for (const auto& [name, dims] : names) {
      STRIDER_ASSIGN_OR_RETURN(at::Tensor t, take(name, dims));
      head.layers.push_back({name, t});
    }
    if (contents.tensors.size() != names.size() + 2) {
      return Status::InvalidArgument(path + ": tensors other than the head's are stored");
    }
    const int64_t f = head.mean.size(0);
    const at::Tensor& w0 = head.layers[0].second;
    const int64_t out0 = w0.size(0);
    bool ok = head.scale.size(0) == f && w0.size(1) == f && head.layers[1].second.size(0) == out0;
    if (hidden) {
      const at::Tensor& w1 = head.layers[2].second;
      ok = ok && w1.size(0) == 1 && w1.size(1) == out0 && head.layers[3].second.size(0) == 1;
    } else {
      ok = ok && out0 == 1;
    }
    if (!ok) return Status::InvalidArgument(path + ": the head's tensor shapes do not agree");
    return head;
  }
};

// ---------------------------------------------------------------------------------------------
// Labelled steps from the store
// ---------------------------------------------------------------------------------------------

bool HeldOut(const schema::TrajectoryId& id, uint64_t split_seed, double fraction) {
  uint64_t h = 1469598103934665603ull ^ (split_seed * kSplitMix64Increment);
  for (uint8_t byte : id.bytes) h = (h ^ byte) * 1099511628211ull;
  // A final mix so ids that differ in their last byte do not land side by side.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

Result<LabelledTrajectory> ReadLabelledTrajectory(std::span<const schema::SegmentData> segments) {
  LabelledTrajectory out;
  STRIDER_ASSIGN_OR_RETURN(out.trajectory, schema::JoinSegments(segments));
  // JoinSegments checked the indices: ordering by index gives the steps in trajectory order.
  std::vector<const schema::SegmentData*> ordered;
  for (const schema::SegmentData& segment : segments) ordered.push_back(&segment);
  std::sort(ordered.begin(), ordered.end(),
            [](const auto* a, const auto* b) { return a->segment_index < b->segment_index; });
  for (const schema::SegmentData* segment : ordered) {
    for (const schema::Step& step : segment->steps) out.labels.push_back(step.label);
  }
  return out;
}

Result<std::vector<schema::StepLabel>> ReplayedLabels(
    const schema::StoredTrajectory& trajectory, const envs::EnvironmentConfig& env,
    std::shared_ptr<const transcript::Format> format) {
  STRIDER_ASSIGN_OR_RETURN(Rescored rescored, Rescore(trajectory, env, std::move(format)));
  std::vector<schema::StepLabel> labels(trajectory.steps.size(), schema::StepLabel::kUnknown);
  for (size_t k = 0; k < rescored.steps.size() && k < labels.size(); ++k) {
    const StepVerdict& verdict = rescored.steps[k];
    if (!verdict.error.empty()) break;
    if (verdict.label == envs::StepLabel::kCorrect) labels[k] = schema::StepLabel::kCorrect;
    if (verdict.label == envs::StepLabel::kIncorrect) labels[k] = schema::StepLabel::kIncorrect;
  }
  return labels;
}

Result<LabelledStore> ReadLabelledStore(const std::string& store_path,
                                        const replay::ListFilter& filter, int64_t max_trajectories,
                                        const envs::EnvironmentConfig* relabel,
                                        std::shared_ptr<const transcript::Format> format) {
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<replay::Inspector> inspector,
                           replay::Inspector::Open(store_path));
  STRIDER_ASSIGN_OR_RETURN(std::vector<schema::TrajectorySummary> summaries,
                           inspector->List(filter));
  LabelledStore out;
  for (const schema::TrajectorySummary& summary : summaries) {
    if (!summary.complete) {
      ++out.incomplete;
      continue;
    }
    if (max_trajectories > 0 && static_cast<int64_t>(out.trajectories.size()) >= max_trajectories) {
      break;
    }
    STRIDER_ASSIGN_OR_RETURN(std::vector<replay::StoredSegment> stored,
                             inspector->Trajectory(summary.trajectory_id));
    std::vector<schema::SegmentData> segments;
    segments.reserve(stored.size());
    for (replay::StoredSegment& s : stored) segments.push_back(std::move(s.segment));
    Result<LabelledTrajectory> labelled = ReadLabelledTrajectory(segments);
    if (!labelled.ok()) return labelled.status().WithContext(store_path);
    if (relabel != nullptr) {
      Result<std::vector<schema::StepLabel>> replayed =
          ReplayedLabels(labelled->trajectory, *relabel, format);
      if (replayed.status().code() == StatusCode::kFailedPrecondition) {
        ++out.unreplayed;  // another episode than the environment plays now: no verdicts
        continue;
      }
      if (!replayed.ok()) return replayed.status().WithContext(store_path);
      labelled->labels = std::move(*replayed);
    }
    out.trajectories.push_back(std::move(*labelled));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------

namespace {

struct Split {
  std::vector<at::Tensor> features;  // (n_i, F) labelled steps of each trajectory
  std::vector<float> labels;         // 1 correct, 0 incorrect, in the same order
  at::Tensor Features(int64_t width) const {
    return features.empty() ? at::empty({0, width}, at::kFloat) : at::cat(features);
  }
};

struct Evaluation {
  double accuracy = 0;
  double loss = 0;
};

Evaluation Evaluate(const ProcessModelHead& head, const at::Tensor& x, const at::Tensor& y) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = head.Logits(x);
  Evaluation e;
  e.loss = at::binary_cross_entropy_with_logits(logits, y).item<double>();
  e.accuracy = (logits.gt(0).to(at::kFloat) == y).to(at::kDouble).mean().item<double>();
  return e;
}

Status CheckOptions(const ProcessModelOptions& o) {
  if (o.store_path.empty()) return Status::InvalidArgument("process model: no store directory");
  if (o.model_config.empty() || o.model_weights.empty()) {
    return Status::InvalidArgument("process model: a policy model config and weights are needed");
  }
  if (!(o.heldout_fraction > 0 && o.heldout_fraction < 1)) {
    return Status::InvalidArgument("process model: heldout_fraction must be in (0, 1)");
  }
  if (o.chunk_tokens < 1 || o.hidden_units < 0 || o.steps < 0 || o.batch_size < 0 ||
      o.max_trajectories < 0) {
    return Status::InvalidArgument(
        "process model: chunk_tokens must be positive; hidden_units, steps, batch_size and "
        "max_trajectories not negative");
  }
  if (!(o.learning_rate > 0) || !(o.weight_decay >= 0)) {
    return Status::InvalidArgument(
        "process model: learning_rate must be positive, weight_decay not negative");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Model>> LoadPolicy(const std::string& config_path,
                                          const std::string& weights_path,
                                          const std::string& device) {
  STRIDER_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(config_path));
  if (!device.empty()) config.device = device;
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(config, weights_path));
  // Frozen: nothing here asks for its gradients.
  model->SetRequiresGrad(false);
  return model;
}

std::string Absolute(const std::string& path) {
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return error ? path : absolute.lexically_normal().string();
}

Json CountsJson(const LabelCounts& c) {
  return {{"correct", c.correct}, {"incorrect", c.incorrect}, {"unknown", c.unknown}};
}

Json ReportObject(const ProcessModelReport& r) {
  return {{"heldout_accuracy", r.heldout_accuracy},
          {"majority_baseline", r.majority_baseline},
          {"heldout_loss", r.heldout_loss},
          {"train_accuracy", r.train_accuracy},
          {"initial_train_loss", r.initial_train_loss},
          {"final_train_loss", r.final_train_loss},
          {"steps", r.steps},
          {"trajectories", r.trajectories},
          {"train_trajectories", r.train_trajectories},
          {"heldout_trajectories", r.heldout_trajectories},
          {"incomplete_trajectories", r.incomplete_trajectories},
          {"unreplayed_trajectories", r.unreplayed_trajectories},
          {"train_labels", CountsJson(r.train_labels)},
          {"heldout_labels", CountsJson(r.heldout_labels)},
          {"feature_dim", r.feature_dim},
          {"feature_seconds", r.feature_seconds},
          {"train_seconds", r.train_seconds},
          {"checkpoint", r.checkpoint_dir}};
}

Status WriteCheckpoint(const ProcessModelOptions& options, const ProcessModelHead& head,
                       const ProcessModelReport& report) {
  std::error_code error;
  std::filesystem::create_directories(options.output_dir, error);
  if (error) {
    return Status::IoError(options.output_dir +
                           ": cannot create the directory: " + error.message());
  }
  const std::filesystem::path dir(options.output_dir);
  STRIDER_RETURN_IF_ERROR(head.Save((dir / kHeadFile).string()));
  Json info = {{"format", kFormat},
               {"model_config", Absolute(options.model_config)},
               {"model_weights", Absolute(options.model_weights)},
               {"chunk_tokens", options.chunk_tokens},
               {"hidden_units", head.hidden_units()},
               {"features", kFeatures},
               {"feature_dim", head.feature_dim()},
               {"store", Absolute(options.store_path)},
               {"heldout_fraction", options.heldout_fraction},
               {"split_seed", options.split_seed},
               {"report", ReportObject(report)}};
  return WriteFileDurably(dir / kInfoFile, info.dump(2) + "\n");
}

}  // namespace

Result<ProcessModelReport> TrainProcessModel(const ProcessModelOptions& options) {
  STRIDER_RETURN_IF_ERROR(CheckOptions(options));
  const Clock::time_point start = Clock::now();
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                           LoadPolicy(options.model_config, options.model_weights, options.device));
  // The policy's actor wrote the trajectories in the policy model's format.
  STRIDER_ASSIGN_OR_RETURN(std::shared_ptr<const transcript::Format> format,
                           tokenizer::ModelFormat(model->config().tokenizer));
  STRIDER_ASSIGN_OR_RETURN(
      LabelledStore store,
      ReadLabelledStore(options.store_path, options.filter, options.max_trajectories,
                        options.relabel ? &*options.relabel : nullptr, std::move(format)));

  ProcessModelReport report;
  report.trajectories = static_cast<int64_t>(store.trajectories.size());
  report.incomplete_trajectories = store.incomplete;
  report.unreplayed_trajectories = store.unreplayed;
  report.feature_dim = 2 * model->config().width;
  Split train, heldout;
  for (const LabelledTrajectory& t : store.trajectories) {
    const bool held = HeldOut(t.trajectory.id, options.split_seed, options.heldout_fraction);
    ++(held ? report.heldout_trajectories : report.train_trajectories);
    LabelCounts& counts = held ? report.heldout_labels : report.train_labels;
    std::vector<int64_t> rows;
    Split& split = held ? heldout : train;
    for (size_t k = 0; k < t.labels.size(); ++k) {
      Count(t.labels[k], &counts);
      if (t.labels[k] == schema::StepLabel::kUnknown) continue;
      rows.push_back(static_cast<int64_t>(k));
      split.labels.push_back(t.labels[k] == schema::StepLabel::kCorrect ? 1.0f : 0.0f);
    }
    if (rows.empty()) continue;  // nothing to learn from: no pass over its tokens
    Result<at::Tensor> features = StepFeatures(*model, t.trajectory, options.chunk_tokens);
    if (!features.ok()) {
      return features.status().WithContext("trajectory " + t.trajectory.id.Hex());
    }
    split.features.push_back(features->index_select(0, at::tensor(rows, at::kLong)));
  }
  report.feature_seconds = SecondsSince(start);
  if (report.train_labels.labelled() == 0 || report.heldout_labels.labelled() == 0) {
    return Status::InvalidArgument(
        "process model: " + std::to_string(report.train_labels.labelled()) +
        " labelled training steps and " + std::to_string(report.heldout_labels.labelled()) +
        " held-out ones in " + std::to_string(report.trajectories) +
        " complete trajectories; both splits need labelled steps");
  }
  if (report.train_labels.correct == 0 || report.train_labels.incorrect == 0) {
    return Status::InvalidArgument("process model: the training steps are all of one label (" +
                                   std::to_string(report.train_labels.correct) + " correct, " +
                                   std::to_string(report.train_labels.incorrect) + " incorrect, " +
                                   std::to_string(report.train_labels.unknown) +
                                   " unknown); nothing to learn");
  }

  const Clock::time_point train_start = Clock::now();
  Result<ProcessModelHead> trained = model::Guarded("process model training", [&]() {
    const int64_t width = report.feature_dim;
    const at::Tensor x = train.Features(width);
    std::vector<float> train_labels = train.labels;
    std::mt19937_64 rng(options.seed ^ 0x5DEECE66Dull);
    if (options.shuffle_labels) std::shuffle(train_labels.begin(), train_labels.end(), rng);
    const at::Tensor y = at::tensor(train_labels, at::kFloat);
    const at::Tensor hx = heldout.Features(width);
    const at::Tensor hy = at::tensor(heldout.labels, at::kFloat);
    const double positive_rate = y.mean().item<double>();

    ProcessModelHead head =
        ProcessModelHead::Init(width, options.hidden_units, positive_rate, options.seed);
    head.mean = x.mean(0);
    // Features that never vary (a constant token's state) are left unscaled instead of blown up.
    head.scale = x.std(0, /*unbiased=*/false).clamp_min(1e-4);
    for (auto& layer : head.layers) layer.second.set_requires_grad(true);
    report.initial_train_loss = Evaluate(head, x, y).loss;

    AdamWOptions adamw;
    adamw.learning_rate = options.learning_rate;
    adamw.weight_decay = options.weight_decay;
    AdamW optimizer(head.layers, adamw);
    const int64_t n = x.size(0);
    const int64_t batch = options.batch_size == 0 ? n : options.batch_size;
    std::uniform_int_distribution<int64_t> pick(0, n - 1);
    for (int64_t step = 0; step < options.steps; ++step) {
      optimizer.ZeroGrad();
      at::Tensor bx = x, by = y;
      if (batch < n) {
        std::vector<int64_t> rows(batch);
        for (int64_t& r : rows) r = pick(rng);
        const at::Tensor index = at::tensor(rows, at::kLong);
        bx = x.index_select(0, index);
        by = y.index_select(0, index);
      }
      const at::Tensor loss = at::binary_cross_entropy_with_logits(head.Logits(bx), by);
      torch::autograd::backward({loss});
      Result<double> norm = optimizer.Step(options.learning_rate);
      if (!norm.ok()) return Result<ProcessModelHead>(norm.status());
      ++report.steps;
    }
    for (auto& layer : head.layers) layer.second = layer.second.detach();
    const Evaluation fit = Evaluate(head, x, y);
    report.final_train_loss = fit.loss;
    report.train_accuracy = fit.accuracy;
    const Evaluation held = Evaluate(head, hx, hy);
    report.heldout_accuracy = held.accuracy;
    report.heldout_loss = held.loss;
    // The majority of the labels trained on (shuffling keeps their counts).
    const float majority = positive_rate >= 0.5 ? 1.0f : 0.0f;
    report.majority_baseline = hy.eq(majority).to(at::kDouble).mean().item<double>();
    return Result<ProcessModelHead>(std::move(head));
  });
  if (!trained.ok()) return trained.status();
  report.train_seconds = SecondsSince(train_start);
  if (!options.output_dir.empty()) {
    report.checkpoint_dir = options.output_dir;
    STRIDER_RETURN_IF_ERROR(WriteCheckpoint(options, *trained, report));
  }
  return report;
}

std::string ProcessModelReportJson(const ProcessModelReport& report) {
  return ReportObject(report).dump();
}

// ---------------------------------------------------------------------------------------------
// Scoring
// ---------------------------------------------------------------------------------------------

ProcessRewardModel::ProcessRewardModel() = default;
ProcessRewardModel::~ProcessRewardModel() = default;

Result<std::unique_ptr<ProcessRewardModel>> ProcessRewardModel::Load(const std::string& dir,
                                                                     const std::string& device) {
  const std::filesystem::path root(dir);
  const std::string info_path = (root / kInfoFile).string();
  std::ifstream in(info_path);
  if (!in) return Status::NotFound(info_path + ": cannot open");
  Json info;
  try {
    info = Json::parse(in);
  } catch (const nlohmann::json::exception& error) {
    return Status::Corruption(info_path + ": " + error.what());
  }
  auto text = [&](const char* key) -> Result<std::string> {
    if (!info.contains(key) || !info[key].is_string()) {
      return Status::Corruption(info_path + ": no string '" + key + "'");
    }
    return info[key].get<std::string>();
  };
  STRIDER_ASSIGN_OR_RETURN(std::string format, text("format"));
  if (format != kFormat) {
    return Status::InvalidArgument(info_path + ": format '" + format + "', expected " + kFormat);
  }
  STRIDER_ASSIGN_OR_RETURN(std::string features, text("features"));
  if (features != kFeatures) {
    return Status::InvalidArgument(info_path + ": unknown features '" + features + "'");
  }
  std::unique_ptr<ProcessRewardModel> prm(new ProcessRewardModel());
  STRIDER_ASSIGN_OR_RETURN(prm->model_config_, text("model_config"));
  STRIDER_ASSIGN_OR_RETURN(prm->model_weights_, text("model_weights"));
  if (info.contains("chunk_tokens") && info["chunk_tokens"].is_number_integer()) {
    prm->chunk_tokens_ = std::max<int64_t>(1, info["chunk_tokens"].get<int64_t>());
  }
  STRIDER_ASSIGN_OR_RETURN(ProcessModelHead head,
                           ProcessModelHead::Load((root / kHeadFile).string()));
  prm->head_ = std::make_unique<ProcessModelHead>(std::move(head));
  Result<std::unique_ptr<Model>> model = LoadPolicy(prm->model_config_, prm->model_weights_, device);
  if (!model.ok()) return model.status().WithContext(info_path);
  prm->model_ = std::move(*model);
  if (prm->head_->feature_dim() != 2 * prm->model_->config().width) {
    return Status::InvalidArgument(
        info_path + ": the head reads " + std::to_string(prm->head_->feature_dim()) +
        " features, the model gives " + std::to_string(2 * prm->model_->config().width));
  }
  return prm;
}

Result<std::vector<double>> ProcessRewardModel::ScoreSteps(
    const schema::StoredTrajectory& trajectory) const {
  STRIDER_ASSIGN_OR_RETURN(at::Tensor features, StepFeatures(*model_, trajectory, chunk_tokens_));
  return model::Guarded("process model scoring", [&]() -> Result<std::vector<double>> {
    at::NoGradGuard no_grad;
    const at::Tensor p = at::sigmoid(head_->Logits(features)).to(at::kDouble).contiguous();
    return std::vector<double>(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
  });
}

}  // namespace strider::reward
