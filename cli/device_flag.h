// The `--device` flag of the commands whose config carries the model's `device:` key.
#pragma once

#include <string>

#include "common/status.h"

namespace strider::cli {

// Puts a `--device` flag over the config's `device:` key (an empty flag keeps the key) and
// checks the result before any work starts, so a device this host lacks is a usage error.
// Errors are InvalidArgument naming the flag when it is malformed, the config file otherwise.
Status ApplyDeviceFlag(const std::string& flag, const std::string& config_path,
                       std::string* device);

}  // namespace strider::cli
