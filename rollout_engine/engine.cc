// The engine behind rollout_engine/engine.h: sequences, admission against the block budget,
// chunked prefill, ragged batched decode through Model::Step, fork, snapshot and weight swap.
//
// The model's layers are used as they are: the engine only assembles a RaggedBatch (stacked
// incremental states, the latent past gathered from the paged cache one layer at a time) and
// stores what comes back. No attention or expert math lives here, and no byte layout: snapshots
// are encoded and checked in snapshot.cc.
#include "rollout_engine/engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <deque>
#include <map>

#include "common/model/parameters.h"
#include "common/mutex.h"
#include "common/tokenizer.h"
#include "common/model/torch_status.h"
#include "rollout_engine/engine_testing.h"
#include "rollout_engine/paged_cache.h"
#include "rollout_engine/snapshot.h"

namespace strider::rollout {
namespace {

using model::Guarded;

struct Sequence {
  SequenceId id = 0;
  SequenceStatus status = SequenceStatus::kIdle;
  std::vector<model::IncrementalAttentionState> incremental;  // per model layer ('I' only)
  BlockTable table;
  int64_t length = 0;                  // tokens fed
  std::vector<int64_t> pending;        // tokens waiting to be fed
  std::vector<at::Tensor> pending_images;  // images of the pending tokens, in stream order
  // (V) float32 on the model's device: the distribution of the next token; undefined before any
  // feed. Sampling reads it where it is.
  at::Tensor next_logits;
  uint64_t logits_version = 0;
  std::optional<SamplingParams> turn;  // generated after `pending` is fed
  bool release_on_finish = false;
  uint64_t counter = 0;                // draws taken from the random stream this turn
  int64_t generated = 0;               // tokens sampled this turn
  std::string turn_text;               // tail of this turn's bytes, for stop strings
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(const EngineOptions& options, std::shared_ptr<const Model> model, uint64_t version,
             const PagedCacheOptions& cache_options)
      : options_(options),
        model_(std::move(model)),
        version_(version),
        config_(model_->config()),
        fingerprint_(ConfigFingerprint(config_)),
        cache_(cache_options) {
    kinds_ = config_.LayerKinds();
    for (int64_t i = 0; i < config_.layers; ++i) {
      latent_index_.push_back(kinds_[i] == 'G' ? latent_layers_++ : -1);
    }
    sparse_layers_ = config_.layers - std::min(config_.layers, config_.feed_forward.dense_layers);
  }

  Result<SequenceId> Submit(const Request& request) override {
    MutexLock lock(&mutex_);
    if (request.tokens.empty()) {
      return Status::InvalidArgument("submit: the prompt must hold at least one token");
    }
    STRIDER_RETURN_IF_ERROR(CheckRequest(request, 0, "submit"));
    if (static_cast<int64_t>(sequences_.size()) >= options_.max_sequences) {
      return Status::ResourceExhausted("submit: " + std::to_string(sequences_.size()) +
                                       " live sequences, options.max_sequences = " +
                                       std::to_string(options_.max_sequences));
    }
    auto sequence = std::make_unique<Sequence>();
    sequence->id = next_id_++;
    sequence->pending = request.tokens;
    sequence->pending_images = request.images;
    sequence->turn = request.sampling;
    sequence->release_on_finish = request.release_on_finish;
    Status status = Guarded("allocating sequence state", [&] {
      mutex_.AssertHeld();
      const at::TensorOptions tensor_options =
          at::TensorOptions().dtype(model_->dtype()).device(model_->device());
      sequence->incremental.resize(config_.layers);
      for (int64_t i = 0; i < config_.layers; ++i) {
        if (kinds_[i] == 'I') {
          sequence->incremental[i] =
              model::IncrementalAttentionState::Zeros(config_.incremental, 1, tensor_options);
        }
      }
      return Status::Ok();
    });
    STRIDER_RETURN_IF_ERROR(status);
    STRIDER_RETURN_IF_ERROR(Admit(sequence.get(), "submit"));
    const SequenceId id = sequence->id;
    sequences_[id] = std::move(sequence);
    return id;
  }

  Status Append(SequenceId id, const Request& request) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * sequence, Find(id, "append"));
    if (sequence->status != SequenceStatus::kIdle) {
      return Status::FailedPrecondition("append: sequence " + std::to_string(id) +
                                        " is not idle (its turn has not ended)");
    }
    if (request.tokens.empty() && !request.sampling) {
      return Status::InvalidArgument("append: no tokens and no turn to generate");
    }
    // A turn needs a next-token distribution: from these tokens or from earlier ones.
    if (request.tokens.empty() && !sequence->next_logits.defined()) {
      return Status::FailedPrecondition("append: sequence " + std::to_string(id) +
                                        " has no tokens to generate from");
    }
    STRIDER_RETURN_IF_ERROR(CheckRequest(request, sequence->length, "append"));
    // Tentatively apply, then admit; undo on refusal so the sequence is untouched.
    Sequence before_turn = *sequence;
    sequence->pending = request.tokens;
    sequence->pending_images = request.images;
    sequence->turn = request.sampling;
    sequence->release_on_finish = request.release_on_finish;
    sequence->counter = 0;
    sequence->generated = 0;
    sequence->turn_text.clear();
    Status status = Admit(sequence, "append");
    if (!status.ok()) {
      *sequence = std::move(before_turn);
      return status;
    }
    return Status::Ok();
  }

  Result<StepResult> Step() override {
    MutexLock lock(&mutex_);
    // A step's memory beyond the weights grows with the cache's blocks, its rows and its chunk.
    model::OutOfMemoryAdvice advice("the actor config's engine.cache_budget_mb, engine.max_batch "
                                    "or engine.prefill_chunk_tokens");
    return Guarded("rollout step", [&]() -> Result<StepResult> {
      mutex_.AssertHeld();
      at::NoGradGuard no_grad;
      StepResult result;
      result.policy_version = version_;
      AdmitQueued();
      std::map<SequenceId, SequenceStep> touched;
      // Prefill. Pending runs that fit one model call are batched with others of the same
      // length (many short prompts: one call); longer ones are fed alone in chunks, so an
      // appended turn of any length never recomputes history and never makes a call too large.
      std::map<int64_t, std::vector<Sequence*>> by_length;
      for (auto& [id, sequence] : sequences_) {
        if (sequence->status != SequenceStatus::kPrefill) continue;
        SequenceStep& step = touched[id];
        step.id = id;
        const int64_t count = static_cast<int64_t>(sequence->pending.size());
        if (PrefillChunk(count) == count && sequence->pending_images.empty()) {
          by_length[count].push_back(sequence.get());
        } else {
          STRIDER_RETURN_IF_ERROR(Prefill(sequence.get(), &step, &result));
        }
      }
      for (auto& [count, group] : by_length) {
        STRIDER_RETURN_IF_ERROR(PrefillGroup(group, count, &touched, &result));
      }
      std::vector<Sequence*> generating;
      for (auto& [id, sequence] : sequences_) {
        if (sequence->status == SequenceStatus::kGenerating) generating.push_back(sequence.get());
      }
      for (size_t begin = 0; begin < generating.size();
           begin += static_cast<size_t>(options_.max_batch)) {
        const size_t end =
            std::min(generating.size(), begin + static_cast<size_t>(options_.max_batch));
        std::vector<Sequence*> rows(generating.begin() + begin, generating.begin() + end);
        STRIDER_RETURN_IF_ERROR(Decode(rows, &touched, &result));
      }
      for (auto& [id, step] : touched) {
        if (step.released) ReleaseSequence(id);
        result.sequences.push_back(std::move(step));
      }
      return result;
    });
  }

  Status Cancel(SequenceId id) override {
    MutexLock lock(&mutex_);
    STRIDER_RETURN_IF_ERROR(Find(id, "cancel").status());
    ReleaseSequence(id);
    return Status::Ok();
  }

  Status Release(SequenceId id) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * sequence, Find(id, "release"));
    if (sequence->status != SequenceStatus::kIdle) {
      return Status::FailedPrecondition("release: sequence " + std::to_string(id) +
                                        " is not idle; use Cancel to stop it");
    }
    ReleaseSequence(id);
    return Status::Ok();
  }

  Result<std::vector<SequenceId>> Fork(SequenceId id, int64_t count,
                                       const std::optional<SamplingParams>& sampling) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * source, Find(id, "fork"));
    if (count < 1) return Status::InvalidArgument("fork: count must be >= 1");
    if (source->status == SequenceStatus::kQueued || source->status == SequenceStatus::kPrefill ||
        !source->next_logits.defined()) {
      return Status::FailedPrecondition("fork: sequence " + std::to_string(id) +
                                        " has tokens not yet fed; Step first");
    }
    if (sampling) {
      STRIDER_RETURN_IF_ERROR(ValidateSamplingParams(*sampling, config_.vocabulary));
      if (source->length + sampling->max_new_tokens > config_.context) {
        return Status::OutOfRange("fork: " + std::to_string(source->length) + " tokens plus " +
                                  std::to_string(sampling->max_new_tokens) +
                                  " new tokens exceed model.context = " +
                                  std::to_string(config_.context));
      }
    }
    if (static_cast<int64_t>(sequences_.size()) + count > options_.max_sequences) {
      return Status::ResourceExhausted("fork: " + std::to_string(count) +
                                       " more sequences exceed options.max_sequences = " +
                                       std::to_string(options_.max_sequences));
    }
    std::vector<std::unique_ptr<Sequence>> children;
    for (int64_t i = 0; i < count; ++i) {
      auto child = std::make_unique<Sequence>(*source);
      child->id = next_id_ + static_cast<SequenceId>(i);
      child->table = cache_.Fork(source->table);
      child->turn = sampling;
      if (sampling) child->turn->seed = DeriveSeed(sampling->seed, static_cast<uint64_t>(i));
      child->status = sampling ? SequenceStatus::kGenerating : SequenceStatus::kIdle;
      child->release_on_finish = false;
      child->counter = 0;
      child->generated = 0;
      child->turn_text.clear();
      children.push_back(std::move(child));
    }
    // Sharing may add copy-on-write needs to the source too: check the whole demand.
    int64_t demand = cache_.used_blocks() + ReservedBlocks();
    for (const auto& child : children) demand += FutureBlocks(*child);
    if (demand > cache_.options().max_blocks) {
      for (auto& child : children) cache_.Release(&child->table);
      return Status::ResourceExhausted("fork: " + std::to_string(count) +
                                       " continuations need " + std::to_string(demand) +
                                       " blocks in all, the budget holds " +
                                       std::to_string(cache_.options().max_blocks));
    }
    std::vector<SequenceId> ids;
    for (auto& child : children) {
      ids.push_back(child->id);
      sequences_[child->id] = std::move(child);
    }
    next_id_ += static_cast<SequenceId>(count);
    return ids;
  }

  Result<std::string> Snapshot(SequenceId id) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * sequence, Find(id, "snapshot"));
    if (sequence->status == SequenceStatus::kQueued ||
        sequence->status == SequenceStatus::kPrefill) {
      return Status::FailedPrecondition("snapshot: sequence " + std::to_string(id) +
                                        " has tokens not yet fed; Step first");
    }
    SnapshotRecord record;
    record.config_name = config_.name;
    record.fingerprint = fingerprint_;
    record.generating = sequence->status == SequenceStatus::kGenerating;
    record.logits_version = sequence->logits_version;
    record.turn = sequence->turn;
    record.release_on_finish = sequence->release_on_finish;
    record.counter = sequence->counter;
    record.generated = sequence->generated;
    record.turn_text = sequence->turn_text;
    STRIDER_RETURN_IF_ERROR(Guarded("snapshot", [&] {
      mutex_.AssertHeld();
      if (sequence->next_logits.defined()) {
        const at::Tensor host = sequence->next_logits.cpu().contiguous();
        record.next_logits.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
      }
      record.state = SerializeState(*sequence);
      return Status::Ok();
    }));
    return EncodeSnapshot(record);
  }

  Result<SequenceId> Restore(const std::string& bytes) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(SnapshotRecord record, DecodeSnapshot(bytes, config_, fingerprint_));
    auto sequence = std::make_unique<Sequence>();
    sequence->status = record.generating ? SequenceStatus::kGenerating : SequenceStatus::kIdle;
    sequence->logits_version = record.logits_version;
    sequence->turn = std::move(record.turn);
    sequence->release_on_finish = record.release_on_finish;
    sequence->counter = record.counter;
    sequence->generated = record.generated;
    sequence->turn_text = std::move(record.turn_text);
    if (static_cast<int64_t>(sequences_.size()) >= options_.max_sequences) {
      return Status::ResourceExhausted("restore: options.max_sequences reached");
    }
    sequence->id = next_id_;
    std::vector<at::Tensor> rows;
    STRIDER_RETURN_IF_ERROR(Guarded("restore", [&] {
      mutex_.AssertHeld();
      if (!record.next_logits.empty()) {
        sequence->next_logits =
            at::tensor(record.next_logits, at::kFloat).to(model_->device());
      }
      return DeserializeState(record.state, sequence.get(), &rows);
    }));
    // Admission: its stored rows plus its remaining turn must fit the budget now.
    const int64_t stored_blocks =
        (sequence->length + options_.block_tokens - 1) / options_.block_tokens;
    const int64_t needed = latent_layers_ == 0 ? 0 : stored_blocks + FutureBlocks(*sequence);
    if (cache_.used_blocks() + ReservedBlocks() + needed > cache_.options().max_blocks) {
      return Status::ResourceExhausted("restore: the sequence needs " + std::to_string(needed) +
                                       " blocks, " +
                                       std::to_string(cache_.options().max_blocks -
                                                      cache_.used_blocks() - ReservedBlocks()) +
                                       " are available");
    }
    const int64_t length = sequence->length;
    sequence->length = 0;
    STRIDER_RETURN_IF_ERROR(Guarded("restore", [&] {
      mutex_.AssertHeld();
      STRIDER_RETURN_IF_ERROR(cache_.Append(&sequence->table, rows));
      return Status::Ok();
    }));
    sequence->table.length = length;
    sequence->length = length;
    ++next_id_;
    const SequenceId id = sequence->id;
    sequences_[id] = std::move(sequence);
    return id;
  }

  Result<uint64_t> StateDigest(SequenceId id) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * sequence, Find(id, "state digest"));
    // Streamed from the blocks: at a million tokens the encoding alone would be 100 MB.
    StreamingHasher hasher;
    STRIDER_RETURN_IF_ERROR(Guarded("state digest", [&] {
      mutex_.AssertHeld();
      WriteSequenceState(*sequence, [&](const void* data, size_t n) { hasher.Update(data, n); });
      return Status::Ok();
    }));
    return hasher.Digest();
  }

  Status SwapWeights(std::shared_ptr<const Model> model, uint64_t policy_version) override {
    if (model == nullptr) return Status::InvalidArgument("swap weights: no model");
    MutexLock lock(&mutex_);
    if (ConfigFingerprint(model->config()) != fingerprint_ || model->dtype() != model_->dtype()) {
      return Status::FailedPrecondition(
          "swap weights: the new model's config '" + model->config().name +
          "' has other shapes or dtype than the engine's '" + config_.name + "'");
    }
    if (model->device() != model_->device()) {
      return Status::FailedPrecondition("swap weights: the new model is on " +
                                        model->device().str() + ", the engine's cache on " +
                                        model_->device().str());
    }
    model_ = std::move(model);
    version_ = policy_version;
    return Status::Ok();
  }

  // engine_testing.h; not part of the Engine interface.
  Status FillForBenchmark(SequenceId id, int64_t tokens, uint64_t seed) {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * sequence, Find(id, "fill for benchmark"));
    if (sequence->status != SequenceStatus::kIdle || !sequence->pending.empty()) {
      return Status::FailedPrecondition("fill for benchmark: sequence " + std::to_string(id) +
                                        " is not idle");
    }
    if (tokens < 1) {
      return Status::InvalidArgument("fill for benchmark: tokens must be >= 1, got " +
                                     std::to_string(tokens));
    }
    if (sequence->length + tokens > config_.context) {
      return Status::OutOfRange("fill for benchmark: " + std::to_string(sequence->length) +
                                " + " + std::to_string(tokens) +
                                " tokens exceed model.context = " +
                                std::to_string(config_.context));
    }
    const int64_t needed = cache_.BlocksToAppend(sequence->table, tokens);
    if (cache_.used_blocks() + ReservedBlocks(id) + needed > cache_.options().max_blocks) {
      return Status::ResourceExhausted("fill for benchmark: " + std::to_string(tokens) +
                                       " tokens need " + std::to_string(needed) +
                                       " blocks the budget does not have");
    }
    return Guarded("fill for benchmark", [&]() -> Status {
      mutex_.AssertHeld();
      at::Generator generator = at::detail::createCPUGenerator(seed);
      const int64_t latent_rank = config_.latent.kv_rank;
      constexpr int64_t kPiece = 65536;
      for (int64_t done = 0; done < tokens && latent_layers_ > 0; done += kPiece) {
        const int64_t n = std::min(kPiece, tokens - done);
        std::vector<at::Tensor> rows;
        for (int64_t layer = 0; layer < latent_layers_; ++layer) {
          // Like real rows: c_kv with unit root-mean-square (RMSNorm), any shared key part.
          at::Tensor latent = at::randn({n, latent_rank}, generator, at::kFloat);
          latent = latent * at::rsqrt(latent.pow(2).mean(-1, true) + config_.norm_epsilon);
          at::Tensor rope = at::randn({n, config_.latent.rope_dim}, generator, at::kFloat);
          rows.push_back(at::cat({latent, rope}, -1));
        }
        STRIDER_RETURN_IF_ERROR(cache_.Append(&sequence->table, rows));
      }
      sequence->length += tokens;
      return Status::Ok();
    });
  }

  Result<SequenceInfo> Info(SequenceId id) override {
    MutexLock lock(&mutex_);
    STRIDER_ASSIGN_OR_RETURN(Sequence * sequence, Find(id, "info"));
    SequenceInfo info;
    info.status = sequence->status;
    info.length = sequence->length;
    info.pending_tokens = static_cast<int64_t>(sequence->pending.size());
    info.generated = sequence->generated;
    info.blocks = static_cast<int64_t>(sequence->table.blocks.size());
    return info;
  }

  EngineStats Stats() override {
    MutexLock lock(&mutex_);
    EngineStats stats;
    stats.live_sequences = static_cast<int64_t>(sequences_.size());
    stats.queued_requests = static_cast<int64_t>(queue_.size());
    stats.used_blocks = cache_.used_blocks();
    stats.reserved_blocks = ReservedBlocks();
    stats.capacity_blocks = cache_.options().max_blocks;
    stats.block_bytes = cache_.BlockBytes();
    stats.allocated_blocks = cache_.allocated_blocks();
    return stats;
  }

  uint64_t policy_version() override {
    MutexLock lock(&mutex_);
    return version_;
  }

 private:
  Result<Sequence*> Find(SequenceId id, const char* what) REQUIRES(mutex_) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) {
      return Status::NotFound(std::string(what) + ": unknown sequence " + std::to_string(id));
    }
    return it->second.get();
  }

  Status CheckRequest(const Request& request, int64_t length, const char* what) const
      REQUIRES(mutex_) {
    for (size_t i = 0; i < request.tokens.size(); ++i) {
      const int64_t token = request.tokens[i];
      if (token < 0 || token >= config_.vocabulary) {
        return Status::InvalidArgument(std::string(what) + ": token " + std::to_string(token) +
                                       " at index " + std::to_string(i) +
                                       " is outside the vocabulary [0, " +
                                       std::to_string(config_.vocabulary) + ")");
      }
    }
    const bool has_patches = std::find(request.tokens.begin(), request.tokens.end(),
                                       int64_t{token::kImagePatch}) != request.tokens.end();
    if (has_patches || !request.images.empty()) {
      // Patch counts, image shapes and the vision config, checked as the model will.
      STRIDER_RETURN_IF_ERROR(Guarded(what, [&] {
        mutex_.AssertHeld();
        ModelInput input{at::tensor(request.tokens, at::kLong).view({1, -1}), {}};
        for (const at::Tensor& pixels : request.images) {
          if (!pixels.defined()) return Status::InvalidArgument("an image tensor is undefined");
          input.images.push_back({0, pixels});
        }
        return model_->CheckInput(input);
      }));
    }
    if (request.sampling) {
      STRIDER_RETURN_IF_ERROR(ValidateSamplingParams(*request.sampling, config_.vocabulary)
                                  .WithContext(what));
    }
    const int64_t longest = length + static_cast<int64_t>(request.tokens.size()) +
                            (request.sampling ? request.sampling->max_new_tokens : 0);
    if (longest > config_.context) {
      return Status::OutOfRange(std::string(what) + ": " + std::to_string(length) +
                                " tokens + " + std::to_string(request.tokens.size()) +
                                " appended" +
                                (request.sampling ? " + " +
                                                        std::to_string(
                                                            request.sampling->max_new_tokens) +
                                                        " new"
                                                  : std::string()) +
                                " exceed model.context = " + std::to_string(config_.context));
    }
    return Status::Ok();
  }

  // Blocks the sequence may still allocate: up to its longest possible length, plus a copy of
  // a shared partially filled last block. Growth never raises used + reserved (a new block
  // lowers this count by one), so admitted sequences cannot run the pool dry.
  int64_t FutureBlocks(const Sequence& sequence) const REQUIRES(mutex_) {
    if (latent_layers_ == 0) return 0;
    const int64_t block = options_.block_tokens;
    int64_t longest = sequence.length + static_cast<int64_t>(sequence.pending.size());
    if (sequence.turn) longest += sequence.turn->max_new_tokens - sequence.generated;
    const int64_t have = (sequence.length + block - 1) / block;
    int64_t future = std::max<int64_t>(0, (longest + block - 1) / block - have);
    if (sequence.length % block != 0 && !sequence.table.blocks.empty() &&
        cache_.RefCount(sequence.table.blocks.back()) > 1) {
      ++future;
    }
    return future;
  }

  // Sum over admitted sequences other than `except`.
  int64_t ReservedBlocks(SequenceId except = 0) const REQUIRES(mutex_) {
    int64_t reserved = 0;
    for (const auto& [id, sequence] : sequences_) {
      if (id == except) continue;
      if (sequence->status != SequenceStatus::kQueued) reserved += FutureBlocks(*sequence);
    }
    return reserved;
  }

  // Admits `sequence` (new, or idle with a new request) or, by policy, queues it.
  Status Admit(Sequence* sequence, const char* what) REQUIRES(mutex_) {
    const int64_t future = FutureBlocks(*sequence);
    const int64_t capacity = cache_.options().max_blocks;
    const int64_t own = static_cast<int64_t>(sequence->table.blocks.size());
    if (own + future > capacity) {
      return Status::ResourceExhausted(
          std::string(what) + ": the sequence would need " + std::to_string(own + future) +
          " blocks of " + std::to_string(options_.block_tokens) +
          " tokens, more than the whole budget of " + std::to_string(capacity) + " blocks (" +
          std::to_string(options_.cache_budget_bytes) + " bytes)");
    }
    // Queued requests keep their order: nobody overtakes them.
    const int64_t others = ReservedBlocks(sequence->id);
    if (queue_.empty() && cache_.used_blocks() + others + future <= capacity) {
      sequence->status = StatusAfterAdmission(*sequence);
      return Status::Ok();
    }
    if (options_.admission == AdmissionPolicy::kQueue) {
      sequence->status = SequenceStatus::kQueued;
      queue_.push_back(sequence->id);
      return Status::Ok();
    }
    return Status::ResourceExhausted(
        std::string(what) + ": the latent cache budget is full: the request needs " +
        std::to_string(future) + " blocks, " +
        std::to_string(std::max<int64_t>(0, capacity - cache_.used_blocks() - others)) +
        " of " + std::to_string(capacity) + " are neither used nor reserved");
  }

  SequenceStatus StatusAfterAdmission(const Sequence& sequence) const {
    if (!sequence.pending.empty()) return SequenceStatus::kPrefill;
    return sequence.turn ? SequenceStatus::kGenerating : SequenceStatus::kIdle;
  }

  void AdmitQueued() REQUIRES(mutex_) {
    while (!queue_.empty()) {
      auto it = sequences_.find(queue_.front());
      if (it == sequences_.end()) {  // cancelled while queued
        queue_.pop_front();
        continue;
      }
      Sequence& sequence = *it->second;
      if (cache_.used_blocks() + ReservedBlocks(sequence.id) + FutureBlocks(sequence) >
          cache_.options().max_blocks) {
        return;
      }
      sequence.status = StatusAfterAdmission(sequence);
      queue_.pop_front();
    }
  }

  void ReleaseSequence(SequenceId id) REQUIRES(mutex_) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) return;
    cache_.Release(&it->second->table);
    sequences_.erase(it);
    queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  }

  // The rows' (1, ...) tensors stacked along the batch: a view without a copy when they are, in
  // order, consecutive rows of one tensor (the same rows decoded together last step), else a
  // copy.
  static at::Tensor StackRows(const std::vector<at::Tensor>& parts) {
    const at::Tensor& first = parts.front();
    bool consecutive = first.size(0) == 1;
    for (size_t b = 1; b < parts.size() && consecutive; ++b) {
      consecutive = parts[b].is_alias_of(first) && parts[b].sizes() == first.sizes() &&
                    parts[b].strides() == first.strides() &&
                    parts[b].storage_offset() ==
                        first.storage_offset() + static_cast<int64_t>(b) * first.stride(0);
    }
    if (!consecutive) return at::cat(parts, 0);
    std::vector<int64_t> sizes = first.sizes().vec();
    sizes[0] = static_cast<int64_t>(parts.size());
    return first.as_strided(sizes, first.strides(), first.storage_offset());
  }

  // *target = value, copying into *target's storage when the sequence owns it alone (not
  // shared with a fork, not a view of a batch); otherwise a compact copy of its own.
  static void StoreInPlace(at::Tensor* target, const at::Tensor& value) {
    if (target->defined() && target->use_count() == 1 && target->sizes() == value.sizes() &&
        target->scalar_type() == value.scalar_type() && target->is_contiguous() &&
        target->storage().nbytes() == static_cast<size_t>(target->nbytes()) &&
        !target->is_alias_of(value)) {
      target->copy_(value);
    } else {
      *target = value.clone(at::MemoryFormat::Contiguous);
    }
  }

  // Gives a sequence that leaves the decode batch (turn ended, prefilled alone) states of its
  // own, so it does not keep a batch's tensors or a prefill's temporaries alive.
  void OwnStates(Sequence* sequence) const {
    for (model::IncrementalAttentionState& state : sequence->incremental) {
      for (at::Tensor* tensor : {&state.recurrent, &state.conv_tail}) {
        if (tensor->defined() &&
            tensor->storage().nbytes() > static_cast<size_t>(tensor->nbytes())) {
          *tensor = tensor->clone();
        }
      }
    }
  }

  // Runs one model call over `rows`, each feeding tokens.size(1) tokens, and commits states,
  // latent rows and next-token logits. Fails without changing any row.
  Result<ForwardOutput> Feed(const std::vector<Sequence*>& rows, const at::Tensor& tokens,
                             const std::vector<at::Tensor>& images = {}) REQUIRES(mutex_) {
    const int64_t batch = static_cast<int64_t>(rows.size());
    const int64_t count = tokens.size(1);
    RaggedBatch ragged;
    ragged.layers.resize(config_.layers);
    std::vector<int64_t> lengths;
    for (Sequence* row : rows) lengths.push_back(row->length);
    ragged.past_lengths = at::tensor(lengths, at::kLong);
    for (int64_t i = 0; i < config_.layers; ++i) {
      if (kinds_[i] != 'I') continue;
      if (batch == 1) {
        ragged.layers[i].incremental = rows[0]->incremental[i];
      } else {
        std::vector<at::Tensor> recurrent, tails;
        for (Sequence* row : rows) {
          recurrent.push_back(row->incremental[i].recurrent);
          tails.push_back(row->incremental[i].conv_tail);
        }
        ragged.layers[i].incremental.recurrent = StackRows(recurrent);
        ragged.layers[i].incremental.conv_tail = StackRows(tails);
      }
    }
    std::vector<const BlockTable*> tables;
    for (Sequence* row : rows) tables.push_back(&row->table);
    const int64_t latent_rank = config_.latent.kv_rank;
    const int64_t rope = config_.latent.rope_dim;
    // The past is read in place from the blocks (views, nothing copied).
    ragged.load_past = [&](int64_t layer) {
      mutex_.AssertHeld();  // the model calls it inside Step below
      model::LatentAttentionPast past;
      past.pages.resize(tables.size());
      for (size_t b = 0; b < tables.size(); ++b) {
        for (const at::Tensor& page : cache_.Pages(*tables[b], latent_index_[layer])) {
          past.pages[b].push_back(
              {page.narrow(-1, 0, latent_rank), page.narrow(-1, latent_rank, rope)});
        }
      }
      return past;
    };
    ForwardOptions forward;
    forward.record_routing = options_.record_routing;
    forward.last_position_only = true;
    ModelInput input{tokens, {}};
    for (const at::Tensor& pixels : images) input.images.push_back({0, pixels});  // one row
    STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, model_->Step(&ragged, input, forward));
    if (options_.record_routing && !out.routing.layers.empty() &&
        !out.routing.layers.front().experts.device().is_cpu()) {
      // The routing record goes to the trajectory on the host: every layer's choices in one
      // copy (docs/cuda.md, device-to-host copies).
      std::vector<at::Tensor> experts;
      for (const RoutingRecord::Layer& layer : out.routing.layers) experts.push_back(layer.experts);
      const at::Tensor host = at::stack(experts, 0).cpu();
      for (size_t layer = 0; layer < out.routing.layers.size(); ++layer) {
        out.routing.layers[layer].experts = host[static_cast<int64_t>(layer)];
      }
    }

    // Commit. Blocks were reserved at admission, so the cache append cannot run out.
    at::Tensor logits = out.logits.select(1, 0).to(at::kFloat).contiguous();  // (B, V)
    std::vector<at::Tensor> new_rows;  // per latent layer: (B, T, W)
    for (int64_t i = 0; i < config_.layers; ++i) {
      if (kinds_[i] != 'G') continue;
      const model::LatentAttentionRows& fresh = ragged.layers[i].new_rows;
      new_rows.push_back(at::cat({fresh.latent, fresh.rope_key}, -1));
    }
    for (int64_t b = 0; b < batch; ++b) {
      Sequence* row = rows[b];
      for (int64_t i = 0; i < config_.layers; ++i) {
        if (kinds_[i] != 'I') continue;
        const model::IncrementalAttentionState& state = ragged.layers[i].incremental;
        if (batch == 1) {
          // Written into the sequence's own tensors: the call's conv tail is a view of its
          // (T + 3)-row input buffer (12 MiB for a 16K chunk of the tiny model), which adopting
          // it would keep alive until the next call.
          StoreInPlace(&row->incremental[i].recurrent, state.recurrent);
          StoreInPlace(&row->incremental[i].conv_tail, state.conv_tail);
        } else {
          // Views of the batch's states: rows decoded together again next step are stacked
          // without a copy (StackRows). A row that leaves the batch takes its own copy
          // (OwnStates), so it never keeps the whole batch's tensor alive.
          row->incremental[i].recurrent = state.recurrent.narrow(0, b, 1);
          row->incremental[i].conv_tail = state.conv_tail.narrow(0, b, 1);
        }
      }
      if (latent_layers_ > 0) {
        std::vector<at::Tensor> layer_rows;
        for (const at::Tensor& joined : new_rows) layer_rows.push_back(joined[b]);  // (T, W)
        Status stored = cache_.Append(&row->table, layer_rows);
        if (!stored.ok()) return Status::Internal("reserved blocks missing: " + stored.message());
      }
      row->length += count;
      row->next_logits = logits[b].clone();  // its own: the batch's logits are not kept alive
      row->logits_version = version_;
    }
    return out;
  }

  CompactRouting Compact(const ForwardOutput& out, int64_t row, int64_t first_position) const {
    CompactRouting routing;
    routing.first_position = first_position;
    routing.layers = static_cast<int64_t>(out.routing.layers.size());
    if (routing.layers == 0) return routing;
    routing.tokens = out.routing.layers[0].experts.size(1);
    routing.experts_per_token = out.routing.layers[0].experts.size(2);
    routing.experts.resize(routing.tokens * routing.layers * routing.experts_per_token);
    for (int64_t layer = 0; layer < routing.layers; ++layer) {
      at::Tensor experts = out.routing.layers[layer].experts[row].to(at::kLong).contiguous();
      const int64_t* data = experts.data_ptr<int64_t>();
      for (int64_t t = 0; t < routing.tokens; ++t) {
        for (int64_t j = 0; j < routing.experts_per_token; ++j) {
          routing.experts[(t * routing.layers + layer) * routing.experts_per_token + j] =
              static_cast<uint16_t>(data[t * routing.experts_per_token + j]);
        }
      }
    }
    return routing;
  }

  // Tokens of the next prefill call. Latent attention works blockwise over the cache in place
  // (its transient memory is a bounded tile of scores), so only the option limits the chunk.
  int64_t PrefillChunk(int64_t remaining) const {
    return std::min(options_.prefill_chunk_tokens, remaining);
  }

  Status Prefill(Sequence* sequence, SequenceStep* step, StepResult* result) REQUIRES(mutex_) {
    std::vector<CompactRouting> parts;
    size_t done = 0;
    const int64_t total = static_cast<int64_t>(sequence->pending.size());
    const int64_t budget =
        options_.prefill_tokens_per_step > 0 && sequence->pending_images.empty()
            ? options_.prefill_tokens_per_step
            : total;
    while (static_cast<int64_t>(done) < total && static_cast<int64_t>(done) < budget) {
      // A run with images goes in one call: an image's patches never straddle two calls.
      const int64_t count = sequence->pending_images.empty()
                                ? PrefillChunk(total - static_cast<int64_t>(done))
                                : total;
      at::Tensor tokens =
          at::tensor(std::vector<int64_t>(sequence->pending.begin() + done,
                                          sequence->pending.begin() + done + count),
                     at::kLong)
              .view({1, count});
      const int64_t first = sequence->length;
      Result<ForwardOutput> out = Feed({sequence}, tokens, sequence->pending_images);
      if (!out.ok()) {
        // Keep the sequence consistent: drop what was fed, keep the rest pending.
        sequence->pending.erase(sequence->pending.begin(), sequence->pending.begin() + done);
        return out.status().WithContext("prefill of sequence " + std::to_string(sequence->id));
      }
      if (options_.record_routing) parts.push_back(Compact(*out, 0, first));
      done += static_cast<size_t>(count);
      result->prefill_tokens += count;
    }
    if (static_cast<int64_t>(done) < total) {
      // The step's budget is spent: the rest waits for the next step, still in prefill.
      sequence->pending.erase(sequence->pending.begin(), sequence->pending.begin() + done);
    } else {
      std::vector<int64_t>().swap(sequence->pending);  // a long run's storage, not kept
      sequence->pending_images.clear();
      sequence->status = sequence->turn ? SequenceStatus::kGenerating : SequenceStatus::kIdle;
    }
    OwnStates(sequence);
    if (!parts.empty()) {
      Result<CompactRouting> joined = CompactRouting::Concatenate(parts);
      if (joined.ok()) step->routing = std::move(*joined);
    }
    return Status::Ok();
  }

  // Feeds the whole pending run of several sequences (all `count` long) in batched calls.
  Status PrefillGroup(const std::vector<Sequence*>& group, int64_t count,
                      std::map<SequenceId, SequenceStep>* touched, StepResult* result)
      REQUIRES(mutex_) {
    size_t begin = 0;
    while (begin < group.size()) {
      // Up to max_batch rows per call.
      const size_t end =
          std::min(group.size(), begin + static_cast<size_t>(options_.max_batch));
      std::vector<Sequence*> rows(group.begin() + begin, group.begin() + end);
      std::vector<int64_t> tokens, firsts;
      for (Sequence* row : rows) {
        tokens.insert(tokens.end(), row->pending.begin(), row->pending.end());
        firsts.push_back(row->length);
      }
      at::Tensor input =
          at::tensor(tokens, at::kLong).view({static_cast<int64_t>(rows.size()), count});
      STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, Feed(rows, input));
      for (size_t b = 0; b < rows.size(); ++b) {
        Sequence* row = rows[b];
        row->pending.clear();
        row->status = row->turn ? SequenceStatus::kGenerating : SequenceStatus::kIdle;
        OwnStates(row);
        if (options_.record_routing) {
          (*touched)[row->id].routing = Compact(out, static_cast<int64_t>(b), firsts[b]);
        }
      }
      result->prefill_tokens += count * static_cast<int64_t>(rows.size());
      begin = end;
    }
    return Status::Ok();
  }

  Status Decode(const std::vector<Sequence*>& rows, std::map<SequenceId, SequenceStep>* touched,
                StepResult* result) REQUIRES(mutex_) {
    // Every row's distribution in one call: the log-prob stored with a token is the shared
    // sampling distribution's (model::SamplingLogProbs), which a learner recomputes.
    std::vector<at::Tensor> next_logits;
    std::vector<model::SamplingSettings> distributions;
    std::vector<double> uniforms;
    for (size_t b = 0; b < rows.size(); ++b) {
      next_logits.push_back(rows[b]->next_logits);
      distributions.push_back(TurnDistribution(*rows[b]->turn, options_.never_sampled));
      uniforms.push_back(UniformDraw(rows[b]->turn->seed, rows[b]->counter));
    }
    STRIDER_ASSIGN_OR_RETURN(at::Tensor logits,
                             Guarded("gathering logits", [&] { return at::stack(next_logits); }));
    STRIDER_ASSIGN_OR_RETURN(std::vector<Sample> samples,
                             SampleTokens(logits, distributions, uniforms));
    std::vector<int64_t> tokens;
    for (const Sample& sample : samples) tokens.push_back(sample.token);
    std::vector<uint64_t> versions;
    std::vector<int64_t> positions;
    for (Sequence* row : rows) {
      versions.push_back(row->logits_version);
      positions.push_back(row->length);
    }
    at::Tensor input =
        at::tensor(tokens, at::kLong).view({static_cast<int64_t>(rows.size()), 1});
    STRIDER_ASSIGN_OR_RETURN(ForwardOutput out, Feed(rows, input));
    for (size_t b = 0; b < rows.size(); ++b) {
      Sequence* row = rows[b];
      ++row->counter;
      ++row->generated;
      SequenceStep& step = (*touched)[row->id];
      step.id = row->id;
      step.sampled = true;
      step.token = samples[b].token;
      step.position = positions[b];
      step.log_prob = samples[b].log_prob;
      step.model_log_prob = samples[b].model_log_prob;
      step.entropy = samples[b].entropy;
      step.policy_version = versions[b];
      if (options_.record_routing) {
        CompactRouting routing = Compact(out, static_cast<int64_t>(b), positions[b]);
        if (step.routing.tokens == 0) {
          step.routing = std::move(routing);
        } else {
          Result<CompactRouting> joined = CompactRouting::Concatenate({step.routing, routing});
          if (joined.ok()) step.routing = std::move(*joined);
        }
      }
      const SamplingParams& params = *row->turn;
      size_t longest_stop = 0;
      for (const std::string& stop : params.stop_strings) {
        longest_stop = std::max(longest_stop, stop.size());
      }
      // A stop string may end anywhere in the new token's bytes; the kept tail is long enough
      // for any that began before them.
      bool stopped = false;
      if (longest_stop > 0) {
        const std::string piece = options_.token_bytes
                                      ? options_.token_bytes(step.token)
                                      : step.token < token::kByteCount
                                            ? std::string(1, static_cast<char>(step.token))
                                            : std::string();
        const size_t before = row->turn_text.size();
        row->turn_text += piece;
        for (const std::string& stop : params.stop_strings) {
          if (piece.empty() || stop.empty() || row->turn_text.size() < stop.size()) continue;
          const size_t from = before + 1 >= stop.size() ? before + 1 - stop.size() : 0;
          stopped = stopped || row->turn_text.find(stop, from) != std::string::npos;
        }
        if (row->turn_text.size() > longest_stop) {
          row->turn_text.erase(0, row->turn_text.size() - longest_stop);
        }
      }
      if (std::find(params.stop_tokens.begin(), params.stop_tokens.end(), step.token) !=
          params.stop_tokens.end()) {
        step.finish = FinishReason::kStopToken;
      } else if (stopped) {
        step.finish = FinishReason::kStopString;
      } else if (row->generated >= params.max_new_tokens) {
        step.finish = FinishReason::kMaxTokens;
      }
      if (step.finish != FinishReason::kNone) {
        OwnStates(row);
        row->status = SequenceStatus::kIdle;
        row->turn.reset();  // the rest of its reservation returns to the pool
        row->generated = 0;
        row->turn_text.clear();
        step.released = row->release_on_finish;
      }
      ++result->decode_tokens;
    }
    return Status::Ok();
  }

  // The snapshot's state section (snapshot.h) handed to `sink` piece by piece, the latent rows
  // straight from the cache's blocks; StateDigest hashes the same bytes.
  void WriteSequenceState(const Sequence& sequence, const ByteSink& sink) const
      REQUIRES(mutex_) {
    std::vector<model::IncrementalAttentionState> incremental;
    for (int64_t i = 0; i < config_.layers; ++i) {
      if (kinds_[i] == 'I') incremental.push_back(sequence.incremental[i]);
    }
    std::vector<std::vector<at::Tensor>> latent;
    for (int64_t layer = 0; layer < latent_layers_; ++layer) {
      latent.push_back(cache_.Pages(sequence.table, layer));
      if (latent.back().empty()) {
        latent.back().push_back(at::empty({0, cache_.options().row_width},
                                          at::TensorOptions().dtype(cache_.options().dtype)));
      }
    }
    WriteState(sequence.length, incremental, latent, sink);
  }

  std::string SerializeState(const Sequence& sequence) const REQUIRES(mutex_) {
    return CollectBytes([&](const ByteSink& sink) {
      mutex_.AssertHeld();
      WriteSequenceState(sequence, sink);
    });
  }

  // Sets the sequence's length and incremental states from a snapshot's state section; its
  // latent rows go to *rows, one (length, d_c + d_rope) per latent layer, for the cache.
  Status DeserializeState(const std::string& bytes, Sequence* sequence,
                          std::vector<at::Tensor>* rows) const REQUIRES(mutex_) {
    STRIDER_ASSIGN_OR_RETURN(SequenceState state, DecodeState(bytes, config_, model_->dtype(),
                                                              cache_.options().dtype));
    sequence->length = state.length;
    sequence->incremental.resize(config_.layers);
    size_t next = 0;
    for (int64_t i = 0; i < config_.layers; ++i) {
      if (kinds_[i] != 'I') continue;
      // Decoded on the host; the states live where the model computes.
      model::IncrementalAttentionState& layer = state.incremental[next++];
      sequence->incremental[i].recurrent = layer.recurrent.to(model_->device());
      sequence->incremental[i].conv_tail = layer.conv_tail.to(model_->device());
    }
    *rows = std::move(state.latent_rows);
    return Status::Ok();
  }

  // Serialises every public method (engine.h: Step holds it for the whole step). The lambdas
  // that run under it (Guarded's, the model's load_past) say so with AssertHeld: the analysis
  // does not carry a lock into a lambda.
  Mutex mutex_;
  EngineOptions options_;
  std::shared_ptr<const Model> model_ GUARDED_BY(mutex_);  // replaced by SwapWeights
  uint64_t version_ GUARDED_BY(mutex_);
  const ModelConfig config_;
  const uint64_t fingerprint_;
  std::vector<char> kinds_;
  std::vector<int64_t> latent_index_;  // per model layer: index among latent layers, or -1
  int64_t latent_layers_ = 0;
  int64_t sparse_layers_ = 0;
  PagedCache cache_ GUARDED_BY(mutex_);
  // Ordered: steps run by id.
  std::map<SequenceId, std::unique_ptr<Sequence>> sequences_ GUARDED_BY(mutex_);
  std::deque<SequenceId> queue_ GUARDED_BY(mutex_);
  SequenceId next_id_ GUARDED_BY(mutex_) = 1;
};

}  // namespace

Result<CompactRouting> CompactRouting::Concatenate(const std::vector<CompactRouting>& parts) {
  CompactRouting joined;
  if (parts.empty()) return joined;
  joined = parts.front();
  for (size_t i = 1; i < parts.size(); ++i) {
    const CompactRouting& part = parts[i];
    if (part.tokens == 0) continue;
    if (joined.tokens == 0) {
      joined = part;
      continue;
    }
    if (part.layers != joined.layers || part.experts_per_token != joined.experts_per_token) {
      return Status::InvalidArgument("routing records of different shapes");
    }
    if (part.first_position != joined.first_position + joined.tokens) {
      return Status::InvalidArgument("routing record starting at " +
                                     std::to_string(part.first_position) + " does not follow " +
                                     std::to_string(joined.first_position + joined.tokens));
    }
    joined.experts.insert(joined.experts.end(), part.experts.begin(), part.experts.end());
    joined.tokens += part.tokens;
  }
  return joined;
}

RoutingRecord CompactRouting::ToRoutingRecord() const {
  RoutingRecord record;
  std::vector<int64_t> widened(experts.begin(), experts.end());
  at::Tensor all = at::tensor(widened, at::kLong).view({tokens, layers, experts_per_token});
  for (int64_t layer = 0; layer < layers; ++layer) {
    RoutingRecord::Layer entry;
    entry.experts = all.select(1, layer).contiguous().unsqueeze(0);  // (1, T, k)
    record.layers.push_back(std::move(entry));
  }
  return record;
}

Status FillForBenchmark(Engine* engine, SequenceId id, int64_t tokens, uint64_t seed) {
  // Every Engine that Engine::Create returns is an EngineImpl.
  EngineImpl* impl = dynamic_cast<EngineImpl*>(engine);
  if (impl == nullptr) {
    return Status::InvalidArgument("fill for benchmark: not an engine from Engine::Create");
  }
  return impl->FillForBenchmark(id, tokens, seed);
}

double SequenceBytesFormula(const ModelConfig& config, int64_t tokens, int64_t block_tokens) {
  const CacheAccounting accounting = AccountCaches(config);
  const int64_t rounded = (tokens + block_tokens - 1) / block_tokens * block_tokens;
  return static_cast<double>(accounting.state_bytes_per_sequence) +
         static_cast<double>(accounting.kv_cache_bytes_per_token) * static_cast<double>(rounded);
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options,
                                               std::shared_ptr<const Model> model,
                                               uint64_t policy_version) {
  if (model == nullptr) return Status::InvalidArgument("engine: no model");
  if (options.block_tokens < 1) {
    return Status::InvalidArgument("engine: block_tokens must be >= 1");
  }
  if (options.prefill_tokens_per_step < 0) {
    return Status::InvalidArgument("engine: prefill_tokens_per_step must be >= 0 (0: no limit)");
  }
  if (options.max_batch < 1 || options.prefill_chunk_tokens < 1 || options.max_sequences < 1) {
    return Status::InvalidArgument(
        "engine: max_batch, prefill_chunk_tokens and max_sequences must be >= 1");
  }
  if (options.cache_budget_bytes < 0) {
    return Status::InvalidArgument("engine: negative cache budget");
  }
  const ModelConfig& config = model->config();
  for (int64_t id : options.never_sampled) {
    if (id < 0 || id >= config.vocabulary) {
      return Status::InvalidArgument("engine: never-sampled id " + std::to_string(id) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(config.vocabulary) + ")");
    }
  }
  PagedCacheOptions cache;
  cache.block_tokens = options.block_tokens;
  cache.latent_layers = config.CountLayers('G');
  cache.row_width = config.latent.kv_rank + config.latent.rope_dim;
  cache.dtype = model->dtype() == at::kDouble
                    ? at::kDouble
                    : (config.cache_dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
  const int64_t block_bytes = cache.latent_layers * cache.block_tokens * cache.row_width *
                              static_cast<int64_t>(c10::elementSize(cache.dtype));
  cache.max_blocks = block_bytes > 0 ? options.cache_budget_bytes / block_bytes : 0;
  cache.device = model->device();
  ConfigureRuntime(options.threads);
  return std::unique_ptr<Engine>(new EngineImpl(options, std::move(model), policy_version, cache));
}

}  // namespace strider::rollout
