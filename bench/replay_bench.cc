// Replay service throughput and latency against their ceilings, measured in the same run:
//   ingest      4 actors streaming 64 KiB / 1 MiB segments, acknowledged after the WAL write,
//               vs. a raw RocksDB put loop (4 threads, same values, same options, WAL on)
//   stream      the same ingest vs. a raw ZeroMQ PUSH/PULL loop of the same frames (loopback)
//   sample      p50/p99 latency of 64 KiB samples while 4 actors ingest, vs. the 5 ms target
//   group       p50/p99 latency of every learner request (data or "not ready") to a fifo group
//               table while 4 actors flood it with small one-segment trajectories, vs. the same
//               target, and how many requests went unanswered
// Segment contents are random (incompressible), as PLATFORM.md advises for RocksDB figures.
//
// Ingest, stream and latency are measured over tcp loopback and, as `*_ipc`, over ipc:// (unix
// sockets, what co-located actors use); the raw RocksDB baseline is the same for both.
//
//   replay_bench [--quick] [--only ingest|curve|latency|verify] [--size 64KiB|1MiB]
//                [--batch-bytes N] [--actor-nice N] [--intake-nice N]
//
// --only curve: ingest over tcp with CURVE against the same ingest without it, in one run.
//
// --batch-bytes sets the actor clients' frame size for batched segments (0: one segment per
// frame; default the library's), to compare batching with sending segments one by one.
//
// The 4 actors stand in for actor processes on other machines, but here they share the server's
// two cores. They run N nice steps below the server's writers (--actor-nice, default 10, as the
// server's own intake does by default; 0: the same priority), their ZeroMQ I/O threads
// included. They still send every byte over the same sockets within the measured time; they
// only take the cores the server leaves idle instead of taking turns with RocksDB's log write,
// the one serial stage of ingest, which the raw put loop never shares. --intake-nice sets
// ServerOptions::intake_nice, for comparisons.
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <latch>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>
#include <zmq.hpp>

#include "bench/bench_json.h"
#include "bench/bench_util.h"
#include "common/clock.h"
#include "common/schema/messages.h"
#include "common/transport/curve.h"
#include "common/transport/zmq_util.h"
#include "replay/client.h"
#include "replay/replay.h"
#include "replay/storage.h"

namespace strider::bench {
namespace {

using std::chrono::milliseconds;
constexpr int kActors = 4;
// ActorClientOptions::batch_bytes of every actor client (--batch-bytes).
uint64_t batch_bytes = replay::ActorClientOptions().batch_bytes;
// How many nice steps below the server's writers the stand-in actors run (--actor-nice).
int actor_nice = 10;
// ServerOptions::intake_nice of every server (--intake-nice).
int intake_nice = replay::ServerOptions().intake_nice;

// A stand-in actor's client, connected from the calling thread, the actor's own: the thread
// first lowers its priority (--actor-nice), and the client's ZeroMQ I/O thread, started when it
// connects, inherits it.
std::unique_ptr<replay::ActorClient> ConnectStandInActor(
    const std::string& endpoint, const std::string& client_id,
    const transport::ClientAuth& auth = {}) {
  transport::NameThisThread("bench-actor");
  (void)transport::LowerPriority(0, actor_nice);
  replay::ActorClientOptions client;
  client.endpoint = endpoint;
  client.client_id = client_id;
  client.batch_bytes = batch_bytes;
  client.auth = auth;
  return replay::ActorClient::Connect(client).value();
}

// What the ingest and latency lines say about the priorities above.
std::string PrioritiesText() {
  return "actors " + std::to_string(actor_nice) + " and the server's intake " +
         std::to_string(intake_nice) + " nice steps below its writers";
}

struct Frame {
  schema::SegmentKey key;
  // Shared: the actor clients send from these bytes without copying them, as an actor sends the
  // frame it just encoded.
  std::shared_ptr<const std::string> bytes;
};

// Segments of random tokens, roles and log-probs whose envelopes are close to `target_bytes`.
std::vector<Frame> MakeFrames(size_t target_bytes, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t tokens = (target_bytes - 512) / 9;  // 4 token + 1 role + 4 log-prob bytes each
  std::vector<Frame> frames;
  for (size_t i = 0; i < count; ++i) {
    schema::SegmentData s;
    for (auto& b : s.trajectory_id.bytes) b = static_cast<uint8_t>(rng());
    s.segment_index = static_cast<uint32_t>(i);
    s.env = "bench";
    s.policy_runs.push_back({0, 1});
    s.tokens.resize(tokens);
    s.roles.resize(tokens);
    s.behaviour_logprobs.resize(tokens);
    for (size_t t = 0; t < tokens; ++t) {
      const uint64_t r = rng();
      s.tokens[t] = static_cast<int32_t>(r & 0xFFFFFF);
      s.roles[t] = static_cast<schema::Role>((r >> 24) % 3);  // system, user, model
      s.behaviour_logprobs[t] = -static_cast<float>((r >> 32) & 0xFFFFFF) / 1e6f;
    }
    Result<std::string> frame = schema::EncodeSegment(s);
    if (!frame.ok()) {
      std::fprintf(stderr, "replay_bench: %s\n", frame.status().ToString().c_str());
      std::exit(1);
    }
    frames.push_back({s.key(), std::make_shared<const std::string>(std::move(*frame))});
  }
  return frames;
}

// Small one-segment trajectories in groups of 4 consecutive frames, as an actor playing short
// episodes stores them: what a group table completes units on.
std::vector<Frame> MakeGroupFrames(size_t target_bytes, size_t count, uint64_t seed) {
  std::vector<Frame> frames = MakeFrames(target_bytes, count, seed);
  std::mt19937_64 rng(seed + 1);
  schema::TrajectoryId group;
  for (size_t i = 0; i < frames.size(); ++i) {
    Result<schema::Message> decoded = schema::Decode(*frames[i].bytes, schema::DecodeLimits());
    if (!decoded.ok()) {
      std::fprintf(stderr, "replay_bench: %s\n", decoded.status().ToString().c_str());
      std::exit(1);
    }
    schema::SegmentData& s = decoded->segment;
    if (i % 4 == 0) {
      for (auto& b : group.bytes) b = static_cast<uint8_t>(rng());
    }
    s.segment_index = 0;
    s.is_last = true;
    s.end_reason = schema::EndReason::kFinished;
    s.group_id = group;
    s.group_index = static_cast<uint32_t>(i % 4);
    s.group_size = 4;
    Result<std::string> frame = schema::EncodeSegment(s);
    if (!frame.ok()) {
      std::fprintf(stderr, "replay_bench: %s\n", frame.status().ToString().c_str());
      std::exit(1);
    }
    frames[i] = {s.key(), std::make_shared<const std::string>(std::move(*frame))};
  }
  return frames;
}

// PrintResult plus a "baseline_is" field saying what the baseline is.
void PrintWithBaseline(const std::string& metric, double value, const std::string& unit,
                       double baseline, const std::string& baseline_is) {
  const double ratio = baseline != 0 ? value / baseline : 0;
  std::printf("{\"bench\":\"replay_bench\",\"metric\":%s,\"value\":%s,\"unit\":%s,"
              "\"baseline\":%s,\"ratio\":%s,\"baseline_is\":%s}\n",
              JsonString(metric).c_str(), JsonNumber(value).c_str(), JsonString(unit).c_str(),
              JsonNumber(baseline).c_str(), JsonNumber(ratio).c_str(),
              JsonString(baseline_is).c_str());
  std::fflush(stdout);
}

// Process CPU time and page faults around one measured run, written to stderr: the JSON ratios
// say how fast, these say where a slow run's time went (CPU spent per MB, or waiting).
class RunCost {
 public:
  RunCost() : start_(Clock::now()), usage_(Usage()) {}
  void Report(const std::string& what, uint64_t bytes) const {
    const rusage now = Usage();
    auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
    const double cpu = seconds(now.ru_utime) - seconds(usage_.ru_utime) + seconds(now.ru_stime) -
                       seconds(usage_.ru_stime);
    const double wall = std::chrono::duration<double>(Clock::now() - start_).count();
    const double mb = static_cast<double>(bytes) / 1e6;
    std::fprintf(stderr,
                 "replay_bench: %-14s wall %.3f s, cpu %.3f s (%.2f ms/MB), %ld minor faults "
                 "(%.0f per MB)\n",
                 what.c_str(), wall, cpu, cpu * 1e3 / mb, now.ru_minflt - usage_.ru_minflt,
                 static_cast<double>(now.ru_minflt - usage_.ru_minflt) / mb);
  }

 private:
  static rusage Usage() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage;
  }
  Clock::time_point start_;
  rusage usage_;
};

double MegabytesPerSecond(uint64_t bytes, Clock::duration elapsed) {
  return static_cast<double>(bytes) / 1e6 / std::chrono::duration<double>(elapsed).count();
}

uint64_t TotalBytes(const std::vector<Frame>& frames) {
  uint64_t total = 0;
  for (const Frame& f : frames) total += f.bytes->size();
  return total;
}

// 4 threads putting the frames into a fresh RocksDB with the options the store uses
// (Store::MakeOptions: same compression, memtables, background jobs, pipelined writes), WAL on,
// no sync, as the server writes them: the same 20-byte keys and the same values (the 8-byte
// sequence number followed by the envelope). The ceiling for ingest.
double RawRocksDbRate(const std::vector<Frame>& frames, const std::string& dir) {
  std::filesystem::remove_all(dir);
  rocksdb::Options options = replay::Store::MakeOptions(replay::StoreOptions());
  rocksdb::DB* raw = nullptr;
  rocksdb::Status status = rocksdb::DB::Open(options, dir, &raw);
  if (!status.ok()) {
    std::fprintf(stderr, "replay_bench: %s\n", status.ToString().c_str());
    std::exit(1);
  }
  std::unique_ptr<rocksdb::DB> db(raw);
  const RunCost cost;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int a = 0; a < kActors; ++a) {
    threads.emplace_back([&, a] {
      transport::NameThisThread("raw-rocksdb");
      rocksdb::WriteOptions write;
      write.sync = replay::StoreOptions().sync_wal;
      for (size_t i = a; i < frames.size(); i += kActors) {
        const std::string key = replay::SegmentStoreKey(frames[i].key);
        const std::string sequence = replay::EncodeU64(i + 1);
        rocksdb::Slice key_slice(key);
        rocksdb::Slice value_parts[2] = {rocksdb::Slice(sequence),
                                         rocksdb::Slice(*frames[i].bytes)};
        rocksdb::WriteBatch batch;
        batch.Put(rocksdb::SliceParts(&key_slice, 1), rocksdb::SliceParts(value_parts, 2));
        const rocksdb::Status written = db->Write(write, &batch);
        Check(written.ok() ? Status::Ok() : Status::IoError(written.ToString()),
              "the plain RocksDB write");
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto elapsed = Clock::now() - start;
  cost.Report("raw rocksdb", TotalBytes(frames));
  db->Close();
  db.reset();
  std::filesystem::remove_all(dir);
  return MegabytesPerSecond(TotalBytes(frames), elapsed);
}

// 4 actors streaming the frames into a fresh in-process server until every one is acked.
// `endpoint`: tcp://127.0.0.1:0 or an ipc:// path.
// With `keys` (--only curve) both ends use CURVE: the server a key pair and the ZAP handler,
// every actor its own authorised pair.
struct CurveKeys {
  transport::ServerAuth server;
  transport::ClientAuth client;
};

double ReplayIngestRate(const std::vector<Frame>& frames, const std::string& dir,
                        const std::string& endpoint, bool keep = false,
                        const CurveKeys* keys = nullptr) {
  std::filesystem::remove_all(dir);
  replay::ServerOptions options;
  if (keys != nullptr) options.auth = keys->server;
  options.db_path = dir;
  options.actor_endpoint = endpoint;
  options.stats_interval_s = 0;
  options.intake_nice = intake_nice;
  options.tables.push_back(replay::TableConfig());
  options.tables.back().retention.max_bytes = 0;  // keep everything: measure pure ingest
  Result<std::unique_ptr<replay::ReplayServer>> server = replay::ReplayServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "replay_bench: %s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  std::atomic<int> failures{0};
  // Each actor connects in its own thread (see ConnectStandInActor), then all start together.
  std::latch connected(kActors);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int a = 0; a < kActors; ++a) {
    threads.emplace_back([&, a] {
      std::unique_ptr<replay::ActorClient> actor = ConnectStandInActor(
          (*server)->actor_endpoint(), "bench-" + std::to_string(a),
          keys != nullptr ? keys->client : transport::ClientAuth{});
      connected.count_down();
      go.wait(false);
      for (size_t i = a; i < frames.size(); i += kActors) {
        if (!actor->SendFrame(frames[i].key, frames[i].bytes).ok()) failures++;
      }
      if (!actor->Flush(milliseconds(120000)).ok()) failures++;
    });
  }
  connected.wait();
  const RunCost cost;
  const auto start = Clock::now();
  go = true;
  go.notify_all();
  for (auto& t : threads) t.join();
  const auto elapsed = Clock::now() - start;
  cost.Report(std::string("replay ") + (keys != nullptr ? "curve " : "") + endpoint.substr(0, 3),
              TotalBytes(frames));
  if (failures > 0) std::fprintf(stderr, "replay_bench: %d ingest failures\n", failures.load());
  (*server)->Stop();
  server->reset();
  if (!keep) std::filesystem::remove_all(dir);
  return MegabytesPerSecond(TotalBytes(frames), elapsed);
}

// 4 PUSH sockets to one PULL over `bind` (tcp loopback or ipc), the same frames: the transport's
// ceiling.
double RawZmqRate(const std::vector<Frame>& frames, const std::string& bind) {
  zmq::context_t context(2);
  zmq::socket_t pull(context, zmq::socket_type::pull);
  pull.set(zmq::sockopt::linger, 0);
  pull.bind(bind);
  const std::string endpoint = pull.get(zmq::sockopt::last_endpoint);
  const RunCost cost;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int a = 0; a < kActors; ++a) {
    threads.emplace_back([&, a] {
      zmq::socket_t push(context, zmq::socket_type::push);
      push.set(zmq::sockopt::linger, -1);
      push.connect(endpoint);
      for (size_t i = a; i < frames.size(); i += kActors) {
        // Zero-copy, as the clients send.
        Check(transport::SendShared(push, frames[i].bytes), "the plain ZeroMQ push");
      }
    });
  }
  for (size_t received = 0; received < frames.size(); ++received) {
    zmq::message_t message;
    (void)pull.recv(message);
  }
  const auto elapsed = Clock::now() - start;
  for (auto& t : threads) t.join();
  cost.Report("raw zeromq " + bind.substr(0, 3), TotalBytes(frames));
  return MegabytesPerSecond(TotalBytes(frames), elapsed);
}

// kActors stand-in actors sending `load` round robin, each from its own thread, until all of it is
// sent or Stop.
class StandInActors {
 public:
  StandInActors(const std::string& endpoint, const std::vector<Frame>& load,
                const std::string& name) {
    for (int a = 0; a < kActors; ++a) {
      threads_.emplace_back([this, endpoint, &load, name, a] {
        auto actor = ConnectStandInActor(endpoint, name + "-" + std::to_string(a));
        // Load, not the measurement: the server stops under it when the measurement ends, so
        // errors then are expected, and a frame lost earlier only lightens the load.
        for (size_t i = a; i < load.size() && !stop_; i += kActors) {
          (void)actor->SendFrame(load[i].key, load[i].bytes);
        }
        (void)actor->Flush(milliseconds(60000));
      });
    }
  }
  ~StandInActors() { Stop(); }
  void Stop() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

struct Latency {
  double p50_ms = 0;
  double p99_ms = 0;
  size_t samples = 0;
  std::string server_side;  // the server's own latency figures (request received to reply sent)
  void SetFrom(std::vector<double> latencies) {
    samples = latencies.size();
    if (latencies.empty()) return;
    std::sort(latencies.begin(), latencies.end());
    p50_ms = latencies[latencies.size() / 2];
    p99_ms = latencies[std::min(latencies.size() - 1, latencies.size() * 99 / 100)];
  }
};

// A server on a fresh store in `dir` for the latency runs, its tables left to the caller.
replay::ServerOptions FreshServerOptions(const std::string& dir, const std::string& endpoint) {
  std::filesystem::remove_all(dir);
  replay::ServerOptions options;
  options.db_path = dir;
  options.actor_endpoint = endpoint;
  options.stats_interval_s = 0;
  options.intake_nice = intake_nice;
  return options;
}

// A uniform table prefilled with 64 KiB segments; 4 actors keep ingesting while one learner
// samples one segment per request.
Latency SampleLatencyUnderIngest(const std::vector<Frame>& prefill,
                                 const std::vector<Frame>& load, size_t requests,
                                 const std::string& dir, const std::string& endpoint) {
  replay::ServerOptions options = FreshServerOptions(dir, endpoint);
  replay::TableConfig table;
  table.sampler.kind = replay::SamplerKind::kUniform;
  table.retention.max_bytes = 0;
  options.tables.push_back(table);
  auto server = replay::ReplayServer::Start(options).value();
  {
    replay::ActorClientOptions client;
    client.endpoint = server->actor_endpoint();
    auto actor = replay::ActorClient::Connect(client).value();
    for (const Frame& f : prefill) Check(actor->SendFrame(f.key, f.bytes), "prefilling the store");
    Check(actor->Flush(milliseconds(60000)), "prefilling the store");
  }
  StandInActors ingest(server->actor_endpoint(), load, "load");
  replay::LearnerClientOptions learner_options;
  learner_options.endpoint = server->learner_endpoint();
  auto learner = replay::LearnerClient::Connect(learner_options).value();
  std::this_thread::sleep_for(milliseconds(100));  // let the ingest reach a steady state
  std::vector<double> latencies;
  for (size_t step = 1; step <= requests; ++step) {
    const auto start = Clock::now();
    Result<replay::SampleBatch> batch = learner->Sample(step, 1, 1, milliseconds(10000));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (batch.ok()) latencies.push_back(ms);
  }
  Latency result;
  {
    const nlohmann::json stats = nlohmann::json::parse(server->StatsJson());
    result.server_side = "server-side p50 " + stats["sample"]["latency_ms_p50"].dump() +
                         " ms, p99 " + stats["sample"]["latency_ms_p99"].dump() + " ms";
  }
  ingest.Stop();
  learner.reset();
  server->Stop();
  server.reset();
  std::filesystem::remove_all(dir);
  result.SetFrom(std::move(latencies));
  return result;
}

struct GroupLatency {
  Latency answered;       // every answered request, data or "not ready"
  size_t with_data = 0;   // requests answered with a group
  size_t unanswered = 0;  // requests the client gave up on (Unavailable)
  uint64_t ingested = 0;  // segments stored while the learner sampled
};

// A fifo group table as an RL learner uses it (each group once, a staleness bound, a capacity)
// while 4 actors flood it with small trajectories: one learner asks for 4 groups at a time,
// one request per ask (no waiting for data), so each figure is one round trip under ingest.
GroupLatency GroupSampleLatencyUnderFlood(const std::vector<Frame>& load, size_t requests,
                                          const std::string& dir, const std::string& endpoint) {
  replay::ServerOptions options = FreshServerOptions(dir, endpoint);
  replay::TableConfig table;
  table.name = "groups";
  table.unit = replay::SampleUnit::kGroup;
  table.sampler.kind = replay::SamplerKind::kFifo;
  table.max_staleness = 2;
  table.capacity = 1000;
  table.rate_limiter.min_fill = 1;
  table.rate_limiter.max_times_sampled = 1;
  options.tables.push_back(table);
  auto server = replay::ReplayServer::Start(options).value();
  StandInActors ingest(server->actor_endpoint(), load, "flood");
  replay::LearnerClientOptions learner_options;
  learner_options.endpoint = server->learner_endpoint();
  learner_options.table = "groups";
  auto learner = replay::LearnerClient::Connect(learner_options).value();
  std::this_thread::sleep_for(milliseconds(100));  // let the flood reach a steady state
  GroupLatency result;
  const uint64_t stored_before =
      nlohmann::json::parse(server->StatsJson())["ingest"]["segments"].get<uint64_t>();
  std::vector<double> latencies;
  uint64_t step = 1;
  for (size_t request = 0; request < requests; ++request) {
    const auto start = Clock::now();
    Result<replay::SampleBatch> batch = learner->Sample(step, 4, 1, milliseconds(0));
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (batch.ok()) {
      ++result.with_data;
      ++step;
    }
    if (batch.ok() || batch.status().code() == StatusCode::kResourceExhausted) {
      latencies.push_back(ms);
    } else {
      ++result.unanswered;
    }
    std::this_thread::sleep_for(milliseconds(1));  // the learner's own work between asks
  }
  {
    const nlohmann::json stats = nlohmann::json::parse(server->StatsJson());
    result.ingested = stats["ingest"]["segments"].get<uint64_t>() - stored_before;
    result.answered.server_side = "server-side p50 " + stats["sample"]["latency_ms_p50"].dump() +
                                  " ms, p99 " + stats["sample"]["latency_ms_p99"].dump() +
                                  " ms (replies with data)";
  }
  ingest.Stop();
  learner.reset();
  server->Stop();
  server.reset();
  std::filesystem::remove_all(dir);
  result.answered.SetFrom(std::move(latencies));
  return result;
}

// `serve --verify` on a store of `frames` (flushed into table files, so the check reads them
// all) against reading the same files whole: MB/s of store bytes, both from the page cache.
void VerifyCost(const std::vector<Frame>& frames, const std::string& dir) {
  (void)ReplayIngestRate(frames, dir, "tcp://127.0.0.1:0", /*keep=*/true);
  {
    Result<std::unique_ptr<replay::Store>> store = replay::Store::Open(dir, replay::StoreOptions());
    if (!store.ok()) {
      std::fprintf(stderr, "replay_bench: %s\n", store.status().ToString().c_str());
      std::exit(1);
    }
    rocksdb::FlushOptions flush;
    for (auto* family : {(*store)->segments(), (*store)->trajectories(), (*store)->sequence(),
                         (*store)->meta()}) {
      const rocksdb::Status flushed = (*store)->db()->Flush(flush, family);
      Check(flushed.ok() ? Status::Ok() : Status::IoError(flushed.ToString()),
            "flushing the store before measuring its files");
    }
  }
  uint64_t bytes = 0;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".sst") {
      files.push_back(entry.path().string());
      bytes += entry.file_size();
    }
  }
  auto read_all = [&] {
    std::vector<char> buffer(1 << 20);
    for (const std::string& file : files) {
      std::FILE* f = std::fopen(file.c_str(), "rb");
      while (f != nullptr && std::fread(buffer.data(), 1, buffer.size(), f) == buffer.size()) {
      }
      if (f != nullptr) std::fclose(f);
    }
  };
  auto verify = [&] {
    replay::StoreOptions read_only;
    read_only.read_only = true;
    Result<std::unique_ptr<replay::Store>> store = replay::Store::Open(dir, read_only);
    Status status = store.ok() ? (*store)->VerifyTables(/*all=*/true).status() : store.status();
    if (!status.ok()) std::fprintf(stderr, "replay_bench: %s\n", status.ToString().c_str());
  };
  auto time = [](const std::function<void()>& run) {
    const auto start = Clock::now();
    run();
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  read_all();  // into the page cache
  std::vector<double> raw, ours;
  for (int round = 0; round < 3; ++round) {
    raw.push_back(time(read_all));
    ours.push_back(time(verify));
  }
  std::sort(raw.begin(), raw.end());
  std::sort(ours.begin(), ours.end());
  const double mb = static_cast<double>(bytes) / 1e6;
  PrintWithBaseline("serve_verify_MBps", mb / ours[1], "MB/s", mb / raw[1],
                    "reading the same " + std::to_string(files.size()) + " table files (" +
                        std::to_string(bytes >> 20) +
                        " MiB) whole with fread, page cache warm, median of 3 alternating; ours "
                        "opens the store read-only and checks every table file of both stores "
                        "as serve --verify does");
  std::filesystem::remove_all(dir);
}

// --only curve: the same ingest over tcp loopback with and without CURVE, alternating in one
// run: what encrypting every frame (and the handshake, once per actor) costs. The keys are made
// here, as `strider keys generate` makes them.
void CurveCost(const std::vector<Frame>& frames, const std::string& label, const std::string& dir,
               bool quick) {
  const std::string key_dir = dir + "_keys";
  std::filesystem::remove_all(key_dir);
  for (const auto& [sub, name] : {std::pair{std::string(), "replay"},
                                  std::pair{std::string("/actors"), "bench-actor"}}) {
    Result<transport::CurveKeyPair> pair = transport::GenerateCurveKeyPair();
    Status written = pair.ok() ? transport::WriteCurveKeyFiles(key_dir + sub, name, *pair, true)
                               : pair.status();
    if (!written.ok()) {
      std::fprintf(stderr, "replay_bench: %s\n", written.ToString().c_str());
      std::exit(1);
    }
  }
  CurveKeys keys;
  keys.server.secret_key = key_dir + "/replay.key_secret";
  keys.server.authorized_keys = {key_dir + "/actors"};
  keys.client.secret_key = key_dir + "/actors/bench-actor.key_secret";
  keys.client.server_key = key_dir + "/replay.key";
  const std::string tcp = "tcp://127.0.0.1:0";
  std::vector<double> plain, curve;
  auto measure_plain = [&] { return ReplayIngestRate(frames, dir + "_ours", tcp); };
  auto measure_curve = [&] { return ReplayIngestRate(frames, dir + "_ours", tcp, false, &keys); };
  if (!quick) {
    (void)measure_plain();
    (void)measure_curve();
  }
  const int rounds = quick ? 1 : 6;
  for (int round = 0; round < rounds; ++round) {
    // Each goes first in half the rounds (the run after another is sometimes slower here).
    if (round % 2 == 0) {
      plain.push_back(measure_plain());
      curve.push_back(measure_curve());
    } else {
      curve.push_back(measure_curve());
      plain.push_back(measure_plain());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  };
  PrintWithBaseline("ingest_" + label + "_4_actors_curve", median(curve), "MB/s", median(plain),
                    "the same ingest without CURVE (4 actors over tcp loopback, 64 MiB credit), "
                    "same run, median of " + std::to_string(rounds) +
                        " rounds alternating which goes first" +
                        (quick ? std::string() : std::string(" after a warm-up of each")) +
                        "; ours: server key pair, ZAP handler, every frame encrypted; " +
                        PrioritiesText());
  std::filesystem::remove_all(key_dir);
}

}  // namespace
}  // namespace strider::bench

int main(int argc, char** argv) {
  using namespace strider::bench;
  bool quick = false;
  std::string only;  // empty: everything
  std::string only_size;  // empty: both segment sizes
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--only" && i + 1 < argc && (std::string(argv[i + 1]) == "ingest" ||
                                                   std::string(argv[i + 1]) == "curve" ||
                                                   std::string(argv[i + 1]) == "latency" ||
                                                   std::string(argv[i + 1]) == "verify")) {
      only = argv[++i];
    } else if (arg == "--batch-bytes" && i + 1 < argc) {
      batch_bytes = std::stoull(argv[++i]);
    } else if (arg == "--actor-nice" && i + 1 < argc) {
      actor_nice = std::stoi(argv[++i]);
    } else if (arg == "--intake-nice" && i + 1 < argc) {
      intake_nice = std::stoi(argv[++i]);
    } else if (arg == "--size" && i + 1 < argc && (std::string(argv[i + 1]) == "64KiB" ||
                                                   std::string(argv[i + 1]) == "1MiB")) {
      only_size = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: replay_bench [--quick] [--only ingest|curve|latency|verify] [--size 64KiB|1MiB] "
                   "[--batch-bytes N] [--actor-nice N] [--intake-nice N]\n");
      return 2;
    }
  }
  // stdout is for the JSON lines only.
  spdlog::set_default_logger(spdlog::stderr_color_mt("replay_bench"));
  spdlog::set_level(spdlog::level::warn);
  // The allocator set up as `strider replay serve` sets it (one heap, freed buffers kept):
  // every munmap takes the process-wide mmap lock and every fresh page faults, which stalls all
  // threads, the sampling ones included. Applies to the baselines and the server alike.
  strider::replay::ConfigureServerProcessMemory();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("replay_bench_" + std::to_string(::getpid())))
          .string();
  const std::string tcp = "tcp://127.0.0.1:0";
  const std::string ipc = "ipc://" + dir + ".sock";
  // ZeroMQ leaves an ipc endpoint's socket file behind (the server's and its sampling one's).
  struct RemoveSockets {
    std::string base;
    ~RemoveSockets() {
      std::error_code ignored;
      std::filesystem::remove(base + ".sock", ignored);
      std::filesystem::remove(base + ".sock.sample", ignored);
    }
  } remove_sockets{dir};
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const uint64_t volume = quick ? (32ull << 20) : (256ull << 20);
  if (only == "verify") {
    VerifyCost(MakeFrames(size_t{1} << 20, volume >> 20, 4), dir + "_verify");
    return 0;
  }
  if (only == "curve") {
    for (size_t size : {size_t{64} << 10, size_t{1} << 20}) {
      const std::string label = size == (size_t{64} << 10) ? "64KiB" : "1MiB";
      if (!only_size.empty() && only_size != label) continue;
      CurveCost(MakeFrames(size, volume / size, size), label, dir, quick);
    }
    return 0;
  }
  for (size_t size : {size_t{64} << 10, size_t{1} << 20}) {
    if (only == "latency") break;
    const std::string label = size == (size_t{64} << 10) ? "64KiB" : "1MiB";
    if (!only_size.empty() && only_size != label) continue;
    const std::vector<Frame> frames = MakeFrames(size, volume / size, size);
    // Alternate the runs so machine noise hits all of them, and rotate their order from round to
    // round so each takes each place once: on these virtual machines the run right after the raw
    // loop was slower whichever it was (in profiles its writes into the page cache took up to 10
    // times longer), so a fixed order would always charge the same one. Medians of the rounds
    // are reported. A first round is a warm-up and not counted: a fresh process faults its heap
    // in (100-200 page faults per MB in the first run of each kind, next to none later), which a
    // running server pays once, not per segment.
    std::vector<double> raw_rates;
    std::vector<double> ours_tcp, ours_ipc;
    std::vector<double> zmq_tcp, zmq_ipc;
    struct Run {
      std::function<double()> measure;  // MB/s
      std::vector<double>* rates;
    };
    const std::vector<Run> runs = {
        {[&] { return RawRocksDbRate(frames, dir + "_raw"); }, &raw_rates},
        {[&] { return ReplayIngestRate(frames, dir + "_ours", tcp); }, &ours_tcp},
        {[&] { return ReplayIngestRate(frames, dir + "_ours", ipc); }, &ours_ipc},
        {[&] { return RawZmqRate(frames, tcp); }, &zmq_tcp},
        {[&] { return RawZmqRate(frames, ipc); }, &zmq_ipc},
    };
    const int repeats = quick ? 1 : static_cast<int>(runs.size());
    if (!quick) {
      for (const Run& run : runs) (void)run.measure();
    }
    for (int round = 0; round < repeats; ++round) {
      for (size_t i = 0; i < runs.size(); ++i) {
        const Run& run = runs[(i + round) % runs.size()];
        run.rates->push_back(run.measure());
      }
    }
    const std::string same =
        "same run, median of " + std::to_string(repeats) +
        (quick ? std::string() : std::string(" rounds in rotating order after a warm-up round"));
    const std::string raw_is =
        "raw RocksDB puts of the same keys and values, 4 threads, Store::MakeOptions (lz4, WAL "
        "on, no sync), random tokens, " + same;
    for (const auto& [suffix, ours, zmq_rates, transport] :
         {std::tuple{std::string(), ours_tcp, zmq_tcp, std::string("tcp loopback")},
          std::tuple{std::string("_ipc"), ours_ipc, zmq_ipc, std::string("ipc")}}) {
      const double ingest = median(ours);
      PrintWithBaseline("ingest_" + label + "_4_actors" + suffix, ingest, "MB/s",
                        median(raw_rates),
                        raw_is + "; actors over " + transport + "; " + PrioritiesText());
      PrintWithBaseline("stream_" + label + "_4_actors" + suffix, ingest, "MB/s",
                        median(zmq_rates),
                        "raw ZeroMQ PUSH/PULL of the same frames over " + transport +
                            ", 4 senders, zero-copy sends, " + same);
    }
  }
  if (only != "ingest") {
    const std::vector<Frame> prefill = MakeFrames(64 << 10, quick ? 64 : 512, 1);
    const std::vector<Frame> load = MakeFrames(64 << 10, quick ? 256 : 2048, 2);
    // A warm-up pass, not counted, as for ingest: the first server of a fresh process faults its
    // heap in while it runs, which put whichever transport went first at a disadvantage.
    if (!quick) (void)SampleLatencyUnderIngest(prefill, load, 200, dir + "_latency", tcp);
    for (const auto& [suffix, endpoint] : {std::pair{std::string(), tcp},
                                           std::pair{std::string("_ipc"), ipc}}) {
      Latency latency = SampleLatencyUnderIngest(prefill, load, quick ? 200 : 1000,
                                                 dir + "_latency", endpoint);
      const std::string target = "the 5 ms target; measured at the client over " +
                                 std::to_string(latency.samples) +
                                 " one-segment samples; actors and learner over " +
                                 endpoint.substr(0, 3) + "; " + PrioritiesText() + "; " +
                                 latency.server_side;
      PrintWithBaseline("sample_latency_p50_64KiB_under_ingest" + suffix, latency.p50_ms, "ms",
                        5.0, target);
      PrintWithBaseline("sample_latency_p99_64KiB_under_ingest" + suffix, latency.p99_ms, "ms",
                        5.0, target);
    }
    const std::vector<Frame> flood = MakeGroupFrames(4 << 10, quick ? 16384 : 131072, 3);
    GroupLatency group = GroupSampleLatencyUnderFlood(flood, quick ? 500 : 5000,
                                                      dir + "_group", tcp);
    const std::string target =
        "the 5 ms target; measured at the client over " +
        std::to_string(group.answered.samples) + " answered requests for 4 groups (" +
        std::to_string(group.with_data) + " with data, the rest not ready), " +
        std::to_string(group.unanswered) + " unanswered, while " +
        std::to_string(group.ingested) +
        " 4 KiB one-segment trajectories were stored; fifo group table, max_times_sampled 1; "
        "over tcp; " + PrioritiesText() + "; " + group.answered.server_side;
    PrintWithBaseline("group_sample_latency_p50_under_flood", group.answered.p50_ms, "ms", 5.0,
                      target);
    PrintWithBaseline("group_sample_latency_p99_under_flood", group.answered.p99_ms, "ms", 5.0,
                      target);
  }
  return 0;
}
