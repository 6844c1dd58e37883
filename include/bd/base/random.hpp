// bd/base/random.hpp — the random numbers preparation draws (the ranking sketch Ω, the rounding
// floor's sample of W), the same on every platform.
//
// Preparation is reproducible from Options::seed. The standard library's engines are specified
// bit for bit, but its distributions are not: std::normal_distribution and
// std::uniform_int_distribution are implementation-defined, so one seed gave libstdc++, libc++
// and MSVC's library three different sketches, and a near-tie between two windows could be
// ranked differently from one platform to the next. Here every draw is specified: SplitMix64
// (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014; the generator
// that seeds xoshiro), whose 64-bit outputs pass TestU01's BigCrush, uniforms from its top 53
// bits, and normals by the Box–Muller transform of two uniforms — the same bits everywhere up to
// the last bit of the C library's log, cos and sin. (Including <random> would also cost every
// program that includes bd compile time.)
#pragma once

#include <cmath>
#include <cstdint>

#include "bd/base/error.hpp"
#include "bd/base/index.hpp"

namespace bd {

class Random {
public:
  explicit Random(std::uint64_t seed) : state_(seed) {}

  /// The next 64 random bits (SplitMix64: a Weyl sequence through a 64-bit mixer).
  std::uint64_t bits() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  /// Uniform on [0, 1): the top 53 bits as a double's significand.
  double uniform() { return static_cast<double>(bits() >> 11) * 0x1.0p-53; }

  /// Uniform on {0, …, n − 1}, n ≥ 1: ⌊uniform()·n⌋ (bias below n·2⁻⁵³, far under a sample's).
  /// RangeError for n < 1 (there is no value to draw).
  Index below(Index n) {
    if (n < 1) throw RangeError(bd::detail::message("Random::below(", n, "): expected n >= 1"));
    const Index i = static_cast<Index>(uniform() * static_cast<double>(n));
    return i < n ? i : n - 1;
  }

  /// Standard normal: Box–Muller, r = √(−2 ln u₁), θ = 2π·u₂, giving r·cos θ and then r·sin θ.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: ln u₁ is finite
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586476925286766559 * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

private:
  std::uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace bd
