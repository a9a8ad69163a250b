// uniform: every eligible item equally likely; distinct items within one sample.
//
// Items live in a dense vector with a position map so insert, remove (swap with the last) and a
// uniform draw are O(1).
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "replay/samplers/samplers.h"

namespace strider::replay {
namespace {

class UniformSampler : public Sampler {
 public:
  explicit UniformSampler(SamplerOptions options) : options_(options) {}

  void Insert(uint64_t item, double) override {
    position_[item] = items_.size();
    items_.push_back(item);
  }
  void Remove(uint64_t item) override {
    auto it = position_.find(item);
    if (it == position_.end()) return;
    const size_t at = it->second;
    position_.erase(it);
    if (at + 1 != items_.size()) {
      items_[at] = items_.back();
      position_[items_[at]] = at;
    }
    items_.pop_back();
  }
  Status SetPriority(uint64_t, double) override {
    return Status::InvalidArgument("the uniform sampler has no priorities");
  }
  std::vector<uint64_t> Sample(size_t count, uint64_t, std::mt19937_64& rng,
                               const std::function<bool(uint64_t)>& eligible) override {
    std::vector<uint64_t> chosen;
    if (items_.empty()) return chosen;
    count = std::min(count, items_.size());
    std::unordered_set<uint64_t> seen;
    // Rejection draws are cheap while most items are eligible; when they are not, fall back to
    // a shuffle of the eligible ones so the result stays uniform and the loop bounded.
    size_t attempts = 4 * count + 16;
    std::uniform_int_distribution<size_t> pick(0, items_.size() - 1);
    while (chosen.size() < count && attempts-- > 0) {
      const uint64_t item = items_[pick(rng)];
      if (seen.insert(item).second && eligible(item)) chosen.push_back(item);
    }
    if (chosen.size() < count) {
      std::vector<uint64_t> rest;
      for (uint64_t item : items_) {
        if (!seen.count(item) && eligible(item)) rest.push_back(item);
      }
      std::shuffle(rest.begin(), rest.end(), rng);
      for (size_t i = 0; i < rest.size() && chosen.size() < count; ++i) chosen.push_back(rest[i]);
    }
    return chosen;
  }
  size_t size() const override { return items_.size(); }
  bool Contains(uint64_t item) const override { return position_.count(item) != 0; }
  SamplerOptions options() const override { return options_; }

 private:
  SamplerOptions options_;
  std::vector<uint64_t> items_;
  std::unordered_map<uint64_t, size_t> position_;
};

}  // namespace

std::unique_ptr<Sampler> MakeUniformSampler(const SamplerOptions& options) {
  return std::make_unique<UniformSampler>(options);
}

}  // namespace strider::replay
