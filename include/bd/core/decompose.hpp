// bd/core/decompose.hpp — the entry points: decompose, decompose_product, decompose_shared.
//
//   bd::decompose<Scalar>(W, rank, opts)         a dense W of rank r
//   bd::decompose_product<Scalar>(U, V, opts)    W = U·Vᵀ, prepared from the factors
//   bd::decompose_shared<Scalar>(Us, Vs, opts)   one basis window for a set of products
//                                                (every head of a layer: the paper's Alg. 3)
//
// All prepare in double and round the result once to Scalar (default: the input's scalar).
// The column form is the row form of Wᵀ = V·Uᵀ, so one code path serves both.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>
#include <Eigen/QR>
#include <Eigen/SVD>

#include "bd/core/basis_selection.hpp"
#include "bd/core/coefficient_fit.hpp"
#include "bd/core/decomposition.hpp"
#include "bd/base/error.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/options.hpp"
#include "bd/core/parallel.hpp"
#include "bd/core/rounding_floor.hpp"
#include "bd/core/scalar.hpp"
#include "bd/core/validate.hpp"

namespace bd {
namespace detail {

/// Window candidates re-ranked by the exact rounding model after the sketch ranking.
inline constexpr std::size_t exact_rerank = 4;

inline std::string sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

inline Basis window_kind(Index offset, Index m, Index r) {
  if (offset == 0) return Basis::First;
  if (offset == m - r) return Basis::Last;
  return Basis::OffsetSearch;
}

/// Which basis rows every product uses, and how it was decided.
struct Choice {
  std::vector<std::vector<Index>> S;  ///< per product, ascending
  std::vector<double> model;          ///< per product, the rounding model value (see basis_selection.hpp)
  bool shared = true;
  Basis chosen = Basis::First;
  Index tried = 0, skipped = 0;
};

inline double relative(double value, double norm2) { return norm2 > 0 ? value / norm2 : 0.0; }

/// One contiguous window for all products: the one whose mean estimated NMSE is lowest among
/// the windows that are non-singular for every product.
inline Choice choose_window(const std::vector<FactoredProduct>& ps, Basis basis, const Options& opts) {
  const Index m = ps.front().m(), r = ps.front().r();
  const Index heads = static_cast<Index>(ps.size());
  const std::vector<Index> offsets = candidate_offsets(basis, m, r, opts.align, opts.offset);
  const Index windows = static_cast<Index>(offsets.size());
  const bool exact_all = offsets.size() <= exact_rerank;
  std::vector<WindowScore> score(static_cast<std::size_t>(windows * heads));
  auto at = [&](Index w, Index h) -> WindowScore& { return score[static_cast<std::size_t>(w * heads + h)]; };
  parallel_for(windows * heads, [&](Index t) {
    at(t / heads, t % heads) = score_window(ps[static_cast<std::size_t>(t % heads)], contiguous(offsets[t / heads], r), exact_all);
  });

  Choice choice;
  choice.tried = windows;
  std::vector<std::pair<double, Index>> ranked;  // (mean estimate, window)
  std::string singular_note;
  for (Index w = 0; w < windows; ++w) {
    double mean = 0;
    bool singular = false;
    for (Index h = 0; h < heads && !singular; ++h) {
      if (at(w, h).singular()) {
        singular = true;
        if (singular_note.empty())
          singular_note = message(ps[static_cast<std::size_t>(h)].name, ", rows ", offsets[w], "..", offsets[w] + r - 1,
                                  " (reciprocal condition ", sci(at(w, h).rcond), ")");
      }
      mean += relative(at(w, h).model, ps[static_cast<std::size_t>(h)].norm2) / static_cast<double>(heads);
    }
    if (singular) ++choice.skipped;
    else ranked.emplace_back(mean, w);
  }
  if (ranked.empty() && windows == 1)
    throw SingularBasisError(message("the ", to_string(basis), " basis block is singular or numerically rank-deficient: ",
                                     singular_note, " < ", singular_rcond,
                                     "; choose another window (offset-search, pivoted or auto skip such blocks) or "
                                     "leave this product dense"));
  if (ranked.empty())
    throw SingularBasisError(message("no ", to_string(basis), " window is non-singular for every product: ", windows,
                                     " tried, e.g. ", singular_note,
                                     "; use Basis::Pivoted or Basis::Auto, or leave this layer dense"));
  std::sort(ranked.begin(), ranked.end());
  if (!exact_all) {
    // The sketch has a relative spread of about sqrt(2/k); settle the best few exactly.
    ranked.resize(std::min(ranked.size(), exact_rerank));
    parallel_for(static_cast<Index>(ranked.size()) * heads, [&](Index t) {
      const Index w = ranked[static_cast<std::size_t>(t / heads)].second, h = t % heads;
      at(w, h) = score_window(ps[static_cast<std::size_t>(h)], contiguous(offsets[w], r), true);
    });
    for (auto& [mean, w] : ranked) {
      mean = 0;
      for (Index h = 0; h < heads; ++h)
        mean += relative(at(w, h).model, ps[static_cast<std::size_t>(h)].norm2) / static_cast<double>(heads);
    }
    std::sort(ranked.begin(), ranked.end());
  }
  const Index best = ranked.front().second;
  choice.S.assign(ps.size(), contiguous(offsets[best], r));
  for (Index h = 0; h < heads; ++h) choice.model.push_back(at(best, h).model);
  choice.chosen = basis == Basis::Window ? Basis::Window : window_kind(offsets[best], m, r);
  return choice;
}

/// Each product its own r most independent rows.
inline Choice choose_pivoted(const std::vector<FactoredProduct>& ps) {
  Choice choice;
  choice.shared = false;
  choice.chosen = Basis::Pivoted;
  choice.tried = 1;
  choice.S.resize(ps.size());
  choice.model.resize(ps.size());
  parallel_for(static_cast<Index>(ps.size()), [&](Index h) {
    const auto& p = ps[static_cast<std::size_t>(h)];
    choice.S[static_cast<std::size_t>(h)] = pivoted_indices(p);
    choice.model[static_cast<std::size_t>(h)] = score_window(p, choice.S[static_cast<std::size_t>(h)], true).model;
  });
  return choice;
}

/// Fits every product's chosen basis; adds the pass's elapsed time to `times` (fit, round, error).
template <typename Scalar, typename Fitter>
std::vector<BasisFit<Scalar>> fit_choice(const std::vector<FactoredProduct>& ps, const Choice& choice, Fitter&& fitter,
                                         PhaseTimes& times) {
  std::vector<BasisFit<Scalar>> fits(ps.size());
  FitClock busy;
  Stopwatch clock;
  parallel_for(static_cast<Index>(ps.size()), [&](Index h) {
    PhaseTimes t;
    fits[static_cast<std::size_t>(h)] = fitter(static_cast<std::size_t>(h), choice.S[static_cast<std::size_t>(h)], t);
    busy.add(t);
  });
  busy.split(clock.lap(), times);
  return fits;
}

template <typename Scalar>
double mean_nmse(const std::vector<FactoredProduct>& ps, const std::vector<BasisFit<Scalar>>& fits) {
  double sum = 0;
  for (std::size_t h = 0; h < ps.size(); ++h) sum += relative(fits[h].residual2, ps[h].norm2);
  return sum / static_cast<double>(ps.size());
}

inline std::string describe(const Choice& c, Index m, Index r) {
  if (!c.shared) return "per-product pivoted basis";
  const Index o = c.S.front().front();
  return message(to_string(window_kind(o, m, r)), " window at rows ", o, "..", o + r - 1);
}

/// Auto skips fitting a window whose ranking estimate (the first-order rounding model before
/// the refit) exceeds the budget this many times: the refit lowers the error by 2–5x on
/// DeepSeek- and LLaMA-shaped products, never by 10x, so such a window cannot pass. Within
/// the margin the window is fitted and its exact error decides.
inline constexpr double auto_hopeless = 10.0;

/// Auto's screen before ranking windows on every product: a lower bound on each window's mean
/// estimate from the exact rounding models of a few products (in units of u²/3, like
/// WindowScore::model; `limit` too). Every product's term of the mean
/// is ≥ 0, so for any window w and any set K of the H products
///     mean_h est(w, h) ≥ Σ_{h ∈ K} est(w, h) / H,
/// and when that bound exceeds `limit` for every window, so does the estimate of whichever
/// window the full ranking would choose (its exact mean): the full ranking cannot change Auto's
/// decision and is skipped. Products are added one at a time (spread over the set, at most a
/// quarter of it) until the bound decides; a window singular for one of them is out for all, as
/// in choose_window. Returns the smallest bound over the windows (+inf when none is usable) if it
/// exceeds `limit`, else a negative value, and then the full ranking runs as before.
inline double screened_window_bound(const std::vector<FactoredProduct>& ps, const Options& opts, double limit,
                                    Index& used) {
  const Index heads = static_cast<Index>(ps.size());
  used = 0;
  if (heads < 8) return -1;  // the full ranking is cheap enough
  const Index m = ps.front().m(), r = ps.front().r();
  const std::vector<Index> offsets = candidate_offsets(Basis::OffsetSearch, m, r, opts.align, opts.offset);
  const Index windows = static_cast<Index>(offsets.size());
  std::vector<double> bound(static_cast<std::size_t>(windows), 0.0);
  for (Index k = 0; k < heads / 4; ++k) {
    const Index h = k * heads / (heads / 4);
    const FactoredProduct& p = ps[static_cast<std::size_t>(h)];
    parallel_for(windows, [&](Index w) {
      double& b = bound[static_cast<std::size_t>(w)];
      if (!(b < std::numeric_limits<double>::infinity())) return;
      const WindowScore score = score_window(p, contiguous(offsets[static_cast<std::size_t>(w)], r), true);
      b = score.singular() ? std::numeric_limits<double>::infinity()
                           : b + relative(score.model, p.norm2) / static_cast<double>(heads);
    });
    used = k + 1;
    const double lowest = *std::min_element(bound.begin(), bound.end());
    if (lowest > limit) return lowest;
  }
  return -1;
}

/// The strategy's outcome for a set of products.
template <typename Scalar>
struct Outcome {
  Choice choice;
  std::vector<BasisFit<Scalar>> fits;
  std::string reason;
  PhaseTimes times;
};

/// Auto's first choice, the best shared window (one slice of X for every head), taken when its
/// exact error is within `opts.error_budget` × the mean rounding floor `floor`. Only the winner
/// is fitted: a window whose ranking estimate is beyond auto_hopeless times the budget is not,
/// and when a few products already bound every window's estimate above that, the windows are not
/// ranked on the others at all (screened_window_bound). Returns the accepted outcome, or nothing
/// with `note` saying why no window was taken; the phases go to `times`.
template <typename Scalar, typename Fitter>
std::optional<Outcome<Scalar>> shared_window_within_budget(const std::vector<FactoredProduct>& ps, const Options& opts,
                                                           double floor, Fitter& fitter, PhaseTimes& times, std::string& note) {
  const Index m = ps.front().m(), r = ps.front().r();
  const double u2 = unit_roundoff<Scalar>() * unit_roundoff<Scalar>();
  const double limit = auto_hopeless * opts.error_budget * floor;
  Stopwatch clock;
  Index screened = 0;
  const double bound = screened_window_bound(ps, opts, limit / (u2 / 3), screened) * (u2 / 3);
  times.score += clock.lap();
  if (bound >= 0 && !(bound < std::numeric_limits<double>::infinity())) {
    note = message("no shared window is usable (each is singular for one of the first ", screened, " screened products)");
    return std::nullopt;
  }
  if (bound >= 0) {
    note = message("every window is estimated at NMSE ≥ ", sci(bound), " = ", sci(bound / floor), "x the floor (a bound from ",
                   screened, " of ", ps.size(), " products' exact rounding models; not fitted: over ", sci(auto_hopeless),
                   "x the budget)");
    return std::nullopt;
  }
  Outcome<Scalar> w;
  try {  // every window singular for some product: choose_window and the fit refuse it by throwing
    w.choice = choose_window(ps, Basis::OffsetSearch, opts);
    times.score += clock.lap();
    double estimate = 0;
    for (std::size_t h = 0; h < ps.size(); ++h)
      estimate += relative(w.choice.model[h] * u2 / 3, ps[h].norm2) / static_cast<double>(ps.size());
    if (estimate > limit) {
      note = message(describe(w.choice, m, r), " is estimated at NMSE ", sci(estimate), " = ", sci(estimate / floor),
                     "x the floor (not fitted: over ", sci(auto_hopeless), "x the budget)");
      return std::nullopt;
    }
    w.fits = fit_choice<Scalar>(ps, w.choice, fitter, times);
  } catch (const SingularBasisError& e) {
    note = message("no shared window is usable (", e.what(), ")");
    times.score += clock.lap();
    return std::nullopt;
  }
  const double nmse = mean_nmse(ps, w.fits);
  note = message(describe(w.choice, m, r), " gives NMSE ", sci(nmse), " = ", sci(nmse / floor), "x the floor");
  if (nmse > opts.error_budget * floor) return std::nullopt;
  w.reason = message("auto: ", note, ", within the budget ", sci(opts.error_budget), "x the ", scalar_traits<Scalar>::name,
                     " rounding floor ", sci(floor));
  w.times = times;
  return w;
}

/// Ranks, chooses and fits the basis `opts.basis` asks for. Auto tries the shared window first
/// (shared_window_within_budget) and falls back to per-product pivoting, saying why.
template <typename Scalar, typename Fitter>
Outcome<Scalar> run_strategy(const std::vector<FactoredProduct>& ps, const std::vector<double>& floors, const Options& opts,
                             Fitter&& fitter) {
  const Index m = ps.front().m(), r = ps.front().r();
  Outcome<Scalar> out;
  Stopwatch clock;
  if (opts.basis != Basis::Auto) {
    out.choice = opts.basis == Basis::Pivoted ? choose_pivoted(ps) : choose_window(ps, opts.basis, opts);
    out.times.score += clock.lap();
    out.fits = fit_choice<Scalar>(ps, out.choice, fitter, out.times);
    out.reason = message(to_string(opts.basis), ": ", describe(out.choice, m, r), " (", out.choice.tried,
                         " candidates ranked, ", out.choice.skipped, " singular skipped)");
    return out;
  }
  double floor = 0;
  for (double f : floors) floor += f / static_cast<double>(floors.size());
  std::string window_note;
  if (auto window = shared_window_within_budget<Scalar>(ps, opts, floor, fitter, out.times, window_note)) return std::move(*window);
  clock.lap();  // the window's phases are already in out.times
  out.choice = choose_pivoted(ps);
  out.times.score += clock.lap();
  out.fits = fit_choice<Scalar>(ps, out.choice, fitter, out.times);
  const double nmse = mean_nmse(ps, out.fits);
  out.reason = message("auto: ", window_note, ", over the budget ", sci(opts.error_budget), "x the ", scalar_traits<Scalar>::name,
                       " rounding floor ", sci(floor), "; fell back to the per-product pivoted basis: NMSE ", sci(nmse), " = ",
                       sci(nmse / floor), "x the floor", nmse <= opts.error_budget * floor ? "" : " (still over budget: the most accurate choice)");
  return out;
}

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
std::vector<Decomposition<Scalar>> assemble_all(const std::vector<FactoredProduct>& ps, Outcome<Scalar>& out,
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
void validate_factors(const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs) {
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

/// Stage 1 of decompose_shared: every product factored for ranking (`ps`) with its rounding
/// floor in Stored (`floors`), in parallel. Each product's weights are checked for NaN/Inf just
/// before it is factored, on the same thread: the check brings them into cache for the
/// factorization instead of reading the whole layer from memory twice. Errors are raised after
/// the loop, in product order, finiteness first, so the message does not depend on thread timing.
template <typename Stored, typename MatrixU, typename MatrixV>
void factor_all(const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs, const Options& opts,
                ProductPrecision precision, std::vector<FactoredProduct>& ps, std::vector<double>& floors) {
  const bool row = opts.side == Side::Row, single = Us.size() == 1;
  ps = std::vector<FactoredProduct>(Us.size());
  floors.assign(Us.size(), 0.0);
  // V in double only where a product reads it (B for float and double storage, the Grams
  // for double); in float where the Grams or B are formed in fp32.
  const bool double_V = !(precision.fp32_basis && precision.fp32_grams);
  const auto omega = sketch_matrix(row ? Us.front().rows() : Vs.front().rows(), opts);
  std::vector<char> finite(Us.size(), 1);
  std::vector<std::exception_ptr> failed(Us.size());
  parallel_for(static_cast<Index>(Us.size()), [&](Index h) {
    const auto i = static_cast<std::size_t>(h);
    finite[i] = all_finite(Us[i]) && all_finite(Vs[i]);
    if (!finite[i]) return;
    try {
      const auto& u = row ? Us[i] : Vs[i];  // the basis side (row form)
      const auto& v = row ? Vs[i] : Us[i];
      // A float V is read where the caller holds it (it outlives ps); other types are rounded.
      const Eigen::MatrixXf* borrowed = nullptr;
      Eigen::MatrixXf vf;
      if (precision.fp32_grams) {
        // (Both factor types float matrices, so v is one of the caller's own, not a converted copy.)
        if constexpr (std::is_same_v<MatrixU, Eigen::MatrixXf> && std::is_same_v<MatrixV, Eigen::MatrixXf>) borrowed = &v;
        else vf = v.template cast<float>();
      }
      ps[i] = factor_product(u.template cast<double>(), double_V ? Eigen::MatrixXd(v.template cast<double>()) : Eigen::MatrixXd(),
                             std::move(vf), single ? std::string("W = U·Vᵀ") : message("head ", h), omega, borrowed);
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

}  // namespace detail

/// One basis choice for products W_h = U_h·V_hᵀ of equal shape. Windows (First, Last,
/// ResidualMin, OffsetSearch) are shared by every product, ranked by their mean estimated
/// NMSE; Pivoted picks each product's own rows; Auto takes the best shared window when it
/// meets Options::error_budget and per-product pivoting otherwise.
template <typename Scalar = void, typename MatrixU, typename MatrixV>
SharedDecomposition<detail::stored_t<Scalar, typename MatrixU::Scalar>> decompose_shared(
    const std::vector<MatrixU>& Us, const std::vector<MatrixV>& Vs, const Options& opts = {}) {
  using Stored = detail::stored_t<Scalar, typename MatrixU::Scalar>;
  static_assert(is_supported_scalar_v<Stored>, "bd stores double, float, Eigen::half or Eigen::bfloat16");
  detail::validate_options(opts);
  detail::validate_factors(Us, Vs);
  const detail::ProductPrecision precision = detail::product_precision<Stored>(opts.fp32_products);
  detail::Stopwatch clock;
  std::vector<detail::FactoredProduct> ps;
  std::vector<double> floors;
  detail::factor_all<Stored>(Us, Vs, opts, precision, ps, floors);
  const double factor_seconds = clock.lap();
  auto fitter = [&](std::size_t h, std::vector<Index> S, PhaseTimes& t) {
    return detail::fit_basis<Stored>(ps[h], std::move(S), opts.refit, precision, opts.side, t);
  };
  detail::Outcome<Stored> out = detail::run_strategy<Stored>(ps, floors, opts, fitter);
  out.times.factor += factor_seconds;
  const bool shared = out.choice.shared;
  const Basis chosen = out.choice.chosen;
  std::string reason = out.reason;
  const PhaseTimes phases = out.times;
  return SharedDecomposition<Stored>(detail::assemble_all<Stored>(ps, out, floors, opts, Us.front().rows(), Vs.front().rows()),
                                     shared, opts.basis, chosen, std::move(reason), phases);
}

/// Decomposes W = U·Vᵀ (m×n, rank r = U.cols()) from its factors, never forming W: one r×r
/// LU per candidate basis, Gram matrices for the exact residual. Scalar is the stored type.
///
/// \f[ \text{row: } W_{S,:} = B,\; W_{R,:} = C B \qquad \text{col: } W_{:,S} = B,\; W_{:,R} = B C \f]
template <typename Scalar = void, typename DerivedU, typename DerivedV>
Decomposition<detail::stored_t<Scalar, typename DerivedU::Scalar>> decompose_product(
    const Eigen::MatrixBase<DerivedU>& U, const Eigen::MatrixBase<DerivedV>& V, const Options& opts = {}) {
  using Stored = detail::stored_t<Scalar, typename DerivedU::Scalar>;
  if (U.cols() != V.cols())
    throw ShapeError(detail::message("factors disagree: U is ", detail::shape_of(U), " and V is ", detail::shape_of(V),
                                     ", expected the same number of columns r (W = U·Vᵀ is m×n of rank r)"));
  const std::vector<Eigen::MatrixXd> Us{U.template cast<double>()}, Vs{V.template cast<double>()};
  return decompose_shared<Stored>(Us, Vs, opts).heads().front();
}

/// Decomposes a dense W whose rank is `rank`. The basis is made of W's own rows (columns),
/// rounded once; the coefficients are the least-squares fit against the rounded basis. If W
/// has more than `rank` significant singular values, their energy Σ_{i>r} σ_i²/‖W‖² is
/// reported as Report::truncation_nmse: a floor under nmse, since BD is exact only for rank-r
/// products (truncate with an SVD first when that is the intent).
template <typename Scalar = void, typename Derived>
Decomposition<detail::stored_t<Scalar, typename Derived::Scalar>> decompose(const Eigen::MatrixBase<Derived>& W,
                                                                             Index rank, const Options& opts = {}) {
  using Stored = detail::stored_t<Scalar, typename Derived::Scalar>;
  static_assert(is_supported_scalar_v<Stored>, "bd stores double, float, Eigen::half or Eigen::bfloat16");
  detail::validate_options(opts);
  detail::require_nonempty(W, "W");
  detail::require_finite(W, "W");
  detail::require_rank(rank, W.rows(), W.cols(), "W");
  const bool row = opts.side == Side::Row;
  detail::Stopwatch clock;
  const Eigen::MatrixXd Wr = row ? Eigen::MatrixXd(W.template cast<double>())
                                 : Eigen::MatrixXd(W.template cast<double>().transpose());
  const Index m = Wr.rows();

  // A rank-revealing factorisation W P = Q R gives the factors U = Q_r, V = P R_rᵀ that rank
  // candidate bases; the tail of R is what no rank-r decomposition can represent.
  Eigen::ColPivHouseholderQR<Eigen::MatrixXd> qr(Wr);
  if (qr.rank() < rank)
    throw RangeError(detail::message("W (", detail::shape_of(W), ") has numerical rank ", qr.rank(),
                                     ", below the requested rank ", rank,
                                     ": any ", rank, " of its rows are dependent; use rank ", qr.rank()));
  Eigen::MatrixXd U = qr.householderQ() * Eigen::MatrixXd::Identity(m, rank);
  Eigen::MatrixXd Rtop = qr.matrixQR().topRows(rank).template triangularView<Eigen::Upper>();
  Eigen::MatrixXd V = (Rtop * qr.colsPermutation().transpose()).transpose();
  // What no rank-r matrix can represent: Σ_{i>r} σ_i², a lower bound on any BD's error.
  const double energy = Wr.squaredNorm();
  const Eigen::VectorXd sigma = Eigen::BDCSVD<Eigen::MatrixXd>(Wr).singularValues();
  const double tail = sigma.tail(sigma.size() - rank).squaredNorm();

  std::vector<detail::FactoredProduct> ps;
  ps.push_back(detail::factor_product(std::move(U), std::move(V), Eigen::MatrixXf(), "W", detail::sketch_matrix(m, opts)));
  ps.front().norm2 = energy;
  const std::vector<double> floors{detail::rounding_floor<Stored>(Wr)};
  const double factor_seconds = clock.lap();
  auto fitter = [&](std::size_t h, std::vector<Index> S, PhaseTimes& t) {
    return detail::fit_basis_dense<Stored>(Wr, ps[h], std::move(S), opts.refit, opts.side, t);
  };
  detail::Outcome<Stored> out = detail::run_strategy<Stored>(ps, floors, opts, fitter);
  out.times.factor += factor_seconds;
  auto heads = detail::assemble_all<Stored>(ps, out, floors, opts, W.rows(), W.cols(), energy > 0 ? tail / energy : 0.0);
  return std::move(heads.front());
}

/// The ranking stage's pieces, public for those who test or extend it: a product factored for
/// ranking, the candidate windows, a window's score and auto's screen (a lower bound on every
/// window's mean estimate from a few products).
namespace ranking {
using detail::candidate_offsets;
using detail::contiguous;
using detail::factor_product;
using detail::FactoredProduct;
using detail::score_window;
using detail::screened_window_bound;
using detail::sketch_matrix;
}  // namespace ranking

}  // namespace bd
