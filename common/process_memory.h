// Allocator settings shared by the processes that move large buffers (model runs, the replay
// server), and the resident-memory readings that benchmarks and memory tests compare against
// their formulas. No LibTorch here.
#pragma once

#include <cstdint>

namespace strider {

// Blocks below 256 MiB come from the heap and stay there when freed. glibc otherwise returns
// every large block to the kernel on free, and on virtual machines where touching a fresh page
// costs tens of microseconds the next allocation of the same size spends more time in page
// faults than in its work. Process-wide: call once, early.
void KeepFreedMemoryInHeap();

// Blocks of `bytes` and more are mapped from the kernel per allocation and returned on free.
// For processes whose large temporaries come from the tensor pool (common/model/tensor_pool.h,
// which ConfigureRuntime installs): what still reaches malloc in large blocks is one-off
// buffers (an encoded segment of a long trajectory, a published weight file), and kept in the
// heap those stay resident, split by the small objects allocated after them.
void ReturnLargeBlocksToKernel(int64_t bytes);

// This process's resident set now (VmRSS of /proc/self/status) in bytes; 0 where the kernel
// does not report it. Pages the allocator keeps free for reuse count as resident.
int64_t ResidentBytes();

// Another process's resident set now (VmRSS of /proc/<pid>/status) in bytes; 0 where the
// process is gone or the kernel does not report it.
int64_t ResidentBytesOf(int pid);

// The largest resident set since the process started or since the last ResetPeakResident
// (VmHWM) in bytes; 0 where the kernel does not report it.
int64_t PeakResidentBytes();

// Restarts the peak from the current resident set (writes 5 to /proc/self/clear_refs), so a
// later PeakResidentBytes covers only what ran in between.
void ResetPeakResident();

}  // namespace strider
