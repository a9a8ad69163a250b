// The paged latent cache: the compressed keys of latent-attention layers (c_kv and the shared
// key part, docs/model_math.md#latent-attention) for every live sequence, in fixed-size blocks from
// one pool.
//
// Why paged: sequences grow by different amounts and are forked into groups that share a
// prefix. A contiguous buffer per sequence would copy on growth and on fork; blocks let a fork
// share every block of its parent (reference counts) and copy only the partially filled last
// block when one of them writes to it (copy-on-write). The pool has a hard capacity (the memory
// budget); running out is an error the caller sees before anything is changed.
//
//   pool:   [blk 0][blk 1][blk 2][blk 3] ...       each block: (latent layers, block_tokens, W)
//   seq A:  table {0, 1, 3}  length 700            W = d_c + d_rope
//   seq B:  table {0, 1, 2}  length 600  (forked from A at 512: blocks 0, 1 shared, refcount 2)
//
// Block storage is allocated on first use and kept for reuse after release, so resident memory
// follows the high-water mark of blocks in use, never more than the capacity. Blocks are carved
// from slabs mapped directly from the kernel (a few MiB each, pages resident once written), not
// from the malloc heap: blocks allocated between a call's temporaries would otherwise pin heap
// pages and resident memory would grow by fragmentation as a sequence gets longer. On a GPU the
// slabs come from LibTorch's caching allocator on that device; the tables stay on the host, where
// the engine decides what a step reads.
//
// Not thread-safe: the engine calls it under its own mutex.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace strider::rollout {

struct PagedCacheOptions {
  int64_t block_tokens = 256;  // tokens per block
  int64_t max_blocks = 1024;   // pool capacity: the memory budget divided by BlockBytes()
  int64_t latent_layers = 1;   // latent-attention layers of the model (0: nothing is stored)
  int64_t row_width = 24;      // d_c + d_rope values per token per layer
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;  // where the blocks live: the model's device
};

using BlockId = int32_t;

// One sequence's view of the pool: its blocks in position order and its length in tokens.
struct BlockTable {
  std::vector<BlockId> blocks;
  int64_t length = 0;
};

class PagedCache {
 public:
  explicit PagedCache(const PagedCacheOptions& options);

  const PagedCacheOptions& options() const { return options_; }
  int64_t BlockBytes() const;
  int64_t used_blocks() const { return used_; }  // blocks referenced by some table
  int64_t free_blocks() const { return options_.max_blocks - used_; }
  // Blocks whose storage exists (in use or kept for reuse): resident memory / BlockBytes().
  int64_t allocated_blocks() const { return static_cast<int64_t>(storage_.size()); }
  int32_t RefCount(BlockId block) const { return refcount_[block]; }

  // Blocks that appending `count` tokens to `table` allocates: new blocks, plus one when the
  // partially filled last block is shared and must be copied first.
  int64_t BlocksToAppend(const BlockTable& table, int64_t count) const;

  // Writes `rows[l]` ((T, W) for latent layer l) at positions table->length.. and advances the
  // length. Allocates as needed, copying a shared last block before writing into it. Fails
  // with ResourceExhausted, changing nothing, when the pool has too few free blocks.
  Status Append(BlockTable* table, const std::vector<at::Tensor>& rows);

  // A table sharing every block of `table` (copy-on-write fork).
  BlockTable Fork(const BlockTable& table);

  // Drops the table's references; blocks nobody references return to the free list.
  void Release(BlockTable* table);

  // Latent layer `layer` of the table's tokens as views of its blocks, in position order: one
  // (n, W) tensor per block, n = block_tokens except for a partially filled last block. Valid
  // until the table's blocks change; nothing is copied.
  std::vector<at::Tensor> Pages(const BlockTable& table, int64_t layer) const;

  // Latent layer `layer` of every table, gathered into (B, padded_length, W) with zero padding
  // after each table's length (padded_length >= every length).
  at::Tensor Gather(const std::vector<const BlockTable*>& tables, int64_t layer,
                    int64_t padded_length) const;

 private:
  BlockId Allocate();  // caller has checked free_blocks()
  at::Tensor MapSlab(int64_t blocks) const;
  void Unref(BlockId block);

  PagedCacheOptions options_;
  std::vector<at::Tensor> slabs_;    // (blocks, latent_layers, block_tokens, W) each
  int64_t slab_next_ = 0;            // next unused block of the last slab
  std::vector<at::Tensor> storage_;  // per block: (latent_layers, block_tokens, W), slab views
  std::vector<int32_t> refcount_;
  std::vector<BlockId> free_;        // allocated storage not referenced by any table
  int64_t used_ = 0;
};

}  // namespace strider::rollout
