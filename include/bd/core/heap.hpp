// bd/core/heap.hpp — opt-in: keep freed heap memory in the process while preparing many products.
//
// Preparation's scratch lives in the caller's bd::Workspace (base/workspace.hpp) and is reused,
// but its results cannot be: each product's stored B and C (512 KiB and 96 KiB in half for a
// DeepSeek-V2-Lite head) are new allocations the caller owns, and the previous layer's are
// freed. glibc hands such blocks back to the kernel as soon as they are freed — blocks above
// M_MMAP_THRESHOLD at once (munmap), the heap's top once more than M_TRIM_THRESHOLD of it is
// free — so the next layer's results are faulted in again, zeroed by the kernel (about 5 % of
// DeepSeek-V2-Lite's preparation, measured with glibc's equivalent tunables). keep_freed_heap()
// raises both thresholds so freed blocks stay with the process and are reused. It changes the
// allocator of the whole process (mallopt), so bd never calls it on its own: a program opts in,
// as bd-convert does. Memory is then returned only when the process ends; peak use is unchanged
// (freed blocks are reused, not added to).
#pragma once

// __GLIBC__ comes from the C library's own headers (features.h): include one before testing it,
// or a program that includes this header first would compile keep_freed_heap() to nothing.
#include <cstdlib>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace bd {

/// Raises glibc's trim and mmap thresholds (see the file comment). True if the allocator took
/// the settings; false elsewhere (another C library), where it does nothing.
inline bool keep_freed_heap() {
#if defined(__GLIBC__)
  // 32 MiB is glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): blocks up to
  // it come from the heap; the trim threshold keeps up to 1 GiB of free heap top.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace bd
