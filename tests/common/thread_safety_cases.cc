// Cases for clang's thread-safety analysis over common/mutex.h, compiled one at a time by
// thread_safety_check.cmake: STRIDER_CASE_LOCKED must compile with -Werror=thread-safety, and
// each other case, one wrong access, must fail with the diagnostic named in the script.
#include <chrono>

#include "common/mutex.h"

namespace strider {
namespace {

class Counter {
 public:
  void Add(int n) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    AddLocked(n);
    changed_.SignalAll();
  }

  int WaitForAtLeast(int n) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    while (value_ < n) changed_.Wait(&mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    while (value_ < n + 1 && changed_.WaitUntil(&mu_, deadline)) {
    }
    (void)changed_.WaitFor(&mu_, std::chrono::nanoseconds(1));
    return value_;
  }

  int Store() EXCLUDES(store_mu_) {
    ReaderMutexLock lock(&store_mu_);
    return store_;
  }

  void SetStore(int n) EXCLUDES(store_mu_) {
    WriterMutexLock lock(&store_mu_);
    store_ = n;
  }

#if defined(STRIDER_CASE_UNLOCKED_READ)
  int UnlockedRead() { return value_; }
#elif defined(STRIDER_CASE_UNLOCKED_WRITE)
  void UnlockedWrite() { value_ = 1; }
#elif defined(STRIDER_CASE_MISSING_REQUIRES)
  void MissingRequires() { AddLocked(1); }
#elif defined(STRIDER_CASE_SHARED_WRITE)
  void SharedWrite() {
    ReaderMutexLock lock(&store_mu_);
    store_ = 1;
  }
#elif defined(STRIDER_CASE_WAIT_UNLOCKED)
  void WaitUnlocked() { changed_.Wait(&mu_); }
#elif !defined(STRIDER_CASE_LOCKED)
#error "define one STRIDER_CASE_*"
#endif

 private:
  void AddLocked(int n) REQUIRES(mu_) { value_ += n; }

  Mutex mu_;
  CondVar changed_;
  int value_ GUARDED_BY(mu_) = 0;
  SharedMutex store_mu_;
  int store_ GUARDED_BY(store_mu_) = 0;
};

}  // namespace
}  // namespace strider

int main() {
  strider::Counter counter;
  counter.Add(1);
  counter.SetStore(counter.WaitForAtLeast(1));
  return counter.Store() == 1 ? 0 : 1;
}
