// The rollout engine: the model's inference path for actors (docs/design.md#two-paths-one-model).
//
// An actor submits sequences (a prompt, or a prompt plus the sampling of a model turn), calls
// Step() to advance every live sequence, appends tool results or observations to a sequence
// whose turn ended, forks a sequence into a group that shares its prefix, and snapshots a
// sequence to bytes to resume it elsewhere.
//
//   Submit / Append ──> [queued] ──admit──> [prefill] ──> [generating] ──stop──> [idle]
//                       (budget)            chunked        one token a Step       │
//                                                                                 ├─ Append ─> prefill
//                                                                                 └─ Release / Cancel
//
// Per sequence the engine keeps the incremental-attention states and convolution tails
// (constant size), the latent-attention rows in a paged cache shared by all sequences (fixed-size
// blocks, copy-on-write on fork), the distribution for the next token, and the random stream.
// Nothing else grows with the sequence: routing records and samples are handed to the caller in
// each StepResult, not kept.
//
// Contracts:
//   - Exactness: token log-probabilities equal the model's training path on the same tokens
//     (fp32: 1e-5), whatever the batch, chunking, forks or snapshots a sequence went through.
//   - Determinism: a sequence's samples depend only on its tokens, its sampling parameters and
//     seed; not on which other sequences share its steps. (Matrix products of a batch can
//     differ from those of a single row in the last bits; a sample could differ only where the
//     uniform draw falls within that rounding of a boundary between two tokens.)
//   - Memory: the pool of latent blocks never exceeds EngineOptions::cache_budget_bytes. A
//     request that would exceed it is refused (ResourceExhausted) or queued, by policy, and
//     never disturbs running sequences: each admitted sequence's blocks are reserved up to its
//     longest possible length (prompt + appended + max_new_tokens).
//   - Errors are values; LibTorch exceptions never leave the engine.
//   - Thread safety: every method may be called from any thread. One mutex serialises them;
//     Step() holds it for the whole step, so a Submit from another thread waits for the step.
//
// Benchmark-only entry points (FillForBenchmark) are in engine_testing.h, not on Engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "common/status.h"
#include "rollout_engine/sampling.h"

namespace strider::rollout {

using SequenceId = uint64_t;

enum class AdmissionPolicy {
  kRefuse,  // a request that does not fit the budget now fails with ResourceExhausted
  kQueue,   // it waits, in arrival order, until finished sequences free enough blocks
};

struct EngineOptions {
  // --- Memory ---
  // Bytes of the latent-block pool (all latent layers of all sequences). Blocks are allocated
  // on first use, so resident memory follows use, up to this.
  int64_t cache_budget_bytes = int64_t{1} << 30;
  int64_t block_tokens = 256;      // tokens per block
  int64_t max_sequences = 4096;    // live sequences (each holds constant-size recurrent state)
  AdmissionPolicy admission = AdmissionPolicy::kRefuse;

  // --- Performance ---
  int64_t max_batch = 64;               // decode rows per model call
  int64_t prefill_chunk_tokens = 4096;  // appended tokens per model call, at most
  // Appended tokens one Step feeds a sequence, at most (whole chunks; 0: all it has pending).
  // A long run (a part of a million-token document) then spans several steps: each returns the
  // routing of what it fed, so a caller cuts and ships segments as the prefill goes instead of
  // holding the whole run's records at the end, and other sequences decode in between.
  int64_t prefill_tokens_per_step = 0;
  int64_t threads = 0;                  // LibTorch intra-op threads (0: all cores)

  // --- Records ---
  bool record_routing = true;  // return the experts of every fed token in each StepResult

  // --- Text ---
  // The bytes a token stands for, for stop strings: they are matched on the turn's bytes as the
  // tokens arrive, which for UTF-8 stop strings is matching on its decoded text however a
  // character or a stop string is split across tokens. Unset: ids below 256 are bytes and other
  // ids stand for none (the byte tokenizer).
  std::function<std::string(int64_t)> token_bytes;
  // The ids no turn samples: the byte format's image-patch placeholder by default; none for a
  // model with its own tokenizer, whose vocabulary has an ordinary token there.
  std::vector<int64_t> never_sampled = model::ByteFormatNeverSampled();
};

// The experts chosen for a run of consecutive tokens of one sequence, compact (uint16 ids).
struct CompactRouting {
  int64_t first_position = 0;     // position of the first token covered
  int64_t tokens = 0;
  int64_t layers = 0;             // sparse layers
  int64_t experts_per_token = 0;  // k
  std::vector<uint16_t> experts;  // [token][layer][k]

  // Joins records of consecutive runs (each must start where the previous one ended).
  static Result<CompactRouting> Concatenate(const std::vector<CompactRouting>& parts);
  // The record as Model::Forward replays it: one row (B = 1), T = tokens.
  RoutingRecord ToRoutingRecord() const;
};

enum class FinishReason { kNone, kStopToken, kStopString, kMaxTokens };

// What one Step did for one sequence.
struct SequenceStep {
  SequenceId id = 0;
  bool sampled = false;        // a token was sampled this step (fields below are set)
  int64_t token = -1;
  int64_t position = -1;       // its position in the sequence
  double log_prob = 0;         // under the sampling distribution
  double model_log_prob = 0;   // under the model's distribution (temperature 1, no cut)
  double entropy = 0;          // of the sampling distribution
  uint64_t policy_version = 0; // the weights that produced the token's distribution
  FinishReason finish = FinishReason::kNone;  // the turn ended with this token
  bool released = false;       // the sequence was released on finish (Request option)
  CompactRouting routing;      // experts of the tokens fed this step (prefill and the sample)
};

struct StepResult {
  std::vector<SequenceStep> sequences;  // every sequence the step touched, by id
  uint64_t policy_version = 0;          // the weights in force for this step
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
};

// Tokens to add to a sequence and what to do after them.
struct Request {
  std::vector<int64_t> tokens;            // the prompt, or an appended turn (may be empty on Append)
  std::optional<SamplingParams> sampling; // generate a turn after the tokens; none: stay idle
  bool release_on_finish = false;         // free the sequence when its turn ends
  // Images of this request in stream order, each (H, W, C) floating point in [0, 1]; their
  // patches fill the token::kImagePatch placeholders of `tokens` (counts must match). A request
  // with images is fed in one model call, so no image is split across calls.
  std::vector<at::Tensor> images;
};

enum class SequenceStatus { kQueued, kPrefill, kGenerating, kIdle };

struct SequenceInfo {
  SequenceStatus status = SequenceStatus::kIdle;
  int64_t length = 0;          // tokens fed to the model
  int64_t pending_tokens = 0;  // tokens waiting to be fed
  int64_t generated = 0;       // tokens sampled in the current turn
  int64_t blocks = 0;          // latent blocks in its table
};

struct EngineStats {
  int64_t live_sequences = 0;
  int64_t queued_requests = 0;
  int64_t used_blocks = 0;       // referenced by some sequence
  int64_t reserved_blocks = 0;   // promised to admitted sequences' future growth
  int64_t capacity_blocks = 0;
  int64_t block_bytes = 0;
  int64_t allocated_blocks = 0;  // storage that exists (high-water mark)
};

class Engine {
 public:
  // The model is shared with the caller and never modified by the engine.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options,
                                                std::shared_ptr<const Model> model,
                                                uint64_t policy_version = 0);
  virtual ~Engine() = default;

  // A new sequence. Its tokens are fed at the next Step, then a turn is generated when
  // request.sampling is set. Errors: InvalidArgument (empty prompt, token outside the
  // vocabulary, bad sampling parameters), OutOfRange (longer than model.context),
  // ResourceExhausted (over budget with kRefuse, or larger than the whole budget).
  virtual Result<SequenceId> Submit(const Request& request) = 0;
  // Appends tokens to an idle sequence (a tool result, an observation) without recomputing
  // its history; then generates when request.sampling is set. NotFound for an unknown id,
  // FailedPrecondition when the sequence is not idle; otherwise as Submit.
  virtual Status Append(SequenceId id, const Request& request) = 0;
  // Feeds pending tokens of admitted sequences (chunked prefill), then samples one token for
  // every generating sequence and feeds the sampled tokens as one ragged batch.
  virtual Result<StepResult> Step() = 0;
  // Ends a sequence in any state and frees its blocks. NotFound for an unknown id.
  virtual Status Cancel(SequenceId id) = 0;
  // Frees an idle sequence (its turn ended). NotFound, or FailedPrecondition when not idle.
  virtual Status Release(SequenceId id) = 0;
  // `count` new sequences sharing every token of `id` (copy-on-write blocks), each generating a
  // turn with `sampling` and seed DeriveSeed(sampling.seed, i) (or idle when sampling is unset).
  // The source must be idle or generating with nothing pending. The group shares the source's
  // next-token distribution, as group-baseline advantage estimation needs.
  virtual Result<std::vector<SequenceId>> Fork(SequenceId id, int64_t count,
                                               const std::optional<SamplingParams>& sampling) = 0;
  // The whole state of a sequence (idle or generating, nothing pending) as bytes: see
  // docs/rollout_engine.md for the format. Restore recreates it as a new sequence that
  // continues exactly as the original would; it rejects bytes of another model config, a
  // different format version, or corrupt or truncated data (Corruption, naming the problem).
  virtual Result<std::string> Snapshot(SequenceId id) = 0;
  virtual Result<SequenceId> Restore(const std::string& bytes) = 0;
  // A 64-bit digest of the sequence's inference state (length, recurrent states, conv tails,
  // latent rows): equal states give equal digests. Stored in snapshots and checked on restore.
  virtual Result<uint64_t> StateDigest(SequenceId id) = 0;
  // New weights for the next Step; live sequences keep their states. The model must have the
  // same config shapes (FailedPrecondition otherwise). Tokens report the version in force.
  virtual Status SwapWeights(std::shared_ptr<const Model> model, uint64_t policy_version) = 0;

  virtual Result<SequenceInfo> Info(SequenceId id) = 0;
  virtual EngineStats Stats() = 0;
  virtual uint64_t policy_version() = 0;
};

// Peak resident bytes the engine's per-sequence data needs for one sequence of `tokens`
// tokens: the state and cache formula of `strider model info` (AccountCaches), with the
// latent cache rounded up to whole blocks.
double SequenceBytesFormula(const ModelConfig& config, int64_t tokens, int64_t block_tokens);

}  // namespace strider::rollout
