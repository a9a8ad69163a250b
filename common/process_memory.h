// Allocator settings shared by the processes that move large buffers (model runs, the replay
// server). No LibTorch here.
#pragma once

namespace strider {

// Blocks below 256 MiB come from the heap and stay there when freed. glibc otherwise returns
// every large block to the kernel on free, and on virtual machines where touching a fresh page
// costs tens of microseconds the next allocation of the same size spends more time in page
// faults than in its work. Process-wide: call once, early.
void KeepFreedMemoryInHeap();

}  // namespace strider
