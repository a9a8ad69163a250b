// The `--http HOST:PORT` of the long-running commands (replay serve, actor, learner): /metrics
// and /status over the JSON each service already keeps (docs/fleet.md, "Live metrics").
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "common/transport/http_status.h"

namespace strider::cli {

// `json` returns the service's metrics object now; it is called on the HTTP thread.
//   /metrics  every number of it as a gauge strider_<role>_<key> labelled {id="<id>"}, and
//             strider_up, strider_uptime_seconds
//   /status   {"role", "id", "uptime_s", "metrics": <json>}
// Nothing is started when `bind` is empty (returns null).
Result<std::unique_ptr<http::StatusServer>> ServeStatusPages(const std::string& bind,
                                                            const std::string& role,
                                                            const std::string& id,
                                                            std::function<std::string()> json);

}  // namespace strider::cli
