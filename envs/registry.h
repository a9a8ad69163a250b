// Environment configs from YAML, and the registry behind MakeEnvironment (environment.h).
//
//   env:
//     name: calculator                 # a built-in, or the name a plug-in reports
//     options: {difficulty: 3}         # strings, numbers or booleans; each env checks its own
//     library: path/to/libmy_env.so    # plug-in path 1 (plugin.h); or
//     command: /usr/bin/python3 my_env.py   # plug-in path 2 (docs/environments.md)
//     step_timeout_ms: 10000
//
// Options are checked against the keys the environment declares (EnvironmentSpec::options), so
// a misspelt option fails with the file, line and key. For plug-ins that means the library is
// loaded, or the process started, once to ask.
#pragma once

#include <string>

#include "common/config.h"
#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

// Reads one `env:` mapping (pass root.Section("env")); the caller calls Finish on its document.
Result<EnvironmentConfig> ReadEnvironmentConfig(ConfigReader& env);
// A whole file whose top level has `env:`.
Result<EnvironmentConfig> LoadEnvironmentConfig(const std::string& path);

}  // namespace strider::envs
