// A service's live view over HTTP: `/metrics` in the Prometheus text exposition format (0.0.4)
// and `/status` as JSON, served by Boost.Beast on one Asio thread of the service's process.
//
//   service threads ──(their own counters)──> page functions <── GET /metrics, GET /status
//                                                 ^
//                      StatusServer: accept, read one request, answer, close
//
// The server only reads: each request calls the page function for its path, which snapshots
// what the service already keeps (the replay server's StatsJson, the actor's metrics, the
// learner's last step). A slow or broken client holds one connection until its 5-second
// deadline and never the service: requests over 8 KiB, methods other than GET and HEAD, and
// unknown paths get 413, 405 and 404.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace strider::http {

struct Page {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Paths ("/metrics") to the functions that make their pages. They run on the server's thread,
// so what they read must be safe to read from another thread.
using Pages = std::map<std::string, std::function<Page()>>;

class StatusServer {
 public:
  // `bind` is HOST:PORT (PORT 0: a free one). InvalidArgument for a malformed address,
  // Unavailable when it cannot be bound.
  static Result<std::unique_ptr<StatusServer>> Start(const std::string& bind, Pages pages);
  virtual ~StatusServer() = default;  // stops
  virtual std::string address() const = 0;  // HOST:PORT as bound (a port 0 resolved)
  virtual void Stop() = 0;                   // idempotent
};

// One metrics page. Samples of one name form one family under one HELP and TYPE line, in the
// order the names first appeared. Names are made valid ([a-zA-Z_:][a-zA-Z0-9_:]*, other
// characters become '_'), label values escaped.
class MetricsText {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;
  // type: "gauge" or "counter" (a counter's name gets _total when it lacks it).
  void Add(const std::string& name, const std::string& type, const std::string& help,
           double value, const Labels& labels = {});
  // Every number and boolean of a JSON object as a gauge named prefix_key (nested objects'
  // keys joined by '_'), each with `labels`: how a service's metrics JSON reaches Prometheus.
  // A list of objects with a string "name" (tables) gives each entry's numbers with the label
  // name="<name>"; other strings and lists are left out (they are /status's). InvalidArgument
  // when `json` is not an object.
  Status AddJson(const std::string& prefix, const std::string& json, const Labels& labels = {});
  std::string Text() const;

 private:
  struct Family {
    std::string type, help;
    std::vector<std::string> samples;  // "name{labels} value"
    std::set<std::string> seen;        // "name{labels}" of those samples
  };
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
};

// GET http://ADDRESS/PATH (ADDRESS as address() gives it: HOST:PORT or [V6]:PORT) on the
// caller's `io`, so a supervisor on one Asio loop scrapes its children without a thread per
// request. `done` runs once, on `io`: the body of a 200 answer, or Unavailable naming the
// address (refused, no answer within `timeout` in all, another status, a body over 16 MiB);
// InvalidArgument for an address that is not numeric HOST:PORT. Nothing runs once `io` stops.
void AsyncGet(boost::asio::io_context& io, const std::string& address, const std::string& path,
              std::chrono::milliseconds timeout, std::function<void(Result<std::string>)> done);

inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";
inline constexpr const char* kJsonContentType = "application/json";

}  // namespace strider::http
