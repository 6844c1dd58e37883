// oneDNN (Debian: libdnnl-dev) as the bf16 anchor: its matmul primitive, created once per shape
// and timed like bd's call, in its own translation unit (dnnl.hpp is heavy and needs exceptions
// of its own): C (m × n, f32) = A (m × k, bf16) · B (k × n, bf16) laid out as PyTorch's linear
// hands them to it — A and C row-major (a tensor of tokens), B column-major (nn.Linear's weight,
// out_features × in_features, row-major: bd's column-major B, the same bytes). oneDNN 2.6 has no
// optimised bf16 kernel for column-major activations (it falls back to its reference code). With
// `prepacked` the weights are reordered once, outside the timing, into the layout oneDNN picks
// (format `any`): what a framework that caches its weights gets.
#pragma once

#include <cstdint>
#include <memory>

namespace bd_bench {

class OneDnnMatmul {
 public:
  /// b holds bf16 bits, column-major (leading dimension k); a (bf16 bits) and c (floats) are row-major.
  OneDnnMatmul(long m, long n, long k, const std::uint16_t* b, bool prepacked);
  ~OneDnnMatmul();
  void operator()(const std::uint16_t* a, float* c);
  /// The implementation oneDNN chose (its ISA: "brg:avx512_core_bf16", ...).
  const char* implementation() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace bd_bench
