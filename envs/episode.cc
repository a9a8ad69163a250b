#include "envs/episode.h"

#include <chrono>
#include <random>
#include <utility>

#include "envs/tools.h"

namespace strider::envs {
namespace {

class RandomPolicy : public ScriptedPolicy {
 public:
  RandomPolicy(uint64_t seed, std::vector<ToolSpec> tools)
      : rng_(seed ^ 0x7a3dULL), tools_(std::move(tools)) {}

  Result<std::string> NextTurn(const std::vector<Observation>&) override {
    static const char* const kWords[] = {"let",   "me",   "think", "the",   "value", "is",
                                         "maybe", "next", "so",    "check", "part",  "cell"};
    std::string text;
    const int words = 1 + static_cast<int>(rng_() % 8);
    for (int i = 0; i < words; ++i) text += std::string(i ? " " : "") + kWords[rng_() % 12];
    const uint64_t roll = rng_() % 10;
    if (roll == 0) return text + " Answer: " + std::to_string(rng_() % 100);
    if (roll < 6) {
      const std::string name =
          tools_.empty() || rng_() % 5 == 0 ? "nosuchtool" : tools_[rng_() % tools_.size()].name;
      std::string arguments;
      static const char kChars[] = "0123456789+-*/(), abcxyz\"";
      const int length = static_cast<int>(rng_() % 12);
      for (int i = 0; i < length; ++i) arguments += kChars[rng_() % (sizeof(kChars) - 1)];
      switch (rng_() % 4) {
        case 0:  // missing closing marker
          return text + std::string(kToolCallOpen) + name + "(" + arguments + ")";
        case 1:  // missing parenthesis
          return text + std::string(kToolCallOpen) + name + " " + arguments +
                 std::string(kToolCallClose);
        default:
          return text + FormatToolCall(name, arguments);
      }
    }
    return text;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<ToolSpec> tools_;
};

}  // namespace

EpisodeReport PlayEpisode(Environment& env, ScriptedPolicy& policy, uint64_t seed, int max_turns,
                          const Options& episode_options, const StepCallback& on_step) {
  EpisodeReport report;
  report.seed = seed;
  const auto start = std::chrono::steady_clock::now();
  auto finish = [&](std::string end, bool error) {
    report.end = std::move(end);
    report.error = error;
    report.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(report);
  };
  Result<Observation> first = env.Reset(seed, episode_options);
  if (!first.ok()) return finish("reset: " + first.status().ToString(), true);
  report.observation_bytes += first->text.size();
  report.images += first->images.size();
  report.observations.push_back(std::move(*first));
  while (report.turns < max_turns) {
    Result<std::string> text = policy.NextTurn(report.observations);
    if (!text.ok()) return finish("policy: " + text.status().ToString(), true);
    Result<StepResult> step = env.Step(MakeAction(*text));
    ++report.turns;
    if (!step.ok()) return finish("step: " + step.status().ToString(), true);
    switch (step->label) {
      case StepLabel::kCorrect:
        ++report.correct;
        break;
      case StepLabel::kIncorrect:
        ++report.incorrect;
        break;
      case StepLabel::kUnknown:
        ++report.unknown;
        break;
    }
    report.observation_bytes += step->observation.text.size();
    report.images += step->observation.images.size();
    if (on_step) on_step(*step);
    report.observations.push_back(std::move(step->observation));
    if (step->done) {
      report.outcome = step->outcome_reward;
      auto reason = step->info.find("reason");
      return finish(reason == step->info.end() ? "done" : reason->second, false);
    }
  }
  return finish("turn limit", false);
}

std::unique_ptr<ScriptedPolicy> MakeRandomPolicy(uint64_t seed, std::vector<ToolSpec> tools) {
  return std::make_unique<RandomPolicy>(seed, std::move(tools));
}

}  // namespace strider::envs
