// What the replay server's start-up check of table files costs (docs/replay.md, "Running"):
// a store of --gb GB of 1 MiB segments is written through a server, flushed into table files,
// and then started, alternately, without a check (`--no-verify`), with the default check on a
// store none of whose files was checked yet (the first start after a run wrote them all), with
// the default check again (nothing new), and with `--verify` (every file). Each start is
// ReplayServer::Start returning, the store open and the server bound; its Stop is not timed.
//
//   replay_start_bench [--gb 4] [--dir /tmp/strider_replay_start_bench] [--rounds 3] [--cold]
//
// --cold drops the page cache before each start (root only: /proc/sys/vm/drop_caches), so the
// checks read from the disk; without it the files stay cached from writing. One JSON line per
// variant, the median of the rounds, with the unchecked start as the baseline.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_json.h"
#include "common/clock.h"
#include "common/schema/messages.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "replay/storage.h"

namespace strider {
namespace {

[[noreturn]] void Fail(const Status& status) {
  std::fprintf(stderr, "replay_start_bench: %s\n", status.ToString().c_str());
  std::exit(1);
}

replay::ServerOptions Options(const std::string& dir, replay::StartVerify verify) {
  replay::ServerOptions options;
  options.db_path = dir;
  options.actor_endpoint = "tcp://127.0.0.1:0";
  options.learner_endpoint = "tcp://127.0.0.1:0";
  options.stats_interval_s = 0;
  options.verify_on_start = verify;
  return options;
}

// Writes `count` segments of about 1 MiB (random tokens, so compression saves little) through a
// server, then flushes and compacts every column family so that all of it is in table files.
void WriteStore(const std::string& dir, size_t count) {
  Result<std::unique_ptr<replay::ReplayServer>> server =
      replay::ReplayServer::Start(Options(dir, replay::StartVerify::kNone));
  if (!server.ok()) Fail(server.status());
  replay::ActorClientOptions client_options;
  client_options.endpoint = (*server)->actor_endpoint();
  client_options.client_id = "start-bench";
  Result<std::unique_ptr<replay::ActorClient>> client =
      replay::ActorClient::Connect(client_options);
  if (!client.ok()) Fail(client.status());
  std::mt19937_64 rng(1);
  schema::SegmentData s;
  s.env = "bench";
  s.is_last = true;
  s.end_reason = schema::EndReason::kFinished;
  s.policy_runs.push_back({0, 1});
  const size_t tokens = ((size_t{1} << 20) - 512) / 9;
  s.tokens.resize(tokens);
  s.roles.resize(tokens);
  s.behaviour_logprobs.resize(tokens);
  for (size_t i = 0; i < count; ++i) {
    for (auto& b : s.trajectory_id.bytes) b = static_cast<uint8_t>(rng());
    for (size_t t = 0; t < tokens; ++t) {
      const uint64_t r = rng();
      s.tokens[t] = static_cast<int32_t>(r & 0xFFFFFF);
      s.roles[t] = static_cast<schema::Role>((r >> 24) % 3);
      s.behaviour_logprobs[t] = -static_cast<float>((r >> 32) & 0xFFFFFF) / 1e6f;
    }
    if (Status sent = (*client)->Send(s); !sent.ok()) Fail(sent);
  }
  if (Status flushed = (*client)->Flush(std::chrono::minutes(10)); !flushed.ok()) Fail(flushed);
  client->reset();
  (*server)->Stop();
  server->reset();
  Result<std::unique_ptr<replay::Store>> store = replay::Store::Open(dir, replay::StoreOptions());
  if (!store.ok()) Fail(store.status());
  const std::vector<rocksdb::ColumnFamilyHandle*> families = {
      (*store)->segments(), (*store)->trajectories(), (*store)->sequence(), (*store)->meta()};
  for (auto* family : families) {
    if (Status flushed = replay::FromRocks((*store)->db()->Flush(rocksdb::FlushOptions(), family),
                                           "flushing the store");
        !flushed.ok()) {
      Fail(flushed);
    }
  }
  // Compacted down to settled levels, so that no start's compactions change the files the next
  // start sees.
  for (auto* family : families) {
    if (Status compacted = replay::FromRocks(
            (*store)->db()->CompactRange(rocksdb::CompactRangeOptions(), family, nullptr, nullptr),
            "compacting the store");
        !compacted.ok()) {
      Fail(compacted);
    }
  }
}

bool DropPageCache() {
  ::sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3\n";
  drop.flush();
  return static_cast<bool>(drop);
}

double TimedStart(const std::string& dir, replay::StartVerify verify, bool cold) {
  if (cold && !DropPageCache()) {
    std::fprintf(stderr, "replay_start_bench: --cold needs root (/proc/sys/vm/drop_caches)\n");
    std::exit(1);
  }
  const auto start = Clock::now();
  Result<std::unique_ptr<replay::ReplayServer>> server =
      replay::ReplayServer::Start(Options(dir, verify));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!server.ok()) Fail(server.status());
  (*server)->Stop();
  return seconds;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace
}  // namespace strider

int main(int argc, char** argv) {
  using namespace strider;
  double gb = 4;
  int rounds = 3;
  bool cold = false;
  std::string dir =
      (std::filesystem::temp_directory_path() / "strider_replay_start_bench").string();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--gb" && i + 1 < argc) {
      gb = std::atof(argv[++i]);
    } else if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--cold") {
      cold = true;
    } else {
      std::fprintf(stderr,
                   "usage: replay_start_bench [--gb 4] [--dir DIR] [--rounds 3] [--cold]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  std::filesystem::remove_all(dir);
  const auto written = Clock::now();
  WriteStore(dir, static_cast<size_t>(gb * 1024));
  uint64_t store_bytes = 0;
  uint64_t table_files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    store_bytes += entry.file_size();
    table_files += entry.path().extension() == ".sst" ? 1 : 0;
  }
  std::fprintf(stderr, "replay_start_bench: %.2f GB in %llu table files written in %.0f s\n",
               store_bytes / 1e9, static_cast<unsigned long long>(table_files),
               std::chrono::duration<double>(Clock::now() - written).count());

  const std::string checked = dir + "/" + std::string(replay::kCheckedTables);
  std::map<std::string, std::vector<double>> times;
  for (int round = 0; round < rounds; ++round) {
    times["no_verify"].push_back(TimedStart(dir, replay::StartVerify::kNone, cold));
    std::filesystem::remove(checked);  // none of the files checked yet
    times["default_first"].push_back(TimedStart(dir, replay::StartVerify::kNew, cold));
    times["default_again"].push_back(TimedStart(dir, replay::StartVerify::kNew, cold));
    times["verify_all"].push_back(TimedStart(dir, replay::StartVerify::kAll, cold));
  }
  const double baseline = Median(times["no_verify"]);
  const std::string setting = std::string(cold ? "page cache dropped" : "page cache warm") +
                              ", store " + std::to_string(store_bytes >> 20) + " MiB in " +
                              std::to_string(table_files) + " table files, median of " +
                              std::to_string(rounds);
  for (const auto& [variant, what] :
       std::vector<std::pair<std::string, std::string>>{
           {"no_verify", "serve --no-verify"},
           {"default_first", "default, no file checked before (the first start after a run "
                             "that wrote them)"},
           {"default_again", "default, every file checked at an earlier start"},
           {"verify_all", "serve --verify"}}) {
    bench::PrintResult("replay_start_bench", "start_s_" + variant, Median(times[variant]), "s",
                       baseline,
                       {{"store_bytes", std::to_string(store_bytes)},
                        {"table_files", std::to_string(table_files)},
                        {"is", bench::JsonString(what)},
                        {"baseline_is", bench::JsonString("serve --no-verify, " + setting)}});
  }
  std::filesystem::remove_all(dir);
  return 0;
}
