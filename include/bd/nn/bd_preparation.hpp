// bd/nn/bd_preparation.hpp — how a dense attention layer becomes BD tensors: the options, the
// decomposition of each product family (QK, VO) into bases, coefficients and head indices
// (core/decompose.hpp's decompose_shared, in double from the factors, rounded once to S), and
// what each family's decomposition reports. bd_attention.hpp holds the layer these tensors make.
//
// QK, head h (g its key/value group), column form of Wq_h·Wk_gᵀ over the key input:
//   Q'_h = x·B_h + β_h,   K'_h = z[:, S_h] + z[:, R_h]·C_hᵀ,   Q'_h·K'_hᵀ = Q_h·K_gᵀ + (row constants)
//   Query bias: bq_h·Wk_gᵀ lies in the row space of [I, C] (it is a row of Wq_h·Wk_gᵀ with bq
//   in place of x), so it becomes β_h = bq_h·Wk_g[S_h]ᵀ. Key-bias terms x·Wq_h·bk_gᵀ and
//   bq_h·bk_gᵀ are constant along each softmax row and drop out exactly.
// VO, head h, row form of Wv_g·Wo_h over the value input:
//   V'_h = z[:, S_h] + z[:, R_h]·C_h,   y = Σ_h P_h·V'_h·B_h + bo'
//   Value bias: P_h·1·bv_g·Wo_h = bv_g·Wo_h since softmax rows sum to one, so it folds into the
//   output bias: bo' = bo + Σ_h bv_g·Wo_h.
// Grouped-query attention (Windows::PerGroup, the default): one window S_g per key/value group.
//   Then C = Wv_g[R]·Wv_g[S_g]⁻¹ whatever Wo_h (Wo_h has full row rank d_v), so the query heads of
//   a group share V'_g = z[S_g] + z[R_g]·C_g, cached per key/value head as dense's V_g, and keep
//   their own bases B_h = Wv_g[S_g]·Wo_h: y = Σ_h P_h·V'_g(h)·B_h. The window comes from the
//   group's product Wv_g·[Wo_h for h in g], whose row basis is [B_h for h in g]. QK likewise:
//   C = Wk_g[R]·Wk_g[S_g]⁻¹, K'_g per key/value head, Q'_h = x·Wq_h·Wk_g[S_g]ᵀ, the window from
//   [Wq_h for h in g]·Wk_gᵀ. Windows::PerHead chooses a window per query head (n_q heads of K'/V').
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/decompose.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/bd_weights.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/projection.hpp"

namespace bd::nn {

/// What to do when the cost model says BD makes the layer slower or its KV cache larger.
enum class CostPolicy { Refuse, Warn, Allow };

struct BDAttentionOptions {
  Mode mode = Mode::QKVO;
  bd::Options decomposition{};  ///< basis strategy, align, …; the side is set per product
  bool force = false;           ///< decompose QK under vanilla RoPE (not exact)
  CostPolicy cost_policy = CostPolicy::Refuse;
  Windows windows = Windows::PerGroup;  ///< GQA: one window per key/value group, or per query head

  BDAttentionOptions& with_mode(Mode m) { mode = m; return *this; }
  BDAttentionOptions& with_windows(Windows w) { windows = w; return *this; }
  BDAttentionOptions& with_basis(bd::Basis b) { decomposition.basis = b; return *this; }
  BDAttentionOptions& with_force(bool f) { force = f; return *this; }
  BDAttentionOptions& with_cost_policy(CostPolicy p) { cost_policy = p; return *this; }
};

/// How one product family (QK or VO) of a layer was decomposed.
struct ProductReport {
  bool decomposed = false;
  bd::Basis chosen = bd::Basis::First;
  bool shared = true;
  Index offset = 0;
  double mean_nmse = 0, max_nmse = 0;
  std::string window;     ///< the basis channels in words (HeadIndices::describe)
  std::string reason;
  bd::PhaseTimes phases;  ///< where preparing this family's heads spent its time (zero when assembled)
};

namespace detail {

template <typename S>
ProductReport summarise(const SharedDecomposition<S>& set, const HeadIndices& indices) {
  ProductReport r;
  r.window = indices.describe();
  r.decomposed = true;
  r.chosen = set.chosen();
  r.shared = set.shared();
  r.offset = set.offset();
  r.mean_nmse = set.mean_nmse();
  for (const auto& h : set.heads()) r.max_nmse = std::max(r.max_nmse, h.report().nmse);
  r.reason = set.reason();
  r.phases = set.phases();
  return r;
}

/// QK's basis B_q, coefficients C_k, indices and query bias β into `out` (x·W orientation).
template <typename S>
BD_COLD ProductReport decompose_qk(const AttentionConfig& c, const AttentionWeights<double>& w, Windows windows, bd::Options opts,
                           Workspace& ws, BDWeights<S>& out) {
  const Index dh = c.head_dim, d_kv = w.Wk.rows(), d_q = w.Wq.rows(), G = c.group();
  const bool per_group = windows == Windows::PerGroup;
  // One product per head of K': Wq_h·Wk_gᵀ per query head, or per group g the query heads'
  // [Wq_h; …]·Wk_gᵀ (its column basis stacks their bases; C depends on Wk_g alone).
  std::vector<Eigen::MatrixXd> Us, Vs;
  if (per_group)
    for (Index g = 0; g < c.n_kv; ++g) {
      Eigen::MatrixXd U(G * d_q, dh);
      for (Index j = 0; j < G; ++j) U.middleRows(j * d_q, d_q) = w.Wq.middleCols((g * G + j) * dh, dh);
      Us.push_back(std::move(U));
      Vs.push_back(w.Wk.middleCols(g * dh, dh));
    }
  else
    for (Index h = 0; h < c.n_q; ++h) {
      Us.push_back(w.Wq.middleCols(h * dh, dh));
      Vs.push_back(w.Wk.middleCols(h / G * dh, dh));
    }
  opts.side = bd::Side::Col;  // C on the key side: K' = z[S] + z[R]·Cᵀ
  const auto set = bd::decompose_shared<S>(Us, Vs, opts, ws);
  out.qk_indices = HeadIndices::of(set, d_kv);
  const Index heads = Index(Us.size());
  out.qk_basis.resize(d_q, c.n_q * dh);
  out.qk_coeff.resize(d_kv - dh, heads * dh);
  Eigen::VectorXd beta(c.n_q * dh);
  for (Index k = 0; k < heads; ++k) out.qk_coeff.middleCols(k * dh, dh) = set.head(static_cast<std::size_t>(k)).coeff().transpose();
  for (Index h = 0; h < c.n_q; ++h) {
    const Index k = per_group ? h / G : h, j = per_group ? h - k * G : 0;  // head of K', row block of its basis
    const auto& head = set.head(static_cast<std::size_t>(k));
    out.qk_basis.middleCols(h * dh, dh) = head.basis().middleRows(j * d_q, d_q);
    if (w.bq.size()) {
      const Eigen::MatrixXd Wk_basis = Vs[static_cast<std::size_t>(k)](head.indices(), Eigen::all);  // d_h × d_h: Wk_g[S]
      beta.segment(h * dh, dh) = Wk_basis * w.bq.segment(h * dh, dh);  // (bq_h·Wk_g[S]ᵀ)ᵀ
    }
  }
  if (w.bq.size()) out.qk_bias = round_matrix<S>(beta);
  return summarise(set, out.qk_indices);
}

/// VO's coefficients C_v, basis B_o, indices and folded output bias bo' into `out`.
template <typename S>
BD_COLD ProductReport decompose_vo(const AttentionConfig& c, const AttentionWeights<double>& w, Windows windows, bd::Options opts,
                           Workspace& ws, BDWeights<S>& out) {
  const Index dv = c.value_dim(), d_kv = w.Wv.rows(), d_out = w.Wo.cols(), G = c.group();
  const bool per_group = windows == Windows::PerGroup;
  // One product per head of V': Wv_g·Wo_h per query head, or per group Wv_g·[Wo_h, …] (its row
  // basis is the query heads' bases side by side; C depends on Wv_g alone).
  std::vector<Eigen::MatrixXd> Us, Vs;
  if (per_group)
    for (Index g = 0; g < c.n_kv; ++g) {
      Us.push_back(w.Wv.middleCols(g * dv, dv));
      Eigen::MatrixXd V(G * d_out, dv);
      for (Index j = 0; j < G; ++j) V.middleRows(j * d_out, d_out) = w.Wo.middleRows((g * G + j) * dv, dv).transpose();
      Vs.push_back(std::move(V));
    }
  else
    for (Index h = 0; h < c.n_q; ++h) {
      Us.push_back(w.Wv.middleCols(h / G * dv, dv));
      Vs.push_back(w.Wo.middleRows(h * dv, dv).transpose());
    }
  opts.side = bd::Side::Row;  // C on the value side: V' = z[S] + z[R]·C
  const auto set = bd::decompose_shared<S>(Us, Vs, opts, ws);
  out.vo_indices = HeadIndices::of(set, d_kv);
  const Index heads = Index(Us.size());
  out.vo_coeff.resize(d_kv - dv, heads * dv);
  out.vo_basis.resize(c.n_q * dv, d_out);
  for (Index k = 0; k < heads; ++k) out.vo_coeff.middleCols(k * dv, dv) = set.head(static_cast<std::size_t>(k)).coeff();
  for (Index h = 0; h < c.n_q; ++h) {
    const Index k = per_group ? h / G : h, j = per_group ? h - k * G : 0;  // head of V', column block of its basis
    out.vo_basis.middleRows(h * dv, dv) = set.head(static_cast<std::size_t>(k)).basis().middleCols(j * d_out, d_out);
  }
  if (w.bv.size() || w.bo.size()) {
    Eigen::VectorXd bias = w.bo.size() ? Eigen::VectorXd(w.bo) : Eigen::VectorXd::Zero(d_out);
    if (w.bv.size())
      for (Index h = 0; h < c.n_q; ++h) bias += (w.bv.segment(h / G * dv, dv).transpose() * w.Wo.middleRows(h * dv, dv)).transpose();
    out.vo_bias = round_matrix<S>(bias);
  }
  return summarise(set, out.vo_indices);
}

}  // namespace detail
}  // namespace bd::nn
