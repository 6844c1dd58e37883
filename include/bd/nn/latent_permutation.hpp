// bd/nn/latent_permutation.hpp — MLA with its latent channels reordered so the BD window is last.
//
// An MLA layer's keys and values read the latent c = RMSNorm(x_kv·W_dkv)·g through Wk and Wv
// (DeepSeek's kv_a_proj, kv_a_layernorm, kv_b_proj). Relabelling the latent's channels by a
// permutation π — columns of W_dkv, entries of g, rows of Wk and Wv — gives the same layer:
// RMSNorm's mean of squares does not depend on the order of its terms (up to the rounding of
// the sum), and every other step only moves numbers. A prepared BD layer relabels the same way:
// basis channels S_h → π⁻¹(S_h), rest rows of C in the new ascending rest order, and the basis
// (B_qk's columns, β, B_vo's rows) and C's columns in the new order of S_h. No number changes.
//
// Why: with the shared QK window at offset o in the middle, K' = c[:, window] + c[:, rest]·C is
// two GEMM calls on a GPU (cuBLASLt; bd/cuda/cublaslt_projection.cuh); with the window last,
// offset = d_kv − d_h, it is one. latent_window_last() picks the order: the QK window last, the
// VO window (when shared) first if the two are disjoint, else next to QK's, so both stay
// contiguous windows.
#pragma once

#include <algorithm>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/nn/attention_config.hpp"
#include "bd/nn/bd_attention.hpp"
#include "bd/nn/multi_head_attention.hpp"
#include "bd/nn/projection.hpp"

namespace bd::nn {

namespace detail {

/// Refuses `order` unless it is a permutation of [0, n); returns its inverse (new label of each old channel).
inline std::vector<Index> inverse_permutation(const std::vector<Index>& order, Index n) {
  if (static_cast<Index>(order.size()) != n)
    throw ShapeError(bd::detail::message("latent order has ", order.size(), " entries, expected the latent width ", n));
  std::vector<Index> inverse(static_cast<std::size_t>(n), -1);
  for (std::size_t j = 0; j < order.size(); ++j) {
    const Index old = order[j];
    if (old < 0 || old >= n || inverse[static_cast<std::size_t>(old)] >= 0)
      throw RangeError(bd::detail::message("latent order is not a permutation of 0…", n - 1, ": entry ", j, " is ", old,
                                           old >= 0 && old < n ? " (repeated)" : " (out of range)"));
    inverse[static_cast<std::size_t>(old)] = static_cast<Index>(j);
  }
  return inverse;
}

/// The latent-reading weights of an MLA layer (W_dkv's columns, g, Wk's and Wv's rows) in `order`.
template <typename S>
AttentionWeights<S> permute_latent_weights(AttentionWeights<S> w, const std::vector<Index>& order) {
  const Eigen::Index n = static_cast<Eigen::Index>(order.size());
  const auto take_cols = [&](auto& m) {
    if (!m.size()) return;
    const std::decay_t<decltype(m)> old = m;
    for (Eigen::Index j = 0; j < n; ++j) m.col(j) = old.col(order[std::size_t(j)]);
  };
  const auto take_rows = [&](auto& m) {
    if (!m.size()) return;
    const std::decay_t<decltype(m)> old = m;
    for (Eigen::Index j = 0; j < n; ++j) m.row(j) = old.row(order[std::size_t(j)]);
  };
  take_cols(w.W_dkv);
  take_rows(w.kv_norm);
  take_rows(w.Wk);
  take_rows(w.Wv);
  return w;
}

/// One decomposed family relabelled: new indices, C's rows (rest order) and the columns of C
/// and of the basis-aligned tensors (basis positions) moved to the new order of each head's S_h.
struct RelabelledHead {
  std::vector<Index> basis;      // new S'_h, ascending
  std::vector<Index> from_pos;   // new basis position p' ← old position from_pos[p']
  std::vector<Index> from_rest;  // new rest row q' ← old rest row from_rest[q']
};

inline RelabelledHead relabel(const std::vector<Index>& basis, const std::vector<Index>& rest, const std::vector<Index>& inverse) {
  RelabelledHead h;
  std::vector<std::pair<Index, Index>> b, r;  // (new label, old position)
  for (std::size_t p = 0; p < basis.size(); ++p) b.emplace_back(inverse[std::size_t(basis[p])], Index(p));
  for (std::size_t q = 0; q < rest.size(); ++q) r.emplace_back(inverse[std::size_t(rest[q])], Index(q));
  std::sort(b.begin(), b.end());
  std::sort(r.begin(), r.end());
  for (const auto& [label, pos] : b) h.basis.push_back(label), h.from_pos.push_back(pos);
  for (const auto& label_pos : r) h.from_rest.push_back(label_pos.second);
  return h;
}

}  // namespace detail

/// The same MLA layer with its latent channels in `order` (new channel j is old channel order[j]).
template <typename T>
MultiHeadAttention<T> permute_latent(const MultiHeadAttention<T>& layer, const std::vector<Index>& order) {
  const auto& w = layer.weights();
  if (!w.W_dkv.size())
    throw RefusedError("permute_latent needs an MLA layer (keys and values from a latent, W_dkv); this layer reads its input");
  (void)detail::inverse_permutation(order, w.W_dkv.cols());
  return MultiHeadAttention<T>(layer.config(), detail::permute_latent_weights(w, order));
}

/// The same prepared BD layer with its latent channels in `order`: indices relabelled, rows and
/// columns moved, no number changed (see the file comment).
template <typename S>
BDAttention<S> permute_latent(const BDAttention<S>& layer, const std::vector<Index>& order) {
  const AttentionWeights<S>& rest = layer.rest();
  if (!rest.W_dkv.size())
    throw RefusedError("permute_latent needs an MLA layer (keys and values from a latent, W_dkv); this layer reads its input");
  const Index d_kv = rest.W_dkv.cols();
  const std::vector<Index> inverse = detail::inverse_permutation(order, d_kv);
  BDWeights<S> out;
  // Moves head h's columns (basis positions) of a tensor with d columns per head, and its C rows.
  const auto relabel_family = [&](const HeadIndices& idx, const auto& coeff, auto& new_coeff, const auto& move_aligned) {
    std::vector<std::vector<Index>> bases;
    new_coeff.resize(coeff.rows(), coeff.cols());
    const Index d = idx.head_dim;
    for (Index h = 0; h < idx.heads(); ++h) {
      const detail::RelabelledHead r = detail::relabel(idx.basis[std::size_t(h)], idx.rest[std::size_t(h)], inverse);
      for (Index p = 0; p < d; ++p) {
        const Index from = h * d + r.from_pos[std::size_t(p)], to = h * d + p;
        for (Index q = 0; q < coeff.rows(); ++q) new_coeff(q, to) = coeff(r.from_rest[std::size_t(q)], from);
        move_aligned(from, to);
      }
      bases.push_back(r.basis);
    }
    return HeadIndices::from_basis(std::move(bases), d_kv);
  };
  const Mode mode = layer.mode();
  if (has_qk(mode)) {
    out.qk_basis.resize(layer.qk_basis().rows(), layer.qk_basis().cols());
    out.qk_bias.resize(layer.qk_bias().size());
    out.qk_indices = relabel_family(layer.qk_indices(), layer.qk_coeff(), out.qk_coeff, [&](Index from, Index to) {
      out.qk_basis.col(to) = layer.qk_basis().col(from);
      if (out.qk_bias.size()) out.qk_bias(to) = layer.qk_bias()(from);
    });
  }
  if (has_vo(mode)) {
    out.vo_basis.resize(layer.vo_basis().rows(), layer.vo_basis().cols());
    out.vo_bias = layer.vo_bias();  // per output channel: not latent-aligned
    out.vo_indices = relabel_family(layer.vo_indices(), layer.vo_coeff(), out.vo_coeff,
                                    [&](Index from, Index to) { out.vo_basis.row(to) = layer.vo_basis().row(from); });
  }
  return BDAttention<S>::assemble(layer.config(), mode, detail::permute_latent_weights(rest, order), std::move(out));
}

/// A latent order that puts the QK window last (or VO's, when QK is not decomposed), for one
/// K' GEMM call per layer on a GPU; see the file comment. Refuses per-head (pivoted) bases for
/// the family it moves: they are not one window.
template <typename S>
std::vector<Index> latent_window_last_order(const BDAttention<S>& layer) {
  const AttentionWeights<S>& rest = layer.rest();
  if (!rest.W_dkv.size())
    throw RefusedError("latent_window_last_order needs an MLA layer (keys and values from a latent, W_dkv)");
  const Index d_kv = rest.W_dkv.cols();
  const bool qk = has_qk(layer.mode()), vo = has_vo(layer.mode());
  const HeadIndices* last = qk ? &layer.qk_indices() : vo ? &layer.vo_indices() : nullptr;
  if (!last) throw RefusedError("latent_window_last_order: neither QK nor VO is decomposed; there is no window to move");
  if (!last->shared)
    throw RefusedError(bd::detail::message(qk ? "QK" : "VO", " bases are per head (pivoted), not one window shared by every head, "
                                           "so no order makes them one contiguous window; prepare with first, last, residual-min "
                                           "or offset-search to get a window"));
  std::vector<bool> in_last(std::size_t(d_kv), false), in_other(std::size_t(d_kv), false);
  for (Index c : last->basis.front()) in_last[std::size_t(c)] = true;
  if (qk && vo && layer.vo_indices().shared)
    for (Index c : layer.vo_indices().basis.front()) in_other[std::size_t(c)] = true;
  bool overlap = false, any_other = false;
  for (Index c = 0; c < d_kv; ++c) overlap |= in_last[std::size_t(c)] && in_other[std::size_t(c)], any_other |= in_other[std::size_t(c)];
  const bool disjoint = any_other && !overlap;
  std::vector<Index> order;
  const auto append = [&](auto&& keep) {
    for (Index c = 0; c < d_kv; ++c)
      if (keep(in_last[std::size_t(c)], in_other[std::size_t(c)])) order.push_back(c);
  };
  if (disjoint) append([](bool l, bool o) { return o && !l; });          // [VO window | rest | QK window]
  append([&](bool l, bool o) { return !l && !o; });                      // rest
  if (!disjoint) append([](bool l, bool o) { return o && !l; });         // [rest | VO∖QK | VO∩QK | QK∖VO]
  append([](bool l, bool o) { return l && o; });
  append([](bool l, bool o) { return l && !o; });
  return order;
}

/// A BD layer with its latent reordered by latent_window_last_order, and that order (apply it to
/// the dense checkpoint with permute_latent too): the QK window (VO's when QK is not decomposed)
/// sits at offset d_kv − d_h. Like every assembled layer, it carries no preparation report.
template <typename S>
struct WindowLastLayer {
  std::vector<Index> order;  ///< new latent channel j is old channel order[j]
  BDAttention<S> layer;
};

template <typename S>
WindowLastLayer<S> latent_window_last(const BDAttention<S>& layer) {
  WindowLastLayer<S> out;
  out.order = latent_window_last_order(layer);
  out.layer = permute_latent(layer, out.order);
  return out;
}

}  // namespace bd::nn
