// bd/nn/attention_steps.hpp — the steps dense and BD attention share around their projections:
// checking inputs, the key/value source (the MLA latent), the decoupled RoPE keys, and the
// softmax over heads with the decoupled RoPE scores added.
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_core.hpp"
#include "bd/nn/latent_cache.hpp"

namespace bd::nn::detail {

/// m as the arithmetic type A: the matrix itself when it is stored in A (no copy of a weight
/// per call), otherwise a cast expression that the product evaluates.
template <typename A, typename S>
decltype(auto) widen(const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& m) {
  if constexpr (std::is_same_v<A, S>) {
    return (m);
  } else {
    return m.template cast<A>();
  }
}

template <typename A, typename S>
void add_bias(MatrixA<A>& m, const Eigen::Matrix<S, Eigen::Dynamic, 1>& b) {
  if (b.size()) m.rowwise() += b.template cast<A>().transpose();
}

inline void require_attention_inputs(Index d_q, Index d_kv_in, Index x_cols, Index x_kv_cols) {
  if (x_cols != d_q) throw ShapeError(message("attention input has ", x_cols, " columns, expected ", d_q));
  if (x_kv_cols != d_kv_in)
    throw ShapeError(message("attention key/value input has ", x_kv_cols, " columns, expected ", d_kv_in));
}

/// z, the matrix the key/value projections read: x_kv, or RMSNorm(x_kv·W_dkv)·g for MLA.
template <typename A, typename S>
MatrixA<A> kv_source(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& x_kv) {
  if (!w.W_dkv.size()) return x_kv;
  MatrixA<A> latent = x_kv * widen<A>(w.W_dkv);
  return w.kv_norm.size() ? rms_norm<A>(latent, w.kv_norm.template cast<A>(), c.norm_eps) : latent;
}

/// The query source x_q: x, or RMSNorm(x·W_qa)·g_q with a query LoRA.
template <typename A, typename S>
MatrixA<A> q_source(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& x) {
  if (!w.W_qa.size()) return x;
  MatrixA<A> q = x * widen<A>(w.W_qa);
  return w.q_norm.size() ? rms_norm<A>(q, w.q_norm.template cast<A>(), c.norm_eps) : q;
}

/// Width of the query input x: W_qa's rows with a query LoRA, else Wq's.
template <typename S>
Index query_input_dim(const AttentionWeights<S>& w) {
  return w.W_qa.size() ? w.W_qa.rows() : w.Wq.rows();
}

/// The decoupled RoPE keys shared by all heads (MLA), rotated; empty without decoupled RoPE.
template <typename A, typename S>
MatrixA<A> rope_keys(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& x_kv, Index first_position) {
  if (c.rope_dim == 0) return MatrixA<A>(x_kv.rows(), 0);
  MatrixA<A> kr = x_kv * widen<A>(w.Wk_rope);
  apply_rope(kr, 1, c.rope_dim, c.rope_dim_theta, first_position);
  return kr;
}

/// The rotated decoupled RoPE queries rope(x_q·Wq_rope) (L × n_q·rope_dim); empty without.
template <typename A, typename S>
MatrixA<A> rope_queries(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& xq, Index first_position) {
  if (c.rope_dim == 0) return MatrixA<A>(xq.rows(), 0);
  MatrixA<A> qr = xq * widen<A>(w.Wq_rope);
  apply_rope(qr, c.n_q, c.rope_dim, c.rope_dim_theta, first_position);
  return qr;
}

/// O = softmax(Q_h·K_hᵀ·scale [+ rope(x_q·Wq_rope)_h·Krᵀ·scale])·V_h for every query head; K
/// has n_k heads and V n_v heads (n_kv for the dense layer, n_q for BD's K'/V'); xq is the
/// query source (q_source).
template <typename A, typename S>
MatrixA<A> attend_heads(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& xq, const ConstRef<A>& Q,
                        const ConstRef<A>& K, const ConstRef<A>& V, const ConstRef<A>& Kr, Index n_k, Index n_v,
                        Index first_position) {
  AttendSpec spec;
  spec.n_q = c.n_q;
  spec.n_k = n_k;
  spec.n_v = n_v;
  spec.d_qk = c.head_dim;
  spec.d_v = c.value_dim();
  spec.d_rope = c.rope_dim;
  spec.scale = c.softmax_scale();
  spec.causal = c.causal;
  spec.first_query_position = first_position;
  if (c.rope_dim == 0) return attend<A>(Q, K, V, spec);
  const MatrixA<A> qr = rope_queries<A>(c, w, xq, first_position);
  const ConstRef<A> qr_ref(qr);
  return attend<A>(Q, K, V, spec, &qr_ref, &Kr);
}

/// Absorbed decoding needs keys and values read from a latent (MLA) with no vanilla RoPE on
/// them (a position-dependent rotation cannot be folded into the query).
template <typename S>
void require_latent_layer(const AttentionConfig& c, const AttentionWeights<S>& w, const char* what) {
  if (!w.W_dkv.size())
    throw RefusedError(message(what, " needs an MLA layer (keys and values from a latent, W_dkv); this layer reads its input"));
  if (c.rope_theta > 0)
    throw RefusedError(message(what, ": vanilla RoPE on keys read from the latent cannot be absorbed into the query; "
                                     "MLA puts RoPE on decoupled channels (rope_dim)"));
}

/// Appends x_new's latents and rotated RoPE keys to the cache (positions start…).
template <typename A, typename S>
void append_latent(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& x_new, LatentCache<A>& cache) {
  const Index start = cache.length();
  cache.append(kv_source<A>(c, w, x_new), rope_keys<A>(c, w, x_new, start));
}

/// Absorbed MLA attention over the latent cache: Õ_h = softmax(Q̃_h·cᵀ·scale + Qr_h·Krᵀ·scale)·c,
/// with Q̃ (L × n_q·d_c) the queries already mapped into the latent — multi-query attention
/// with one shared latent head as key and value. Returns L × n_q·d_c.
template <typename A, typename S>
MatrixA<A> attend_latent(const AttentionConfig& c, const AttentionWeights<S>& w, const MatrixA<A>& xq, const MatrixA<A>& Qt,
                         const LatentCache<A>& cache, Index first_position) {
  AttendSpec spec;
  spec.n_q = c.n_q;
  spec.n_k = spec.n_v = 1;
  spec.d_qk = spec.d_v = cache.latent_dim();
  spec.d_rope = c.rope_dim;
  spec.scale = c.softmax_scale();
  spec.causal = c.causal;
  spec.first_query_position = first_position;
  const ConstRef<A> C(cache.latent());
  if (c.rope_dim == 0) return attend<A>(Qt, C, C, spec);
  const MatrixA<A> qr = rope_queries<A>(c, w, xq, first_position);
  const ConstRef<A> qr_ref(qr), kr_ref(cache.rope_keys());
  return attend<A>(Qt, C, C, spec, &qr_ref, &kr_ref);
}

}  // namespace bd::nn::detail
