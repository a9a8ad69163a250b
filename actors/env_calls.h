// The actor's environment calls, each on a short-lived thread of its own, so that a slow or
// stuck environment holds up its episode only (actor.h has the picture).
//
// A call's thread owns nothing but shared pointers: the box with its environment, the call it
// answers and the counters here. A call past its time limit is abandoned by the decode loop and
// its thread finishes whenever the environment returns, after the actor may be gone; the state
// it touches lives as long as it does.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "envs/environment.h"

namespace strider::actors {

// Wakes the decode loop out of an idle wait: an environment answered, or weights arrived.
class Wake {
 public:
  void Notify() EXCLUDES(mutex_);
  // Returns after `timeout`, or earlier once Notify was called since the last wait returned.
  void WaitFor(std::chrono::milliseconds timeout) EXCLUDES(mutex_);

 private:
  Mutex mutex_;
  CondVar cv_;
  bool flag_ GUARDED_BY(mutex_) = false;
};

// The environment of one episode, shared with the thread of a call in progress.
struct EnvBox {
  std::unique_ptr<envs::Environment> env;
  envs::EnvironmentSpec spec;
};

// One Reset (making the environment first) or Step in progress. Its thread answers once; the
// decode loop polls done() and then takes the answer.
class EnvCall {
 public:
  bool done() const EXCLUDES(mutex_);
  Clock::time_point started() const { return started_; }
  // The answer, moved out; only after done() said so.
  Result<envs::Observation> TakeReset() EXCLUDES(mutex_);
  Result<envs::StepResult> TakeStep() EXCLUDES(mutex_);

 private:
  friend class EnvCalls;
  void Answer(Result<envs::Observation> reset) EXCLUDES(mutex_);
  void Answer(Result<envs::StepResult> step) EXCLUDES(mutex_);

  const Clock::time_point started_ = Clock::now();
  mutable Mutex mutex_;
  bool done_ GUARDED_BY(mutex_) = false;
  std::optional<Result<envs::Observation>> reset_ GUARDED_BY(mutex_);
  std::optional<Result<envs::StepResult>> step_ GUARDED_BY(mutex_);
};

// Starts environment calls on their own threads and counts them. Calls are started from the
// decode loop only; the counters are read from it too.
class EnvCalls {
 public:
  EnvCalls();

  // Makes the environment of `config` in `box` and resets it with `seed`.
  std::shared_ptr<EnvCall> Reset(std::shared_ptr<EnvBox> box, const envs::EnvironmentConfig& config,
                                 uint64_t seed);
  std::shared_ptr<EnvCall> Step(std::shared_ptr<EnvBox> box, envs::Action action);
  // Closes the box's environment off the loop (a process may take a while to go).
  void Close(std::shared_ptr<EnvBox> box);

  // Calls (closes included) whose thread has not finished.
  int64_t running() const { return shared_->running.load(); }
  // Time inside environment calls so far, summed over calls.
  double seconds() const { return static_cast<double>(shared_->spent_ns.load()) * 1e-9; }
  // Waits up to `timeout` for every call's thread to finish.
  void WaitIdle(std::chrono::milliseconds timeout) const;

  // The loop's idle wait, which every answered call ends early.
  Wake& wake() { return shared_->wake; }

 private:
  template <typename Work>
  std::shared_ptr<EnvCall> Start(Work work);

  struct Shared {
    Wake wake;
    std::atomic<int64_t> running{0};
    std::atomic<int64_t> spent_ns{0};  // nanoseconds inside calls, added by the call threads
  };
  std::shared_ptr<Shared> shared_;
};

}  // namespace strider::actors
