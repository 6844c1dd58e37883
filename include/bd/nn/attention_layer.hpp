// bd/nn/attention_layer.hpp — the attention algorithm, written once for dense and BD layers:
// self- and cross-attention, KV-cache decoding, and MLA over a latent cache (prefill, chunked
// prefill, absorbed decoding). What differs between the layers — how q, k, v and the output are
// projected, and absorbed MLA's maps into and out of the latent — is the projection policy that
// the derived class supplies (CRTP; MultiHeadAttention: dense_projections.hpp, BDAttention: the
// basis and coefficients):
//
//   queries(x_q, p, out)  Q (L × n_q·d_h), bias and RoPE applied, positions from p
//   keys(z, p, out)       K (L × key heads·d_h);  values(z, out): V (L × value heads·d_v)
//   output(O)             y (L × d_out)
//   absorb_queries(Q)     Q̃ (L × n_q·d_c), Q̃_h·cᵀ = Q_h·K_hᵀ for every latent c
//   absorb_values(Õ)      O (L × n_q·d_v) from Õ_h = P_h·c
//   layer_shape(), cost_mode(), decomposed()   for the cost model's choice of a chunk's path
//   config(), shared_weights(), input_dim(), kv_input_dim()
// and for training (backward(), the gradients in the order of the layer's trainable()):
//   gradient_slots()                         one empty matrix per trainable tensor, each
//                                            assigned whole by the steps below
//   output_backward(O, ∂y, grads)            ∂O; adds the output projection's gradients
//   queries_backward(x_q, ∂Q, p, grads)      ∂x_q; keys_backward(z, ∂K, p, grads): ∂z
//   values_backward(z, ∂V, grads)            ∂z
//
// Q, K, V and the heads' output are written into a ScratchMatrix (`out`) of the Workspace's
// AttentionScratch (attention_steps.hpp) and returned as views of it: they are the layer's
// largest intermediates, reused from call to call instead of allocated afresh.
//
// z is what keys and values read: x_kv, or the MLA latent RMSNorm(x_kv·W_dkv)·g. Queries read
// x_q: x, or RMSNorm(x·W_qa)·g_q with a query LoRA. Inputs are read in place (Eigen::Ref).
#pragma once

#include <algorithm>
#include <optional>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/nn/attend.hpp"
#include "bd/nn/attention_backward.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/attention_steps.hpp"
#include "bd/nn/cost_model.hpp"
#include "bd/nn/decoding_cache.hpp"
#include "bd/nn/gradients.hpp"

namespace bd::nn {

template <typename Derived, typename A>
class AttentionLayer {
public:
  using Matrix = MatrixA<A>;
  using Input = Eigen::Ref<const Matrix>;
  using Cache = KVCache<A>;
  using Latent = LatentCache<A>;

  /// Self-attention over a whole sequence (positions 0..L−1). Every call below runs its kernels
  /// with the buffers of `ws` (types.hpp).
  Matrix forward(const Input& x, Workspace& ws = default_workspace()) const { return forward(x, x, ws); }

  /// Cross-attention: queries from x, keys and values from x_kv.
  Matrix forward(const Input& x, const Input& x_kv, Workspace& ws = default_workspace()) const;

  /// Self-attention decoding: appends x_new's keys and values to the cache, attends to all of
  /// them, returns the outputs of the new tokens. Equal to forward() on the whole sequence.
  Matrix decode(const Input& x_new, Cache& cache, Workspace& ws = default_workspace()) const;

  /// MLA prefill or chunked prefill: appends x_new's latents to the cache and attends to the
  /// whole context, by the path `path` names; `automatic` takes the one the cost model says is
  /// cheaper for this chunk and context (chunk_plan(): K/V recomputed from the latent, Algorithm
  /// 2 for BD, or absorbed). Equal to forward() on the whole sequence either way.
  Matrix prefill(const Input& x_new, Latent& cache, PrefillPath path = PrefillPath::Automatic,
                 Workspace& ws = default_workspace()) const;

  /// Training: the backward of forward(x) (self-attention), given ∂y; ∂x and the gradients of
  /// the layer's trainable() tensors, in their order. The forward is recomputed (keeping only
  /// each softmax row's log-sum-exp), and attention's backward recomputes its probabilities a
  /// tile at a time (attention_backward.hpp). MLA (a latent, query LoRA, decoupled RoPE) is not
  /// implemented and refused.
  Gradients<A> backward(const Input& x, const Input& dy, Workspace& ws = default_workspace()) const {
    Gradients<A> g = backward(x, x, dy, ws);
    g.input += g.kv_input;
    g.kv_input.resize(0, 0);
    return g;
  }

  /// The backward of forward(x, x_kv): ∂x, ∂x_kv and the parameters' gradients.
  Gradients<A> backward(const Input& x, const Input& x_kv, const Input& dy, Workspace& ws = default_workspace()) const;

  /// Context tokens whose K/V (K'/V') prefill recomputes at a time: enough rows that packing the
  /// up-projection's weights once per block costs little against the block's product.
  static constexpr Index recompute_block = 1024;

  /// The path prefill() takes for `chunk` new tokens when the cache will hold `context` tokens
  /// (the chunk included), with both estimates.
  ChunkPlan plan_chunk(Index chunk, Index context) const {
    return chunk_plan(self().layer_shape(), self().cost_mode(), self().decomposed(), chunk, context);
  }

  /// MLA decoding absorbed (serving engines' way): only the latent cache is read. Queries are
  /// mapped into the latent, Q̃_h·cᵀ = Q_h·K_hᵀ, every head attends to the one shared latent
  /// (multi-query attention with c as key and value: one product for all heads), and Õ_h = P_h·c
  /// is mapped out. Equal to prefill() and to forward() on the whole sequence.
  Matrix decode_absorbed(const Input& x_new, Latent& cache, Workspace& ws = default_workspace()) const;

private:
  const Derived& self() const { return static_cast<const Derived&>(*this); }
  const AttentionConfig& config() const { return self().config(); }
  decltype(auto) weights() const { return self().shared_weights(); }
  bool has_latent() const { return weights().W_dkv.size() != 0; }
  bool has_lora() const { return weights().W_qa.size() != 0; }

  void require_inputs(const Input& x, const Input& x_kv) const {
    detail::require_attention_inputs(self().input_dim(), self().kv_input_dim(), x.cols(), x_kv.cols());
  }

  /// A model with a sliding window masks keys further back than it; bd does not, so a call that
  /// reaches `positions` tokens (the last position + 1) past the window is refused.
  void require_window(Index positions) const {
    const Index window = config().sliding_window;
    if (window > 0 && positions > window)
      throw RefusedError(bd::detail::message("sliding_window = ", window, ": this call reaches ", positions,
                                             " tokens, and bd's attention does not mask keys outside a sliding window "
                                             "(it computes the layer exactly up to ", window, " tokens)"));
  }

  /// x's queries, attend(Q, Qr) (every head's output), then the output projection.
  template <typename Attend>
  Matrix attend_and_output(const Input& x, Index first_position, detail::AttentionScratch<A>& scratch, Workspace& ws,
                           Attend&& attend) const;
};

// The algorithm's members, defined out of the class so that bd::compiled can hold them: a member
// defined in its class is implicitly inline, and GCC compiles it in every caller whatever an
// `extern template` declaration says (multi_head_attention.hpp and bd_attention.hpp list them).

template <typename Derived, typename A>
auto AttentionLayer<Derived, A>::forward(const Input& x, const Input& x_kv, Workspace& ws) const -> Matrix {
  require_inputs(x, x_kv);
  require_window(std::max(x.rows(), x_kv.rows()));
  detail::AttentionScratch<A>& scratch = ws.local<detail::AttentionScratch<A>>();
  const Matrix z_storage = has_latent() ? detail::latent<A>(config(), weights(), x_kv, ws) : Matrix();
  const Input z = has_latent() ? Input(z_storage) : x_kv;
  const Input K = self().keys(z, 0, scratch.keys, ws), V = self().values(z, scratch.values, ws);
  const Matrix Kr = detail::rope_keys<A>(config(), weights(), x_kv, 0, ws);
  return attend_and_output(x, 0, scratch, ws, [&](const Input& Q, const Input& Qr) {
    const AttentionConfig& c = config();
    return detail::attend_heads<A>(c, Q, Qr, K, V, Kr, K.cols() / c.head_dim, V.cols() / c.value_dim(), c.head_dim,
                                   c.value_dim(), 0, scratch.heads_output, ws);
  });
}

template <typename Derived, typename A>
auto AttentionLayer<Derived, A>::decode(const Input& x_new, Cache& cache, Workspace& ws) const -> Matrix {
  require_inputs(x_new, x_new);
  const Index start = cache.length();
  require_window(start + x_new.rows());
  detail::AttentionScratch<A>& scratch = ws.local<detail::AttentionScratch<A>>();
  const Matrix z_storage = has_latent() ? detail::latent<A>(config(), weights(), x_new, ws) : Matrix();
  const Input z = has_latent() ? Input(z_storage) : x_new;
  cache.append(self().keys(z, start, scratch.keys, ws), self().values(z, scratch.values, ws),
               detail::rope_keys<A>(config(), weights(), x_new, start, ws));
  return attend_and_output(x_new, start, scratch, ws, [&](const Input& Q, const Input& Qr) {
    return detail::attend_cache<A>(config(), Q, Qr, cache, start, scratch.heads_output, ws);
  });
}

template <typename Derived, typename A>
auto AttentionLayer<Derived, A>::prefill(const Input& x_new, Latent& cache, PrefillPath path, Workspace& ws) const -> Matrix {
  detail::require_latent_layer(config(), weights(), "prefill over a latent cache");
  require_inputs(x_new, x_new);
  require_window(cache.length() + x_new.rows());
  if (path == PrefillPath::Automatic) path = plan_chunk(x_new.rows(), cache.length() + x_new.rows()).path;
  if (path == PrefillPath::Absorbed) return decode_absorbed(x_new, cache, ws);
  const AttentionConfig& c = config();
  const Index start = cache.length();
  detail::append_latent<A>(c, weights(), x_new, cache, ws);
  // K/V of the context recomputed block by block and attended to as they are made: the
  // context's K and V (L × n·d_h each: 2 GB at DeepSeek's shape and 16k tokens) never exist,
  // and each block's stay in cache between their product and their use.
  detail::AttentionScratch<A>& scratch = ws.local<detail::AttentionScratch<A>>();
  const Matrix xq_storage = has_lora() ? detail::lora_queries<A>(c, weights(), x_new, ws) : Matrix();
  const Input xq = has_lora() ? Input(xq_storage) : x_new;
  const Input Q = self().queries(xq, start, scratch.queries, ws);
  const Input Qr = detail::rope_queries<A>(c, weights(), xq, start, scratch.rope_queries, ws);
  const Index context = cache.length();
  const Eigen::Map<Matrix> O = scratch.heads_output.take(Q.rows(), c.n_q * c.value_dim());
  std::optional<StreamedAttention<A>> attention;
  const bool widened = cache.storage() != storage_of<A>();  // a bf16 cache: each block's rows widened
  for (Index k0 = 0; k0 < context; k0 += recompute_block) {
    const Index n = std::min(recompute_block, context - k0);
    std::pair<Matrix, Matrix> rows;
    if (widened) rows = cache.rows(k0, n);
    const Input z = widened ? Input(rows.first) : Input(cache.latent().middleRows(k0, n));
    const Input Kr = widened ? Input(rows.second) : Input(cache.rope_keys().middleRows(k0, n));
    const Input K = self().keys(z, k0, scratch.keys, ws), V = self().values(z, scratch.values, ws);
    if (!attention)
      attention.emplace(O, detail::head_spec(c, K.cols() / c.head_dim, V.cols() / c.value_dim(), c.head_dim,
                                             c.value_dim(), start), ws);
    attention->add(Q, K, V, k0, c.rope_dim ? &Qr : nullptr, c.rope_dim ? &Kr : nullptr);
  }
  attention->finish();
  return self().output(O, ws);
}

template <typename Derived, typename A>
Gradients<A> AttentionLayer<Derived, A>::backward(const Input& x, const Input& x_kv, const Input& dy, Workspace& ws) const {
  if (has_latent() || has_lora() || config().rope_dim)
    throw RefusedError("attention backward: MLA (a latent, query LoRA or decoupled RoPE) is not implemented");
  require_inputs(x, x_kv);
  if (dy.rows() != x.rows() || dy.cols() != self().output_dim())
    throw ShapeError(bd::detail::message("attention backward: dy is ", dy.rows(), "x", dy.cols(), ", expected ", x.rows(), "x",
                                         self().output_dim()));
  const AttentionConfig& c = config();
  detail::AttentionScratch<A>& scratch = ws.local<detail::AttentionScratch<A>>();
  const Input Q = self().queries(x, 0, scratch.queries, ws), K = self().keys(x_kv, 0, scratch.keys, ws),
              V = self().values(x_kv, scratch.values, ws);
  AttendSpec spec = detail::head_spec(c, K.cols() / c.head_dim, V.cols() / c.value_dim(), c.head_dim, c.value_dim(), 0);
  spec.compute = Compute::F32;  // backward computes in f32, its forward too
  std::vector<A> lse;
  const Matrix O = attend_with_lse<A>(Q, K, V, spec, lse, ws);
  Gradients<A> g;
  g.parameters = self().gradient_slots();
  const Matrix dO = self().output_backward(O, dy, g.parameters, ws);
  const AttentionInputGrads<A> d = attend_backward<A>(Q, K, V, O, dO, lse, spec, ws);
  g.input = self().queries_backward(x, d.dQ, 0, g.parameters, ws);
  g.kv_input = self().keys_backward(x_kv, d.dK, 0, g.parameters, ws);
  g.kv_input += self().values_backward(x_kv, d.dV, g.parameters, ws);
  return g;
}

template <typename Derived, typename A>
auto AttentionLayer<Derived, A>::decode_absorbed(const Input& x_new, Latent& cache, Workspace& ws) const -> Matrix {
  detail::require_latent_layer(config(), weights(), "absorbed decoding");
  require_inputs(x_new, x_new);
  require_window(cache.length() + x_new.rows());
  const AttentionConfig& c = config();
  const Index start = cache.length();
  detail::append_latent<A>(c, weights(), x_new, cache, ws);
  detail::AttentionScratch<A>& scratch = ws.local<detail::AttentionScratch<A>>();
  const Matrix xq_storage = has_lora() ? detail::lora_queries<A>(c, weights(), x_new, ws) : Matrix();
  const Input xq = has_lora() ? Input(xq_storage) : x_new;
  const Matrix Qt = self().absorb_queries(self().queries(xq, start, scratch.queries, ws), ws);
  const Input Qr = detail::rope_queries<A>(c, weights(), xq, start, scratch.rope_queries, ws);
  const Input Ot = detail::attend_latent<A>(c, Qt, Qr, cache, start, scratch.heads_output, ws);
  return self().output(self().absorb_values(Ot, ws), ws);
}

template <typename Derived, typename A>
template <typename Attend>
auto AttentionLayer<Derived, A>::attend_and_output(const Input& x, Index first_position, detail::AttentionScratch<A>& scratch,
                                                 Workspace& ws, Attend&& attend) const -> Matrix {
  const AttentionConfig& c = config();
  const Matrix xq_storage = has_lora() ? detail::lora_queries<A>(c, weights(), x, ws) : Matrix();
  const Input xq = has_lora() ? Input(xq_storage) : x;
  const Input Q = self().queries(xq, first_position, scratch.queries, ws);
  const Input Qr = detail::rope_queries<A>(c, weights(), xq, first_position, scratch.rope_queries, ws);
  const Input O = attend(Q, Qr);
  return self().output(O, ws);
}

/// The members bd::compiled holds for a layer type (multi_head_attention.hpp and bd_attention.hpp
/// expand these for their stored types); `backward` for the trainable ones (weights in float or
/// double) only.
#define BD_ATTENTION_LAYER_MEMBERS(prefix, Layer, A)                                                             \
  prefix MatrixA<A> AttentionLayer<Layer, A>::forward(const Eigen::Ref<const MatrixA<A>>&,                       \
                                                      const Eigen::Ref<const MatrixA<A>>&, Workspace&) const;    \
  prefix MatrixA<A> AttentionLayer<Layer, A>::decode(const Eigen::Ref<const MatrixA<A>>&, KVCache<A>&,           \
                                                     Workspace&) const;                                          \
  prefix MatrixA<A> AttentionLayer<Layer, A>::prefill(const Eigen::Ref<const MatrixA<A>>&, LatentCache<A>&,      \
                                                      PrefillPath, Workspace&) const;                            \
  prefix MatrixA<A> AttentionLayer<Layer, A>::decode_absorbed(const Eigen::Ref<const MatrixA<A>>&,               \
                                                              LatentCache<A>&, Workspace&) const;
#define BD_ATTENTION_LAYER_BACKWARD(prefix, Layer, A)                                                            \
  prefix Gradients<A> AttentionLayer<Layer, A>::backward(const Eigen::Ref<const MatrixA<A>>&,                    \
                                                         const Eigen::Ref<const MatrixA<A>>&,                    \
                                                         const Eigen::Ref<const MatrixA<A>>&, Workspace&) const;

}  // namespace bd::nn
