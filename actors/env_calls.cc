#include "actors/env_calls.h"

#include <exception>
#include <string>
#include <thread>
#include <utility>

namespace strider::actors {

void Wake::Notify() {
  {
    MutexLock lock(&mutex_);
    flag_ = true;
  }
  cv_.Signal();
}

void Wake::WaitFor(std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  MutexLock lock(&mutex_);
  while (!flag_) {
    if (!cv_.WaitUntil(&mutex_, deadline)) break;
  }
  flag_ = false;
}

bool EnvCall::done() const {
  MutexLock lock(&mutex_);
  return done_;
}

Result<envs::Observation> EnvCall::TakeReset() {
  MutexLock lock(&mutex_);
  return std::move(*reset_);
}

Result<envs::StepResult> EnvCall::TakeStep() {
  MutexLock lock(&mutex_);
  return std::move(*step_);
}

void EnvCall::Answer(Result<envs::Observation> reset) {
  MutexLock lock(&mutex_);
  reset_ = std::move(reset);
  done_ = true;
}

void EnvCall::Answer(Result<envs::StepResult> step) {
  MutexLock lock(&mutex_);
  step_ = std::move(step);
  done_ = true;
}

EnvCalls::EnvCalls() : shared_(std::make_shared<Shared>()) {}

// Runs `work` on a thread of its own, timed; an exception it throws becomes the call's error.
template <typename Work>
std::shared_ptr<EnvCall> EnvCalls::Start(Work work) {
  auto call = std::make_shared<EnvCall>();
  ++shared_->running;
  std::thread([call, work = std::move(work), shared = shared_]() mutable {
    std::optional<decltype(work())> result;
    const auto start = Clock::now();
    try {
      result = work();
    } catch (const std::exception& e) {
      result = Status::Internal(std::string("environment threw: ") + e.what());
    }
    shared->spent_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    call->Answer(std::move(*result));
    --shared->running;
    shared->wake.Notify();
  }).detach();
  return call;
}

std::shared_ptr<EnvCall> EnvCalls::Reset(std::shared_ptr<EnvBox> box,
                                         const envs::EnvironmentConfig& config, uint64_t seed) {
  return Start([box = std::move(box), config, seed]() -> Result<envs::Observation> {
    Result<std::unique_ptr<envs::Environment>> made = envs::MakeEnvironment(config);
    if (!made.ok()) return made.status();
    box->env = std::move(*made);
    box->spec = box->env->Describe();
    return box->env->Reset(seed, {});
  });
}

std::shared_ptr<EnvCall> EnvCalls::Step(std::shared_ptr<EnvBox> box, envs::Action action) {
  return Start([box = std::move(box), action = std::move(action)]() -> Result<envs::StepResult> {
    return box->env->Step(action);
  });
}

void EnvCalls::Close(std::shared_ptr<EnvBox> box) {
  ++shared_->running;
  std::thread([box = std::move(box), shared = shared_] {
    box->env->Close();
    --shared->running;
  }).detach();
}

void EnvCalls::WaitIdle(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  while (shared_->running > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace strider::actors
