// The launcher's live status page during a real run (tiny fleet with `http: true`): its
// address in the ready line and http.json, /fleet.json carrying the learner's curves, every
// child's scraped /status and the expert load of the tiny model's three sparse layers, /metrics
// read by Debian's Prometheus parser, and the page itself opened in headless Chromium, whose DOM
// holds the plots' polylines and the heat map's cells and whose screenshot is a drawn page.
// Skips where /usr/bin/chromium is not installed (scripts/setup.sh installs it).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/child_process.h"
#include "tests/integration/png.h"
#include "tests/integration/tiny_fleet.h"
#include "tests/scratch_dir.h"
#include "tests/transport/http_get.h"

namespace strider {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using std::chrono::milliseconds;
using testing::ChildProcess;
using testing::HttpGet;
using testing::PortOf;
using testing::StriderBinary;
using testing::TempDir;
using testing::WaitEvent;

constexpr const char* kChromium = "/usr/bin/chromium";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Headless Chromium on `url`; its stdout.
std::string Chromium(const std::string& profile, const std::vector<std::string>& flags,
                     const std::string& url) {
  // The virtual time budget lets the page's script run (and its first poll answer) before the
  // DOM is dumped or the screenshot taken.
  std::vector<std::string> argv = {kChromium,
                                   "--headless=new",
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--no-first-run",
                                   "--user-data-dir=" + profile,
                                   "--virtual-time-budget=5000"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(url);
  testing::RunResult result = testing::RunCommand(argv);
  EXPECT_EQ(result.exit_code, 0) << "chromium " << flags[0] << ": "
                                 << result.output.substr(0, 2000);
  return result.output;
}

// Points of every polyline inside the <svg> elements of `dom` whose opening tag contains
// `marker`, with each svg's data-points checked against what it holds.
size_t PlottedPoints(const std::string& dom, const std::string& marker) {
  const std::regex polyline_re("<polyline[^>]* points=\"([^\"]*)\"[^>]*></polyline>");
  size_t total = 0;
  for (size_t at = dom.find("<svg"); at != std::string::npos; at = dom.find("<svg", at + 1)) {
    const std::string open = dom.substr(at, dom.find('>', at) - at);
    if (open.find(marker) == std::string::npos) continue;
    const std::string body = dom.substr(at, dom.find("</svg>", at) - at);
    size_t points = 0;
    for (auto p = std::sregex_iterator(body.begin(), body.end(), polyline_re);
         p != std::sregex_iterator(); ++p) {
      std::istringstream pairs((*p)[1].str());
      for (std::string pair; pairs >> pair;) {
        EXPECT_TRUE(std::regex_match(pair, std::regex("-?[0-9.]+,-?[0-9.]+"))) << pair;
        ++points;
      }
    }
    std::smatch declared;
    EXPECT_TRUE(std::regex_search(open, declared, std::regex("data-points=\"([0-9]+)\""))) << open;
    EXPECT_EQ(std::to_string(points), declared[1].str()) << open;
    total += points;
  }
  return total;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(LaunchPage, ChromiumShowsTheLiveFleet) {
  if (!fs::exists(kChromium)) {
    GTEST_SKIP() << kChromium << " is not installed (apt-get install chromium, or "
                 << "scripts/setup.sh): the launcher's page is not checked in a browser";
  }
  const auto started = std::chrono::steady_clock::now();
  TempDir dir;
  testing::WriteTinyFleetConfigs(
      dir, {.env_yaml = "env:\n  name: calculator\n  options: {difficulty: 1}\n"});
  const std::string run = dir.Sub("run");
  const std::string fleet = dir.Sub("fleet.yaml");
  // The wall-time rule only ends a run this test failed to stop.
  std::ofstream(fleet) << "run_dir: " << run << "\nhttp: true\n"
                       << "replay:\n  config: " << dir.Sub("replay.yaml") << "\n"
                       << "learner:\n  config: " << dir.Sub("learner.yaml") << "\n"
                       << "actors:\n  config: " << dir.Sub("actor.yaml") << "\n  count: 1\n"
                       << "stop:\n  wall_time_s: 300\n  grace_s: 30\n";
  ChildProcess launcher;
  ASSERT_TRUE(launcher.Start({StriderBinary(), "launch", fleet}, dir.Sub("launch.err")));
  const json ready = WaitEvent(launcher, "ready", 120000);
  ASSERT_TRUE(ready.is_object()) << ReadFile(dir.Sub("launch.err"));
  ASSERT_TRUE(ready.contains("http") && ready["http"].contains("launcher")) << ready.dump();
  const std::string address = ready["http"]["launcher"];
  EXPECT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
  EXPECT_EQ(json::parse(ReadFile(run + "/http.json"), nullptr, false).value("launcher", ""),
            address);
  const int port = PortOf(address);

  // Wait for three learner steps on the page, every child's /status scraped and the expert
  // load recorded: what the browser is then to draw.
  json page;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  const auto complete = [](const json& p) {
    if (!p.is_object() || p["curves"]["learner"]["step"].size() < 3) return false;
    if (!p["curves"]["expert_load"].is_object()) return false;
    if (p["curves"]["ticks"]["elapsed_s"].size() < 2) return false;
    for (const json& child : p["children"]) {
      if (child["role"] != "eval" && (!child["up"].get<bool>() || !child["status"].is_object())) {
        return false;
      }
    }
    return true;
  };
  while (std::chrono::steady_clock::now() < deadline) {
    const testing::HttpReply reply = HttpGet(port, "/fleet.json");
    ASSERT_EQ(reply.status, 200) << "the launcher's page stopped answering";
    page = json::parse(reply.body, nullptr, false);
    if (complete(page)) break;
    std::this_thread::sleep_for(milliseconds(500));
  }
  ASSERT_TRUE(complete(page)) << page.dump().substr(0, 4000) << "\n"
                              << ReadFile(run + "/logs/learner.log").substr(0, 4000);
  const double waited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // fleet.json: the children as the launcher and their own pages see them.
  std::map<std::string, json> children;
  for (const json& child : page["children"]) children[child["name"]] = child;
  ASSERT_EQ(children.size(), 3u) << page["children"].dump();
  EXPECT_EQ(children["learner"]["status"]["role"], "learner");
  EXPECT_EQ(children["actor-0"]["status"]["id"], "actor-0");
  EXPECT_TRUE(children["replay"]["status"]["metrics"]["tables"].is_array());
  for (const auto& [name, child] : children) {
    EXPECT_EQ(child["restarts"], 0) << name;
    EXPECT_GT(child["uptime_s"].get<double>(), 0) << name;
    EXPECT_EQ(child["http"], ready["http"][name]) << name;
  }
  // Curves: one point per learner step in every learner series, the ticks' replay fill.
  const json& learner = page["curves"]["learner"];
  for (const char* key : {"reward_mean", "success_rate", "staleness_mean", "tokens_per_second"}) {
    EXPECT_EQ(learner[key].size(), learner["step"].size()) << key;
  }
  EXPECT_TRUE(learner["tokens_per_second"].back().is_number());
  EXPECT_TRUE(page["curves"]["ticks"]["replay_fill"].contains("groups"))
      << page["curves"]["ticks"].dump();
  // Expert load: the tiny model's sparse layers 1-3, 8 routed experts each, top-2 routing, so
  // every layer routes the same tokens twice.
  const json& load = page["curves"]["expert_load"]["layers"];
  ASSERT_EQ(load.size(), 3u) << load.dump();
  int64_t first_sum = -1;
  for (const json& layer : load) {
    ASSERT_EQ(layer.size(), 8u);
    int64_t sum = 0;
    for (const json& count : layer) sum += count.get<int64_t>();
    EXPECT_GT(sum, 0);
    EXPECT_EQ(sum % 2, 0) << layer.dump();
    if (first_sum < 0) first_sum = sum;
    EXPECT_EQ(sum, first_sum) << load.dump();
  }

  // /metrics in the Prometheus format, with the children's health.
  const testing::HttpReply metrics = HttpGet(port, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  const json samples = testing::ParsePrometheus(metrics.body, dir.Sub("metrics"));
  ASSERT_FALSE(samples.contains("error")) << samples.dump() << "\n" << metrics.body;
  // The parser's keys: labels as Python's json.dumps(sort_keys=True) writes them.
  const std::string labels = "{\"id\": \"" + run + "\", \"role\": \"launcher\"}";
  EXPECT_EQ(samples.value("strider_launcher_children_up" + labels, -1.0), 3.0) << metrics.body;
  EXPECT_EQ(samples.value(
                "strider_launcher_child_restarts_total{\"child\": \"actor-0\", " + labels.substr(1),
                -1.0),
            0.0)
      << metrics.body;
  EXPECT_GE(samples.value("strider_launcher_learner_step" + labels, -1.0), 3.0);

  // The page in a browser. The DOM is what its script built: the plots' polylines (three steps
  // of reward and train success at least) and one heat map cell per layer and expert.
  const std::string url = "http://" + address + "/";
  std::string dom = Chromium(dir.Sub("profile"), {"--dump-dom"}, url);
  // What the script drew precedes the script, whose own text holds the same tags as templates.
  dom = dom.substr(0, dom.find("<script"));
  ASSERT_NE(dom.find("Fleet health"), std::string::npos) << dom.substr(0, 3000);
  const size_t all_points = PlottedPoints(dom, "class=\"plot\"");
  const std::string reward_plot = dom.substr(dom.find("<h3>Reward and success</h3>"));
  const size_t reward_points =
      PlottedPoints(reward_plot.substr(0, reward_plot.find("</svg>") + 6), "class=\"plot\"");
  EXPECT_GE(reward_points, 6u) << "reward and train success over three steps at least";
  EXPECT_GE(all_points, reward_points + 4u) << "staleness and throughput carry data too";
  EXPECT_NE(dom.find("data-cells=\"24\""), std::string::npos);
  EXPECT_EQ(Count(dom, "<rect class=\"cell\""), 24u);
  EXPECT_EQ(Count(dom, "<span class=\"up\">up</span>"), 3u) << "replay, learner and actor-0 up";

  // The screenshot: a drawn page, with the first series' blue (#0072B2) along its lines, far
  // more than the legend swatches' 14x4 pixels each.
  const std::string png = dir.Sub("page.png");
  Chromium(dir.Sub("profile"), {"--screenshot=" + png, "--window-size=1280,1600"}, url);
  if (const char* keep = std::getenv("STRIDER_PAGE_SCREENSHOT")) {
    fs::copy_file(png, keep, fs::copy_options::overwrite_existing);  // to look at it
  }
  testing::Image image;
  ASSERT_EQ(testing::DecodePng(ReadFile(png), &image), "");
  EXPECT_EQ(image.width, 1280u);
  EXPECT_EQ(image.height, 1600u);
  std::map<std::array<uint8_t, 3>, size_t> colors;
  for (const auto& p : image.pixels) ++colors[p];
  const size_t white = colors[{255, 255, 255}];
  const size_t blue = testing::CountColor(image, {0x00, 0x72, 0xB2});
  std::cout << "screenshot: " << colors.size() << " colours, " << blue << " pixels #0072B2, "
            << 100.0 * (image.pixels.size() - white) / image.pixels.size()
            << "% not white; page complete after " << waited_s << " s\n";
  EXPECT_GT(colors.size(), 50u) << "not a page of plots";
  EXPECT_LT(white, image.pixels.size() * 98 / 100) << "a blank page";
  EXPECT_GT(blue, 200u);

  launcher.Signal(SIGINT);
  const json finished = WaitEvent(launcher, "finished", 120000);
  ASSERT_TRUE(finished.is_object());
  EXPECT_EQ(finished["reason"], "signal");
  EXPECT_EQ(launcher.Wait(), 0);
  // The page goes with the launcher.
  EXPECT_EQ(HttpGet(port, "/fleet.json").status, 0);
}

}  // namespace
}  // namespace strider
