// Load and soak (docs/reliability.md, "Soak"): one `strider replay serve`, two real `strider
// actor` processes (tiny model, calculator) and 32 stand-in actors (threads of this test, each
// with its own replay client and connection, streaming 4-segment trajectories of about 4 KiB
// segments at a fixed pace) plus one sampling learner, on loopback, for a bounded time.
//
// Every 5 s the harness reads the resident memory and open descriptors of the server and the
// real actors (/proc) and the segments acknowledged to the stand-ins. The first fifth of the run
// warms up (RocksDB's memtables and caches fill); after it, what must hold:
//   - resident memory flat: each service ends within 25% + 32 MiB of its reading at the end of
//     the warm-up (the server runs with small memtable and block-cache budgets and retention,
//     as an operator sets them for a long run, so the short run plateaus within the warm-up
//     too; growth past that is a leak);
//   - no descriptor growth: each service ends with at most 4 more than after the warm-up (the
//     server: plus the table files it may hold open, max_open_files);
//   - ingest stable: the stand-ins' acknowledged rate over the last window (a fifth of the run)
//     is at least half of that over the second, and no stand-in saw an error;
//   - the store verifies, the server stored every acknowledged segment, and retention kept the
//     store at its 20,000 segments.
// One JSON line on stdout sums it up (start and end figures per service, rates per window).
//
// STRIDER_SOAK_SECONDS (default 40) and STRIDER_SOAK_SEED (default 1) choose the run;
// scripts/soak.sh runs the 10-minute one.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/process_memory.h"
#include "replay/client.h"
#include "replay/inspect.h"
#include "tests/integration/child_process.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using namespace std::chrono_literals;
using strider::testing::ChildProcess;
using strider::testing::EnvInt;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

constexpr int kStandIns = 32;
constexpr int kRealActors = 2;
constexpr int kSegmentsPerTrajectory = 4;
constexpr auto kStandInPeriod = 100ms;  // per stand-in: 10 segments/s, 320/s in all
constexpr auto kReadingPeriod = 5s;
constexpr int kMemtableMb = 32;
constexpr int kBlockCacheMb = 16;
constexpr int kMaxOpenFiles = 16;

int64_t OpenDescriptorsOf(pid_t pid) {
  DIR* dir = ::opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (dir == nullptr) return 0;
  int64_t count = 0;
  while (dirent* entry = ::readdir(dir)) count += entry->d_name[0] != '.' ? 1 : 0;
  ::closedir(dir);
  return count;
}

// Segments of a stand-in's trajectories: random tokens, roles and log-probs, ~4 KiB each.
schema::SegmentData StandInSegment(std::mt19937_64& rng, const schema::TrajectoryId& id,
                                   uint32_t index) {
  schema::SegmentData s;
  s.trajectory_id = id;
  s.segment_index = index;
  s.token_begin = uint64_t{index} * 400;
  s.is_last = index + 1 == kSegmentsPerTrajectory;
  if (s.is_last) {
    s.end_reason = schema::EndReason::kFinished;
    s.outcome_reward = static_cast<float>(rng() % 2);
  }
  s.env = "soak";
  s.policy_runs.push_back({0, 1});
  s.tokens.resize(400);
  s.roles.resize(400);
  s.behaviour_logprobs.resize(400);
  for (size_t t = 0; t < 400; ++t) {
    const uint64_t r = rng();
    s.tokens[t] = static_cast<int32_t>(r & 0xFF);
    s.roles[t] = t < 100 ? schema::Role::kUser : schema::Role::kModel;
    s.behaviour_logprobs[t] = t < 100 ? 0.0f : -static_cast<float>((r >> 32) & 0xFFFF) / 1e4f;
  }
  return s;
}

struct StandInTotals {
  std::atomic<uint64_t> acked{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> sampled{0};
};

void RunStandIn(int index, uint64_t seed, const std::string& endpoint,
                const std::atomic<bool>& stop, StandInTotals* totals, std::string* failure) {
  replay::ActorClientOptions options;
  options.endpoint = endpoint;
  options.client_id = "stand-in-" + std::to_string(index);
  Result<std::unique_ptr<replay::ActorClient>> client = replay::ActorClient::Connect(options);
  if (!client.ok()) {
    *failure = client.status().ToString();
    return;
  }
  std::mt19937_64 rng(seed * 1000 + index);
  auto next = std::chrono::steady_clock::now();
  uint64_t acked_before = 0;
  while (!stop) {
    schema::TrajectoryId id;
    for (auto& b : id.bytes) b = static_cast<uint8_t>(rng());
    for (uint32_t i = 0; i < kSegmentsPerTrajectory && !stop; ++i) {
      if (Status sent = (*client)->Send(StandInSegment(rng, id, i)); !sent.ok()) {
        *failure = sent.ToString();
        return;
      }
      next += kStandInPeriod;
      std::this_thread::sleep_until(next);
      (void)(*client)->TakeAcked();
      totals->errors += (*client)->TakeErrors().size();
      totals->acked += (*client)->acked_count() - acked_before;
      acked_before = (*client)->acked_count();
    }
  }
  if (Status flushed = (*client)->Flush(30s); !flushed.ok()) *failure = flushed.ToString();
  totals->errors += (*client)->TakeErrors().size();
  totals->acked += (*client)->acked_count() - acked_before;
}

void RunSampler(const std::string& endpoint, const std::atomic<bool>& stop,
                StandInTotals* totals, std::string* failure) {
  replay::LearnerClientOptions options;
  options.endpoint = endpoint;
  options.learner_id = "soak-learner";
  Result<std::unique_ptr<replay::LearnerClient>> client = replay::LearnerClient::Connect(options);
  if (!client.ok()) {
    *failure = client.status().ToString();
    return;
  }
  for (uint64_t step = 1; !stop; ++step) {
    Result<replay::SampleBatch> batch = (*client)->Sample(step, 16, 1, 2s);
    if (batch.ok()) {
      totals->sampled += batch->items.size();
    } else if (batch.status().code() != StatusCode::kResourceExhausted) {
      *failure = batch.status().ToString();
      return;
    }
    std::this_thread::sleep_for(200ms);
  }
}

struct Reading {
  double at_s = 0;
  uint64_t acked = 0;
  nlohmann::json server_memory;  // the server's own account (stats "memory")
  std::vector<int64_t> rss;  // server, then the real actors
  std::vector<int64_t> fds;
};

TEST(Soak, StreamingFleetKeepsMemoryDescriptorsAndIngestFlat) {
  const int64_t seconds = EnvInt("STRIDER_SOAK_SECONDS", 40);
  const uint64_t seed = static_cast<uint64_t>(EnvInt("STRIDER_SOAK_SEED", 1));
  TempDir dir;
  // Small memory bounds and retention, as an operator sets them for a long-running server, so
  // that even the short run reaches its plateau within the warm-up.
  std::ofstream(dir.Sub("replay.yaml"))
      << "server:\n  stats_interval_s: 0\n  memtable_mb: " << kMemtableMb
      << "\n  block_cache_mb: " << kBlockCacheMb << "\n  max_open_files: " << kMaxOpenFiles
      << "\ntables:\n  - name: soak\n    sampler: uniform\n    capacity: 10000\n"
      << "    retention: {max_segments: 20000}\n";
  ChildProcess replay;
  ASSERT_TRUE(replay.Start({StriderBinary(), "replay", "serve", "--db", dir.Sub("db"), "--bind",
                            "tcp://127.0.0.1:0", "--sample-bind", "tcp://127.0.0.1:0", "--config",
                            dir.Sub("replay.yaml")},
                           dir.Sub("replay.log")));
  const nlohmann::json ready = WaitEvent(replay, "ready", 30000);
  ASSERT_TRUE(ready.is_object()) << "no ready line from the replay server";
  const std::string actor_endpoint = ready["actor_endpoint"];
  const std::string learner_endpoint = ready["learner_endpoint"];

  std::vector<std::unique_ptr<ChildProcess>> actors;
  for (int i = 0; i < kRealActors; ++i) {
    const std::string config = dir.Sub("actor" + std::to_string(i) + ".yaml");
    std::ofstream(config) << "actor:\n  id: soak-" << i << "\n  model: " << SourceDir()
                          << "/configs/model/tiny.yaml\n  model_seed: 0\n  threads: 1\n"
                          << "  episodes: 0\n  episodes_in_flight: 4\n  group_size: 1\n"
                          << "  max_turns: 3\n  max_episode_tokens: 1024\n  seed: "
                          << seed * 100 + i << "\n  segment_tokens: 96\n"
                          << "  sampling: {temperature: 1.0, max_new_tokens: 40}\n"
                          << "  engine: {cache_budget_mb: 64}\n"
                          << "  metrics: {interval_s: 5, progress: false}\n"
                          << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
    actors.push_back(std::make_unique<ChildProcess>());
    ASSERT_TRUE(actors.back()->Start({StriderBinary(), "actor", "--config", config, "--replay",
                                      actor_endpoint, "--spill-dir",
                                      dir.Sub("spill" + std::to_string(i)), "--no-progress"},
                                     dir.Sub("actor" + std::to_string(i) + ".log")));
    ASSERT_TRUE(WaitEvent(*actors.back(), "ready", 60000).is_object()) << "actor " << i;
  }

  std::atomic<bool> stop{false};
  StandInTotals totals;
  std::vector<std::string> failures(kStandIns + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStandIns; ++i) {
    threads.emplace_back(RunStandIn, i, seed, actor_endpoint, std::cref(stop), &totals,
                         &failures[i]);
  }
  threads.emplace_back(RunSampler, learner_endpoint, std::cref(stop), &totals,
                       &failures[kStandIns]);

  std::vector<pid_t> pids = {replay.pid()};
  for (const auto& actor : actors) pids.push_back(actor->pid());
  replay::ActorClientOptions stats_options;
  stats_options.endpoint = actor_endpoint;
  stats_options.client_id = "soak-stats";
  Result<std::unique_ptr<replay::ActorClient>> stats_client =
      replay::ActorClient::Connect(stats_options);
  ASSERT_TRUE(stats_client.ok()) << stats_client.status().ToString();
  std::vector<Reading> readings;
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::seconds(seconds);
  for (auto next = start; next <= end; next += kReadingPeriod) {
    std::this_thread::sleep_until(next);
    Reading reading;
    reading.at_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    reading.acked = totals.acked;
    for (pid_t pid : pids) {
      reading.rss.push_back(ResidentBytesOf(pid));
      reading.fds.push_back(OpenDescriptorsOf(pid));
    }
    if (Result<std::string> stats = (*stats_client)->Stats(5s); stats.ok()) {
      const nlohmann::json parsed = nlohmann::json::parse(*stats, nullptr, false);
      if (parsed.is_object()) {
        reading.server_memory = parsed["memory"];
        reading.server_memory["stored_segments"] = parsed["tables"][0]["stored_segments"];
      }
    }
    // One line per reading on stderr (the soak log), for a look at the curve.
    std::vector<int64_t> rss_mib;
    for (int64_t bytes : reading.rss) rss_mib.push_back(bytes >> 20);
    std::fprintf(stderr, "soak %.0f s: acked %llu, resident MiB %s, descriptors %s, server %s\n",
                 reading.at_s, static_cast<unsigned long long>(reading.acked),
                 nlohmann::json(rss_mib).dump().c_str(),
                 nlohmann::json(reading.fds).dump().c_str(),
                 reading.server_memory.dump().c_str());
    readings.push_back(reading);
  }
  stop = true;
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < failures.size(); ++i) EXPECT_EQ(failures[i], "") << "client " << i;

  // The real actors end cleanly; their own segments are all acknowledged.
  nlohmann::json actor_metrics = nlohmann::json::array();
  for (size_t i = 0; i < actors.size(); ++i) {
    actors[i]->Signal(SIGTERM);
    const nlohmann::json finished = WaitEvent(*actors[i], "finished", 120000);
    EXPECT_TRUE(finished.is_object()) << "actor " << i << " did not finish";
    EXPECT_EQ(actors[i]->Wait(), 0);
    if (!finished.is_object()) continue;
    const nlohmann::json& m = finished["metrics"];
    EXPECT_EQ(m["acked_segments"], m["segments"]) << "actor " << i;
    actor_metrics.push_back({{"segments", m["segments"]}, {"acked", m["acked_segments"]}});
  }
  replay.Signal(SIGTERM);
  const nlohmann::json stopped = WaitEvent(replay, "stopped", 60000);
  EXPECT_EQ(replay.Wait(), 0);

  ASSERT_GE(readings.size(), 5u) << "too short a run to judge";
  const size_t warm = readings.size() / 5;  // end of the warm-up
  const Reading& first = readings[warm];
  const Reading& last = readings.back();
  const char* names[] = {"server", "actor0", "actor1"};
  nlohmann::json services = nlohmann::json::object();
  for (size_t p = 0; p < pids.size(); ++p) {
    services[names[p]] = {{"rss_start_mib", readings[0].rss[p] / 1048576.0},
                          {"rss_warm_mib", first.rss[p] / 1048576.0},
                          {"rss_end_mib", last.rss[p] / 1048576.0},
                          {"fds_warm", first.fds[p]},
                          {"fds_end", last.fds[p]}};
    EXPECT_LE(last.rss[p], first.rss[p] * 5 / 4 + (int64_t{32} << 20))
        << names[p] << ": resident memory grew from " << first.rss[p] << " to " << last.rss[p];
    // The server may open up to max_open_files table files after the warm-up; nothing else.
    const int64_t allowed = p == 0 ? kMaxOpenFiles + 4 : 4;
    EXPECT_LE(last.fds[p], first.fds[p] + allowed)
        << names[p] << ": descriptors grew from " << first.fds[p] << " to " << last.fds[p];
  }
  // Acknowledged rate (segments/s) per window of the run: fifths, or single readings in a run
  // too short for fifths of more than one.
  std::vector<double> rates;
  const size_t window = std::max<size_t>(1, (readings.size() - 1) / 5);
  for (size_t begin = 0; begin + window < readings.size(); begin += window) {
    const Reading& a = readings[begin];
    const Reading& b = readings[begin + window];
    rates.push_back((b.acked - a.acked) / (b.at_s - a.at_s));
  }
  ASSERT_GE(rates.size(), 2u);
  EXPECT_GE(rates.back(), 0.5 * rates[1]) << "ingest slowed down";
  EXPECT_EQ(totals.errors, 0u);

  Result<std::unique_ptr<replay::Inspector>> inspector = replay::Inspector::Open(dir.Sub("db"));
  ASSERT_TRUE(inspector.ok()) << inspector.status().ToString();
  Result<replay::VerifyReport> report = (*inspector)->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok()) << ::testing::PrintToString(report->problems);
  uint64_t actor_segments = 0;
  for (const nlohmann::json& m : actor_metrics) actor_segments += m["acked"].get<uint64_t>();
  // Every segment acknowledged to anyone was stored (retention has deleted the oldest since,
  // keeping the newest 20,000).
  ASSERT_TRUE(stopped.is_object());
  EXPECT_GE(stopped["stats"]["ingest"]["segments"].get<uint64_t>(),
            totals.acked.load() + actor_segments);
  EXPECT_LE(report->segments, 20000u + 1000u);

  nlohmann::json line = {{"soak_seconds", seconds},
                         {"soak_seed", seed},
                         {"stand_ins", kStandIns},
                         {"stand_in_segments_acked", totals.acked.load()},
                         {"segments_sampled", totals.sampled.load()},
                         {"ingest_window_s", window * 5},
                         {"ingest_rates", rates},
                         {"services", services},
                         {"server_memory_warm", first.server_memory},
                         {"server_memory_end", last.server_memory},
                         {"real_actors", actor_metrics},
                         {"segments_stored", report->segments},
                         {"verify_problems", report->problems.size()},
                         {"server_ingest", stopped.is_object() ? stopped["stats"]["ingest"]
                                                               : nlohmann::json()}};
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace
}  // namespace strider
