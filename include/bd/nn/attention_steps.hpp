// bd/nn/attention_steps.hpp — the steps dense and BD attention share around their projections:
// a projection on the kernel, checking inputs, the key/value source (the MLA latent), the query
// source (query LoRA), the decoupled RoPE keys and queries, and the softmax over heads.
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/kernel/matmul.hpp"
#include "bd/nn/attend.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/decoding_cache.hpp"
#include "bd/nn/rms_norm.hpp"
#include "bd/nn/rope.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn::detail {

/// y = x·W + b on the dispatched kernel (W stored in S, converted while packed; b empty: none);
/// y is x.rows() × W.cols(), written, not read.
template <typename A, typename S>
void project_into(const ConstRef<A>& x, const StoredMatrix<S>& W, const StoredVector<S>& b, Eigen::Ref<MatrixA<A>> y,
                  Workspace& ws, Compute compute = Compute::F32) {
  if (x.cols() != W.rows())
    throw ShapeError(bd::detail::message("projection: input has ", x.cols(), " columns, the weight ", W.rows(), " rows"));
  const Eigen::Matrix<A, Eigen::Dynamic, 1> bias = b.template cast<A>();
  bd::kernel::linear_into<A, S>(x.data(), x.outerStride(), x.rows(), x.cols(), W.data(), W.outerStride(), false, W.cols(),
                                b.size() ? bias.data() : nullptr, y.data(), y.outerStride(), 0, ws, compute);
}

/// The same, into a new matrix.
template <typename A, typename S>
MatrixA<A> project(const ConstRef<A>& x, const StoredMatrix<S>& W, const StoredVector<S>& b, Workspace& ws,
                   Compute compute = Compute::F32) {
  MatrixA<A> y(x.rows(), W.cols());
  project_into<A, S>(x, W, b, y, ws, compute);
  return y;
}

/// The same, into `out` (a layer's scratch, types.hpp).
template <typename A, typename S>
Eigen::Map<MatrixA<A>> project_into(const ConstRef<A>& x, const StoredMatrix<S>& W, const StoredVector<S>& b,
                                    ScratchMatrix<A>& out, Workspace& ws, Compute compute = Compute::F32) {
  Eigen::Map<MatrixA<A>> y = out.take(x.rows(), W.cols());
  project_into<A, S>(x, W, b, y, ws, compute);
  return y;
}

/// The intermediates of one attention call (attention_layer.hpp), kept in its Workspace between
/// calls (types.hpp says why): the query side, the key/value side, and the heads' output.
template <typename A>
struct AttentionScratch {
  ScratchMatrix<A> queries, rope_queries, keys, values, heads_output;
};

inline void require_attention_inputs(Index d_q, Index d_kv_in, Index x_cols, Index x_kv_cols) {
  if (x_cols != d_q) throw ShapeError(message("attention input has ", x_cols, " columns, expected ", d_q));
  if (x_kv_cols != d_kv_in)
    throw ShapeError(message("attention key/value input has ", x_kv_cols, " columns, expected ", d_kv_in));
}

/// RMSNorm(x·W)·g, or x·W without a gain: the MLA latent and the query LoRA.
template <typename A, typename S>
MatrixA<A> normed_projection(const ConstRef<A>& x, const StoredMatrix<S>& W, const StoredVector<S>& gain, double eps,
                             Workspace& ws, Compute compute) {
  MatrixA<A> p = project<A, S>(x, W, {}, ws, compute);
  return gain.size() ? rms_norm<A>(p, gain.template cast<A>(), eps) : p;
}

/// The latent RMSNorm(x_kv·W_dkv)·g that an MLA layer's keys and values read (W_dkv set).
template <typename A, typename S>
MatrixA<A> latent(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& x_kv, Workspace& ws) {
  return normed_projection<A, S>(x_kv, w.W_dkv, w.kv_norm, c.norm_eps, ws, c.compute);
}

/// The query LoRA's RMSNorm(x·W_qa)·g_q (W_qa set).
template <typename A, typename S>
MatrixA<A> lora_queries(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& x, Workspace& ws) {
  return normed_projection<A, S>(x, w.W_qa, w.q_norm, c.norm_eps, ws, c.compute);
}

/// Width of the query input x: W_qa's rows with a query LoRA, else Wq's.
template <typename S>
Index query_input_dim(const AttentionWeights<S>& w) {
  return w.W_qa.size() ? w.W_qa.rows() : w.Wq.rows();
}

/// The decoupled RoPE keys shared by all heads (MLA), rotated; empty without decoupled RoPE.
template <typename A, typename S>
MatrixA<A> rope_keys(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& x_kv, Index first_position,
                     Workspace& ws) {
  if (c.rope_dim == 0) return MatrixA<A>(x_kv.rows(), 0);
  MatrixA<A> kr = project<A, S>(x_kv, w.Wk_rope, {}, ws, c.compute);
  apply_rope(kr, 1, c.rope_dim, c.rope_dim_theta, c.rope_scaling, first_position);
  return kr;
}

/// The rotated decoupled RoPE queries rope(x_q·Wq_rope) (L × n_q·rope_dim), into `out`; empty
/// without.
template <typename A, typename S>
Eigen::Map<MatrixA<A>> rope_queries(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& xq,
                                    Index first_position, ScratchMatrix<A>& out, Workspace& ws) {
  if (c.rope_dim == 0) return out.take(xq.rows(), 0);
  Eigen::Map<MatrixA<A>> qr = project_into<A, S>(xq, w.Wq_rope, {}, out, ws, c.compute);
  apply_rope(qr, c.n_q, c.rope_dim, c.rope_dim_theta, c.rope_scaling, first_position);
  return qr;
}

/// The spec of attend_heads: the layer's heads, scale and mask, with the given widths.
inline AttendSpec head_spec(const AttentionConfig& c, Index n_k, Index n_v, Index d_qk, Index d_v, Index first_position) {
  AttendSpec spec;
  spec.n_q = c.n_q;
  spec.n_k = n_k;
  spec.n_v = n_v;
  spec.d_qk = d_qk;
  spec.d_v = d_v;
  spec.d_rope = c.rope_dim;
  spec.scale = c.softmax_scale();
  spec.causal = c.causal;
  spec.first_query_position = first_position;
  spec.compute = c.compute;
  return spec;
}

/// O = softmax(Q_h·K_hᵀ·scale [+ Qr_h·Krᵀ·scale])·V_h for every query head (d_qk and d_v wide;
/// the layer's own widths, or the latent's for absorbed MLA), into `out`; K has n_k heads and V n_v
/// (values_are_keys: V is K, absorbed MLA's latent).
template <typename A>
Eigen::Map<MatrixA<A>> attend_heads(const AttentionConfig& c, const ConstRef<A>& Q, const ConstRef<A>& Qr,
                                    const ConstRef<A>& K, const ConstRef<A>& V, const ConstRef<A>& Kr, Index n_k, Index n_v,
                                    Index d_qk, Index d_v, Index first_position, ScratchMatrix<A>& out, Workspace& ws,
                                    bool values_are_keys = false) {
  AttendSpec spec = head_spec(c, n_k, n_v, d_qk, d_v, first_position);
  spec.values_are_keys = values_are_keys;
  Eigen::Map<MatrixA<A>> O = out.take(Q.rows(), c.n_q * d_v);
  if (c.rope_dim == 0)
    attend_into<A>(Q, K, V, spec, nullptr, nullptr, O, ws);
  else
    attend_into<A>(Q, K, V, spec, &Qr, &Kr, O, ws);
  return O;
}

/// Absorbed MLA's attention: every head's absorbed query q̃ (and RoPE query) against the latent
/// cache, whose latents are both the keys and, their d_c channels, the values; read where the
/// cache holds them, in f32 or in bf16.
template <typename A>
Eigen::Map<MatrixA<A>> attend_latent(const AttentionConfig& c, const ConstRef<A>& Qt, const ConstRef<A>& Qr,
                                     const LatentCache<A>& cache, Index first_position, ScratchMatrix<A>& out, Workspace& ws) {
  const Index dc = cache.latent_dim();
  if constexpr (std::is_same_v<A, float>) {
    if (cache.storage() == Storage::BF16) {
      AttendSpec spec = head_spec(c, 1, 1, dc, dc, first_position);
      spec.values_are_keys = true;
      Eigen::Map<MatrixA<A>> O = out.take(Qt.rows(), c.n_q * dc);
      const Bf16Ref C(cache.latent_bf16()), Kr(cache.rope_keys_bf16());
      attend_stored_bf16_into<A>(Qt, C, C, spec, c.rope_dim ? &Qr : nullptr, c.rope_dim ? &Kr : nullptr, O, ws);
      return O;
    }
  }
  const ConstRef<A> C(cache.latent());
  return attend_heads<A>(c, Qt, Qr, C, C, cache.rope_keys(), 1, 1, dc, dc, first_position, out, ws, true);
}

/// Every head's attention over a KVCache (MHA, GQA, MLA decoded without absorption), read where
/// the cache holds it, in f32 or in bf16.
template <typename A>
Eigen::Map<MatrixA<A>> attend_cache(const AttentionConfig& c, const ConstRef<A>& Q, const ConstRef<A>& Qr,
                                    const KVCache<A>& cache, Index first_position, ScratchMatrix<A>& out, Workspace& ws) {
  if constexpr (std::is_same_v<A, float>) {
    if (cache.storage() == Storage::BF16) {
      const Bf16Ref K(cache.keys_bf16()), V(cache.values_bf16()), Kr(cache.rope_keys_bf16());
      const AttendSpec spec =
          head_spec(c, K.cols() / c.head_dim, V.cols() / c.value_dim(), c.head_dim, c.value_dim(), first_position);
      Eigen::Map<MatrixA<A>> O = out.take(Q.rows(), c.n_q * c.value_dim());
      attend_stored_bf16_into<A>(Q, K, V, spec, c.rope_dim ? &Qr : nullptr, c.rope_dim ? &Kr : nullptr, O, ws);
      return O;
    }
  }
  const ConstRef<A> K(cache.keys()), V(cache.values());
  return attend_heads<A>(c, Q, Qr, K, V, cache.rope_keys(), K.cols() / c.head_dim, V.cols() / c.value_dim(), c.head_dim,
                         c.value_dim(), first_position, out, ws);
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
void append_latent(const AttentionConfig& c, const AttentionWeights<S>& w, const ConstRef<A>& x_new, LatentCache<A>& cache,
                   Workspace& ws) {
  const Index start = cache.length();
  cache.append(latent<A, S>(c, w, x_new, ws), rope_keys<A, S>(c, w, x_new, start, ws));
}

}  // namespace bd::nn::detail
