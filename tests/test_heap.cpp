// keep_freed_heap (bd/core/heap.hpp): the opt-in allocator setting programs that prepare many
// products use. On glibc it must take both thresholds; elsewhere it must say it did nothing.
#include <catch2/catch.hpp>

#include <bd/core/heap.hpp>

#include <cstdlib>
#include <vector>

TEST_CASE("keep_freed_heap takes glibc's thresholds, and memory still works after it", "[heap]") {
#if defined(__GLIBC__)
  CHECK(bd::keep_freed_heap());
#else
  CHECK_FALSE(bd::keep_freed_heap());
#endif
  // Blocks on both sides of the old 128 KiB mmap threshold and above the new 32 MiB one, freed
  // and taken again: the allocator must hand back usable, distinct memory.
  for (std::size_t bytes : {std::size_t(64) << 10, std::size_t(256) << 10, std::size_t(40) << 20}) {
    std::vector<unsigned char> a(bytes, 1), b(bytes, 2);
    CHECK(a.front() == 1);
    CHECK(b.back() == 2);
    CHECK(a.data() != b.data());
  }
}
