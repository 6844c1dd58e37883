// The bf16 twins of a benchmark's layer pair (bench_layers.cpp, bench_mla.cpp): the dense layer
// and its BD preparation, both stored in bfloat16 and computing in bf16 (nn/compute.hpp).
#pragma once

#include <Eigen/Core>

#include <bd/nn/bd_attention.hpp>
#include <bd/nn/multi_head_attention.hpp>

namespace bd_bench {

struct Bf16LayerPair {
  bd::nn::MultiHeadAttention<Eigen::bfloat16> dense;
  bd::nn::BDAttention<Eigen::bfloat16> bd;
};

/// From the f32 dense layer: its weights rounded once to bf16, BD prepared in double from it
/// with the first-channels basis (the f32 pairs' choice), both set to bf16 compute.
inline Bf16LayerPair bf16_layer_pair(const bd::nn::MultiHeadAttention<float>& dense) {
  Bf16LayerPair p{dense.cast<Eigen::bfloat16>(), bd::nn::BDAttention<Eigen::bfloat16>::prepare(
                                                     dense, bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First))};
  p.dense.set_compute(bd::kernel::Compute::BF16);
  p.bd.set_compute(bd::kernel::Compute::BF16);
  return p;
}

}  // namespace bd_bench
