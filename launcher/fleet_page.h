// The launcher's status page (fleet `http`, docs/fleet.md "Live status page"): the children's
// /status pages scraped on the launcher's loop, the run's curves, and the page bodies rebuilt
// for the StatusBoard (status_page.h) whenever what they show changed.
#pragma once

// clang-format off
#include <utility>  // before Boost.Asio: its awaitable.hpp uses std::exchange without including it
// clang-format on

#include <boost/asio/io_context.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/transport/http_status.h"
#include "launcher/child_process.h"
#include "launcher/status_page.h"

namespace strider::launcher {

// What the page shows of the launcher itself, as the Supervisor knows it now.
struct FleetState {
  std::string run_dir;
  std::string phase;   // starting | running | stopping | final evaluation | done
  std::string reason;  // why the run stops, or ""
  double elapsed_s = 0;
  nlohmann::json http;    // {role: "HOST:PORT"}
  nlohmann::json latest;  // the merged metrics line
};

class FleetPage {
 public:
  // The curves are kept whether or not a page is served (Start), so a page started late would
  // still show them; without one they cost a row per learner step.
  void AddLearnerRow(const nlohmann::json& row) { curves_.AddLearnerRow(row); }
  void AddEvalRow(const nlohmann::json& row) { curves_.AddEvalRow(row); }
  // A tick's merged line, its replay fill replaced by the replay server's own when it answered
  // its last scrape: that is current, where its log's stats line comes every
  // server.stats_interval_s, if at all.
  void AddTick(const nlohmann::json& line, const Child& replay);

  // Serves the page on `address` (numeric HOST:PORT), showing `state` from the first request,
  // with the evaluations of RUN_DIR/eval.jsonl an earlier launch recorded on its curve. Errors:
  // the server's, naming status_page.
  Status Start(const std::string& address, const std::filesystem::path& run_dir,
               const FleetState& state, const std::vector<std::unique_ptr<Child>>& children);
  bool serving() const { return board_ != nullptr; }
  // HOST:PORT the page is served on; "" before Start.
  const std::string& address() const { return address_; }

  // Fetches /status of each running child that serves pages and has no fetch in flight;
  // `changed` runs after each answer (or failure) of a current start.
  void Scrape(boost::asio::io_context& io, const std::vector<std::unique_ptr<Child>>& children,
              std::function<void()> changed);
  // Rebuilds the page bodies; nothing without Start.
  void Publish(const FleetState& state, const std::vector<std::unique_ptr<Child>>& children);

 private:
  nlohmann::json FleetJson(const FleetState& state,
                           const std::vector<std::unique_ptr<Child>>& children) const;
  std::string MetricsText(const FleetState& state,
                          const std::vector<std::unique_ptr<Child>>& children) const;

  FleetCurves curves_;
  std::shared_ptr<StatusBoard> board_;
  std::unique_ptr<http::StatusServer> server_;
  std::string address_;
};

}  // namespace strider::launcher
