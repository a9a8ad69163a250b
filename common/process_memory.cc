#include "common/process_memory.h"

#include <malloc.h>

#include <fstream>
#include <string>
#include <string_view>

namespace strider {
namespace {

// The value of a "Name:  1234 kB" line of /proc/<process>/status in bytes, 0 if absent.
int64_t StatusKilobytes(std::string_view name, const std::string& process = "self") {
  std::ifstream status("/proc/" + process + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 &&
        line[name.size()] == ':') {
      return std::stoll(line.substr(name.size() + 1)) * 1024;
    }
  }
  return 0;
}

}  // namespace

void KeepFreedMemoryInHeap() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void ReturnLargeBlocksToKernel(int64_t bytes) { mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)); }

int64_t ResidentBytes() { return StatusKilobytes("VmRSS"); }

int64_t ResidentBytesOf(int pid) { return StatusKilobytes("VmRSS", std::to_string(pid)); }

int64_t PeakResidentBytes() { return StatusKilobytes("VmHWM"); }

void ResetPeakResident() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace strider
