// keep_freed_heap (bd/core/heap.hpp): the opt-in allocator setting programs that prepare many
// products use. It changes the allocator of the whole process, so it runs in its own test
// executable (bd_heap_tests), and each ctest case in its own process. What it promises is
// observable through glibc's mallinfo2: a block between the old 128 KiB and the new 32 MiB mmap
// threshold comes from the heap instead of its own mapping, and freeing it at the heap's top
// does not hand the memory back (the trim threshold is 1 GiB); a block above 32 MiB is still
// mapped. Elsewhere (another C library) it must say it did nothing.
//
// heap.hpp is included first, before any other header: it must find out which C library it is
// on by itself (a program that included it first once compiled keep_freed_heap() to nothing).
#include <bd/core/heap.hpp>

#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace {

/// A block the compiler cannot elide: written through, read back.
unsigned char* take(std::size_t bytes, unsigned char fill) {
  auto* p = static_cast<unsigned char*>(std::malloc(bytes));
  REQUIRE(p != nullptr);
  std::memset(p, fill, bytes);
  const volatile unsigned char* v = p;
  REQUIRE(v[0] == fill);
  REQUIRE(v[bytes - 1] == fill);
  return p;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
#define BD_MALLOC_IS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BD_MALLOC_IS_ASAN 1
#endif
#endif

TEST_CASE("keep_freed_heap: blocks up to 32 MiB come from the heap and stay with it when freed", "[heap]") {
#if defined(BD_MALLOC_IS_ASAN)
  WARN("built with AddressSanitizer: malloc is ASan's, glibc's thresholds cannot be observed");
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  REQUIRE(bd::keep_freed_heap());
  const std::size_t mid = std::size_t(256) << 10, big = std::size_t(40) << 20;

  // 256 KiB: above glibc's default mmap threshold (128 KiB), below the new one: not a mapping.
  const struct mallinfo2 before = mallinfo2();
  unsigned char* a = take(mid, 1);
  const struct mallinfo2 holding = mallinfo2();
  CHECK(holding.hblks == before.hblks);
  // Freed at the top of the heap: with the default trim threshold (128 KiB) glibc would shrink the
  // heap by it (brk); raised to 1 GiB, the heap keeps its size and the block comes back as free.
  std::free(a);
  const struct mallinfo2 freed = mallinfo2();
  CHECK(freed.arena == holding.arena);
  CHECK(freed.fordblks >= holding.fordblks + mid);

  // 40 MiB: above glibc's largest mmap threshold, still its own mapping.
  unsigned char* b = take(big, 2);
  CHECK(mallinfo2().hblks == before.hblks + 1);
  // Memory still works: two live blocks are distinct and keep their contents.
  unsigned char* c = take(mid, 3);
  CHECK(b != c);
  CHECK(b[big / 2] == 2);
  CHECK(c[mid / 2] == 3);
  std::free(c);
  std::free(b);
#elif defined(__GLIBC__)
  CHECK(bd::keep_freed_heap());  // glibc before 2.33 has no mallinfo2 to observe it with
#else
  CHECK_FALSE(bd::keep_freed_heap());
#endif
}
