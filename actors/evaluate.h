// Held-out evaluation of a policy on an environment (`strider eval`, docs/actors.md
// "Evaluation").
//
// An evaluation is an actor run in-process: the same decode loop, engine, transcript and
// tool-call parsing as training (actors/actor.h), with an episode sink instead of a replay
// server, weights fixed for the whole run, and environment seeds from the evaluation stream
// (EvaluationSeed), which never meets the training stream. Problem i is group i of the run; with
// K samples per problem its K members share the problem and differ only in their random stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/actor.h"
#include "common/status.h"

namespace strider::actors {

struct EvaluateOptions {
  // Model, environment, max_turns, max_episode_tokens, sampling and engine settings. Its
  // episodes, group size, seed, replay, weight-stream and metrics fields are replaced: nothing
  // is streamed and the weights do not change during the run.
  ActorOptions actor;

  // --- Weights: exactly one ---
  std::string weights;           // a safetensors file, or
  std::string weights_endpoint;  // the newest version a WeightPublisher holds (FetchNewer(0))
  // How long to wait for a publisher that does not answer or has nothing published yet.
  std::chrono::milliseconds weights_timeout{30000};

  // --- What to play ---
  // Empty: the actor's environment. Otherwise it must equal the actor's environment name, or,
  // when the actor has none, names a built-in environment run with its default options.
  std::string env;
  int64_t episodes = 100;  // problems, each from the evaluation seed stream
  int64_t samples = 1;     // K episodes per problem
  uint64_t seed = 0;       // problem i resets with EvaluationSeed(seed, i)
  // Unset: greedy (0) with one sample; the actor's sampling temperature with K > 1. K > 1 at
  // temperature 0 is refused (the samples would be one episode K times).
  std::optional<double> temperature;
  // When set, every episode is appended to this file as one JSON line (problem, sample, seed,
  // status, outcome, and the exchange as text: EpisodeSummary::exchange), in episode order, so
  // what the policy wrote can be read next to the success rate.
  std::string episodes_out;
};

struct Interval {
  double low = 0;
  double high = 1;
};

struct EvalResult {
  std::string env;
  uint64_t policy_version = 0;
  std::string weights;   // the file or the endpoint
  int64_t episodes = 0;  // problems
  int64_t samples = 1;   // per problem
  uint64_t seed = 0;
  int64_t successes = 0;            // of episodes * samples
  double success_rate = 0;          // successes / (episodes * samples)
  Interval ci;                      // 95% Wilson interval on successes
  double reward_mean = 0;           // outcome reward, per episode
  std::optional<double> pass_at_k;  // samples > 1: mean over problems of PassAtK(K, c, K)
  double mean_turns = 0;
  double seconds = 0;  // playing time (the actor's Run), not model loading
  double temperature = 0;
  std::map<std::string, int64_t> endings;  // episode statuses (docs/actors.md) and counts
  // The episodes' seeds and sampled tokens chained in episode order: equal digests mean the
  // same episodes were played (a greedy rerun, the same weights from a file and a publisher).
  uint64_t digest = 0;

  // The `{"event":"eval",...}` line of the CLI contract (docs/actors.md), without a newline.
  std::string ToJson() const;
};

// Success: an episode ended by the environment (status done) with outcome reward >= 1.
inline bool IsSuccess(const EpisodeSummary& e) {
  return e.status == "done" && e.outcome_reward >= 1.0;
}

// The Wilson score interval for `successes` of `trials` at normal quantile `z` (1.96: 95%).
// Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or all
// successes. trials == 0 gives [0, 1].
Interval WilsonInterval(int64_t successes, int64_t trials, double z = 1.959963984540054);

// The unbiased pass@k estimator of Chen et al. 2021 for a problem with `correct` of `n`
// samples correct: 1 - C(n - c, k) / C(n, k), computed as a product so it does not overflow.
// Requires 0 <= correct <= n and 1 <= k <= n (InvalidArgument otherwise).
Result<double> PassAtK(int64_t n, int64_t correct, int64_t k);

// The statistics of `problems` x `samples` finished episodes (any order; members of a problem
// share EpisodeSummary::group) into `result`: successes, success rate and its Wilson interval,
// reward and turn means, endings, digest, and pass@K when samples > 1. Internal when the
// episodes are not exactly that many, in that many groups.
Status SummariseEpisodes(std::vector<EpisodeSummary> episodes, int64_t problems, int64_t samples,
                         EvalResult* result);

// One `{"event":"episode",...}` line per episode of `episodes`, in the order given, appended to
// `path`: problem, sample (the member within its problem), seed, status, outcome reward, turns
// and the exchange texts.
Status WriteEpisodes(const std::vector<EpisodeSummary>& episodes, const std::string& path);

// Checks the options, resolves the environment and weights, plays episodes * samples episodes
// and summarises them. InvalidArgument / NotFound for bad options (usage); other errors are
// runtime failures (no publisher, the engine failing).
Result<EvalResult> Evaluate(const EvaluateOptions& options);

}  // namespace strider::actors
