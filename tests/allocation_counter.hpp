// tests/allocation_counter.hpp — every operator new of a test program counted, so that a test can
// say that a call allocates nothing (decoding allocates no scratch per token). The program that
// links allocation_counter.cpp replaces the global operator new with a counting one.
#pragma once

namespace bd_test {

/// Whether this build counts: not under AddressSanitizer, whose own operator new must pair with its
/// operator delete (a replacement mixes the two: alloc-dealloc-mismatch); the Release build counts.
bool counts_allocations();

/// How many times operator new (every form: the array and nothrow ones call the plain one) ran so
/// far in this process.
long allocations();

}  // namespace bd_test
