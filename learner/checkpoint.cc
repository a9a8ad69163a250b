#include "learner/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/durable_file.h"
#include "common/model/model.h"
#include "learner/optimizer.h"

namespace strider {
namespace {

// WriteCheckpoint swaps directories in two renames (<dir> to <dir>.old, then <dir>.tmp to <dir>);
// a crash between them leaves no <dir>, with the previous checkpoint whole in <dir>.old (its files
// were synced before). Moving it back restores the "previous or new" promise.
Status RecoverInterruptedSwap(const std::string& directory) {
  namespace fs = std::filesystem;
  const std::string previous = directory + ".old";
  std::error_code error;
  if (fs::exists(directory, error) || !fs::exists(previous + "/state.json", error)) {
    return Status::Ok();
  }
  return RenameDurably(previous, directory)
      .WithContext("cannot restore interrupted checkpoint " + previous);
}

std::string ToHex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    text += kDigits[byte >> 4];
    text += kDigits[byte & 15];
  }
  return text;
}

Result<std::string> FromHex(const std::string& text, const std::string& path) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() % 2 != 0) return Status::Corruption(path + ": rng_state has an odd length");
  std::string bytes(text.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    const int high = digit(text[2 * i]), low = digit(text[2 * i + 1]);
    if (high < 0 || low < 0) return Status::Corruption(path + ": rng_state is not lowercase hex");
    bytes[i] = static_cast<char>(high * 16 + low);
  }
  return bytes;
}

}  // namespace

std::string CheckpointModelPath(const std::string& directory) {
  return directory + "/model.safetensors";
}
std::string CheckpointOptimizerPath(const std::string& directory) {
  return directory + "/optimizer.safetensors";
}

Status WriteCheckpoint(const std::string& directory, const Model& model, const AdamW* optimizer,
                       const CheckpointState& state, const CheckpointExtra& extra) {
  namespace fs = std::filesystem;
  const std::string temporary = directory + ".tmp";
  const std::string previous = directory + ".old";
  // Before <dir>.old is removed below: it may be the only whole checkpoint left.
  STRIDER_RETURN_IF_ERROR(RecoverInterruptedSwap(directory));
  std::error_code error;
  fs::remove_all(temporary, error);
  fs::create_directories(temporary, error);
  if (error) return Status::IoError("cannot create " + temporary + ": " + error.message());
  STRIDER_RETURN_IF_ERROR(model.Save(CheckpointModelPath(temporary)));
  if (optimizer != nullptr) {
    STRIDER_RETURN_IF_ERROR(optimizer->Save(CheckpointOptimizerPath(temporary)));
  }
  if (extra) STRIDER_RETURN_IF_ERROR(extra(temporary));
  nlohmann::json json = {{"format", 2},
                         {"mode", state.mode},
                         {"model", state.model},
                         {"seed", state.seed},
                         {"step", state.step},
                         {"policy_version", state.policy_version},
                         {"sample_step", state.sample_step},
                         {"total_tokens", state.total_tokens},
                         {"sampler_cursor", state.sampler_cursor},
                         {"rng_state", ToHex(state.rng_state)}};
  if (state.mode == "pretrain") {
    json["pretrain"] = {{"stage", state.pretrain.stage},
                        {"stage_index", state.pretrain.stage_index},
                        {"stage_complete", state.pretrain.stage_complete},
                        {"stage_tokens", state.pretrain.stage_tokens},
                        {"data_position", state.pretrain.data_position}};
  }
  const std::string state_path = temporary + "/state.json";
  STRIDER_RETURN_IF_ERROR(WriteFileDurably(state_path, json.dump(2) + "\n"));
  fs::remove_all(previous, error);
  if (fs::exists(directory)) {
    STRIDER_RETURN_IF_ERROR(
        RenameDurably(directory, previous).WithContext("cannot move old checkpoint " + directory));
  }
  // RenameDurably syncs <dir>.tmp itself (its files are synced already) and then the parent.
  STRIDER_RETURN_IF_ERROR(RenameDurably(temporary, directory));
  fs::remove_all(previous, error);
  return Status::Ok();
}

Result<CheckpointState> ReadCheckpointState(const std::string& directory) {
  STRIDER_RETURN_IF_ERROR(RecoverInterruptedSwap(directory));
  const std::string path = directory + "/state.json";
  std::ifstream in(path);
  if (!in) return Status::NotFound("no checkpoint state at " + path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    nlohmann::json json = nlohmann::json::parse(text.str());
    const int format = json.value("format", 1);
    CheckpointState state;
    state.model = json.at("model").get<std::string>();
    state.seed = json.at("seed").get<uint64_t>();
    state.step = json.at("step").get<int64_t>();
    state.total_tokens = json.at("total_tokens").get<int64_t>();
    // Format 1: pretraining's fields at the top level, nothing mode-neutral beyond the above.
    const nlohmann::json* pretrain = &json;
    if (format == 1) {
      state.mode = "pretrain";
    } else if (format == 2) {
      state.mode = json.at("mode").get<std::string>();
      state.policy_version = json.at("policy_version").get<uint64_t>();
      state.sample_step = json.at("sample_step").get<int64_t>();
      state.sampler_cursor = json.at("sampler_cursor").get<std::string>();
      STRIDER_ASSIGN_OR_RETURN(state.rng_state,
                               FromHex(json.at("rng_state").get<std::string>(), path));
      pretrain = json.contains("pretrain") ? &json.at("pretrain") : nullptr;
    } else {
      return Status::InvalidArgument(path + ": checkpoint format " + std::to_string(format) +
                                     " is newer than this build reads (2)");
    }
    if (state.mode == "pretrain") {
      if (pretrain == nullptr) {
        return Status::Corruption(path + ": mode pretrain without 'pretrain'");
      }
      state.pretrain.stage = pretrain->at("stage").get<std::string>();
      state.pretrain.stage_index = pretrain->at("stage_index").get<int64_t>();
      state.pretrain.stage_complete = pretrain->at("stage_complete").get<bool>();
      state.pretrain.stage_tokens = pretrain->at("stage_tokens").get<int64_t>();
      state.pretrain.data_position = pretrain->at("data_position").get<int64_t>();
    }
    return state;
  } catch (const std::exception& error) {
    return Status::Corruption(path + ": " + error.what());
  }
}

}  // namespace strider
