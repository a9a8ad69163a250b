#include "common/subprocess.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace strider {
namespace {

// The one forking thread. Requests are served one at a time; the thread is detached and never
// ends, so no child loses its parent thread while the process lives.
class Forker {
 public:
  static Forker& Get() {
    static Forker* forker = new Forker();  // never destroyed: it must outlive every caller
    return *forker;
  }

  pid_t Fork(const std::function<void()>& in_child) {
    std::lock_guard<std::mutex> one_at_a_time(caller_mutex_);
    std::unique_lock<std::mutex> lock(mutex_);
    request_ = &in_child;
    done_ = false;
    wake_.notify_all();
    finished_.wait(lock, [&] { return done_; });
    errno = error_;
    return pid_;
  }

 private:
  Forker() { std::thread([this] { Serve(); }).detach(); }

  void Serve() {
    const pid_t parent = ::getpid();
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return request_ != nullptr; });
      const std::function<void()>* body = request_;
      request_ = nullptr;
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        // The parent may have died before the prctl: then nothing would ever signal us.
        if (::getppid() != parent) ::_exit(1);
        (*body)();
        ::_exit(127);
      }
      pid_ = pid;
      error_ = pid < 0 ? errno : 0;
      done_ = true;
      finished_.notify_all();
    }
  }

  std::mutex caller_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const std::function<void()>* request_ = nullptr;
  bool done_ = false;
  pid_t pid_ = -1;
  int error_ = 0;
};

}  // namespace

pid_t ForkWithLifeline(const std::function<void()>& in_child) {
  return Forker::Get().Fork(in_child);
}

}  // namespace strider
