// bd/core/truncated_svd.hpp — the best rank-r factors of a dense matrix (Eckart–Young), from
// which a dense layer becomes a low-rank product and then BD (nn::BDLinear::from_dense):
//
//   W ≈ U·Vᵀ,  U = U_r·Σ_r (m × r),  V = V_r (n × r),  ‖W − U·Vᵀ‖²_F = Σ_{k ≥ r} σ_k²
//
// by Eigen's divide-and-conquer SVD (BDCSVD) in double. Its own file because that SVD is the
// heaviest thing a program including bd can compile (about 20 s and 0.7 GB of g++'s time for one
// instantiation): here once, and with bd::compiled not at all in the caller (it is listed below).
#pragma once

#include <algorithm>

#include <Eigen/Core>
#include <Eigen/SVD>

#include "bd/base/error.hpp"

namespace bd {

/// The rank-r factors and what the truncation drops.
template <typename T>
struct TruncatedSVD {
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> U;  ///< m × r: U_r·Σ_r
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> V;  ///< n × r: V_r
  T dropped_energy = 0;                                ///< Σ_{k ≥ r} σ_k² = ‖W − U·Vᵀ‖²_F
  T energy = 0;                                        ///< ‖W‖²_F = Σ_k σ_k²
};

/// The rank-`rank` truncated SVD of W; a rank outside 1 … min(m, n) throws RangeError.
template <typename T>
TruncatedSVD<T> truncated_svd(const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>& W, Eigen::Index rank) {
  if (rank < 1 || rank > std::min(W.rows(), W.cols()))
    throw RangeError(detail::message("truncated_svd: rank ", rank, " of a ", W.rows(), "x", W.cols(),
                                     " matrix; expected 1 to ", std::min(W.rows(), W.cols())));
  Eigen::BDCSVD<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>> svd(W, Eigen::ComputeThinU | Eigen::ComputeThinV);
  const auto& sigma = svd.singularValues();
  TruncatedSVD<T> out;
  out.U = svd.matrixU().leftCols(rank) * sigma.head(rank).asDiagonal();
  out.V = svd.matrixV().leftCols(rank);
  out.dropped_energy = sigma.tail(sigma.size() - rank).squaredNorm();
  out.energy = sigma.squaredNorm();
  return out;
}

/// The instantiation bd::compiled holds (src/compiled_double.cpp); extern under BD_COMPILED_LIB.
#define BD_TRUNCATED_SVD_INSTANTIATIONS(prefix) \
  prefix TruncatedSVD<double> truncated_svd<double>(const Eigen::MatrixXd&, Eigen::Index);
#ifdef BD_COMPILED_LIB
BD_TRUNCATED_SVD_INSTANTIATIONS(extern template)
#endif

}  // namespace bd
