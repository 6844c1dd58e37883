// bd/nn/bd_attention.hpp — attention with its QK and/or VO products basis-decomposed (the
// paper's Algorithm 2), equal to the dense layer it was prepared from.
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
// Grouped-query attention (Windows::per_group, the default): one window S_g per key/value group.
//   Then C = Wv_g[R]·Wv_g[S_g]⁻¹ whatever Wo_h (Wo_h has full row rank d_v), so the query heads of
//   a group share V'_g = z[S_g] + z[R_g]·C_g, cached per key/value head as dense's V_g, and keep
//   their own bases B_h = Wv_g[S_g]·Wo_h: y = Σ_h P_h·V'_g(h)·B_h. The window comes from the
//   group's product Wv_g·[Wo_h for h in g], whose row basis is [B_h for h in g]. QK likewise:
//   C = Wk_g[R]·Wk_g[S_g]⁻¹, K'_g per key/value head, Q'_h = x·Wq_h·Wk_g[S_g]ᵀ, the window from
//   [Wq_h for h in g]·Wk_gᵀ. Windows::per_head chooses a window per query head (n_q heads of K'/V').
// RoPE rotates q and k by position and Wq·R·Wkᵀ ≠ B·R·[I, C]: QK is refused under vanilla
// RoPE unless forced (then Q' and K' are rotated, an approximation). VO stays exact. MLA's
// decoupled RoPE channels pass through unchanged.
//
// MLA over a LatentCache (c and k_rope per token, as serving engines cache it), from the same
// prepared tensors. Prefill and chunked prefill: K'/V' of the whole context from the cached
// latent by the fused projection above. Decoding absorbed, per head h with basis channels S_h
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

#include "bd/core/decompose.hpp"
#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/kernel/gemm.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_core.hpp"
#include "bd/nn/attention_layer.hpp"
#include "bd/nn/attention_steps.hpp"
#include "bd/nn/dense_projections.hpp"
#include "bd/nn/gradients.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/multi_head_attention.hpp"
#include "bd/nn/projection.hpp"

namespace bd::nn {

/// What to do when the cost model says BD makes the layer slower or its KV cache larger.
enum class CostPolicy { Refuse, Warn, Allow };

struct BDAttentionOptions {
  Mode mode = Mode::QKVO;
  bd::Options decomposition{};  ///< basis strategy, align, …; the side is set per product
  bool force = false;           ///< decompose QK under vanilla RoPE (not exact)
  CostPolicy cost_policy = CostPolicy::Refuse;
  Windows windows = Windows::per_group;  ///< GQA: one window per key/value group, or per query head

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

/// The tensors BD stores for a layer (bd-convert's format v1, in x·W orientation): what
/// BDAttention::assemble takes back. Empty members for a family that is not decomposed. h is the
/// number of heads of K' (V'): n_kv with Windows::per_group, n_q with per_head.
template <typename S>
struct BDWeights {
  using Stored = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  Stored qk_basis;          ///< d_q × n_q·d_h
  Stored qk_coeff;          ///< (d_kv − d_h) × h·d_h
  HeadIndices qk_indices;   ///< per head of K', d_h ascending channels of the key input
  StoredVector qk_bias;     ///< n_q·d_h, or empty
  Stored vo_coeff;          ///< (d_kv − d_v) × h·d_v
  Stored vo_basis;          ///< n_q·d_v × d_out
  HeadIndices vo_indices;   ///< per head of V'
  StoredVector vo_bias;     ///< d_out, or empty
};

template <typename S = float>
class BDAttention : public AttentionLayer<BDAttention<S>, acc_t<S>> {
public:
  using Scalar = S;
  using A = acc_t<S>;
  using Matrix = MatrixA<A>;
  using Input = Eigen::Ref<const Matrix>;
  using Stored = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
  using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;
  using Cache = KVCache<A>;
  using Latent = LatentCache<A>;

  BDAttention() = default;

  /// Prepares from a dense layer (any stored type), in double; weights are rounded once to S.
  /// Preparation's scratch memory is kept in `ws` for the next layer's (base/workspace.hpp).
  template <typename T>
  static BDAttention prepare(const MultiHeadAttention<T>& dense, const BDAttentionOptions& opts, Workspace& ws) {
    BDAttention out;
    out.config_ = dense.config();
    out.mode_ = opts.mode;
    const AttentionWeights<double> w = dense.weights().template cast<double>();
    const AttentionConfig& c = out.config_;
    out.dense_ = w.template cast<S>();  // the parts BD leaves alone, stored in S

    if (has_qk(opts.mode) && c.rope_theta > 0 && !opts.force)
      throw RefusedError(bd::detail::message(
          "BD on QK is not exact under RoPE: rotary embeddings rotate q and k by position, and "
          "Wq·R(n−m)·Wkᵀ is not B·R(n−m)·[I, C]; use mode vo (exact under RoPE), or force to accept the error"));

    out.shape_ = AttentionShape::of(c, w);
    out.windows_ = c.group() > 1 ? opts.windows : Windows::per_group;
    out.cost_ = attention_cost(out.shape_, opts.mode, out.windows_);
    if (!out.cost_.worthwhile()) {
      const std::string why = bd::detail::message(
          out.cost_.describe(), ". With n_q/n_kv = ", c.group(), " query heads per key/value head and a window per query head, K'/V' need ",
          c.n_q, " heads instead of ", c.n_kv, out.cost_.slower() ? ": the layer gets slower" : "",
          out.cost_.larger_cache() ? (out.cost_.slower() ? " and its KV cache larger" : ": its KV cache gets larger") : "",
          " (Windows::per_group, one window per key/value group, keeps ", c.n_kv, ")");
      if (opts.cost_policy == CostPolicy::Refuse)
        throw RefusedError("BD refused by the cost model: " + why + "; set CostPolicy::Warn or Allow to prepare it anyway");
      if (opts.cost_policy == CostPolicy::Warn) out.warnings_.push_back(why);
    }
    out.d_q_ = detail::query_input_dim(w);
    out.d_kv_in_ = w.W_dkv.size() ? w.W_dkv.rows() : w.Wk.rows();
    if (has_qk(opts.mode)) {
      out.prepare_qk(w, opts.decomposition, ws);
      out.dense_.Wq.resize(0, 0);
      out.dense_.Wk.resize(0, 0);
      out.dense_.bq.resize(0);
      out.dense_.bk.resize(0);
    }
    if (has_vo(opts.mode)) {
      out.prepare_vo(w, opts.decomposition, ws);
      out.dense_.Wv.resize(0, 0);
      out.dense_.Wo.resize(0, 0);
      out.dense_.bv.resize(0);
      out.dense_.bo.resize(0);
    }
    return out;
  }

  /// The same with scratch memory of its own, freed on return.
  template <typename T>
  static BDAttention prepare(const MultiHeadAttention<T>& dense, const BDAttentionOptions& opts = {}) {
    Workspace ws;
    return prepare(dense, opts, ws);
  }

  /// Rebuilds a prepared layer from stored tensors (a BD checkpoint): `rest` holds what BD left
  /// dense (Wq, Wk and biases when QK is not decomposed; Wv, Wo when VO is not; MLA's latent and
  /// RoPE parts). Every shape and index is checked against `config`.
  static BDAttention assemble(const AttentionConfig& config, Mode mode, AttentionWeights<S> rest, BDWeights<S> bd) {
    using bd::detail::message;
    BDAttention out;
    out.config_ = config;
    out.mode_ = mode;
    const AttentionConfig& c = config;
    const Index n = c.n_q, dh = c.head_dim, dv = c.value_dim();
    auto require = [](bool ok, const std::string& what) {
      if (!ok) throw ShapeError("BDAttention::assemble: " + what);
    };
    // Per query head (n_q) or per key/value group (n_kv): the indices say which.
    auto check_indices = [&](const HeadIndices& idx, Index dim, const char* family) {
      require((idx.heads() == n || idx.heads() == c.n_kv) && idx.head_dim == dim,
              message(family, " indices have ", idx.heads(), " heads of ", idx.head_dim, ", expected ", n, " (a window per query head) or ",
                      c.n_kv, " (per key/value group) of ", dim));
      // Range and order were checked by HeadIndices::from_basis.
    };
    Index d_kv = 0;
    if (has_qk(mode)) {
      check_indices(bd.qk_indices, dh, "QK");
      d_kv = bd.qk_indices.input_dim;
      require(bd.qk_basis.cols() == n * dh, message("QK basis has ", bd.qk_basis.cols(), " columns, expected n_q·d_h = ", n * dh));
      const Index hk = bd.qk_indices.heads();
      require(bd.qk_coeff.rows() == d_kv - dh && bd.qk_coeff.cols() == hk * dh,
              message("QK coefficients are ", bd.qk_coeff.rows(), "x", bd.qk_coeff.cols(), ", expected ", d_kv - dh, "x", hk * dh));
      require(bd.qk_bias.size() == 0 || bd.qk_bias.size() == n * dh,
              message("QK bias has ", bd.qk_bias.size(), " values, expected ", n * dh));
      out.d_q_ = rest.W_qa.size() ? rest.W_qa.rows() : bd.qk_basis.rows();
    } else {
      require(rest.Wq.size() && rest.Wk.size(), "QK is not decomposed, so the dense Wq and Wk are needed");
      out.d_q_ = detail::query_input_dim(rest);
      d_kv = rest.Wk.rows();
    }
    if (has_vo(mode)) {
      check_indices(bd.vo_indices, dv, "VO");
      require(bd.vo_indices.input_dim == d_kv,
              message("VO indices are over ", bd.vo_indices.input_dim, " key/value input channels, QK's over ", d_kv));
      const Index hv = bd.vo_indices.heads();
      require(bd.vo_coeff.rows() == d_kv - dv && bd.vo_coeff.cols() == hv * dv,
              message("VO coefficients are ", bd.vo_coeff.rows(), "x", bd.vo_coeff.cols(), ", expected ", d_kv - dv, "x", hv * dv));
      require(bd.vo_basis.rows() == n * dv, message("VO basis has ", bd.vo_basis.rows(), " rows, expected n_q·d_v = ", n * dv));
      require(bd.vo_bias.size() == 0 || bd.vo_bias.size() == bd.vo_basis.cols(),
              message("VO bias has ", bd.vo_bias.size(), " values, expected ", bd.vo_basis.cols()));
    } else {
      require(rest.Wv.rows() == d_kv && rest.Wo.size(), message("VO is not decomposed, so the dense Wv (", d_kv,
                                                                " rows) and Wo are needed"));
    }
    out.d_kv_in_ = rest.W_dkv.size() ? rest.W_dkv.rows() : d_kv;
    AttentionShape& shape = out.shape_;
    shape.config = config;
    shape.d_q = has_qk(mode) ? bd.qk_basis.rows() : rest.Wq.rows();
    shape.d_kv = d_kv;
    shape.d_out = has_vo(mode) ? bd.vo_basis.cols() : rest.Wo.cols();
    shape.latent = rest.W_dkv.size() != 0;
    shape.d_model_kv = out.d_kv_in_;
    shape.d_model_q = out.d_q_;
    const bool per_head = c.group() > 1 && ((has_qk(mode) && bd.qk_indices.heads() == n) || (has_vo(mode) && bd.vo_indices.heads() == n));
    require(!(has_qk(mode) && has_vo(mode)) || bd.qk_indices.heads() == bd.vo_indices.heads(),
            message("QK has ", bd.qk_indices.heads(), " heads of windows and VO ", bd.vo_indices.heads(), ": expected both per query head or both per group"));
    out.windows_ = per_head ? Windows::per_head : Windows::per_group;
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
  friend class AttentionLayer<BDAttention<S>, A>;

  // The projection policy (attention_layer.hpp): the decomposed families through their basis and
  // coefficients, the others dense (dense_projections.hpp) from the weights BD left alone.
  const AttentionWeights<S>& shared_weights() const { return dense_; }
  const AttentionShape& layer_shape() const { return shape_; }
  Mode cost_mode() const { return mode_; }
  bool decomposed() const { return true; }

  Matrix queries(const Input& xq, Index first) const {
    if (!has_qk(mode_)) return detail::dense_queries<A>(config_, dense_, xq, first);
    Matrix Q = detail::project<A, S>(xq, Bq_, beta_);  // Q' = x·B + β
    if (config_.rope_theta > 0) apply_rope(Q, config_.n_q, config_.head_dim, config_.rope_theta, config_.rope_scaling, first);  // forced
    return Q;
  }

  Matrix keys(const Input& z, Index first) const {
    if (!has_qk(mode_)) return detail::dense_keys<A>(config_, dense_, z, first);
    Matrix K = bd_project<A>(z, qk_idx_, Ck_);  // K'_h = z[S_h] + z[R_h]·C_hᵀ, h a head of K'
    if (config_.rope_theta > 0) apply_rope(K, qk_idx_.heads(), config_.head_dim, config_.rope_theta, config_.rope_scaling, first);  // forced
    return K;
  }

  Matrix values(const Input& z) const {
    if (!has_vo(mode_)) return detail::dense_values<A>(dense_, z);
    return bd_project<A>(z, vo_idx_, Cv_);  // V'_h = z[S_h] + z[R_h]·C_h
  }

  Matrix output(const Input& O) const {
    if (!has_vo(mode_)) return detail::dense_output<A>(dense_, O);
    return detail::project<A, S>(O, Bo_, bo_);  // y = O'·B_vo + bo'
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
  std::vector<Matrix> zero_gradients() const {
    std::vector<Matrix> g;
    for (const Part& p : parts()) {
      g.push_back(Matrix::Zero(p.matrix->rows(), p.matrix->cols()));
      if (p.bias && p.bias->size()) g.push_back(Matrix::Zero(p.bias->size(), 1));
    }
    return g;
  }
  /// Index in trainable() of part p's matrix; its bias, if any, follows.
  std::size_t slot(int p) const {
    const auto all = parts();
    std::size_t i = 0;
    for (int k = 0; k < p; ++k) i += all[std::size_t(k)].bias && all[std::size_t(k)].bias->size() ? 2 : 1;
    return i;
  }
  Matrix dense_backward(int p, const Input& x, const Matrix& dY, std::vector<Matrix>& g) const {
    const Part part = parts()[std::size_t(p)];
    const std::size_t i = slot(p);
    return detail::dense_projection_backward<A, S>(x, dY, *part.matrix, g[i], part.bias->size() ? &g[i + 1] : nullptr);
  }
  // Q' = x·B + β and y = O'·B_vo + bo' are dense products; K' and V' are bd_project's.
  Matrix output_backward(const Matrix& O, const Input& dy, std::vector<Matrix>& g) const { return dense_backward(3, O, dy, g); }
  Matrix queries_backward(const Input& xq, Matrix dQ, Index first, std::vector<Matrix>& g) const {
    if (config_.rope_theta > 0) apply_rope(dQ, config_.n_q, config_.head_dim, config_.rope_theta, config_.rope_scaling, first, true);
    return dense_backward(0, xq, dQ, g);
  }
  Matrix keys_backward(const Input& z, Matrix dK, Index first, std::vector<Matrix>& g) const {
    if (!has_qk(mode_)) {
      detail::unrotate<A>(config_, dK, config_.n_kv, first);
      return dense_backward(1, z, dK, g);
    }
    if (config_.rope_theta > 0) apply_rope(dK, qk_idx_.heads(), config_.head_dim, config_.rope_theta, config_.rope_scaling, first, true);
    return bd_project_backward<A, S>(z, qk_idx_, Ck_, dK, g[slot(1)]);
  }
  Matrix values_backward(const Input& z, const Matrix& dV, std::vector<Matrix>& g) const {
    if (!has_vo(mode_)) return dense_backward(2, z, dV, g);
    return bd_project_backward<A, S>(z, vo_idx_, Cv_, dV, g[slot(2)]);
  }

  /// Q̃_h[S_h] = q'_h, Q̃_h[R_h] = q'_h·C_hᵀ: per head one product with Ck_h read transposed in
  /// place, its columns written to R_h's places in Q̃_h, and a copy of q'_h to S_h's.
  Matrix absorb_queries(const Matrix& Q) const {
    if (!has_qk(mode_)) return detail::dense_absorb_queries<A>(config_, dense_, Q);
    const Index L = Q.rows(), dh = config_.head_dim, dc = qk_idx_.input_dim, per = config_.n_q / qk_idx_.heads();
    Matrix Qt(L, config_.n_q * dc);
    std::vector<Index> columns(static_cast<std::size_t>(dc - dh));
    for (Index h = 0; h < config_.n_q; ++h) {
      const Index k_head = h / per;  // the head of K' (and of C) query head h reads
      const auto& basis = qk_idx_.basis[static_cast<std::size_t>(qk_idx_.shared ? 0 : k_head)];
      const auto& rest = qk_idx_.rest[static_cast<std::size_t>(qk_idx_.shared ? 0 : k_head)];
      for (std::size_t k = 0; k < basis.size(); ++k) Qt.col(h * dc + basis[k]) = Q.col(h * dh + Index(k));
      for (std::size_t k = 0; k < rest.size(); ++k) columns[k] = h * dc + rest[k];
      bd::kernel::GemmArguments<A, S> args;
      const std::vector<Index> channels = bd::detail::contiguous(h * dh, dh);
      args.rows = L;
      args.x = Q.data(), args.ldx = Q.outerStride();
      args.b = Ck_.data() + k_head * dh * Ck_.outerStride(), args.ldb = Ck_.outerStride(), args.b_row_major = true;
      args.out = Qt.data(), args.ldo = Qt.outerStride(), args.out_columns = columns.data();
      args.segments.push_back({channels.data(), dh, 0, dc - dh});
      bd::kernel::gemm(args);
    }
    return Qt;
  }

  /// O_h = Õ_h[S_h] + Õ_h[R_h]·C_h for every head in one product: head h's columns are a segment
  /// reading Õ's channels h·d_c + R_h and starting from h·d_c + S_h (bd_project's form).
  Matrix absorb_values(const Matrix& Ot) const {
    if (!has_vo(mode_)) return detail::dense_absorb_values<A>(config_, dense_, Ot);
    if (vo_idx_.heads() != config_.n_q)
      throw RefusedError("BDAttention: absorbed decoding over a latent with VO windows per key/value group of several query heads "
                         "is not implemented (MLA has one query head per latent head)");
    const Index dv = config_.value_dim(), dc = vo_idx_.input_dim, n = config_.n_q, r = dc - dv;
    Matrix O(Ot.rows(), n * dv);
    std::vector<Index> channels(static_cast<std::size_t>(n * r)), init(static_cast<std::size_t>(n * dv));
    bd::kernel::GemmArguments<A, S> args;
    for (Index h = 0; h < n; ++h) {
      const auto& basis = vo_idx_.basis[static_cast<std::size_t>(vo_idx_.shared ? 0 : h)];
      const auto& rest = vo_idx_.rest[static_cast<std::size_t>(vo_idx_.shared ? 0 : h)];
      for (Index k = 0; k < r; ++k) channels[static_cast<std::size_t>(h * r + k)] = h * dc + rest[static_cast<std::size_t>(k)];
      for (Index j = 0; j < dv; ++j) init[static_cast<std::size_t>(h * dv + j)] = h * dc + basis[static_cast<std::size_t>(j)];
      args.segments.push_back({channels.data() + h * r, r, h * dv, dv});
    }
    args.rows = Ot.rows();
    args.x = Ot.data(), args.ldx = Ot.outerStride();
    args.b = Cv_.data(), args.ldb = Cv_.outerStride();
    args.out = O.data(), args.ldo = O.outerStride();
    args.init_channels = init.data();
    bd::kernel::gemm(args);
    return O;
  }

  static ProductReport summarise(const SharedDecomposition<S>& set, const HeadIndices& indices) {
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

  /// Query head h's position in its key/value group, and the group.
  Index group_of(Index h) const { return h / config_.group(); }
  bool per_group() const { return windows_ == Windows::per_group; }

  void prepare_qk(const AttentionWeights<double>& w, bd::Options opts, Workspace& ws) {
    const AttentionConfig& c = config_;
    const Index dh = c.head_dim, d_kv = w.Wk.rows(), d_q = w.Wq.rows(), G = c.group();
    // One product per head of K': Wq_h·Wk_gᵀ per query head, or per group g the query heads'
    // [Wq_h; …]·Wk_gᵀ (its column basis stacks their bases; C depends on Wk_g alone).
    std::vector<Eigen::MatrixXd> Us, Vs;
    if (per_group())
      for (Index g = 0; g < c.n_kv; ++g) {
        Eigen::MatrixXd U(G * d_q, dh);
        for (Index j = 0; j < G; ++j) U.middleRows(j * d_q, d_q) = w.Wq.middleCols((g * G + j) * dh, dh);
        Us.push_back(std::move(U));
        Vs.push_back(w.Wk.middleCols(g * dh, dh));
      }
    else
      for (Index h = 0; h < c.n_q; ++h) {
        Us.push_back(w.Wq.middleCols(h * dh, dh));
        Vs.push_back(w.Wk.middleCols(group_of(h) * dh, dh));
      }
    opts.side = bd::Side::Col;  // C on the key side: K' = z[S] + z[R]·Cᵀ
    const auto set = bd::decompose_shared<S>(Us, Vs, opts, ws);
    qk_idx_ = HeadIndices::of(set, d_kv);
    qk_report_ = summarise(set, qk_idx_);
    const Index heads = Index(Us.size());
    Bq_.resize(d_q, c.n_q * dh);
    Ck_.resize(d_kv - dh, heads * dh);
    Eigen::VectorXd beta(c.n_q * dh);
    for (Index k = 0; k < heads; ++k) Ck_.middleCols(k * dh, dh) = set.head(static_cast<std::size_t>(k)).coeff().transpose();
    for (Index h = 0; h < c.n_q; ++h) {
      const Index k = per_group() ? group_of(h) : h, j = per_group() ? h - k * G : 0;  // head of K', row block of its basis
      const auto& head = set.head(static_cast<std::size_t>(k));
      Bq_.middleCols(h * dh, dh) = head.basis().middleRows(j * d_q, d_q);
      if (w.bq.size()) {
        const Eigen::MatrixXd Wk_basis = Vs[static_cast<std::size_t>(k)](head.indices(), Eigen::all);  // d_h × d_h: Wk_g[S]
        beta.segment(h * dh, dh) = Wk_basis * w.bq.segment(h * dh, dh);  // (bq_h·Wk_g[S]ᵀ)ᵀ
      }
    }
    if (w.bq.size()) beta_ = round_matrix<S>(beta);
  }

  void prepare_vo(const AttentionWeights<double>& w, bd::Options opts, Workspace& ws) {
    const AttentionConfig& c = config_;
    const Index dv = c.value_dim(), d_kv = w.Wv.rows(), d_out = w.Wo.cols(), G = c.group();
    // One product per head of V': Wv_g·Wo_h per query head, or per group Wv_g·[Wo_h, …] (its row
    // basis is the query heads' bases side by side; C depends on Wv_g alone).
    std::vector<Eigen::MatrixXd> Us, Vs;
    if (per_group())
      for (Index g = 0; g < c.n_kv; ++g) {
        Us.push_back(w.Wv.middleCols(g * dv, dv));
        Eigen::MatrixXd V(G * d_out, dv);
        for (Index j = 0; j < G; ++j) V.middleRows(j * d_out, d_out) = w.Wo.middleRows((g * G + j) * dv, dv).transpose();
        Vs.push_back(std::move(V));
      }
    else
      for (Index h = 0; h < c.n_q; ++h) {
        Us.push_back(w.Wv.middleCols(group_of(h) * dv, dv));
        Vs.push_back(w.Wo.middleRows(h * dv, dv).transpose());
      }
    opts.side = bd::Side::Row;  // C on the value side: V' = z[S] + z[R]·C
    const auto set = bd::decompose_shared<S>(Us, Vs, opts, ws);
    vo_idx_ = HeadIndices::of(set, d_kv);
    vo_report_ = summarise(set, vo_idx_);
    const Index heads = Index(Us.size());
    Cv_.resize(d_kv - dv, heads * dv);
    Bo_.resize(c.n_q * dv, d_out);
    for (Index k = 0; k < heads; ++k) Cv_.middleCols(k * dv, dv) = set.head(static_cast<std::size_t>(k)).coeff();
    for (Index h = 0; h < c.n_q; ++h) {
      const Index k = per_group() ? group_of(h) : h, j = per_group() ? h - k * G : 0;  // head of V', column block of its basis
      Bo_.middleRows(h * dv, dv) = set.head(static_cast<std::size_t>(k)).basis().middleCols(j * d_out, d_out);
    }
    if (w.bv.size() || w.bo.size()) {
      Eigen::VectorXd bias = w.bo.size() ? Eigen::VectorXd(w.bo) : Eigen::VectorXd::Zero(d_out);
      if (w.bv.size())
        for (Index h = 0; h < c.n_q; ++h) bias += (w.bv.segment(group_of(h) * dv, dv).transpose() * w.Wo.middleRows(h * dv, dv)).transpose();
      bo_ = round_matrix<S>(bias);
    }
  }

  AttentionConfig config_;
  Mode mode_ = Mode::QKVO;
  Windows windows_ = Windows::per_group;
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

}  // namespace bd::nn
