// bd/nn/dense_projections.hpp — the dense projections of an attention layer, the policy of
// MultiHeadAttention and of each product family BDAttention leaves dense (attention_layer.hpp
// runs the rest). Every product is on the dispatched kernel, weights read where they lie in
// their stored type.
//
//   Q = x_q·Wq + bq,  K = z·Wk + bk,  V = z·Wv + bv   (RoPE on Q and K when rope_theta > 0)
//   y = O·Wo + bo
// Absorbed MLA (z the latent c): Q̃_h = Q_h·Wk_gᵀ, O_h = Õ_h·Wv_g + bv_g (g = h / group). A key
// bias adds a constant to each softmax row and drops out of both.
//
// Backward of each projection Y = x·W + b (RoPE's rotation transposed first for Q and K):
//   ∂W = xᵀ·∂Y,  ∂b = Σ_rows ∂Y,  ∂x = ∂Y·Wᵀ.
#pragma once

#include <Eigen/Core>

#include "bd/core/parallel.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_steps.hpp"
#include "bd/nn/dense_linear.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn::detail {

// Q, K and V into a layer's scratch (types.hpp), the output into a new matrix.
template <typename A, typename S>
Eigen::Map<MatrixA<A>> dense_queries(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& xq,
                                     Index first_position, ScratchMatrix<A>& out, Workspace& ws) {
  Eigen::Map<MatrixA<A>> Q = project_into<A, S>(xq, w.Wq, w.bq, out, ws, c.compute);
  if (c.rope_theta > 0) apply_rope(Q, c.n_q, c.head_dim, c.rope_theta, c.rope_scaling, first_position);
  return Q;
}

template <typename A, typename S>
Eigen::Map<MatrixA<A>> dense_keys(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& z,
                                  Index first_position, ScratchMatrix<A>& out, Workspace& ws) {
  Eigen::Map<MatrixA<A>> K = project_into<A, S>(z, w.Wk, w.bk, out, ws, c.compute);
  if (c.rope_theta > 0) apply_rope(K, c.n_kv, c.head_dim, c.rope_theta, c.rope_scaling, first_position);
  return K;
}

template <typename A, typename S>
Eigen::Map<MatrixA<A>> dense_values(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& z,
                                    ScratchMatrix<A>& out, Workspace& ws) {
  return project_into<A, S>(z, w.Wv, w.bv, out, ws, c.compute);
}

template <typename A, typename S>
MatrixA<A> dense_output(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& O, Workspace& ws) {
  return project<A, S>(O, w.Wo, w.bo, ws, c.compute);
}

/// The backward of Y = x·W (+ b): writes ∂W (and ∂b into *db when there is a bias), returns ∂x.
template <typename A, typename S>
MatrixA<A> dense_projection_backward(const ConstRef<A>& x, const ConstRef<A>& dY, const StoredMatrix<S>& W, MatrixA<A>& dW,
                                     MatrixA<A>* db, Workspace& ws) {
  require_trainable<S, A>();
  dW = product(x.transpose(), dY, ws);
  if (db) *db = column_sums<A>(dY);
  return product(dY, W.transpose(), ws);
}

/// The rotation's transpose applied to a gradient of rotated queries or keys (`heads` heads).
template <typename A>
void unrotate(const AttentionConfig& c, MatrixA<A>& d, Index heads, Index first_position) {
  if (c.rope_theta > 0) apply_rope(d, heads, c.head_dim, c.rope_theta, c.rope_scaling, first_position, true);
}

/// Q̃ (L × n_q·d_c): Q̃_h = Q_h·Wk_gᵀ, Wk_g read transposed in place; decoding's few rows take
/// the heads in parallel (bd::kernel::heads_across_threads).
template <typename A, typename S>
MatrixA<A> dense_absorb_queries(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& Q, Workspace& ws) {
  const Index L = Q.rows(), dh = c.head_dim, dc = w.Wk.rows();
  MatrixA<A> Qt(L, c.n_q * dc);
  bd::detail::parallel_for(
      c.n_q,
      [&](Index h) {
        const Index g = h / c.group();
        bd::kernel::linear_into<A, S>(Q.data() + h * dh * Q.outerStride(), Q.outerStride(), L, dh,
                                      w.Wk.data() + g * dh * w.Wk.outerStride(),
                                      w.Wk.outerStride(), true, dc, nullptr, Qt.data() + h * dc * L, L, 0, ws, c.compute);
      },
      bd::kernel::heads_across_threads(L));
  return Qt;
}

/// O (L × n_q·d_v): O_h = Õ_h·Wv_g + bv_g (softmax rows sum to one, so the bias passes through);
/// the heads shared among the threads as in dense_absorb_queries.
template <typename A, typename S>
MatrixA<A> dense_absorb_values(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& Ot, Workspace& ws) {
  const Index L = Ot.rows(), dv = c.value_dim(), dc = w.Wv.rows();
  MatrixA<A> O(L, c.n_q * dv);
  const Eigen::Matrix<A, Eigen::Dynamic, 1> bias = w.bv.template cast<A>();
  bd::detail::parallel_for(
      c.n_q,
      [&](Index h) {
        const Index g = h / c.group();
        bd::kernel::linear_into<A, S>(Ot.data() + h * dc * Ot.outerStride(), Ot.outerStride(), L, dc,
                                      w.Wv.data() + g * dv * w.Wv.outerStride(),
                                      w.Wv.outerStride(), false, dv, w.bv.size() ? bias.data() + g * dv : nullptr,
                                      O.data() + h * dv * L, L, 0, ws, c.compute);
      },
      bd::kernel::heads_across_threads(L));
  return O;
}

}  // namespace bd::nn::detail
