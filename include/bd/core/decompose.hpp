// bd/core/decompose.hpp — the entry points: decompose, decompose_product, decompose_shared.
//
//   bd::decompose<Scalar>(W, rank, opts)         a dense W of rank r
//   bd::decompose_product<Scalar>(U, V, opts)    W = U·Vᵀ, prepared from the factors
//   bd::decompose_shared<Scalar>(Us, Vs, opts)   one basis window for a set of products
//                                                (every head of a layer: the paper's Alg. 3)
//
// All prepare in double and round the result once to Scalar (default: the input's scalar).
// The column form is the row form of Wᵀ = V·Uᵀ, so one code path serves both. Each takes a
// Workspace last (base/workspace.hpp) whose buffers later calls reuse; without one, a call
// has its own, freed when it returns.
//
// The pipeline, stage by stage: validate the factors; factor every product for ranking (Q,
// VᵀV, row norms, sketch: factored_product.hpp) and measure the storage type's rounding floor;
// rank candidate bases and choose by strategy (basis_selection.hpp, strategy.hpp); fit the
// winner — invert its basis block, form and round B, the ΔB Grams, fit and refit C, round C,
// the exact error (coefficient_fit.hpp); assemble the reports.
#pragma once

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <Eigen/QR>
#include <Eigen/SVD>

#include "bd/base/code_size.hpp"
#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/basis_selection.hpp"
#include "bd/core/coefficient_fit.hpp"
#include "bd/core/decomposition.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/options.hpp"
#include "bd/core/parallel.hpp"
#include "bd/core/precision.hpp"
#include "bd/core/rounding_floor.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/strategy.hpp"
#include "bd/core/validate.hpp"

namespace bd {
namespace detail {

inline void validate_options(const Options& opts) {
  if (opts.align <= 0) throw RangeError(message("Options::align is ", opts.align, ": expected a positive window stride"));
  if (opts.sketch_columns <= 0)
    throw RangeError(message("Options::sketch_columns is ", opts.sketch_columns, ": expected at least 1"));
  if (opts.basis == Basis::Auto && !(opts.error_budget > 0))
    throw RangeError(message("Options::error_budget is ", opts.error_budget,
                             ": expected a positive multiple of the rounding floor"));
}

template <typename Scalar>
Decomposition<Scalar> assemble(const FactoredProduct& p, BasisFit<Scalar> fit, Side side, Index rows, Index cols,
                               Report report) {
  report.norm = std::sqrt(p.norm2);
  report.residual = std::sqrt(fit.residual2);
  report.nmse = p.norm2 > 0 ? fit.residual2 / p.norm2 : (fit.residual2 > 0 ? INFINITY : 0.0);
  report.rcond = fit.rcond;
  report.refitted = fit.refitted;
  // The fitters stored B and C in the side's orientation (column form: the row form's transposes).
  return Decomposition<Scalar>(side, rows, cols, std::move(fit.S), std::move(fit.B), std::move(fit.C),
                               std::move(report));
}

template <typename Scalar>
BD_COLD std::vector<Decomposition<Scalar>> assemble_all(const std::vector<FactoredProduct>& ps, Outcome<Scalar>& out,
                                                const std::vector<double>& floors, const Options& opts, Index rows,
                                                Index cols, double truncation_nmse = 0) {
  const double u2 = unit_roundoff<Scalar>() * unit_roundoff<Scalar>();
  std::vector<Decomposition<Scalar>> heads;
  heads.reserve(ps.size());
  for (std::size_t h = 0; h < ps.size(); ++h) {
    Report report;
    report.requested = opts.basis;
    report.chosen = out.choice.chosen;
    report.estimate = relative(out.choice.model[h] * u2 / 3, ps[h].norm2);
    report.floor_nmse = floors[h];
    report.windows_tried = out.choice.tried;
    report.windows_skipped = out.choice.skipped;
    report.reason = out.reason;
    report.truncation_nmse = truncation_nmse;
    if (ps.size() == 1) report.phases = out.times;  // a set's time is the set's (SharedDecomposition::phases)
    heads.push_back(assemble<Scalar>(ps[h], std::move(out.fits[h]), opts.side, rows, cols, std::move(report)));
  }
  return heads;
}

template <typename Scalar, typename Default>
using stored_t = std::conditional_t<std::is_void_v<Scalar>, Default, Scalar>;

}  // namespace detail

namespace detail {

/// Stage 0 of decompose_shared: the set's factors agree in shape, are non-empty, and r is a
/// rank BD saves something at.
template <typename MatrixU, typename MatrixV>
BD_COLD void validate_factors(const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs) {
  if (Us.empty() || Us.size() != Vs.size())
    throw ShapeError(message("decompose_shared: got ", Us.size(), " U factors and ", Vs.size(),
                             " V factors, expected the same positive number"));
  const bool single = Us.size() == 1;
  const Index m = Us.front().rows(), n = Vs.front().rows(), r = Us.front().cols();
  for (std::size_t h = 0; h < Us.size(); ++h) {
    const std::string u = single ? "U" : message("U[", h, "]"), v = single ? "V" : message("V[", h, "]");
    require_nonempty(Us[h], u);
    require_nonempty(Vs[h], v);
    if (Us[h].rows() != m || Us[h].cols() != r || Vs[h].rows() != n || Vs[h].cols() != r)
      throw ShapeError(message(u, " is ", shape_of(Us[h]), " and ", v, " is ", shape_of(Vs[h]), ": expected ", m, "x", r,
                               " and ", n, "x", r, " like the first product"));
  }
  require_rank(r, m, n, single ? "W = U·Vᵀ" : "every W_h = U_h·V_hᵀ");
}

/// One product of a set factored for ranking into p (factored_product.hpp), reusing p's storage,
/// V held in the precisions the products read it in (precision.hpp): in double for B in double
/// or the Grams in double, in float for either in float — a float V is then the caller's own,
/// read in place (it outlives the product), any other type rounded. Stored decides which float
/// paths exist at all.
template <typename Stored, typename MatrixU, typename MatrixV>
void factor_one(FactoredProduct& p, const MatrixU& u, const MatrixV& v, Precision precision, std::string name,
                const std::shared_ptr<const Eigen::MatrixXd>& omega, Workspace& ws) {
  const bool float_grams = grams_in_float<Stored>(precision);
  const bool double_V = !(basis_in_float<Stored>(precision) && float_grams);
  p.U = u.template cast<double>();
  if (double_V) p.V = v.template cast<double>();
  else p.V.resize(0, 0);
  p.Vf_borrowed = nullptr;
  p.Vf_owned.resize(0, 0);
  if constexpr (fp32_grams_possible<Stored>) {
    if (float_grams) {
      if constexpr (std::is_same_v<MatrixV, Eigen::MatrixXf>) p.Vf_borrowed = &v;
      else p.Vf_owned = v.template cast<float>();
    }
  }
  p.name = std::move(name);
  p.omega = omega;
  factor_in_place(p, ws);
}

/// Stage 1 of decompose_shared: every product factored for ranking (`ps`) with its rounding
/// floor in Stored (`floors`), in parallel. Each product's weights are checked for NaN/Inf just
/// before it is factored, on the same thread: the check brings them into cache for the
/// factorization instead of reading the whole layer from memory twice. Errors are raised after
/// the loop, in product order, finiteness first, so the message does not depend on thread timing.
template <typename Stored, typename MatrixU, typename MatrixV>
void factor_all(const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs, const Options& opts, Precision precision,
                Workspace& ws, std::vector<FactoredProduct>& ps, std::vector<double>& floors) {
  const bool row = opts.side == Side::Row, single = Us.size() == 1;
  ps.resize(Us.size());
  floors.assign(Us.size(), 0.0);
  const auto omega = sketch_matrix(row ? Us.front().rows() : Vs.front().rows(), opts);
  std::vector<char> finite(Us.size(), 1);
  std::vector<std::exception_ptr> failed(Us.size());
  parallel_for(static_cast<Index>(Us.size()), [&](Index h) {
    const auto i = static_cast<std::size_t>(h);
    finite[i] = all_finite(Us[i]) && all_finite(Vs[i]);
    if (!finite[i]) return;
    try {
      const std::string name = single ? std::string("W = U·Vᵀ") : message("head ", h);
      // The basis side is U in row form, V in column form (the row form of Wᵀ = V·Uᵀ).
      if (row) factor_one<Stored>(ps[i], Us[i], Vs[i], precision, name, omega, ws);
      else factor_one<Stored>(ps[i], Vs[i], Us[i], precision, name, omega, ws);
      floors[i] = rounding_floor<Stored>(ps[i], opts.seed + i);
    } catch (...) {
      failed[i] = std::current_exception();
    }
  });
  for (std::size_t h = 0; h < Us.size(); ++h) {
    if (finite[h]) continue;
    require_finite(Us[h], single ? "U" : message("U[", h, "]"));
    require_finite(Vs[h], single ? "V" : message("V[", h, "]"));
  }
  for (const auto& failure : failed)
    if (failure) std::rethrow_exception(failure);
}

/// decompose_shared after the checks: factor, then the strategy with its fits, in the precision
/// Options::fp32_products allows for Stored.
template <typename Stored, typename MatrixU, typename MatrixV>
SharedDecomposition<Stored> decompose_shared_with(const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs,
                                                  const Options& opts, Workspace& ws) {
  const Precision precision = precision_for<Stored>(opts.fp32_products);
  double factor_seconds = 0;
  std::vector<FactoredProduct>& ps = ws.local<FactoredSet>().products;
  std::vector<double> floors;
  {
    PhaseTimer timer(factor_seconds);
    factor_all<Stored>(Us, Vs, opts, precision, ws, ps, floors);
  }
  const FitFunction<Stored> fitter = [&](std::size_t h, std::vector<Index> S, PhaseTimes& t) {
    return fit_basis<Stored>(ps[h], std::move(S), opts.refit, opts.side, precision, t, ws);
  };
  Outcome<Stored> out = run_strategy<Stored>(ps, floors, opts, fitter, ws);
  out.times.factor += factor_seconds;
  const bool shared = out.choice.shared;
  const Basis chosen = out.choice.chosen;
  std::string reason = out.reason;
  const PhaseTimes phases = out.times;
  return SharedDecomposition<Stored>(assemble_all<Stored>(ps, out, floors, opts, Us.front().rows(), Vs.front().rows()), shared,
                                     opts.basis, chosen, std::move(reason), phases);
}

/// decompose()'s factoring of W (row form), which no stored type changes: the product to rank,
/// and the energy Σσ² of W and of its tail Σ_{i>r} σ_i².
struct DenseFactors {
  FactoredProduct product;
  double energy = 0, tail = 0;
};
BD_DEFERRED DenseFactors factor_dense(const Eigen::MatrixXd& Wr, Index rank, const Options& opts, Index rows, Index cols,
                                      Workspace& ws) {
  DenseFactors f;
  const Index m = Wr.rows();
  // A rank-revealing factorisation W P = Q R gives the factors U = Q_r, V = P R_rᵀ that rank
  // candidate bases; the tail of R is what no rank-r decomposition can represent.
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(Wr);
  if (qr.rank() < rank)
    throw RangeError(message("W (", rows, "x", cols, ") has numerical rank ", qr.rank(), ", below the requested rank ", rank,
                             ": any ", rank, " of its rows are dependent; use rank ", qr.rank()));
  Eigen::MatrixXd U = qr.householderQ() * Eigen::MatrixXd::Identity(m, rank);
  Eigen::MatrixXd Rtop = qr.matrixQR().topRows(rank).template triangularView<Eigen::Upper>();
  Eigen::MatrixXd V = (Rtop * qr.colsPermutation().transpose()).transpose();
  // What no rank-r matrix can represent: Σ_{i>r} σ_i², a lower bound on any BD's error.
  f.energy = Wr.squaredNorm();
  const Eigen::VectorXd sigma = Eigen::BDCSVD<Eigen::MatrixXd>(Wr).singularValues();
  f.tail = sigma.tail(sigma.size() - rank).squaredNorm();
  f.product = factor_product(std::move(U), std::move(V), Eigen::MatrixXf(), "W", sketch_matrix(m, opts), nullptr, ws);
  f.product.norm2 = f.energy;
  return f;
}

/// decompose(W, rank) after the checks: W's factors from a rank-revealing QR (factor_dense), then
/// the strategy with fits made on W itself.
template <typename Stored>
Decomposition<Stored> decompose_dense(const Eigen::MatrixXd& Wr, Index rank, const Options& opts, Index rows, Index cols,
                                      Workspace& ws) {
  double factor_seconds = 0;
  std::vector<FactoredProduct> ps;
  std::vector<double> floors;
  double energy = 0, tail = 0;
  {
    PhaseTimer timer(factor_seconds);
    DenseFactors f = factor_dense(Wr, rank, opts, rows, cols, ws);
    energy = f.energy, tail = f.tail;
    ps.push_back(std::move(f.product));
    floors.push_back(rounding_floor<Stored>(Wr));
  }
  const FitFunction<Stored> fitter = [&](std::size_t h, std::vector<Index> S, PhaseTimes& t) {
    return fit_basis_dense<Stored>(Wr, ps[h], std::move(S), opts.refit, opts.side, t);
  };
  Outcome<Stored> out = run_strategy<Stored>(ps, floors, opts, fitter, ws);
  out.times.factor += factor_seconds;
  auto heads = assemble_all<Stored>(ps, out, floors, opts, rows, cols, energy > 0 ? tail / energy : 0.0);
  return std::move(heads.front());
}

}  // namespace detail

/// One basis choice for products W_h = U_h·V_hᵀ of equal shape. Windows (First, Last,
/// ResidualMin, OffsetSearch) are shared by every product, ranked by their mean estimated
/// NMSE; Pivoted picks each product's own rows; Auto takes the best shared window when it
/// meets Options::error_budget and per-product pivoting otherwise. Scratch memory is kept in
/// `ws` (base/workspace.hpp), for the next call to reuse.
template <typename Scalar = void, typename MatrixU, typename MatrixV>
SharedDecomposition<detail::stored_t<Scalar, typename MatrixU::Scalar>> decompose_shared(
    const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs, const Options& opts, Workspace& ws) {
  using Stored = detail::stored_t<Scalar, typename MatrixU::Scalar>;
  static_assert(is_supported_scalar_v<Stored>, "bd stores double, float, Eigen::half or Eigen::bfloat16");
  detail::validate_options(opts);
  detail::validate_factors(Us, Vs);
  // The pipeline is compiled for float and for double factors (bd::compiled holds both); any
  // other factors are read as double, which preparation converts them to anyway.
  constexpr bool all_double = std::is_same_v<MatrixU, Eigen::MatrixXd> && std::is_same_v<MatrixV, Eigen::MatrixXd>;
  constexpr bool all_float = std::is_same_v<MatrixU, Eigen::MatrixXf> && std::is_same_v<MatrixV, Eigen::MatrixXf>;
  if constexpr (all_double || all_float) {
    return detail::decompose_shared_with<Stored>(Us, Vs, opts, ws);
  } else {
    std::vector<Eigen::MatrixXd> Ud, Vd;
    Ud.reserve(Us.size()), Vd.reserve(Vs.size());
    for (const auto& u : Us) Ud.push_back(u.template cast<double>());
    for (const auto& v : Vs) Vd.push_back(v.template cast<double>());
    return decompose_shared<Stored>(Ud, Vd, opts, ws);
  }
}

/// The same with scratch memory of its own, freed on return.
template <typename Scalar = void, typename MatrixU, typename MatrixV>
SharedDecomposition<detail::stored_t<Scalar, typename MatrixU::Scalar>> decompose_shared(
    const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs, const Options& opts = {}) {
  Workspace ws;
  return decompose_shared<Scalar>(Us, Vs, opts, ws);
}

/// Decomposes W = U·Vᵀ (m×n, rank r = U.cols()) from its factors, never forming W: one r×r
/// LU per candidate basis, Gram matrices for the exact residual. Scalar is the stored type.
///
/// \f[ \text{row: } W_{S,:} = B,\; W_{R,:} = C B \qquad \text{col: } W_{:,S} = B,\; W_{:,R} = B C \f]
template <typename Scalar = void, typename DerivedU, typename DerivedV>
Decomposition<detail::stored_t<Scalar, typename DerivedU::Scalar>> decompose_product(
    const Eigen::MatrixBase<DerivedU>& U, const Eigen::MatrixBase<DerivedV>& V, const Options& opts, Workspace& ws) {
  using Stored = detail::stored_t<Scalar, typename DerivedU::Scalar>;
  if (U.cols() != V.cols())
    throw ShapeError(detail::message("factors disagree: U is ", detail::shape_of(U), " and V is ", detail::shape_of(V),
                                     ", expected the same number of columns r (W = U·Vᵀ is m×n of rank r)"));
  const std::vector<Eigen::MatrixXd> Us{U.template cast<double>()}, Vs{V.template cast<double>()};
  return decompose_shared<Stored>(Us, Vs, opts, ws).heads().front();
}

/// The same with scratch memory of its own, freed on return.
template <typename Scalar = void, typename DerivedU, typename DerivedV>
Decomposition<detail::stored_t<Scalar, typename DerivedU::Scalar>> decompose_product(
    const Eigen::MatrixBase<DerivedU>& U, const Eigen::MatrixBase<DerivedV>& V, const Options& opts = {}) {
  Workspace ws;
  return decompose_product<Scalar>(U, V, opts, ws);
}

/// Decomposes a dense W whose rank is `rank`. The basis is made of W's own rows (columns),
/// rounded once; the coefficients are the least-squares fit against the rounded basis. If W
/// has more than `rank` significant singular values, their energy Σ_{i>r} σ_i²/‖W‖² is
/// reported as Report::truncation_nmse: a floor under nmse, since BD is exact only for rank-r
/// products (truncate with an SVD first when that is the intent).
template <typename Scalar = void, typename Derived>
Decomposition<detail::stored_t<Scalar, typename Derived::Scalar>> decompose(const Eigen::MatrixBase<Derived>& W, Index rank,
                                                                             const Options& opts, Workspace& ws) {
  using Stored = detail::stored_t<Scalar, typename Derived::Scalar>;
  static_assert(is_supported_scalar_v<Stored>, "bd stores double, float, Eigen::half or Eigen::bfloat16");
  detail::validate_options(opts);
  detail::require_nonempty(W, "W");
  detail::require_finite(W, "W");
  detail::require_rank(rank, W.rows(), W.cols(), "W");
  const Eigen::MatrixXd Wr = opts.side == Side::Row ? Eigen::MatrixXd(W.template cast<double>())
                                                    : Eigen::MatrixXd(W.template cast<double>().transpose());
  return detail::decompose_dense<Stored>(Wr, rank, opts, W.rows(), W.cols(), ws);
}

/// The same with scratch memory of its own, freed on return.
template <typename Scalar = void, typename Derived>
Decomposition<detail::stored_t<Scalar, typename Derived::Scalar>> decompose(const Eigen::MatrixBase<Derived>& W, Index rank,
                                                                             const Options& opts = {}) {
  Workspace ws;
  return decompose<Scalar>(W, rank, opts, ws);
}

namespace detail {
/// The instantiations bd::compiled holds (src/compiled_<stored type>.cpp, one file per stored
/// type so that they compile in parallel): the pipeline on double and on float factors, and
/// decompose()'s.
#define BD_DECOMPOSE_WITH(prefix, S, M)                                                                              \
  prefix SharedDecomposition<S> decompose_shared_with<S, M, M>(const std::vector<M>&, const std::vector<M>&, const Options&, \
                                                              Workspace&);
/// decompose()'s factoring, independent of the stored type: in src/compiled_strategy.cpp.
#define BD_FACTOR_DENSE_INSTANTIATION(prefix) \
  prefix DenseFactors factor_dense<>(const Eigen::MatrixXd&, Index, const Options&, Index, Index, Workspace&);
#define BD_DECOMPOSE_DENSE(prefix, S) \
  prefix Decomposition<S> decompose_dense<S>(const Eigen::MatrixXd&, Index, const Options&, Index, Index, Workspace&);
/// One stored type: the pipeline on double and on float factors, and decompose()'s.
#define BD_DECOMPOSE_STORED(prefix, S)               \
  BD_DECOMPOSE_WITH(prefix, S, Eigen::MatrixXd)      \
  BD_DECOMPOSE_WITH(prefix, S, Eigen::MatrixXf)      \
  BD_DECOMPOSE_DENSE(prefix, S)
#define BD_DECOMPOSE_INSTANTIATIONS(prefix)          \
  BD_FACTOR_DENSE_INSTANTIATION(prefix)              \
  BD_DECOMPOSE_STORED(prefix, double)                \
  BD_DECOMPOSE_STORED(prefix, float)                 \
  BD_DECOMPOSE_STORED(prefix, Eigen::half)           \
  BD_DECOMPOSE_STORED(prefix, Eigen::bfloat16)
#ifdef BD_COMPILED_LIB
BD_DECOMPOSE_INSTANTIATIONS(extern template)
#endif
}  // namespace detail

}  // namespace bd
