// prioritized: P(item) proportional to priority^exponent, learners update priorities.
//
// A sum tree over dense slots: leaves hold weights, inner nodes the sums below, so a draw and an
// update are O(log n). Removing an item moves the last slot into the hole, keeping slots dense.
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "replay/samplers/samplers.h"

namespace strider::replay {
namespace {

class PrioritizedSampler : public Sampler {
 public:
  explicit PrioritizedSampler(SamplerOptions options) : options_(options) {}

  void Insert(uint64_t item, double priority) override {
    if (capacity_ == items_.size()) Grow();
    const size_t slot = items_.size();
    items_.push_back(item);
    slot_[item] = slot;
    SetWeight(slot, Weight(priority));
  }
  void Remove(uint64_t item) override {
    auto it = slot_.find(item);
    if (it == slot_.end()) return;
    const size_t slot = it->second;
    const size_t last = items_.size() - 1;
    slot_.erase(it);
    if (slot != last) {
      items_[slot] = items_[last];
      slot_[items_[slot]] = slot;
      SetWeight(slot, tree_[capacity_ + last]);
    }
    SetWeight(last, 0);
    items_.pop_back();
  }
  Status SetPriority(uint64_t item, double priority) override {
    auto it = slot_.find(item);
    if (it == slot_.end()) return Status::NotFound("item " + std::to_string(item));
    if (!std::isfinite(priority) || priority < 0) {
      return Status::InvalidArgument("priority must be finite and >= 0");
    }
    SetWeight(it->second, Weight(priority));
    return Status::Ok();
  }
  std::vector<uint64_t> Sample(size_t count, uint64_t, std::mt19937_64& rng,
                               const std::function<bool(uint64_t)>& eligible) override {
    std::vector<uint64_t> chosen;
    std::unordered_set<uint64_t> seen;
    size_t attempts = 8 * count + 16;
    while (chosen.size() < count && attempts-- > 0 && !items_.empty()) {
      const double total = tree_[1];
      if (!(total > 0)) break;
      std::uniform_real_distribution<double> uniform(0.0, total);
      const uint64_t item = items_[Find(uniform(rng))];
      if (seen.insert(item).second && eligible(item)) chosen.push_back(item);
    }
    return chosen;
  }
  size_t size() const override { return items_.size(); }
  bool Contains(uint64_t item) const override { return slot_.count(item) != 0; }
  SamplerOptions options() const override { return options_; }

 private:
  double Weight(double priority) const {
    return std::pow(std::max(priority, 0.0), options_.priority_exponent);
  }
  void SetWeight(size_t slot, double weight) {
    size_t node = capacity_ + slot;
    tree_[node] = weight;
    for (node /= 2; node >= 1; node /= 2) tree_[node] = tree_[2 * node] + tree_[2 * node + 1];
  }
  // The slot whose cumulative weight range holds `target`.
  size_t Find(double target) const {
    size_t node = 1;
    while (node < capacity_) {
      if (target < tree_[2 * node] || tree_[2 * node + 1] <= 0) {
        node = 2 * node;
      } else {
        target -= tree_[2 * node];
        node = 2 * node + 1;
      }
    }
    const size_t slot = node - capacity_;
    return slot < items_.size() ? slot : items_.size() - 1;
  }
  void Grow() {
    const size_t new_capacity = capacity_ == 0 ? 1024 : 2 * capacity_;
    std::vector<double> tree(2 * new_capacity, 0.0);
    for (size_t slot = 0; slot < items_.size(); ++slot) {
      tree[new_capacity + slot] = tree_[capacity_ + slot];
    }
    for (size_t node = new_capacity - 1; node >= 1; --node) {
      tree[node] = tree[2 * node] + tree[2 * node + 1];
    }
    tree_ = std::move(tree);
    capacity_ = new_capacity;
  }

  SamplerOptions options_;
  size_t capacity_ = 0;       // leaves in the tree, a power of two
  std::vector<double> tree_;  // 1-based heap layout; leaves at [capacity_, 2 * capacity_)
  std::vector<uint64_t> items_;
  std::unordered_map<uint64_t, size_t> slot_;
};

}  // namespace

std::unique_ptr<Sampler> MakePrioritizedSampler(const SamplerOptions& options) {
  return std::make_unique<PrioritizedSampler>(options);
}

}  // namespace strider::replay
