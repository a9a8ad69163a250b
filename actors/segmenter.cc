#include "actors/segmenter.h"

#include <algorithm>
#include <cstdio>
#include <random>

namespace strider::actors {

Segmenter::Segmenter(SegmenterOptions options, schema::TrajectoryId id)
    : options_(std::move(options)), id_(id) {
  // Segment 0 starts from the empty state: nothing to compare, so no digest.
}

Status Segmenter::AddContext(std::span<const int32_t> tokens, schema::Role role) {
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  if (schema::IsAction(role)) {
    return Status::InvalidArgument("segmenter: context tokens cannot have the action role " +
                                   std::string(schema::RoleName(role)));
  }
  for (int32_t token : tokens) {
    tokens_.push_back(token);
    roles_.push_back(role);
    log_probs_.push_back(0.0f);
    versions_.push_back(last_version_);
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

Status Segmenter::EndStep(float process_reward) {
  const int64_t position = length();
  if (position == 0 || (!steps_.empty() && steps_.back().first >= position)) {
    return Status::FailedPrecondition("segmenter: a step must end after the previous one");
  }
  steps_.emplace_back(position, process_reward);
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
  segment.routing.layers = static_cast<uint16_t>(options_.routing_layers);
  segment.routing.top_k = static_cast<uint16_t>(options_.routing_top_k);
  const size_t per_token = static_cast<size_t>(options_.routing_layers * options_.routing_top_k);
  const size_t expert_count = segment.ActionTokens() * per_token;
  segment.routing.experts.assign(experts_.begin(), experts_.begin() + expert_count);
  experts_.erase(experts_.begin(), experts_.begin() + expert_count);

  const int64_t end = begin_ + count;
  auto step = steps_.begin();
  for (; step != steps_.end() && step->first <= end; ++step) {
    segment.steps.push_back({static_cast<uint32_t>(step->first - begin_), step->second});
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
    float outcome_reward, std::vector<std::pair<std::string, std::string>> metadata) {
  if (finished_) return Status::FailedPrecondition("segmenter: trajectory already finished");
  if (length() == 0) return Status::FailedPrecondition("segmenter: the trajectory has no tokens");
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
