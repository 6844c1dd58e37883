// bd/nn/latent_cache.hpp — MLA's decoding cache as serving engines keep it (vLLM, SGLang,
// llama.cpp): per token and layer the normalised latent c (d_c values) and the rotated shared
// RoPE key (rope_dim values), 512 + 64 on DeepSeek-V2/V3 — instead of n·d_h keys and n·d_v
// values. Dense and BD layers read the same cache: BD changes the weights, not what is cached.
#pragma once

#include <algorithm>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/nn/attention_core.hpp"

namespace bd::nn {

template <typename A>
class LatentCache {
public:
  Index length() const { return length_; }
  Index latent_dim() const { return C_.cols(); }
  Index rope_dim() const { return Kr_.cols(); }
  void clear() { length_ = 0; }
  /// Forgets every token after the first `length`.
  void truncate(Index length) {
    if (length < 0 || length > length_)
      throw RangeError(bd::detail::message("LatentCache::truncate(", length, "): the cache holds ", length_, " tokens"));
    length_ = length;
  }
  /// L × d_c normalised latents and L × rope_dim rotated RoPE keys of the tokens so far.
  auto latent() const { return C_.topRows(length_); }
  auto rope_keys() const { return Kr_.topRows(length_); }

  /// Appends tokens; a cache holding another layer shape's entries is refused.
  void append(const MatrixA<A>& c, const MatrixA<A>& kr) {
    if (c.rows() != kr.rows())
      throw ShapeError(bd::detail::message("LatentCache::append: ", c.rows(), " latents but ", kr.rows(), " RoPE keys"));
    if (length_ > 0 && (c.cols() != C_.cols() || kr.cols() != Kr_.cols()))
      throw ShapeError(bd::detail::message("LatentCache: the cache holds latents of width ", C_.cols(), " and RoPE keys of ",
                                           Kr_.cols(), "; this layer gives ", c.cols(), " and ", kr.cols(),
                                           " (a cache from another layer shape?)"));
    const Index rows = length_ + c.rows();
    if (rows > C_.rows() || C_.cols() != c.cols() || Kr_.cols() != kr.cols()) {
      const Index capacity = std::max<Index>(rows, 2 * C_.rows());  // doubling: amortised O(1) per token
      MatrixA<A> C(capacity, c.cols()), Kr(capacity, kr.cols());
      if (length_) {
        C.topRows(length_) = C_.topRows(length_);
        Kr.topRows(length_) = Kr_.topRows(length_);
      }
      C_.swap(C);
      Kr_.swap(Kr);
    }
    C_.middleRows(length_, c.rows()) = c;
    if (kr.cols()) Kr_.middleRows(length_, kr.rows()) = kr;
    length_ = rows;
  }

private:
  MatrixA<A> C_, Kr_;
  Index length_ = 0;
};

}  // namespace bd::nn
