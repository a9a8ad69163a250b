// The services' HTTP pages: a real Beast server on a loopback port, read by a plain-socket client,
// and the metrics text read by Debian's Prometheus parser.
#include "common/transport/http_status.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "tests/scratch_dir.h"
#include "tests/transport/http_get.h"

namespace strider::http {
namespace {

using testing::HttpGet;
using testing::ParsePrometheus;
using testing::PortOf;
using testing::RawHttp;

// A path prefix in this program's scratch directory.
std::string Scratch(const std::string& name) {
  static const std::string dir = testing::ScratchDir("strider_http_status_test");
  return dir + "/" + name;
}

TEST(StatusServer, ServesItsPagesAndRefusesWhatItDoesNotServe) {
  std::atomic<int> calls{0};
  Pages pages;
  pages["/metrics"] = [&] {
    ++calls;
    return Page{200, kPrometheusContentType, "strider_up 1\n"};
  };
  pages["/status"] = [] { return Page{200, kJsonContentType, "{\"ok\":true}\n"}; };
  pages["/broken"] = []() -> Page { throw std::runtime_error("no data"); };
  Result<std::unique_ptr<StatusServer>> server = StatusServer::Start("127.0.0.1:0", pages);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = PortOf((*server)->address());
  ASSERT_GT(port, 0);

  testing::HttpReply metrics = HttpGet(port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.body, "strider_up 1\n");
  EXPECT_NE(metrics.headers.find("text/plain; version=0.0.4"), std::string::npos) << metrics.headers;
  EXPECT_EQ(HttpGet(port, "/status?pretty=1").body, "{\"ok\":true}\n");  // the query is ignored

  testing::HttpReply missing = HttpGet(port, "/nothing");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.body.find("/metrics"), std::string::npos) << "names the pages it has";
  EXPECT_EQ(RawHttp(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").status,
            405);
  testing::HttpReply head = RawHttp(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_NE(head.headers.find("Content-Length: 13"), std::string::npos) << head.headers;
  EXPECT_EQ(RawHttp(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(9000, 'a') +
                              "\r\n\r\n")
                .status,
            413);
  EXPECT_EQ(RawHttp(port, "this is not http\r\n\r\n").status, 0);  // closed without an answer
  testing::HttpReply broken = HttpGet(port, "/broken");
  EXPECT_EQ(broken.status, 500);
  EXPECT_NE(broken.body.find("no data"), std::string::npos);

  // A client that connects and says nothing holds its own connection, not the server.
  const int idle = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(idle, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const auto before = std::chrono::steady_clock::now();
  EXPECT_EQ(HttpGet(port, "/metrics").status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(2));
  ::close(idle);
  EXPECT_EQ(calls.load(), 3);

  (*server)->Stop();
  (*server)->Stop();  // idempotent
  EXPECT_EQ(HttpGet(port, "/metrics").status, 0);
}

TEST(StatusServer, RefusesBadAddressesAndAPortInUse) {
  for (const std::string bind : {"", "localhost", ":80", "127.0.0.1:", "127.0.0.1:70000",
                                 "127.0.0.1:http", "not-an-ip:0"}) {
    Result<std::unique_ptr<StatusServer>> server = StatusServer::Start(bind, {});
    ASSERT_FALSE(server.ok()) << bind;
    EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << server.status().ToString();
    EXPECT_NE(server.status().message().find(bind), std::string::npos)
        << server.status().ToString();
  }
  Result<std::unique_ptr<StatusServer>> first = StatusServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(first.ok());
  Result<std::unique_ptr<StatusServer>> second = StatusServer::Start((*first)->address(), {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().ToString();
}

// The launcher's scrapes: on the caller's loop, every outcome through the callback, once.
TEST(AsyncGet, AnswersOnTheCallersLoopWithTheBodyOrWhyNot) {
  Pages pages;
  pages["/status"] = [] { return Page{200, kJsonContentType, "{\"role\":\"actor\"}\n"}; };
  pages["/slow"] = [] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    return Page{200, "text/plain", "late\n"};
  };
  Result<std::unique_ptr<StatusServer>> server = StatusServer::Start("127.0.0.1:0", pages);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string address = (*server)->address();
  // A port nothing listens on: this server's, once it is stopped.
  Result<std::unique_ptr<StatusServer>> gone = StatusServer::Start("127.0.0.1:0", {});
  ASSERT_TRUE(gone.ok());
  const std::string gone_address = (*gone)->address();
  (*gone)->Stop();

  boost::asio::io_context io;
  std::map<std::string, std::vector<Result<std::string>>> answers;
  const auto ask = [&](const std::string& name, const std::string& at, const std::string& path,
                       int timeout_ms) {
    AsyncGet(io, at, path, std::chrono::milliseconds(timeout_ms),
             [&answers, name](Result<std::string> body) { answers[name].push_back(body); });
  };
  ask("ok", address, "/status", 5000);
  ask("missing", address, "/nothing", 5000);
  ask("refused", gone_address, "/status", 5000);
  ask("slow", address, "/slow", 200);
  ask("malformed", "localhost:80", "/status", 5000);
  EXPECT_TRUE(answers.empty()) << "answered before the loop ran";
  io.run();
  for (const char* name : {"ok", "missing", "refused", "slow", "malformed"}) {
    ASSERT_EQ(answers[name].size(), 1u) << name;
  }
  ASSERT_TRUE(answers["ok"][0].ok()) << answers["ok"][0].status().ToString();
  EXPECT_EQ(*answers["ok"][0], "{\"role\":\"actor\"}\n");
  EXPECT_EQ(answers["missing"][0].status().code(), StatusCode::kUnavailable);
  EXPECT_NE(answers["missing"][0].status().message().find("status 404"), std::string::npos);
  EXPECT_EQ(answers["refused"][0].status().code(), StatusCode::kUnavailable);
  EXPECT_NE(answers["refused"][0].status().message().find(gone_address), std::string::npos);
  EXPECT_EQ(answers["slow"][0].status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(answers["malformed"][0].status().code(), StatusCode::kInvalidArgument);
}

TEST(MetricsText, ParsesAsPrometheusTextWithValidNamesAndEscapedLabels) {
  MetricsText metrics;
  metrics.Add("strider_up", "gauge", "1 while serving\nand a second line", 1.0,
              {{"role", "actor"}, {"id", "a \"quoted\" \\ id\nwith a newline"}});
  metrics.Add("replay.segments-stored", "counter", "", 1234567890123.0);
  metrics.Add("9lives", "gauge", "", -0.25);
  metrics.Add("9.lives", "gauge", "", 7.0);  // cleans up to the same name: the first stays
  metrics.Add("strider_up", "gauge", "ignored: the family has its help", 0.0, {{"role", "learner"}});
  ASSERT_TRUE(metrics
                  .AddJson("strider_actor",
                           R"({"episodes": 12, "replay_connected": true, "errors": {"max_turns": 3,
                               "env-timeout": 1}, "id": "text is left out", "list": [1, 2],
                               "queues": {"live_episodes": 4},
                               "tables": [{"name": "groups", "fill": 0.5}, {"fill": 2}]})",
                           {{"id", "actor-0"}})
                  .ok());
  EXPECT_FALSE(metrics.AddJson("x", "[1, 2]").ok());
  EXPECT_FALSE(metrics.AddJson("x", "{not json").ok());
  const std::string text = metrics.Text();
  // One HELP/TYPE per family, its samples together.
  EXPECT_EQ(text.find("# TYPE strider_up gauge"), text.rfind("# TYPE strider_up gauge")) << text;

  const nlohmann::json parsed = ParsePrometheus(text, Scratch("parse"));
  ASSERT_FALSE(parsed.contains("error")) << parsed.dump() << "\n" << text;
  EXPECT_EQ(parsed.value(R"(strider_up{"id": "a \"quoted\" \\ id\nwith a newline", "role": "actor"})",
                         -1.0),
            1.0)
      << parsed.dump();
  EXPECT_EQ(parsed.value(R"(strider_up{"role": "learner"})", -1.0), 0.0) << parsed.dump();
  EXPECT_EQ(parsed.value("replay_segments_stored_total{}", -1.0), 1234567890123.0) << parsed.dump();
  EXPECT_EQ(parsed.value("_lives{}", 0.0), -0.25) << parsed.dump();
  EXPECT_EQ(parsed.value(R"(strider_actor_episodes{"id": "actor-0"})", -1.0), 12.0);
  EXPECT_EQ(parsed.value(R"(strider_actor_replay_connected{"id": "actor-0"})", -1.0), 1.0);
  EXPECT_EQ(parsed.value(R"(strider_actor_errors_max_turns{"id": "actor-0"})", -1.0), 3.0);
  EXPECT_EQ(parsed.value(R"(strider_actor_errors_env_timeout{"id": "actor-0"})", -1.0), 1.0);
  EXPECT_EQ(parsed.value(R"(strider_actor_queues_live_episodes{"id": "actor-0"})", -1.0), 4.0);
  EXPECT_EQ(parsed.value(R"(strider_actor_tables_fill{"id": "actor-0", "name": "groups"})", -1.0),
            0.5);
  EXPECT_EQ(text.find("} 2\n"), std::string::npos) << "an unnamed entry is left out:\n" << text;
  EXPECT_FALSE(text.find("strider_actor_id") != std::string::npos) << text;
  EXPECT_FALSE(text.find("strider_actor_list") != std::string::npos) << text;

  // The parser is a real one: it refuses what the format does not allow.
  EXPECT_TRUE(ParsePrometheus("bad name 1\n", Scratch("bad")).contains("error"));
}

}  // namespace
}  // namespace strider::http
