#include "rollout_engine/paged_cache.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <algorithm>
#include <string>

namespace strider::rollout {

namespace {

constexpr int64_t kSlabBytes = int64_t{4} << 20;

}  // namespace

PagedCache::PagedCache(const PagedCacheOptions& options) : options_(options) {}

at::Tensor PagedCache::MapSlab(int64_t blocks) const {
  const std::vector<int64_t> shape = {blocks, options_.latent_layers, options_.block_tokens,
                                      options_.row_width};
  const at::TensorOptions tensor_options =
      at::TensorOptions().dtype(options_.dtype).device(options_.device);
  if (!options_.device.is_cpu()) return at::empty(shape, tensor_options);
  const size_t bytes = static_cast<size_t>(blocks * BlockBytes());
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return at::empty(shape, tensor_options);  // the heap, then
  return at::from_blob(
      memory, shape, [bytes](void* data) { munmap(data, bytes); }, tensor_options);
}

int64_t PagedCache::BlockBytes() const {
  return options_.latent_layers * options_.block_tokens * options_.row_width *
         static_cast<int64_t>(c10::elementSize(options_.dtype));
}

int64_t PagedCache::BlocksToAppend(const BlockTable& table, int64_t count) const {
  if (count <= 0 || options_.latent_layers == 0) return 0;
  const int64_t block = options_.block_tokens;
  const int64_t have = static_cast<int64_t>(table.blocks.size());
  const int64_t need = (table.length + count + block - 1) / block;
  int64_t blocks = std::max<int64_t>(0, need - have);
  const bool partial = table.length % block != 0;
  if (partial && refcount_[table.blocks.back()] > 1) ++blocks;
  return blocks;
}

BlockId PagedCache::Allocate() {
  BlockId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    if (slabs_.empty() || slab_next_ == slabs_.back().size(0)) {
      const int64_t blocks =
          std::min(std::max<int64_t>(1, kSlabBytes / BlockBytes()),
                   options_.max_blocks - static_cast<int64_t>(storage_.size()));
      slabs_.push_back(MapSlab(blocks));
      slab_next_ = 0;
    }
    id = static_cast<BlockId>(storage_.size());
    storage_.push_back(slabs_.back()[slab_next_++]);
    refcount_.push_back(0);
  }
  refcount_[id] = 1;
  ++used_;
  return id;
}

void PagedCache::Unref(BlockId block) {
  if (--refcount_[block] == 0) {
    free_.push_back(block);
    --used_;
  }
}

Status PagedCache::Append(BlockTable* table, const std::vector<at::Tensor>& rows) {
  if (options_.latent_layers == 0) return Status::Ok();
  if (static_cast<int64_t>(rows.size()) != options_.latent_layers) {
    return Status::InvalidArgument("paged cache append: " + std::to_string(rows.size()) +
                                   " layers of rows for " +
                                   std::to_string(options_.latent_layers) + " latent layers");
  }
  const int64_t count = rows.front().size(0);
  const int64_t needed = BlocksToAppend(*table, count);
  if (needed > free_blocks()) {
    return Status::ResourceExhausted(
        "paged cache: appending " + std::to_string(count) + " tokens needs " +
        std::to_string(needed) + " blocks, " + std::to_string(free_blocks()) + " of " +
        std::to_string(options_.max_blocks) + " are free");
  }
  const int64_t block = options_.block_tokens;
  if (table->length % block != 0 && refcount_[table->blocks.back()] > 1) {
    // Copy-on-write: the partially filled last block is shared with a fork.
    const BlockId shared = table->blocks.back();
    const BlockId copy = Allocate();
    storage_[copy].copy_(storage_[shared]);
    Unref(shared);
    table->blocks.back() = copy;
  }
  int64_t written = 0;
  while (written < count) {
    const int64_t position = table->length + written;
    const int64_t index = position / block;
    const int64_t offset = position % block;
    if (index == static_cast<int64_t>(table->blocks.size())) table->blocks.push_back(Allocate());
    const int64_t n = std::min(block - offset, count - written);
    at::Tensor target = storage_[table->blocks[index]].narrow(1, offset, n);  // (L, n, W)
    for (int64_t layer = 0; layer < options_.latent_layers; ++layer) {
      target.select(0, layer).copy_(rows[layer].narrow(0, written, n));
    }
    written += n;
  }
  table->length += count;
  return Status::Ok();
}

BlockTable PagedCache::Fork(const BlockTable& table) {
  for (BlockId block : table.blocks) ++refcount_[block];
  return table;
}

void PagedCache::Release(BlockTable* table) {
  for (BlockId block : table->blocks) Unref(block);
  table->blocks.clear();
  table->length = 0;
}

std::vector<at::Tensor> PagedCache::Pages(const BlockTable& table, int64_t layer) const {
  std::vector<at::Tensor> pages;
  pages.reserve(table.blocks.size());
  const int64_t block = options_.block_tokens;
  for (size_t i = 0; i < table.blocks.size(); ++i) {
    const int64_t n = std::min<int64_t>(block, table.length - static_cast<int64_t>(i) * block);
    if (n <= 0) break;
    pages.push_back(storage_[table.blocks[i]].select(0, layer).narrow(0, 0, n));
  }
  return pages;
}

at::Tensor PagedCache::Gather(const std::vector<const BlockTable*>& tables, int64_t layer,
                              int64_t padded_length) const {
  const int64_t rows = static_cast<int64_t>(tables.size());
  at::Tensor out = at::zeros({rows, padded_length, options_.row_width},
                             at::TensorOptions().dtype(options_.dtype).device(options_.device));
  const int64_t block = options_.block_tokens;
  for (int64_t b = 0; b < rows; ++b) {
    const BlockTable& table = *tables[b];
    if (table.length == 0) continue;
    std::vector<at::Tensor> parts;
    parts.reserve(table.blocks.size());
    for (size_t i = 0; i < table.blocks.size(); ++i) {
      const int64_t n = std::min<int64_t>(block, table.length - static_cast<int64_t>(i) * block);
      parts.push_back(storage_[table.blocks[i]].select(0, layer).narrow(0, 0, n));
    }
    out.select(0, b).narrow(0, 0, table.length).copy_(at::cat(parts, 0));
  }
  return out;
}

}  // namespace strider::rollout
