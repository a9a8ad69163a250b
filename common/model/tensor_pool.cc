#include "common/model/tensor_pool.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <new>
#include <unordered_map>
#include <vector>

namespace strider {
namespace {

constexpr size_t kPooledBytes = size_t{256} << 10;  // smaller requests stay with malloc
constexpr size_t kPageBytes = 4096;
constexpr size_t kMinCacheBytes = size_t{64} << 20;

size_t PagesOf(size_t bytes) { return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes; }

// Four classes per power of two, in whole pages: at most 25% over the request.
size_t SizeClass(size_t bytes) {
  const size_t top = size_t{1} << (63 - __builtin_clzll(bytes));  // largest power of two <= bytes
  const size_t step = std::max(top / 4, kPageBytes);
  return (bytes + step - 1) / step * step;
}

// As LibTorch's own CPU allocator does: 64-byte alignment for its vector kernels, no buffer for
// an empty tensor.
void* HeapAllocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* data = nullptr;
  if (posix_memalign(&data, 64, bytes) != 0) throw std::bad_alloc();
  return data;
}

// LibTorch 2.x made c10::Allocator::allocate non-const and added copy_data; the pool builds
// against Debian's 1.13 and the CUDA build's 2.11.
#if TORCH_VERSION_MAJOR >= 2
#define STRIDER_ALLOCATE_CONST
#else
#define STRIDER_ALLOCATE_CONST const
#endif

class TensorPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) STRIDER_ALLOCATE_CONST override {
    // Small buffers are freed straight to malloc, without the pool's lock.
    if (bytes < kPooledBytes) {
      void* data = HeapAllocate(bytes);
      return {data, data, &std::free, c10::Device(c10::DeviceType::CPU)};
    }
    void* data = Take(bytes);
    return {data, data, &Delete, c10::Device(c10::DeviceType::CPU)};
  }

  // The context is the data pointer, as with LibTorch's own CPU allocator, so raw_allocate
  // works too; Delete tells the pool's buffers from malloc's.
  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

#if TORCH_VERSION_MAJOR >= 2
  // Plain host memory either way, pooled or from malloc.
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif

  TensorPoolStats Stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void ResetWindow() const {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.window_peak_in_use_bytes = stats_.in_use_bytes;
  }

  void Trim() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, cls] : classes_) Unmap(size, &cls);
  }

  static TensorPool& Instance() {
    static TensorPool* pool = new TensorPool;  // never destroyed: tensors may outlive statics
    return *pool;
  }

 private:
  struct Class {
    std::vector<void*> cached;
    uint64_t last_use = 0;
  };

  static void Delete(void* data) { Instance().Give(data); }

  void* Take(size_t bytes) const {
    const size_t size = SizeClass(bytes);
    std::unique_lock<std::mutex> lock(mutex_);
    ++tick_;
    // The class itself, else the smallest cached class up to twice the size.
    for (auto it = classes_.lower_bound(size); it != classes_.end() && it->first <= 2 * size;
         ++it) {
      if (it->second.cached.empty()) continue;
      void* data = it->second.cached.back();
      it->second.cached.pop_back();
      it->second.last_use = tick_;
      Block& block = blocks_[data];
      stats_.cached_bytes -= static_cast<int64_t>(it->first);
      stats_.cached_written_bytes -= static_cast<int64_t>(block.written);
      block.written = std::max(block.written, PagesOf(bytes));
      stats_.in_use_bytes += static_cast<int64_t>(it->first);
      NotePeaks();
      ++stats_.hits;
      return data;
    }
    ReleaseStale();
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      lock.unlock();
      return HeapAllocate(bytes);  // the heap, then; its pointer is not ours, so Give frees it
    }
    blocks_.emplace(data, Block{size, PagesOf(bytes)});
    classes_[size].last_use = tick_;
    stats_.in_use_bytes += static_cast<int64_t>(size);
    NotePeaks();
    stats_.mapped_bytes += static_cast<int64_t>(size);
    stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, stats_.mapped_bytes);
    ++stats_.misses;
    return data;
  }

  void Give(void* data) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto block = blocks_.find(data);
      if (block != blocks_.end()) {
        classes_[block->second.size].cached.push_back(data);
        stats_.in_use_bytes -= static_cast<int64_t>(block->second.size);
        stats_.cached_bytes += static_cast<int64_t>(block->second.size);
        stats_.cached_written_bytes += static_cast<int64_t>(block->second.written);
        return;
      }
    }
    std::free(data);
  }

  void NotePeaks() const {
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    stats_.window_peak_in_use_bytes =
        std::max(stats_.window_peak_in_use_bytes, stats_.in_use_bytes);
  }

  // Unmaps every cached buffer of one class. Called under the mutex.
  void Unmap(size_t size, Class* cls) const {
    for (void* data : cls->cached) {
      munmap(data, size);
      stats_.cached_written_bytes -= static_cast<int64_t>(blocks_[data].written);
      blocks_.erase(data);
      stats_.cached_bytes -= static_cast<int64_t>(size);
      stats_.mapped_bytes -= static_cast<int64_t>(size);
      stats_.unmapped_bytes += static_cast<int64_t>(size);
    }
    cls->cached.clear();
  }

  // Before mapping new memory: unmap whole classes, the longest unused first, while the cache
  // holds more than the most ever in use at once (or kMinCacheBytes). The peak rather than what
  // is in use now: between two calls almost nothing is, and a new size met then (a shorter last
  // chunk) would otherwise unmap the working set the next call needs. Called under the mutex.
  void ReleaseStale() const {
    const int64_t bound =
        std::max<int64_t>(stats_.peak_in_use_bytes, static_cast<int64_t>(kMinCacheBytes));
    while (stats_.cached_bytes > bound) {
      auto stalest = classes_.end();
      for (auto it = classes_.begin(); it != classes_.end(); ++it) {
        if (!it->second.cached.empty() &&
            (stalest == classes_.end() || it->second.last_use < stalest->second.last_use)) {
          stalest = it;
        }
      }
      if (stalest == classes_.end()) return;
      Unmap(stalest->first, &stalest->second);
    }
  }

  // Mutable: c10::Allocator::allocate is const in LibTorch 1.x.
  mutable std::mutex mutex_;
  struct Block {
    size_t size;     // its class
    size_t written;  // bytes up to the end of the largest tensor it held, in whole pages
  };
  mutable std::unordered_map<void*, Block> blocks_;  // every mapped buffer
  mutable std::map<size_t, Class> classes_;
  mutable uint64_t tick_ = 0;
  mutable TensorPoolStats stats_;
};
#undef STRIDER_ALLOCATE_CONST

std::once_flag installed;
bool in_use = false;

}  // namespace

void UseTensorPool() {
  std::call_once(installed, [] {
    const char* setting = std::getenv("STRIDER_TENSOR_POOL");
    if (setting != nullptr && std::string_view(setting) == "0") return;
    c10::SetCPUAllocator(&TensorPool::Instance(), /*priority=*/1);
    in_use = true;
  });
}

TensorPoolStats GetTensorPoolStats() {
  return in_use ? TensorPool::Instance().Stats() : TensorPoolStats{};
}

void ResetTensorPoolWindow() {
  if (in_use) TensorPool::Instance().ResetWindow();
}

void TrimTensorPool() {
  if (in_use) TensorPool::Instance().Trim();
}

}  // namespace strider
