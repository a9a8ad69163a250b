#include "cli/service_http.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

namespace strider::cli {

Result<std::unique_ptr<http::StatusServer>> ServeStatusPages(const std::string& bind,
                                                            const std::string& role,
                                                            const std::string& id,
                                                            std::function<std::string()> json) {
  if (bind.empty()) return std::unique_ptr<http::StatusServer>();
  const auto started = std::chrono::steady_clock::now();
  auto uptime = [started] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };
  const http::MetricsText::Labels labels = {{"role", role}, {"id", id}};
  http::Pages pages;
  pages["/metrics"] = [=] {
    http::MetricsText metrics;
    metrics.Add("strider_up", "gauge", "1 while the service serves", 1.0, labels);
    metrics.Add("strider_uptime_seconds", "gauge", "seconds since the service started", uptime(),
                labels);
    const Status added = metrics.AddJson("strider_" + role, json(), labels);
    if (!added.ok()) return http::Page{500, "text/plain", added.ToString() + "\n"};
    return http::Page{200, http::kPrometheusContentType, metrics.Text()};
  };
  pages["/status"] = [=] {
    nlohmann::json status = {{"role", role}, {"id", id}, {"uptime_s", uptime()}};
    status["metrics"] = nlohmann::json::parse(json(), nullptr, false);
    return http::Page{200, http::kJsonContentType, status.dump() + "\n"};
  };
  STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<http::StatusServer> server,
                           http::StatusServer::Start(bind, std::move(pages)));
  spdlog::info("{} {}: /metrics and /status on http://{}", role, id, server->address());
  return server;
}

}  // namespace strider::cli
