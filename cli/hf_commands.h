// The Hugging Face side of `strider model`: `info --from-hf`, `import --from-hf` and
// `export --from-hf ... --to-hf` (docs/models.md).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "common/model/config.h"
#include "common/status.h"

namespace strider {
class Model;
}

namespace strider::cli {

// `strider model info --from-hf DIR [--expert-parallel N]`: prints the figures as JSON.
Status PrintHfModelInfo(const std::string& directory, int64_t expert_parallel);

// A Hugging Face checkpoint converted in memory and loaded as a Model (fp32) on `device` (empty:
// the imported config's cpu): what `model eval --from-hf` runs. `config` receives the model
// config.
Result<std::unique_ptr<Model>> LoadHfModel(const std::string& directory, const std::string& device,
                                           ModelConfig* config);

// Registers `import` and `export` under `model`.
void AddHfModelCommands(CLI::App* model, int& exit_code);

}  // namespace strider::cli
