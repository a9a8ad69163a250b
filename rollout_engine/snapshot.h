// The sequence snapshot format (docs/rollout_engine.md, "Snapshot format"), internal to
// rollout_engine/: Engine::Snapshot and Engine::Restore move a sequence between engines with it.
//
// A snapshot is the sequence's bookkeeping (SnapshotRecord) around its inference state, which is
// encoded on its own (SequenceState) because StateDigest hashes exactly those bytes. Decoding
// makes every check that needs no engine: magic, checksum, version, model config, lengths,
// sampling parameters, state digest, dtypes and shapes. What remains for the engine is its own
// limits (sequences, cache budget).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/model/config.h"
#include "common/model/incremental_attention.h"
#include "common/status.h"
#include "rollout_engine/sampling.h"

namespace strider::rollout {

inline constexpr uint32_t kSnapshotVersion = 1;

// A 64-bit hash over bytes, eight at a time (FNV-style multiply, final avalanche). Used for the
// state digest and the snapshot checksum; not cryptographic.
class Hasher {
 public:
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  uint64_t state_ = 0xcbf29ce484222325ull;
  uint64_t total_ = 0;
};

// Hashes bytes given in pieces exactly as Hasher hashes them given in one Update: Hasher takes
// eight-byte words from the start of each call, so pieces of other lengths would change it.
// What the state digest streams through, piece by piece, instead of encoding the state first.
class StreamingHasher {
 public:
  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  Hasher words_;              // every complete eight-byte word so far
  unsigned char carry_[8]{};  // the bytes after them
  size_t carried_ = 0;
};

// Hash of every parameter name and shape and the cache dtype: a snapshot restores, and new
// weights swap in, only where it is equal.
uint64_t ConfigFingerprint(const ModelConfig& config);

// A sequence's inference state in snapshot order.
struct SequenceState {
  int64_t length = 0;  // tokens fed
  // One per incremental ('I') layer, in layer order: recurrent (1, H, d_k, d_v) and conv tail
  // (1, conv_width - 1, H (2 d_k + d_v)).
  std::vector<model::IncrementalAttentionState> incremental;
  std::vector<at::Tensor> latent_rows;  // one per latent ('G') layer: (length, d_c + d_rope)
};

// The tensors must be on the CPU; LibTorch errors are thrown (call it under model::Guarded).
std::string EncodeState(const SequenceState& state);

// EncodeState's bytes handed to `sink` in order, each latent layer's rows given as consecutive
// pieces ((n_i, d_c + d_rope), the n_i summing to `length`: the paged cache's blocks; at least
// one, an empty (0, d_c + d_rope) piece when there are no rows), so that
// neither a gathered copy of the rows nor the whole encoding has to exist. The state digest of
// a million-token `tiny` sequence would otherwise hold both at once, 100 MB each.
using ByteSink = std::function<void(const void* data, size_t size)>;
void WriteState(int64_t length, const std::vector<model::IncrementalAttentionState>& incremental,
                const std::vector<std::vector<at::Tensor>>& latent_pieces, const ByteSink& sink);

// The bytes `write` hands its sink, in one string allocated once at their total size (`write`
// runs twice: to count, then to copy).
std::string CollectBytes(const std::function<void(const ByteSink&)>& write);

// Reads EncodeState's bytes for `config`: recurrent states in float64 for a float64 model and
// float32 otherwise, conv tails in `model_dtype`, latent rows in `cache_dtype`. Corruption naming
// the problem for a bad length, dtype, rank, shape, truncation or trailing bytes. Allocates with
// LibTorch (call it under model::Guarded).
Result<SequenceState> DecodeState(const std::string& bytes, const ModelConfig& config,
                                  at::ScalarType model_dtype, at::ScalarType cache_dtype);

// Everything a snapshot holds besides the state's own encoding.
struct SnapshotRecord {
  std::string config_name;
  uint64_t fingerprint = 0;            // ConfigFingerprint of the writer's config
  bool generating = false;             // mid-turn; otherwise idle
  uint64_t logits_version = 0;         // policy version of next_logits
  std::optional<SamplingParams> turn;  // the turn being generated, if any
  bool release_on_finish = false;
  uint64_t counter = 0;            // draws taken from the random stream this turn
  int64_t generated = 0;           // tokens sampled this turn
  std::string turn_text;           // tail of the turn's bytes, for stop strings
  std::vector<float> next_logits;  // empty, or one per vocabulary entry
  std::string state;               // EncodeState's bytes
};

std::string EncodeSnapshot(const SnapshotRecord& record);

// Reads a snapshot for an engine of `config` (whose ConfigFingerprint is `fingerprint`).
// Corruption for bytes that are not a snapshot, fail the checksum or the state digest, are of
// another format version, truncated, or inconsistent (a logit count other than the vocabulary, a
// generating sequence without a turn); FailedPrecondition for a snapshot of another model
// config; the sampling parameters are validated as a request's. The state is returned as bytes,
// not decoded.
Result<SnapshotRecord> DecodeSnapshot(const std::string& bytes, const ModelConfig& config,
                                      uint64_t fingerprint);

}  // namespace strider::rollout
