#include "envs/plugin_loader.h"

#include <dlfcn.h>

#include <mutex>

#include "envs/messages.h"
#include "envs/plugin.h"

namespace strider::envs {
namespace {

static_assert(STRIDER_ENVIRONMENT_API_VERSION == kEnvironmentApiVersion,
              "plugin.h and environment.h disagree on the API version");

// A loaded library: shared by every environment made from it, unloaded with the last one.
struct Library {
  std::string path;
  void* handle = nullptr;
  const StriderEnvironmentApi* api = nullptr;
  ~Library() {
    if (handle != nullptr) ::dlclose(handle);
  }
};

Result<std::shared_ptr<Library>> Open(const std::string& path) {
  auto library = std::make_shared<Library>();
  library->path = path;
  library->handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library->handle == nullptr) {
    const char* why = ::dlerror();
    return Status::NotFound("environment plug-in " + path +
                            ": cannot load: " + (why ? why : "unknown dlopen error"));
  }
  const std::string entry = "strider_environment_api_v" + std::to_string(kEnvironmentApiVersion);
  auto function =
      reinterpret_cast<StriderEnvironmentEntryPoint>(::dlsym(library->handle, entry.c_str()));
  if (function == nullptr) {
    // Say which version it was built for, when it exports another one.
    for (uint32_t version = 1; version < 64; ++version) {
      const std::string other = "strider_environment_api_v" + std::to_string(version);
      if (version != kEnvironmentApiVersion && ::dlsym(library->handle, other.c_str()) != nullptr) {
        return Status::FailedPrecondition(
            "environment plug-in " + path + " was built for environment API version " +
            std::to_string(version) + " (exports " + other + "); this strider speaks version " +
            std::to_string(kEnvironmentApiVersion) + ": rebuild it against envs/plugin.h");
      }
    }
    return Status::InvalidArgument("environment plug-in " + path + " exports no " + entry +
                                   " (is it a Strider environment plug-in?)");
  }
  library->api = function();
  if (library->api == nullptr) {
    return Status::InvalidArgument("environment plug-in " + path + ": " + entry + " returned NULL");
  }
  if (library->api->api_version != kEnvironmentApiVersion) {
    return Status::FailedPrecondition("environment plug-in " + path + " reports API version " +
                                      std::to_string(library->api->api_version) + " from " + entry +
                                      "; this strider speaks version " +
                                      std::to_string(kEnvironmentApiVersion));
  }
  if (library->api->struct_size < offsetof(StriderEnvironmentApi, scripted_turn) ||
      !library->api->describe || !library->api->create || !library->api->reset ||
      !library->api->step || !library->api->destroy) {
    return Status::InvalidArgument("environment plug-in " + path +
                                   ": its function table is incomplete");
  }
  return library;
}

// One handle per path for the process, so actors with many environments load a library once.
Result<std::shared_ptr<Library>> Load(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<Library>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto existing = loaded[path].lock()) return existing;
  STRIDER_ASSIGN_OR_RETURN(std::shared_ptr<Library> library, Open(path));
  loaded[path] = library;
  return library;
}

class PluginEnvironment : public Environment {
 public:
  PluginEnvironment(std::shared_ptr<Library> library, StriderEnvironment* env, EnvironmentSpec spec)
      : library_(std::move(library)), env_(env), spec_(std::move(spec)) {}
  ~PluginEnvironment() override { Close(); }

  EnvironmentSpec Describe() const override { return spec_; }

  Result<Observation> Reset(uint64_t seed, const Options& episode_options) override {
    if (env_ == nullptr) return Status::FailedPrecondition(Where("reset") + ": closed");
    const std::string options = ToWireText(OptionsToJson(episode_options));
    const char* reply = nullptr;
    const int rc = library_->api->reset(env_, seed, options.c_str(), &reply);
    STRIDER_ASSIGN_OR_RETURN(nlohmann::json json, Reply(rc, reply, "reset"));
    return ObservationFromJson(json, Where("reset reply"));
  }

  Result<StepResult> Step(const Action& action) override {
    if (env_ == nullptr) return Status::FailedPrecondition(Where("step") + ": closed");
    const std::string text = ToWireText(ActionToJson(action));
    const char* reply = nullptr;
    const int rc = library_->api->step(env_, text.c_str(), &reply);
    STRIDER_ASSIGN_OR_RETURN(nlohmann::json json, Reply(rc, reply, "step"));
    return StepResultFromJson(json, Where("step reply"));
  }

  void Close() override {
    if (env_ != nullptr) library_->api->destroy(env_);
    env_ = nullptr;
  }

 private:
  std::string Where(const std::string& what) const {
    return "environment plug-in " + library_->path + ": " + what;
  }

  Result<nlohmann::json> Reply(int rc, const char* reply, const std::string& what) const {
    if (reply == nullptr) return Status::Corruption(Where(what) + " gave no reply");
    if (rc != 0) return Status::Internal(Where(what) + " failed: " + reply);
    return ParseJsonObject(reply, Where(what + " reply"));
  }

  std::shared_ptr<Library> library_;
  StriderEnvironment* env_;
  EnvironmentSpec spec_;
};

class PluginPolicy : public ScriptedPolicy {
 public:
  explicit PluginPolicy(std::shared_ptr<Library> library) : library_(std::move(library)) {}
  Result<std::string> NextTurn(const std::vector<Observation>& observations) override {
    const std::string text = ToWireText(ObservationsToJson(observations));
    const char* reply = nullptr;
    const int rc = library_->api->scripted_turn(text.c_str(), &reply);
    if (reply == nullptr) {
      return Status::Corruption("environment plug-in " + library_->path +
                                ": scripted_turn gave no reply");
    }
    if (rc != 0) {
      return Status::Internal("environment plug-in " + library_->path +
                              ": scripted_turn failed: " + reply);
    }
    return std::string(reply);
  }

 private:
  std::shared_ptr<Library> library_;
};

}  // namespace

Result<std::unique_ptr<Environment>> LoadPluginEnvironment(const std::string& path,
                                                           const Options& options) {
  STRIDER_ASSIGN_OR_RETURN(std::shared_ptr<Library> library, Load(path));
  const char* describe = library->api->describe();
  if (describe == nullptr)
    return Status::Corruption("environment plug-in " + path + ": describe gave NULL");
  const std::string where = "environment plug-in " + path + ": describe";
  STRIDER_ASSIGN_OR_RETURN(nlohmann::json json, ParseJsonObject(describe, where));
  STRIDER_ASSIGN_OR_RETURN(EnvironmentSpec spec, SpecFromJson(json, where));
  const std::string options_json = ToWireText(OptionsToJson(options));
  const char* error = nullptr;
  StriderEnvironment* env = library->api->create(options_json.c_str(), &error);
  if (env == nullptr) {
    return Status::InvalidArgument("environment plug-in " + path + " (" + spec.name +
                                   "): create failed: " + (error ? error : "no message"));
  }
  return std::unique_ptr<Environment>(new PluginEnvironment(library, env, std::move(spec)));
}

Result<std::unique_ptr<ScriptedPolicy>> LoadPluginPolicy(const std::string& path) {
  STRIDER_ASSIGN_OR_RETURN(std::shared_ptr<Library> library, Load(path));
  if (library->api->struct_size <= offsetof(StriderEnvironmentApi, scripted_turn) ||
      library->api->scripted_turn == nullptr) {
    return Status::Unimplemented("environment plug-in " + path + " has no scripted policy");
  }
  return std::unique_ptr<ScriptedPolicy>(new PluginPolicy(library));
}

}  // namespace strider::envs
