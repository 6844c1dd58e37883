// bd/nn/projection.hpp — the BD projection that replaces a key or value projection:
//
//     out[:, h·d:(h+1)·d] = z[:, S_h] + z[:, R_h]·C_h        for every head h
//
// S_h are head h's basis channels (one shared window, or a pivoted set per head), R_h the
// others in ascending order, C = [C_1 … C_n] ((d_in − d) × n·d). With a shared window the
// first term is one slice of z broadcast to every head and the second a single GEMM.
#pragma once

#include <vector>

#include <Eigen/Core>

#include "bd/core/basis_selection.hpp"
#include "bd/core/decomposition.hpp"
#include "bd/nn/attention_core.hpp"

namespace bd::nn {

/// Which input channels form each head's basis.
struct HeadIndices {
  Index input_dim = 0;  ///< d_in, the width of z
  Index head_dim = 0;   ///< d, the width of each head's output
  bool shared = true;   ///< one contiguous window [offset, offset + d) for every head
  Index offset = 0;
  std::vector<std::vector<Index>> basis, rest;  ///< per head, ascending

  template <typename S>
  static HeadIndices of(const SharedDecomposition<S>& set, Index input_dim) {
    HeadIndices out;
    out.input_dim = input_dim;
    out.head_dim = set.head(0).rank();
    out.shared = set.shared() && set.head(0).contiguous();
    out.offset = set.offset();
    for (const auto& head : set.heads()) {
      out.basis.push_back(head.indices());
      out.rest.push_back(bd::detail::complement(head.indices(), input_dim));
    }
    return out;
  }
  Index heads() const { return static_cast<Index>(basis.size()); }
};

/// out = z[:, S_h] + z[:, R_h]·C_h for every head (plain Eigen: gather, GEMM, add).
template <typename A, typename CoeffMatrix>
MatrixA<A> bd_project(const ConstRef<A>& z, const HeadIndices& idx, const CoeffMatrix& C) {
  const Index d = idx.head_dim, n = idx.heads(), L = z.rows();
  MatrixA<A> out(L, n * d);
  if (idx.shared) {
    const Index o = idx.offset;
    MatrixA<A> z_rest(L, idx.input_dim - d);
    z_rest << z.leftCols(o), z.rightCols(idx.input_dim - o - d);
    out.noalias() = z_rest * C.template cast<A>();
    for (Index h = 0; h < n; ++h) out.middleCols(h * d, d) += z.middleCols(o, d);
  } else {
    for (Index h = 0; h < n; ++h) {
      const auto& S = idx.basis[static_cast<std::size_t>(h)];
      const auto& R = idx.rest[static_cast<std::size_t>(h)];
      out.middleCols(h * d, d).noalias() = z(Eigen::all, R) * C.middleCols(h * d, d).template cast<A>();
      out.middleCols(h * d, d) += z(Eigen::all, S);
    }
  }
  return out;
}

}  // namespace bd::nn
