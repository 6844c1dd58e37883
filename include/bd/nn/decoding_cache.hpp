// bd/nn/decoding_cache.hpp — what a layer keeps between decoding steps, row per token:
//   KVCache      keys and values per head (MHA, GQA, and MLA decoded without absorption): for BD
//                attention the keys are K' = x·B·[I; C]-projected, n_k·d_h wide, as dense;
//   LatentCache  MLA's cache as serving engines keep it (vLLM, SGLang, llama.cpp): the normalised
//                latent c (d_c values) and the rotated shared RoPE key (rope_dim values), 512 + 64
//                on DeepSeek-V2/V3, instead of n·d_h keys and n·d_v values. Dense and BD layers
//                read the same cache: BD changes the weights, not what is cached. Stored in the
//                activations' type or, for float ones, in bf16 (half the bytes a token reads).
// Both grow by doubling, so appending one token at a time costs amortised O(1) copies per token,
// their capacity padded off the powers of two (TokenRows::padded), and both refuse rows of another
// layer's shape.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/core/scalar.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

namespace detail {
/// At least `rows`, rounded so that a column of S values (a channel's tokens, what the attention
/// reads as one run) is an odd number of cache lines. The columns lie `capacity` apart, and the
/// kernels read one block of keys across all of them; at the power-of-two capacities that
/// doubling from one token reaches, every column's run falls in the same cache set of L1 and of
/// L2, and a block's lines evict each other there (docs/benchmarks.md, "Absorbed MLA's values
/// read in place").
template <typename S>
Index padded_rows(Index rows) {
  constexpr Index line = 64 % sizeof(S) == 0 ? Index(64 / sizeof(S)) : 1;  // values per cache line
  const Index lines = (rows + line - 1) / line;
  return (lines % 2 == 0 ? lines + 1 : lines) * line;
}

/// Room in N matrices of tokens' rows for `rows` tokens of the given widths, the first `length`
/// kept: the capacity doubles, padded (padded_rows).
template <typename S, std::size_t N>
void reserve_rows(std::array<Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>, N>& m, Index length, Index rows,
                  const std::array<Index, N>& widths) {
  bool fits = rows <= m[0].rows();
  for (std::size_t i = 0; i < N; ++i) fits = fits && m[i].cols() == widths[i];
  if (fits) return;
  const Index capacity = padded_rows<S>(std::max<Index>(rows, 2 * m[0].rows()));
  for (std::size_t i = 0; i < N; ++i) {
    Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic> bigger(capacity, widths[i]);
    if (length) bigger.topRows(length) = m[i].topRows(length);
    m[i].swap(bigger);
  }
}

/// N matrices of tokens' rows that grow together; `what` names the cache in messages.
template <typename A, std::size_t N>
class TokenRows {
public:
  Index length() const { return length_; }
  void clear() { length_ = 0; }
  /// Forgets every token after the first `length` (rolling back a rejected draft, or a
  /// benchmark that decodes at a fixed context).
  void truncate(Index length) {
    if (length < 0 || length > length_)
      throw RangeError(bd::detail::message(what_, "::truncate(", length, "): the cache holds ", length_, " tokens"));
    length_ = length;
  }

protected:
  explicit TokenRows(const char* what) : what_(what) {}
  /// Room for `rows` tokens of the given widths; the rows held so far are kept.
  void reserve(Index rows, const std::array<Index, N>& widths) { reserve_rows(m_, length_, rows, widths); }
  std::array<MatrixA<A>, N> m_;
  Index length_ = 0;
  const char* what_;
};
}  // namespace detail

template <typename A>
class KVCache : public detail::TokenRows<A, 3> {
  using Base = detail::TokenRows<A, 3>;
  using Base::length_;
  using Base::m_;

public:
  KVCache() : Base("KVCache") {}
  /// L × heads·d_qk (K' for BD attention), L × heads·d_v, L × rope_dim.
  auto keys() const { return m_[0].topRows(length_); }
  auto values() const { return m_[1].topRows(length_); }
  auto rope_keys() const { return m_[2].topRows(length_); }

  /// Appends tokens' keys, values and RoPE keys (one row each); a cache holding another layer
  /// shape's entries, or row counts that differ, are refused.
  void append(const ConstRef<A>& k, const ConstRef<A>& v, const ConstRef<A>& kr) {
    using bd::detail::message;
    if (v.rows() != k.rows() || kr.rows() != k.rows())
      throw ShapeError(message("KVCache::append: ", k.rows(), " keys, ", v.rows(), " values and ", kr.rows(),
                               " RoPE keys: one row per token in each"));
    if (length_ > 0 && (k.cols() != m_[0].cols() || v.cols() != m_[1].cols() || kr.cols() != m_[2].cols()))
      throw ShapeError(message("KVCache: the cache holds keys of width ", m_[0].cols(), ", values of ", m_[1].cols(),
                               " and RoPE keys of ", m_[2].cols(), "; this layer gives ", k.cols(), ", ", v.cols(),
                               " and ", kr.cols(), " (a cache from another layer shape?)"));
    const Index add = k.rows();
    this->reserve(length_ + add, {k.cols(), v.cols(), kr.cols()});
    m_[0].middleRows(length_, add) = k;
    m_[1].middleRows(length_, add) = v;
    if (kr.cols()) m_[2].middleRows(length_, add) = kr;
    length_ += add;
  }
};

template <typename A>
class LatentCache : public detail::TokenRows<A, 2> {
  using Base = detail::TokenRows<A, 2>;
  using Base::length_;
  using Base::m_;

public:
  using Bf16Matrix = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>;

  /// A cache storing its rows in `storage`: the activations' own type, or BF16 for float
  /// activations — half the bytes a decoded token reads, the values bf16 compute rounds to anyway
  /// (docs/design.md, "Compute type"). Other storages are refused by name.
  explicit LatentCache(Storage storage = storage_of<A>()) : Base("LatentCache"), storage_(storage) {
    if (storage == storage_of<A>()) return;
    if (storage != Storage::BF16)
      throw RangeError(bd::detail::message("LatentCache<", to_string(storage_of<A>()), ">: ", to_string(storage),
                                           " storage is not implemented; store the cache in ", to_string(storage_of<A>()),
                                           " or, for f32 activations, bf16"));
    if (!std::is_same_v<A, float>)
      throw RangeError(bd::detail::message("LatentCache<", to_string(storage_of<A>()), ">: a bf16 cache is read by f32 "
                                           "arithmetic; store an f64 layer's cache in f64"));
  }
  Storage storage() const { return storage_; }
  Index latent_dim() const { return stored_bf16() ? h_[0].cols() : m_[0].cols(); }
  Index rope_dim() const { return stored_bf16() ? h_[1].cols() : m_[1].cols(); }
  /// L × d_c normalised latents and L × rope_dim rotated RoPE keys of the tokens so far, in the
  /// activations' type (a bf16 cache: rows() widens them, latent_bf16() reads them).
  auto latent() const { return held(m_[0]); }
  auto rope_keys() const { return held(m_[1]); }
  /// The same of a bf16 cache, as stored.
  auto latent_bf16() const { return held(h_[0], Storage::BF16); }
  auto rope_keys_bf16() const { return held(h_[1], Storage::BF16); }
  /// Tokens [first, first + n)'s latents and RoPE keys in the activations' type, whatever the
  /// storage (widened exactly from bf16).
  std::pair<MatrixA<A>, MatrixA<A>> rows(Index first, Index n) const {
    if (first < 0 || n < 0 || first + n > length_)
      throw RangeError(bd::detail::message("LatentCache::rows(", first, ", ", n, "): the cache holds ", length_, " tokens"));
    if (!stored_bf16()) return {m_[0].middleRows(first, n), m_[1].middleRows(first, n)};
    return {h_[0].middleRows(first, n).template cast<A>(), h_[1].middleRows(first, n).template cast<A>()};
  }

  /// Appends tokens (rounded once to bf16 in a bf16 cache); a cache holding another layer shape's
  /// entries is refused.
  void append(const MatrixA<A>& c, const MatrixA<A>& kr) {
    if (c.rows() != kr.rows())
      throw ShapeError(bd::detail::message("LatentCache::append: ", c.rows(), " latents but ", kr.rows(), " RoPE keys"));
    if (length_ > 0 && (c.cols() != latent_dim() || kr.cols() != rope_dim()))
      throw ShapeError(bd::detail::message("LatentCache: the cache holds latents of width ", latent_dim(),
                                           " and RoPE keys of ", rope_dim(), "; this layer gives ", c.cols(), " and ",
                                           kr.cols(), " (a cache from another layer shape?)"));
    if (stored_bf16()) {
      detail::reserve_rows(h_, length_, length_ + c.rows(), {c.cols(), kr.cols()});
      h_[0].middleRows(length_, c.rows()) = c.template cast<Eigen::bfloat16>();
      if (kr.cols()) h_[1].middleRows(length_, kr.rows()) = kr.template cast<Eigen::bfloat16>();
    } else {
      this->reserve(length_ + c.rows(), {c.cols(), kr.cols()});
      m_[0].middleRows(length_, c.rows()) = c;
      if (kr.cols()) m_[1].middleRows(length_, kr.rows()) = kr;
    }
    length_ += c.rows();
  }

private:
  bool stored_bf16() const { return storage_ == Storage::BF16 && !std::is_same_v<A, Eigen::bfloat16>; }
  /// The tokens so far of `m`, a matrix of the cache's storage `as` (refused otherwise).
  template <typename M>
  auto held(const M& m, Storage as = storage_of<A>()) const {
    if (as != storage_)
      throw RangeError(bd::detail::message("LatentCache: this cache stores ", to_string(storage_), "; read it ",
                                           storage_ == Storage::BF16 ? "with latent_bf16() or rows()" : "with latent()"));
    return m.topRows(length_);
  }
  Storage storage_;
  std::array<Bf16Matrix, 2> h_;  ///< a bf16 cache's latents and RoPE keys (m_ is empty then)
};

}  // namespace bd::nn
