// bd/nn/rope.hpp — rotary position embedding (RoPE) and the context-extension schemes models
// ship with it, computed in double as the models' own code defines them:
//
//   x₁' = a·(x₁·cos θ_k p − x₂·sin θ_k p),  x₂' = a·(x₂·cos θ_k p + x₁·sin θ_k p)     (rotate_half)
//
// for channel pairs (k, k + dim/2), k < dim/2, at position p, with inverse frequencies θ_k and a
// cos/sin scale a (1 but for YaRN):
//   standard  θ_k = base^(−2k/dim)
//   linear    θ_k / factor
//   dynamic   (NTK) base' = base·(factor·n/n₀ − (factor − 1))^(dim/(dim−2)) for a call whose last
//             position is n − 1 > n₀ (max_position_embeddings); base otherwise. As Hugging Face
//             computes it, the tables follow the call's longest position, so keys cached by
//             earlier calls keep the frequencies they were rotated with.
//   llama3    (Llama 3.1) wavelengths λ = 2π/θ_k over n₀/low_freq_factor divided by factor,
//             under n₀/high_freq_factor kept, between them blended by
//             s = (n₀/λ − low)/(high − low): (1 − s)·θ_k/factor + s·θ_k
//   yarn      θ_k/factor and θ_k blended by a linear ramp over k between the correction dims
//             ⌊d(β_fast)⌋ and ⌈d(β_slow)⌉, d(β) = dim·ln(n₀/(2πβ))/(2 ln base), clamped to
//             [0, dim − 1]: θ_k·(1 − γ_k)/factor + θ_k·γ_k with γ_k = 1 − clamp((k − low)/(high − low), 0, 1);
//             a = the attention factor the config implies (io/model_config.hpp resolves it per
//             model family: DeepSeek's and Hugging Face's read mscale differently).
// A model whose RoPE channels are stored interleaved (DeepSeek: pairs (2k, 2k + 1)) is brought to
// this layout once, by permuting its RoPE projection's output columns (io/checkpoint.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/base/index.hpp"
#include "bd/base/names.hpp"

namespace bd::nn {

using bd::Index;

enum class RopeType {
  Standard, Linear, Dynamic, Llama3, Yarn,
};

/// Each scheme by its name in Hugging Face's configs (rope_scaling.rope_type; plain RoPE is "default").
inline constexpr bd::detail::Named<RopeType> rope_type_names[] = {{RopeType::Standard, "default"},
                                                                  {RopeType::Linear, "linear"},
                                                                  {RopeType::Dynamic, "dynamic"},
                                                                  {RopeType::Llama3, "llama3"},
                                                                  {RopeType::Yarn, "yarn"}};

inline const char* to_string(RopeType t) { return bd::detail::name_in(rope_type_names, t); }

/// A RoPE scheme's parameters (the config's rope_scaling); the default is plain RoPE.
struct RopeScaling {
  RopeType type = RopeType::Standard;
  double factor = 1;
  /// n₀: the pretraining context (llama3, yarn: original_max_position_embeddings; dynamic:
  /// max_position_embeddings).
  double original_context = 0;
  double low_freq_factor = 1, high_freq_factor = 4;  ///< llama3
  double beta_fast = 32, beta_slow = 1;              ///< yarn
  bool truncate = true;                              ///< yarn: correction dims rounded outwards
  double attention_factor = 1;                       ///< a, the cos/sin scale (yarn)

  /// Checks the parameters the type uses; names the one that is out of range.
  BD_COLD void validate() const {
    using bd::detail::message;
    if (type == RopeType::Standard) return;
    if (!(factor > 0) || !std::isfinite(factor))
      throw RangeError(message("rope_scaling.factor is ", factor, ": expected a positive number"));
    if (type != RopeType::Linear && !(original_context > 0))
      throw RangeError(message("rope_scaling (", to_string(type), ") needs the pretraining context length (",
                               type == RopeType::Dynamic ? "max_position_embeddings" : "original_max_position_embeddings",
                               "), got ", original_context));
    if (type == RopeType::Llama3 && !(high_freq_factor > low_freq_factor))
      throw RangeError(message("rope_scaling: high_freq_factor ", high_freq_factor, " must exceed low_freq_factor ",
                               low_freq_factor));
    if (type == RopeType::Yarn && !(attention_factor > 0))
      throw RangeError(message("rope_scaling.attention_factor is ", attention_factor, ": expected a positive number"));
  }
};

/// θ_k (dim/2 values) of a call whose positions end at seq_len − 1 (only `dynamic` reads it).
inline std::vector<double> rope_frequencies(const RopeScaling& s, Index dim, double base, Index seq_len) {
  const Index half = dim / 2;
  const double pi = 3.14159265358979323846;
  if (s.type == RopeType::Dynamic && double(seq_len) > s.original_context)
    base *= std::pow(s.factor * double(seq_len) / s.original_context - (s.factor - 1), double(dim) / double(dim - 2));
  std::vector<double> theta(static_cast<std::size_t>(half));
  for (Index k = 0; k < half; ++k) theta[std::size_t(k)] = 1.0 / std::pow(base, double(2 * k) / double(dim));
  switch (s.type) {
    case RopeType::Standard:
    case RopeType::Dynamic: break;
    case RopeType::Linear:
      for (double& t : theta) t /= s.factor;
      break;
    case RopeType::Llama3: {
      const double low_wavelength = s.original_context / s.low_freq_factor;
      const double high_wavelength = s.original_context / s.high_freq_factor;
      for (double& t : theta) {
        const double wavelength = 2 * pi / t;
        if (wavelength > low_wavelength) {
          t /= s.factor;
        } else if (wavelength >= high_wavelength) {  // neither shorter than high nor longer than low
          const double smooth = (s.original_context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          t = (1 - smooth) * t / s.factor + smooth * t;
        }
      }
      break;
    }
    case RopeType::Yarn: {
      const auto correction_dim = [&](double rotations) {
        return double(dim) * std::log(s.original_context / (rotations * 2 * pi)) / (2 * std::log(base));
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
      if (low == high) high += 0.001;  // the published code's guard against a zero-width ramp
      for (Index k = 0; k < half; ++k) {
        const double ramp = std::clamp((double(k) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // the share of the unscaled frequency
        double& t = theta[std::size_t(k)];
        t = t / s.factor * (1 - extrapolation) + t * extrapolation;
      }
      break;
    }
  }
  return theta;
}

/// Rotates `heads` blocks of `dim` columns of x in place (rotate_half pairs k, k + dim/2); row i
/// has position first_position + i. `transposed`: the transposed map (rotation by −angle, the
/// same scale a), which carries a gradient back through the rotation.
///
/// The cos/sin of each (position, pair) are computed once, in double, rounded to x's scalar, and
/// shared by every head; the rotation then runs down whole columns (x is column-major: contiguous,
/// vectorised), not across a row's heads, which strides through the matrix a column at a time.
template <typename Matrix>
void apply_rope(Matrix& x, Index heads, Index dim, double base, const RopeScaling& s, Index first_position,
                bool transposed = false) {
  using A = typename Matrix::Scalar;
  const Index half = dim / 2, rows = x.rows();
  const std::vector<double> theta = rope_frequencies(s, dim, base, first_position + rows);
  const double a = s.type == RopeType::Yarn ? s.attention_factor : 1.0;
  // cos and sin of pair k at row i: table[2·k·rows + i] and table[(2·k + 1)·rows + i].
  std::vector<A> table(static_cast<std::size_t>(2 * half * rows));
  for (Index k = 0; k < half; ++k) {
    A* c = table.data() + 2 * k * rows;
    A* sn = c + rows;
    for (Index i = 0; i < rows; ++i) {
      const double angle = double(first_position + i) * theta[std::size_t(k)];
      c[i] = A(a * std::cos(angle));
      sn[i] = A((transposed ? -a : a) * std::sin(angle));
    }
  }
  for (Index h = 0; h < heads; ++h) {
    for (Index k = 0; k < half; ++k) {
      const A* c = table.data() + 2 * k * rows;
      const A* sn = c + rows;
      auto x1 = x.col(h * dim + k);
      auto x2 = x.col(h * dim + k + half);
      for (Index i = 0; i < rows; ++i) {
        const A u = x1(i), v = x2(i);
        x1(i) = u * c[i] - v * sn[i];
        x2(i) = v * c[i] + u * sn[i];
      }
    }
  }
}

/// Plain RoPE with base θ.
template <typename Matrix>
void apply_rope(Matrix& x, Index heads, Index dim, double base, Index first_position) {
  apply_rope(x, heads, dim, base, RopeScaling{}, first_position);
}

/// The column order that brings interleaved RoPE pairs (2k, 2k + 1) of each `dim`-wide head to
/// rotate_half's (k, k + dim/2): new column j of a head is old column order[j].
inline std::vector<Index> deinterleaved_rope_columns(Index heads, Index dim) {
  std::vector<Index> order;
  for (Index h = 0; h < heads; ++h) {
    for (Index k = 0; k < dim / 2; ++k) order.push_back(h * dim + 2 * k);
    for (Index k = 0; k < dim / 2; ++k) order.push_back(h * dim + 2 * k + 1);
  }
  return order;
}

}  // namespace bd::nn
