// The Hugging Face side of `strider model`: `info --from-hf`, `import --from-hf` and
// `export --from-hf ... --to-hf` (docs/models.md).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace strider::cli {

// `strider model info --from-hf DIR [--expert-parallel N]`: prints the figures as JSON.
Status PrintHfModelInfo(const std::string& directory, int64_t expert_parallel);

// Registers `import` and `export` under `model`.
void AddHfModelCommands(CLI::App* model, int& exit_code);

}  // namespace strider::cli
