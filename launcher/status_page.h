// The launcher's live status page (docs/fleet.md, "Live status page"): what the launcher knows
// of its fleet, served over the same StatusServer the children use.
//
//   launcher loop (Asio) ── tick: children, merged line, scraped /status ──> FleetCurves
//          │                                                                    │
//          └──────── Publish(fleet.json, metrics text) ──> StatusBoard <── GET /, /fleet.json,
//                                                            (mutex)        /metrics (HTTP thread)
//
// The launcher's loop builds every page body; the HTTP thread only copies the last ones out
// under the board's mutex, so a slow browser never holds the loop and the loop never waits for
// the browser.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/transport/http_status.h"

namespace strider::launcher {

// The run's series for the page's plots. Learner rows are keyed by step, so the steps a resumed
// or restarted learner trains again replace their first rows; tick rows are this launch's.
// Not thread-safe: fed and read on the launcher's loop.
class FleetCurves {
 public:
  // A learner metrics row (docs/rl_learner.md): step, reward_mean, success_rate,
  // staleness_mean, tokens_per_second and, when the row has one, expert_load.
  void AddLearnerRow(const nlohmann::json& row);
  // A merged line of RUN_DIR/metrics.jsonl with `replay_fill` replaced by the freshest fill
  // known (the replay server's /status when scraped).
  void AddTick(const nlohmann::json& line);
  // An evaluation row of RUN_DIR/eval.jsonl (learner_step, success_rate, ci_low, ci_high).
  void AddEvalRow(const nlohmann::json& row);

  // {"learner": {"step": [...], "reward_mean": [...], ...}, "ticks": {"elapsed_s": [...],
  //  "learner_tokens_per_s": [...], "actor_tokens_per_s": [...], "replay_fill": {table: [...]}},
  //  "eval": {"learner_step": [...], "success_rate": [...], ...},
  //  "expert_load": {"step": S, "layers": [[tokens per expert], ...]} or null}.
  // Each series holds at most `max_points` points, evenly spaced over it, its last one included.
  nlohmann::json ToJson(size_t max_points) const;

 private:
  static constexpr const char* kLearnerKeys[] = {"reward_mean", "success_rate", "staleness_mean",
                                                 "tokens_per_second"};
  static constexpr const char* kEvalKeys[] = {"success_rate", "ci_low", "ci_high"};
  std::map<int64_t, nlohmann::json> learner_;  // step -> {key: value or null}
  std::vector<nlohmann::json> ticks_;          // {elapsed_s, tokens, fill}
  std::vector<nlohmann::json> evals_;
  nlohmann::json expert_load_;  // null until a row carries one
};

// The last page bodies the launcher published. Shared by the loop (Publish) and the HTTP thread
// (Pages), hence the mutex.
class StatusBoard {
 public:
  void Publish(std::string fleet_json, std::string metrics_text) EXCLUDES(mutex_);
  // "/" (the HTML page with the current fleet.json inline, polling it every `poll_ms`),
  // "/fleet.json" and "/metrics"; they keep the board alive.
  static http::Pages Pages(std::shared_ptr<StatusBoard> board, int poll_ms);

 private:
  Mutex mutex_;
  std::string fleet_json_ GUARDED_BY(mutex_) = "{}";
  std::string metrics_text_ GUARDED_BY(mutex_);
};

// The HTML page: no external assets; an inline script draws `fleet_json` at once and then
// polls fleet.json every `poll_ms`, drawing each answer as SVG.
std::string StatusPageHtml(const std::string& fleet_json, int poll_ms);

}  // namespace strider::launcher
