#include "envs/external/external_env.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/subprocess.h"
#include "envs/messages.h"

extern char** environ;

namespace strider::envs {
namespace {

using nlohmann::json;

constexpr int64_t kStartTimeoutMs = 10000;

// One child process and the socket it answers on.
class Process {
 public:
  explicit Process(EnvironmentConfig config) : config_(std::move(config)) {}
  ~Process() { Stop(); }

  bool running() const { return pid_ > 0; }
  // Running and not exited since the last look (reaps a child that died while idle).
  bool alive() { return !Reaped(); }

  Status Start() {
    Stop();
    socket_ = std::make_unique<zmq::socket_t>(Context(), zmq::socket_type::dealer);
    socket_->set(zmq::sockopt::linger, 0);
    socket_->bind("tcp://127.0.0.1:*");
    const std::string endpoint = socket_->get(zmq::sockopt::last_endpoint);
    // The environment for the child, built before fork (only exec-safe calls after it).
    std::vector<std::string> env_storage;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "STRIDER_ENV_ENDPOINT=", 21) != 0) env_storage.emplace_back(*e);
    }
    env_storage.push_back("STRIDER_ENV_ENDPOINT=" + endpoint);
    std::vector<char*> envp;
    for (std::string& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    // `exec` so the child is the environment itself and its exit status is the one reported.
    std::string shell = "/bin/sh", flag = "-c", command = "exec " + config_.command;
    char* argv[] = {shell.data(), flag.data(), command.data(), nullptr};
    const pid_t pid = ForkWithLifeline([&] {
      ::setpgid(0, 0);
      ::execve(argv[0], argv, envp.data());
    });
    if (pid < 0) return Status::IoError(Where() + ": fork: " + std::strerror(errno));
    ::setpgid(pid, pid);
    pid_ = pid;
    exit_description_.clear();
    return Status::Ok();
  }

  // Kills the process group and reaps the child.
  void Stop() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    socket_.reset();
  }

  // Asks politely first (`close`, a short wait), then Stop.
  void Close() {
    if (pid_ > 0 && socket_) {
      // A close that fails or goes unanswered changes nothing: Stop below ends the process.
      (void)Request({{"op", "close"}}, 1000);
      for (int i = 0; i < 50 && Reaped() == false; ++i) ::usleep(10000);
    }
    Stop();
  }

  // Sends `request` (an id is added) and waits for the reply with the same id.
  Result<json> Request(json request, int64_t timeout_ms) {
    if (pid_ <= 0 || !socket_) return Status::FailedPrecondition(Where() + ": not running");
    const uint64_t id = ++next_id_;
    request["id"] = id;
    const std::string op = request.value("op", "");
    const std::string payload = ToWireText(request);
    std::array<zmq::const_buffer, 2> frames = {zmq::const_buffer(nullptr, 0), zmq::buffer(payload)};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    // A DEALER has nowhere to send until the process has connected (it may still be starting).
    while (!zmq::send_multipart(*socket_, frames, zmq::send_flags::dontwait)) {
      if (Reaped()) {
        return Status::Unavailable(Where() + ": " + op + ": the environment process " +
                                   exit_description_ + " before connecting");
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::Unavailable(Where() + ": " + op + ": the process did not connect to " +
                                   "its endpoint within " + std::to_string(timeout_ms) + " ms");
      }
      zmq::pollitem_t item = {static_cast<void*>(*socket_), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
    }
    while (true) {
      if (Reaped()) {
        return Status::Unavailable(Where() + ": " + op + ": the environment process " +
                                   exit_description_ + " before replying");
      }
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        return Status::DeadlineExceeded(Where() + ": " + op + ": no reply within " +
                                        std::to_string(timeout_ms) +
                                        " ms (step_timeout_ms, timed by the environment client)");
      }
      zmq::pollitem_t item = {static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
      const auto slice = std::min<int64_t>(
          50, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1);
      zmq::poll(&item, 1, std::chrono::milliseconds(slice));
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> parts;
      (void)zmq::recv_multipart(*socket_, std::back_inserter(parts), zmq::recv_flags::dontwait);
      if (parts.size() != 2 || parts[0].size() != 0) {
        return Status::Corruption(Where() + ": " + op + ": reply is not one REP message (" +
                                  std::to_string(parts.size()) + " frames)");
      }
      STRIDER_ASSIGN_OR_RETURN(
          json reply, ParseJsonObject(parts[1].to_string_view(), Where() + ": " + op + " reply"));
      // A reply to an earlier request that timed out: not ours.
      if (reply.contains("id") && reply["id"].is_number_unsigned() &&
          reply["id"].get<uint64_t>() != id) {
        continue;
      }
      if (!reply.contains("ok") || !reply["ok"].is_boolean()) {
        return Status::Corruption(Where() + ": " + op + " reply has no boolean 'ok'");
      }
      if (!reply["ok"].get<bool>()) {
        const json error = reply.value("error", json("no message"));
        return Status::Internal(Where() + ": " + op + " failed in the environment: " +
                                (error.is_string() ? error.get<std::string>() : ToWireText(error)));
      }
      return reply;
    }
  }

  std::string Where() const { return "external environment '" + config_.command + "'"; }

 private:
  static zmq::context_t& Context() {
    static zmq::context_t context(1);
    return context;
  }

  // True once the child has exited (reaped here, with how it ended).
  bool Reaped() {
    if (pid_ <= 0) return true;
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == 0 || (done < 0 && errno != ECHILD)) return false;
    if (done < 0) {  // reaped by someone else (a SIGCHLD handler of the host program)
      exit_description_ = "exited (its status was collected elsewhere)";
      pid_ = -1;
      return true;
    }
    if (WIFEXITED(status)) {
      exit_description_ = "exited with code " + std::to_string(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      exit_description_ = "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                          ::strsignal(WTERMSIG(status)) + ")";
    }
    ::kill(-pid_, SIGKILL);  // anything it started
    pid_ = -1;
    return true;
  }

  EnvironmentConfig config_;
  pid_t pid_ = -1;
  std::unique_ptr<zmq::socket_t> socket_;
  uint64_t next_id_ = 0;
  std::string exit_description_;
};

Result<EnvironmentSpec> StartAndDescribe(Process& process, const EnvironmentConfig& config) {
  STRIDER_RETURN_IF_ERROR(process.Start());
  Result<json> reply =
      process.Request({{"op", "describe"}}, std::max(config.step_timeout_ms, kStartTimeoutMs));
  if (!reply.ok()) {
    process.Stop();
    return reply.status();
  }
  if (!reply->contains("spec")) {
    process.Stop();
    return Status::Corruption(process.Where() + ": describe reply has no 'spec'");
  }
  Result<EnvironmentSpec> spec = SpecFromJson((*reply)["spec"], process.Where() + ": describe");
  if (!spec.ok()) process.Stop();
  return spec;
}

class ExternalEnvironment : public Environment {
 public:
  ExternalEnvironment(EnvironmentConfig config, std::unique_ptr<Process> process,
                      EnvironmentSpec spec)
      : config_(std::move(config)), process_(std::move(process)), spec_(std::move(spec)) {}
  ~ExternalEnvironment() override { Close(); }

  EnvironmentSpec Describe() const override { return spec_; }

  Result<Observation> Reset(uint64_t seed, const Options& episode_options) override {
    if (!process_->alive()) {
      // A fault ended the last episode, or the process died between episodes: start afresh.
      STRIDER_ASSIGN_OR_RETURN(EnvironmentSpec spec, StartAndDescribe(*process_, config_));
      (void)spec;
    }
    Options options = config_.options;
    for (const auto& [key, value] : episode_options) options[key] = value;
    Result<json> reply =
        Call({{"op", "reset"}, {"seed", seed}, {"options", OptionsToJson(options)}});
    if (!reply.ok()) return reply.status();
    if (!reply->contains("observation"))
      return Fault(Status::Corruption(process_->Where() + ": reset reply has no 'observation'"));
    Result<Observation> observation =
        ObservationFromJson((*reply)["observation"], process_->Where() + ": reset reply");
    if (!observation.ok()) return Fault(observation.status());
    return observation;
  }

  Result<StepResult> Step(const Action& action) override {
    if (!process_->running()) {
      return Status::FailedPrecondition(process_->Where() + ": step without a running episode");
    }
    Result<json> reply = Call({{"op", "step"}, {"action", ActionToJson(action)}});
    if (!reply.ok()) return reply.status();
    Result<StepResult> result = StepResultFromJson(*reply, process_->Where() + ": step reply");
    if (!result.ok()) return Fault(result.status());
    return result;
  }

  void Close() override { process_->Close(); }

 private:
  Result<json> Call(const json& request) {
    Result<json> reply = process_->Request(request, config_.step_timeout_ms);
    if (!reply.ok()) return Fault(reply.status());
    return reply;
  }

  // A process that misbehaved once is not trusted with the next episode.
  Status Fault(Status status) {
    process_->Stop();
    return status;
  }

  EnvironmentConfig config_;
  std::unique_ptr<Process> process_;
  EnvironmentSpec spec_;
};

class ExternalPolicy : public ScriptedPolicy {
 public:
  ExternalPolicy(EnvironmentConfig config, std::unique_ptr<Process> process)
      : config_(std::move(config)), process_(std::move(process)) {}
  ~ExternalPolicy() override { process_->Close(); }

  Result<std::string> NextTurn(const std::vector<Observation>& observations) override {
    if (!process_->running()) {
      STRIDER_ASSIGN_OR_RETURN(EnvironmentSpec spec, StartAndDescribe(*process_, config_));
      (void)spec;
    }
    Result<json> reply = process_->Request(
        {{"op", "scripted_turn"}, {"observations", ObservationsToJson(observations)}},
        config_.step_timeout_ms);
    if (!reply.ok()) {
      process_->Stop();
      return reply.status();
    }
    if (!reply->value("text", json()).is_string()) {
      return Status::Corruption(process_->Where() + ": scripted_turn reply has no 'text'");
    }
    return (*reply)["text"].get<std::string>();
  }

 private:
  EnvironmentConfig config_;
  std::unique_ptr<Process> process_;
};

}  // namespace

Result<std::unique_ptr<Environment>> MakeExternalEnvironment(const EnvironmentConfig& config) {
  if (config.step_timeout_ms <= 0) {
    return Status::InvalidArgument("external environment: step_timeout_ms must be positive");
  }
  auto process = std::make_unique<Process>(config);
  STRIDER_ASSIGN_OR_RETURN(EnvironmentSpec spec, StartAndDescribe(*process, config));
  if (!config.name.empty() && config.name != spec.name) {
    return Status::InvalidArgument(process->Where() + " describes itself as '" + spec.name +
                                   "', the config names '" + config.name + "'");
  }
  return std::unique_ptr<Environment>(
      new ExternalEnvironment(config, std::move(process), std::move(spec)));
}

Result<std::unique_ptr<ScriptedPolicy>> MakeExternalPolicy(const EnvironmentConfig& config) {
  auto process = std::make_unique<Process>(config);
  STRIDER_ASSIGN_OR_RETURN(EnvironmentSpec spec, StartAndDescribe(*process, config));
  // Ask once whether the process implements scripted_turn at all.
  Result<json> probe = process->Request({{"op", "scripted_turn"}, {"observations", json::array()}},
                                        config.step_timeout_ms);
  if (!probe.ok() && probe.status().message().find("unknown op") != std::string::npos) {
    return Status::Unimplemented(process->Where() + " (" + spec.name + ") has no scripted policy");
  }
  return std::unique_ptr<ScriptedPolicy>(new ExternalPolicy(config, std::move(process)));
}

}  // namespace strider::envs
