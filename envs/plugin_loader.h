// Loading shared-library plug-ins (plugin.h) as Environments. Internal to envs/: the registry
// calls it for `env: {library: ...}`.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

// Loads (or reuses) the library at `path`, checks its API version and creates one environment
// with `options`. Errors name the library and what was wrong: not loadable (dlerror's text),
// no entry point, another API version, a failed create.
Result<std::unique_ptr<Environment>> LoadPluginEnvironment(const std::string& path,
                                                           const Options& options);
Result<std::unique_ptr<ScriptedPolicy>> LoadPluginPolicy(const std::string& path);

}  // namespace strider::envs
