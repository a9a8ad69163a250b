// Fleet files for the launcher's tests: three placeholder child configs and a fleet naming them.
#pragma once

#include <fstream>
#include <string>

#include "tests/scratch_dir.h"


namespace strider::launcher {

// A fleet in `dir` naming replay.yaml, learner.yaml and actor.yaml there, plus `extra` YAML
// (top-level keys; `replay_extra` etc. go inside the role's section, one "key: value" a line).
inline std::string WriteFleet(const testing::TempDir& dir, const std::string& extra,
                              const std::string& replay_extra = "",
                              const std::string& learner_extra = "",
                              const std::string& actors_extra = "") {
  for (const char* name : {"replay.yaml", "learner.yaml", "actor.yaml"}) {
    std::ofstream(dir.Sub(name)) << "# placeholder\n";
  }
  const auto indented = [](const std::string& lines) {
    std::string out;
    size_t start = 0;
    while (start < lines.size()) {
      size_t end = lines.find('\n', start);
      if (end == std::string::npos) end = lines.size();
      out += "  " + lines.substr(start, end - start) + "\n";
      start = end + 1;
    }
    return out;
  };
  const std::string path = dir.Sub("fleet.yaml");
  std::ofstream(path) << "replay:\n  config: " << dir.Sub("replay.yaml") << "\n"
                      << indented(replay_extra) << "learner:\n  config: " << dir.Sub("learner.yaml")
                      << "\n"
                      << indented(learner_extra) << "actors:\n  config: " << dir.Sub("actor.yaml")
                      << "\n"
                      << indented(actors_extra) << extra;
  return path;
}

}  // namespace strider::launcher
