// The two samplers that read items in insertion order, one class with a direction:
//   fifo:   the oldest items after the caller's read position, oldest first. Each learner keeps
//           its own position (durable in the store), so every learner sees every item once.
//   newest: the most recently inserted eligible items, newest first (on-policy training that
//           wants the freshest data and tolerates reuse); the read position is not used.
#include <set>
#include <string>

#include "replay/samplers/samplers.h"

namespace strider::replay {
namespace {

class InsertionOrderSampler : public Sampler {
 public:
  InsertionOrderSampler(SamplerOptions options, bool newest_first, std::string name)
      : options_(options), newest_first_(newest_first), name_(std::move(name)) {}

  void Insert(uint64_t item, double) override { items_.insert(items_.end(), item); }
  void Remove(uint64_t item) override { items_.erase(item); }
  Status SetPriority(uint64_t, double) override {
    return Status::InvalidArgument("the " + name_ + " sampler has no priorities");
  }
  std::vector<uint64_t> Sample(size_t count, uint64_t after, std::mt19937_64&,
                               const std::function<bool(uint64_t)>& eligible) override {
    return newest_first_ ? Collect(items_.rbegin(), items_.rend(), count, eligible)
                         : Collect(items_.upper_bound(after), items_.end(), count, eligible);
  }
  size_t size() const override { return items_.size(); }
  bool Contains(uint64_t item) const override { return items_.count(item) != 0; }
  SamplerOptions options() const override { return options_; }

 private:
  template <typename Iterator>
  static std::vector<uint64_t> Collect(Iterator begin, Iterator end, size_t count,
                                       const std::function<bool(uint64_t)>& eligible) {
    std::vector<uint64_t> chosen;
    for (Iterator it = begin; it != end && chosen.size() < count; ++it) {
      if (eligible(*it)) chosen.push_back(*it);
    }
    return chosen;
  }

  SamplerOptions options_;
  bool newest_first_;
  std::string name_;
  std::set<uint64_t> items_;
};

}  // namespace

std::unique_ptr<Sampler> MakeFifoSampler(const SamplerOptions& options) {
  return std::make_unique<InsertionOrderSampler>(options, /*newest_first=*/false, "fifo");
}

std::unique_ptr<Sampler> MakeNewestSampler(const SamplerOptions& options) {
  return std::make_unique<InsertionOrderSampler>(options, /*newest_first=*/true, "newest");
}

}  // namespace strider::replay
