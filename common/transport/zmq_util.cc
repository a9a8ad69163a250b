#include "common/transport/zmq_util.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <thread>

namespace strider::transport {
namespace {

// struct sched_attr of sched_setattr(2); glibc has no wrapper.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;  // for SCHED_OTHER on EEVDF kernels: the thread's slice
  uint64_t sched_deadline;
  uint64_t sched_period;
  uint32_t sched_util_min;
  uint32_t sched_util_max;
};

// 0.1 ms instead of the default 3 ms: short enough to preempt on wake-up, long enough for a
// request to be answered within one slice most of the time.
constexpr uint64_t kLatencySliceNs = 100000;

void SetSlice(pid_t tid) {
#if defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
  SchedAttr attr{};
  if (syscall(SYS_sched_getattr, tid, &attr, sizeof(attr), 0) != 0) return;
  if (attr.sched_policy != SCHED_OTHER) return;  // leave real-time and batch threads alone
  attr.size = sizeof(attr);
  attr.sched_flags = 0;
  attr.sched_runtime = kLatencySliceNs;
  // Older kernels reject or ignore a runtime for SCHED_OTHER: nothing to do then.
  (void)syscall(SYS_sched_setattr, tid, &attr, 0);
#else
  (void)tid;
#endif
}

}  // namespace

void MarkLatencySensitive() { SetSlice(0); }

void NameThisThread(const std::string& name) {
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
}

bool LowerPriority(pid_t thread_id, int nice_steps) {
  if (nice_steps <= 0) return true;
  // On Linux the nice value belongs to the thread, not the process (setpriority(2), NOTES).
  const id_t id = thread_id == 0 ? static_cast<id_t>(syscall(SYS_gettid)) : thread_id;
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, id);
  if (errno != 0) return false;
  return setpriority(PRIO_PROCESS, id, std::min(current + nice_steps, 19)) == 0;
}

NamedContext::NamedContext() {
  // A process-wide number names this context's threads "<n>/ZMQbg/IO/<i>" (15 characters at
  // most, the kernel's limit for thread names).
  static std::atomic<int> next{1};
  prefix_ = next++ % 10000;
  context_.set(zmq::ctxopt::thread_name_prefix, prefix_);
}

std::vector<pid_t> NamedContext::IoThreads() const {
  const std::string wanted = std::to_string(prefix_) + "/ZMQbg/IO/";
  std::vector<pid_t> found;
  // A new I/O thread names itself once it runs: look again for a short while until it has.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::error_code error;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      if (!std::getline(comm, name) || name.rfind(wanted, 0) != 0) continue;
      try {
        found.push_back(static_cast<pid_t>(std::stoi(task.path().filename().string())));
      } catch (...) {
      }
    }
    if (!found.empty() || error) return found;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return found;
}

void LatencySensitiveContext::MarkIoThreads() {
  for (pid_t thread_id : IoThreads()) SetSlice(thread_id);
}

Status CheckEndpoint(std::string_view endpoint) {
  for (std::string_view scheme : {"tcp://", "ipc://", "inproc://"}) {
    if (endpoint.size() > scheme.size() && endpoint.substr(0, scheme.size()) == scheme) {
      if (scheme == "tcp://" && endpoint.find(':', scheme.size()) == std::string_view::npos) {
        return Status::InvalidArgument("endpoint '" + std::string(endpoint) +
                                       "' needs a port (tcp://host:port, port 0 for any)");
      }
      return Status::Ok();
    }
  }
  return Status::InvalidArgument("endpoint '" + std::string(endpoint) +
                                 "' must start with tcp://, ipc:// or inproc://");
}

Result<zmq::socket_t> MakeSocket(zmq::context_t& context, zmq::socket_type type,
                                 size_t hard_max_message_bytes) {
  try {
    zmq::socket_t socket(context, type);
    socket.set(zmq::sockopt::linger, 0);
    if (hard_max_message_bytes > 0) {
      socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(hard_max_message_bytes));
    }
    return socket;
  } catch (const zmq::error_t& error) {
    return Status::Internal(std::string("cannot create a ZeroMQ socket: ") + error.what());
  }
}

Result<std::string> Bind(zmq::socket_t& socket, const std::string& endpoint) {
  STRIDER_RETURN_IF_ERROR(CheckEndpoint(endpoint));
  try {
    socket.bind(endpoint);
    return socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& error) {
    return Status::Unavailable("cannot bind " + endpoint + ": " + error.what());
  }
}

Status Connect(zmq::socket_t& socket, const std::string& endpoint) {
  STRIDER_RETURN_IF_ERROR(CheckEndpoint(endpoint));
  try {
    socket.connect(endpoint);
    return Status::Ok();
  } catch (const zmq::error_t& error) {
    return Status::Unavailable("cannot connect to " + endpoint + ": " + error.what());
  }
}

std::string LocalEndpoint(const std::string& bound_endpoint) {
  std::string endpoint = bound_endpoint;
  for (std::string wildcard : {"tcp://0.0.0.0:", "tcp://*:"}) {
    if (endpoint.rfind(wildcard, 0) == 0) {
      return "tcp://127.0.0.1:" + endpoint.substr(wildcard.size());
    }
  }
  return endpoint;
}

Result<bool> WaitReadable(zmq::socket_t& socket, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  try {
    zmq::poll(&item, 1, timeout);
  } catch (const zmq::error_t& error) {
    if (error.num() == EINTR) return false;
    return Status::Internal(std::string("zmq poll failed: ") + error.what());
  }
  return (item.revents & ZMQ_POLLIN) != 0;
}

Result<std::vector<zmq::message_t>> ReceiveParts(zmq::socket_t& socket) {
  std::vector<zmq::message_t> parts;
  try {
    while (true) {
      zmq::message_t part;
      const auto received =
          socket.recv(part, parts.empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
      if (!received) return parts;  // nothing waiting
      const bool more = part.more();
      parts.push_back(std::move(part));
      if (!more) return parts;
    }
  } catch (const zmq::error_t& error) {
    if (error.num() == EINTR) return parts;
    return Status::Internal(std::string("zmq receive failed: ") + error.what());
  }
}

Status SendParts(zmq::socket_t& socket, const std::vector<std::string_view>& parts,
                 bool dont_wait) {
  try {
    for (size_t i = 0; i < parts.size(); ++i) {
      zmq::send_flags flags = i + 1 < parts.size() ? zmq::send_flags::sndmore
                                                   : zmq::send_flags::none;
      if (dont_wait) flags = flags | zmq::send_flags::dontwait;
      const auto sent = socket.send(zmq::const_buffer(parts[i].data(), parts[i].size()), flags);
      if (!sent) return Status::ResourceExhausted("zmq send would block (peer pipe full)");
    }
    return Status::Ok();
  } catch (const zmq::error_t& error) {
    return Status::Unavailable(std::string("zmq send failed: ") + error.what());
  }
}

Status SendShared(zmq::socket_t& socket, std::shared_ptr<const std::string> bytes,
                  bool dont_wait) {
  // The message owns one reference, released by ZeroMQ (possibly on its I/O thread) when done.
  auto* owner = new std::shared_ptr<const std::string>(std::move(bytes));
  const std::string& data = **owner;
  zmq::message_t message(
      const_cast<char*>(data.data()), data.size(),
      [](void*, void* hint) { delete static_cast<std::shared_ptr<const std::string>*>(hint); },
      owner);
  try {
    const auto sent =
        socket.send(message, dont_wait ? zmq::send_flags::dontwait : zmq::send_flags::none);
    // Not sent: `message` still owns the reference and releases it when it goes out of scope.
    if (!sent) return Status::ResourceExhausted("zmq send would block (peer pipe full)");
    return Status::Ok();
  } catch (const zmq::error_t& error) {
    return Status::Unavailable(std::string("zmq send failed: ") + error.what());
  }
}

}  // namespace strider::transport
