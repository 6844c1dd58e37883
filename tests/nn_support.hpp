// Random attention layers for the operator tests, and the plain double oracle they are held to
// (defined in nn_support.cpp, compiled once per build: see support.hpp).
#pragma once

#include <bd/nn/bd_attention.hpp>

#include "support.hpp"

namespace bd_test {

struct LayerSpec {
  Eigen::Index n_q = 4, n_kv = 4, head_dim = 8, v_head_dim = 0, d_q = 48, d_kv = 48, d_out = 48;
  bool biases = false, causal = false;
  double rope_theta = 0;
  // MLA: keys/values from a latent of width d_kv computed from a d_model_kv input.
  Eigen::Index d_model_kv = 0, rope_dim = 0;
  // Query LoRA: queries from RMSNorm(x·W_qa) of width q_lora (x is d_q wide).
  Eigen::Index q_lora = 0;
};

/// A layer with Gaussian weights scaled like a trained one (1/sqrt(fan_in)), seeded.
bd::nn::MultiHeadAttention<double> random_attention(const LayerSpec& s, unsigned seed);

/// rotate_half RoPE on `heads` blocks of `dim` columns, row i at position first + i, written
/// out here rather than taken from bd (the oracle below shares no code with the library).
Eigen::MatrixXd plain_rope(Eigen::MatrixXd x, Eigen::Index heads, Eigen::Index dim, double theta, Eigen::Index first);

/// The layer computed plainly in double from its dense weights, with Eigen's products and each
/// head's whole score matrix — none of bd's kernels: the oracle every path of every layer is
/// held to. Self-attention when x_kv is x; causal rows see keys 0 … i.
Eigen::MatrixXd plain_attention(const bd::nn::MultiHeadAttention<double>& layer, const Eigen::MatrixXd& x,
                                const Eigen::MatrixXd& x_kv);

/// max |a − b| / max |b|: the test bound for operators is relative to the output's scale. NaN
/// anywhere makes it NaN, which fails every bound: Eigen's default maxCoeff may skip a NaN, and a
/// kernel that read a cache's spare rows passed a test measured that way (test_flash_attention.cpp).
template <typename DA, typename DB>
double max_rel(const Eigen::MatrixBase<DA>& a, const Eigen::MatrixBase<DB>& b) {
  return (a.template cast<double>() - b.template cast<double>()).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() /
         b.template cast<double>().cwiseAbs().template maxCoeff<Eigen::PropagateNaN>();
}

/// fp32 bound for operator outputs (the issue's): max abs error ≤ 1e-4 of the output's scale.
/// fp32 arithmetic over d ≤ 96 terms with coefficients |C| of a few units errs by ~1e-6.
constexpr double kFp32OperatorBound = 1e-4;

}  // namespace bd_test
