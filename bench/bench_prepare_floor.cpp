// prepare-floor/<strategy>/deepseek-v2-lite: the floor under prepare/<strategy>/deepseek-v2-lite
// (bench_prepare.cpp) — only the products preparation must compute for every one of the 864
// products (QK and VO of 27 layers × 16 heads, m = 512, n = 2048, r = 128, stored in f16), each
// timed on bd's kernel at its shape, with the same threads and the same split of products over
// them (one layer's 16 products at a time, dynamically scheduled), on the same weights. Nothing
// else: no gathers, casts, rounding, checks or bookkeeping. Counters: elapsed seconds per phase.
//
//   factor  the Cholesky QR of U (UᵀU and U·R⁻¹ on R⁻¹'s triangle, double), G = VᵀV and U·G
//           for the row norms (float)
//   score   first, last: one window's float LU and inverse; residual-min two; offset-search
//           the sketched LU and solve of every window (25) and 4 exact inverses; pivoted
//           F = U·L (double) and QR with column pivoting of Fᵀ (float), one exact inverse;
//           auto: its screen (every window's exact inverse on 4 of a set's 16 products, which
//           rule the shared window out here), then pivoted's
//   fit     Q_S's double LU and inverse; B = U_S·Vᵀ, ΔB·V and ΔB·ΔBᵀ in float blocks of 256;
//           the refit's five r×r×r double products and B̂B̂ᵀ's inverse; C = Q_R·T
//   error   D̂ = Ĉ·U_S (double) and the [D̂ Ĉ] Gram (float)
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include <bd/bd.hpp>
#include <bd/kernel/inverse.hpp>
#include <bd/kernel/matmul.hpp>
#include <bd/kernel/pivoted_qr.hpp>
#include <bd/kernel/small_lu.hpp>
#include "deepseek_layers.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using Eigen::MatrixXd;
using Eigen::MatrixXf;
using bd::Index;

/// One thread's operands and results, at the shapes of one product (row form: U m×r, V n×r).
struct Scratch {
  MatrixXd F, gram, Rinv, Q, QS, QSinv, US, QR, C, T, Ch, Dh, small[4], Linv, inv;
  MatrixXf Gf, UG, USf, Bb, dBb, dBV, dBdBt, X, XtX, QSf, inv_f, Y;
  bd::kernel::SmallLU<double> lu;
  bd::kernel::SmallLU<float> lu_f;
  bd::kernel::ColumnPivots<float> pivots;
  Eigen::LLT<MatrixXd> llt;
};

Scratch make_scratch(Index m, Index r) {
  Scratch s;
  s.gram.resize(r, r), s.Q.resize(m, r), s.QSinv.resize(r, r), s.C.resize(m - r, r), s.T = MatrixXd::Random(r, r);
  s.Rinv = MatrixXd::Random(r, r).triangularView<Eigen::Upper>();
  s.QS = MatrixXd::Random(r, r) + 4 * MatrixXd::Identity(r, r);
  s.US = MatrixXd::Random(r, r), s.QR = MatrixXd::Random(m - r, r), s.Ch = MatrixXd::Random(m - r, r);
  s.Dh.resize(m - r, r);
  for (auto& x : s.small) x = MatrixXd::Random(r, r);
  s.Gf.resize(r, r), s.UG.resize(m, r), s.USf = MatrixXf::Random(r, r);
  s.dBV.resize(r, r), s.dBdBt.resize(r, r), s.X = MatrixXf::Random(m - r, 2 * r), s.XtX.resize(2 * r, 2 * r);
  s.QSf = MatrixXf::Random(r, r) + 4 * MatrixXf::Identity(r, r), s.Y.resize(r, 8);
  const MatrixXd spd = s.small[0] * s.small[0].transpose() + r * MatrixXd::Identity(r, r);
  s.llt.compute(spd);
  return s;
}

enum class Ranking { first, residual_min, offset_search, pivoted, automatic };

/// What ranking computes per product for a strategy (see the file comment).
void score(Scratch& s, const MatrixXd& U, Ranking ranking, Index m, Index r, bool screened, bd::Workspace& ws) {
  const MatrixXf sketch = MatrixXf::Ones(r, 8);
  const auto exact = [&] {
    s.lu_f.compute(s.QSf);
    s.lu_f.inverse_into(s.inv_f, ws);
  };
  const auto sketched = [&] {
    s.lu_f.compute(s.QSf);
    s.Y = s.lu_f.solve(sketch);
  };
  const Index windows = (m - r) / 16 + 1;  // align 16: 25 windows at m = 512, r = 128
  const auto offset_search = [&] {
    for (Index w = 0; w < windows; ++w) sketched();
    for (int k = 0; k < 4; ++k) exact();
  };
  const auto pivoted = [&] {
    MatrixXd& Ft = s.F;  // Fᵀ = Lᵀ·Uᵀ (r×m), pivoted in float
    Ft.resize(r, m);
    bd::kernel::matmul_into(s.small[1], U.transpose(), Ft, ws);
    s.pivots.compute(Ft, r);
    exact();
  };
  switch (ranking) {
    case Ranking::first: exact(); break;
    case Ranking::residual_min: exact(), exact(); break;
    case Ranking::offset_search: offset_search(); break;
    case Ranking::pivoted: pivoted(); break;
    case Ranking::automatic:
      if (screened)
        for (Index w = 0; w < windows; ++w) exact();
      pivoted();
      break;
  }
}

void factor(Scratch& s, const MatrixXd& U, const MatrixXf& Uf, const MatrixXf& Vf, bd::Workspace& ws) {
  bd::kernel::gram_into(U, s.gram, ws);
  s.Q.resize(U.rows(), U.cols());
  bd::kernel::matmul_upper_into(U, s.Rinv, s.Q, ws);
  bd::kernel::gram_into(Vf, s.Gf, ws);
  bd::kernel::matmul_into(Uf, s.Gf, s.UG, ws);
}

void fit(Scratch& s, const MatrixXf& Vf, bd::Workspace& ws) {
  s.lu.compute(s.QS);
  s.lu.inverse_into(s.QSinv, ws);
  const Index n = Vf.rows(), r = Vf.cols(), block = bd::basis_block;
  for (Index j0 = 0; j0 < n; j0 += block) {
    const Index w = std::min(block, n - j0);
    const auto Vb = Vf.middleRows(j0, w);
    s.Bb.resize(r, w);
    bd::kernel::matmul_into(s.USf, Vb.transpose(), s.Bb, ws);
    s.dBb = s.Bb;  // stands for ΔB (rounding is not a product)
    bd::kernel::matmul_into(s.dBb, Vb, s.dBV, ws);
    bd::kernel::gram_into(s.dBb.transpose(), s.dBdBt, ws);
  }
  MatrixXd& out = s.small[3];
  for (int k = 0; k < 5; ++k) bd::kernel::matmul_into(s.small[k % 3], s.small[(k + 1) % 3], out, ws);
  bd::kernel::inverse_into(s.llt, s.inv, ws);
  bd::kernel::matmul_into(s.QR, s.T, s.C, ws);
}

void error(Scratch& s, bd::Workspace& ws) {
  bd::kernel::matmul_into(s.Ch, s.US, s.Dh, ws);
  bd::kernel::gram_into(s.X, s.XtX, ws);
}

int thread_number() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/// Elapsed seconds of one pass over a set's products, dynamically scheduled like preparation's.
template <typename Body>
double pass(Index count, Body&& body) {
  const auto start = std::chrono::steady_clock::now();
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic)
#endif
  for (Index h = 0; h < count; ++h) body(h);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void floor(benchmark::State& state, Ranking ranking) {
  const Index m = synthetic::DeepSeekV2Lite::latent, r = synthetic::DeepSeekV2Lite::head_dim;
  bd::Workspace ws;
  std::vector<Scratch> per_thread(static_cast<std::size_t>(bd::max_threads()), make_scratch(m, r));
  double factor_s = 0, score_s = 0, fit_s = 0, error_s = 0;
  for (auto _ : state) {
    factor_s = score_s = fit_s = error_s = 0;
    for (const auto& layer : bd_bench::v2_lite_layers()) {
      for (int side = 0; side < 2; ++side) {  // QK (basis side uk, n-side q), then VO (uv, o)
        const auto& Us = side == 0 ? layer.uk : layer.uv;
        const auto& Vs = side == 0 ? layer.q : layer.o;
        const Index heads = static_cast<Index>(Us.size());
        state.PauseTiming();
        std::vector<MatrixXd> Ud(Us.size());
        for (std::size_t h = 0; h < Us.size(); ++h) Ud[h] = Us[h].cast<double>();
        state.ResumeTiming();
        const auto mine = [&]() -> Scratch& { return per_thread[static_cast<std::size_t>(thread_number())]; };
        factor_s += pass(heads, [&](Index h) {
          const auto i = static_cast<std::size_t>(h);
          factor(mine(), Ud[i], Us[i], Vs[i], ws);
        });
        score_s += pass(heads, [&](Index h) {
          score(mine(), Ud[static_cast<std::size_t>(h)], ranking, m, r, h < heads / 4, ws);
        });
        fit_s += pass(heads, [&](Index h) { fit(mine(), Vs[static_cast<std::size_t>(h)], ws); });
        error_s += pass(heads, [&](Index) { error(mine(), ws); });
      }
    }
  }
  state.counters["products"] = 2.0 * bd_bench::v2_lite_layers().size() * bd_bench::v2_lite_layers().front().q.size();
  state.counters["factor_s"] = factor_s;
  state.counters["score_s"] = score_s;
  state.counters["fit_s"] = fit_s;
  state.counters["error_s"] = error_s;
  state.counters["floor_s"] = factor_s + score_s + fit_s + error_s;
}

void register_all() {
  const std::pair<const char*, Ranking> strategies[] = {{"first", Ranking::first},
                                                        {"residual-min", Ranking::residual_min},
                                                        {"offset-search", Ranking::offset_search},
                                                        {"pivoted", Ranking::pivoted},
                                                        {"auto", Ranking::automatic}};
  for (const auto& [name, ranking] : strategies) {
    const Ranking k = ranking;
    benchmark::RegisterBenchmark((std::string("prepare-floor/") + name + "/deepseek-v2-lite").c_str(),
                                 [k](benchmark::State& s) { floor(s, k); })
        ->Unit(benchmark::kSecond)
        ->Iterations(1)
        ->UseRealTime();
  }
}

const int registered = (register_all(), 0);

}  // namespace
