// bd/nn/bd_weights.hpp — the tensors a BD attention layer stores (bd-convert's format v1, in x·W
// orientation), and their validation against the layer's configuration: what preparation
// produces and BDAttention::assemble takes back from a checkpoint.
#pragma once

#include <string>

#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/bd_mode.hpp"
#include "bd/nn/projection.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

/// Empty members for a family that is not decomposed. h is the number of heads of K' (V'):
/// n_kv with Windows::PerGroup, n_q with Windows::PerHead.
template <typename S>
struct BDWeights {
  using Stored = StoredMatrix<S>;
  using StoredVector = nn::StoredVector<S>;
  Stored qk_basis;          ///< d_q × n_q·d_h
  Stored qk_coeff;          ///< (d_kv − d_h) × h·d_h
  HeadIndices qk_indices;   ///< per head of K', d_h ascending channels of the key input
  StoredVector qk_bias;     ///< n_q·d_h, or empty
  Stored vo_coeff;          ///< (d_kv − d_v) × h·d_v
  Stored vo_basis;          ///< n_q·d_v × d_out
  HeadIndices vo_indices;   ///< per head of V'
  StoredVector vo_bias;     ///< d_out, or empty

  /// Checks every shape and index against `config` for a layer decomposed in `mode`, whose
  /// `rest` holds what BD left dense (Wq and Wk when QK is not decomposed, Wv and Wo when VO is
  /// not; MLA's latent and RoPE parts). Returns d_kv, the projections' key/value input width.
  BD_COLD Index validate(const AttentionConfig& config, Mode mode, const AttentionWeights<S>& rest) const {
    using bd::detail::message;
    const AttentionConfig& c = config;
    const Index n = c.n_q, dh = c.head_dim, dv = c.value_dim();
    auto require = [](bool ok, const std::string& what) {
      if (!ok) throw ShapeError("BDAttention::assemble: " + what);
    };
    // Per query head (n_q) or per key/value group (n_kv): the indices say which. Range and order
    // were checked by HeadIndices::from_basis.
    auto check_indices = [&](const HeadIndices& idx, Index dim, const char* family) {
      require((idx.heads() == n || idx.heads() == c.n_kv) && idx.head_dim == dim,
              message(family, " indices have ", idx.heads(), " heads of ", idx.head_dim, ", expected ", n,
                      " (a window per query head) or ", c.n_kv, " (per key/value group) of ", dim));
    };
    Index d_kv = 0;
    if (has_qk(mode)) {
      check_indices(qk_indices, dh, "QK");
      d_kv = qk_indices.input_dim;
      require(qk_basis.cols() == n * dh, message("QK basis has ", qk_basis.cols(), " columns, expected n_q·d_h = ", n * dh));
      const Index hk = qk_indices.heads();
      require(qk_coeff.rows() == d_kv - dh && qk_coeff.cols() == hk * dh,
              message("QK coefficients are ", qk_coeff.rows(), "x", qk_coeff.cols(), ", expected ", d_kv - dh, "x", hk * dh));
      require(qk_bias.size() == 0 || qk_bias.size() == n * dh, message("QK bias has ", qk_bias.size(), " values, expected ", n * dh));
    } else {
      require(rest.Wq.size() && rest.Wk.size(), "QK is not decomposed, so the dense Wq and Wk are needed");
      d_kv = rest.Wk.rows();
    }
    if (has_vo(mode)) {
      check_indices(vo_indices, dv, "VO");
      require(vo_indices.input_dim == d_kv,
              message("VO indices are over ", vo_indices.input_dim, " key/value input channels, QK's over ", d_kv));
      const Index hv = vo_indices.heads();
      require(vo_coeff.rows() == d_kv - dv && vo_coeff.cols() == hv * dv,
              message("VO coefficients are ", vo_coeff.rows(), "x", vo_coeff.cols(), ", expected ", d_kv - dv, "x", hv * dv));
      require(vo_basis.rows() == n * dv, message("VO basis has ", vo_basis.rows(), " rows, expected n_q·d_v = ", n * dv));
      require(vo_bias.size() == 0 || vo_bias.size() == vo_basis.cols(),
              message("VO bias has ", vo_bias.size(), " values, expected ", vo_basis.cols()));
    } else {
      require(rest.Wv.rows() == d_kv && rest.Wo.size(),
              message("VO is not decomposed, so the dense Wv (", d_kv, " rows) and Wo are needed"));
    }
    require(!(has_qk(mode) && has_vo(mode)) || qk_indices.heads() == vo_indices.heads(),
            message("QK has ", qk_indices.heads(), " heads of windows and VO ", vo_indices.heads(),
                    ": expected both per query head or both per group"));
    return d_kv;
  }
};

}  // namespace bd::nn
