// Fault injection on a real fleet (docs/reliability.md, "Chaos"): `strider replay serve` and two
// `strider actor` processes (tiny model, calculator) stream while, at seeded random moments, the
// harness SIGKILLs and restarts the server or an actor, SIGSTOPs the server for longer than the
// actors' timeouts, and (as root, on a small tmpfs) fills the replay disk and frees it again.
// Beside the actors, two clients of this process (plain ActorClients, as the actors' senders use)
// stream through every fault and append the key of each segment the server acknowledged to them
// to a file of their own, fsynced before they send more: a record of what the server promised,
// kept outside the store. At the end it counts what was injected and what arrived, and checks
// that every recorded key is in the store as `strider replay inspect DB export` reads it out (key
// by key, the missing ones printed), that the server's own acknowledged marks agree, that
// `verify` passes, that every trajectory is stored once and whole or closed as abandoned, and
// that the actors' spill directories are empty. One JSON line on stdout sums it up.
//
// STRIDER_CHAOS_SEED (default 1) and STRIDER_CHAOS_SECONDS (default 40) choose the run;
// scripts/chaos.sh runs a long one.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "replay/client.h"
#include "replay/inspect.h"
#include "tests/integration/child_process.h"
#include "tests/replay/small_disk.h"
#include "tests/replay/test_segments.h"
#include "tests/scratch_dir.h"

namespace strider {
namespace {

using strider::testing::ChildProcess;
using strider::testing::EnvInt;
using strider::testing::SmallDisk;
using strider::testing::SourceDir;
using strider::testing::StriderBinary;
using strider::testing::TempDir;
using strider::testing::WaitEvent;

size_t FilesIn(const std::string& dir) {
  size_t count = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    count += entry.is_regular_file() ? 1 : 0;
  }
  return count;
}

// One of this process's clients: streams 4-segment trajectories until `stop`, then finishes the
// trajectory it is in and flushes. Each batch of keys the server acknowledged is appended to
// `keys_path` and fsynced before the next send. A client that gives up (no progress for its
// give_up_after) is replaced by a fresh one; what it held unacknowledged was never promised.
struct StandIn {
  uint64_t sent = 0;
  uint64_t acked = 0;
  uint64_t replaced = 0;
  std::string failure;
};

void RunStandIn(int index, const std::string& endpoint, const std::string& keys_path,
                const std::atomic<bool>& stop, StandIn* out) {
  const int fd = ::open(keys_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    out->failure = keys_path + ": cannot open";
    return;
  }
  const auto record = [&](replay::ActorClient& client) {
    std::string lines;
    for (const schema::SegmentKey& key : client.TakeAcked()) {
      lines += key.ToString() + "\n";
      ++out->acked;
    }
    for (size_t done = 0; done < lines.size();) {
      const ssize_t n = ::write(fd, lines.data() + done, lines.size() - done);
      if (n <= 0) {
        out->failure = keys_path + ": write failed";
        return false;
      }
      done += static_cast<size_t>(n);
    }
    if (!lines.empty() && ::fsync(fd) != 0) {
      out->failure = keys_path + ": fsync failed";
      return false;
    }
    return true;
  };
  replay::ActorClientOptions options;
  options.endpoint = endpoint;
  options.client_id = "chaos-client-" + std::to_string(index);
  std::unique_ptr<replay::ActorClient> client;
  for (uint64_t trajectory = 0; !stop && out->failure.empty(); ++trajectory) {
    const uint64_t seed = (static_cast<uint64_t>(index) + 1) * 1000000 + trajectory;
    for (uint32_t segment = 0; segment < 4; ++segment) {
      if (!client) {
        Result<std::unique_ptr<replay::ActorClient>> connected =
            replay::ActorClient::Connect(options);
        if (!connected.ok()) {  // the server is down past give_up_after: a new trajectory
          ++out->replaced;
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          break;
        }
        client = std::move(*connected);
      }
      const Status sent = client->Send(
          strider::testing::MakeSegment(seed, segment, 256, 1, /*is_last=*/segment == 3));
      if (!record(*client)) break;
      if (!sent.ok()) {
        ++out->replaced;
        client.reset();
        break;  // the trajectory stays open; the server closes it as abandoned
      }
      ++out->sent;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  if (client) {
    const Status flushed = client->Flush(std::chrono::milliseconds(120000));
    if (!flushed.ok() && out->failure.empty()) out->failure = flushed.ToString();
    record(*client);
  }
  ::close(fd);
}

// The keys in one of RunStandIn's files.
std::set<std::string> KeysIn(const std::string& path) {
  std::set<std::string> keys;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) keys.insert(line);
  }
  return keys;
}

class Fleet {
 public:
  explicit Fleet(const TempDir& dir) : dir_(dir), disk_(dir.Sub("disk"), 64 << 20) {
    db_ = disk_.mounted() ? dir.Sub("disk/db") : dir.Sub("db");
    std::ofstream(dir.Sub("replay.yaml"))
        << "server:\n  stats_interval_s: 0\n  abandon_after_s: 5\n";
    for (int i = 0; i < 2; ++i) {
      std::ofstream(dir.Sub("actor" + std::to_string(i) + ".yaml"))
          << "actor:\n  id: chaos-" << i << "\n  model: " << SourceDir()
          << "/configs/model/tiny.yaml\n  model_seed: 0\n  threads: 1\n  episodes: 0\n"
          << "  episodes_in_flight: 4\n  group_size: 1\n  max_turns: 3\n"
          << "  max_episode_tokens: 1024\n  seed: " << 100 + i << "\n  segment_tokens: 96\n"
          << "  sampling: {temperature: 1.0, max_new_tokens: 40}\n"
          << "  engine: {cache_budget_mb: 64}\n"
          << "  replay: {endpoint: tcp://127.0.0.1:1, spill_after_ms: 1000}\n"
          << "  metrics: {interval_s: 1, progress: false}\n"
          << "env:\n  name: calculator\n  options: {difficulty: 1}\n";
    }
  }

  bool small_disk() const { return disk_.mounted(); }
  SmallDisk& disk() { return disk_; }
  const std::string& db() const { return db_; }
  std::string spill(int i) const { return dir_.Sub("spill" + std::to_string(i)); }

  // The first start binds a free port; restarts bind the same one, where the actors look.
  bool StartServer() {
    server_ = std::make_unique<ChildProcess>();
    const std::string bind = endpoint_.empty() ? "tcp://127.0.0.1:0" : endpoint_;
    if (!server_->Start({StriderBinary(), "replay", "serve", "--db", db_, "--bind", bind,
                         "--sample-bind", "tcp://127.0.0.1:0", "--config",
                         dir_.Sub("replay.yaml")},
                        dir_.Sub("replay.log"))) {
      return false;
    }
    const nlohmann::json ready = WaitEvent(*server_, "ready", 30000);
    if (!ready.is_object()) return false;
    endpoint_ = ready["actor_endpoint"];
    return true;
  }
  ChildProcess& server() { return *server_; }
  const std::string& endpoint() const { return endpoint_; }

  bool StartActor(int i) {
    actors_[i] = std::make_unique<ChildProcess>();
    return actors_[i]->Start({StriderBinary(), "actor", "--config",
                              dir_.Sub("actor" + std::to_string(i) + ".yaml"), "--replay",
                              endpoint_, "--spill-dir", spill(i), "--no-progress"},
                             dir_.Sub("actor" + std::to_string(i) + ".log"));
  }
  ChildProcess& actor(int i) { return *actors_[i]; }

 private:
  const TempDir& dir_;
  SmallDisk disk_;
  std::string db_;
  std::string endpoint_;
  std::unique_ptr<ChildProcess> server_;
  std::unique_ptr<ChildProcess> actors_[2];
};

TEST(Chaos, SeededFaultsLoseNoAcknowledgedSegment) {
  const uint64_t seed = static_cast<uint64_t>(EnvInt("STRIDER_CHAOS_SEED", 1));
  const int64_t seconds = EnvInt("STRIDER_CHAOS_SECONDS", 40);
  TempDir dir;
  Fleet fleet(dir);
  ASSERT_TRUE(fleet.StartServer());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(fleet.StartActor(i));

  std::atomic<bool> stop_clients{false};
  StandIn stand_ins[2];
  std::vector<std::thread> clients;
  // A failed assertion returns early: the clients still stop and are joined.
  struct Joiner {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~Joiner() {
      stop = true;
      for (std::thread& thread : threads) {
        if (thread.joinable()) thread.join();
      }
    }
  } joiner{stop_clients, clients};
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back(RunStandIn, i, fleet.endpoint(), dir.Sub("acked" + std::to_string(i)),
                         std::cref(stop_clients), &stand_ins[i]);
  }

  std::mt19937_64 rng(seed);
  std::map<std::string, int> faults;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000 + rng() % 3000));
    const int kinds = fleet.small_disk() ? 4 : 3;
    switch (rng() % kinds) {
      case 0: {  // the server dies and comes back
        fleet.server().Signal(SIGKILL);
        fleet.server().Wait();
        ASSERT_TRUE(fleet.StartServer()) << "the server did not come back";
        ++faults["server_sigkill"];
        break;
      }
      case 1: {  // the server stops answering for longer than the actors wait
        fleet.server().Signal(SIGSTOP);
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        fleet.server().Signal(SIGCONT);
        ++faults["server_sigstop"];
        break;
      }
      case 2: {  // an actor dies mid-episode and a new one starts on its spill directory
        const int i = static_cast<int>(rng() % 2);
        fleet.actor(i).Signal(SIGKILL);
        fleet.actor(i).Wait();
        ASSERT_TRUE(fleet.StartActor(i));
        ++faults["actor_sigkill"];
        break;
      }
      default: {  // the replay disk fills up, then space returns
        fleet.disk().Fill("ballast");
        std::this_thread::sleep_for(std::chrono::milliseconds(2000));
        std::filesystem::remove(dir.Sub("disk/ballast"));
        ++faults["disk_full"];
        break;
      }
    }
  }

  // A clean end: this process's clients finish their trajectories and flush, the actors flush
  // (or spill) and exit, then the server.
  stop_clients = true;
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < 2; ++i) EXPECT_EQ(stand_ins[i].failure, "") << "client " << i;
  nlohmann::json acked = nlohmann::json::object();
  for (int i = 0; i < 2; ++i) {
    fleet.actor(i).Signal(SIGTERM);
    const nlohmann::json finished = WaitEvent(fleet.actor(i), "finished", 120000);
    EXPECT_TRUE(finished.is_object()) << "actor " << i << " did not finish";
    EXPECT_EQ(fleet.actor(i).Wait(), 0);
    if (!finished.is_object()) continue;
    const nlohmann::json& m = finished["metrics"];
    acked[std::to_string(i)] = {{"segments", m["segments"]},
                                {"acked_segments", m["acked_segments"]},
                                {"refused_segments", m["refused_segments"]}};
    // Nothing of a clean end's own segments is refused, and every one is acknowledged (its
    // acknowledgements also count files an earlier incarnation spilled).
    EXPECT_EQ(m["refused_segments"], 0) << "actor " << i;
    EXPECT_GE(m["acked_segments"].get<uint64_t>(), m["segments"].get<uint64_t>())
        << "actor " << i << ": " << m.dump();
  }
  // Segments the last incarnations could not hand over before they stopped stay in their spill
  // directories; a new actor delivers them first (as a restarted one would).
  for (int i = 0; i < 2; ++i) {
    if (FilesIn(fleet.spill(i)) == 0) continue;
    ChildProcess deliver;
    ASSERT_TRUE(deliver.Start({StriderBinary(), "actor", "--config",
                               dir.Sub("actor" + std::to_string(i) + ".yaml"), "--replay",
                               fleet.endpoint(), "--spill-dir", fleet.spill(i), "--no-progress"}));
    WaitEvent(deliver, "ready", 30000);
    deliver.Signal(SIGTERM);
    deliver.Wait();
  }
  // Long enough for the server to close the killed actors' open trajectories (abandon_after_s).
  std::this_thread::sleep_for(std::chrono::seconds(6));
  const nlohmann::json server_stats = [&] {
    fleet.server().Signal(SIGTERM);
    const nlohmann::json stopped = WaitEvent(fleet.server(), "stopped", 60000);
    fleet.server().Wait();
    return stopped.is_object() ? stopped["stats"] : nlohmann::json::object();
  }();

  // Every key the server acknowledged to this process's clients is in the store, as the CLI's
  // export reads it out: a check against the clients' own record, not the store's counters.
  std::set<std::string> promised;
  for (int i = 0; i < 2; ++i) {
    const std::set<std::string> keys = KeysIn(dir.Sub("acked" + std::to_string(i)));
    promised.insert(keys.begin(), keys.end());
  }
  EXPECT_GT(promised.size(), 0u) << "the clients were acknowledged nothing";
  const testing::RunResult exported =
      testing::RunCommand({StriderBinary(), "replay", "inspect", fleet.db(), "export",
                           "--format", "jsonl", "--out", dir.Sub("export.jsonl")});
  ASSERT_EQ(exported.exit_code, 0) << "replay inspect export failed";
  std::set<std::string> stored;
  uint64_t exported_twice = 0;
  {
    std::ifstream in(dir.Sub("export.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json segment = nlohmann::json::parse(line, nullptr, false);
      ASSERT_TRUE(segment.is_object() && segment.contains("trajectory_id") &&
                  segment.contains("segment_index"))
          << "not an export line: " << line.substr(0, 200);
      const std::string key = segment["trajectory_id"].get<std::string>() + "/" +
                              std::to_string(segment["segment_index"].get<uint64_t>());
      exported_twice += stored.insert(key).second ? 0 : 1;
    }
  }
  std::vector<std::string> missing;
  for (const std::string& key : promised) {
    if (stored.count(key) == 0) missing.push_back(key);
  }
  std::ostringstream listed;
  for (size_t i = 0; i < missing.size() && i < 50; ++i) listed << "\n  " << missing[i];
  EXPECT_TRUE(missing.empty()) << missing.size() << " of " << promised.size()
                               << " acknowledged segments are not in the store:" << listed.str();
  EXPECT_EQ(exported_twice, 0u) << "segments exported more than once";

  Result<std::unique_ptr<replay::Inspector>> inspector = replay::Inspector::Open(fleet.db());
  ASSERT_TRUE(inspector.ok()) << inspector.status().ToString();
  Result<replay::VerifyReport> report = (*inspector)->Verify();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok()) << ::testing::PrintToString(report->problems);
  const nlohmann::json stats = nlohmann::json::parse(*(*inspector)->StatsJson());
  EXPECT_EQ(stats["lost_acknowledged_segments"], 0);
  EXPECT_EQ(stats["accepted_lost_segments"], 0);
  Result<std::vector<schema::TrajectorySummary>> summaries = (*inspector)->List({});
  ASSERT_TRUE(summaries.ok());
  uint64_t complete = 0, abandoned = 0, open = 0;
  for (const schema::TrajectorySummary& s : *summaries) {
    if (s.abandoned) {
      ++abandoned;
    } else if (s.complete) {
      ++complete;
    } else {
      ++open;
    }
  }
  // Open ones are the last incarnations' episodes cut by SIGTERM mid-flight; they end
  // `abandoned` by the actor itself, so nothing may be left open here.
  EXPECT_EQ(open, 0u);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(FilesIn(fleet.spill(i)), 0u) << "spill " << i;
  EXPECT_GT(complete, 0u);

  nlohmann::json line = {{"chaos_seed", seed},
                         {"seconds", seconds},
                         {"small_disk", fleet.small_disk()},
                         {"faults", faults},
                         {"segments_stored", report->segments},
                         {"client_segments_acknowledged", promised.size()},
                         {"client_acknowledged_missing", missing.size()},
                         {"client_replacements", stand_ins[0].replaced + stand_ins[1].replaced},
                         {"trajectories_complete", complete},
                         {"trajectories_abandoned", abandoned},
                         {"lost_acknowledged_segments", stats["lost_acknowledged_segments"]},
                         {"verify_problems", report->problems.size()},
                         {"duplicates_seen_by_last_server", server_stats["ingest"]["duplicates"]},
                         {"last_actors", acked}};
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace
}  // namespace strider
