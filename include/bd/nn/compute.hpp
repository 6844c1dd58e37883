// bd/nn/compute.hpp — the arithmetic a layer's products run in (kernel/arguments.hpp's Compute:
// f32, or bf16 where the CPU multiplies bf16 fast), and which layers can honour bf16: float
// arithmetic on weights stored in float or bfloat16 (docs/design.md, "Compute type").
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/kernel/arguments.hpp"

namespace bd::nn {

using bd::kernel::Compute;

namespace detail {
/// Refuses `compute` for a layer `layer` storing its weights in S, naming what would honour it.
template <typename S>
void require_compute(Compute compute, const char* layer) {
  if (compute != Compute::BF16) return;
  if constexpr (std::is_same_v<S, double>)
    throw RangeError(bd::detail::message(layer, "<f64>: bf16 compute multiplies bf16 operands in f32 arithmetic; a layer "
                                                "stored in f64 computes in f64 (store it in f32 or bf16 for bf16 compute)"));
  if constexpr (std::is_same_v<S, Eigen::half>)
    throw RangeError(bd::detail::message(layer, "<f16>: bf16 compute would round its f16 weights a second time (11 → 8 bits "
                                                "of mantissa); store them in bf16, prepared from double and rounded once "
                                                "(bd-convert --dtype bf16), or compute in f32"));
}
}  // namespace detail

}  // namespace bd::nn
