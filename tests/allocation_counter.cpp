// The counting operator new behind allocation_counter.hpp.
#include "allocation_counter.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define BD_TEST_COUNTS_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BD_TEST_COUNTS_NEW 0
#endif
#endif
#ifndef BD_TEST_COUNTS_NEW
#define BD_TEST_COUNTS_NEW 1
#endif

namespace {
std::atomic<long> count{0};
}

bool bd_test::counts_allocations() { return BD_TEST_COUNTS_NEW != 0; }
long bd_test::allocations() { return count.load(); }

#if BD_TEST_COUNTS_NEW
void* operator new(std::size_t size) {
  count.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif
