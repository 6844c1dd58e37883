// bd::kernel::flash_attention equals softmax(Q·Kᵀ·scale [+ Qr·Krᵀ·scale], masked)·V computed
// plainly in double, head by head with the whole score matrix, for every edge its tiling makes:
// query rows and keys not multiples of the tiles, several key blocks, causal blocks skipped and
// the diagonal masked, grouped heads stacked into one task (GQA, MQA, all heads against one
// latent), a query offset (chunked prefill, decoding), widths not multiples of NR — in float and
// double, on every micro-kernel this CPU runs, and with scores of ±1e4, where a softmax without
// its running maximum overflows; the keys streamed over several calls equal one call; and a call
// of a shape the workspace has seen allocates nothing (decoding allocates no scratch per token).
// Keys and values may lie in a cache with spare rows past the last key (ldk > Lk, ldv > Lk, the two
// apart), which hold NaN here: a tile that reads keys or values in place (AVX-512) past a run, or
// at the wrong stride, shows; and the values may be the keys' first channels (absorbed MLA's
// latent is both).
#include <bd/kernel/flash_attention.hpp>

#include <limits>
#include <map>

#include "allocation_counter.hpp"
#include "support.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using bd::kernel::AttentionArguments;
using bd::kernel::Compute;
using Eigen::Index;
using Eigen::MatrixXd;

struct Shape {
  Index Lq, Lk, n_q, n_k, n_v, d_qk, d_rope, d_v;
  bool causal;
  Index first = 0;
  double spread = 1;  ///< scales the queries: scores of order spread²·d
  Index pad = 0;      ///< K and k_rope lie Lk + pad rows apart, V Lk + 2·pad (a cache's spare capacity, NaN)
  bool values_are_keys = false;  ///< V is K's first d_v channels, read from K (n_k = n_v = 1, d_v ≤ d_qk)
};

/// The plain computation, in double: one head at a time, the whole score matrix.
MatrixXd reference(const Shape& s, const MatrixXd& Q, const MatrixXd& Qr, const MatrixXd& K, const MatrixXd& Kr,
                   const MatrixXd& V, double scale) {
  MatrixXd O(s.Lq, s.n_q * s.d_v);
  for (Index h = 0; h < s.n_q; ++h) {
    const Index kh = h * s.n_k / s.n_q, vh = h * s.n_v / s.n_q;
    MatrixXd S = Q.middleCols(h * s.d_qk, s.d_qk) * K.middleCols(kh * s.d_qk, s.d_qk).transpose();
    if (s.d_rope) S += Qr.middleCols(h * s.d_rope, s.d_rope) * Kr.transpose();
    S *= scale;
    for (Index i = 0; i < s.Lq; ++i) {
      const Index visible = s.causal ? std::min(s.Lk, s.first + i + 1) : s.Lk;
      const double top = S.row(i).head(visible).maxCoeff();
      S.row(i).head(visible) = (S.row(i).head(visible).array() - top).exp().matrix();
      S.row(i).tail(s.Lk - visible).setZero();
      S.row(i) /= S.row(i).sum();
    }
    O.middleCols(h * s.d_v, s.d_v) = S * V.middleCols(vh * s.d_v, s.d_v);
  }
  return O;
}

/// x rounded to bfloat16, in double.
template <typename M>
MatrixXd bf16_rounded(const M& x) {
  return x.template cast<float>().template cast<Eigen::bfloat16>().template cast<double>();
}

/// flash_attention's output on seeded inputs of shape s (threads: 0 for all), and its relative
/// error against the plain computation — for bf16 compute, the plain computation of the rounded
/// operands (the queries rounded once scaled, as the kernel rounds them), relative to max|v|, the
/// scale by which rounding P's weights moves an output.
template <typename T>
std::pair<MatrixXd, double> attend(const Shape& s, unsigned seed, int threads, Compute compute = Compute::F32) {
  using M = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
  const M Q = (bd_test::gaussian(s.Lq, s.n_q * s.d_qk, seed) * s.spread).cast<T>();
  const M Qr = (bd_test::gaussian(s.Lq, s.n_q * s.d_rope, seed + 1) * s.spread).cast<T>();
  // K, k_rope and V with `pad` rows of NaN below their Lk keys: a read past a key's run shows.
  const auto padded = [&](Index cols, unsigned from) {
    M X = M::Constant(s.Lk + s.pad, cols, std::numeric_limits<T>::quiet_NaN());
    X.topRows(s.Lk) = bd_test::gaussian(s.Lk, cols, from).cast<T>();
    return X;
  };
  const M K = padded(s.n_k * s.d_qk, seed + 2), Kr = padded(s.d_rope, seed + 3);
  const Index ld = s.Lk + s.pad;
  M V = M::Constant(s.Lk + 2 * s.pad, s.n_v * s.d_v, std::numeric_limits<T>::quiet_NaN());
  V.topRows(s.Lk) = s.values_are_keys ? M(K.topLeftCorner(s.Lk, s.d_v)) : M(bd_test::gaussian(s.Lk, s.n_v * s.d_v, seed + 4).cast<T>());
  const double scale = 1.0 / std::sqrt(double(s.d_qk + s.d_rope));
  AttentionArguments<T> a;
  a.q_len = s.Lq, a.k_len = s.Lk, a.n_q = s.n_q, a.n_k = s.n_k, a.n_v = s.n_v;
  a.d_qk = s.d_qk, a.d_rope = s.d_rope, a.d_v = s.d_v;
  a.q = Q.data(), a.ldq = s.Lq, a.qr = Qr.data(), a.ldqr = s.Lq;
  a.k = K.data(), a.ldk = ld, a.kr = Kr.data(), a.ldkr = ld;
  a.v = s.values_are_keys ? K.data() : V.data(), a.ldv = s.values_are_keys ? ld : V.rows();
  a.values_are_keys = s.values_are_keys;
  M O = M::Constant(s.Lq, s.n_q * s.d_v, T(7));
  a.out = O.data(), a.ldo = s.Lq;
  a.scale = T(scale), a.causal = s.causal, a.first_query_position = s.first;
  a.compute = compute;
  bd::kernel::flash_attention(a, threads);
  const MatrixXd expected =
      compute == Compute::BF16
          ? reference(s, bf16_rounded(M(Q * T(scale))), bf16_rounded(M(Qr * T(scale))), bf16_rounded(K.topRows(s.Lk)),
                      bf16_rounded(Kr.topRows(s.Lk)), bf16_rounded(V.topRows(s.Lk)), 1.0)
          : reference(s, Q.template cast<double>(), Qr.template cast<double>(), K.topRows(s.Lk).template cast<double>(),
                      Kr.topRows(s.Lk).template cast<double>(), V.topRows(s.Lk).template cast<double>(), double(T(scale)));
  const MatrixXd got = O.template cast<double>();
  // PropagateNaN: Eigen's default maximum may skip a NaN, and a read of the NaN spare rows must show.
  const double size = compute == Compute::BF16 ? double(V.topRows(s.Lk).cwiseAbs().maxCoeff()) : expected.cwiseAbs().maxCoeff();
  return {got, (got - expected).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() / size};
}

/// Seeded float inputs of shape s and the call that reads them (scale 0.2, causal from s.first),
/// writing into `out`: the streaming and allocation tests' setup.
struct FloatCall {
  using M = Eigen::MatrixXf;
  M Q, Qr, K, Kr, V;
  explicit FloatCall(const Shape& s)
      : Q(bd_test::gaussian(s.Lq, s.n_q * s.d_qk, 1).cast<float>()),
        Qr(bd_test::gaussian(s.Lq, s.n_q * s.d_rope, 2).cast<float>()),
        K(bd_test::gaussian(s.Lk, s.n_k * s.d_qk, 3).cast<float>()),
        Kr(bd_test::gaussian(s.Lk, s.d_rope, 4).cast<float>()),
        V(bd_test::gaussian(s.Lk, s.n_v * s.d_v, 5).cast<float>()) {}
  AttentionArguments<float> arguments(const Shape& s, M& out) const {
    AttentionArguments<float> a;
    a.q_len = s.Lq, a.k_len = s.Lk, a.n_q = s.n_q, a.n_k = s.n_k, a.n_v = s.n_v, a.d_qk = s.d_qk, a.d_rope = s.d_rope,
    a.d_v = s.d_v;
    a.q = Q.data(), a.ldq = s.Lq, a.qr = Qr.data(), a.ldqr = s.Lq, a.k = K.data(), a.ldk = s.Lk, a.kr = Kr.data(),
    a.ldkr = s.Lk, a.v = V.data(), a.ldv = s.Lk, a.out = out.data(), a.ldo = s.Lq;
    a.scale = 0.2f, a.causal = true, a.first_query_position = s.first;
    return a;
  }
};

template <typename T>
double run(const Shape& s, unsigned seed) {
  return attend<T>(s, seed, 0).second;
}

// The outputs are convex combinations of V's rows (|V| ≲ 4): the error is the scores' rounding
// (d·u·|q||k| relative, times the score's size in the exponent) plus the sums' (Lk·u). With
// unit Gaussians, d ≤ 80 and Lk ≤ 70 000 the worst seen (every ISA of a Zen 5) is 1.3e-6 in float
// and 1.4e-14 in double, the latter at 70 000 keys, where the sums' Lk·u term leads.
constexpr double kFloat = 1e-5, kDouble = 1e-13;

const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 8, 0, 8, false},             // one query, one key
    {5, 7, 2, 2, 2, 8, 0, 5, false},             // smaller than every tile
    {70, 70, 3, 3, 3, 16, 0, 13, true},          // causal, odd widths
    {600, 600, 2, 2, 2, 16, 8, 12, true},        // causal, each head's rows in three or more tasks (≤ 256 rows each)
    {150, 300, 4, 2, 2, 16, 0, 16, true, 150},   // GQA 2:1, 300 rows a group: a task's rows run from one head into the next
    {130, 700, 2, 2, 2, 24, 8, 20, true, 570},   // chunked prefill: queries at 570…699, several key blocks
    {33, 400, 8, 2, 2, 16, 0, 16, true, 367},    // GQA 4:1, the group's rows stacked
    {1, 513, 16, 1, 1, 64, 16, 64, true, 512},   // absorbed decoding: 16 heads against one latent
    {3, 300, 4, 4, 1, 12, 4, 12, false},         // K per head, V shared (BD's QK, dense VO)
    {200, 200, 4, 1, 4, 12, 0, 12, true},        // the other way round
    // Few rows per key/value head (flash_attention_few_rows: K and V read in place):
    {1, 9000, 2, 2, 2, 24, 8, 16, true, 8999},   // decoding one token per head over three key blocks
    {1, 900, 8, 2, 2, 16, 0, 12, true, 899},     // GQA 4:1 decoding: four rows against one key head
    {3, 40, 2, 2, 2, 8, 4, 8, true, 10},         // three queries at 10…12 over 40 keys: masked inside a block
    {2, 1300, 4, 1, 1, 20, 4, 20, false},        // MQA, not causal, two queries per head: 8 rows, two sweeps
    {3, 6000, 2, 1, 1, 21, 3, 9, true, 5997},    // 6 rows, 24 channels (not a multiple of 4 with d_qk 21)
                                                 // over key blocks of 2720 (in L2 for two sweeps)
    // Keys split into chunks of 1024, each its own task, merged (few row blocks, many keys):
    {1, 5000, 32, 1, 1, 32, 8, 32, true, 4999},  // absorbed decoding: 32 heads, five chunks, the last partial
    {2, 4500, 64, 1, 1, 16, 0, 16, true, 1500},  // queries at 1500, 1501: chunks 2…4 after every row (no key seen)
    {3, 3000, 8, 2, 2, 16, 4, 12, false},        // two groups of 12 rows, not causal, three chunks
    {1, 70000, 16, 1, 1, 8, 0, 8, true, 69999},  // past 64 chunks of 1024: 64 chunks of 1094 keys
    // Keys and values in a cache with spare rows (NaN) past the last key: runs read ldk apart
    {1, 3001, 64, 1, 1, 24, 8, 24, true, 3000, 1, 999},  // absorbed decoding, three chunks, keys read in place
    {1, 3001, 64, 1, 1, 24, 8, 20, true, 3000, 1, 17, true},  // the same with the values the latent's first channels
    {70, 900, 8, 1, 1, 32, 8, 32, true, 830, 1, 3, true},     // an absorbed chunk: values are keys, several key blocks
    {40, 300, 4, 2, 2, 16, 4, 12, true, 260, 1, 13},     // a chunk's prefill, two key heads, odd strides
    {2, 700, 2, 2, 2, 16, 4, 8, true, 698, 1, 5},        // few rows per head: K and V read in place there too
};

}  // namespace

TEST_CASE("flash attention equals the plain softmax(Q·Kᵀ)·V in float and double on every ISA", "[kernel][flash]") {
  bd_test::for_each_isa([&] {
    unsigned seed = 1;
    for (const Shape& s : kShapes) {
      INFO("Lq " << s.Lq << ", Lk " << s.Lk << ", heads " << s.n_q << "/" << s.n_k << "/" << s.n_v << ", causal "
                 << s.causal << " from " << s.first);
      CHECK(run<float>(s, seed) <= kFloat);
      CHECK(run<double>(s, seed) <= kDouble);
      seed += 10;
    }
  });
}

TEST_CASE("flash attention: the online softmax stays exact with scores of ±1e4", "[kernel][flash]") {
  bd_test::for_each_isa([&] {
    // q scaled by 40 over d = 64 makes scores of order ±1e4: e^score overflows any float, and
    // each key block's maximum differs from the last by thousands (rescaling underflows to 0).
    for (const Shape& s : {Shape{40, 500, 2, 2, 2, 64, 0, 16, true, 460, 40.0}, Shape{1, 1500, 2, 2, 2, 64, 0, 16, true, 1499, 40.0}}) {
      const double e32 = run<float>(s, 3), e64 = run<double>(s, 3);
      INFO(s.Lq << " queries: float " << e32 << ", double " << e64);
      // The scores themselves round at |score|·u ≈ 1e4·6e-8 in float: softmax weights err by about
      // that much relative, so the bound is 1e-3 there; double keeps 1e-9.
      CHECK(e32 <= 1e-3);
      CHECK(e64 <= 1e-9);
    }
  });
}

TEST_CASE("flash attention gives the same result on one thread and on all", "[kernel][flash]") {
  // Each (head, row block) task runs whole on one thread, in the same order of key blocks, and
  // keys are split into chunks by the shape alone: the partition of tasks over threads changes
  // nothing, to the bit. The second shape has several row blocks per head, the third splits its
  // keys (absorbed decoding).
  bd_test::for_each_isa([&] {
    for (const Shape& s : {Shape{100, 300, 4, 2, 2, 16, 8, 16, true, 200}, Shape{700, 700, 2, 2, 2, 16, 8, 16, true},
                           Shape{1, 4000, 48, 1, 1, 32, 8, 32, true, 3999}}) {
      const auto [one, one_error] = attend<float>(s, 9, 1);
      const auto [all, all_error] = attend<float>(s, 9, 0);
      CHECK(one_error <= kFloat);
      CHECK(all_error <= kFloat);
      CHECK(one == all);
    }
  });
#ifdef _OPENMP
  if (omp_get_max_threads() < 2) WARN("one thread available: the comparison ran one thread twice");
#else
  WARN("built without OpenMP: the comparison ran one thread twice");
#endif
}

TEST_CASE("flash attention streamed over key blocks in several calls equals one call", "[kernel][flash]") {
  bd_test::for_each_isa([&] {
    // A chunk of 20 queries at positions 280…299 over 300 keys given in blocks of 7, 100, 150 and
    // 43 (the last block is partly after the first queries: causal masking across calls); and 2
    // queries, 4 rows per key head (the few-row path).
    for (const Shape& s : {Shape{20, 300, 4, 2, 2, 16, 8, 12, true, 280}, Shape{2, 300, 4, 2, 2, 16, 8, 12, true, 298}}) {
    using M = Eigen::MatrixXf;
    const FloatCall in(s);
    const M &K = in.K, &Kr = in.Kr, &V = in.V;
    M whole(s.Lq, s.n_q * s.d_v), streamed = M::Zero(s.Lq, s.n_q * s.d_v);
    AttentionArguments<float> a = in.arguments(s, whole);
    bd::kernel::flash_attention(a);
    std::vector<float> row_max(std::size_t(s.n_q * s.Lq), -std::numeric_limits<float>::infinity()), row_sum(row_max.size(), 0.f);
    a.out = streamed.data(), a.row_max = row_max.data(), a.row_sum = row_sum.data();
    Index k0 = 0;
    for (const Index n : {7, 100, 150, 43}) {
      a.k = K.data() + k0, a.kr = Kr.data() + k0, a.v = V.data() + k0, a.k_len = n, a.first_key_position = k0;
      bd::kernel::flash_attention(a);
      k0 += n;
    }
    bd::kernel::flash_attention_finish(a);
    const double err = (streamed - whole).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() / whole.cwiseAbs().maxCoeff();
    INFO(s.Lq << " queries, streamed against one call: " << err);
    CHECK(err <= 1e-6);
    }
  });
}

TEST_CASE("flash attention allocates nothing for a shape its workspace has seen: decoding allocates no scratch per token",
          "[kernel][flash]") {
  if (!bd_test::counts_allocations()) {
    WARN("built with AddressSanitizer, which owns operator new: allocations are counted in the Release build");
    return;
  }
  bd_test::for_each_isa([&] {
    // A decoded token (one row per head, the few-row path), a prefill chunk (the tiles) and an
    // absorbed token (32 heads against one latent: the keys split), on all threads: the first
    // call sizes the workspace's scratch, the next ones only read it.
    for (const Shape& s : {Shape{1, 3000, 4, 4, 4, 16, 8, 16, true, 2999}, Shape{40, 300, 4, 2, 2, 16, 8, 16, true, 260},
                           Shape{1, 3000, 32, 1, 1, 16, 8, 16, true, 2999}}) {
      using M = Eigen::MatrixXf;
      const FloatCall in(s);
      M O(s.Lq, s.n_q * s.d_v);
      const AttentionArguments<float> a = in.arguments(s, O);
      bd::Workspace ws;
      const long before_first = bd_test::allocations();
      bd::kernel::flash_attention(a, 0, ws);
      const long first = bd_test::allocations() - before_first;
      const M once = O;
      const long before = bd_test::allocations();
      for (int token = 0; token < 5; ++token) bd::kernel::flash_attention(a, 0, ws);
      const long later = bd_test::allocations() - before;
      INFO(s.Lq << " queries: the first call allocated " << first << " times, five more " << later << " times");
      CHECK(first > 0);  // the counter sees the scratch being made
      CHECK(later == 0);
      CHECK(O == once);
    }
  });
}

// bf16 compute (AttentionArguments::compute): the tiled path multiplies the scaled queries, the
// keys, the softmax's weights P and the values rounded once to bfloat16, summing in float, the
// running softmax in float; the few-row path reads the cache in float whatever the request.

namespace {

/// Shapes of the tiled path: odd widths and depths (a pair's missing half), the causal diagonal
/// cutting a block after an odd number of keys, several key blocks, GQA stacked, values shared,
/// keys split into chunks (absorbed decoding), the values the latent's first channels in a cache
/// with spare NaN rows (bf16 packs them: nothing is read in place).
const Shape kBf16Shapes[] = {
    {70, 70, 3, 3, 3, 15, 0, 13, true},
    {130, 700, 2, 2, 2, 24, 7, 19, true, 570},
    {33, 400, 8, 2, 2, 16, 0, 16, true, 367},
    {50, 301, 4, 1, 4, 12, 0, 12, false},
    {1, 5000, 32, 1, 1, 33, 6, 31, true, 4999},
    {1, 3001, 64, 1, 1, 24, 8, 20, true, 3000, 1, 17, true},
};

}  // namespace

TEST_CASE("bf16 attention: equal scores over integer values give the exact mean of the rounded values on every path",
          "[kernel][flash][bf16]") {
  // Queries of zeros make every visible score 0 and every weight e⁰ = 1 exactly (every rescaling
  // and merge weight too), so the output is Σ bf16(v) / n, summed exactly in float (integers below
  // 2²⁴), then divided: within two roundings of it. Values are integers 4m + 1 in 257…509, halfway
  // between two of bfloat16's (8 bits: steps of 2 there), which rounds each down to 4m: float
  // arithmetic on the unrounded values would give a mean 1 higher, far past two roundings.
  for (const Shape& s : kBf16Shapes) {
    INFO("Lq " << s.Lq << ", Lk " << s.Lk << ", heads " << s.n_q << "/" << s.n_k << "/" << s.n_v);
    const Index ld = s.Lk + s.pad;
    Eigen::MatrixXf Q = Eigen::MatrixXf::Zero(s.Lq, s.n_q * s.d_qk), Qr = Eigen::MatrixXf::Zero(s.Lq, s.n_q * s.d_rope);
    Eigen::MatrixXf K = bd_test::gaussian(ld, s.n_k * s.d_qk, 3).cast<float>(), Kr = bd_test::gaussian(ld, s.d_rope, 4).cast<float>();
    Eigen::MatrixXf V(ld, s.n_v * s.d_v);
    for (Index i = 0; i < V.size(); ++i) V.data()[i] = float(257 + 4 * ((i * 7919) % 64));
    if (s.values_are_keys) K.leftCols(s.d_v) = V.leftCols(s.d_v);
    const Eigen::MatrixXf& values = s.values_are_keys ? K : V;
    Eigen::MatrixXf O(s.Lq, s.n_q * s.d_v);
    AttentionArguments<float> a;
    a.q_len = s.Lq, a.k_len = s.Lk, a.n_q = s.n_q, a.n_k = s.n_k, a.n_v = s.n_v, a.d_qk = s.d_qk, a.d_rope = s.d_rope,
    a.d_v = s.d_v;
    a.q = Q.data(), a.ldq = s.Lq, a.qr = Qr.data(), a.ldqr = s.Lq, a.k = K.data(), a.ldk = ld, a.kr = Kr.data(), a.ldkr = ld;
    a.v = values.data(), a.ldv = ld, a.values_are_keys = s.values_are_keys, a.out = O.data(), a.ldo = s.Lq;
    a.scale = 0.125f, a.causal = s.causal, a.first_query_position = s.first;
    MatrixXd exact(s.Lq, s.n_q * s.d_v);
    for (Index h = 0; h < s.n_q; ++h)
      for (Index i = 0; i < s.Lq; ++i) {
        const Index n = s.causal ? std::min(s.Lk, s.first + i + 1) : s.Lk;
        for (Index c = 0; c < s.d_v; ++c)
          exact(i, h * s.d_v + c) = bf16_rounded(values.block(0, (h * s.n_v / s.n_q) * s.d_v + c, n, 1)).sum() / double(n);
      }
    const auto off = [&] { return ((O.cast<double>() - exact).cwiseAbs().array() / exact.array()).maxCoeff<Eigen::PropagateNaN>(); };
    bd_test::for_each_bf16_path([&] {
      a.compute = Compute::BF16;
      bd::kernel::flash_attention(a);
      CHECK(off() <= std::ldexp(1.0, -22));  // 1/n and the product each rounded once
      a.compute = Compute::F32;
      bd::kernel::flash_attention(a);
      CHECK(off() > std::ldexp(1.0, -20));
    });
  }
}

TEST_CASE("bf16 attention: the softmax of the rounded operands within P's rounding, the same bits by vdpbf16ps and FMAs",
          "[kernel][flash][bf16]") {
  // Rounding P's weights (2⁻⁹ relative each) moves an output, a convex combination of values, by
  // at most 2⁻⁹·max|v|; the float sums add ~1e-6. Across methods on one instruction set the
  // products are the same (vdpbf16ps adds a pair's odd product, then its even one; the FMA path
  // packs each pair swapped) and so is every other step: the same bits.
  unsigned seed = 1;
  for (const Shape& s : kBf16Shapes) {
    INFO("Lq " << s.Lq << ", Lk " << s.Lk << ", heads " << s.n_q << "/" << s.n_k << "/" << s.n_v);
    std::map<bd::kernel::Isa, MatrixXd> first;  // each instruction set's first method's output
    bd_test::for_each_bf16_path([&] {
      const auto [got, error] = attend<float>(s, seed, 0, Compute::BF16);
      CHECK(error <= std::ldexp(1.0, -9) * 1.25);
      const auto [at, fresh] = first.emplace(bd::kernel::active_isa(), got);
      if (!fresh) CHECK((got - at->second).cwiseAbs().maxCoeff() == 0.0);
      CHECK(attend<float>(s, seed, 1, Compute::BF16).first == got);  // one thread and all
      CHECK(attend<float>(s, seed, 0).first != got);                 // f32 differs: the request was honoured
    });
    seed += 10;
  }
}

TEST_CASE("bf16 attention: few rows per key head read the cache in float, and f64 arithmetic is refused by name",
          "[kernel][flash][bf16]") {
  const Shape decode{1, 900, 8, 2, 2, 16, 0, 12, true, 899};  // four rows per key head: the few-row path
  CHECK(attend<float>(decode, 5, 0, Compute::F32).first == attend<float>(decode, 5, 0, Compute::BF16).first);
  const Shape prefill{40, 40, 2, 2, 2, 8, 0, 8, true};
  BD_CHECK_THROWS_CONTAINING(attend<double>(prefill, 5, 0, Compute::BF16), bd::RangeError,
                             Catch::Contains("this call's arithmetic is f64"));
}

namespace {
// Keys (and the values that are their first channels) stored in bfloat16, as a bf16 latent cache
// holds them: tiled with split keys, an absorbed chunk over several blocks with an odd key count,
// two key heads with d_v = d_qk, no RoPE, and few rows per key head (the widened path). Then keys
// and values apart, as a bf16 KV cache holds them: GQA decoding (the few-row path, keys and values
// widened), a few tokens at once, a prefill chunk (tiled, causal, RoPE), split keys, and MHA with
// d_v ≠ d_qk.
const Shape kStoredBf16Shapes[] = {
    {1, 3001, 64, 1, 1, 24, 8, 20, true, 3000, 1, 17, true},
    {70, 901, 8, 1, 1, 32, 8, 32, true, 831, 1, 3, true},
    {33, 301, 4, 1, 1, 17, 5, 13, false, 0, 1, 1, true},
    {40, 300, 4, 2, 2, 16, 4, 16, true, 260, 1, 13, true},
    {5, 1000, 16, 1, 1, 32, 0, 32, true, 995, 1, 2, true},
    {1, 700, 4, 1, 1, 16, 4, 12, true, 699, 1, 5, true},
    {2, 1500, 4, 1, 1, 16, 3, 16, true, 1498, 1, 0, true},
    {1, 1000, 8, 2, 2, 16, 0, 16, true, 999, 1, 3},
    {3, 900, 8, 4, 4, 12, 4, 12, true, 897, 1, 1},
    {45, 400, 4, 2, 2, 16, 4, 16, true, 355, 1, 7},
    {2, 2600, 8, 1, 1, 16, 0, 16, true, 2598, 1, 2},
    {20, 333, 3, 3, 3, 10, 0, 7, false, 0, 1, 5},
};
}  // namespace

TEST_CASE("keys and values stored in bf16 give the bits of the same values in float, on every path and arithmetic",
          "[kernel][flash][bf16]") {
  // A bf16 cache holds what bf16 compute would round anyway: widened exactly for float
  // arithmetic, paired as they lie for vdpbf16ps. So over keys and values that are bf16 values,
  // reading them from bfloat16 storage changes no bit, whatever the path (tiled, split keys, few
  // rows), the arithmetic (f32, bf16 by vdpbf16ps or FMAs) or the threads; a latent's values are
  // its keys' channels, a KV cache's apart. The spare rows hold NaN.
  for (const Shape& s : kStoredBf16Shapes) {
    INFO("Lq " << s.Lq << ", Lk " << s.Lk << ", heads " << s.n_q << "/" << s.n_k << ", d " << s.d_qk << "+" << s.d_rope);
    const Index ld = s.Lk + s.pad;
    const Eigen::MatrixXf Q = bd_test::gaussian(s.Lq, s.n_q * s.d_qk, 1).cast<float>();
    const Eigen::MatrixXf Qr = bd_test::gaussian(s.Lq, s.n_q * s.d_rope, 2).cast<float>();
    const auto stored = [&](Index cols, unsigned seed) {  // bf16 values, NaN in the spare rows
      // NaN everywhere, then the keys: no bottom block of an empty matrix (an offset from null data)
      using Bf16Matrix = Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>;
      Bf16Matrix X = Bf16Matrix::Constant(ld, cols, Eigen::bfloat16(std::numeric_limits<float>::quiet_NaN()));
      X.topRows(s.Lk) = bd_test::gaussian(s.Lk, cols, seed).cast<float>().cast<Eigen::bfloat16>();
      return X;
    };
    const auto K16 = stored(s.n_k * s.d_qk, 3), Kr16 = stored(s.d_rope, 4), V16 = stored(s.n_v * s.d_v, 5);
    const Eigen::MatrixXf K = K16.cast<float>(), Kr = Kr16.cast<float>(), V = V16.cast<float>();
    Eigen::MatrixXf O(s.Lq, s.n_q * s.d_v), O16(s.Lq, s.n_q * s.d_v);
    AttentionArguments<float> a;
    a.q_len = s.Lq, a.k_len = s.Lk, a.n_q = s.n_q, a.n_k = s.n_k, a.n_v = s.n_v, a.d_qk = s.d_qk, a.d_rope = s.d_rope,
    a.d_v = s.d_v;
    a.q = Q.data(), a.ldq = s.Lq, a.qr = Qr.data(), a.ldqr = s.Lq, a.ldk = ld, a.ldkr = ld, a.ldv = ld, a.ldo = s.Lq;
    a.values_are_keys = s.values_are_keys, a.scale = 0.125f, a.causal = s.causal, a.first_query_position = s.first;
    AttentionArguments<float> b = a;
    a.k = K.data(), a.kr = Kr.data(), a.v = s.values_are_keys ? K.data() : V.data(), a.out = O.data();
    b.k_bf16 = K16.data(), b.kr_bf16 = Kr16.data(), b.v_bf16 = s.values_are_keys ? K16.data() : V16.data(), b.out = O16.data();
    bd_test::for_each_bf16_path([&] {
      for (Compute compute : {Compute::F32, Compute::BF16})
        for (int threads : {0, 1}) {
          INFO(bd::kernel::to_string(compute) << " on " << threads << " threads (0: all)");
          a.compute = b.compute = compute;
          bd::kernel::flash_attention(a, threads);
          bd::kernel::flash_attention(b, threads);
          CHECK(O16 == O);
          CHECK(O.allFinite());
        }
    });
  }
}

TEST_CASE("keys and values stored in bf16 are read by float arithmetic, or refused by name", "[kernel][flash][bf16]") {
  Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic> K16 = Eigen::MatrixXf::Ones(16, 8).cast<Eigen::bfloat16>();
  Eigen::MatrixXf Q = Eigen::MatrixXf::Ones(1, 8), O(1, 8), V = Eigen::MatrixXf::Ones(16, 8);
  AttentionArguments<float> a;
  a.q_len = 1, a.k_len = 16, a.d_qk = 8, a.d_v = 8, a.q = Q.data(), a.ldq = 1, a.k_bf16 = K16.data(), a.ldk = 16, a.ldv = 16;
  a.out = O.data(), a.ldo = 1;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::flash_attention(a), bd::ShapeError, Catch::Contains("no values"));
  a.values_are_keys = true, a.v_bf16 = K16.data();  // a bf16 latent: its values are its keys
  bd::kernel::flash_attention(a);
  CHECK(O == Eigen::MatrixXf::Ones(1, 8));
  a.v = V.data();
  BD_CHECK_THROWS_CONTAINING(bd::kernel::flash_attention(a), bd::ShapeError, Catch::Contains("leave v null"));
  a.v = nullptr, a.k = V.data();
  BD_CHECK_THROWS_CONTAINING(bd::kernel::flash_attention(a), bd::ShapeError, Catch::Contains("k null"));
  AttentionArguments<double> d;
  d.q_len = 1, d.k_len = 16, d.d_qk = 8, d.d_v = 8, d.k_bf16 = K16.data(), d.values_are_keys = true;
  BD_CHECK_THROWS_CONTAINING(bd::kernel::flash_attention(d), bd::ShapeError, Catch::Contains("float arithmetic"));
}

TEST_CASE("bf16 attention rounds halfway keys and queries to even, as vdpbf16ps's conversion does", "[kernel][flash][bf16]") {
  // The even keys are odd integers in 257…495, each halfway between two bfloat16 values (steps of 2
  // there): 4m + 1 rounds down to 4m, 4m + 3 up to 4m + 4 (the neighbour with an even mantissa),
  // so truncating or rounding ties up or down each gets half of them wrong; the odd keys are exact.
  // The query 1 + 3·2⁻⁸ is halfway too and rounds up to 1 + 2⁻⁶. Scores run from 16 to 31: a tie
  // rounded the wrong way moves a key's weight by e^(2/16) or every score by 2⁻⁷ of itself, far
  // past P's own rounding (2⁻⁹·max|v|).
  const Shape s{40, 300, 1, 1, 1, 8, 0, 8, false};
  Eigen::MatrixXf Q = Eigen::MatrixXf::Zero(s.Lq, 8), K = Eigen::MatrixXf::Zero(s.Lk, 8), V(s.Lk, 8), O(s.Lq, 8);
  Q.col(0).setConstant(1.0f + 3 * std::ldexp(1.0f, -8));
  for (Index j = 0; j < s.Lk; ++j) {
    K(j, 0) = float(256 + 4 * (j % 60) + (j % 4 == 0 ? 1 : j % 4 == 2 ? 3 : 0));
    for (Index c = 0; c < 8; ++c) V(j, c) = float((j * 7 + c * 3) % 11 - 5);
  }
  AttentionArguments<float> a;
  a.q_len = s.Lq, a.k_len = s.Lk, a.d_qk = 8, a.d_v = 8, a.q = Q.data(), a.ldq = s.Lq, a.k = K.data(), a.ldk = s.Lk;
  a.v = V.data(), a.ldv = s.Lk, a.out = O.data(), a.ldo = s.Lq, a.scale = 0.0625f, a.compute = Compute::BF16;
  const MatrixXd expected = reference(s, bf16_rounded(Eigen::MatrixXf(Q * a.scale)), MatrixXd(s.Lq, 0), bf16_rounded(K),
                                      MatrixXd(s.Lk, 0), V.cast<double>(), 1.0);
  bd_test::for_each_bf16_path([&] {
    bd::kernel::flash_attention(a);
    CHECK((O.cast<double>() - expected).cwiseAbs().maxCoeff<Eigen::PropagateNaN>() <= std::ldexp(1.0, -9) * 5 * 1.25);
  });
}
