#include "actors/weight_receiver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "common/clock.h"
#include "common/transport/weight_stream.h"

namespace strider::actors {

using std::chrono::milliseconds;

WeightReceiver::WeightReceiver(WeightReceiverOptions options, ModelConfig config,
                               std::function<void()> on_update)
    : options_(std::move(options)), config_(std::move(config)), on_update_(std::move(on_update)) {}

void WeightReceiver::Start() {
  if (options_.endpoint.empty()) return;
  thread_ = std::jthread([this](std::stop_token stop) { Loop(stop); });
}

void WeightReceiver::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

std::optional<WeightReceiver::Update> WeightReceiver::Take() {
  MutexLock lock(&mutex_);
  if (!pending_model_) return std::nullopt;
  return Update{std::move(pending_model_), pending_version_};
}

void WeightReceiver::Loop(std::stop_token stop) {
  transport::WeightSubscriberOptions subscriber_options;
  subscriber_options.endpoint = options_.endpoint;
  subscriber_options.reply_timeout = std::max(milliseconds(2000), options_.poll);
  subscriber_options.auth = options_.auth;
  std::unique_ptr<transport::WeightSubscriber> subscriber;
  uint64_t have = options_.initial_version;
  while (!stop.stop_requested()) {
    if (!subscriber) {
      auto connected = transport::WeightSubscriber::Connect(subscriber_options);
      if (connected.ok()) subscriber = std::move(*connected);
    }
    if (subscriber) {
      Result<std::optional<transport::WeightUpdate>> update = subscriber->FetchNewer(have);
      if (!update.ok()) {
        if (update.status().code() != StatusCode::kUnavailable) {
          ++errors_;
          spdlog::warn("weights: {}", update.status().ToString());
        }
      } else if (update->has_value()) {
        // Loaded straight from the checked bytes: no file per update.
        Result<std::unique_ptr<Model>> loaded = Model::LoadFromBytes(
            config_, (*update)->bytes, "weights version " + std::to_string((*update)->version));
        if (loaded.ok()) {
          // Converted here, on the weight thread, so the swap in the decode loop stays a pointer.
          if (Status converted = ApplyWeightPrecision(loaded->get(), options_.precision);
              !converted.ok()) {
            loaded = converted;
          }
        }
        if (!loaded.ok()) {
          ++errors_;
          spdlog::error("weights: version {} does not load into model '{}': {}", (*update)->version,
                        config_.name, loaded.status().ToString());
          have = (*update)->version;  // do not fetch the same bad bytes again and again
        } else {
          MutexLock lock(&mutex_);
          pending_model_ = std::shared_ptr<const Model>(std::move(*loaded));
          pending_version_ = (*update)->version;
          have = pending_version_;
          spdlog::info("weights: version {} received ({} bytes)", have, (*update)->bytes.size());
        }
        on_update_();  // an idle loop (a synchronous round waiting for it) takes it now
      }
    }
    const auto until = Clock::now() + options_.poll;
    while (!stop.stop_requested() && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
}

}  // namespace strider::actors
