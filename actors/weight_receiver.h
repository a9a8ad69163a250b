// The actor's weight subscriber: a thread that polls the learner's publisher, loads each newer
// version into a model of the actor's config, and leaves it for the decode loop, which swaps it
// into the engine between steps (actor.h has the picture). Loading happens here so that the loop
// never waits on the network or on a parse of the weights.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "common/model/model.h"
#include "common/model/precision.h"
#include "common/mutex.h"
#include "common/transport/auth.h"

namespace strider::actors {

struct WeightReceiverOptions {
  std::string endpoint;  // a WeightPublisher; empty: Start starts nothing
  std::chrono::milliseconds poll{1000};
  transport::ClientAuth auth;
  uint64_t initial_version = 0;  // the version the actor starts with: only newer ones come
  Precision precision = Precision::kFloat32;  // each version's weights are held in this
};

class WeightReceiver {
 public:
  // `on_update` is called on the subscriber's thread after each update it fetched (loaded or
  // not), to wake a loop that waits for one.
  WeightReceiver(WeightReceiverOptions options, ModelConfig config,
                 std::function<void()> on_update);
  ~WeightReceiver() { Stop(); }
  WeightReceiver(const WeightReceiver&) = delete;
  WeightReceiver& operator=(const WeightReceiver&) = delete;

  void Start();
  // Stops and joins the thread; idempotent.
  void Stop();

  struct Update {
    std::shared_ptr<const Model> model;
    uint64_t version = 0;
  };
  // The newest loaded version not yet taken; an older one not taken in time is skipped.
  std::optional<Update> Take() EXCLUDES(mutex_);
  // Updates that failed to fetch or to load.
  int64_t errors() const { return errors_.load(); }

 private:
  void Loop(std::stop_token stop);

  const WeightReceiverOptions options_;
  const ModelConfig config_;
  const std::function<void()> on_update_;
  std::atomic<int64_t> errors_{0};
  Mutex mutex_;
  std::shared_ptr<const Model> pending_model_ GUARDED_BY(mutex_);
  uint64_t pending_version_ GUARDED_BY(mutex_) = 0;
  std::jthread thread_;
};

}  // namespace strider::actors
