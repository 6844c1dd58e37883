// bd/nn/cost_model.hpp — what BD costs and saves in an attention layer, per token.
//
// FLOPs follow the paper's count: a dot product of length d is 2d − 1 operations, so a dense
// key projection costs n_kv·d_h·(2d − 1) per token and its BD form n_q·d_h·2(d − d_h) (the
// window adds one). BD works per query head, so with grouped-query attention (g = n_q/n_kv)
// K'/V' get n_q heads: the projection is slower when g > (2d − 1)/(2(d − d_h)) and the KV cache
// grows g-fold. BDAttention refuses such a mode unless told otherwise, with these figures.
#pragma once

#include <string>

#include "bd/core/error.hpp"
#include "bd/nn/attention_config.hpp"

namespace bd::nn {

/// Which products of an attention layer are decomposed.
enum class Mode { QK, VO, QKVO };

inline const char* to_string(Mode m) { return m == Mode::QK ? "qk" : m == Mode::VO ? "vo" : "qkvo"; }
inline Mode parse_mode(const std::string& s) {
  if (s == "qk") return Mode::QK;
  if (s == "vo") return Mode::VO;
  if (s == "qkvo") return Mode::QKVO;
  throw RangeError("unknown attention mode '" + s + "': expected qk, vo or qkvo");
}
inline bool has_qk(Mode m) { return m != Mode::VO; }
inline bool has_vo(Mode m) { return m != Mode::QK; }

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
    return s;
  }
};

struct CostComparison {
  AttentionCost dense, bd;
  Mode mode = Mode::QKVO;
  bool slower() const { return bd.flops() > dense.flops(); }
  bool larger_cache() const { return bd.cache_elements > dense.cache_elements; }
  bool worthwhile() const { return !slower() && !larger_cache(); }
  double speedup() const { return dense.flops() / bd.flops(); }

  std::string describe() const {
    return bd::detail::message("BD ", to_string(mode), ": ", bd.flops(), " FLOPs/token against ", dense.flops(),
                               " dense (", speedup(), "x), ", bd.parameters, " parameters against ", dense.parameters,
                               ", KV cache ", bd.cache_elements, " values/token against ", dense.cache_elements);
  }
};

inline double dot_flops(Index length) { return 2.0 * double(length) - 1.0; }

inline CostComparison attention_cost(const AttentionShape& s, Mode mode) {
  const AttentionConfig& c = s.config;
  const double nq = double(c.n_q), nkv = double(c.n_kv), dh = double(c.head_dim), dv = double(c.value_dim());
  const double dr = double(c.rope_dim);
  AttentionCost dense;
  dense.q_flops = nq * dh * dot_flops(s.d_q);
  dense.k_flops = nkv * dh * dot_flops(s.d_kv);
  dense.v_flops = nkv * dv * dot_flops(s.d_kv);
  dense.o_flops = double(s.d_out) * dot_flops(c.n_q * c.value_dim());
  if (s.latent) dense.other_flops += double(s.d_kv) * dot_flops(s.d_model_kv);
  if (c.rope_dim) dense.other_flops += nq * dr * dot_flops(s.d_q) + dr * dot_flops(s.d_model_kv);
  dense.parameters = double(s.d_q) * nq * dh + double(s.d_kv) * nkv * (dh + dv) + nq * dv * double(s.d_out);
  dense.cache_elements = nkv * (dh + dv) + dr;

  AttentionCost bd = dense;
  if (has_qk(mode)) {
    // Q' = x·B_qk (same size as Wq); K'_h = z[window] + z[rest]·C_h: 2(d − d_h) per output.
    bd.k_flops = nq * dh * 2.0 * (double(s.d_kv) - dh);
    bd.parameters += double(s.d_kv - c.head_dim) * nq * dh - double(s.d_kv) * nkv * dh;
    bd.cache_elements += (nq - nkv) * dh;
  }
  if (has_vo(mode)) {
    // V'_h = z[window] + z[rest]·C_h; y = O'·B_vo (same size as Wo).
    bd.v_flops = nq * dv * 2.0 * (double(s.d_kv) - dv);
    bd.parameters += double(s.d_kv - c.value_dim()) * nq * dv - double(s.d_kv) * nkv * dv;
    bd.cache_elements += (nq - nkv) * dv;
  }
  return {dense, bd, mode};
}

}  // namespace bd::nn
