// bd/nn/bd_attention.hpp — attention with its QK and/or VO products basis-decomposed (the
// paper's Algorithm 2), equal to the dense layer it was prepared from.
//
// How the products, their biases and grouped-query windows become bases and coefficients:
// bd_preparation.hpp; the tensors the layer stores and their checks: bd_weights.hpp; the fused
// projections K'_h = z[S_h] + z[R_h]·C_h and their adjoint: projection.hpp.
//
// RoPE rotates q and k by position and Wq·R·Wkᵀ ≠ B·R·[I, C]: QK is refused under vanilla
// RoPE unless forced (then Q' and K' are rotated, an approximation). VO stays exact. MLA's
// decoupled RoPE channels pass through unchanged.
//
// MLA over a LatentCache (c and k_rope per token, as serving engines cache it), from the same
// prepared tensors. Prefill and chunked prefill: K'/V' of the whole context from the cached
// latent by the fused projection. Decoding absorbed, per head h with basis channels S_h
// and the others R_h of the latent:
//   scores: q'_h = x_q·B_h (+β_h), Q̃_h[S_h] = q'_h, Q̃_h[R_h] = q'_h·C_hᵀ   (Q̃_h·cᵀ = q'_h·K'_hᵀ)
//   output: Õ_h = P_h·c,  O_h = Õ_h[S_h] + Õ_h[R_h]·C_h,  y = Σ_h O_h·B_h + bo'  (O_h = P_h·V'_h)
// Against dense absorbed decoding (Q̃_h = Q_h·Wk_hᵀ, O_h = Õ_h·Wv_h) each token saves
// n_q·d_h² multiply-adds per product; the cache is the same.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_layer.hpp"
#include "bd/nn/attention_steps.hpp"
#include "bd/nn/bd_preparation.hpp"
#include "bd/nn/bd_weights.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/decoding_cache.hpp"
#include "bd/nn/dense_projections.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/multi_head_attention.hpp"
#include "bd/nn/projection.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

template <typename S = float>
class BDAttention : public AttentionLayer<BDAttention<S>, acc_t<S>> {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Input = Eigen::Ref<const Matrix>;
  using Stored = StoredMatrix<S>;
  using StoredVector = nn::StoredVector<S>;
  using Cache = KVCache<A>;
  using Latent = LatentCache<A>;

  BDAttention() = default;

  /// Prepares from a dense layer (any stored type), in double; weights are rounded once to S.
  /// Preparation's scratch memory is kept in `ws` for the next layer's (base/workspace.hpp).
  template <typename T>
  static BDAttention prepare(const MultiHeadAttention<T>& dense, const BDAttentionOptions& opts, Workspace& ws) {
    refuse_qk_under_rope(dense.config(), opts);  // before the weights' copy in double, which a refusal would waste
    return prepare_from(dense.config(), dense.weights().template cast<double>(), opts, ws);
  }

  /// The same with scratch memory of its own, freed on return.
  template <typename T>
  static BDAttention prepare(const MultiHeadAttention<T>& dense, const BDAttentionOptions& opts = {}) {
    Workspace ws;
    return prepare(dense, opts, ws);
  }

  /// Rebuilds a prepared layer from stored tensors (a BD checkpoint): `rest` holds what BD left
  /// dense (Wq, Wk and biases when QK is not decomposed; Wv, Wo when VO is not; MLA's latent and
  /// RoPE parts). Every shape and index is checked against `config` (BDWeights::validate).
  BD_COLD static BDAttention assemble(const AttentionConfig& config, Mode mode, AttentionWeights<S> rest, BDWeights<S> bd) {
    const Index d_kv = bd.validate(config, mode, rest);
    BDAttention out;
    out.config_ = config;
    out.mode_ = mode;
    const Index n = config.n_q;
    out.d_q_ = has_qk(mode) ? (rest.W_qa.size() ? rest.W_qa.rows() : bd.qk_basis.rows()) : detail::query_input_dim(rest);
    out.d_kv_in_ = rest.W_dkv.size() ? rest.W_dkv.rows() : d_kv;
    AttentionShape& shape = out.shape_;
    shape.config = config;
    shape.d_q = has_qk(mode) ? bd.qk_basis.rows() : rest.Wq.rows();
    shape.d_kv = d_kv;
    shape.d_out = has_vo(mode) ? bd.vo_basis.cols() : rest.Wo.cols();
    shape.latent = rest.W_dkv.size() != 0;
    shape.d_model_kv = out.d_kv_in_;
    shape.d_model_q = out.d_q_;
    const bool per_head =
        config.group() > 1 && ((has_qk(mode) && bd.qk_indices.heads() == n) || (has_vo(mode) && bd.vo_indices.heads() == n));
    out.windows_ = per_head ? Windows::PerHead : Windows::PerGroup;
    out.cost_ = attention_cost(shape, mode, out.windows_);
    out.dense_ = std::move(rest);
    out.Bq_ = std::move(bd.qk_basis);
    out.Ck_ = std::move(bd.qk_coeff);
    out.beta_ = std::move(bd.qk_bias);
    out.qk_idx_ = std::move(bd.qk_indices);
    out.Cv_ = std::move(bd.vo_coeff);
    out.Bo_ = std::move(bd.vo_basis);
    out.bo_ = std::move(bd.vo_bias);
    out.vo_idx_ = std::move(bd.vo_indices);
    out.qk_report_.decomposed = has_qk(mode);
    out.vo_report_.decomposed = has_vo(mode);
    if (has_qk(mode)) out.qk_report_.window = out.qk_idx_.describe();
    if (has_vo(mode)) out.vo_report_.window = out.vo_idx_.describe();
    return out;
  }

  const AttentionConfig& config() const { return config_; }
  Mode mode() const { return mode_; }

  /// The arithmetic of the layer's products (compute.hpp): f32, or bf16 (K'/V' from z[R]·C in
  /// bf16, z[S] added in f32; the attention's as AttentionConfig::compute says). RangeError where the stored type cannot honour bf16 (f64, f16).
  BDAttention& set_compute(Compute compute) {
    detail::require_compute<S>(compute, "BDAttention");
    config_.compute = cost_.compute = compute;
    return *this;
  }
  Compute compute() const { return config_.compute; }
  const CostComparison& cost() const { return cost_; }
  /// Per key/value group (K'/V' with n_kv heads, the dense cache) or per query head.
  Windows windows() const { return windows_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  const ProductReport& qk_report() const { return qk_report_; }
  const ProductReport& vo_report() const { return vo_report_; }
  /// Stored tensors (x·W orientation): B_qk (d_q × n_q·d_h), C_qk ((d_kv − d_h) × n_q·d_h), …
  const Stored& qk_basis() const { return Bq_; }
  const Stored& qk_coeff() const { return Ck_; }
  const Stored& vo_coeff() const { return Cv_; }
  const Stored& vo_basis() const { return Bo_; }
  /// β: the query bias carried onto Q' (empty when the layer has no query bias).
  const StoredVector& qk_bias() const { return beta_; }
  /// bo + Σ_h bv_g·Wo_h: the output bias with the value bias folded in (empty when neither exists).
  const StoredVector& vo_bias() const { return bo_; }
  /// What BD left dense: MLA's latent and RoPE parts, the undecomposed family's weights.
  const AttentionWeights<S>& rest() const { return dense_; }
  const HeadIndices& qk_indices() const { return qk_idx_; }
  const HeadIndices& vo_indices() const { return vo_idx_; }
  /// Parameters of the q, k, v, o projections as stored.
  Index parameters() const {
    const auto& d = dense_;
    return (has_qk(mode_) ? Bq_.size() + Ck_.size() : d.Wq.size() + d.Wk.size()) +
           (has_vo(mode_) ? Cv_.size() + Bo_.size() : d.Wv.size() + d.Wo.size());
  }

  Index input_dim() const { return d_q_; }
  Index kv_input_dim() const { return d_kv_in_; }
  Index output_dim() const { return has_vo(mode_) ? Bo_.cols() : dense_.Wo.cols(); }

  /// Training (the paper's §5.2: the basis and coefficients are the learnable parameters, no
  /// basis is ever re-selected): views of, for QK, "qk_basis", "qk_bias" (if any), "qk_coeff" —
  /// or Wq, bq, Wk, bk when QK is left dense — then for VO "vo_coeff", "vo_basis", "vo_bias"
  /// (if any) — or Wv, bv, Wo, bo.
  std::vector<Parameter<S>> trainable() {
    std::vector<Parameter<S>> out;
    auto add = [&](const char* name, auto& m) {
      if (m.size()) out.push_back(detail::parameter(name, m));
    };
    if (has_qk(mode_)) add("qk_basis", Bq_), add("qk_bias", beta_), add("qk_coeff", Ck_);
    else add("Wq", dense_.Wq), add("bq", dense_.bq), add("Wk", dense_.Wk), add("bk", dense_.bk);
    if (has_vo(mode_)) add("vo_coeff", Cv_), add("vo_basis", Bo_), add("vo_bias", bo_);
    else add("Wv", dense_.Wv), add("bv", dense_.bv), add("Wo", dense_.Wo), add("bo", dense_.bo);
    return out;
  }

private:
  BD_COLD static BDAttention prepare_from(const AttentionConfig& c, const AttentionWeights<double>& w,
                                  const BDAttentionOptions& opts, Workspace& ws);
  /// BD on QK under RoPE is not exact: refused unless opts.force.
  static void refuse_qk_under_rope(const AttentionConfig& c, const BDAttentionOptions& opts) {
    if (has_qk(opts.mode) && c.rope_theta > 0 && !opts.force)
      throw RefusedError(bd::detail::message(
          "BD on QK is not exact under RoPE: rotary embeddings rotate q and k by position, and "
          "Wq·R(n−m)·Wkᵀ is not B·R(n−m)·[I, C]; use mode vo (exact under RoPE), or force to accept the error"));
  }
  friend class AttentionLayer<BDAttention<S>, A>;

  // The projection policy (attention_layer.hpp): the decomposed families through their basis and
  // coefficients, the others dense (dense_projections.hpp) from the weights BD left alone.
  const AttentionWeights<S>& shared_weights() const { return dense_; }
  const AttentionShape& layer_shape() const { return shape_; }
  Mode cost_mode() const { return mode_; }
  bool decomposed() const { return true; }

  using Scratch = ScratchMatrix<A>;
  using View = Eigen::Map<Matrix>;
  View queries(const Input& xq, Index first, Scratch& out, Workspace& ws) const {
    if (!has_qk(mode_)) return detail::dense_queries<A>(config_, dense_, xq, first, out, ws);
    View Q = detail::project_into<A, S>(xq, Bq_, beta_, out, ws, config_.compute);  // Q' = x·B + β
    if (config_.rope_theta > 0) apply_rope(Q, config_.n_q, config_.head_dim, config_.rope_theta, config_.rope_scaling, first);  // forced
    return Q;
  }

  View keys(const Input& z, Index first, Scratch& out, Workspace& ws) const {
    if (!has_qk(mode_)) return detail::dense_keys<A>(config_, dense_, z, first, out, ws);
    View K = out.take(z.rows(), qk_idx_.heads() * qk_idx_.head_dim);
    bd_project_into<A>(z, qk_idx_, Ck_, K, {}, ws, config_.compute);  // K'_h = z[S_h] + z[R_h]·C_hᵀ, h a head of K'
    if (config_.rope_theta > 0) apply_rope(K, qk_idx_.heads(), config_.head_dim, config_.rope_theta, config_.rope_scaling, first);  // forced
    return K;
  }

  View values(const Input& z, Scratch& out, Workspace& ws) const {
    if (!has_vo(mode_)) return detail::dense_values<A>(config_, dense_, z, out, ws);
    View V = out.take(z.rows(), vo_idx_.heads() * vo_idx_.head_dim);
    bd_project_into<A>(z, vo_idx_, Cv_, V, {}, ws, config_.compute);  // V'_h = z[S_h] + z[R_h]·C_h
    return V;
  }

  Matrix output(const Input& O, Workspace& ws) const {
    if (!has_vo(mode_)) return detail::dense_output<A>(config_, dense_, O, ws);
    return detail::project<A, S>(O, Bo_, bo_, ws, config_.compute);  // y = O'·B_vo + bo'
  }

  // Backward (attention_layer.hpp), gradients in trainable()'s order. The four parts
  // [query-side, key-side] of QK and [value-side, output-side] of VO each hold a matrix and
  // maybe a bias; parts() lists them in that order (one of each pair is the bias slot).
  struct Part {
    const Stored* matrix;
    const StoredVector* bias;
  };
  std::vector<Part> parts() const {
    if (has_qk(mode_) && has_vo(mode_)) return {{&Bq_, &beta_}, {&Ck_, nullptr}, {&Cv_, nullptr}, {&Bo_, &bo_}};
    if (has_qk(mode_)) return {{&Bq_, &beta_}, {&Ck_, nullptr}, {&dense_.Wv, &dense_.bv}, {&dense_.Wo, &dense_.bo}};
    if (has_vo(mode_)) return {{&dense_.Wq, &dense_.bq}, {&dense_.Wk, &dense_.bk}, {&Cv_, nullptr}, {&Bo_, &bo_}};
    return {{&dense_.Wq, &dense_.bq}, {&dense_.Wk, &dense_.bk}, {&dense_.Wv, &dense_.bv}, {&dense_.Wo, &dense_.bo}};
  }
  // One empty slot per trainable tensor (slot(4) counts them): each backward step assigns its
  // projection's gradients whole, so nothing is zeroed first (4 MB per step at d = 512).
  std::vector<Matrix> gradient_slots() const { return std::vector<Matrix>(slot(4)); }
  /// Index in trainable() of part p's matrix; its bias, if any, follows.
  std::size_t slot(int p) const {
    const auto all = parts();
    std::size_t i = 0;
    for (int k = 0; k < p; ++k) i += all[std::size_t(k)].bias && all[std::size_t(k)].bias->size() ? 2 : 1;
    return i;
  }
  Matrix dense_backward(int p, const Input& x, const Matrix& dY, std::vector<Matrix>& g, Workspace& ws) const {
    const Part part = parts()[std::size_t(p)];
    const std::size_t i = slot(p);
    return detail::dense_projection_backward<A, S>(x, dY, *part.matrix, g[i], part.bias->size() ? &g[i + 1] : nullptr, ws);
  }
  // Q' = x·B + β and y = O'·B_vo + bo' are dense products; K' and V' are bd_project's.
  Matrix output_backward(const Matrix& O, const Input& dy, std::vector<Matrix>& g, Workspace& ws) const {
    return dense_backward(3, O, dy, g, ws);
  }
  Matrix queries_backward(const Input& xq, Matrix dQ, Index first, std::vector<Matrix>& g, Workspace& ws) const {
    if (config_.rope_theta > 0) apply_rope(dQ, config_.n_q, config_.head_dim, config_.rope_theta, config_.rope_scaling, first, true);
    return dense_backward(0, xq, dQ, g, ws);
  }
  Matrix keys_backward(const Input& z, Matrix dK, Index first, std::vector<Matrix>& g, Workspace& ws) const {
    if (!has_qk(mode_)) {
      detail::unrotate<A>(config_, dK, config_.n_kv, first);
      return dense_backward(1, z, dK, g, ws);
    }
    if (config_.rope_theta > 0) apply_rope(dK, qk_idx_.heads(), config_.head_dim, config_.rope_theta, config_.rope_scaling, first, true);
    return bd_project_backward<A, S>(z, qk_idx_, Ck_, dK, g[slot(1)], ws);
  }
  Matrix values_backward(const Input& z, const Matrix& dV, std::vector<Matrix>& g, Workspace& ws) const {
    if (!has_vo(mode_)) return dense_backward(2, z, dV, g, ws);
    return bd_project_backward<A, S>(z, vo_idx_, Cv_, dV, g[slot(2)], ws);
  }

  // Absorbed decoding over a latent (the file comment): the queries through the projection's
  // adjoint, the outputs through the projection itself, each head reading its own latent block.
  Matrix absorb_queries(const Input& Q, Workspace& ws) const {
    if (!has_qk(mode_)) return detail::dense_absorb_queries<A>(config_, dense_, Q, ws);
    return bd_adjoint_heads<A, S>(Q, config_.n_q, qk_idx_, Ck_, ws, config_.compute);
  }

  Matrix absorb_values(const Input& Ot, Workspace& ws) const {
    if (!has_vo(mode_)) return detail::dense_absorb_values<A>(config_, dense_, Ot, ws);
    if (vo_idx_.heads() != config_.n_q)
      throw RefusedError("BDAttention: absorbed decoding over a latent with VO windows per key/value group of several query heads "
                         "is not implemented (MLA has one query head per latent head)");
    Matrix O(Ot.rows(), config_.n_q * config_.value_dim());
    bd_project_heads_into<A, S>(Ot, vo_idx_, Cv_, O, {}, ws, config_.compute);
    return O;
  }

  AttentionConfig config_;
  Mode mode_ = Mode::QKVO;
  Windows windows_ = Windows::PerGroup;
  Index d_q_ = 0, d_kv_in_ = 0;
  AttentionWeights<S> dense_;  ///< what BD leaves dense (the replaced projections are dropped)
  Stored Bq_, Ck_, Cv_, Bo_;
  StoredVector beta_, bo_;
  HeadIndices qk_idx_, vo_idx_;
  ProductReport qk_report_, vo_report_;
  AttentionShape shape_;
  CostComparison cost_;
  std::vector<std::string> warnings_;
};

/// prepare()'s work, once the dense layer's weights are in double: one function per stored type
/// S whatever the dense layer's, which bd::compiled holds (the list below).
template <typename S>
BDAttention<S> BDAttention<S>::prepare_from(const AttentionConfig& c, const AttentionWeights<double>& w,
                                            const BDAttentionOptions& opts, Workspace& ws) {
  refuse_qk_under_rope(c, opts);
  const Windows windows = c.group() > 1 ? opts.windows : Windows::PerGroup;
  const CostComparison cost = attention_cost(AttentionShape::of(c, w), opts.mode, windows);
  std::vector<std::string> warnings;
  if (!cost.worthwhile()) {
    const std::string why = bd::detail::message(
        cost.describe(), ". With n_q/n_kv = ", c.group(), " query heads per key/value head and a window per query head, K'/V' need ",
        c.n_q, " heads instead of ", c.n_kv, cost.slower() ? ": the layer gets slower" : "",
        cost.larger_cache() ? (cost.slower() ? " and its KV cache larger" : ": its KV cache gets larger") : "",
        " (Windows::PerGroup, one window per key/value group, keeps ", c.n_kv, ")");
    if (opts.cost_policy == CostPolicy::Refuse)
      throw RefusedError("BD refused by the cost model: " + why + "; set CostPolicy::Warn or Allow to prepare it anyway");
    if (opts.cost_policy == CostPolicy::Warn) warnings.push_back(why);
  }
  AttentionWeights<S> rest = w.template cast<S>();  // the parts BD leaves alone, stored in S
  BDWeights<S> bd;
  ProductReport qk, vo;
  if (has_qk(opts.mode)) {
    qk = detail::decompose_qk<S>(c, w, windows, opts.decomposition, ws, bd);
    rest.Wq.resize(0, 0), rest.Wk.resize(0, 0), rest.bq.resize(0), rest.bk.resize(0);
  }
  if (has_vo(opts.mode)) {
    vo = detail::decompose_vo<S>(c, w, windows, opts.decomposition, ws, bd);
    rest.Wv.resize(0, 0), rest.Wo.resize(0, 0), rest.bv.resize(0), rest.bo.resize(0);
  }
  BDAttention out = assemble(c, opts.mode, std::move(rest), std::move(bd));
  if (has_qk(opts.mode)) out.qk_report_ = std::move(qk);
  if (has_vo(opts.mode)) out.vo_report_ = std::move(vo);
  out.warnings_ = std::move(warnings);
  return out;
}

/// The BD layers bd::compiled holds (src/compiled_nn.cpp), extern under BD_COMPILED_LIB: the
/// algorithm's members and preparation for every stored type, trainable in float and double.
#define BD_BD_ATTENTION_MEMBERS(prefix, S)                                                             \
  BD_ATTENTION_LAYER_MEMBERS(prefix, BDAttention<S>, acc_t<S>)                                         \
  prefix BDAttention<S> BDAttention<S>::prepare_from(const AttentionConfig&, const AttentionWeights<double>&, \
                                                     const BDAttentionOptions&, Workspace&);
#define BD_BD_ATTENTION_INSTANTIATIONS(prefix)                 \
  BD_BD_ATTENTION_MEMBERS(prefix, float)                       \
  BD_ATTENTION_LAYER_BACKWARD(prefix, BDAttention<float>, float) \
  BD_BD_ATTENTION_MEMBERS(prefix, double)                      \
  BD_ATTENTION_LAYER_BACKWARD(prefix, BDAttention<double>, double) \
  BD_BD_ATTENTION_MEMBERS(prefix, Eigen::half)                 \
  BD_BD_ATTENTION_MEMBERS(prefix, Eigen::bfloat16)
#if defined(BD_COMPILED_LIB)
BD_BD_ATTENTION_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::nn
