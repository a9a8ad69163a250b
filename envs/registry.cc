#include "envs/registry.h"

#include <functional>

#include "envs/calculator/calculator.h"
#include "envs/dataset/dataset.h"
#include "envs/external/external_env.h"
#include "envs/options.h"
#include "envs/plugin_loader.h"
#include "envs/retrieval/retrieval.h"
#include "envs/vision_count/vision_count.h"

namespace strider::envs {
namespace {

struct BuiltIn {
  std::string name;
  std::function<Result<std::unique_ptr<Environment>>(const Options&)> make;
  // Given the config's options: a policy may need them to know the answers (dataset).
  std::function<Result<std::unique_ptr<ScriptedPolicy>>(const Options&)> policy;
};

template <std::unique_ptr<ScriptedPolicy> (*Make)()>
Result<std::unique_ptr<ScriptedPolicy>> IgnoringOptions(const Options&) {
  return Make();
}

// The one place built-ins are listed: adding an environment is one entry here.
const std::vector<BuiltIn>& BuiltIns() {
  static const std::vector<BuiltIn> built_ins = {
      {"calculator", MakeCalculatorEnvironment, IgnoringOptions<MakeCalculatorPolicy>},
      {"dataset", MakeDatasetEnvironment, MakeDatasetPolicy},
      {"retrieval", MakeRetrievalEnvironment, IgnoringOptions<MakeRetrievalPolicy>},
      {"vision_count", MakeVisionCountEnvironment, IgnoringOptions<MakeVisionCountPolicy>},
  };
  return built_ins;
}

const BuiltIn* FindBuiltIn(const std::string& name) {
  for (const BuiltIn& built_in : BuiltIns()) {
    if (built_in.name == name) return &built_in;
  }
  return nullptr;
}

Status UnknownName(const std::string& name) {
  std::string known;
  for (const BuiltIn& built_in : BuiltIns()) known += (known.empty() ? "" : ", ") + built_in.name;
  return Status::NotFound("unknown environment '" + name + "' (built-in: " + known +
                          "; plug-ins are named by `library` or `command`)");
}

// Built-ins reject unknown option keys when made; a plug-in may only see its options at the
// first reset, so its keys are checked against the ones it declares before any episode runs.
Result<std::unique_ptr<Environment>> CheckPluginOptions(std::unique_ptr<Environment> env,
                                                        const Options& options) {
  const EnvironmentSpec spec = env->Describe();
  const Status status = OptionReader(spec.name, options, {}, spec.options).status();
  if (!status.ok()) {
    env->Close();
    return status;
  }
  return env;
}

}  // namespace

std::vector<std::string> RegisteredEnvironments() {
  std::vector<std::string> names;
  for (const BuiltIn& built_in : BuiltIns()) names.push_back(built_in.name);
  return names;
}

Result<std::unique_ptr<Environment>> MakeEnvironment(const EnvironmentConfig& config) {
  if (!config.library.empty() && !config.command.empty()) {
    return Status::InvalidArgument("environment '" + config.name +
                                   "': set either `library` or `command`, not both");
  }
  if (!config.library.empty()) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Environment> env,
                             LoadPluginEnvironment(config.library, config.options));
    const std::string reported = env->Describe().name;
    if (!config.name.empty() && config.name != reported) {
      return Status::InvalidArgument("environment plug-in " + config.library +
                                     " describes itself as '" + reported + "', the config names '" +
                                     config.name + "'");
    }
    return CheckPluginOptions(std::move(env), config.options);
  }
  if (!config.command.empty()) {
    STRIDER_ASSIGN_OR_RETURN(std::unique_ptr<Environment> env, MakeExternalEnvironment(config));
    return CheckPluginOptions(std::move(env), config.options);
  }
  const BuiltIn* built_in = FindBuiltIn(config.name);
  if (built_in == nullptr) return UnknownName(config.name);
  return built_in->make(config.options);
}

Result<std::unique_ptr<ScriptedPolicy>> MakeScriptedPolicy(const EnvironmentConfig& config) {
  if (!config.library.empty()) return LoadPluginPolicy(config.library);
  if (!config.command.empty()) return MakeExternalPolicy(config);
  const BuiltIn* built_in = FindBuiltIn(config.name);
  if (built_in == nullptr) return UnknownName(config.name);
  return built_in->policy(config.options);
}

Result<EnvironmentConfig> ReadEnvironmentConfig(ConfigReader& env) {
  EnvironmentConfig config;
  env.Optional("name", &config.name);
  env.Optional("library", &config.library);
  env.Optional("command", &config.command);
  env.Optional("step_timeout_ms", &config.step_timeout_ms);
  env.Check(config.step_timeout_ms > 0, "step_timeout_ms", "must be positive");
  env.Check(!config.name.empty() || !config.library.empty() || !config.command.empty(), "name",
            "is required (or `library` / `command` for a plug-in)");
  ConfigReader options = env.Section("options");
  STRIDER_RETURN_IF_ERROR(env.status());
  // Which option keys exist is the environment's to say: build it once without options to ask.
  EnvironmentConfig probe = config;
  Result<std::unique_ptr<Environment>> made = MakeEnvironment(probe);
  if (!made.ok()) {
    env.Fail(config.library.empty() && config.command.empty() ? "name"
             : config.library.empty()                         ? "command"
                                                              : "library",
             made.status().message());
    return env.status();
  }
  const EnvironmentSpec spec = (*made)->Describe();
  (*made)->Close();
  if (config.name.empty()) config.name = spec.name;
  for (const std::string& key : spec.options) {
    std::string value;
    if (options.Has(key)) {
      options.Optional(key, &value);
      config.options[key] = value;
    }
  }
  STRIDER_RETURN_IF_ERROR(env.status());
  return config;
}

Result<EnvironmentConfig> LoadEnvironmentConfig(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(ConfigReader root, ConfigReader::FromFile(path));
  ConfigReader env = root.Section("env");
  if (!root.Has("env")) env.Fail("name", "the file has no `env:` section");
  STRIDER_ASSIGN_OR_RETURN(EnvironmentConfig config, ReadEnvironmentConfig(env));
  STRIDER_RETURN_IF_ERROR(root.Finish());
  return config;
}

}  // namespace strider::envs
