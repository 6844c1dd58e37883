// bd/nn/attention_backward.hpp — the gradient of O = softmax(Q·Kᵀ·scale, masked)·V for every
// head (FlashAttention-2's backward, laid out for the CPU). The forward keeps only each row's
// log-sum-exp ℓ = m + ln l (attend_with_lse); the backward recomputes the probabilities a tile
// at a time instead of storing an L×L matrix per head:
//
//   for each query head h (key head g, value head v), block of queries i, block of keys j:
//     P   = exp(Q_i·K_jᵀ·scale − ℓ_i)          (masked entries 0)
//     dV_j += Pᵀ·dO_i,   dP = dO_i·V_jᵀ
//     dS  = P ⊙ (dP − Δ_i)·scale,  Δ_i = rowsum(dO_i ⊙ O_i)
//     dQ_i += dS·K_j,    dK_j += dSᵀ·Q_i
//
// Under the causal mask a block of queries sees the keys before its diagonal whole and the
// square of keys level with it on and below the diagonal: there S and ∂P are computed only in
// the micro-tiles that meet the lower triangle (matmul_lower_part_into), and the exponentials and
// ∂S only where a key is visible (the rest of P and ∂S is 0).
// The tiles' products go through bd::kernel::matmul (the dispatched kernel where they are large
// enough). Parallel over query heads; a key or value head that several query heads read (GQA,
// or BD's per-head K' against a shared V) takes their contributions summed in head order, so
// the result does not depend on the thread count.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/attend.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::nn {

/// attend() that also returns each row's log-sum-exp of the scaled, masked scores, head-major
/// (lse[h·L_q + t]): what attend_backward needs to recompute the probabilities.
template <typename A>
MatrixA<A> attend_with_lse(const ConstRef<A>& Q, const ConstRef<A>& K, const ConstRef<A>& V, const AttendSpec& s,
                           std::vector<A>& lse, Workspace& ws = default_workspace()) {
  if (s.d_rope) throw RefusedError("attention backward: decoupled RoPE (MLA) is not implemented");
  MatrixA<A> O = MatrixA<A>::Zero(Q.rows(), s.n_q * s.d_v);
  lse.assign(static_cast<std::size_t>(Q.rows() * s.n_q), -std::numeric_limits<A>::infinity());
  std::vector<A> sum(lse.size(), A(0));
  auto a = detail::attention_arguments<A, ConstRef<A>>(Q, K, V, s, nullptr, nullptr, O);
  a.row_max = lse.data(), a.row_sum = sum.data();
  bd::kernel::flash_attention(a, 0, ws);
  bd::kernel::flash_attention_finish(a);
  for (std::size_t i = 0; i < lse.size(); ++i) lse[i] += std::log(sum[i]);
  return O;
}

/// Gradients of attend()'s output with respect to Q, K and V.
template <typename A>
struct AttentionInputGrads {
  MatrixA<A> dQ, dK, dV;
};

namespace detail {
/// Which of a (query block, key block) pair's scores the causal mask keeps: all, those on and
/// below the diagonal (keys level with the queries), or some, entry by entry.
enum class Visible { All, Lower, Some };
}  // namespace detail

/// dQ, dK, dV from dO, given the forward's Q, K, V, O and lse (attend_with_lse). Shapes as attend's.
template <typename A>
AttentionInputGrads<A> attend_backward(const ConstRef<A>& Q, const ConstRef<A>& K, const ConstRef<A>& V, const ConstRef<A>& O,
                                       const ConstRef<A>& dO, const std::vector<A>& lse, const AttendSpec& s,
                                       Workspace& ws = default_workspace()) {
  using M = MatrixA<A>;
  const Index Lq = Q.rows(), Lk = K.rows(), n_v = s.n_v ? s.n_v : s.n_k, dq = s.d_qk, dv = s.d_v;
  if (s.d_rope) throw RefusedError("attention backward: decoupled RoPE (MLA) is not implemented");
  if (O.rows() != Lq || dO.rows() != Lq || O.cols() != s.n_q * dv || dO.cols() != O.cols() ||
      Index(lse.size()) != Lq * s.n_q || Q.cols() != s.n_q * dq || K.cols() != s.n_k * dq || V.cols() != n_v * dv ||
      V.rows() != Lk)
    throw ShapeError("attend_backward: Q, K, V, O, dO and lse do not fit the spec's heads");
  AttentionInputGrads<A> g;
  g.dQ.resize(Lq, s.n_q * dq);
  // One head's contribution to dK and dV, kept per query head where several share a key or value
  // head and summed afterwards in head order. Each head zeroes its own columns in the parallel
  // loop: at training sizes these are fresh pages (256 KiB at L = 128, d = 512), and faulting them
  // in on one thread while the other waits cost a fifth of the backward.
  const bool shared_k = s.n_k != s.n_q, shared_v = n_v != s.n_q;
  M dK_parts(Lk, (shared_k ? s.n_q : s.n_k) * dq), dV_parts(Lk, (shared_v ? s.n_q : n_v) * dv);
  constexpr Index Bq = 128, Bk = 256;
#ifdef _OPENMP
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && s.n_q > 1)
#endif
  for (Index h = 0; h < s.n_q; ++h) {
    const Index kh = h * s.n_k / s.n_q, vh = h * n_v / s.n_q;
    const auto Qh = Q.middleCols(h * dq, dq);
    const auto Kg = K.middleCols(kh * dq, dq);
    const auto Vg = V.middleCols(vh * dv, dv);
    const auto dOh = dO.middleCols(h * dv, dv);
    const Eigen::Matrix<A, Eigen::Dynamic, 1> delta = (dOh.array() * O.middleCols(h * dv, dv).array()).rowwise().sum();
    auto dQh = g.dQ.middleCols(h * dq, dq);
    auto dKh = dK_parts.middleCols((shared_k ? h : kh) * dq, dq);
    auto dVh = dV_parts.middleCols((shared_v ? h : vh) * dv, dv);
    dQh.setZero(), dKh.setZero(), dVh.setZero();
    // Query t sees key k iff k ≤ t + offset (causal). Per (query block, key block): the rows
    // each column starts at (its keys' first visible query), the probabilities
    // P = exp(S·scale − ℓ) there and 0 above, then the four products.
    const Index offset = s.first_query_position - s.first_key_position;
    const Eigen::Map<const Eigen::Array<A, Eigen::Dynamic, 1>> lse_h(lse.data() + h * Lq, Lq);
    M S, dP;
    auto block = [&](Index i0, Index bq, Index j0, Index bk, detail::Visible visible) {
      const auto Qi = Qh.middleRows(i0, bq), dOi = dOh.middleRows(i0, bq);
      const auto Kj = Kg.middleRows(j0, bk), Vj = Vg.middleRows(j0, bk);
      // A column's first visible row: 0 for a block every query sees; on the diagonal (key j0 + j
      // at query i0 + j's position) row j, so only the lower triangle of S and ∂P is computed.
      auto first_row = [&](Index j) {
        if (visible == detail::Visible::All) return Index(0);
        if (visible == detail::Visible::Lower) return j;
        return std::clamp<Index>(j0 + j - i0 - offset, 0, bq);
      };
      S.resize(bq, bk), dP.resize(bq, bk);
      if (visible == detail::Visible::Lower) bd::kernel::matmul_lower_part_into(Qi, Kj.transpose(), S, ws);
      else bd::kernel::matmul_into(Qi, Kj.transpose(), S, ws);
      for (Index j = 0; j < bk; ++j) {
        const Index r = first_row(j), n = bq - r;
        S.col(j).head(r).setZero();
        auto p = S.col(j).segment(r, n).array();
        p = (p * A(s.scale) - lse_h.segment(i0 + r, n)).exp();
      }
      // S now holds P.
      auto dV_block = dVh.middleRows(j0, bk);
      bd::kernel::matmul_add_into(S.transpose(), dOi, dV_block, ws);
      if (visible == detail::Visible::Lower) bd::kernel::matmul_lower_part_into(dOi, Vj.transpose(), dP, ws);
      else bd::kernel::matmul_into(dOi, Vj.transpose(), dP, ws);
      for (Index j = 0; j < bk; ++j) {  // above the first row, P = 0 and ∂P was not computed: ∂S stays 0
        const Index r = first_row(j), n = bq - r;
        S.col(j).segment(r, n).array() *= (dP.col(j).segment(r, n).array() - delta.segment(i0 + r, n).array()) * A(s.scale);
      }
      // S now holds dS.
      auto dQ_block = dQh.middleRows(i0, bq);
      bd::kernel::matmul_add_into(S, Kj, dQ_block, ws);
      auto dK_block = dKh.middleRows(j0, bk);
      bd::kernel::matmul_add_into(S.transpose(), Qi, dK_block, ws);
    };
    for (Index i0 = 0; i0 < Lq; i0 += Bq) {
      const Index bq = std::min(Bq, Lq - i0);
      const Index diagonal = i0 + offset;  // the key at the block's first query's position
      if (!s.causal) {
        for (Index j0 = 0; j0 < Lk; j0 += Bk) block(i0, bq, j0, std::min(Bk, Lk - j0), detail::Visible::All);
      } else if (diagonal >= 0 && diagonal + bq <= Lk) {
        // The keys before the diagonal, which every query of the block sees, then the square of
        // keys level with the queries, visible on and below its diagonal.
        for (Index j0 = 0; j0 < diagonal; j0 += Bk) block(i0, bq, j0, std::min(Bk, diagonal - j0), detail::Visible::All);
        block(i0, bq, diagonal, bq, detail::Visible::Lower);
      } else {  // the diagonal leaves the keys (queries ahead of or behind them): masked entry by entry
        const Index k_end = std::min(Lk, diagonal + bq);
        for (Index j0 = 0; j0 < k_end; j0 += Bk) block(i0, bq, j0, std::min(Bk, k_end - j0), detail::Visible::Some);
      }
    }
  }
  auto reduce = [](M& parts, bool shared, Index heads, Index n_q, Index d, Index rows) -> M {
    if (!shared) return std::move(parts);
    M out = M::Zero(rows, heads * d);
    for (Index h = 0; h < n_q; ++h) out.middleCols((h * heads / n_q) * d, d) += parts.middleCols(h * d, d);
    return out;
  };
  g.dK = reduce(dK_parts, shared_k, s.n_k, s.n_q, dq, Lk);
  g.dV = reduce(dV_parts, shared_v, n_v, s.n_q, dv, Lk);
  return g;
}

}  // namespace bd::nn
