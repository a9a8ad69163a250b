#include "common/model/model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/cuda.h>

#include <cstring>
#include <optional>
#include <sstream>
#include <thread>

#include "common/kernels/routing.h"
#include "common/model/attention_residuals.h"
#include "common/model/expert_parallel.h"
#include "common/model/parameters.h"
#include "common/model/torch_status.h"
#include "common/model/vision.h"
#include "common/process_memory.h"
#include "common/model/tensor_pool.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"

namespace strider {

using model::Guarded;
using model::TensorMap;

struct Model::Layers {
  struct Layer {
    char kind = 'I';
    at::Tensor attention_norm;     // (d)
    at::Tensor feed_forward_norm;  // (d)
    model::IncrementalAttentionWeights incremental;
    model::LatentAttentionWeights latent;
    bool sparse = false;
    model::DenseFeedForwardWeights dense;
    model::SparseExpertWeights experts;
  };
  at::Tensor embedding;         // (V, d)
  at::Tensor residual_queries;  // (2L+1, d); undefined with plain residuals
  at::Tensor final_norm;        // (d)
  at::Tensor output;            // (V, d)
  at::Tensor value_weight;      // (1, d)
  at::Tensor value_bias;        // (1)
  model::VisionWeights vision;
  std::vector<Layer> layers;
};

namespace {

Result<DType> ToDType(at::ScalarType type) {
  switch (type) {
    case at::kDouble: return DType::kF64;
    case at::kFloat: return DType::kF32;
    case at::kHalf: return DType::kF16;
    case at::kBFloat16: return DType::kBF16;
    case at::kLong: return DType::kI64;
    case at::kInt: return DType::kI32;
    default: return Status::InvalidArgument("no safetensors dtype for this tensor type");
  }
}

Result<at::ScalarType> ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kF64: return at::kDouble;
    case DType::kF32: return at::kFloat;
    case DType::kF16: return at::kHalf;
    case DType::kBF16: return at::kBFloat16;
    case DType::kI64: return at::kLong;
    case DType::kI32: return at::kInt;
    default: return Status::InvalidArgument("unsupported dtype for model weights");
  }
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace

Result<c10::Device> ResolveDevice(const std::string& name) {
  if (!ValidDeviceName(name)) {
    return Status::InvalidArgument("device '" + name + "' is not cpu, cuda or cuda:N");
  }
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (!torch::cuda::is_available()) {
    return Status::InvalidArgument("device " + name +
                                   ": this build of LibTorch has no CUDA or no GPU is visible");
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  const int64_t index = name == "cuda" ? 0 : std::stoll(name.substr(5));
  if (index >= count) {
    return Status::InvalidArgument("device " + name + ": only " + std::to_string(count) +
                                   " CUDA device(s) are visible");
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

RoutingRecord RoutingRecord::Concatenate(const std::vector<RoutingRecord>& parts) {
  RoutingRecord joined;
  if (parts.empty()) return joined;
  joined.layers.resize(parts.front().layers.size());
  for (size_t layer = 0; layer < joined.layers.size(); ++layer) {
    std::vector<at::Tensor> experts, scores;
    for (const RoutingRecord& part : parts) {
      experts.push_back(part.layers[layer].experts);
      if (part.layers[layer].scores.defined()) scores.push_back(part.layers[layer].scores);
    }
    joined.layers[layer].experts = at::cat(experts, 1);
    if (scores.size() == parts.size()) joined.layers[layer].scores = at::cat(scores, 1);
  }
  return joined;
}

int64_t InferenceState::StateBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    if (layer.incremental.recurrent.defined()) {
      bytes += layer.incremental.recurrent.nbytes() + layer.incremental.conv_tail.nbytes();
    }
  }
  return bytes;
}

int64_t InferenceState::CacheBytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers_) {
    if (layer.latent.latent.defined()) bytes += layer.latent.Bytes();
  }
  return bytes;
}

void InferenceState::Reserve(int64_t tokens) {
  for (Layer& layer : layers_) layer.latent.Reserve(tokens);
}

void InferenceState::DetachGraph() {
  for (Layer& layer : layers_) {
    if (layer.incremental.recurrent.defined()) {
      layer.incremental.recurrent = layer.incremental.recurrent.detach();
      layer.incremental.conv_tail = layer.incremental.conv_tail.detach();
    }
    layer.latent.latent_graph = at::Tensor();
    layer.latent.rope_key_graph = at::Tensor();
  }
}

Model::Model(ModelConfig config) : config_(std::move(config)) {
  expert_shard_ = {0, config_.feed_forward.routed_experts};
}

Status Model::ShardExperts(int64_t rank, int64_t world_size) {
  const int64_t n = config_.feed_forward.routed_experts;
  if (sharded_) return Status::FailedPrecondition("the model's experts are sharded already");
  if (world_size < 1 || rank < 0 || rank >= world_size || n % world_size != 0) {
    return Status::InvalidArgument("expert parallelism: rank " + std::to_string(rank) + " of " +
                                   std::to_string(world_size) + " does not split the " +
                                   std::to_string(n) + " routed experts of '" + config_.name +
                                   "' (the degree must divide them)");
  }
  const ExpertShard shard = ExpertShardOf(n, rank, world_size);
  STRIDER_RETURN_IF_ERROR(Guarded("sharding the experts", [&] {
    for (auto& [name, tensor] : tensors_) {
      if (!IsRoutedExpertTensor(name)) continue;
      const bool requires_grad = tensor.requires_grad();
      tensor = tensor.detach().narrow(0, shard.first, shard.count).clone().requires_grad_(
          requires_grad);
    }
    Bind();
  }));
  expert_shard_ = shard;
  sharded_ = true;
  return Status::Ok();
}
Model::~Model() = default;

at::ScalarType Model::dtype() const { return layers_->embedding.scalar_type(); }

c10::Device Model::device() const { return layers_->embedding.device(); }

Result<std::unique_ptr<Model>> Model::Create(const ModelConfig& config, uint64_t seed) {
  STRIDER_RETURN_IF_ERROR(ValidateModelConfig(config, "model config"));
  STRIDER_ASSIGN_OR_RETURN(const c10::Device device, ResolveDevice(config.device));
  std::unique_ptr<Model> model(new Model(config));
  Status status = Guarded("initialising model weights", [&] {
    at::Generator generator = at::detail::createCPUGenerator(seed);
    for (const ParameterSpec& spec : ModelParameterSpecs(config)) {
      at::Tensor tensor = at::empty(spec.shape, at::kFloat);
      switch (spec.init) {
        case ParameterInit::kNormal:
          tensor.normal_(0.0, config.init_std * spec.scale, generator);
          break;
        case ParameterInit::kZeros:
          tensor.zero_();
          break;
        case ParameterInit::kOnes:
          tensor.fill_(1.0);
          break;
        case ParameterInit::kDecayBias:
          // sigmoid(b) from 0.0002 to 0.16: per-step decays from about 0.999 to 0.45 at A = 0,
          // so some channels remember thousands of tokens and some only a few.
          tensor.uniform_(-8.5, -1.7, generator);
          break;
      }
      model->tensors_.emplace_back(spec.name, tensor.to(device));
      model->trainable_.push_back(spec.trainable);
    }
    model->Bind();
  });
  STRIDER_RETURN_IF_ERROR(status);
  return model;
}

Result<std::unique_ptr<Model>> Model::Load(const ModelConfig& config, const std::string& path) {
  STRIDER_RETURN_IF_ERROR(ValidateModelConfig(config, "model config"));
  STRIDER_RETURN_IF_ERROR(ResolveDevice(config.device).status());
  STRIDER_ASSIGN_OR_RETURN(SafetensorsContents contents, ReadSafetensors(path));
  return FromContents(config, contents, path);
}

Result<std::unique_ptr<Model>> Model::LoadFromBytes(const ModelConfig& config,
                                                    std::string_view bytes,
                                                    const std::string& name) {
  STRIDER_RETURN_IF_ERROR(ValidateModelConfig(config, "model config"));
  STRIDER_RETURN_IF_ERROR(ResolveDevice(config.device).status());
  STRIDER_ASSIGN_OR_RETURN(SafetensorsContents contents, DecodeSafetensors(bytes, name));
  return FromContents(config, contents, name);
}

Result<std::unique_ptr<Model>> Model::FromContents(const ModelConfig& config,
                                                   const SafetensorsContents& contents,
                                                   const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(const c10::Device device, ResolveDevice(config.device));
  std::unique_ptr<Model> model(new Model(config));
  std::vector<ParameterSpec> specs = ModelParameterSpecs(config);
  // An expert-parallel rank's checkpoint holds its shard of the routed experts.
  std::optional<ExpertShard> shard;
  if (auto it = contents.metadata.find("expert_shard"); it != contents.metadata.end()) {
    ExpertShard s;
    char colon = 0;
    std::istringstream text(it->second);
    if (!(text >> s.first >> colon >> s.count) || colon != ':' || s.first < 0 || s.count < 1 ||
        s.first + s.count > config.feed_forward.routed_experts) {
      return Status::InvalidArgument(path + ": metadata expert_shard '" + it->second +
                                     "' is not FIRST:COUNT of the config's " +
                                     std::to_string(config.feed_forward.routed_experts) +
                                     " routed experts");
    }
    shard = s;
    for (ParameterSpec& spec : specs) {
      if (IsRoutedExpertTensor(spec.name)) spec.shape[0] = s.count;
    }
  }
  // The model computes in the checkpoint's dtype when that is float32 or float64, and in
  // float32 for 16-bit checkpoints; one model never mixes the two.
  std::string stored_dtype;
  at::ScalarType compute = at::kFloat;
  for (const ParameterSpec& spec : specs) {
    auto it = contents.tensors.find(spec.name);
    if (it == contents.tensors.end()) {
      return Status::InvalidArgument(path + ": missing tensor '" + spec.name +
                                     "' required by the model config '" + config.name + "'");
    }
    const LoadedTensor& loaded = it->second;
    if (loaded.shape != spec.shape) {
      return Status::InvalidArgument(path + ": tensor '" + spec.name + "' has shape " +
                                     ShapeText(loaded.shape) + ", the config needs " +
                                     ShapeText(spec.shape));
    }
    STRIDER_ASSIGN_OR_RETURN(at::ScalarType type, ToScalarType(loaded.dtype));
    if (type != at::kDouble && type != at::kFloat && type != at::kHalf && type != at::kBFloat16) {
      return Status::InvalidArgument(path + ": tensor '" + spec.name + "' is " +
                                     std::string(DTypeName(loaded.dtype)) +
                                     ", model weights are floating point");
    }
    const at::ScalarType tensor_compute = type == at::kDouble ? at::kDouble : at::kFloat;
    if (stored_dtype.empty()) {
      stored_dtype = DTypeName(loaded.dtype);
      compute = tensor_compute;
    } else if (tensor_compute != compute) {
      return Status::InvalidArgument(path + ": tensor '" + spec.name + "' is " +
                                     std::string(DTypeName(loaded.dtype)) +
                                     " but earlier tensors are " + stored_dtype +
                                     ": a checkpoint holds F64 weights throughout or none");
    }
    at::Tensor placed;
    STRIDER_RETURN_IF_ERROR(Guarded("placing weights on " + device.str(), [&] {
      at::Tensor tensor = at::empty(spec.shape, type);
      std::memcpy(tensor.data_ptr(), loaded.bytes.data(), loaded.bytes.size());
      placed = tensor.to(device, compute);
    }));
    model->tensors_.emplace_back(spec.name, placed);
    model->trainable_.push_back(spec.trainable);
  }
  if (contents.tensors.size() != specs.size()) {
    for (const auto& [name, tensor] : contents.tensors) {
      bool known = false;
      for (const ParameterSpec& spec : specs) known = known || spec.name == name;
      if (!known) {
        return Status::InvalidArgument(path + ": tensor '" + name +
                                       "' is not part of the model config '" + config.name + "'");
      }
    }
  }
  STRIDER_RETURN_IF_ERROR(Guarded("binding loaded weights", [&] { model->Bind(); }));
  if (shard.has_value()) {
    model->expert_shard_ = *shard;
    model->sharded_ = true;
  }
  return model;
}

// The views borrow `contiguous`, which must outlive them.
Result<std::vector<TensorView>> Model::Views(std::vector<at::Tensor>* contiguous) const {
  std::vector<TensorView> views;
  contiguous->clear();
  contiguous->reserve(tensors_.size());
  for (const auto& [name, tensor] : tensors_) {
    contiguous->push_back(tensor.detach().cpu().contiguous());
    STRIDER_ASSIGN_OR_RETURN(DType dtype, ToDType(contiguous->back().scalar_type()));
    TensorView view;
    view.name = name;
    view.dtype = dtype;
    view.shape = contiguous->back().sizes().vec();
    view.data = contiguous->back().data_ptr();
    view.byte_size = contiguous->back().nbytes();
    views.push_back(std::move(view));
  }
  return views;
}

std::map<std::string, std::string> Model::SaveMetadata() const {
  std::map<std::string, std::string> metadata = {
      {"format", "strider"}, {"model", config_.name}, {"version", "1"}};
  if (sharded_) {
    metadata["expert_shard"] =
        std::to_string(expert_shard_.first) + ":" + std::to_string(expert_shard_.count);
  }
  return metadata;
}

Status Model::Save(const std::string& path) const {
  std::vector<at::Tensor> contiguous;
  STRIDER_ASSIGN_OR_RETURN(std::vector<TensorView> views, Views(&contiguous));
  return WriteSafetensors(path, views, SaveMetadata());
}

Result<std::string> Model::SaveToBytes() const {
  std::vector<at::Tensor> contiguous;
  STRIDER_ASSIGN_OR_RETURN(std::vector<TensorView> views, Views(&contiguous));
  return EncodeSafetensors(views, SaveMetadata());
}

Result<std::string> Model::SaveWholeToBytes(
    const std::map<std::string, at::Tensor>& whole_experts) const {
  std::vector<at::Tensor> contiguous;
  STRIDER_ASSIGN_OR_RETURN(std::vector<TensorView> views, Views(&contiguous));
  const std::vector<ParameterSpec> specs = ModelParameterSpecs(config_);
  for (size_t i = 0; i < views.size(); ++i) {
    if (!IsRoutedExpertTensor(views[i].name)) continue;
    auto it = whole_experts.find(views[i].name);
    if (it == whole_experts.end() || it->second.sizes().vec() != specs[i].shape ||
        it->second.scalar_type() != contiguous[i].scalar_type()) {
      return Status::InvalidArgument("whole weights: no whole tensor " + views[i].name + " of " +
                                     ShapeText(specs[i].shape));
    }
    contiguous[i] = it->second.detach().cpu().contiguous();
    views[i].shape = contiguous[i].sizes().vec();
    views[i].data = contiguous[i].data_ptr();
    views[i].byte_size = contiguous[i].nbytes();
  }
  std::map<std::string, std::string> metadata = SaveMetadata();
  metadata.erase("expert_shard");
  return EncodeSafetensors(views, metadata);
}

void Model::ServeExperts(model::ExpertExchange& exchange, bool backward) const {
  TORCH_CHECK(sharded_, "serving experts: this model holds every expert");
  at::AutoGradMode grad_mode(backward);
  const FeedForwardConfig& c = config_.feed_forward;
  const at::TensorOptions options = at::TensorOptions().dtype(dtype()).device(device());
  at::Tensor total;
  for (const Layers::Layer& layer : layers_->layers) {
    if (!layer.sparse) continue;
    // No rows of its own: the layer only computes what the other ranks send. The empty latent
    // requires a gradient so that backward runs the reverse exchanges too. Full-width experts
    // read the tokens themselves.
    const int64_t expert_input = c.latent_experts ? c.latent_width : config_.width;
    const at::Tensor latent = at::zeros({0, expert_input}, options).requires_grad_(backward);
    const at::Tensor experts = at::zeros({0, c.experts_per_token}, options.dtype(at::kLong));
    const at::Tensor weights = at::zeros({0, c.experts_per_token}, options);
    const at::Tensor out =
        model::RoutedExpertsParallel(layer.experts, c, latent, experts, weights, exchange);
    if (backward) total = total.defined() ? total + out.sum() : out.sum();
  }
  if (backward && total.defined()) total.backward();
}

void Model::Bind() {
  TensorMap map;
  for (const auto& [name, tensor] : tensors_) map[name] = tensor;
  // Weights that read the same input become row blocks of one matrix, so inference applies
  // them as one product (model/ops.h, LinearParts). The parameters stay separate tensors (views).
  const std::vector<char> layer_kinds = config_.LayerKinds();
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    if (layer_kinds[i] == 'I') {
      const std::string p = prefix + "incremental.";
      const std::string gate = config_.incremental.gate_rank > 0 ? "gate_down" : "gate";
      map[p + "joined_input"] = model::JoinRows(
          &map, {p + "query", p + "key", p + "value", p + gate, p + "beta", p + "decay_down"});
    } else {
      const std::string p = prefix + "latent.";
      map[p + "joined_input"] =
          model::JoinRows(&map, model::LatentAttentionInputNames(config_.latent, p));
    }
    if (config_.IsMoeLayer(i)) {
      const std::string p = prefix + "experts.";
      std::vector<std::string> names = {p + "router"};
      if (config_.feed_forward.latent_experts) names.push_back(p + "latent_down");
      if (config_.feed_forward.shared_experts > 0) {
        names.push_back(p + "shared_gate");
        names.push_back(p + "shared_up");
      }
      map[p + "joined_input"] = model::JoinRows(&map, names);
    } else {
      const std::string p = prefix + "dense.";
      map[p + "joined_input"] = model::JoinRows(&map, {p + "gate", p + "up"});
    }
  }
  for (auto& [name, tensor] : tensors_) tensor = map.at(name);
  auto layers = std::make_unique<Layers>();
  layers->embedding = model::Lookup(map, "embedding");
  if (config_.attention_residuals) {
    layers->residual_queries = model::Lookup(map, "residual_queries");
  }
  layers->final_norm = model::Lookup(map, "final_norm");
  // Tied: the head reads the embedding table itself, so an optimiser step updates both.
  layers->output = model::Lookup(map, config_.tie_embeddings ? "embedding" : "output");
  layers->value_weight = model::Lookup(map, "value_head.weight");
  layers->value_bias = model::Lookup(map, "value_head.bias");
  if (config_.vision.enabled) layers->vision = model::VisionWeights::Bind(map, "vision.");
  const std::vector<char> kinds = config_.LayerKinds();
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    Layers::Layer layer;
    layer.kind = kinds[i];
    layer.attention_norm = model::Lookup(map, prefix + "attention_norm");
    layer.feed_forward_norm = model::Lookup(map, prefix + "feed_forward_norm");
    if (layer.kind == 'I') {
      layer.incremental = model::IncrementalAttentionWeights::Bind(map, prefix + "incremental.");
    } else {
      layer.latent = model::LatentAttentionWeights::Bind(map, prefix + "latent.");
    }
    layer.sparse = config_.IsMoeLayer(i);
    if (layer.sparse) {
      layer.experts = model::SparseExpertWeights::Bind(map, prefix + "experts.",
                                                       config_.feed_forward.shared_experts > 0,
                                                       config_.feed_forward.latent_experts);
    } else {
      layer.dense = model::DenseFeedForwardWeights::Bind(map, prefix + "dense.");
    }
    layers->layers.push_back(std::move(layer));
  }
  layers_ = std::move(layers);
}

std::vector<at::Tensor> Model::TrainableParameters() const {
  std::vector<at::Tensor> parameters;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (trainable_[i]) parameters.push_back(tensors_[i].second);
  }
  return parameters;
}

void Model::SetRequiresGrad(bool requires_grad) {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (trainable_[i]) tensors_[i].second.requires_grad_(requires_grad);
  }
}

Status Model::ConvertTo(at::ScalarType dtype) {
  return Guarded("converting model weights", [&] {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const bool requires_grad = tensors_[i].second.requires_grad();
      tensors_[i].second = tensors_[i].second.detach().to(dtype).requires_grad_(requires_grad);
    }
    Bind();
  });
}

Status Model::CheckInput(const ModelInput& input) const {
  const at::Tensor& tokens = input.tokens;
  if (!tokens.defined() || tokens.dim() != 2) {
    return Status::InvalidArgument("tokens must be a (batch, length) tensor");
  }
  if (tokens.scalar_type() != at::kLong) {
    return Status::InvalidArgument("tokens must be int64");
  }
  if (tokens.size(0) == 0 || tokens.size(1) == 0) {
    return Status::InvalidArgument("tokens must hold at least one token per sequence");
  }
  const int64_t low = tokens.min().item<int64_t>();
  const int64_t high = tokens.max().item<int64_t>();
  if (low < 0 || high >= config_.vocabulary) {
    return Status::InvalidArgument("token id " + std::to_string(low < 0 ? low : high) +
                                   " is outside the vocabulary [0, " +
                                   std::to_string(config_.vocabulary) + ")");
  }
  // Without vision the placeholder's id is an ordinary token (a real tokenizer's vocabulary
  // has one there).
  if (!config_.vision.enabled && input.images.empty()) return Status::Ok();
  at::Tensor placeholders = (tokens == token::kImagePatch).sum(1).cpu();
  std::vector<int64_t> patches(tokens.size(0), 0);
  for (size_t i = 0; i < input.images.size(); ++i) {
    const ImageInput& image = input.images[i];
    if (image.sequence < 0 || image.sequence >= tokens.size(0)) {
      return Status::InvalidArgument("image " + std::to_string(i) + " names sequence " +
                                     std::to_string(image.sequence) + " outside the batch");
    }
    STRIDER_RETURN_IF_ERROR(
        model::ValidateImage(config_.vision, image.pixels).WithContext("image " + std::to_string(i)));
    patches[image.sequence] += model::PatchCount(config_.vision, image.pixels);
  }
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    const int64_t expected = placeholders[b].item<int64_t>();
    if (patches[b] != expected) {
      return Status::InvalidArgument(
          "sequence " + std::to_string(b) + " has " + std::to_string(expected) +
          " image-patch tokens but its images give " + std::to_string(patches[b]) + " patches");
    }
  }
  return Status::Ok();
}

ForwardOutput Model::Run(const ModelInput& input, InferenceState* state,
                         const ForwardOptions& options, RaggedBatch* ragged) const {
  const Layers& w = *layers_;
  // Callers build token ids on the host; the weights say where they are needed.
  const at::Tensor tokens = input.tokens.to(device());
  const int64_t batch = tokens.size(0);
  const int64_t length = tokens.size(1);
  const double epsilon = config_.norm_epsilon;

  at::Tensor x = at::embedding(w.embedding, tokens);  // (B, T, d)
  if (!input.images.empty()) {
    // Patch vectors replace the placeholder positions, image by image in stream order.
    at::Tensor is_patch = tokens == token::kImagePatch;
    std::vector<int64_t> next_position(batch, 0);
    std::vector<at::Tensor> rows, columns, vectors;
    for (const ImageInput& image : input.images) {
      at::Tensor embedded =
          model::EmbedImagePatches(w.vision, config_.vision, image.pixels.to(device()));
      const int64_t count = embedded.size(0);
      at::Tensor positions = at::nonzero(is_patch[image.sequence]).reshape({-1});
      rows.push_back(at::full({count}, image.sequence, tokens.options()));
      columns.push_back(positions.narrow(0, next_position[image.sequence], count));
      next_position[image.sequence] += count;
      vectors.push_back(embedded);
    }
    x = x.index_put({at::cat(rows), at::cat(columns)}, at::cat(vectors).to(x.scalar_type()));
  }

  // With attention residuals each sublayer reads a learned mix of the earlier outputs; with
  // plain residuals (attention_residuals: false) `stream` carries the running sum instead.
  const bool mixed = config_.attention_residuals;
  model::ResidualSources sources(x);
  at::Tensor stream = x;
  ForwardOutput out;
  int64_t sparse_index = 0;
  const int64_t block = config_.residual_block;
  for (int64_t i = 0; i < config_.layers; ++i) {
    const Layers::Layer& layer = w.layers[i];
    at::Tensor h = stream;
    if (mixed) {
      h = i == 0 ? x : model::ReadResidual(sources, w.residual_queries[2 * i], epsilon);
      if (i % block == 0) sources.Seal();
    }
    at::Tensor normed = model::RmsNorm(h, layer.attention_norm, epsilon);
    at::Tensor attention;
    if (layer.kind == 'I') {
      model::IncrementalAttentionState* layer_state = nullptr;
      if (state != nullptr) layer_state = &state->layers_[i].incremental;
      if (ragged != nullptr) layer_state = &ragged->layers[i].incremental;
      attention = model::IncrementalAttentionForward(layer.incremental, config_.incremental,
                                                     normed, layer_state, epsilon);
    } else if (ragged != nullptr) {
      model::LatentAttentionPast past = ragged->load_past(i);
      if (!past.lengths.defined()) past.lengths = ragged->past_lengths.to(tokens.device());
      attention = model::LatentAttentionForwardRagged(
          layer.latent, config_.latent, normed, past, epsilon,
          options.explicit_latent_attention ? model::LatentAttentionForm::kExplicit
                                            : model::LatentAttentionForm::kAbsorbed,
          &ragged->layers[i].new_rows);
    } else {
      attention = model::LatentAttentionForward(
          layer.latent, config_.latent, normed,
          state != nullptr ? &state->layers_[i].latent : nullptr, epsilon,
          (state != nullptr && !options.explicit_latent_attention)
              ? model::LatentAttentionForm::kAbsorbed
              : model::LatentAttentionForm::kExplicit);
    }
    if (mixed) {
      sources.Add(attention);
      h = model::ReadResidual(sources, w.residual_queries[2 * i + 1], epsilon);
    } else {
      stream = stream + attention;
      h = stream;
    }
    normed = model::RmsNorm(h, layer.feed_forward_norm, epsilon);
    at::Tensor feed_forward;
    if (layer.sparse) {
      at::Tensor replay;
      if (options.replay_routing != nullptr) {
        TORCH_CHECK(sparse_index < static_cast<int64_t>(options.replay_routing->layers.size()),
                    "routing replay has no record for sparse layer ", sparse_index);
        replay = options.replay_routing->layers[sparse_index].experts;
        TORCH_CHECK(replay.size(0) == batch && replay.size(1) == length,
                    "routing replay for sparse layer ", sparse_index, " covers ", replay.size(0),
                    "x", replay.size(1), " tokens, the input has ", batch, "x", length);
        replay = replay.reshape({batch * length, -1});
      }
      model::RoutingRecordEntry record;
      TORCH_CHECK(sharded_ == (options.expert_exchange != nullptr),
                  sharded_ ? "this model holds a shard of the experts: forward needs the ranks' "
                             "expert exchange"
                           : "an expert exchange was given, but this model holds every expert");
      feed_forward = model::SparseExpertForward(layer.experts, config_.feed_forward, normed,
                                                replay, &record, epsilon,
                                                options.expert_exchange);
      if (options.record_routing) {
        RoutingRecord::Layer entry;
        entry.experts = record.experts.view({batch, length, -1});
        entry.scores = record.scores.view({batch, length, -1});
        out.routing.layers.push_back(std::move(entry));
      }
      ++sparse_index;
    } else {
      feed_forward = model::DenseFeedForward(layer.dense, config_.feed_forward, normed);
    }
    if (mixed) {
      sources.Add(feed_forward);
    } else {
      stream = stream + feed_forward;
    }
  }
  at::Tensor final_read =
      mixed ? model::ReadResidual(sources, w.residual_queries[2 * config_.layers], epsilon)
            : stream;
  if (options.last_position_only) final_read = final_read.narrow(1, length - 1, 1);
  at::Tensor final_hidden = model::RmsNorm(final_read, w.final_norm, epsilon);
  out.logits = model::Linear(final_hidden, w.output);
  if (options.compute_values) {
    out.values = (model::Linear(final_hidden, w.value_weight) + w.value_bias).squeeze(-1);
  }
  if (options.return_hidden) out.hidden = final_hidden;
  return out;
}

Result<ForwardOutput> Model::Forward(const ModelInput& input, const ForwardOptions& options) const {
  STRIDER_RETURN_IF_ERROR(CheckInput(input));
  ForwardOutput out;
  STRIDER_RETURN_IF_ERROR(
      Guarded("model forward (training path)", [&] { out = Run(input, nullptr, options); }));
  return out;
}

Result<InferenceState> Model::NewState(int64_t batch_size) const {
  if (batch_size <= 0) return Status::InvalidArgument("batch size must be positive");
  InferenceState state;
  state.batch_size_ = batch_size;
  STRIDER_RETURN_IF_ERROR(Guarded("allocating inference state", [&] {
    const at::TensorOptions options = at::TensorOptions().dtype(dtype()).device(device());
    const at::ScalarType cache_type =
        dtype() == at::kDouble ? at::kDouble
                               : (config_.cache_dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
    for (const Layers::Layer& layer : layers_->layers) {
      InferenceState::Layer layer_state;
      if (layer.kind == 'I') {
        layer_state.incremental =
            model::IncrementalAttentionState::Zeros(config_.incremental, batch_size, options);
      } else {
        layer_state.latent = model::LatentAttentionCache::Empty(config_.latent, batch_size,
                                                                options.dtype(cache_type));
      }
      state.layers_.push_back(std::move(layer_state));
    }
  }));
  return state;
}

Result<ForwardOutput> Model::Append(InferenceState* state, const ModelInput& input,
                                    const ForwardOptions& options) const {
  if (state == nullptr) return Status::InvalidArgument("Append needs an inference state");
  STRIDER_RETURN_IF_ERROR(CheckInput(input));
  if (input.tokens.size(0) != state->batch_size()) {
    return Status::InvalidArgument("input batch of " + std::to_string(input.tokens.size(0)) +
                                   " sequences for a state of " +
                                   std::to_string(state->batch_size()));
  }
  if (state->length() + input.tokens.size(1) > config_.context) {
    return Status::OutOfRange("appending " + std::to_string(input.tokens.size(1)) +
                              " tokens to a sequence of " + std::to_string(state->length()) +
                              " exceeds model.context = " + std::to_string(config_.context));
  }
  ForwardOutput out;
  // Work on a copy of the per-layer handles so a failure midway leaves the state as it was.
  InferenceState next = *state;
  STRIDER_RETURN_IF_ERROR(Guarded("model append (inference path)", [&] {
    at::AutoGradMode grad_mode(options.enable_grad);
    out = Run(input, &next, options);
  }));
  next.length_ += input.tokens.size(1);
  *state = std::move(next);
  return out;
}

Result<ForwardOutput> Model::Step(RaggedBatch* batch, const ModelInput& input,
                                  const ForwardOptions& options) const {
  if (batch == nullptr) return Status::InvalidArgument("Step needs a ragged batch");
  STRIDER_RETURN_IF_ERROR(CheckInput(input));
  const int64_t rows = input.tokens.size(0);
  if (batch->layers.size() != static_cast<size_t>(config_.layers)) {
    return Status::InvalidArgument("ragged batch has " + std::to_string(batch->layers.size()) +
                                   " layers, the model " + std::to_string(config_.layers));
  }
  if (!batch->past_lengths.defined() || batch->past_lengths.dim() != 1 ||
      batch->past_lengths.size(0) != rows) {
    return Status::InvalidArgument("ragged batch needs past_lengths of shape (" +
                                   std::to_string(rows) + ")");
  }
  if (config_.CountLayers('G') > 0 && !batch->load_past) {
    return Status::InvalidArgument("ragged batch has no load_past for the latent layers");
  }
  const int64_t longest = batch->past_lengths.max().item<int64_t>();
  if (longest + input.tokens.size(1) > config_.context) {
    return Status::OutOfRange("appending " + std::to_string(input.tokens.size(1)) +
                              " tokens to a sequence of " + std::to_string(longest) +
                              " exceeds model.context = " + std::to_string(config_.context));
  }
  ForwardOutput out;
  RaggedBatch next = *batch;  // handles only: a failure midway leaves `batch` as it was
  STRIDER_RETURN_IF_ERROR(Guarded("model step (inference path, ragged batch)", [&] {
    at::AutoGradMode grad_mode(options.enable_grad);
    out = Run(input, nullptr, options, &next);
  }));
  *batch = std::move(next);
  return out;
}

Result<std::vector<double>> Model::UpdateRoutingBalance(const RoutingRecord& record) {
  std::vector<double> violations;
  int64_t sparse_index = 0;
  STRIDER_RETURN_IF_ERROR(Guarded("quantile balancing", [&] {
    at::NoGradGuard no_grad;
    for (Layers::Layer& layer : layers_->layers) {
      if (!layer.sparse) continue;
      TORCH_CHECK(sparse_index < static_cast<int64_t>(record.layers.size()),
                  "routing record has no entry for sparse layer ", sparse_index);
      const RoutingRecord::Layer& entry = record.layers[sparse_index++];
      TORCH_CHECK(entry.scores.defined(), "routing record holds no router scores");
      const int64_t experts = config_.feed_forward.routed_experts;
      at::Tensor scores = entry.scores.reshape({-1, experts});
      violations.push_back(
          kernels::MaxViolation(entry.experts.reshape({scores.size(0), -1}), experts));
      // Held as loaded (an imported correction bias): measured, not moved.
      if (!config_.feed_forward.quantile_balancing) continue;
      at::Tensor bias = kernels::QuantileBalanceBias(scores, layer.experts.router_bias,
                                                     config_.feed_forward.experts_per_token);
      layer.experts.router_bias.copy_(bias);
    }
  }));
  return violations;
}

at::Tensor NextTokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens) {
  const int64_t length = logits.size(1);
  const at::ScalarType type = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor log_probs = at::log_softmax(logits.narrow(1, 0, length - 1).to(type), -1);
  const at::Tensor targets = tokens.narrow(1, 1, length - 1).to(log_probs.device());
  return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
}

void ConfigureThreads(int64_t threads) {
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(threads));
}

void ConfigureRuntime(int64_t threads) {
  ConfigureThreads(threads);
  KeepFreedMemoryInHeap();
  UseTensorPool();
  // Tensors of 256 KiB and more live in the pool now; malloc's blocks of 1 MiB and more are
  // one-off buffers, mapped and returned (at a million tokens they grew the heap by 40 MB).
  ReturnLargeBlocksToKernel(int64_t{1} << 20);
}

}  // namespace strider
