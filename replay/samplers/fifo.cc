// fifo: the oldest items after the caller's read position, in insertion order. Each learner
// keeps its own position (durable in the store), so every learner sees every item once.
#include <set>

#include "replay/samplers/samplers.h"

namespace strider::replay {
namespace {

class FifoSampler : public Sampler {
 public:
  explicit FifoSampler(SamplerOptions options) : options_(options) {}

  void Insert(uint64_t item, double) override { items_.insert(items_.end(), item); }
  void Remove(uint64_t item) override { items_.erase(item); }
  Status SetPriority(uint64_t, double) override {
    return Status::InvalidArgument("the fifo sampler has no priorities");
  }
  std::vector<uint64_t> Sample(size_t count, uint64_t after, std::mt19937_64&,
                               const std::function<bool(uint64_t)>& eligible) override {
    std::vector<uint64_t> chosen;
    for (auto it = items_.upper_bound(after); it != items_.end() && chosen.size() < count; ++it) {
      if (eligible(*it)) chosen.push_back(*it);
    }
    return chosen;
  }
  size_t size() const override { return items_.size(); }
  bool Contains(uint64_t item) const override { return items_.count(item) != 0; }
  SamplerOptions options() const override { return options_; }

 private:
  SamplerOptions options_;
  std::set<uint64_t> items_;
};

}  // namespace

std::unique_ptr<Sampler> MakeFifoSampler(const SamplerOptions& options) {
  return std::make_unique<FifoSampler>(options);
}

}  // namespace strider::replay
