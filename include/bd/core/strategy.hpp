// bd/core/strategy.hpp — which basis each product of a set gets, by Options::basis, and its fit.
//
//   First, Last, ResidualMin, OffsetSearch, Window   one contiguous window shared by every product:
//                                                    the lowest mean ranking estimate among the
//                                                    windows non-singular for all (rank_windows)
//   Pivoted                                          each product its own r most independent rows
//   Auto                                             the best shared window if its exact error is
//                                                    within Options::error_budget × the storage
//                                                    type's rounding floor, else Pivoted
//
// Ranking (basis_selection.hpp) decides; only the winner is fitted (coefficient_fit.hpp).
#pragma once

#include <algorithm>
#include <cstdio>
#include <limits>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bd/base/code_size.hpp"
#include "bd/base/deferred.hpp"
#include "bd/base/error.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/basis_selection.hpp"
#include "bd/core/coefficient_fit.hpp"
#include "bd/core/factored_product.hpp"
#include "bd/core/options.hpp"
#include "bd/core/parallel.hpp"
#include "bd/core/phase_times.hpp"
#include "bd/core/scalar.hpp"

namespace bd::detail {

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

inline double relative(double value, double norm2) { return norm2 > 0 ? value / norm2 : 0.0; }

/// Which basis rows every product uses, and how it was decided.
struct Choice {
  std::vector<std::vector<Index>> S;  ///< per product, ascending
  std::vector<double> model;          ///< per product, the rounding model value (see basis_selection.hpp)
  bool shared = true;
  Basis chosen = Basis::First;
  Index tried = 0, skipped = 0;
};

/// Every candidate window scored on every product, and the usable ones in ranking order.
struct WindowRanking {
  std::vector<Index> offsets;
  Index heads = 0;
  std::vector<WindowScore> score;                // window-major: score[w·heads + h]
  std::vector<std::pair<double, Index>> ranked;  // (mean relative estimate, window), best first
  Index skipped = 0;                             // windows singular for some product
  std::string singular_note;                     // the first of them, in words

  WindowScore& at(Index w, Index h) { return score[static_cast<std::size_t>(w * heads + h)]; }
};

/// The mean over products of each window's relative estimate; a window singular for any product
/// is left out (and counted).
BD_DEFERRED void rank_usable(const std::vector<FactoredProduct>& ps, Index r, WindowRanking& t) {
  const Index windows = static_cast<Index>(t.offsets.size());
  for (Index w = 0; w < windows; ++w) {
    double mean = 0;
    bool singular = false;
    for (Index h = 0; h < t.heads && !singular; ++h) {
      const FactoredProduct& p = ps[static_cast<std::size_t>(h)];
      if (t.at(w, h).singular()) {
        singular = true;
        if (t.singular_note.empty())
          t.singular_note = message(p.name, ", rows ", t.offsets[w], "..", t.offsets[w] + r - 1, " (reciprocal condition ",
                                    sci(t.at(w, h).rcond), ")");
      }
      mean += relative(t.at(w, h).model, p.norm2) / static_cast<double>(t.heads);
    }
    if (singular) ++t.skipped;
    else t.ranked.emplace_back(mean, w);
  }
  std::sort(t.ranked.begin(), t.ranked.end());
}

/// Ranks the windows `basis` considers on every product: by the sketch, then the best few again
/// by the exact model (the sketch has a relative spread of about sqrt(2/k)). With few windows,
/// all are scored exactly at once.
BD_DEFERRED WindowRanking rank_windows(const std::vector<FactoredProduct>& ps, Basis basis, const Options& opts, Workspace& ws) {
  WindowRanking t;
  const Index m = ps.front().m(), r = ps.front().r();
  t.offsets = candidate_offsets(basis, m, r, opts.align, opts.offset);
  t.heads = static_cast<Index>(ps.size());
  const Index windows = static_cast<Index>(t.offsets.size());
  const bool exact_all = t.offsets.size() <= exact_rerank;
  t.score.resize(static_cast<std::size_t>(windows * t.heads));
  parallel_for(windows * t.heads, [&](Index i) {
    const Index w = i / t.heads, h = i % t.heads;
    t.at(w, h) = score_window(ps[static_cast<std::size_t>(h)], contiguous(t.offsets[w], r), exact_all, ws);
  });
  rank_usable(ps, r, t);
  if (exact_all || t.ranked.empty()) return t;
  t.ranked.resize(std::min(t.ranked.size(), exact_rerank));
  parallel_for(static_cast<Index>(t.ranked.size()) * t.heads, [&](Index i) {
    const Index w = t.ranked[static_cast<std::size_t>(i / t.heads)].second, h = i % t.heads;
    t.at(w, h) = score_window(ps[static_cast<std::size_t>(h)], contiguous(t.offsets[w], r), true, ws);
  });
  for (auto& [mean, w] : t.ranked) {
    mean = 0;
    for (Index h = 0; h < t.heads; ++h)
      mean += relative(t.at(w, h).model, ps[static_cast<std::size_t>(h)].norm2) / static_cast<double>(t.heads);
  }
  std::sort(t.ranked.begin(), t.ranked.end());
  return t;
}

/// One contiguous window for all products: the best-ranked usable one, or nothing (with `why`
/// saying so) when every window is singular for some product.
BD_DEFERRED std::optional<Choice> choose_window(const std::vector<FactoredProduct>& ps, Basis basis, const Options& opts,
                                           Workspace& ws, std::string& why) {
  const Index m = ps.front().m(), r = ps.front().r();
  WindowRanking t = rank_windows(ps, basis, opts, ws);
  const Index windows = static_cast<Index>(t.offsets.size());
  if (t.ranked.empty()) {
    why = windows == 1 ? message("the ", to_string(basis), " basis block is singular or numerically rank-deficient: ",
                                 t.singular_note, " < ", singular_rcond)
                       : message("no ", to_string(basis), " window is non-singular for every product: ", windows,
                                 " tried, e.g. ", t.singular_note);
    return std::nullopt;
  }
  Choice choice;
  choice.tried = windows;
  choice.skipped = t.skipped;
  const Index best = t.ranked.front().second;
  choice.S.assign(ps.size(), contiguous(t.offsets[best], r));
  for (Index h = 0; h < t.heads; ++h) choice.model.push_back(t.at(best, h).model);
  choice.chosen = basis == Basis::Window ? Basis::Window : window_kind(t.offsets[best], m, r);
  return choice;
}

/// choose_window for a strategy that must use a window: no usable one is an error.
BD_DEFERRED Choice require_window(const std::vector<FactoredProduct>& ps, Basis basis, const Options& opts, Workspace& ws) {
  std::string why;
  if (auto choice = choose_window(ps, basis, opts, ws, why)) return std::move(*choice);
  const bool one = candidate_offsets(basis, ps.front().m(), ps.front().r(), opts.align, opts.offset).size() == 1;
  throw SingularBasisError(why + (one ? "; choose another window (offset-search, pivoted or auto skip such blocks) or "
                                        "leave this product dense"
                                      : "; use Basis::Pivoted or Basis::Auto, or leave this layer dense"));
}

/// Each product its own r most independent rows.
BD_DEFERRED Choice choose_pivoted(const std::vector<FactoredProduct>& ps, Workspace& ws) {
  Choice choice;
  choice.shared = false;
  choice.chosen = Basis::Pivoted;
  choice.tried = 1;
  choice.S.resize(ps.size());
  choice.model.resize(ps.size());
  parallel_for(static_cast<Index>(ps.size()), [&](Index h) {
    const auto& p = ps[static_cast<std::size_t>(h)];
    choice.S[static_cast<std::size_t>(h)] = pivoted_indices(p, ws);
    choice.model[static_cast<std::size_t>(h)] = score_window(p, choice.S[static_cast<std::size_t>(h)], true, ws).model;
  });
  return choice;
}

/// How a strategy fits product h's basis S (adding its phases to the PhaseTimes): the caller's
/// fit — on the factors or on a dense W, in its precision — behind one type, so that the
/// strategies are compiled once per stored type, not once per caller.
template <typename Scalar>
using FitFunction = std::function<BasisFit<Scalar>(std::size_t, std::vector<Index>, PhaseTimes&)>;

/// Fits every product's chosen basis; adds the pass's elapsed time to `times` (fit, round, error).
template <typename Scalar>
std::vector<BasisFit<Scalar>> fit_choice(const std::vector<FactoredProduct>& ps, const Choice& choice,
                                         const FitFunction<Scalar>& fitter, PhaseTimes& times) {
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

}  // namespace bd::detail

namespace bd::ranking {

/// Auto's screen before ranking windows on every product: a lower bound on each window's mean
/// estimate from the exact rounding models of a few products (in units of u²/3, like
/// WindowScore::model; `limit` too). Every product's term of the mean
/// is ≥ 0, so for any window w and any set K of the H products
///     mean_h est(w, h) ≥ Σ_{h ∈ K} est(w, h) / H,
/// and when that bound exceeds `limit` for every window, so does the estimate of whichever
/// window the full ranking would choose (its exact mean): the full ranking cannot change Auto's
/// decision and is skipped. Products are added one at a time (spread over the set, at most a
/// quarter of it) until the bound decides; a window singular for one of them is out for all, as
/// in rank_windows. Returns the smallest bound over the windows (+inf when none is usable) if it
/// exceeds `limit`, else a negative value, and then the full ranking runs as before.
BD_DEFERRED double screened_window_bound(const std::vector<FactoredProduct>& ps, const Options& opts, double limit,
                                    Index& used, Workspace& ws = default_workspace()) {
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
    detail::parallel_for(windows, [&](Index w) {
      double& b = bound[static_cast<std::size_t>(w)];
      if (!(b < std::numeric_limits<double>::infinity())) return;
      const WindowScore score = score_window(p, contiguous(offsets[static_cast<std::size_t>(w)], r), true, ws);
      b = score.singular() ? std::numeric_limits<double>::infinity()
                           : b + detail::relative(score.model, p.norm2) / static_cast<double>(heads);
    });
    used = k + 1;
    const double lowest = *std::min_element(bound.begin(), bound.end());
    if (lowest > limit) return lowest;
  }
  return -1;
}

/// The instantiation bd::compiled holds (src/compiled_ranking.cpp).
#define BD_SCREEN_INSTANTIATIONS(prefix) \
  prefix double screened_window_bound<>(const std::vector<FactoredProduct>&, const Options&, double, Index&, Workspace&);
#ifdef BD_COMPILED_LIB
BD_SCREEN_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::ranking

namespace bd::detail {

/// The strategy's outcome for a set of products.
template <typename Scalar>
struct Outcome {
  Choice choice;
  std::vector<BasisFit<Scalar>> fits;
  std::string reason;
  PhaseTimes times;
};

/// Auto's ranking of shared windows, short of fitting: the best window if its estimate is within
/// auto_hopeless × the budget, else nothing and `note` says why. When a few products already
/// bound every window's estimate above that (screened_window_bound), the windows are not ranked
/// on the others at all. `floor` is the set's mean rounding floor; the phases go to `times`.
template <typename Scalar>
BD_COLD std::optional<Choice> hopeful_window(const std::vector<FactoredProduct>& ps, const Options& opts, double floor, Workspace& ws,
                                     PhaseTimes& times, std::string& note) {
  PhaseTimer timer(times.score);
  const Index m = ps.front().m(), r = ps.front().r();
  const double u2 = unit_roundoff<Scalar>() * unit_roundoff<Scalar>();
  const double limit = auto_hopeless * opts.error_budget * floor;
  Index screened = 0;
  const double bound = screened_window_bound(ps, opts, limit / (u2 / 3), screened, ws) * (u2 / 3);
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
  std::string why;
  std::optional<Choice> choice = choose_window(ps, Basis::OffsetSearch, opts, ws, why);
  if (!choice) {
    note = message("no shared window is usable (", why, ")");
    return std::nullopt;
  }
  double estimate = 0;
  for (std::size_t h = 0; h < ps.size(); ++h)
    estimate += relative(choice->model[h] * u2 / 3, ps[h].norm2) / static_cast<double>(ps.size());
  if (estimate > limit) {
    note = message(describe(*choice, m, r), " is estimated at NMSE ", sci(estimate), " = ", sci(estimate / floor),
                   "x the floor (not fitted: over ", sci(auto_hopeless), "x the budget)");
    return std::nullopt;
  }
  return choice;
}

/// Auto's first choice, the best shared window (one slice of X for every head), taken when its
/// exact error is within `opts.error_budget` × the mean rounding floor `floor`. Only the winner
/// is fitted (hopeful_window). Returns the accepted outcome, or nothing with `note` saying why
/// no window was taken; the phases go to `times`.
template <typename Scalar>
BD_COLD std::optional<Outcome<Scalar>> shared_window_within_budget(const std::vector<FactoredProduct>& ps, const Options& opts,
                                                           double floor, const FitFunction<Scalar>& fitter, Workspace& ws,
                                                           PhaseTimes& times, std::string& note) {
  const Index m = ps.front().m(), r = ps.front().r();
  Outcome<Scalar> w;
  std::optional<Choice> choice = hopeful_window<Scalar>(ps, opts, floor, ws, times, note);
  if (!choice) return std::nullopt;
  w.choice = std::move(*choice);
  try {
    w.fits = fit_choice<Scalar>(ps, w.choice, fitter, times);
  } catch (const SingularBasisError& e) {
    // The fit's double LU can find a block singular that ranking, to a few digits, did not.
    note = message("no shared window is usable (", e.what(), ")");
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

/// Auto: the shared window when it meets the budget, else per-product pivoting, saying why.
template <typename Scalar>
BD_COLD Outcome<Scalar> run_auto(const std::vector<FactoredProduct>& ps, const std::vector<double>& floors, const Options& opts,
                         const FitFunction<Scalar>& fitter, Workspace& ws) {
  Outcome<Scalar> out;
  double floor = 0;
  for (double f : floors) floor += f / static_cast<double>(floors.size());
  std::string window_note;
  if (auto window = shared_window_within_budget<Scalar>(ps, opts, floor, fitter, ws, out.times, window_note))
    return std::move(*window);
  {
    PhaseTimer timer(out.times.score);
    out.choice = choose_pivoted(ps, ws);
  }
  out.fits = fit_choice<Scalar>(ps, out.choice, fitter, out.times);
  const double nmse = mean_nmse(ps, out.fits);
  out.reason = message("auto: ", window_note, ", over the budget ", sci(opts.error_budget), "x the ", scalar_traits<Scalar>::name,
                       " rounding floor ", sci(floor), "; fell back to the per-product pivoted basis: NMSE ", sci(nmse), " = ",
                       sci(nmse / floor), "x the floor", nmse <= opts.error_budget * floor ? "" : " (still over budget: the most accurate choice)");
  return out;
}

/// Ranks, chooses and fits the basis `opts.basis` asks for.
template <typename Scalar>
BD_COLD Outcome<Scalar> run_strategy(const std::vector<FactoredProduct>& ps, const std::vector<double>& floors, const Options& opts,
                             const FitFunction<Scalar>& fitter, Workspace& ws) {
  if (opts.basis == Basis::Auto) return run_auto<Scalar>(ps, floors, opts, fitter, ws);
  const Index m = ps.front().m(), r = ps.front().r();
  Outcome<Scalar> out;
  {
    PhaseTimer timer(out.times.score);
    out.choice = opts.basis == Basis::Pivoted ? choose_pivoted(ps, ws) : require_window(ps, opts.basis, opts, ws);
  }
  out.fits = fit_choice<Scalar>(ps, out.choice, fitter, out.times);
  out.reason = message(to_string(opts.basis), ": ", describe(out.choice, m, r), " (", out.choice.tried,
                       " candidates ranked, ", out.choice.skipped, " singular skipped)");
  return out;
}

/// The instantiations bd::compiled holds: the ranking stages (src/compiled_ranking.cpp) and the
/// strategies for every stored type (src/compiled_strategy.cpp).
#define BD_RUN_STRATEGY(prefix, S)                                                                                   \
  prefix Outcome<S> run_strategy<S>(const std::vector<FactoredProduct>&, const std::vector<double>&, const Options&, \
                                    const FitFunction<S>&, Workspace&);
#define BD_STRATEGY_INSTANTIATIONS(prefix)                                                                              \
  prefix void rank_usable<>(const std::vector<FactoredProduct>&, Index, WindowRanking&);                               \
  prefix WindowRanking rank_windows<>(const std::vector<FactoredProduct>&, Basis, const Options&, Workspace&);         \
  prefix std::optional<Choice> choose_window<>(const std::vector<FactoredProduct>&, Basis, const Options&, Workspace&, \
                                               std::string&);                                                         \
  prefix Choice require_window<>(const std::vector<FactoredProduct>&, Basis, const Options&, Workspace&);              \
  prefix Choice choose_pivoted<>(const std::vector<FactoredProduct>&, Workspace&);
#define BD_RUN_STRATEGY_INSTANTIATIONS(prefix) \
  BD_RUN_STRATEGY(prefix, double)              \
  BD_RUN_STRATEGY(prefix, float)               \
  BD_RUN_STRATEGY(prefix, Eigen::half)         \
  BD_RUN_STRATEGY(prefix, Eigen::bfloat16)
#ifdef BD_COMPILED_LIB
BD_STRATEGY_INSTANTIATIONS(extern template)
BD_RUN_STRATEGY_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::detail
