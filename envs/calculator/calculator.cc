#include "envs/calculator/calculator.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <regex>

#include "envs/options.h"
#include "envs/sandbox.h"
#include "envs/tools.h"

namespace strider::envs {
namespace {

// ---- The expression evaluator (recursive descent; depth-limited so input cannot blow the stack).

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Result<double> Parse() {
    Result<double> value = Sum(0);
    if (!value.ok()) return value;
    Skip();
    if (pos_ != text_.size()) return Error("unexpected '" + std::string(1, text_[pos_]) + "'");
    if (!std::isfinite(*value)) return Status::InvalidArgument("calc: the result is not finite");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  Status Error(const std::string& what) const {
    return Status::InvalidArgument(fmt::format("calc: {} at position {}", what, pos_ + 1));
  }
  void Skip() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool Take(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  Result<double> Sum(int depth) {
    Result<double> left = Product(depth);
    if (!left.ok()) return left;
    double value = *left;
    while (true) {
      if (Take('+')) {
        Result<double> right = Product(depth);
        if (!right.ok()) return right;
        value += *right;
      } else if (Take('-')) {
        Result<double> right = Product(depth);
        if (!right.ok()) return right;
        value -= *right;
      } else {
        return value;
      }
    }
  }

  Result<double> Product(int depth) {
    Result<double> left = Unary(depth);
    if (!left.ok()) return left;
    double value = *left;
    while (true) {
      if (Take('*')) {
        Result<double> right = Unary(depth);
        if (!right.ok()) return right;
        value *= *right;
      } else if (Take('/')) {
        Result<double> right = Unary(depth);
        if (!right.ok()) return right;
        if (*right == 0) return Error("division by zero");
        value /= *right;
      } else {
        return value;
      }
    }
  }

  Result<double> Unary(int depth) {
    if (depth > kMaxDepth) return Error("nesting deeper than 64");
    if (Take('-')) {
      Result<double> inner = Unary(depth + 1);
      if (!inner.ok()) return inner;
      return -*inner;
    }
    if (Take('+')) return Unary(depth + 1);
    if (Take('(')) {
      Result<double> inner = Sum(depth + 1);
      if (!inner.ok()) return inner;
      if (!Take(')')) return Error("expected ')'");
      return inner;
    }
    Skip();
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isdigit(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.')) {
      ++pos_;
    }
    if (start == pos_) {
      if (pos_ >= text_.size()) return Error("expected a number, got the end");
      return Error("expected a number, got '" + std::string(1, text_[pos_]) + "'");
    }
    const std::string number(text_.substr(start, pos_ - start));
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return Error("bad number '" + number + "'");
    return value;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// ---- Problems.

enum class Op { kAdd, kSubtract, kMultiply, kDivide };

struct Problem {
  std::string text;
  std::vector<double> intermediates;  // after each operation; the last is the answer
};

// Small integers from the seed with plain modulo, so problems are the same on every platform
// (std::uniform_int_distribution is implementation-defined).
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  int64_t Int(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng_() % (hi - lo + 1)); }
  template <typename T>
  const T& Pick(const std::vector<T>& items) {
    return items[rng_() % items.size()];
  }

 private:
  std::mt19937_64 rng_;
};

// The sentences name the operation with fixed phrases; the scripted policy reads them back.
Problem MakeProblem(uint64_t seed, int steps, int difficulty) {
  Draw draw(seed);
  static const std::vector<std::string> names = {"Mia", "Omar", "Lena", "Ravi", "Ada", "Tom"};
  static const std::vector<std::string> things = {"marbles", "stamps", "coins",
                                                  "apples",  "cards",  "shells"};
  const std::string name = draw.Pick(names);
  const std::string thing = draw.Pick(things);
  const int64_t scale = 10 * difficulty;
  int64_t value = draw.Int(2, 10 + scale);
  Problem problem;
  problem.text = fmt::format("{} has {} {}.", name, value, thing);
  for (int i = 0; i < steps; ++i) {
    Op op = static_cast<Op>(draw.Int(0, 3));
    std::vector<int64_t> divisors;
    for (int64_t d = 2; d <= 9; ++d) {
      if (value % d == 0) divisors.push_back(d);
    }
    if (op == Op::kDivide && divisors.empty()) op = Op::kMultiply;
    if (op == Op::kSubtract && value < 3) op = Op::kAdd;
    if (op == Op::kMultiply && value > 5000) op = Op::kSubtract;
    switch (op) {
      case Op::kAdd: {
        const int64_t a = draw.Int(2, 5 + 4 * scale);
        value += a;
        problem.text += fmt::format(" Then {} gets {} more.", name, a);
        break;
      }
      case Op::kSubtract: {
        const int64_t a = draw.Int(1, value - 1);
        value -= a;
        problem.text += fmt::format(" Then {} gives away {}.", name, a);
        break;
      }
      case Op::kMultiply: {
        const int64_t a = draw.Int(2, 3 + difficulty);
        value *= a;
        problem.text += fmt::format(" Then {} trades each one for {} new ones.", name, a);
        break;
      }
      case Op::kDivide: {
        const int64_t a = draw.Pick(divisors);
        value /= a;
        problem.text +=
            fmt::format(" Then {} splits them into {} equal shares and keeps one share.", name, a);
        break;
      }
    }
    problem.intermediates.push_back(static_cast<double>(value));
  }
  problem.text += fmt::format(" How many {} does {} have now?", thing, name);
  return problem;
}

const std::vector<std::string> kOptionKeys = {"difficulty", "steps", "python", "python_binary",
                                              "tool_timeout_ms"};

struct Settings {
  int difficulty = 2;
  int steps = 3;
  bool python = false;
  std::string python_binary = "/usr/bin/python3";
  int64_t tool_timeout_ms = 5000;
};

Result<Settings> ReadSettings(const Options& config, const Options& episode) {
  OptionReader reader("calculator", config, episode, kOptionKeys);
  Settings settings;
  settings.difficulty = static_cast<int>(reader.Int("difficulty", 2, 1, 5));
  settings.steps = static_cast<int>(reader.Int("steps", settings.difficulty + 1, 1, 12));
  settings.python = reader.Bool("python", false);
  settings.python_binary = reader.String("python_binary", settings.python_binary);
  settings.tool_timeout_ms = reader.Int("tool_timeout_ms", settings.tool_timeout_ms, 100, 60000);
  STRIDER_RETURN_IF_ERROR(reader.status());
  return settings;
}

// The last number in a text ("... = 87" or "87\n"), for labelling python output.
std::optional<double> LastNumber(const std::string& text) {
  static const std::regex number(R"(-?\d+(\.\d+)?)");
  std::optional<double> last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number);
       it != std::sregex_iterator(); ++it) {
    last = std::strtod(it->str().c_str(), nullptr);
  }
  return last;
}

class Calculator : public Environment {
 public:
  explicit Calculator(Options config, Settings settings)
      : config_(std::move(config)), settings_(settings) {}

  EnvironmentSpec Describe() const override {
    EnvironmentSpec spec;
    spec.name = "calculator";
    spec.description = "Multi-step arithmetic word problems; answer with 'Answer: N'.";
    spec.tools.push_back(CalculatorTool());
    if (settings_.python) {
      spec.tools.push_back({"python", R"({"code": "string"})",
                            "runs Python 3 code in a sandbox and returns what it prints"});
    }
    spec.max_turns = 2 * 12 + 4;
    spec.options = kOptionKeys;
    return spec;
  }

  Result<Observation> Reset(uint64_t seed, const Options& episode_options) override {
    STRIDER_ASSIGN_OR_RETURN(episode_, ReadSettings(config_, episode_options));
    problem_ = MakeProblem(seed, episode_.steps, episode_.difficulty);
    turns_ = 0;
    active_ = true;
    Observation observation;
    observation.role = ObservationRole::kUser;
    observation.text =
        problem_.text + "\nUse the tools for the arithmetic, then reply with 'Answer: <number>'.";
    return observation;
  }

  Result<StepResult> Step(const Action& action) override {
    if (!active_) return Status::FailedPrecondition("calculator: Step before Reset or after done");
    ++turns_;
    StepResult result;
    result.observation.role = ObservationRole::kToolResult;
    if (!action.tool_call_error.empty()) {
      Label(&result, false, ToolErrorText(action.tool_call_error));
    } else if (action.tool_call.has_value()) {
      const ToolCall& call = *action.tool_call;
      if (call.name == "calc") {
        Result<double> value = EvaluateArithmetic(call.arguments);
        if (value.ok()) {
          Label(&result, IsIntermediate(*value), FormatNumber(*value));
        } else {
          Label(&result, false, ToolErrorText(value.status().message()));
        }
      } else if (call.name == "python" && episode_.python) {
        STRIDER_RETURN_IF_ERROR(RunPython(call.arguments, &result));
      } else {
        Label(&result, false, ToolErrorText("unknown tool '" + call.name + "'"));
      }
    } else {
      static const std::regex answer(R"(Answer:\s*(-?\d+(\.\d+)?))");
      std::smatch match;
      if (std::regex_search(action.text, match, answer)) {
        const bool right = std::abs(std::strtod(match[1].str().c_str(), nullptr) -
                                    problem_.intermediates.back()) < 1e-9;
        result.observation.text.clear();
        result.reward = right ? 1.0 : 0.0;
        result.label = right ? StepLabel::kCorrect : StepLabel::kIncorrect;
        result.outcome_reward = right ? 1.0 : 0.0;
        result.done = true;
        result.info["answer"] = FormatNumber(problem_.intermediates.back());
        active_ = false;
        return result;
      }
      result.observation.role = ObservationRole::kUser;
      result.observation.text = "Call a tool, or reply with 'Answer: <number>'.";
    }
    if (turns_ >= Describe().max_turns) {
      EndAtTurnLimit(&result);
      active_ = false;
    }
    return result;
  }

 private:
  bool IsIntermediate(double value) const {
    for (double v : problem_.intermediates) {
      if (std::abs(v - value) < 1e-9) return true;
    }
    return false;
  }

  static void Label(StepResult* result, bool correct, std::string text) {
    result->observation.text = std::move(text);
    result->label = correct ? StepLabel::kCorrect : StepLabel::kIncorrect;
    result->reward = correct ? 1.0 : 0.0;
  }

  Status RunPython(const std::string& code, StepResult* result) {
    SandboxRequest request;
    request.argv = {episode_.python_binary, "-I", "main.py"};
    request.files = {{"main.py", code}};
    request.limits.cpu_seconds = 2;
    request.limits.wall_ms = episode_.tool_timeout_ms;
    request.limits.output_bytes = 4096;
    Result<SandboxResult> run = RunSandboxed(request);
    if (!run.ok()) return run.status().WithContext("calculator: python tool");
    if (!run->ok()) {
      std::string tail = run->stderr_text.size() > 400
                             ? run->stderr_text.substr(run->stderr_text.size() - 400)
                             : run->stderr_text;
      Label(result, false, ToolErrorText(run->Summary(request.limits) + "\n" + tail));
      return Status::Ok();
    }
    const std::optional<double> last = LastNumber(run->stdout_text);
    Label(result, last.has_value() && IsIntermediate(*last), run->stdout_text);
    return Status::Ok();
  }

  Options config_;
  Settings settings_;
  Settings episode_;
  Problem problem_;
  int turns_ = 0;
  bool active_ = false;
};

// Reads the problem sentences back and computes one step per turn with `calc`.
class CalculatorPolicy : public ScriptedPolicy {
 public:
  Result<std::string> NextTurn(const std::vector<Observation>& observations) override {
    if (observations.empty()) return Status::InvalidArgument("calculator policy: no observations");
    const std::string& problem = observations.front().text;
    static const std::regex start(R"(has (\d+) )");
    static const std::regex step(
        R"(gets (\d+) more|gives away (\d+)|for (\d+) new ones|into (\d+) equal shares)");
    std::smatch match;
    if (!std::regex_search(problem, match, start)) {
      return Status::InvalidArgument("calculator policy: no starting quantity in the problem");
    }
    std::string value = match[1].str();
    // Each tool result after the first observation is the value after one more operation.
    size_t done = 0;
    for (size_t i = 1; i < observations.size(); ++i) {
      if (observations[i].role == ObservationRole::kToolResult) {
        value = observations[i].text;
        ++done;
      }
    }
    size_t index = 0;
    for (auto it = std::sregex_iterator(problem.begin(), problem.end(), step);
         it != std::sregex_iterator(); ++it, ++index) {
      if (index < done) continue;
      const std::smatch& m = *it;
      if (m[1].matched) return "Add." + FormatToolCall("calc", value + "+" + m[1].str());
      if (m[2].matched) return "Subtract." + FormatToolCall("calc", value + "-" + m[2].str());
      if (m[3].matched) return "Multiply." + FormatToolCall("calc", value + "*" + m[3].str());
      return "Divide." + FormatToolCall("calc", value + "/" + m[4].str());
    }
    return "Answer: " + value;
  }
};

}  // namespace

ToolSpec CalculatorTool() {
  return {"calc", R"({"expression": "string"})",
          "evaluates + - * / and parentheses, e.g. calc(12*7+3)"};
}

Result<double> EvaluateArithmetic(std::string_view expression) {
  if (expression.size() > 256)
    return Status::InvalidArgument("calc: expression longer than 256 bytes");
  return Parser(expression).Parse();
}

std::string FormatNumber(double value) {
  if (std::abs(value) < 1e15 && value == std::floor(value)) {
    return fmt::format("{}", static_cast<int64_t>(value));
  }
  return fmt::format("{:.10g}", value);
}

Result<std::unique_ptr<Environment>> MakeCalculatorEnvironment(const Options& options) {
  STRIDER_ASSIGN_OR_RETURN(Settings settings, ReadSettings(options, {}));
  return std::unique_ptr<Environment>(new Calculator(options, settings));
}

std::unique_ptr<ScriptedPolicy> MakeCalculatorPolicy() {
  return std::make_unique<CalculatorPolicy>();
}

}  // namespace strider::envs
