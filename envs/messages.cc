#include "envs/messages.h"

#include <fmt/format.h>

#include <cstdint>

namespace strider::envs {
namespace {

using nlohmann::json;

Status Bad(const std::string& where, const std::string& what) {
  return Status::Corruption(where + ": " + what);
}

}  // namespace

json OptionsToJson(const Options& options) {
  json out = json::object();
  for (const auto& [key, value] : options) out[key] = value;
  return out;
}

json ObservationToJson(const Observation& observation) {
  json images = json::array();
  for (const Image& image : observation.images) {
    images.push_back({{"width", image.width},
                      {"height", image.height},
                      {"channels", image.channels},
                      {"pixels_base64", Base64Encode(image.pixels)}});
  }
  return {{"role", std::string(ObservationRoleName(observation.role))},
          {"text", observation.text},
          {"images", images}};
}

json ObservationsToJson(const std::vector<Observation>& observations) {
  json out = json::array();
  for (const Observation& observation : observations) out.push_back(ObservationToJson(observation));
  return out;
}

json ActionToJson(const Action& action) {
  json call = nullptr;
  if (action.tool_call) {
    call = {{"name", action.tool_call->name}, {"arguments", action.tool_call->arguments}};
  }
  return {{"text", action.text}, {"tool_call", call}, {"tool_call_error", action.tool_call_error}};
}

Result<Observation> ObservationFromJson(const json& in, const std::string& where) {
  if (!in.is_object()) return Bad(where, "observation must be an object");
  Observation observation;
  const json role_field = in.value("role", json("user"));
  if (!role_field.is_string()) return Bad(where, "observation.role must be a string");
  const std::string role = role_field.get<std::string>();
  if (role == "user") {
    observation.role = ObservationRole::kUser;
  } else if (role == "system") {
    observation.role = ObservationRole::kSystem;
  } else if (role == "tool_result") {
    observation.role = ObservationRole::kToolResult;
  } else {
    return Bad(where, "observation.role '" + role + "' is not user, system or tool_result");
  }
  if (!in.contains("text") || !in["text"].is_string()) {
    return Bad(where, "observation.text must be a string");
  }
  observation.text = in["text"].get<std::string>();
  if (in.contains("images")) {
    if (!in["images"].is_array()) return Bad(where, "observation.images must be a list");
    for (const json& item : in["images"]) {
      Image image;
      if (!item.is_object() || !item.value("width", json()).is_number_integer() ||
          !item.value("height", json()).is_number_integer() ||
          !item.value("pixels_base64", json()).is_string()) {
        return Bad(where, "an image needs integer width, height and a pixels_base64 string");
      }
      image.width = item["width"].get<int32_t>();
      image.height = item["height"].get<int32_t>();
      const json channels = item.value("channels", json(3));
      if (!channels.is_number_integer()) return Bad(where, "image channels must be an integer");
      image.channels = channels.get<int32_t>();
      Result<std::string> pixels = Base64Decode(item["pixels_base64"].get<std::string>());
      if (!pixels.ok()) return Bad(where, "image pixels: " + pixels.status().message());
      image.pixels = std::move(*pixels);
      if (image.width <= 0 || image.height <= 0 || image.channels <= 0 ||
          image.pixels.size() != static_cast<size_t>(image.width) * image.height * image.channels) {
        return Bad(where, "image of " + std::to_string(image.width) + "x" +
                              std::to_string(image.height) + "x" + std::to_string(image.channels) +
                              " has " + std::to_string(image.pixels.size()) + " bytes");
      }
      observation.images.push_back(std::move(image));
    }
  }
  return observation;
}

Result<StepResult> StepResultFromJson(const json& in, const std::string& where) {
  if (!in.is_object()) return Bad(where, "step reply must be an object");
  StepResult result;
  if (!in.contains("observation")) return Bad(where, "step reply has no observation");
  STRIDER_ASSIGN_OR_RETURN(result.observation, ObservationFromJson(in["observation"], where));
  auto number = [&](const char* key, std::optional<double>* out) -> Status {
    if (!in.contains(key) || in[key].is_null()) return Status::Ok();
    if (!in[key].is_number()) return Bad(where, std::string(key) + " must be a number or null");
    *out = in[key].get<double>();
    return Status::Ok();
  };
  STRIDER_RETURN_IF_ERROR(number("reward", &result.reward));
  STRIDER_RETURN_IF_ERROR(number("outcome_reward", &result.outcome_reward));
  const json label = in.value("label", json("unknown"));
  if (label == "correct") {
    result.label = StepLabel::kCorrect;
  } else if (label == "incorrect") {
    result.label = StepLabel::kIncorrect;
  } else if (label == "unknown") {
    result.label = StepLabel::kUnknown;
  } else {
    return Bad(where, "label must be correct, incorrect or unknown, got " + label.dump());
  }
  const json done = in.value("done", json(false));
  if (!done.is_boolean()) return Bad(where, "done must be true or false");
  result.done = done.get<bool>();
  if (in.contains("info")) {
    if (!in["info"].is_object()) return Bad(where, "info must be an object");
    for (const auto& [key, value] : in["info"].items()) {
      result.info[key] = value.is_string() ? value.get<std::string>() : value.dump();
    }
  }
  return result;
}

Result<EnvironmentSpec> SpecFromJson(const json& in, const std::string& where) {
  if (!in.is_object()) return Bad(where, "describe reply must be an object");
  EnvironmentSpec spec;
  if (!in.value("name", json()).is_string() || in["name"].get<std::string>().empty()) {
    return Bad(where, "describe reply needs a non-empty name");
  }
  spec.name = in["name"].get<std::string>();
  const json description = in.value("description", json(""));
  if (!description.is_string()) return Bad(where, "description must be a string");
  spec.description = description.get<std::string>();
  const json max_turns = in.value("max_turns", json(spec.max_turns));
  if (!max_turns.is_number_integer() || max_turns.get<int64_t>() <= 0) {
    return Bad(where, "max_turns must be a positive integer");
  }
  spec.max_turns = max_turns.get<int32_t>();
  const json tools = in.value("tools", json::array());
  if (!tools.is_array()) return Bad(where, "tools must be a list");
  for (const json& tool : tools) {
    if (!tool.is_object() || !tool.value("name", json()).is_string()) {
      return Bad(where, "each tool needs a name");
    }
    ToolSpec spec_tool;
    spec_tool.name = tool["name"].get<std::string>();
    const json arguments = tool.value("arguments", json::object());
    spec_tool.arguments = arguments.is_string() ? arguments.get<std::string>() : arguments.dump();
    const json tool_description = tool.value("description", json(""));
    if (!tool_description.is_string()) {
      return Bad(where, "tool " + spec_tool.name + ": description must be a string");
    }
    spec_tool.description = tool_description.get<std::string>();
    spec.tools.push_back(std::move(spec_tool));
  }
  const json options = in.value("options", json::array());
  if (!options.is_array()) return Bad(where, "options must be a list of option names");
  for (const json& option : options) {
    if (!option.is_string()) return Bad(where, "options must be a list of option names");
    spec.options.push_back(option.get<std::string>());
  }
  return spec;
}

namespace {

// The first `limit` bytes of text a plug-in sent, for an error message: valid UTF-8 is kept,
// any other byte (and control characters) is written as \xNN. Messages travel on as JSON
// (`env run --json`, stored episode metadata, logs), which must not receive invalid UTF-8.
std::string Shown(std::string_view text, size_t limit) {
  std::string out;
  size_t i = 0;
  while (i < text.size() && i < limit) {
    const auto byte = static_cast<uint8_t>(text[i]);
    size_t length = byte < 0x80 ? 1 : (byte >> 5) == 0x6 ? 2 : (byte >> 4) == 0xE ? 3
                                    : (byte >> 3) == 0x1E ? 4 : 0;
    if (length > 1 && i + length <= text.size()) {
      uint32_t code = byte & (0x7F >> length);
      for (size_t k = 1; k < length; ++k) {
        const auto next = static_cast<uint8_t>(text[i + k]);
        if ((next & 0xC0) != 0x80) {
          length = 0;
          break;
        }
        code = (code << 6) | (next & 0x3F);
      }
      // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 either.
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (length > 1 && (code < kMin[length] || code > 0x10FFFF ||
                         (code >= 0xD800 && code <= 0xDFFF))) {
        length = 0;
      }
    } else if (length > 1) {
      length = 0;  // cut off by the end of the text
    }
    if (length == 1 && byte >= 0x20 && byte != 0x7F) {
      out.push_back(static_cast<char>(byte));
    } else if (length > 1) {
      out.append(text.substr(i, length));
    } else {
      out += fmt::format("\\x{:02X}", byte);
      length = 1;
    }
    i += length;
  }
  if (i < text.size()) out += "...";
  return out;
}

}  // namespace

Result<json> ParseJsonObject(std::string_view text, const std::string& where) {
  json parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded()) {
    return Bad(where, "not valid JSON: '" + Shown(text, 80) + "'");
  }
  if (!parsed.is_object())
    return Bad(where, "expected a JSON object, got " + std::string(parsed.type_name()));
  return parsed;
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string ToWireText(const nlohmann::json& message) {
  return message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint8_t(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= uint8_t(bytes[i + 1]) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Base64Decode(std::string_view text) {
  if (text.size() % 4 != 0) return Status::Corruption("base64 length is not a multiple of 4");
  int8_t table[256];
  std::fill(std::begin(table), std::end(table), -1);
  for (int i = 0; i < 64; ++i) table[uint8_t(kAlphabet[i])] = static_cast<int8_t>(i);
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        ++pad;
        v <<= 6;
        continue;
      }
      if (pad > 0 || table[uint8_t(c)] < 0) return Status::Corruption("invalid base64 character");
      v = (v << 6) | table[uint8_t(c)];
    }
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

}  // namespace strider::envs
