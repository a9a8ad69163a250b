// A one-turn environment where a random model already earns something and a policy gradient
// earns more at once: the reward of a reply is the fraction of its characters that are the
// target letter (option `letter`, default "a"). The slow RL test trains on it to show reward
// rising in a bounded number of learner steps, with the whole fleet of real processes; it is a
// test fixture, built as a plug-in (envs/plugin.h) like envs/template/.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "envs/plugin.h"

namespace {

using nlohmann::json;

struct Letter {
  char letter = 'a';
  bool active = false;
  std::string reply;
};

int Reply(Letter* env, const json& message, const char** reply) {
  env->reply = message.dump();
  *reply = env->reply.c_str();
  return 0;
}

bool ApplyOptions(Letter* env, const char* options_json, std::string* error) {
  const json options = json::parse(options_json, nullptr, false);
  if (!options.is_object()) {
    *error = "options must be a JSON object";
    return false;
  }
  for (const auto& [key, value] : options.items()) {
    const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    if (key != "letter" || text.size() != 1) {
      *error = "letter: option '" + key + "' = '" + text + "': known is letter, one character";
      return false;
    }
    env->letter = text[0];
  }
  return true;
}

const char* Describe() {
  return R"({"name": "letter",
             "description": "reply with as many of one letter as you can",
             "tools": [],
             "max_turns": 1,
             "options": ["letter"]})";
}

StriderEnvironment* Create(const char* options_json, const char** error) {
  static thread_local std::string message;
  auto* env = new Letter();
  if (!ApplyOptions(env, options_json, &message)) {
    delete env;
    *error = message.c_str();
    return nullptr;
  }
  return reinterpret_cast<StriderEnvironment*>(env);
}

int Reset(StriderEnvironment* handle, uint64_t, const char*, const char** reply) {
  auto* env = reinterpret_cast<Letter*>(handle);
  env->active = true;
  return Reply(env,
               {{"role", "user"},
                {"text", std::string("Write the letter ") + env->letter + " as often as you can."}},
               reply);
}

int Step(StriderEnvironment* handle, const char* action_json, const char** reply) {
  auto* env = reinterpret_cast<Letter*>(handle);
  const json action = json::parse(action_json, nullptr, false);
  const std::string text = action.is_object() ? action.value("text", "") : "";
  int64_t hits = 0;
  for (char c : text) hits += c == env->letter;
  const double reward = text.empty() ? 0.0 : static_cast<double>(hits) / text.size();
  env->active = false;
  return Reply(env,
               {{"observation", {{"role", "user"}, {"text", ""}}},
                {"reward", reward},
                {"label", "unknown"},
                {"done", true},
                {"outcome_reward", reward},
                {"info", json::object()}},
               reply);
}

void Destroy(StriderEnvironment* handle) { delete reinterpret_cast<Letter*>(handle); }

int ScriptedTurn(const char*, const char** reply) {
  static thread_local std::string text;
  text = "aaaaaaaa";
  *reply = text.c_str();
  return 0;
}

const StriderEnvironmentApi kApi = {
    STRIDER_ENVIRONMENT_API_VERSION, sizeof(StriderEnvironmentApi), Describe, Create, Reset, Step,
    Destroy, ScriptedTurn,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const StriderEnvironmentApi*
strider_environment_api_v1(void) {
  return &kApi;
}
