#include "replay/table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace strider::replay {

Result<SampleUnit> ParseSampleUnit(const std::string& name) {
  if (name == "segment") return SampleUnit::kSegment;
  if (name == "trajectory") return SampleUnit::kTrajectory;
  if (name == "group") return SampleUnit::kGroup;
  return Status::InvalidArgument("unknown unit '" + name +
                                 "' (expected segment, trajectory or group)");
}

std::string SampleUnitName(SampleUnit unit) {
  switch (unit) {
    case SampleUnit::kSegment: return "segment";
    case SampleUnit::kTrajectory: return "trajectory";
    case SampleUnit::kGroup: return "group";
  }
  return "segment";
}

TableConfig ReadTableConfig(ConfigReader& reader) {
  TableConfig config;
  reader.Required("name", &config.name);
  reader.Check(!config.name.empty(), "name", "must not be empty");
  std::string unit = "segment";
  reader.Optional("unit", &unit);
  Result<SampleUnit> parsed_unit = ParseSampleUnit(unit);
  if (parsed_unit.ok()) {
    config.unit = *parsed_unit;
  } else {
    reader.Fail("unit", parsed_unit.status().message());
  }
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
  std::string count = "items";
  limiter.Optional("count", &count);
  limiter.Check(count == "items" || count == "tokens", "count", "must be items or tokens");
  config.rate_limiter.count_tokens = count == "tokens";
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
      {"unit", SampleUnitName(c.unit)},
      {"sampler", SamplerKindName(c.sampler.kind)},
      {"priority_exponent", c.sampler.priority_exponent},
      {"default_priority", c.sampler.default_priority},
      {"max_staleness", c.max_staleness},
      {"capacity", c.capacity},
      {"rate_limiter",
       {{"count", c.rate_limiter.count_tokens ? "tokens" : "items"},
        {"min_fill", c.rate_limiter.min_fill},
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
    const double budget = Budget(inserts, samples);
    const size_t allowed = budget < 1 ? 0 : static_cast<size_t>(std::floor(budget));
    if (allowed == 0) {
      const char* unit = options_.count_tokens ? " tokens" : "";
      *reason = "samples_per_insert: " + std::to_string(samples) + unit + " sampled after " +
                std::to_string(inserts) + unit + " inserted; waiting for inserts";
      return 0;
    }
    // Counting tokens, the table trims the items drawn to the budget.
    return options_.count_tokens ? wanted : std::min(wanted, allowed);
  }
  return wanted;
}

double RateLimiter::Budget(uint64_t inserts, uint64_t samples) const {
  if (options_.samples_per_insert <= 0) return std::numeric_limits<double>::infinity();
  return options_.samples_per_insert * static_cast<double>(inserts) + options_.tolerance -
         static_cast<double>(samples);
}

Table::Table(TableConfig config, uint64_t inserts, uint64_t samples, uint64_t seed)
    : config_(std::move(config)),
      sampler_(MakeSampler(config_.sampler)),
      limiter_(config_.rate_limiter),
      inserts_(inserts),
      samples_(samples),
      rng_(seed) {
  // Units and tokens are counted as they are inserted, which start-up replays: the durable
  // counter counts segments. What retention deleted before a restart is then not counted.
  if (per_unit() || config_.rate_limiter.count_tokens) inserts_ = 0;
}

void Table::Insert(uint64_t item, const ItemInfo& info, bool counted,
                   const schema::SegmentFacts* facts) {
  stored_[item] = info;
  stored_bytes_ += info.bytes;
  const bool tokens = config_.rate_limiter.count_tokens;
  if (!per_unit()) {
    if (tokens) {
      inserts_ += info.tokens;
    } else if (counted) {
      ++inserts_;
    }
    if (facts != nullptr && abandoned_.count(std::string(facts->key.trajectory.View()))) return;
    AddToSampler(item, info);
    return;
  }
  if (facts == nullptr) return;
  std::optional<std::vector<uint64_t>> unit = Track(item, *facts);
  if (!unit) return;
  AddUnit(item);
}

void Table::AddUnit(uint64_t item) {
  inserts_ += config_.rate_limiter.count_tokens ? units_.at(item).tokens : 1;
  // The completing item holds the unit's times sampled and priority (durable per item).
  AddToSampler(item, stored_.at(item));
}

void Table::Abandon(const std::string& trajectory, const std::vector<uint64_t>& items) {
  if (!per_unit()) {
    abandoned_.insert(trajectory);
    for (uint64_t item : items) RemoveFromSampler(item);
    return;
  }
  auto it = trajectories_.find(trajectory);
  if (it == trajectories_.end() || it->second.abandoned) return;
  it->second.abandoned = true;
  if (unit_of_.count(trajectory) || it->second.segments.empty()) return;
  // Its group may be waiting for it alone.
  const uint64_t last = it->second.segments.rbegin()->second;
  if (TryComplete(trajectory, last)) AddUnit(last);
}

void Table::AddToSampler(uint64_t item, const ItemInfo& info) {
  const int64_t max_times = config_.rate_limiter.max_times_sampled;
  if (max_times > 0 && info.times_sampled >= static_cast<uint64_t>(max_times)) return;
  sampler_->Insert(item, info.priority);
  in_sampler_.insert(item);
  while (static_cast<int64_t>(in_sampler_.size()) > config_.capacity) {
    RemoveFromSampler(*in_sampler_.begin());
  }
}

std::optional<std::vector<uint64_t>> Table::Track(uint64_t item,
                                                  const schema::SegmentFacts& facts) {
  const std::string id(facts.key.trajectory.View());
  TrajectoryState& t = trajectories_[id];
  if (t.group.empty()) {
    const bool grouped = facts.group_size > 0;
    t.group = grouped ? std::string(facts.group_id.View()) : id;
    t.group_index = grouped ? facts.group_index : 0;
    GroupState& g = groups_[t.group];
    g.size = grouped ? facts.group_size : 1;
    g.members[t.group_index] = id;
  }
  t.segments[facts.key.index] = item;
  trajectory_of_[item] = id;
  if (facts.is_last) {
    t.last_index = facts.key.index;
    t.end_reason = facts.end_reason;
  }
  if (t.abandoned || !t.complete() || unit_of_.count(id)) return std::nullopt;
  return TryComplete(id, item);
}

std::optional<std::vector<uint64_t>> Table::TryComplete(const std::string& id, uint64_t item) {
  const TrajectoryState& t = trajectories_.at(id);
  if (unit_of_.count(id)) return std::nullopt;
  Unit unit;
  if (config_.unit == SampleUnit::kTrajectory) {
    if (t.abandoned) return std::nullopt;
    unit.trajectories = {id};
    unit.items = ItemsInOrder(id);
  } else {
    const GroupState& g = groups_.at(t.group);
    if (g.members.size() < g.size) return std::nullopt;
    bool abandoned = false;
    std::vector<std::string> kept;
    for (const auto& [index, member] : g.members) {
      const TrajectoryState& m = trajectories_.at(member);
      if (!m.abandoned && !m.complete()) return std::nullopt;
      if (m.abandoned || m.end_reason == schema::EndReason::kAbandoned) {
        abandoned = true;
      } else {
        kept.push_back(member);
      }
      unit.trajectories.push_back(member);
    }
    // A baseline over fewer than two trajectories carries no signal.
    if (abandoned && kept.size() < 2) return std::nullopt;
    for (const std::string& member : kept) {
      for (uint64_t segment : ItemsInOrder(member)) unit.items.push_back(segment);
    }
  }
  unit.min_policy_version = std::numeric_limits<uint64_t>::max();
  for (uint64_t segment : unit.items) {
    const ItemInfo& info = stored_.at(segment);
    unit.min_policy_version = std::min(unit.min_policy_version, info.min_policy_version);
    unit.max_policy_version = std::max(unit.max_policy_version, info.max_policy_version);
    unit.tokens += info.tokens;
  }
  for (const std::string& member : unit.trajectories) unit_of_[member] = item;
  std::vector<uint64_t> items = unit.items;
  units_[item] = std::move(unit);
  return items;
}

std::vector<uint64_t> Table::ItemsInOrder(const std::string& trajectory) const {
  std::vector<uint64_t> items;
  auto it = trajectories_.find(trajectory);
  if (it == trajectories_.end()) return items;
  for (const auto& [index, item] : it->second.segments) items.push_back(item);
  return items;
}

uint64_t Table::TokensOf(uint64_t item) const {
  if (per_unit()) return units_.at(item).tokens;
  return stored_.at(item).tokens;
}

std::vector<uint64_t> Table::ItemsOf(uint64_t item) const {
  if (!per_unit()) return {item};
  auto it = units_.find(item);
  return it == units_.end() ? std::vector<uint64_t>() : it->second.items;
}

Result<std::vector<uint64_t>> Table::ItemsOfTrajectory(const std::string& trajectory) const {
  if (!per_unit()) {
    return Status::InvalidArgument("table " + config_.name +
                                   " samples segments and keeps no trajectory index");
  }
  return ItemsInOrder(trajectory);
}

Result<std::vector<uint64_t>> Table::ItemsOfGroup(const std::string& group) const {
  if (!per_unit()) {
    return Status::InvalidArgument("table " + config_.name +
                                   " samples segments and keeps no group index");
  }
  std::vector<uint64_t> items;
  auto it = groups_.find(group);
  if (it == groups_.end()) return items;
  for (const auto& [index, member] : it->second.members) {
    for (uint64_t item : ItemsInOrder(member)) items.push_back(item);
  }
  return items;
}

std::vector<uint64_t> Table::SelectForDeletion(uint64_t now_unix_ms) const {
  std::vector<uint64_t> victims;
  std::set<uint64_t> chosen;
  const RetentionOptions& r = config_.retention;
  size_t count = stored_.size();
  uint64_t bytes = stored_bytes_;
  for (const auto& [item, info] : stored_) {
    if (chosen.count(item)) continue;
    const bool too_many = r.max_segments > 0 && static_cast<int64_t>(count) > r.max_segments;
    const bool too_big = r.max_bytes > 0 && bytes > static_cast<uint64_t>(r.max_bytes);
    const bool too_old = r.max_age_s > 0 &&
                         now_unix_ms > info.insert_unix_ms + static_cast<uint64_t>(r.max_age_s) * 1000;
    if (!too_many && !too_big && !too_old) break;
    std::vector<uint64_t> taken = {item};
    if (per_unit()) {
      auto t = trajectory_of_.find(item);
      if (t != trajectory_of_.end()) taken = ItemsInOrder(t->second);
    }
    for (uint64_t victim : taken) {
      if (!chosen.insert(victim).second) continue;
      --count;
      bytes -= stored_.at(victim).bytes;
    }
  }
  victims.assign(chosen.begin(), chosen.end());
  return victims;
}

void Table::Erase(uint64_t item) {
  auto it = stored_.find(item);
  if (it == stored_.end()) return;
  stored_bytes_ -= it->second.bytes;
  stored_.erase(it);
  RemoveFromSampler(item);
  if (!per_unit()) return;
  auto owner = trajectory_of_.find(item);
  if (owner == trajectory_of_.end()) return;
  const std::string id = owner->second;
  trajectory_of_.erase(owner);
  // A unit missing a segment is never sampled again, nor completed again.
  auto unit = unit_of_.find(id);
  if (unit != unit_of_.end()) {
    const uint64_t unit_item = unit->second;
    RemoveFromSampler(unit_item);
    auto u = units_.find(unit_item);
    if (u != units_.end()) {
      for (const std::string& member : u->second.trajectories) unit_of_.erase(member);
      units_.erase(u);
    }
  }
  TrajectoryState& t = trajectories_.at(id);
  for (auto s = t.segments.begin(); s != t.segments.end(); ++s) {
    if (s->second == item) {
      t.segments.erase(s);
      break;
    }
  }
  if (!t.segments.empty()) return;
  auto g = groups_.find(t.group);
  if (g != groups_.end()) {
    g->second.members.erase(t.group_index);
    if (g->second.members.empty()) groups_.erase(g);
  }
  trajectories_.erase(id);
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
  size_t ahead = 0;
  auto eligible = [&](uint64_t item) {
    const uint64_t oldest = per_unit() ? units_.at(item).min_policy_version
                                       : stored_.at(item).min_policy_version;
    // Learner versions only grow, so an item too stale now is too stale for good.
    if (config_.max_staleness >= 0 &&
        policy_version > oldest + static_cast<uint64_t>(config_.max_staleness)) {
      stale.push_back(item);
      return false;
    }
    // On-policy (max_staleness 0): every token of the item is of the request's version. An item
    // with a newer token than the request stays in the sampler: all of it may be of the version
    // a later request carries, and a mixed one goes as too stale then.
    const uint64_t newest =
        per_unit() ? units_.at(item).max_policy_version : stored_.at(item).max_policy_version;
    if (config_.max_staleness == 0 && newest > policy_version) {
      ++ahead;
      return false;
    }
    return true;
  };
  draw.items = sampler_->Sample(allowed, after, rng_, eligible);
  for (uint64_t item : stale) RemoveFromSampler(item);
  uint64_t counted = draw.items.size();
  if (config_.rate_limiter.count_tokens) {
    // The limiter allowed a budget of tokens: items are taken while some of it is left, so the
    // last one may overshoot it (never by more than one item).
    const double budget = limiter_.Budget(inserts_, samples_);
    counted = 0;
    size_t kept = 0;
    while (kept < draw.items.size() && static_cast<double>(counted) < budget) {
      counted += TokensOf(draw.items[kept++]);
    }
    draw.items.resize(kept);
  }
  const int64_t max_times = config_.rate_limiter.max_times_sampled;
  for (uint64_t item : draw.items) {
    ItemInfo& info = stored_.at(item);
    ++info.times_sampled;
    if (max_times > 0 && info.times_sampled >= static_cast<uint64_t>(max_times)) {
      RemoveFromSampler(item);
    }
  }
  samples_ += counted;
  if (draw.items.empty()) {
    draw.not_ready_reason = "no eligible items: " + std::to_string(sampler_->size()) +
                            " sampleable, " + std::to_string(stale.size()) +
                            " found too stale for policy version " +
                            std::to_string(policy_version) +
                            (ahead > 0 ? ", " + std::to_string(ahead) + " ahead of it" : "");
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
