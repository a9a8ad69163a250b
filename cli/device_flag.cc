#include "cli/device_flag.h"

#include "common/model/config.h"
#include "common/model/model.h"

namespace strider::cli {

Status ApplyDeviceFlag(const std::string& flag, const std::string& config_path,
                       std::string* device) {
  if (!flag.empty()) {
    if (!ValidDeviceName(flag)) {
      return Status::InvalidArgument("--device: '" + flag + "' is not cpu, cuda or cuda:N");
    }
    *device = flag;
  }
  return ResolveDevice(*device).status().WithContext(config_path);
}

}  // namespace strider::cli
