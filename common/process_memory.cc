#include "common/process_memory.h"

#include <malloc.h>

namespace strider {

void KeepFreedMemoryInHeap() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace strider
