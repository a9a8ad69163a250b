// Builders of realistic segments for replay tests and the benchmark.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "common/random.h"
#include "common/schema/messages.h"
#include "common/tokenizer.h"

namespace strider::testing {

inline schema::TrajectoryId MakeTrajectoryId(uint64_t seed) {
  schema::TrajectoryId id;
  std::mt19937_64 rng(seed * kSplitMix64Increment + 1);
  for (auto& b : id.bytes) b = static_cast<uint8_t>(rng());
  return id;
}

// A segment of a tool-using conversation: a user turn then model turns with tool calls and
// results, `tokens` long, with a routing record of its action tokens (2 layers, top-2), one step
// per 256 tokens, and the group and sampling fields of schema 1.2.
inline schema::SegmentData MakeSegment(uint64_t trajectory_seed, uint32_t index, size_t tokens,
                                       uint64_t policy_version = 1, bool is_last = false,
                                       const std::string& env = "calculator") {
  schema::SegmentData s;
  s.trajectory_id = MakeTrajectoryId(trajectory_seed);
  s.segment_index = index;
  s.is_last = is_last;
  s.token_begin = uint64_t{index} * tokens;
  s.env = env;
  std::mt19937 rng(static_cast<uint32_t>(trajectory_seed * 131 + index));
  const std::string user_text = "what is 17 * 23? trajectory " + std::to_string(trajectory_seed);
  for (size_t i = 0; i < tokens; ++i) {
    schema::Role role;
    int32_t token;
    const size_t turn = (i / 64) % 4;
    if (i < user_text.size()) {
      role = schema::Role::kUser;
      token = static_cast<unsigned char>(user_text[i]);
    } else if (turn == 3) {
      role = schema::Role::kToolResult;
      token = '0' + static_cast<int32_t>(rng() % 10);
    } else if (turn == 2) {
      role = schema::Role::kToolCall;
      token = 'a' + static_cast<int32_t>(rng() % 26);
    } else {
      role = schema::Role::kModel;
      token = 'a' + static_cast<int32_t>(rng() % 26);
    }
    s.tokens.push_back(token);
    s.roles.push_back(role);
    s.behaviour_logprobs.push_back(schema::IsAction(role) ? -0.25f * (1 + rng() % 8) : 0.0f);
  }
  s.policy_runs.push_back({0, policy_version});
  if (tokens > 8) s.policy_runs.push_back({static_cast<uint32_t>(tokens / 2), policy_version + 1});
  s.routing.layers = 2;
  s.routing.top_k = 2;
  const size_t experts = s.ActionTokens() * 4;
  for (size_t i = 0; i < experts; ++i) {
    s.routing.experts.push_back(static_cast<uint16_t>(rng() % 64));
  }
  uint32_t previous_end = 0;
  for (size_t end = 128; end <= tokens; end += 256) {
    schema::Step step{static_cast<uint32_t>(end), 0.125f * static_cast<float>(end % 7)};
    step.index = index * 16 + static_cast<uint32_t>(s.steps.size());
    step.begin = s.token_begin + previous_end + 1;
    step.label = static_cast<schema::StepLabel>(s.steps.size() % 3);
    s.steps.push_back(step);
    previous_end = step.end;
  }
  if (is_last) {
    s.outcome_reward = 1.0f + static_cast<float>(trajectory_seed % 3);
    s.end_reason = schema::EndReason::kFinished;
  }
  // Groups of 4 consecutive trajectory seeds, sampled at temperature 0.7 with top-p 0.9.
  s.group_id = MakeTrajectoryId(1000003 + trajectory_seed / 4);
  s.group_index = static_cast<uint32_t>(trajectory_seed % 4);
  s.group_size = 4;
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  s.top_k = 50;
  s.metadata.push_back({"prompt_id", std::to_string(trajectory_seed % 5)});
  s.state_digest = std::string(8, static_cast<char>(index));
  return s;
}

// Routing records for the context tokens too: every one, or (masked) every third one.
inline void AddContextRouting(schema::SegmentData& s, bool masked) {
  const size_t per_token = size_t{s.routing.layers} * s.routing.top_k;
  s.routing.coverage = masked ? schema::RoutingCoverage::kMasked : schema::RoutingCoverage::kAll;
  s.routing.context_experts.clear();
  s.routing.mask.assign(masked ? (s.tokens.size() + 7) / 8 : 0, 0);
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const bool action = schema::IsAction(s.roles[i]);
    const bool record = action || !masked || i % 3 == 0;
    if (masked && record) s.routing.mask[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    if (action || !record) continue;
    for (size_t j = 0; j < per_token; ++j) {
      s.routing.context_experts.push_back(static_cast<uint16_t>((i * 7 + j) % 64));
    }
  }
}

inline void AddImage(schema::SegmentData& s, uint32_t offset, uint32_t w, uint32_t h) {
  schema::Image image;
  image.token_offset = offset;
  image.width = w;
  image.height = h;
  image.channels = 3;
  image.pixels.resize(size_t{w} * h * 3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<char>(i * 7);
  s.images.push_back(std::move(image));
}

}  // namespace strider::testing
