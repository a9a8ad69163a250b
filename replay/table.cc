#include "replay/table.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace strider::replay {

TableConfig ReadTableConfig(ConfigReader& reader) {
  TableConfig config;
  reader.Required("name", &config.name);
  reader.Check(!config.name.empty(), "name", "must not be empty");
  std::string sampler = "fifo";
  reader.Optional("sampler", &sampler);
  Result<SamplerKind> kind = ParseSamplerKind(sampler);
  if (kind.ok()) {
    config.sampler.kind = *kind;
  } else {
    reader.Fail("sampler", kind.status().message());
  }
  reader.Optional("priority_exponent", &config.sampler.priority_exponent);
  reader.Check(config.sampler.priority_exponent >= 0, "priority_exponent", "must be >= 0");
  reader.Optional("default_priority", &config.sampler.default_priority);
  reader.Check(config.sampler.default_priority >= 0, "default_priority", "must be >= 0");
  reader.Optional("max_staleness", &config.max_staleness);
  reader.Check(config.max_staleness >= -1, "max_staleness", "must be -1 (unbounded) or >= 0");
  reader.Optional("capacity", &config.capacity);
  reader.Check(config.capacity >= 1, "capacity", "must be >= 1");

  ConfigReader limiter = reader.Section("rate_limiter");
  limiter.Optional("min_fill", &config.rate_limiter.min_fill);
  limiter.Check(config.rate_limiter.min_fill >= 1, "min_fill", "must be >= 1");
  limiter.Optional("samples_per_insert", &config.rate_limiter.samples_per_insert);
  limiter.Check(config.rate_limiter.samples_per_insert >= 0, "samples_per_insert",
                "must be >= 0 (0 turns the ratio off)");
  limiter.Optional("tolerance", &config.rate_limiter.tolerance);
  limiter.Check(config.rate_limiter.tolerance >= 0, "tolerance", "must be >= 0");
  limiter.Optional("max_times_sampled", &config.rate_limiter.max_times_sampled);
  limiter.Check(config.rate_limiter.max_times_sampled >= 0, "max_times_sampled",
                "must be >= 0 (0 is unlimited)");

  ConfigReader retention = reader.Section("retention");
  retention.Optional("max_segments", &config.retention.max_segments);
  retention.Optional("max_bytes", &config.retention.max_bytes);
  retention.Optional("max_age_s", &config.retention.max_age_s);
  retention.Check(config.retention.max_segments >= 0, "max_segments", "must be >= 0");
  retention.Check(config.retention.max_bytes >= 0, "max_bytes", "must be >= 0");
  retention.Check(config.retention.max_age_s >= 0, "max_age_s", "must be >= 0");
  return config;
}

std::string TableConfigJson(const TableConfig& c) {
  nlohmann::json j = {
      {"name", c.name},
      {"sampler", SamplerKindName(c.sampler.kind)},
      {"priority_exponent", c.sampler.priority_exponent},
      {"default_priority", c.sampler.default_priority},
      {"max_staleness", c.max_staleness},
      {"capacity", c.capacity},
      {"rate_limiter",
       {{"min_fill", c.rate_limiter.min_fill},
        {"samples_per_insert", c.rate_limiter.samples_per_insert},
        {"tolerance", c.rate_limiter.tolerance},
        {"max_times_sampled", c.rate_limiter.max_times_sampled}}},
      {"retention",
       {{"max_segments", c.retention.max_segments},
        {"max_bytes", c.retention.max_bytes},
        {"max_age_s", c.retention.max_age_s}}},
  };
  return j.dump();
}

size_t RateLimiter::Allowed(size_t wanted, size_t sampleable, uint64_t inserts, uint64_t samples,
                            std::string* reason) const {
  if (static_cast<int64_t>(sampleable) < options_.min_fill) {
    *reason = "min_fill: " + std::to_string(sampleable) + " sampleable items, " +
              std::to_string(options_.min_fill) + " needed";
    return 0;
  }
  if (options_.samples_per_insert > 0) {
    const double budget = options_.samples_per_insert * static_cast<double>(inserts) +
                          options_.tolerance - static_cast<double>(samples);
    const size_t allowed = budget < 1 ? 0 : static_cast<size_t>(std::floor(budget));
    if (allowed == 0) {
      *reason = "samples_per_insert: " + std::to_string(samples) + " samples after " +
                std::to_string(inserts) + " inserts; waiting for inserts";
      return 0;
    }
    return std::min(wanted, allowed);
  }
  return wanted;
}

Table::Table(TableConfig config, uint64_t inserts, uint64_t samples, uint64_t seed)
    : config_(std::move(config)),
      sampler_(MakeSampler(config_.sampler)),
      limiter_(config_.rate_limiter),
      inserts_(inserts),
      samples_(samples),
      rng_(seed) {}

void Table::Insert(uint64_t item, const ItemInfo& info, bool counted) {
  stored_[item] = info;
  stored_bytes_ += info.bytes;
  if (counted) ++inserts_;
  const int64_t max_times = config_.rate_limiter.max_times_sampled;
  if (max_times > 0 && info.times_sampled >= static_cast<uint64_t>(max_times)) return;
  sampler_->Insert(item, info.priority);
  in_sampler_.insert(item);
  while (static_cast<int64_t>(in_sampler_.size()) > config_.capacity) {
    RemoveFromSampler(*in_sampler_.begin());
  }
}

std::vector<uint64_t> Table::SelectForDeletion(uint64_t now_unix_ms) const {
  std::vector<uint64_t> victims;
  const RetentionOptions& r = config_.retention;
  size_t count = stored_.size();
  uint64_t bytes = stored_bytes_;
  for (const auto& [item, info] : stored_) {
    const bool too_many = r.max_segments > 0 && static_cast<int64_t>(count) > r.max_segments;
    const bool too_big = r.max_bytes > 0 && bytes > static_cast<uint64_t>(r.max_bytes);
    const bool too_old = r.max_age_s > 0 &&
                         now_unix_ms > info.insert_unix_ms + static_cast<uint64_t>(r.max_age_s) * 1000;
    if (!too_many && !too_big && !too_old) break;
    victims.push_back(item);
    --count;
    bytes -= info.bytes;
  }
  return victims;
}

void Table::Erase(uint64_t item) {
  auto it = stored_.find(item);
  if (it == stored_.end()) return;
  stored_bytes_ -= it->second.bytes;
  stored_.erase(it);
  RemoveFromSampler(item);
}

void Table::RemoveFromSampler(uint64_t item) {
  sampler_->Remove(item);
  in_sampler_.erase(item);
}

Table::Draw Table::Sample(size_t count, uint64_t after, uint64_t policy_version) {
  Draw draw;
  const size_t allowed =
      limiter_.Allowed(count, sampler_->size(), inserts_, samples_, &draw.not_ready_reason);
  if (allowed == 0) return draw;
  std::vector<uint64_t> stale;
  auto eligible = [&](uint64_t item) {
    const ItemInfo& info = stored_.at(item);
    // Learner versions only grow, so an item too stale now is too stale for good.
    if (config_.max_staleness >= 0 &&
        policy_version > info.min_policy_version + static_cast<uint64_t>(config_.max_staleness)) {
      stale.push_back(item);
      return false;
    }
    return true;
  };
  draw.items = sampler_->Sample(allowed, after, rng_, eligible);
  for (uint64_t item : stale) RemoveFromSampler(item);
  const int64_t max_times = config_.rate_limiter.max_times_sampled;
  for (uint64_t item : draw.items) {
    ItemInfo& info = stored_.at(item);
    ++info.times_sampled;
    if (max_times > 0 && info.times_sampled >= static_cast<uint64_t>(max_times)) {
      RemoveFromSampler(item);
    }
  }
  samples_ += draw.items.size();
  if (draw.items.empty()) {
    draw.not_ready_reason = "no eligible items: " + std::to_string(sampler_->size()) +
                            " sampleable, " + std::to_string(stale.size()) +
                            " found too stale for policy version " +
                            std::to_string(policy_version);
  }
  return draw;
}

Status Table::SetPriority(uint64_t item, double priority) {
  auto it = stored_.find(item);
  if (it == stored_.end()) {
    return Status::NotFound("table " + config_.name + " has no item " + std::to_string(item));
  }
  it->second.priority = priority;
  if (!sampler_->Contains(item)) return Status::Ok();
  return sampler_->SetPriority(item, priority);
}

const ItemInfo* Table::Find(uint64_t item) const {
  auto it = stored_.find(item);
  return it == stored_.end() ? nullptr : &it->second;
}

}  // namespace strider::replay
