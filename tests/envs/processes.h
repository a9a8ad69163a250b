// Finding processes by their command line, for tests that check nothing of a run outlives it.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace strider::testing {

// Pids of the processes whose command line holds `marker` and, when `program` is not empty,
// starts with it. Zombies have an empty command line, so they never count.
inline std::vector<pid_t> ProcessesWith(const std::string& marker,
                                        const std::string& program = "") {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream file(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(file)),
                              std::istreambuf_iterator<char>());
    if (cmdline.rfind(program, 0) == 0 && cmdline.find(marker) != std::string::npos) {
      found.push_back(std::stoi(name));
    }
  }
  return found;
}

}  // namespace strider::testing
