// bd/nn/decoding_cache.hpp — what a layer keeps between decoding steps, row per token:
//   KVCache      keys and values per head (MHA, GQA, and MLA decoded without absorption): for BD
//                attention the keys are K' = x·B·[I; C]-projected, n_k·d_h wide, as dense;
//   LatentCache  MLA's cache as serving engines keep it (vLLM, SGLang, llama.cpp): the normalised
//                latent c (d_c values) and the rotated shared RoPE key (rope_dim values), 512 + 64
//                on DeepSeek-V2/V3, instead of n·d_h keys and n·d_v values. Dense and BD layers
//                read the same cache: BD changes the weights, not what is cached.
// Both are stored in the activations' type or, for float ones, in bf16 (half the bytes a token
// reads).
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

/// N matrices of tokens' rows that grow together, stored in the activations' type or, for float
/// activations, in bf16 (half the bytes a decoded token reads, the values bf16 compute rounds to
/// anyway: docs/design.md, "Compute type"); `what` names the cache in messages.
template <typename A, std::size_t N>
class TokenRows {
public:
  using Bf16Matrix = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>;

  Index length() const { return length_; }
  void clear() { length_ = 0; }
  /// Forgets every token after the first `length` (rolling back a rejected draft, or a
  /// benchmark that decodes at a fixed context).
  void truncate(Index length) {
    if (length < 0 || length > length_)
      throw RangeError(bd::detail::message(what_, "::truncate(", length, "): the cache holds ", length_, " tokens"));
    length_ = length;
  }
  Storage storage() const { return storage_; }

protected:
  /// Other storages than the activations' own and bf16 for float activations are refused by name.
  TokenRows(const char* what, Storage storage) : what_(what), storage_(storage) {
    if (storage == storage_of<A>()) return;
    if (storage != Storage::BF16)
      throw RangeError(bd::detail::message(what, "<", to_string(storage_of<A>()), ">: ", to_string(storage),
                                           " storage is not implemented; store the cache in ", to_string(storage_of<A>()),
                                           " or, for f32 activations, bf16"));
    if (!std::is_same_v<A, float>)
      throw RangeError(bd::detail::message(what, "<", to_string(storage_of<A>()), ">: a bf16 cache is read by f32 "
                                           "arithmetic; store an f64 layer's cache in f64"));
  }
  bool stored_bf16() const { return storage_ == Storage::BF16 && !std::is_same_v<A, Eigen::bfloat16>; }
  Index width(std::size_t i) const { return stored_bf16() ? h_[i].cols() : m_[i].cols(); }
  /// Appends `add` tokens' rows, rows[i] to matrix i (rounded once to bf16 in a bf16 cache); a
  /// cache holding rows of other widths has been refused by the caller.
  void append_rows(Index add, const std::array<const ConstRef<A>*, N>& rows) {
    std::array<Index, N> widths;
    for (std::size_t i = 0; i < N; ++i) widths[i] = rows[i]->cols();
    if (stored_bf16()) reserve_rows(h_, length_, length_ + add, widths);
    else reserve_rows(m_, length_, length_ + add, widths);
    for (std::size_t i = 0; i < N; ++i) {
      if (!widths[i]) continue;
      if (stored_bf16()) h_[i].middleRows(length_, add) = rows[i]->template cast<Eigen::bfloat16>();
      else m_[i].middleRows(length_, add) = *rows[i];
    }
    length_ += add;
  }
  /// The tokens so far of matrix i, in the activations' type or as stored in bf16 (`bf16`); read
  /// the other way, refused with `hint`, the accessors that read it.
  auto held(std::size_t i, const char* hint) const {
    require(storage_of<A>(), hint);
    return m_[i].topRows(length_);
  }
  auto held_bf16(std::size_t i, const char* hint) const {
    require(Storage::BF16, hint);
    return h_[i].topRows(length_);
  }
  const Bf16Matrix& bf16_matrix(std::size_t i) const { return h_[i]; }
  const MatrixA<A>& matrix(std::size_t i) const { return m_[i]; }

private:
  void require(Storage as, const char* hint) const {
    if (as != storage_)
      throw RangeError(bd::detail::message(what_, ": this cache stores ", to_string(storage_), "; read it with ", hint));
  }
  std::array<MatrixA<A>, N> m_;
  std::array<Bf16Matrix, N> h_;  ///< a bf16 cache's rows (m_ is empty then)
  Index length_ = 0;
  const char* what_;
  Storage storage_;
};
}  // namespace detail

template <typename A>
class KVCache : public detail::TokenRows<A, 3> {
  using Base = detail::TokenRows<A, 3>;

public:
  /// A cache storing its rows in `storage`: the activations' own type, or BF16 for float
  /// activations. Other storages are refused by name.
  explicit KVCache(Storage storage = storage_of<A>()) : Base("KVCache", storage) {}
  /// L × heads·d_qk (K' for BD attention), L × heads·d_v, L × rope_dim, in the activations' type
  /// (a bf16 cache: the *_bf16 accessors read them as stored).
  auto keys() const { return this->held(0, "keys_bf16(), values_bf16() and rope_keys_bf16()"); }
  auto values() const { return this->held(1, "keys_bf16(), values_bf16() and rope_keys_bf16()"); }
  auto rope_keys() const { return this->held(2, "keys_bf16(), values_bf16() and rope_keys_bf16()"); }
  auto keys_bf16() const { return this->held_bf16(0, "keys(), values() and rope_keys()"); }
  auto values_bf16() const { return this->held_bf16(1, "keys(), values() and rope_keys()"); }
  auto rope_keys_bf16() const { return this->held_bf16(2, "keys(), values() and rope_keys()"); }

  /// Appends tokens' keys, values and RoPE keys (one row each; rounded once to bf16 in a bf16
  /// cache); a cache holding another layer shape's entries, or row counts that differ, are refused.
  void append(const ConstRef<A>& k, const ConstRef<A>& v, const ConstRef<A>& kr) {
    using bd::detail::message;
    if (v.rows() != k.rows() || kr.rows() != k.rows())
      throw ShapeError(message("KVCache::append: ", k.rows(), " keys, ", v.rows(), " values and ", kr.rows(),
                               " RoPE keys: one row per token in each"));
    if (this->length() > 0 && (k.cols() != this->width(0) || v.cols() != this->width(1) || kr.cols() != this->width(2)))
      throw ShapeError(message("KVCache: the cache holds keys of width ", this->width(0), ", values of ", this->width(1),
                               " and RoPE keys of ", this->width(2), "; this layer gives ", k.cols(), ", ", v.cols(),
                               " and ", kr.cols(), " (a cache from another layer shape?)"));
    this->append_rows(k.rows(), {&k, &v, &kr});
  }
};

template <typename A>
class LatentCache : public detail::TokenRows<A, 2> {
  using Base = detail::TokenRows<A, 2>;

public:
  /// A cache storing its rows in `storage`: the activations' own type, or BF16 for float
  /// activations. Other storages are refused by name.
  explicit LatentCache(Storage storage = storage_of<A>()) : Base("LatentCache", storage) {}
  Index latent_dim() const { return this->width(0); }
  Index rope_dim() const { return this->width(1); }
  /// L × d_c normalised latents and L × rope_dim rotated RoPE keys of the tokens so far, in the
  /// activations' type (a bf16 cache: rows() widens them, latent_bf16() reads them).
  auto latent() const { return this->held(0, "latent_bf16() or rows()"); }
  auto rope_keys() const { return this->held(1, "latent_bf16() or rows()"); }
  /// The same of a bf16 cache, as stored.
  auto latent_bf16() const { return this->held_bf16(0, "latent()"); }
  auto rope_keys_bf16() const { return this->held_bf16(1, "latent()"); }
  /// Tokens [first, first + n)'s latents and RoPE keys in the activations' type, whatever the
  /// storage (widened exactly from bf16).
  std::pair<MatrixA<A>, MatrixA<A>> rows(Index first, Index n) const {
    if (first < 0 || n < 0 || first + n > this->length())
      throw RangeError(bd::detail::message("LatentCache::rows(", first, ", ", n, "): the cache holds ", this->length(), " tokens"));
    if (!this->stored_bf16()) return {this->matrix(0).middleRows(first, n), this->matrix(1).middleRows(first, n)};
    return {this->bf16_matrix(0).middleRows(first, n).template cast<A>(),
            this->bf16_matrix(1).middleRows(first, n).template cast<A>()};
  }

  /// Appends tokens (rounded once to bf16 in a bf16 cache); a cache holding another layer shape's
  /// entries is refused.
  void append(const ConstRef<A>& c, const ConstRef<A>& kr) {
    if (c.rows() != kr.rows())
      throw ShapeError(bd::detail::message("LatentCache::append: ", c.rows(), " latents but ", kr.rows(), " RoPE keys"));
    if (this->length() > 0 && (c.cols() != latent_dim() || kr.cols() != rope_dim()))
      throw ShapeError(bd::detail::message("LatentCache: the cache holds latents of width ", latent_dim(),
                                           " and RoPE keys of ", rope_dim(), "; this layer gives ", c.cols(), " and ",
                                           kr.cols(), " (a cache from another layer shape?)"));
    this->append_rows(c.rows(), {&c, &kr});
  }
};

}  // namespace bd::nn
