// The mutex, scoped lock and condition variable that carry Clang's thread-safety attributes
// (common/thread_annotations.h), so that members marked GUARDED_BY(mu_) are checked at compile
// time in the clang build tree (STRIDER_THREAD_SAFETY=ON). Thin wrappers over std::mutex and
// std::condition_variable: the same cost and the same behaviour.
//
// Waiting on a condition is written as a loop over the predicate, so the analysis sees the
// lock held while the condition is read:
//
//   MutexLock lock(&mu_);
//   while (queue_.empty() && !stopped_) ready_.Wait(&mu_);
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "common/thread_annotations.h"

namespace strider {

class CondVar;

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

  // Tells the analysis the calling thread holds this mutex, for code it cannot follow (a
  // callback invoked under the lock). std::mutex cannot report its owner, so nothing is
  // checked at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

  // BasicLockable, for std::scoped_lock over several mutexes. Prefer MutexLock.
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` from construction to the end of the scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A reader-writer mutex: held by one writer (Lock) or shared by any number of readers
// (ReaderLock). Members it guards are read with either hold and written only with Lock.
class CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  void ReaderLock() ACQUIRE_SHARED() { mu_.lock_shared(); }
  void ReaderUnlock() RELEASE_SHARED() { mu_.unlock_shared(); }

  // As Mutex::AssertHeld, for a hold of either kind; nothing is checked at run time.
  void AssertReaderHeld() const ASSERT_SHARED_CAPABILITY(this) {}

 private:
  std::shared_mutex mu_;
};

// Holds `mu` alone from construction to the end of the scope.
class SCOPED_CAPABILITY WriterMutexLock {
 public:
  explicit WriterMutexLock(SharedMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~WriterMutexLock() RELEASE() { mu_->Unlock(); }
  WriterMutexLock(const WriterMutexLock&) = delete;
  WriterMutexLock& operator=(const WriterMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// Holds `mu` shared from construction to the end of the scope.
class SCOPED_CAPABILITY ReaderMutexLock {
 public:
  explicit ReaderMutexLock(SharedMutex* mu) ACQUIRE_SHARED(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() RELEASE() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  SharedMutex* const mu_;
};

// A condition variable waited on with a strider::Mutex held. Each wait releases the mutex while
// blocked and holds it again on return, as std::condition_variable does; wake-ups may be
// spurious, so callers wait in a loop over their predicate.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) REQUIRES(mu) {
    Borrowed lock(mu);
    cv_.wait(lock.get());
  }

  // False when `timeout` passed without a wake-up. A timeout too long for the steady clock to
  // add (nanoseconds::max() as "forever") waits until a wake-up: added as it is, it would
  // overflow into a deadline already past.
  bool WaitFor(Mutex* mu, std::chrono::nanoseconds timeout) REQUIRES(mu) {
    const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
    return WaitUntil(mu, now + std::min(timeout, kFarAhead));
  }

  // False when `deadline` passed without a wake-up.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    Borrowed lock(mu);
    return cv_.wait_until(lock.get(), deadline) == std::cv_status::no_timeout;
  }

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  // Further ahead than any wait needs to end (a century), and near enough that the steady
  // clock's time since boot plus this cannot overflow.
  static constexpr std::chrono::nanoseconds kFarAhead = std::chrono::hours(24 * 365 * 100);

  // The caller's mutex lent to std::condition_variable for one wait. The wait unlocks and
  // relocks it, and holds it again when it returns or throws; ownership goes back to the caller's
  // lock (MutexLock, or Lock()) on every exit, so the mutex is unlocked once, by the caller.
  class Borrowed {
   public:
    explicit Borrowed(Mutex* mu) : lock_(mu->mu_, std::adopt_lock) {}
    ~Borrowed() { lock_.release(); }
    Borrowed(const Borrowed&) = delete;
    Borrowed& operator=(const Borrowed&) = delete;
    std::unique_lock<std::mutex>& get() { return lock_; }

   private:
    std::unique_lock<std::mutex> lock_;
  };

  std::condition_variable cv_;
};

}  // namespace strider
