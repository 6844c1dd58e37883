// bd/nn/attention_core.hpp — what dense and BD attention share once q, k, v are projected:
// rotary embeddings, RMSNorm, and softmax(q·kᵀ·scale)·v per head with an optional causal mask.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Core>

#include "bd/core/error.hpp"
#include "bd/core/validate.hpp"

namespace bd::nn {

using Index = Eigen::Index;

template <typename A>
using MatrixA = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic>;

/// Applies rotate_half RoPE in place to `heads` blocks of `dim` columns; row i has position
/// first_position + i:  x₁' = x₁·cos − x₂·sin,  x₂' = x₂·cos + x₁·sin,  angle = p·θ^(−2k/dim).
template <typename A>
void apply_rope(MatrixA<A>& x, Index heads, Index dim, double theta, Index first_position) {
  const Index half = dim / 2;
  for (Index i = 0; i < x.rows(); ++i) {
    const double p = double(first_position + i);
    for (Index k = 0; k < half; ++k) {
      const double angle = p * std::pow(theta, -2.0 * double(k) / double(dim));
      const A c = A(std::cos(angle)), s = A(std::sin(angle));
      for (Index h = 0; h < heads; ++h) {
        A& x1 = x(i, h * dim + k);
        A& x2 = x(i, h * dim + k + half);
        const A a = x1, b = x2;
        x1 = a * c - b * s;
        x2 = b * c + a * s;
      }
    }
  }
}

/// RMSNorm over each row: x·g / sqrt(mean(x²) + eps).
template <typename A, typename Gain>
MatrixA<A> rms_norm(const MatrixA<A>& x, const Gain& gain, double eps) {
  MatrixA<A> out(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i) {
    const A inv = A(1.0 / std::sqrt(double(x.row(i).squaredNorm()) / double(x.cols()) + eps));
    out.row(i) = (x.row(i).array() * inv * gain.transpose().array()).matrix();
  }
  return out;
}

/// Heads and positions of one attention call.
struct AttendSpec {
  Index n_q = 1;             ///< query heads in Q
  Index n_k = 1;             ///< heads in K; query head h reads key head h·n_k/n_q
  Index n_v = 0;             ///< heads in V (0: n_k); query head h reads value head h·n_v/n_q
  Index d_qk = 0, d_v = 0;   ///< per-head widths
  Index d_rope = 0;          ///< decoupled RoPE width (Qr per head, one Kr for all)
  double scale = 1;
  bool causal = false;
  Index first_query_position = 0;  ///< keys sit at positions 0..L_k−1
};

/// O (L_q × n_q·d_v) = [softmax(Q_h·K_hᵀ·scale [+ Qr_h·Krᵀ·scale], masked)·V_h]_h.
template <typename A>
using ConstRef = Eigen::Ref<const MatrixA<A>>;

template <typename A>
MatrixA<A> attend(const ConstRef<A>& Q, const ConstRef<A>& K, const ConstRef<A>& V, const AttendSpec& s,
                  const ConstRef<A>* Qr = nullptr, const ConstRef<A>* Kr = nullptr) {
  const Index Lq = Q.rows(), Lk = K.rows();
  MatrixA<A> O(Lq, s.n_q * s.d_v);
  MatrixA<A> scores(Lq, Lk);
  for (Index h = 0; h < s.n_q; ++h) {
    const Index kh = h * s.n_k / s.n_q;
    const Index vh = h * (s.n_v ? s.n_v : s.n_k) / s.n_q;
    scores.noalias() = Q.middleCols(h * s.d_qk, s.d_qk) * K.middleCols(kh * s.d_qk, s.d_qk).transpose();
    if (Qr && Kr) scores.noalias() += Qr->middleCols(h * s.d_rope, s.d_rope) * Kr->transpose();
    scores *= A(s.scale);
    for (Index i = 0; i < Lq; ++i) {
      const Index visible = s.causal ? std::min(Lk, s.first_query_position + i + 1) : Lk;
      auto row = scores.row(i);
      const A top = row.head(visible).maxCoeff();
      row.head(visible) = (row.head(visible).array() - top).exp();
      row.tail(Lk - visible).setZero();
      row /= row.head(visible).sum();
    }
    O.middleCols(h * s.d_v, s.d_v).noalias() = scores * V.middleCols(vh * s.d_v, s.d_v);
  }
  return O;
}

/// Keys and values of the tokens seen so far, for incremental decoding. Storage grows by
/// doubling, so appending one token at a time costs amortised O(1) copies per token.
template <typename A>
class KVCache {
public:
  Index length() const { return length_; }
  void clear() { length_ = 0; }
  /// Forgets every token after the first `length` (rolling back a rejected draft, or a
  /// benchmark that decodes at a fixed context).
  void truncate(Index length) {
    if (length < 0 || length > length_)
      throw RangeError(bd::detail::message("KVCache::truncate(", length, "): the cache holds ", length_, " tokens"));
    length_ = length;
  }
  /// L × heads·d_qk (K' for BD attention), L × heads·d_v, L × rope_dim.
  auto keys() const { return K_.topRows(length_); }
  auto values() const { return V_.topRows(length_); }
  auto rope_keys() const { return Kr_.topRows(length_); }

  void append(const MatrixA<A>& k, const MatrixA<A>& v, const MatrixA<A>& kr) {
    const Index add = k.rows();
    reserve(length_ + add, k.cols(), v.cols(), kr.cols());
    K_.middleRows(length_, add) = k;
    V_.middleRows(length_, add) = v;
    if (kr.cols()) Kr_.middleRows(length_, add) = kr;
    length_ += add;
  }

private:
  void reserve(Index rows, Index kc, Index vc, Index rc) {
    if (rows <= K_.rows() && K_.cols() == kc) return;
    const Index capacity = std::max<Index>(rows, 2 * K_.rows());
    auto grow = [&](MatrixA<A>& m, Index cols) {
      MatrixA<A> bigger(capacity, cols);
      if (length_) bigger.topRows(length_) = m.topRows(length_);
      m.swap(bigger);
    };
    grow(K_, kc);
    grow(V_, vc);
    grow(Kr_, rc);
  }
  MatrixA<A> K_, V_, Kr_;
  Index length_ = 0;
};

}  // namespace bd::nn
