// libFuzzer target for the out-of-process environment protocol (docs/environments.md): a reply
// from a plug-in is untrusted bytes. No input may crash, hang or read out of bounds; an accepted
// reply decodes into an observation, a step result or a spec, and every error message (which
// travels on as JSON) is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "envs/messages.h"

namespace {

// Serialising as strict JSON throws on invalid UTF-8: that is the check.
void MustBeUtf8(const std::string& text) {
  (void)nlohmann::json(text).dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  using strider::envs::ParseJsonObject;
  strider::Result<nlohmann::json> reply = ParseJsonObject(text, "fuzz reply");
  if (!reply.ok()) {
    MustBeUtf8(reply.status().message());
    return 0;
  }
  const nlohmann::json& message = *reply;
  if (message.contains("observation")) {
    auto observation = strider::envs::ObservationFromJson(message["observation"], "fuzz");
    if (!observation.ok()) MustBeUtf8(observation.status().message());
  }
  auto step = strider::envs::StepResultFromJson(message, "fuzz");
  if (!step.ok()) MustBeUtf8(step.status().message());
  if (message.contains("spec")) {
    auto spec = strider::envs::SpecFromJson(message["spec"], "fuzz");
    if (!spec.ok()) MustBeUtf8(spec.status().message());
  }
  // A message to the plug-in built from whatever came back never fails to serialise.
  (void)strider::envs::ToWireText(message);
  return 0;
}
