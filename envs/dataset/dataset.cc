#include "envs/dataset/dataset.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>

#include "common/config.h"
#include "common/random.h"
#include "common/subprocess.h"
#include "envs/calculator/calculator.h"
#include "envs/options.h"
#include "envs/tools.h"

namespace strider::envs {
namespace {

using nlohmann::json;

const std::vector<std::string> kOptionKeys = {
    "path",  "verifier",      "tolerance", "normalize", "command", "verifier_timeout_ms",
    "tools", "answer_prefix", "max_turns", "shuffle"};

enum class VerifierKind { kExact, kNumeric, kRegex, kCommand };

struct Settings {
  std::string path;
  VerifierKind verifier = VerifierKind::kExact;
  double tolerance = 1e-6;
  bool normalize = true;
  std::string command;
  int64_t verifier_timeout_ms = 10000;
  bool calc = false;
  std::string answer_prefix = "Answer: ";
  int max_turns = 1;
  bool shuffle = false;
};

// Relative paths resolve as config paths do: from the working directory, else from the first
// of its parents that holds them (so a run from a build folder inside the repository works).
std::string ResolvePath(const std::string& path) {
  return ResolveConfigPath(path, (std::filesystem::current_path() / "dataset").string());
}

Result<Settings> ReadSettings(const Options& options) {
  OptionReader reader("dataset", options, {}, kOptionKeys);
  Settings settings;
  settings.path = reader.String("path", "");
  const std::string verifier = reader.String("verifier", "exact");
  settings.normalize = reader.Bool("normalize", true);
  settings.command = reader.String("command", "");
  settings.verifier_timeout_ms = reader.Int("verifier_timeout_ms", 10000, 1, 3600000);
  const std::string tools = reader.String("tools", "");
  // The turn limit's default depends on whether a tool is offered.
  settings.max_turns = static_cast<int>(reader.Int("max_turns", tools == "calc" ? 4 : 1, 1, 64));
  settings.answer_prefix = reader.String("answer_prefix", settings.answer_prefix);
  settings.shuffle = reader.Bool("shuffle", false);
  STRIDER_RETURN_IF_ERROR(reader.status());
  auto fail = [](const std::string& key, const std::string& why) {
    return Status::InvalidArgument("dataset: option '" + key + "': " + why);
  };
  if (verifier == "exact") {
    settings.verifier = VerifierKind::kExact;
  } else if (verifier == "numeric") {
    settings.verifier = VerifierKind::kNumeric;
  } else if (verifier == "regex") {
    settings.verifier = VerifierKind::kRegex;
  } else if (verifier == "command") {
    settings.verifier = VerifierKind::kCommand;
  } else {
    return fail("verifier", "expected exact, numeric, regex or command, got '" + verifier + "'");
  }
  if (settings.verifier == VerifierKind::kCommand && settings.command.empty()) {
    return fail("command", "is required with verifier: command");
  }
  if (settings.verifier != VerifierKind::kCommand && !settings.command.empty()) {
    return fail("command", "is only read with verifier: command");
  }
  if (auto it = options.find("tolerance"); it != options.end()) {
    char* end = nullptr;
    settings.tolerance = std::strtod(it->second.c_str(), &end);
    if (it->second.empty() || end != it->second.c_str() + it->second.size() ||
        !std::isfinite(settings.tolerance) || settings.tolerance < 0) {
      return fail("tolerance", "expected a non-negative number, got '" + it->second + "'");
    }
  }
  if (tools == "calc") {
    settings.calc = true;
  } else if (!tools.empty() && tools != "none") {
    return fail("tools", "expected calc (or empty for none), got '" + tools + "'");
  }
  if (settings.answer_prefix.empty() && settings.calc) {
    return fail("answer_prefix", "must not be empty when tools are offered");
  }
  return settings;
}

Status LineError(const std::string& path, int line, const std::string& why) {
  return Status::InvalidArgument(fmt::format("{}:{}: {}", path, line, why));
}

// ---- Rule verifiers.

std::string Trim(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

// Trim, collapse runs of whitespace to one space, ASCII case-fold.
std::string Normalize(std::string_view text) {
  std::string out;
  bool space = false;
  for (char c : Trim(text)) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = true;
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::optional<double> ParseNumber(const std::string& text) {
  const std::string trimmed = Trim(text);
  if (trimmed.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(trimmed.c_str(), &end);
  if (end != trimmed.c_str() + trimmed.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// A numeric answer may carry words around it ("42 apples", "x = 3.5"): the last number counts.
std::optional<double> LastNumber(const std::string& text) {
  if (std::optional<double> whole = ParseNumber(text)) return whole;
  static const std::regex number(R"([-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)");
  std::optional<double> last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number);
       it != std::sregex_iterator(); ++it) {
    last = std::strtod(it->str().c_str(), nullptr);
  }
  return last;
}

struct Verdict {
  double reward = 0;
  bool correct = false;
  std::string reason;
};

// ---- The out-of-process verifier: one child per environment object, kept across episodes.

class VerifierProcess {
 public:
  VerifierProcess(std::string command, int64_t timeout_ms)
      : command_(std::move(command)), timeout_ms_(timeout_ms) {}
  ~VerifierProcess() { Stop(); }

  // One request line out, one reply line back. Any fault stops the child (the next call
  // starts a fresh one) and is returned naming the fault.
  Result<std::string> Ask(const std::string& line) {
    if (pid_ <= 0) STRIDER_RETURN_IF_ERROR(Start());
    Status written = WriteAll(line + "\n");
    if (!written.ok()) return Fault(written.message());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (true) {
      const size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string reply = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return reply;
      }
      if (buffer_.size() > (1 << 20)) return Fault("reply line longer than 1 MiB");
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) return Fault(fmt::format("no reply within {} ms", timeout_ms_));
      pollfd fd{from_child_, POLLIN, 0};
      const int ready = ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) continue;
      char chunk[4096];
      const ssize_t got = ::read(from_child_, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return Fault("the verifier exited" + ExitText());
      buffer_.append(chunk, static_cast<size_t>(got));
    }
  }

  void Stop() {
    if (to_child_ >= 0) ::close(to_child_);
    if (from_child_ >= 0) ::close(from_child_);
    to_child_ = from_child_ = -1;
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    pid_ = -1;
    buffer_.clear();
  }

 private:
  Status Start() {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return Status::Internal("dataset verifier: pipe failed");
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return Status::Internal("dataset verifier: pipe failed");
    }
    const pid_t pid = ForkWithLifeline([&] {
      // Its own process group, so Stop kills anything the shell started too.
      ::setpgid(0, 0);
      ::dup2(in[0], STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::execl("/bin/sh", "sh", "-c", command_.c_str(), static_cast<char*>(nullptr));
    });
    if (pid < 0) {
      for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
      return Status::Internal("dataset verifier: fork failed");
    }
    ::setpgid(pid, pid);
    ::close(in[0]);
    ::close(out[1]);
    pid_ = pid;
    to_child_ = in[1];
    from_child_ = out[0];
    return Status::Ok();
  }

  // Writes with SIGPIPE blocked on this thread: a verifier that died must be an error result,
  // never a signal that takes the actor down.
  Status WriteAll(const std::string& text) {
    sigset_t pipe_set, old_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    size_t done = 0;
    Status status;
    while (done < text.size()) {
      const ssize_t n = ::write(to_child_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        status = Status::Unavailable("the verifier stopped reading its input" + ExitText());
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (!status.ok()) {
      // Consume the SIGPIPE this write raised so unblocking does not deliver it.
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_set, nullptr, &zero) > 0) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
    return status;
  }

  std::string ExitText() {
    if (pid_ <= 0) return "";
    int wstatus = 0;
    for (int i = 0; i < 50; ++i) {
      if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        pid_ = -1;
        if (WIFEXITED(wstatus)) return fmt::format(" (exit status {})", WEXITSTATUS(wstatus));
        if (WIFSIGNALED(wstatus)) return fmt::format(" (signal {})", WTERMSIG(wstatus));
        return "";
      }
      ::usleep(2000);
    }
    return "";
  }

  Status Fault(const std::string& why) {
    Stop();
    return Status::Unavailable("dataset: verifier command '" + command_ + "': " + why);
  }

  std::string command_;
  int64_t timeout_ms_;
  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffer_;
};

std::string FirstObservationText(const DatasetRecord& record) {
  return record.system.empty() ? record.prompt : record.system + "\n\n" + record.prompt;
}

class Dataset : public Environment {
 public:
  Dataset(Settings settings, std::shared_ptr<const std::vector<DatasetRecord>> records)
      : settings_(std::move(settings)), records_(std::move(records)) {
    if (settings_.verifier == VerifierKind::kCommand) {
      verifier_ =
          std::make_unique<VerifierProcess>(settings_.command, settings_.verifier_timeout_ms);
    }
  }

  EnvironmentSpec Describe() const override {
    EnvironmentSpec spec;
    spec.name = "dataset";
    spec.description = "Prompts with reference answers from a JSONL file; answer with '" +
                       settings_.answer_prefix + "<answer>'.";
    if (settings_.calc) {
      spec.tools.push_back(CalculatorTool());
    }
    spec.max_turns = settings_.max_turns;
    spec.options = kOptionKeys;
    return spec;
  }

  Result<Observation> Reset(uint64_t seed, const Options& episode_options) override {
    // The dataset is fixed when the environment is made; per-episode overrides of it would
    // need another file load per episode, so none are taken.
    if (!episode_options.empty()) {
      return Status::InvalidArgument(
          "dataset: options are fixed when the environment is made (got '" +
          episode_options.begin()->first + "' for one episode)");
    }
    if (records_ == nullptr) {
      return Status::InvalidArgument("dataset: option 'path': is required (a JSONL file)");
    }
    const uint64_t index = (settings_.shuffle ? SplitMix64(seed) : seed) % records_->size();
    record_ = &(*records_)[index];
    turns_ = 0;
    Observation observation;
    observation.role = ObservationRole::kUser;
    observation.text = FirstObservationText(*record_);
    return observation;
  }

  Result<StepResult> Step(const Action& action) override {
    if (record_ == nullptr)
      return Status::FailedPrecondition("dataset: Step before Reset or after done");
    ++turns_;
    StepResult result;
    result.info["id"] = record_->id;
    const std::string text = Trim(action.text);
    const bool prefixed =
        !settings_.answer_prefix.empty() && text.rfind(Trim(settings_.answer_prefix), 0) == 0;
    if (settings_.calc && !prefixed) {
      result.observation.role = ObservationRole::kToolResult;
      if (!action.tool_call_error.empty()) {
        result.observation.text = ToolErrorText(action.tool_call_error);
      } else if (action.tool_call.has_value()) {
        if (action.tool_call->name == "calc") {
          Result<double> value = EvaluateArithmetic(action.tool_call->arguments);
          result.observation.text =
              value.ok() ? FormatNumber(*value) : ToolErrorText(value.status().message());
        } else {
          result.observation.text = ToolErrorText("unknown tool '" + action.tool_call->name + "'");
        }
      } else {
        result.observation.role = ObservationRole::kUser;
        result.observation.text =
            "Call a tool, or reply with '" + settings_.answer_prefix + "<answer>'.";
      }
      if (turns_ >= settings_.max_turns) {
        EndAtTurnLimit(&result);
        record_ = nullptr;
      }
      return result;
    }
    const std::string answer =
        prefixed ? Trim(std::string_view(text).substr(Trim(settings_.answer_prefix).size())) : text;
    STRIDER_ASSIGN_OR_RETURN(Verdict verdict, Verify(answer));
    result.reward = verdict.reward;
    result.outcome_reward = verdict.reward;
    result.label = verdict.correct ? StepLabel::kCorrect : StepLabel::kIncorrect;
    result.done = true;
    result.info["answer"] = record_->answer;
    if (!verdict.reason.empty()) result.info["verifier_reason"] = verdict.reason;
    record_ = nullptr;
    return result;
  }

  void Close() override {
    if (verifier_ != nullptr) verifier_->Stop();
  }

 private:
  Result<Verdict> Verify(const std::string& answer) {
    Verdict verdict;
    switch (settings_.verifier) {
      case VerifierKind::kExact:
        verdict.correct = settings_.normalize ? Normalize(answer) == Normalize(record_->answer)
                                              : answer == record_->answer;
        break;
      case VerifierKind::kNumeric: {
        const std::optional<double> got = LastNumber(answer);
        const std::optional<double> want = ParseNumber(record_->answer);
        if (!want.has_value()) {
          return Status::InvalidArgument("dataset: reference answer '" + record_->answer +
                                         "' is not a number (verifier: numeric)");
        }
        if (got.has_value()) {
          const double error = std::abs(*got - *want);
          verdict.correct =
              error <= settings_.tolerance || error <= settings_.tolerance * std::abs(*want);
        } else {
          verdict.reason = "no number in the answer";
        }
        break;
      }
      case VerifierKind::kRegex:
        try {
          verdict.correct = std::regex_match(answer, std::regex(record_->answer));
        } catch (const std::regex_error& e) {
          return Status::InvalidArgument("dataset: reference pattern '" + record_->answer +
                                         "': " + e.what());
        }
        break;
      case VerifierKind::kCommand:
        return AskCommand(answer);
    }
    verdict.reward = verdict.correct ? 1.0 : 0.0;
    return verdict;
  }

  Result<Verdict> AskCommand(const std::string& answer) {
    json request = {{"prompt", record_->prompt},
                    {"reference", record_->answer},
                    {"answer", answer},
                    {"metadata", json::parse(record_->metadata_json)}};
    STRIDER_ASSIGN_OR_RETURN(
        std::string line,
        verifier_->Ask(request.dump(-1, ' ', false, json::error_handler_t::replace)));
    auto bad = [&](const std::string& why) {
      verifier_->Stop();
      return Status::InvalidArgument("dataset: verifier command '" + settings_.command +
                                     "': " + why + ": " + line.substr(0, 200));
    };
    json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!reply.is_object()) return bad("the reply is not a JSON object");
    if (!reply.contains("reward") || !reply["reward"].is_number()) {
      return bad("the reply has no number `reward`");
    }
    Verdict verdict;
    verdict.reward = reply["reward"].get<double>();
    if (!(verdict.reward >= 0 && verdict.reward <= 1)) return bad("`reward` is outside [0, 1]");
    if (reply.contains("correct")) {
      if (!reply["correct"].is_boolean()) return bad("`correct` is not a boolean");
      verdict.correct = reply["correct"].get<bool>();
    } else {
      verdict.correct = verdict.reward == 1.0;
    }
    if (reply.contains("reason")) {
      if (!reply["reason"].is_string()) return bad("`reason` is not a string");
      verdict.reason = reply["reason"].get<std::string>();
    }
    return verdict;
  }

  Settings settings_;
  std::shared_ptr<const std::vector<DatasetRecord>> records_;  // null when `path` is unset
  std::unique_ptr<VerifierProcess> verifier_;
  const DatasetRecord* record_ = nullptr;  // the episode's line; null between episodes
  int turns_ = 0;
};

class DatasetPolicy : public ScriptedPolicy {
 public:
  DatasetPolicy(std::string prefix, std::shared_ptr<const std::vector<DatasetRecord>> records)
      : prefix_(std::move(prefix)), records_(std::move(records)) {}

  Result<std::string> NextTurn(const std::vector<Observation>& observations) override {
    if (observations.empty()) return Status::InvalidArgument("dataset policy: no observations");
    if (records_ == nullptr)
      return Status::InvalidArgument("dataset policy: option 'path' is required");
    for (const DatasetRecord& record : *records_) {
      if (FirstObservationText(record) == observations.front().text) {
        return prefix_ + record.answer;
      }
    }
    return Status::NotFound("dataset policy: the prompt is not in the dataset");
  }

 private:
  std::string prefix_;
  std::shared_ptr<const std::vector<DatasetRecord>> records_;
};

// An actor makes one environment per episode slot, all with the same options: they share one
// read of the file while any of them lives (keyed by the resolved path, its size and its
// modification time, so an edited file is read again).
Result<std::shared_ptr<const std::vector<DatasetRecord>>> LoadRecords(const Settings& settings) {
  using Records = std::vector<DatasetRecord>;
  if (settings.path.empty()) return std::shared_ptr<const Records>();
  std::string key = ResolvePath(settings.path);
  std::error_code error;
  const auto size = std::filesystem::file_size(key, error);
  const auto mtime = std::filesystem::last_write_time(key, error);
  if (!error) {
    key += fmt::format("\n{}\n{}", size, mtime.time_since_epoch().count());
  }
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<const Records>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (!error) {
    if (std::shared_ptr<const Records> shared = cache[key].lock()) return shared;
  }
  STRIDER_ASSIGN_OR_RETURN(Records records, LoadDataset(settings.path));
  auto shared = std::make_shared<const Records>(std::move(records));
  if (!error) cache[key] = shared;
  return shared;
}

}  // namespace

Result<std::vector<DatasetRecord>> LoadDataset(const std::string& given_path) {
  const std::string path = ResolvePath(given_path);
  std::ifstream file(path);
  if (!file) return Status::NotFound("dataset: cannot read " + given_path);
  std::vector<DatasetRecord> records;
  std::string line;
  int number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (Trim(line).empty()) continue;
    json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded()) return LineError(given_path, number, "not valid JSON");
    if (!row.is_object()) return LineError(given_path, number, "expected a JSON object");
    DatasetRecord record;
    for (const auto& [key, value] : row.items()) {
      if (key == "prompt" || key == "system" || key == "id") {
        if (!value.is_string())
          return LineError(given_path, number, "`" + key + "` must be a string");
        (key == "prompt"   ? record.prompt
         : key == "system" ? record.system
                           : record.id) = value.get<std::string>();
      } else if (key == "answer") {
        if (value.is_string()) {
          record.answer = value.get<std::string>();
        } else if (value.is_number()) {
          record.answer = value.dump();
        } else {
          return LineError(given_path, number, "`answer` must be a string or a number");
        }
      } else if (key == "metadata") {
        if (!value.is_object())
          return LineError(given_path, number, "`metadata` must be an object");
        record.metadata_json = value.dump();
      } else {
        return LineError(given_path, number,
                         "unknown key `" + key + "` (known: prompt, answer, system, id, metadata)");
      }
    }
    if (!row.contains("prompt")) return LineError(given_path, number, "`prompt` is required");
    if (!row.contains("answer")) return LineError(given_path, number, "`answer` is required");
    if (record.id.empty()) record.id = std::to_string(number);
    records.push_back(std::move(record));
  }
  if (records.empty()) return Status::InvalidArgument("dataset: " + given_path + " has no records");
  return records;
}

Result<std::unique_ptr<Environment>> MakeDatasetEnvironment(const Options& options) {
  STRIDER_ASSIGN_OR_RETURN(Settings settings, ReadSettings(options));
  STRIDER_ASSIGN_OR_RETURN(auto records, LoadRecords(settings));
  if (records != nullptr && settings.verifier == VerifierKind::kRegex) {
    // A bad pattern is the file's mistake: report it at load time with its line.
    for (const DatasetRecord& record : *records) {
      try {
        std::regex pattern(record.answer);
      } catch (const std::regex_error& e) {
        return Status::InvalidArgument("dataset: " + settings.path + ": record " + record.id +
                                       ": answer is not a regex: " + e.what());
      }
    }
  }
  return std::unique_ptr<Environment>(new Dataset(std::move(settings), std::move(records)));
}

Result<std::unique_ptr<ScriptedPolicy>> MakeDatasetPolicy(const Options& options) {
  STRIDER_ASSIGN_OR_RETURN(Settings settings, ReadSettings(options));
  STRIDER_ASSIGN_OR_RETURN(auto records, LoadRecords(settings));
  return std::unique_ptr<ScriptedPolicy>(
      new DatasetPolicy(settings.answer_prefix, std::move(records)));
}

}  // namespace strider::envs
