// The tensor pool (common/model/tensor_pool.h) as LibTorch's CPU allocator: a freed size comes
// back as the same pages, small requests stay with malloc, long-lived buffers between a call's
// temporaries do not make the pool grow, and the cache gives back classes no longer used.
#include "common/model/tensor_pool.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <vector>

namespace strider {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

at::Tensor Floats(int64_t bytes) { return at::empty({bytes / 4}, at::kFloat); }

class TensorPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { UseTensorPool(); }
};

TEST_F(TensorPoolTest, AFreedSizeComesBackAsTheSamePages) {
  const TensorPoolStats before = GetTensorPoolStats();
  const void* first;
  {
    at::Tensor t = Floats(4 * kMiB);
    t.fill_(1.5f);
    first = t.data_ptr();
    EXPECT_EQ(t.sum().item<float>(), 1.5f * kMiB);
  }
  for (int i = 0; i < 10; ++i) {
    at::Tensor t = Floats(4 * kMiB);
    EXPECT_EQ(t.data_ptr(), first) << "round " << i;
  }
  const TensorPoolStats after = GetTensorPoolStats();
  EXPECT_LE(after.mapped_bytes - before.mapped_bytes, 4 * kMiB);
  EXPECT_GE(after.hits - before.hits, 10);

  // A smaller request takes a cached buffer up to twice its size.
  {
    at::Tensor t = Floats(3 * kMiB);
    EXPECT_EQ(t.data_ptr(), first);
  }
  // A request a quarter-class larger is a class of its own.
  {
    at::Tensor t = Floats(5 * kMiB);
    EXPECT_NE(t.data_ptr(), first);
  }

  // The cache's resident part: a 6.5 MiB tensor takes a 7 MiB buffer and writes 6.5 of it.
  const TensorPoolStats empty = GetTensorPoolStats();
  {
    at::Tensor t = Floats(6 * kMiB + kMiB / 2);
    t.fill_(0.0f);
  }
  const TensorPoolStats cached = GetTensorPoolStats();
  EXPECT_EQ(cached.cached_bytes - empty.cached_bytes, 7 * kMiB);
  EXPECT_EQ(cached.cached_written_bytes - empty.cached_written_bytes, 6 * kMiB + kMiB / 2);
}

TEST_F(TensorPoolTest, SmallRequestsStayWithMalloc) {
  const TensorPoolStats before = GetTensorPoolStats();
  std::vector<at::Tensor> small;
  for (int i = 0; i < 100; ++i) small.push_back(Floats(64 << 10));
  const TensorPoolStats after = GetTensorPoolStats();
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.hits + after.misses, before.hits + before.misses);
}

TEST_F(TensorPoolTest, RawAllocationsUseTheSameDeleter) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const TensorPoolStats before = GetTensorPoolStats();
  void* big = allocator->raw_allocate(2 * kMiB);
  void* small = allocator->raw_allocate(100);
  // Its class, or a cached buffer up to twice that.
  EXPECT_GE(GetTensorPoolStats().in_use_bytes - before.in_use_bytes, 2 * kMiB);
  EXPECT_LE(GetTensorPoolStats().in_use_bytes - before.in_use_bytes, 4 * kMiB);
  allocator->raw_deallocate(big);
  allocator->raw_deallocate(small);
  EXPECT_EQ(GetTensorPoolStats().in_use_bytes, before.in_use_bytes);
}

// What made resident memory grow with a sequence's length in the malloc heap: every call's
// large temporaries freed, then long-lived buffers allocated before the next call.
TEST_F(TensorPoolTest, LongLivedBuffersBetweenCallsDoNotGrowIt) {
  std::vector<at::Tensor> kept;
  int64_t mapped_after_first = 0;
  for (int call = 0; call < 100; ++call) {
    {
      at::Tensor a = Floats(24 * kMiB);
      at::Tensor b = Floats(6 * kMiB);
      a.fill_(1.0f);
      b.fill_(2.0f);
    }
    kept.push_back(Floats(300 << 10));  // a class of 320 KiB
    if (call == 0) mapped_after_first = GetTensorPoolStats().mapped_bytes;
  }
  const TensorPoolStats stats = GetTensorPoolStats();
  EXPECT_LE(stats.mapped_bytes, mapped_after_first + 99 * (320 << 10))
      << "only the kept buffers may add to what is mapped";
}

TEST_F(TensorPoolTest, TheCacheGivesBackClassesNoLongerUsed) {
  const TensorPoolStats before = GetTensorPoolStats();
  // Growing sizes, each freed at once: without a bound the cache would keep them all (288 MiB).
  for (int64_t mib = 8; mib <= 64; mib += 8) Floats(mib * kMiB).fill_(0.0f);
  for (int64_t mib = 8; mib <= 64; mib += 8) Floats(mib * kMiB).fill_(0.0f);
  const TensorPoolStats after = GetTensorPoolStats();
  EXPECT_GT(after.unmapped_bytes, before.unmapped_bytes);
  EXPECT_LE(after.cached_bytes, std::max<int64_t>(after.peak_in_use_bytes, 64 * kMiB) + 64 * kMiB);
}

// What the chunked pass does before a chunk that records after chunks that did not: the cached
// classes go back to the kernel, live tensors stay, and the next request maps its own class
// instead of taking a cached one twice its size.
TEST_F(TensorPoolTest, TrimGivesBackTheCacheAndKeepsLiveTensors) {
  at::Tensor live = Floats(8 * kMiB).fill_(3.0f);
  Floats(16 * kMiB).fill_(1.0f);
  ASSERT_GE(GetTensorPoolStats().cached_bytes, 16 * kMiB);
  const TensorPoolStats before = GetTensorPoolStats();
  TrimTensorPool();
  const TensorPoolStats after = GetTensorPoolStats();
  EXPECT_EQ(after.cached_bytes, 0);
  EXPECT_EQ(after.cached_written_bytes, 0);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes - before.cached_bytes);
  EXPECT_EQ(after.unmapped_bytes - before.unmapped_bytes, before.cached_bytes);
  EXPECT_EQ(live.sum().item<float>(), 3.0f * 2 * kMiB);
  // 9 MiB would have taken the cached 16 MiB buffer; now it maps a class of its own.
  at::Tensor next = Floats(9 * kMiB);
  EXPECT_EQ(GetTensorPoolStats().in_use_bytes - after.in_use_bytes, 10 * kMiB);
}

TEST_F(TensorPoolTest, TheWindowPeakIsTheMostLiveSinceItsReset) {
  at::Tensor kept = Floats(4 * kMiB);
  { at::Tensor big = Floats(32 * kMiB); }
  ResetTensorPoolWindow();
  const TensorPoolStats start = GetTensorPoolStats();
  EXPECT_EQ(start.window_peak_in_use_bytes, start.in_use_bytes);
  {
    at::Tensor a = Floats(6 * kMiB);
    at::Tensor b = Floats(2 * kMiB);
  }
  { at::Tensor c = Floats(4 * kMiB); }
  const TensorPoolStats end = GetTensorPoolStats();
  // a and b at once, in their classes or cached buffers up to twice their size.
  EXPECT_GE(end.window_peak_in_use_bytes - start.in_use_bytes, 8 * kMiB);
  EXPECT_LE(end.window_peak_in_use_bytes - start.in_use_bytes, 16 * kMiB);
  EXPECT_GE(end.peak_in_use_bytes, start.in_use_bytes + 32 * kMiB - 4 * kMiB);
}

}  // namespace
}  // namespace strider
