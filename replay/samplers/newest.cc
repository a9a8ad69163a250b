// newest: the most recently inserted eligible items, newest first (on-policy training that
// wants the freshest data and tolerates reuse).
#include <set>

#include "replay/samplers/samplers.h"

namespace strider::replay {
namespace {

class NewestSampler : public Sampler {
 public:
  explicit NewestSampler(SamplerOptions options) : options_(options) {}

  void Insert(uint64_t item, double) override { items_.insert(items_.end(), item); }
  void Remove(uint64_t item) override { items_.erase(item); }
  Status SetPriority(uint64_t, double) override {
    return Status::InvalidArgument("the newest sampler has no priorities");
  }
  std::vector<uint64_t> Sample(size_t count, uint64_t, std::mt19937_64&,
                               const std::function<bool(uint64_t)>& eligible) override {
    std::vector<uint64_t> chosen;
    for (auto it = items_.rbegin(); it != items_.rend() && chosen.size() < count; ++it) {
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

std::unique_ptr<Sampler> MakeNewestSampler(const SamplerOptions& options) {
  return std::make_unique<NewestSampler>(options);
}

}  // namespace strider::replay
