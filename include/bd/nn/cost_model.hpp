// bd/nn/cost_model.hpp — what BD costs and saves in an attention layer, per token.
//
// FLOPs follow the paper's count: a dot product of length d is 2d − 1 operations, so a dense
// key projection costs n_kv·d_h·(2d − 1) per token and its BD form h·d_h·2(d − d_h) (the window
// adds one), h the heads of K'. With grouped-query attention (g = n_q/n_kv) BD chooses one
// window per key/value group by default (Windows::PerGroup: C_g is the same for every query
// head of the group, so h = n_kv and the cache is dense's); per query head (Windows::PerHead)
// h = n_q: the projection is slower when g > (2d − 1)/(2(d − d_h)) and the KV cache grows
// g-fold. BDAttention refuses such a mode unless told otherwise, with these figures.
//
// MLA (mla_cost) is served from a latent cache of d_c + d_rope values per token, dense or BD.
// Decoding absorbed, per token: the query absorption Q̃_h = Q_h·W_uk,hᵀ costs n·d_c·(2d_h − 1)
// dense and n·(d_c − d_h)·(2d_h − 1) with BD (Q̃[S] is q' itself); the output absorption
// O_h = Õ_h·W_uv,h costs n·d_v·(2d_c − 1) dense and n·d_v·2(d_c − d_v) with BD. The rest (latent,
// query LoRA, q, q_rope, o_proj) is the same, and so is attention over the T cached tokens,
// n·(T·(2(d_c + d_rope) − 1) + d_c·(2T − 1)), which the figures leave out. Prefill (Algorithm 2)
// recomputes K'/V' from the latent: the k and v up-projections of attention_cost.
#pragma once

#include <string>

#include "bd/base/error.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/bd_mode.hpp"

namespace bd::nn {

/// Per-token cost of one attention layer's projections (the softmax core is the same for both).
struct AttentionCost {
  double q_flops = 0, k_flops = 0, v_flops = 0, o_flops = 0, other_flops = 0;
  double parameters = 0;
  double cache_elements = 0;  ///< keys and values cached per token
  double flops() const { return q_flops + k_flops + v_flops + o_flops + other_flops; }
};

/// The shapes that set the cost: query input d_q, key/value input d_kv (the latent for MLA),
/// output d_out, and for MLA the model width the latent is computed from.
struct AttentionShape {
  AttentionConfig config;
  Index d_q = 0, d_kv = 0, d_out = 0, d_model_kv = 0;
  Index d_model_q = 0;  ///< the query input's width: d_q, or the model width before a query LoRA
  bool latent = false;

  template <typename S>
  static AttentionShape of(const AttentionConfig& c, const AttentionWeights<S>& w) {
    AttentionShape s;
    s.config = c;
    s.d_q = w.Wq.rows();
    s.d_kv = w.Wk.rows();
    s.d_out = w.Wo.cols();
    s.latent = w.W_dkv.size() != 0;
    s.d_model_kv = s.latent ? w.W_dkv.rows() : s.d_kv;
    s.d_model_q = w.W_qa.size() ? w.W_qa.rows() : s.d_q;
    return s;
  }
};

struct CostComparison {
  AttentionCost dense, bd;
  Mode mode = Mode::QKVO;
  Windows windows = Windows::PerGroup;
  Compute compute = Compute::F32;  ///< the projections' arithmetic (the counts are the same in either)
  bool slower() const { return bd.flops() > dense.flops(); }
  bool larger_cache() const { return bd.cache_elements > dense.cache_elements; }
  bool worthwhile() const { return !slower() && !larger_cache(); }
  double speedup() const { return dense.flops() / bd.flops(); }

  std::string describe() const {
    return bd::detail::message("BD ", to_string(mode), " (", to_string(windows), " windows, ", to_string(compute),
                               " compute): ", bd.flops(), " FLOPs/token against ", dense.flops(),
                               " dense (", speedup(), "x), ", bd.parameters, " parameters against ", dense.parameters,
                               ", KV cache ", bd.cache_elements, " values/token against ", dense.cache_elements);
  }
};

inline double dot_flops(Index length) { return 2.0 * double(length) - 1.0; }

inline CostComparison attention_cost(const AttentionShape& s, Mode mode, Windows windows = Windows::PerGroup) {
  const AttentionConfig& c = s.config;
  const double nq = double(c.n_q), nkv = double(c.n_kv), dh = double(c.head_dim), dv = double(c.value_dim());
  const double heads = windows == Windows::PerGroup ? nkv : nq;  // of K' and V' (see Windows)
  const double dr = double(c.rope_dim);
  AttentionCost dense;
  dense.q_flops = nq * dh * dot_flops(s.d_q);
  dense.k_flops = nkv * dh * dot_flops(s.d_kv);
  dense.v_flops = nkv * dv * dot_flops(s.d_kv);
  dense.o_flops = double(s.d_out) * dot_flops(c.n_q * c.value_dim());
  if (s.latent) dense.other_flops += double(s.d_kv) * dot_flops(s.d_model_kv);
  if (c.rope_dim) dense.other_flops += nq * dr * dot_flops(s.d_q) + dr * dot_flops(s.d_model_kv);
  if (s.d_model_q != s.d_q && s.d_model_q > 0) dense.other_flops += double(s.d_q) * dot_flops(s.d_model_q);  // query LoRA
  dense.parameters = double(s.d_q) * nq * dh + double(s.d_kv) * nkv * (dh + dv) + nq * dv * double(s.d_out);
  dense.cache_elements = nkv * (dh + dv) + dr;

  AttentionCost bd = dense;
  if (has_qk(mode)) {
    // Q' = x·B_qk (same size as Wq); K' = z[window] + z[rest]·C per head of K': 2(d − d_h) per output.
    bd.k_flops = heads * dh * 2.0 * (double(s.d_kv) - dh);
    bd.parameters += double(s.d_kv - c.head_dim) * heads * dh - double(s.d_kv) * nkv * dh;
    bd.cache_elements += (heads - nkv) * dh;
  }
  if (has_vo(mode)) {
    // V' = z[window] + z[rest]·C per head of V'; y = O'·B_vo (same size as Wo).
    bd.v_flops = heads * dv * 2.0 * (double(s.d_kv) - dv);
    bd.parameters += double(s.d_kv - c.value_dim()) * heads * dv - double(s.d_kv) * nkv * dv;
    bd.cache_elements += (heads - nkv) * dv;
  }
  return {dense, bd, mode, windows, c.compute};
}

/// MLA served from the latent cache: per decoded token (absorbed) and per prefill token, the
/// projections' FLOPs (see the file comment), parameters and cached values, dense against BD.
struct MLACost {
  Mode mode = Mode::QKVO;
  double decode_dense = 0, decode_bd = 0;    ///< FLOPs per decoded token, absorbed, projections only
  double prefill_dense = 0, prefill_bd = 0;  ///< FLOPs per prefill token (Algorithm 2)
  double parameters_dense = 0, parameters_bd = 0;
  double cache_values = 0;                   ///< per token: d_c + d_rope, the same for both

  /// The attention over `context` cached tokens per decoded token, equal for both.
  double context_flops(double context, const AttentionShape& s) const {
    const double n = double(s.config.n_q), dc = double(s.d_kv), dr = double(s.config.rope_dim);
    return n * (context * (2.0 * (dc + dr) - 1.0) + dc * (2.0 * context - 1.0));
  }
  bool worthwhile() const { return decode_bd <= decode_dense && prefill_bd <= prefill_dense; }

  std::string describe() const {
    return bd::detail::message("MLA ", to_string(mode), ": decode ", decode_bd, " FLOPs/token against ", decode_dense,
                               " dense (absorbed, projections), prefill ", prefill_bd, " against ", prefill_dense,
                               ", parameters ", parameters_bd, " against ", parameters_dense, ", latent cache ", cache_values,
                               " values/token for both");
  }
};

inline MLACost mla_cost(const AttentionShape& s, Mode mode) {
  if (!s.latent) throw RangeError("mla_cost: the layer reads no latent (W_dkv); use attention_cost");
  const AttentionConfig& c = s.config;
  const CostComparison per_token = attention_cost(s, mode);  // prefill: K/V recomputed from the latent
  const double n = double(c.n_q), dh = double(c.head_dim), dv = double(c.value_dim()), dc = double(s.d_kv);
  MLACost m;
  m.mode = mode;
  m.prefill_dense = per_token.dense.flops();
  m.prefill_bd = per_token.bd.flops();
  m.parameters_dense = per_token.dense.parameters;
  m.parameters_bd = per_token.bd.parameters;
  m.cache_values = dc + double(c.rope_dim);
  const double common = per_token.dense.q_flops + per_token.dense.o_flops + per_token.dense.other_flops;
  const double absorb_q = n * dc * dot_flops(c.head_dim), absorb_o = n * dv * dot_flops(s.d_kv);
  m.decode_dense = common + absorb_q + absorb_o;
  m.decode_bd = common + (has_qk(mode) ? n * (dc - dh) * dot_flops(c.head_dim) : absorb_q) +
                (has_vo(mode) ? n * dv * 2.0 * (dc - dv) : absorb_o);
  return m;
}

/// How a chunk of new tokens is served from an MLA latent cache: K/V (K'/V' for BD) recomputed
/// from the cached latent for the whole context, or absorbed (queries mapped into the latent).
enum class PrefillPath {
  Automatic, Recompute, Absorbed,
};

inline const char* to_string(PrefillPath p) {
  return p == PrefillPath::Recompute ? "recompute" : p == PrefillPath::Absorbed ? "absorbed" : "automatic";
}

/// The cheaper path for `chunk` new tokens over `context` cached ones (the chunk included), and
/// both estimates: the FLOPs in which the paths differ. Recomputing costs the K/V up-projection
/// of every context token and attention at the heads' widths (d_h + d_rope, d_v); absorbing costs
/// the maps into and out of the latent per new token and attention at the latent's width
/// (d_c + d_rope, d_c). Long chunks over short contexts recompute, short chunks absorb.
struct ChunkPlan {
  PrefillPath path = PrefillPath::Recompute;
  double recompute_flops = 0, absorbed_flops = 0;
};

inline ChunkPlan chunk_plan(const AttentionShape& s, Mode mode, bool decomposed, Index chunk, Index context) {
  const AttentionConfig& c = s.config;
  const CostComparison per = attention_cost(s, mode);
  const AttentionCost& own = decomposed ? per.bd : per.dense;
  const MLACost m = mla_cost(s, mode);
  const double common = per.dense.q_flops + per.dense.o_flops + per.dense.other_flops;
  const double absorb = (decomposed ? m.decode_bd : m.decode_dense) - common;
  const double L = double(chunk), T = double(context), n = double(c.n_q), dr = double(c.rope_dim), dc = double(s.d_kv);
  ChunkPlan p;
  p.recompute_flops = T * (own.k_flops + own.v_flops) + L * T * n * 2.0 * (double(c.head_dim) + dr + double(c.value_dim()));
  p.absorbed_flops = L * absorb + L * T * n * 2.0 * (2.0 * dc + dr);
  p.path = p.absorbed_flops < p.recompute_flops ? PrefillPath::Absorbed : PrefillPath::Recompute;
  return p;
}

}  // namespace bd::nn
