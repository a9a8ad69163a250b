// A complete environment plug-in, commented to be copied: start a new shared-library
// environment from this file (docs/environments.md, "Writing an environment").
//
// The environment, `template_counter`: the model must bring a counter from 0 to a target by
// calling `add(n)` with 1 <= n <= 10, then say "Done". Each call is labelled correct while the
// counter has not passed the target, incorrect once it has; the outcome reward is 1 when the
// counter ends exactly on the target.
//
// The plug-in talks to Strider only through envs/plugin.h: a table of C functions exchanging
// JSON strings. It links no Strider library, so it can be built out of tree against that one
// header (and any JSON library; this one uses nlohmann/json, header-only).
//
// Built by the test suite as tests/envs/libstrider_template_env.so (and once more with
// STRIDER_TEMPLATE_API_VERSION=2, to check that Strider refuses a library built for another
// API version).
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "envs/plugin.h"

#ifndef STRIDER_TEMPLATE_API_VERSION
#define STRIDER_TEMPLATE_API_VERSION STRIDER_ENVIRONMENT_API_VERSION
#endif

namespace {

using nlohmann::json;

// ---- The environment's state. One instance per episode slot; Strider uses it from one thread
// at a time, so no locking is needed inside.
struct Counter {
  int64_t target_max = 50;  // option: the largest target
  int64_t target = 0;
  int64_t total = 0;
  int turns = 0;
  bool active = false;
  std::string reply;  // the last reply: returned strings must outlive the call
};

// ---- Helpers. Errors become a non-zero return with the message as the reply.
int Fail(Counter* env, const std::string& message, const char** reply) {
  env->reply = message;
  *reply = env->reply.c_str();
  return 1;
}

int Reply(Counter* env, const json& message, const char** reply) {
  env->reply = message.dump();
  *reply = env->reply.c_str();
  return 0;
}

// Reads the options object; unknown keys are errors so a typo in a config is caught early.
bool ApplyOptions(Counter* env, const char* options_json, std::string* error) {
  const json options = json::parse(options_json, nullptr, false);
  if (!options.is_object()) {
    *error = "options must be a JSON object";
    return false;
  }
  for (const auto& [key, value] : options.items()) {
    if (key != "target_max") {
      *error = "template_counter: option '" + key + "': unknown option (known: target_max)";
      return false;
    }
    // Options arrive as strings (config values are passed through as text).
    const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    char* end = nullptr;
    const long long parsed = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || parsed < 1 || parsed > 1000) {
      *error = "template_counter: option 'target_max': expected an integer in [1, 1000], got '" +
               text + "'";
      return false;
    }
    env->target_max = parsed;
  }
  return true;
}

// ---- The API functions.

// describe: static text, valid for the library's lifetime. `options` lists the option keys so a
// config with a misspelt key fails when it is read.
const char* Describe() {
  return R"({"name": "template_counter",
             "description": "bring a counter to the target with add(n), then say Done",
             "tools": [{"name": "add", "arguments": {"n": "integer 1..10"},
                        "description": "adds n to the counter"}],
             "max_turns": 110,
             "options": ["target_max"]})";
}

StriderEnvironment* Create(const char* options_json, const char** error) {
  // create's error must outlive the call although there is no instance yet: thread-local.
  static thread_local std::string message;
  auto* env = new Counter();
  if (!ApplyOptions(env, options_json, &message)) {
    delete env;
    *error = message.c_str();
    return nullptr;
  }
  return reinterpret_cast<StriderEnvironment*>(env);
}

int Reset(StriderEnvironment* handle, uint64_t seed, const char* episode_options_json,
          const char** reply) {
  auto* env = reinterpret_cast<Counter*>(handle);
  std::string error;
  // Episode options override the configured ones for this episode only.
  Counter episode = *env;
  if (!ApplyOptions(&episode, episode_options_json, &error)) return Fail(env, error, reply);
  // The same seed must give the same episode: derive everything from it.
  std::mt19937_64 rng(seed);
  env->target = 1 + static_cast<int64_t>(rng() % episode.target_max);
  env->total = 0;
  env->turns = 0;
  env->active = true;
  return Reply(env,
               {{"role", "user"},
                {"text", "The counter is at 0. Bring it to exactly " + std::to_string(env->target) +
                             " with add(n), 1 <= n <= 10, then say Done."}},
               reply);
}

int Step(StriderEnvironment* handle, const char* action_json, const char** reply) {
  auto* env = reinterpret_cast<Counter*>(handle);
  if (!env->active) return Fail(env, "step before reset or after the episode ended", reply);
  const json action = json::parse(action_json, nullptr, false);
  if (!action.is_object()) return Fail(env, "the action is not a JSON object", reply);
  ++env->turns;
  json result = {{"observation", {{"role", "tool_result"}, {"text", ""}}},
                 {"reward", nullptr},
                 {"label", "unknown"},
                 {"done", false},
                 {"outcome_reward", nullptr},
                 {"info", json::object()}};
  const std::string error = action.value("tool_call_error", "");
  const json& call = action["tool_call"];
  auto label = [&](bool correct, const std::string& text) {
    result["observation"]["text"] = text;
    result["label"] = correct ? "correct" : "incorrect";
    result["reward"] = correct ? 1.0 : 0.0;
  };
  if (!error.empty()) {
    // A malformed call is the model's mistake, shown to it as a tool result; never a failure.
    label(false, "error: " + error);
  } else if (call.is_object()) {
    const std::string name = call.value("name", "");
    const std::string arguments = call.value("arguments", "");
    char* end = nullptr;
    const long long n = std::strtoll(arguments.c_str(), &end, 10);
    if (name != "add") {
      label(false, "error: unknown tool '" + name + "'");
    } else if (arguments.empty() || *end != '\0' || n < 1 || n > 10) {
      label(false, "error: add takes one integer from 1 to 10, got '" + arguments + "'");
    } else {
      env->total += n;
      label(env->total <= env->target, "counter: " + std::to_string(env->total));
    }
  } else if (action.value("text", "").find("Done") != std::string::npos) {
    const bool hit = env->total == env->target;
    result["observation"] = {{"role", "user"}, {"text", ""}};
    result["label"] = hit ? "correct" : "incorrect";
    result["reward"] = hit ? 1.0 : 0.0;
    result["outcome_reward"] = hit ? 1.0 : 0.0;
    result["done"] = true;
    result["info"]["target"] = std::to_string(env->target);
    env->active = false;
  } else {
    result["observation"] = {{"role", "user"}, {"text", "Call add(n), or say Done."}};
  }
  if (env->active && env->turns >= 110) {
    result["done"] = true;
    result["outcome_reward"] = 0.0;
    result["info"]["reason"] = "turn limit";
    env->active = false;
  }
  return Reply(env, result, reply);
}

void Destroy(StriderEnvironment* handle) { delete reinterpret_cast<Counter*>(handle); }

// The scripted policy: reads the target and the counter from the observations and adds at most
// 10 at a time. Stateless: everything it needs is in the observations.
int ScriptedTurn(const char* observations_json, const char** reply) {
  static thread_local std::string text;
  const json observations = json::parse(observations_json, nullptr, false);
  if (!observations.is_array() || observations.empty()) {
    text = "expected a non-empty list of observations";
    *reply = text.c_str();
    return 1;
  }
  const std::string first = observations.front().value("text", "");
  const size_t at = first.find("exactly ");
  if (at == std::string::npos) {
    text = "the first observation names no target";
    *reply = text.c_str();
    return 1;
  }
  const long long target = std::strtoll(first.c_str() + at + 8, nullptr, 10);
  long long total = 0;
  for (const json& observation : observations) {
    const std::string t = observation.value("text", "");
    if (t.rfind("counter: ", 0) == 0) total = std::strtoll(t.c_str() + 9, nullptr, 10);
  }
  const long long remaining = target - total;
  text = remaining <= 0 ? "Done"
                        : "<|tool_call|>add(" + std::to_string(remaining > 10 ? 10 : remaining) +
                              ")<|tool_call_end|>";
  *reply = text.c_str();
  return 0;
}

const StriderEnvironmentApi kApi = {
    STRIDER_TEMPLATE_API_VERSION,
    sizeof(StriderEnvironmentApi),
    Describe,
    Create,
    Reset,
    Step,
    Destroy,
    ScriptedTurn,
};

}  // namespace

// The entry point: its name carries the API version, so a library built for another version is
// refused at load time, before any of its functions is called.
#define STRIDER_ENTRY_NAME_(v) strider_environment_api_v##v
#define STRIDER_ENTRY_NAME(v) STRIDER_ENTRY_NAME_(v)
extern "C" __attribute__((visibility("default"))) const StriderEnvironmentApi* STRIDER_ENTRY_NAME(
    STRIDER_TEMPLATE_API_VERSION)(void) {
  return &kApi;
}
