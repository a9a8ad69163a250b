// The pretraining data pipeline between shards and batches: a weighted mixture of shard sets,
// shuffled deterministically by seed, packed into fixed-length sequences.
//
// Order: each draw picks a source with probability proportional to its weight, then that
// source's next document in a per-epoch permutation; both come from one seeded generator, so the
// sequence of documents depends only on (sources, weights, seed).
// Packing respects document boundaries: a document that fits in a sequence is never split; when
// it does not fit in what is left of the current sequence, the rest is padded (token::kPad, or
// the id given to Create) and the document starts the next sequence. Only documents longer than
// a whole sequence are cut, and their pieces continue in the following sequences.
// Resume: the packer's position (sequences produced) is the whole data state; SkipTo replays the
// plan without copying tokens, so a resumed run sees exactly the sequences it would have seen.
//
// No LibTorch here. Not thread-safe: one packer per consumer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/token_ids.h"
#include "learner/pretrain/data/shard.h"

namespace strider::data {

struct DataSource {
  std::string name;  // for messages and metrics: a directory or generator name
  double weight = 1.0;
  std::vector<std::unique_ptr<Shard>> shards;
};

class Packer {
 public:
  // Fails when there are no sources, a weight is not positive, or a source has no documents.
  // `pad` fills the rest of a sequence: in a model's own vocabulary the byte format's padding
  // id is an ordinary token, so its batches mask padding by position (filled()).
  static Result<std::unique_ptr<Packer>> Create(std::vector<DataSource> sources, int64_t length,
                                                uint64_t seed, int32_t pad = token::kPad);

  int64_t length() const { return length_; }
  int64_t position() const { return position_; }  // sequences produced so far

  // The next sequence: `length` tokens, padded.
  std::vector<int32_t> Next();
  // Tokens of documents in the last sequence made; the rest of it is padding.
  int64_t filled() const { return filled_; }
  // Restarts from the beginning and advances to `position` sequences.
  void SkipTo(int64_t position);
  // Documents drawn from each source so far (mixture accounting).
  const std::vector<int64_t>& drawn() const { return drawn_; }

 private:
  struct Source {
    DataSource data;
    std::vector<int64_t> first;  // global index of each shard's first document, plus the total
    std::vector<int64_t> order;  // current epoch's permutation
    int64_t next = 0;
    int64_t epoch = 0;
  };
  Packer() = default;
  void Reset();
  void Draw();                           // sets pending_* to a new document
  void Fill(int32_t* out);               // one sequence; out may be null (skip)
  void Shuffle(Source& source);

  std::vector<Source> sources_;
  double total_weight_ = 0;
  int64_t length_ = 0;
  int32_t pad_ = token::kPad;
  int64_t filled_ = 0;
  uint64_t seed_ = 0;
  uint64_t rng_ = 0;
  int64_t position_ = 0;
  std::vector<int64_t> drawn_;
  bool pending_ = false;
  int32_t pending_source_ = 0;
  const Shard* pending_shard_ = nullptr;
  int64_t pending_document_ = 0;
  int64_t pending_begin_ = 0;
};

}  // namespace strider::data
