// LibTorch's CPU tensor buffers of 256 KiB and more, from a pool of their own.
//
// Why: a model call's large temporaries (a prefill chunk's activations, a training chunk's
// graph) are freed at its end, and the malloc heap keeps them for the next call (faulting fresh
// pages costs more than the work on these machines; process_memory.h). But long-lived objects
// allocated between calls (segments, vectors that grow with the trajectory, the store's
// memtable) land in those freed holes, the next call's temporaries no longer fit, and the heap
// grows by another working set: resident memory of a million-token episode grew by twice its
// latent cache that way. In the pool, buffers of one size class come back as the same pages,
// call after call, and nothing else can split them.
//
// Size classes are four per power of two (at most 25% over a request, whole pages), each
// mapped from the kernel on first need and kept when freed. A request no class has cached takes
// a cached buffer up to twice its size before mapping a new one; while the cache holds more
// than the most ever in use at once (or 64 MiB, whichever is larger), the classes unused the
// longest are unmapped. So what is mapped stays within twice the working set.
// Smaller requests go to malloc as before.
#pragma once

#include <cstdint>

namespace strider {

struct TensorPoolStats {
  int64_t mapped_bytes = 0;       // held from the kernel: in use plus cached
  int64_t in_use_bytes = 0;       // in live tensors
  int64_t peak_in_use_bytes = 0;  // the most ever in live tensors at once
  int64_t cached_bytes = 0;       // freed, kept for reuse (resident once touched)
  // Of those, the pages tensors have held (each buffer up to the end of the largest tensor it
  // held): what of the cache is resident. A class is up to a quarter larger than its tensors,
  // and pages no tensor reached are never touched.
  int64_t cached_written_bytes = 0;
  int64_t peak_mapped_bytes = 0;  // the most ever mapped at once
  int64_t hits = 0;               // requests served from the cache
  int64_t misses = 0;             // requests that mapped new memory
  int64_t unmapped_bytes = 0;     // cache given back to the kernel so far
  // The most in live tensors at once since the last ResetTensorPoolWindow (or the start): one
  // call's working set, measured by bracketing it.
  int64_t window_peak_in_use_bytes = 0;
};

// Makes the pool LibTorch's CPU allocator from now on (tensors allocated before keep their own
// deleter). Process-wide and idempotent; ConfigureRuntime calls it. STRIDER_TENSOR_POOL=0 in
// the environment leaves LibTorch's allocator in place, so that a heap profiler, which sees
// malloc and not the pool's mappings, attributes every tensor.
void UseTensorPool();

// Zeros where the pool is not in use.
TensorPoolStats GetTensorPoolStats();

// Starts a new window: window_peak_in_use_bytes becomes what is in use now.
void ResetTensorPoolWindow();

// Gives every cached buffer back to the kernel; live tensors keep theirs. For a caller whose
// next call needs other sizes than the calls before it (a chunk that records a graph after
// chunks that did not): without it, that call's requests take the cached buffers of other
// classes up to twice their size, or map new ones beside them, and what is resident grows by
// the difference. The next call of the old sizes faults its pages in again.
void TrimTensorPool();

}  // namespace strider
