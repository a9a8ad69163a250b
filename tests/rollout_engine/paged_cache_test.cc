// The paged latent cache: gathering equals the contiguous rows, copy-on-write on fork,
// reference counts, release, and refusal without side effects.
#include "rollout_engine/paged_cache.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace strider::rollout {
namespace {

PagedCacheOptions SmallPool(int64_t max_blocks) {
  PagedCacheOptions options;
  options.block_tokens = 4;
  options.max_blocks = max_blocks;
  options.latent_layers = 2;
  options.row_width = 3;
  return options;
}

std::vector<at::Tensor> Rows(int64_t count, double base) {
  at::Tensor rows = at::arange(count * 3, at::kFloat).view({count, 3}) + base;
  return {rows, rows * -1};
}

TEST(PagedCache, GatherReturnsAppendedRowsAcrossBlocksWithZeroPadding) {
  PagedCache cache(SmallPool(16));
  BlockTable a, b;
  ASSERT_TRUE(cache.Append(&a, Rows(3, 0)).ok());
  ASSERT_TRUE(cache.Append(&a, Rows(7, 100)).ok());
  ASSERT_TRUE(cache.Append(&b, Rows(2, 1000)).ok());
  EXPECT_EQ(a.length, 10);
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(cache.used_blocks(), 4);
  at::Tensor expected = at::cat({Rows(3, 0)[1], Rows(7, 100)[1]}, 0);
  at::Tensor gathered = cache.Gather({&a, &b}, 1, 12);
  ASSERT_EQ(gathered.sizes(), (std::vector<int64_t>{2, 12, 3}));
  EXPECT_TRUE(at::equal(gathered[0].narrow(0, 0, 10), expected));
  EXPECT_TRUE(at::equal(gathered[1].narrow(0, 0, 2), Rows(2, 1000)[1]));
  EXPECT_EQ(gathered[1].narrow(0, 2, 10).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(gathered[0].narrow(0, 10, 2).abs().sum().item<double>(), 0.0);
}

TEST(PagedCache, ForkSharesBlocksAndCopiesTheSharedLastBlockOnWrite) {
  PagedCache cache(SmallPool(16));
  BlockTable parent;
  ASSERT_TRUE(cache.Append(&parent, Rows(6, 0)).ok());  // blocks: full, half
  BlockTable child = cache.Fork(parent);
  EXPECT_EQ(cache.used_blocks(), 2);
  EXPECT_EQ(cache.RefCount(parent.blocks[1]), 2);
  EXPECT_EQ(cache.BlocksToAppend(child, 1), 1);  // the copy of the shared half block
  EXPECT_EQ(cache.BlocksToAppend(child, 3), 2);  // the copy plus one new block
  ASSERT_TRUE(cache.Append(&child, Rows(3, 50)).ok());
  EXPECT_EQ(child.blocks[0], parent.blocks[0]);  // full block still shared
  EXPECT_NE(child.blocks[1], parent.blocks[1]);
  EXPECT_EQ(cache.RefCount(parent.blocks[1]), 1);
  // The parent's rows are untouched; the child sees the prefix plus its own rows.
  EXPECT_TRUE(at::equal(cache.Gather({&parent}, 0, 6)[0], Rows(6, 0)[0]));
  EXPECT_TRUE(at::equal(cache.Gather({&child}, 0, 9)[0],
                        at::cat({Rows(6, 0)[0], Rows(3, 50)[0]}, 0)));
  // The parent now owns its last block alone: writing into it allocates nothing.
  EXPECT_EQ(cache.BlocksToAppend(parent, 2), 0);
}

TEST(PagedCache, ReleaseReturnsBlocksOnlyWhenNobodyReferencesThem) {
  PagedCache cache(SmallPool(8));
  BlockTable parent;
  ASSERT_TRUE(cache.Append(&parent, Rows(8, 0)).ok());
  BlockTable child = cache.Fork(parent);
  cache.Release(&parent);
  EXPECT_EQ(cache.used_blocks(), 2);
  EXPECT_TRUE(at::equal(cache.Gather({&child}, 1, 8)[0], Rows(8, 0)[1]));
  cache.Release(&child);
  EXPECT_EQ(cache.used_blocks(), 0);
  EXPECT_EQ(cache.free_blocks(), 8);
  // Storage is reused, not grown.
  for (int i = 0; i < 100; ++i) {
    BlockTable table;
    ASSERT_TRUE(cache.Append(&table, Rows(5, i)).ok());
    cache.Release(&table);
  }
  EXPECT_EQ(cache.allocated_blocks(), 2);
}

TEST(PagedCache, RefusedAppendChangesNothing) {
  PagedCache cache(SmallPool(3));
  BlockTable a, b;
  ASSERT_TRUE(cache.Append(&a, Rows(9, 0)).ok());  // three blocks: the pool is full
  Status refused = cache.Append(&b, Rows(1, 0));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("0 of 3 are free"), std::string::npos) << refused.message();
  EXPECT_EQ(b.length, 0);
  EXPECT_TRUE(b.blocks.empty());
  Status too_long = cache.Append(&a, Rows(4, 0));
  EXPECT_FALSE(too_long.ok());
  EXPECT_EQ(a.length, 9);
  EXPECT_TRUE(at::equal(cache.Gather({&a}, 0, 9)[0], Rows(9, 0)[0]));
}

}  // namespace
}  // namespace strider::rollout
