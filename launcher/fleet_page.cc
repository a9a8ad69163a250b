#include "launcher/fleet_page.h"

#include <chrono>
#include <fstream>

#include "launcher/fleet_metrics.h"

namespace strider::launcher {
namespace {

using nlohmann::json;

// How often the browser polls, how long a child's /status may take, and how many points each
// plotted series sends.
constexpr int kPagePollMs = 2000;
constexpr auto kScrapeTimeout = std::chrono::milliseconds(1500);
constexpr size_t kPagePoints = 1000;

}  // namespace

void FleetPage::AddTick(const json& line, const Child& replay) {
  json tick = line;
  if (replay.last_status.is_object() && replay.last_status.contains("metrics")) {
    json fill = ReplayFill(replay.last_status["metrics"]);
    if (!fill.is_null()) tick["replay_fill"] = std::move(fill);
  }
  curves_.AddTick(tick);
}

Status FleetPage::Start(const std::string& address, const std::filesystem::path& run_dir,
                        const FleetState& state,
                        const std::vector<std::unique_ptr<Child>>& children) {
  // A resumed run's earlier evaluations belong on its curve; its learner rows come with the
  // metrics, which read the learner's file from the start.
  std::ifstream earlier(run_dir / "eval.jsonl");
  for (std::string line; std::getline(earlier, line);) {
    curves_.AddEvalRow(json::parse(line, nullptr, false));
  }
  board_ = std::make_shared<StatusBoard>();
  Publish(state, children);
  Result<std::unique_ptr<http::StatusServer>> server =
      http::StatusServer::Start(address, StatusBoard::Pages(board_, kPagePollMs));
  if (!server.ok()) {
    return Status(server.status().code(), "status_page: " + server.status().message());
  }
  server_ = std::move(server).value();
  address_ = server_->address();
  return Status::Ok();
}

void FleetPage::Scrape(boost::asio::io_context& io,
                       const std::vector<std::unique_ptr<Child>>& children,
                       std::function<void()> changed) {
  for (const auto& owned : children) {
    Child& child = *owned;
    if (child.http.empty() || child.scraping || !child.running()) continue;
    child.scraping = true;
    const uint64_t generation = child.generation;
    http::AsyncGet(io, child.http, "/status", kScrapeTimeout,
                   [&child, generation, changed](Result<std::string> body) {
                     child.scraping = false;
                     if (generation != child.generation) return;  // an earlier start's pages
                     if (!body.ok()) {
                       child.scrape_error = body.status().message();
                     } else if (json status = json::parse(*body, nullptr, false);
                                status.is_object()) {
                       child.last_status = std::move(status);
                       child.scrape_error.clear();
                     } else {
                       child.scrape_error = "its /status is not a JSON object";
                     }
                     changed();
                   });
  }
}

json FleetPage::FleetJson(const FleetState& state,
                          const std::vector<std::unique_ptr<Child>>& children) const {
  json rows = json::array();
  for (const auto& owned : children) {
    const Child& child = *owned;
    // An evaluation prints no ready line: it is up while it runs.
    const bool up = child.running() && (child.ready || child.role == Role::kEval);
    rows.push_back(
        {{"name", child.name},
         {"role", RoleName(child.role)},
         {"running", child.running()},
         {"up", up},
         {"pid", child.running() ? json(child.pid) : json(nullptr)},
         {"restarts", child.restarts},
         {"uptime_s",
          child.running()
              ? json(std::chrono::duration<double>(Clock::now() - child.started_at).count())
              : json(nullptr)},
         {"http", child.http.empty() ? json(nullptr) : json(child.http)},
         {"status", child.last_status},
         {"scrape_error", child.scrape_error.empty() ? json(nullptr) : json(child.scrape_error)}});
  }
  return {{"run_dir", state.run_dir},
          {"phase", state.phase},
          {"reason", state.reason.empty() ? json(nullptr) : json(state.reason)},
          {"elapsed_s", state.elapsed_s},
          {"http", state.http},
          {"latest", state.latest},
          {"children", std::move(rows)},
          {"curves", curves_.ToJson(kPagePoints)}};
}

std::string FleetPage::MetricsText(const FleetState& state,
                                   const std::vector<std::unique_ptr<Child>>& children) const {
  http::MetricsText metrics;
  const http::MetricsText::Labels labels = {{"role", "launcher"}, {"id", state.run_dir}};
  metrics.Add("strider_up", "gauge", "1 while the service serves", 1.0, labels);
  metrics.Add("strider_uptime_seconds", "gauge", "seconds since the service started",
              state.elapsed_s, labels);
  int64_t up = 0;
  for (const auto& child : children) {
    if (child->role != Role::kEval && child->running() && child->ready) ++up;
  }
  metrics.Add("strider_launcher_children_up", "gauge",
              "replay server, learner and actors running and ready", static_cast<double>(up),
              labels);
  for (const auto& child : children) {
    if (child->role == Role::kEval) continue;
    http::MetricsText::Labels with_child = labels;
    with_child.emplace_back("child", child->name);
    metrics.Add("strider_launcher_child_up", "gauge", "1 while the child runs and is ready",
                child->running() && child->ready ? 1.0 : 0.0, with_child);
    metrics.Add("strider_launcher_child_restarts", "counter",
                "restarts of the child's role in this launch", static_cast<double>(child->restarts),
                with_child);
  }
  json merged = state.latest;
  merged.erase("restarts");  // per child above, with the label
  // Cannot fail: AddJson refuses only text that is not a JSON object, and `merged` is one.
  (void)metrics.AddJson("strider_launcher", merged.dump(), labels);
  return metrics.Text();
}

void FleetPage::Publish(const FleetState& state,
                        const std::vector<std::unique_ptr<Child>>& children) {
  if (!board_) return;
  board_->Publish(FleetJson(state, children).dump() + "\n", MetricsText(state, children));
}

}  // namespace strider::launcher
