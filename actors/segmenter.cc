#include "actors/segmenter.h"

#include <algorithm>
#include <cstdio>
#include <random>

namespace strider::actors {

Segmenter::Segmenter(SegmenterOptions options, schema::TrajectoryId id)
    : options_(std::move(options)), id_(id), last_version_(options_.policy_version) {
  // Segment 0 starts from the empty state: nothing to compare, so no digest.
  route_context_ = options_.route_context && options_.routing_layers * options_.routing_top_k > 0;
}

namespace {

// A long observation (a quarter of a million-token document) waits here until the engine has
// fed it and its routing came back, and the buffers keep that capacity, 30-60 bytes per token,
// after the cuts emptied them: given back once they are half empty and large enough to
// matter, so what a trajectory holds follows what waits, not the largest part seen. Half, not
// less: the pages a cut emptied were written, so they stay resident until given back (a
// quarter-million-token part waited at 30 bytes per token, 7.8 MB), and a copy of what is left
// costs little beside the prefill that routed it.
template <typename T>
void ReleaseSlack(std::vector<T>& v) {
  constexpr size_t kWorthBytes = 1 << 20;
  if (v.capacity() * sizeof(T) >= kWorthBytes && v.capacity() > 2 * v.size()) v.shrink_to_fit();
}

}  // namespace

void Segmenter::AdvanceRouted() {
  while (routed_until_ < length()) {
    const size_t i = static_cast<size_t>(routed_until_ - begin_);
    if (route_context_ && !has_record_[i] && !schema::IsAction(roles_[i])) break;
    ++routed_until_;
  }
}

Status Segmenter::AddContext(std::span<const int32_t> tokens, schema::Role role) {
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  if (schema::IsAction(role)) {
    return Status::InvalidArgument("segmenter: context tokens cannot have the action role " +
                                   std::string(schema::RoleName(role)));
  }
  const size_t per_token = static_cast<size_t>(options_.routing_layers * options_.routing_top_k);
  for (int32_t token : tokens) {
    tokens_.push_back(token);
    roles_.push_back(role);
    log_probs_.push_back(0.0f);
    versions_.push_back(last_version_);
    experts_.insert(experts_.end(), per_token, 0);
    has_record_.push_back(0);
    AdvanceRouted();
    CutWhileOver();
  }
  return Status::Ok();
}

Status Segmenter::AddImage(schema::Image image) {
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  const uint64_t expected = uint64_t{image.width} * image.height * image.channels;
  if (expected == 0 || image.pixels.size() != expected) {
    return Status::InvalidArgument("segmenter: image at position " + std::to_string(length()) +
                                   " has " + std::to_string(image.pixels.size()) +
                                   " pixel bytes for " + std::to_string(image.width) + "x" +
                                   std::to_string(image.height) + "x" +
                                   std::to_string(image.channels));
  }
  images_.emplace_back(length(), std::move(image));
  return Status::Ok();
}

Status Segmenter::AddAction(int32_t token, schema::Role role, float log_prob,
                            uint64_t policy_version, std::span<const uint16_t> experts) {
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  if (!schema::IsAction(role)) {
    return Status::InvalidArgument("segmenter: action token with the context role " +
                                   std::string(schema::RoleName(role)));
  }
  const size_t expected = static_cast<size_t>(options_.routing_layers * options_.routing_top_k);
  if (experts.size() != expected) {
    return Status::InvalidArgument(
        "segmenter: action token at position " + std::to_string(length()) + " has " +
        std::to_string(experts.size()) + " expert ids, expected " + std::to_string(expected));
  }
  tokens_.push_back(token);
  roles_.push_back(role);
  // The schema wants log-probs <= 0; a sampled token's log-prob is, up to rounding.
  log_probs_.push_back(std::min(log_prob, 0.0f));
  versions_.push_back(policy_version);
  last_version_ = policy_version;
  experts_.insert(experts_.end(), experts.begin(), experts.end());
  has_record_.push_back(1);
  if (!step_begin_) step_begin_ = length() - 1;
  AdvanceRouted();
  CutWhileOver();
  return Status::Ok();
}

Status Segmenter::AddRouting(int64_t first_position, std::span<const uint16_t> experts) {
  if (!route_context_) return Status::Ok();
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  const size_t per_token = static_cast<size_t>(options_.routing_layers * options_.routing_top_k);
  if (experts.size() % per_token != 0) {
    return Status::InvalidArgument("segmenter: " + std::to_string(experts.size()) +
                                   " expert ids are not whole records of " +
                                   std::to_string(per_token));
  }
  const int64_t count = static_cast<int64_t>(experts.size() / per_token);
  if (count == 0) return Status::Ok();
  if (first_position < begin_ || first_position + count > length()) {
    return Status::InvalidArgument(
        "segmenter: routing of positions [" + std::to_string(first_position) + ", " +
        std::to_string(first_position + count) + ") is outside the waiting tokens [" +
        std::to_string(begin_) + ", " + std::to_string(length()) + ")");
  }
  for (int64_t p = 0; p < count; ++p) {
    const size_t i = static_cast<size_t>(first_position + p - begin_);
    if (schema::IsAction(roles_[i])) continue;
    std::copy(experts.begin() + p * per_token, experts.begin() + (p + 1) * per_token,
              experts_.begin() + i * per_token);
    has_record_[i] = 1;
  }
  AdvanceRouted();
  CutWhileOver();
  return Status::Ok();
}

void Segmenter::MarkTurnBoundary(std::optional<uint64_t> digest) {
  const int64_t position = length();
  if (position == begin_) {
    // A boundary exactly at the start of the waiting tokens: the digest describes it.
    if (digest && begin_ > 0) start_digest_ = digest;
    return;
  }
  if (!boundaries_.empty() && boundaries_.back().first == position) {
    if (digest) boundaries_.back().second = digest;
    return;
  }
  boundaries_.emplace_back(position, digest);
}

Status Segmenter::EndStep(std::optional<float> process_reward, schema::StepLabel label) {
  const int64_t position = length();
  if (position == 0 || position <= last_step_end_) {
    return Status::FailedPrecondition("segmenter: a step must end after the previous one");
  }
  schema::Step step;
  step.process_reward = process_reward.value_or(0.0f);
  step.has_reward = process_reward.has_value();
  step.label = label;
  step.index = next_step_index_++;
  // A turn with no action (which the actor never ends a step on) spans from the previous end.
  step.begin = static_cast<uint64_t>(step_begin_.value_or(last_step_end_));
  steps_.emplace_back(position, step);
  last_step_end_ = position;
  step_begin_.reset();
  return Status::Ok();
}

void Segmenter::CutWhileOver() {
  const int64_t window = options_.segment_tokens;
  while (static_cast<int64_t>(tokens_.size()) > window) {
    int64_t cut = window;
    for (auto it = boundaries_.rbegin(); it != boundaries_.rend(); ++it) {
      const int64_t offset = it->first - begin_;
      if (offset <= window) {
        if (2 * offset >= window) cut = offset;
        break;
      }
    }
    if (begin_ + cut > routed_until_) return;  // AddRouting or Finish cuts it later
    Cut(cut);
  }
}

void Segmenter::Cut(int64_t count) {
  schema::SegmentData segment;
  segment.trajectory_id = id_;
  segment.segment_index = next_index_++;
  segment.token_begin = static_cast<uint64_t>(begin_);
  segment.env = options_.env;
  segment.table = options_.table;
  segment.tokens.assign(tokens_.begin(), tokens_.begin() + count);
  segment.roles.assign(roles_.begin(), roles_.begin() + count);
  segment.behaviour_logprobs.assign(log_probs_.begin(), log_probs_.begin() + count);
  for (int64_t i = 0; i < count; ++i) {
    if (i == 0 || versions_[i] != versions_[i - 1]) {
      segment.policy_runs.push_back({static_cast<uint32_t>(i), versions_[i]});
    }
  }
  segment.group_id = options_.group_id;
  segment.group_index = options_.group_index;
  segment.group_size = options_.group_size;
  segment.temperature = options_.temperature;
  segment.top_p = options_.top_p;
  segment.top_k = options_.top_k;
  segment.routing.layers = static_cast<uint16_t>(options_.routing_layers);
  segment.routing.top_k = static_cast<uint16_t>(options_.routing_top_k);
  const size_t per_token = static_cast<size_t>(options_.routing_layers * options_.routing_top_k);
  bool every_context = true;
  for (int64_t i = 0; i < count; ++i) every_context = every_context && has_record_[i];
  if (route_context_) {
    segment.routing.coverage =
        every_context ? schema::RoutingCoverage::kAll : schema::RoutingCoverage::kMasked;
    if (!every_context) segment.routing.mask.assign((count + 7) / 8, 0);
  }
  for (int64_t i = 0; i < count; ++i) {
    const auto from = experts_.begin() + i * per_token;
    if (schema::IsAction(roles_[i])) {
      segment.routing.experts.insert(segment.routing.experts.end(), from, from + per_token);
    } else if (route_context_ && has_record_[i]) {
      segment.routing.context_experts.insert(segment.routing.context_experts.end(), from,
                                             from + per_token);
    }
    if (!segment.routing.mask.empty() && has_record_[i]) {
      segment.routing.mask[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    }
  }
  experts_.erase(experts_.begin(), experts_.begin() + count * per_token);
  has_record_.erase(has_record_.begin(), has_record_.begin() + count);

  const int64_t end = begin_ + count;
  auto step = steps_.begin();
  for (; step != steps_.end() && step->first <= end; ++step) {
    schema::Step cut = step->second;
    cut.end = static_cast<uint32_t>(step->first - begin_);
    segment.steps.push_back(cut);
  }
  steps_.erase(steps_.begin(), step);
  auto image = images_.begin();
  for (; image != images_.end() && image->first < end; ++image) {
    image->second.token_offset = static_cast<uint32_t>(image->first - begin_);
    segment.images.push_back(std::move(image->second));
  }
  images_.erase(images_.begin(), image);
  if (start_digest_) {
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(*start_digest_));
    segment.state_digest = hex;
  }

  tokens_.erase(tokens_.begin(), tokens_.begin() + count);
  roles_.erase(roles_.begin(), roles_.begin() + count);
  log_probs_.erase(log_probs_.begin(), log_probs_.begin() + count);
  versions_.erase(versions_.begin(), versions_.begin() + count);
  ReleaseSlack(tokens_);
  ReleaseSlack(roles_);
  ReleaseSlack(log_probs_);
  ReleaseSlack(versions_);
  ReleaseSlack(experts_);
  ReleaseSlack(has_record_);
  start_digest_.reset();
  auto boundary = boundaries_.begin();
  for (; boundary != boundaries_.end() && boundary->first <= end; ++boundary) {
    if (boundary->first == end) start_digest_ = boundary->second;
  }
  boundaries_.erase(boundaries_.begin(), boundary);
  begin_ = end;
  ready_.push_back(std::move(segment));
}

std::vector<schema::SegmentData> Segmenter::TakeReady() {
  std::vector<schema::SegmentData> out;
  out.swap(ready_);
  return out;
}

Result<std::vector<schema::SegmentData>> Segmenter::Finish(
    float outcome_reward, schema::EndReason end_reason,
    std::vector<std::pair<std::string, std::string>> metadata) {
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  if (length() == 0) return Status::FailedPrecondition("segmenter: the trajectory has no tokens");
  if (end_reason == schema::EndReason::kNone) {
    return Status::InvalidArgument("segmenter: a finished trajectory needs an end reason");
  }
  // No more records will come: what still waits is cut without them.
  routed_until_ = length();
  CutWhileOver();
  finished_ = true;
  if (!tokens_.empty()) Cut(static_cast<int64_t>(tokens_.size()));
  std::vector<schema::SegmentData> out = TakeReady();
  if (out.empty()) {
    // Every token was already cut and taken: the last segment went out without knowing it was
    // last. The trajectory still needs an end marker, which the schema cannot express without
    // tokens, so this never happens: CutWhileOver keeps at least one token waiting.
    return Status::Internal("segmenter: nothing left for the last segment");
  }
  schema::SegmentData& last = out.back();
  last.is_last = true;
  last.outcome_reward = outcome_reward;
  last.end_reason = end_reason;
  last.metadata = std::move(metadata);
  return out;
}

schema::TrajectoryId NewTrajectoryId() {
  static thread_local std::mt19937_64 generator{std::random_device{}() ^
                                                (uint64_t{std::random_device{}()} << 32)};
  schema::TrajectoryId id;
  for (int half = 0; half < 2; ++half) {
    const uint64_t bits = generator();
    for (int i = 0; i < 8; ++i) id.bytes[half * 8 + i] = static_cast<uint8_t>(bits >> (8 * i));
  }
  return id;
}

}  // namespace strider::actors
