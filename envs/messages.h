// The JSON messages both plug-in paths exchange (docs/environments.md, "Messages"): a shared
// library passes them through the C ABI of plugin.h, an external process over ZeroMQ. One format
// means a plug-in can move between the two paths without rewriting its encoding.
// Internal to envs/.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "envs/environment.h"

namespace strider::envs {

nlohmann::json OptionsToJson(const Options& options);
nlohmann::json ObservationToJson(const Observation& observation);
nlohmann::json ObservationsToJson(const std::vector<Observation>& observations);
nlohmann::json ActionToJson(const Action& action);

// Decoders name the offending field, prefixed by `where` ("plug-in libfoo.so: step reply").
Result<Observation> ObservationFromJson(const nlohmann::json& json, const std::string& where);
Result<StepResult> StepResultFromJson(const nlohmann::json& json, const std::string& where);
Result<EnvironmentSpec> SpecFromJson(const nlohmann::json& json, const std::string& where);

// Serialises a message for a plug-in. A model's turn may hold bytes that are not valid UTF-8
// (the tokenizer is byte-level); JSON cannot carry them, so each invalid byte becomes U+FFFD in
// the message. The token stream the learner trains on keeps the exact ids; only the plug-in's
// view of the text is repaired.
std::string ToWireText(const nlohmann::json& message);

// Parses text that must be a JSON object.
Result<nlohmann::json> ParseJsonObject(std::string_view text, const std::string& where);

std::string Base64Encode(std::string_view bytes);
Result<std::string> Base64Decode(std::string_view text);

}  // namespace strider::envs
