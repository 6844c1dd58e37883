// Gradients flow through B and C (the paper's §5.2): every backward pass — the linear layers
// (dense, low-rank, BD) and the attention layers (dense, BD with a shared window at several
// positions or per-head pivoted bases, attention over linear layers) — against central finite
// differences in double, for the input(s) and every trainable tensor: MHA, GQA, biases, RoPE,
// causal and not, cross-attention, sequences longer than the backward's tiles; and attention's
// own backward against the softmax's gradient written out, for every kind of causal block.
#include <bd/nn/bd_linear.hpp>
#include <bd/nn/llama.hpp>

#include <functional>
#include <random>

#include "nn_support.hpp"

using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::BDLinear;
using bd::nn::DenseLinear;
using bd::nn::LowRankLinear;
using bd::nn::Mode;
using bd_test::gaussian;
using Catch::Contains;
using Eigen::Index;
using Eigen::MatrixXd;

namespace {

/// ∂/∂value of loss() by central differences (value restored).
double central_difference(const std::function<double()>& loss, double& value) {
  const double v = value, h = 1e-6 * std::max(1.0, std::abs(v));
  value = v + h;
  const double up = loss();
  value = v - h;
  const double down = loss();
  value = v;
  return (up - down) / (2 * h);
}

/// The largest relative difference between finite differences and the analytic gradient over
/// up to `samples` entries of `target`, relative to the gradient's largest entry (entries near
/// zero are compared on the tensor's scale, not their own).
double worst_error(const std::function<double()>& loss, Eigen::Ref<MatrixXd> target, const MatrixXd& analytic, unsigned seed,
                   int samples = 10) {
  REQUIRE(analytic.rows() == target.rows());
  REQUIRE(analytic.cols() == target.cols());
  // A gradient that is zero by the algebra (a key bias shifts each softmax row by a constant)
  // is held to the finite differences' own noise, 1e-7 absolute, scaled to read against 1e-6.
  const double largest = analytic.cwiseAbs().maxCoeff();
  const bool zero = largest < 1e-12;
  const double scale = zero ? 0.1 : largest;
  std::mt19937 rng(seed);
  double worst = 0;
  for (int s = 0; s < samples; ++s) {
    const Index i = Index(rng() % std::uint32_t(target.rows())), j = Index(rng() % std::uint32_t(target.cols()));
    const double fd = central_difference(loss, target(i, j));
    worst = std::max(worst, std::abs(fd - analytic(i, j)) / scale);
  }
  return worst;
}

constexpr double kBound = 1e-6;

/// Checks every gradient of a layer: loss = Σ forward(x, x_kv) ⊙ R, so ∂loss/∂y = R.
template <typename Layer, typename Forward, typename Backward>
void check_layer(Layer& layer, Forward forward, Backward backward, MatrixXd x, MatrixXd x_kv, bool cross, unsigned seed) {
  const MatrixXd R = gaussian(x.rows(), forward(x, x_kv).cols(), seed);
  const auto g = backward(x, x_kv, R);
  auto loss = [&] { return (forward(x, x_kv).array() * R.array()).sum(); };
  INFO("input");
  CHECK(worst_error(loss, x, g.input, seed + 1) <= kBound);
  if (cross) {
    INFO("key/value input");
    CHECK(worst_error(loss, x_kv, g.kv_input, seed + 2) <= kBound);
  }
  auto params = layer.trainable();
  REQUIRE(params.size() == g.parameters.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << params[i].name);
    CHECK(worst_error(loss, params[i].value, g.parameters[i], seed + 3 + unsigned(i)) <= kBound);
  }
}

template <typename Linear>
void check_linear(Linear layer, Index L, unsigned seed) {
  const MatrixXd x = gaussian(L, layer.input_dim(), seed);
  check_layer(
      layer, [&](const MatrixXd& in, const MatrixXd&) { return MatrixXd(layer.forward(in)); },
      [&](const MatrixXd& in, const MatrixXd&, const MatrixXd& dy) { return layer.backward(in, dy); }, x, MatrixXd(), false, seed);
}

/// Self-attention (x_kv ignored) or cross-attention.
template <typename Layer>
void check_attention(Layer layer, Index L, Index L_kv, bool cross, unsigned seed) {
  const MatrixXd x = gaussian(L, layer.input_dim(), seed), x_kv = gaussian(L_kv, layer.kv_input_dim(), seed + 50);
  check_layer(
      layer,
      [&](const MatrixXd& in, const MatrixXd& kv) { return MatrixXd(cross ? layer.forward(in, kv) : layer.forward(in)); },
      [&](const MatrixXd& in, const MatrixXd& kv, const MatrixXd& dy) {
        return cross ? layer.backward(in, kv, dy) : layer.backward(in, dy);
      },
      x, x_kv, cross, seed);
}

}  // namespace

TEST_CASE("linear layers: dense, low-rank and BD gradients equal finite differences", "[gradients][linear]") {
  const LowRankLinear<double> low_rank(gaussian(40, 9, 1) / 6, gaussian(30, 9, 2) / 3, gaussian(30, 1, 3));
  SECTION("dense") { check_linear(DenseLinear<double>(gaussian(40, 30, 4) / 6, gaussian(30, 1, 5)), 7, 10); }
  SECTION("low-rank") { check_linear(low_rank, 7, 20); }
  for (bd::Basis basis : {bd::Basis::First, bd::Basis::Last, bd::Basis::Pivoted}) {
    INFO("BD basis " << bd::to_string(basis));
    check_linear(BDLinear<double>::from_low_rank(low_rank, bd::Options{}.with_basis(basis)), 7, 30);
  }
}

TEST_CASE("BD linear: the gradients of B and C are the dense gradient of W pulled back through W(B, C)", "[gradients][linear]") {
  // Column form: W[:, S] = B, W[:, R] = B·C. With G = xᵀ·∂y, the gradient of the same layer in
  // dense form, the chain rule gives ∂B = G[:, S] + G[:, R]·Cᵀ and ∂C = Bᵀ·G[:, R] — written
  // here from the decomposition's indices with Eigen, apart from BDLinear's backward. ∂x is a
  // property of the function: the low-rank layer's.
  const LowRankLinear<double> low_rank(gaussian(24, 5, 6) / 5, gaussian(18, 5, 7) / 2);
  for (bd::Basis basis : {bd::Basis::First, bd::Basis::Pivoted}) {
    INFO("basis " << bd::to_string(basis));
    const auto bd_layer = BDLinear<double>::from_low_rank(low_rank, bd::Options{}.with_basis(basis));
    const MatrixXd x = gaussian(4, 24, 8), dy = gaussian(4, 18, 9);
    const auto g = bd_layer.backward(x, dy);
    REQUIRE(g.parameters.size() == 2);
    const auto& d = bd_layer.decomposition();
    REQUIRE(d.side() == bd::Side::Col);
    const MatrixXd G = x.transpose() * dy;
    const auto S = d.indices();
    const auto R = d.rest();
    MatrixXd G_S(G.rows(), Index(S.size())), G_R(G.rows(), Index(R.size()));
    for (std::size_t k = 0; k < S.size(); ++k) G_S.col(Index(k)) = G.col(S[k]);
    for (std::size_t k = 0; k < R.size(); ++k) G_R.col(Index(k)) = G.col(R[k]);
    const MatrixXd B = d.basis(), C = d.coeff();
    CHECK(bd_test::max_rel(g.parameters[0], MatrixXd(G_S + G_R * C.transpose())) < 1e-12);
    CHECK(bd_test::max_rel(g.parameters[1], MatrixXd(B.transpose() * G_R)) < 1e-12);
    CHECK(bd_test::max_rel(g.input, low_rank.backward(x, dy).input) < 1e-12);
    CHECK(bd_layer.trainable_count() == 2);
  }
}

TEST_CASE("dense attention gradients equal finite differences: MHA, GQA, biases, RoPE, causal, cross", "[gradients][attention]") {
  struct Case {
    const char* name;
    bd_test::LayerSpec spec;
    Index L, L_kv;
    bool cross;
  };
  bd_test::LayerSpec mha, gqa, rope, cross, longer;
  mha.n_q = mha.n_kv = 3, mha.head_dim = 6, mha.d_q = mha.d_kv = mha.d_out = 18, mha.biases = true, mha.causal = true;
  gqa = mha, gqa.n_q = 6, gqa.n_kv = 2, gqa.head_dim = 4, gqa.d_q = gqa.d_kv = 20, gqa.d_out = 16, gqa.causal = false;
  rope = mha, rope.rope_theta = 100;
  cross = mha, cross.causal = false, cross.d_kv = 14, cross.d_out = 11;
  longer = mha, longer.biases = false, longer.n_q = longer.n_kv = 2, longer.head_dim = 4, longer.d_q = longer.d_kv = 8;
  longer.d_out = 8;
  for (const Case& c : {Case{"MHA, biases, causal", mha, 9, 9, false}, Case{"GQA 3:1, not causal", gqa, 7, 7, false},
                        Case{"RoPE", rope, 8, 8, false}, Case{"cross-attention", cross, 5, 11, true},
                        Case{"300 tokens: several query and key tiles", longer, 300, 300, false}}) {
    INFO(c.name);
    check_attention(bd_test::random_attention(c.spec, 7), c.L, c.L_kv, c.cross, 40);
  }
}

TEST_CASE("BD attention gradients flow through B and C: windows at several offsets, pivoted heads, GQA, biases",
          "[gradients][attention][bd]") {
  bd_test::LayerSpec s;
  s.n_q = s.n_kv = 3, s.head_dim = 5, s.d_q = s.d_kv = 17, s.d_out = 13, s.biases = true, s.causal = true;
  bd_test::LayerSpec gqa = s;
  gqa.n_q = 4, gqa.n_kv = 2, gqa.causal = false;
  const auto allow = [](bd::Basis b, Mode m) {
    return BDAttentionOptions{}.with_basis(b).with_mode(m).with_cost_policy(bd::nn::CostPolicy::Allow);
  };
  for (bd::Basis basis : {bd::Basis::First, bd::Basis::Last, bd::Basis::OffsetSearch, bd::Basis::Pivoted})
    for (Mode mode : {Mode::QKVO, Mode::QK, Mode::VO}) {
      INFO("basis " << bd::to_string(basis) << ", mode " << bd::nn::to_string(mode));
      const auto layer = BDAttention<double>::prepare(bd_test::random_attention(s, 8), allow(basis, mode));
      check_attention(layer, 8, 8, false, 60);
    }
  INFO("GQA, cross-attention");
  bd_test::LayerSpec cross = gqa;
  cross.d_kv = 12;
  check_attention(BDAttention<double>::prepare(bd_test::random_attention(cross, 9), allow(bd::Basis::Pivoted, Mode::QKVO)), 6, 9,
                  true, 70);
}

TEST_CASE("BD attention's gradient with respect to its input is the dense layer's", "[gradients][attention][bd]") {
  bd_test::LayerSpec s;
  s.n_q = s.n_kv = 4, s.head_dim = 8, s.d_q = s.d_kv = s.d_out = 32, s.biases = true, s.causal = true;
  const auto dense = bd_test::random_attention(s, 11);
  const auto bd_layer = BDAttention<double>::prepare(dense, BDAttentionOptions{}.with_basis(bd::Basis::First));
  const MatrixXd x = gaussian(10, 32, 12), dy = gaussian(10, 32, 13);
  CHECK(bd_test::max_rel(bd_layer.backward(x, dy).input, dense.backward(x, dy).input) < 1e-11);
  // BD's trainable tensors hold d_h² fewer values per head and product than MHA's.
  auto d = dense;
  auto b = bd_layer;
  Index dense_count = 0, bd_count = 0;
  for (const auto& p : d.trainable()) dense_count += p.value.rows() * p.value.cols();
  for (const auto& p : b.trainable()) bd_count += p.value.rows() * p.value.cols();
  const Index bias_change = 4 * 8 + 4 * 8 - 0;  // bk and bv drop out (folded or constant per row)
  CHECK(dense_count - bd_count == 2 * 4 * 8 * 8 + bias_change);
}

TEST_CASE("attention over low-rank and BD linear layers: gradients equal finite differences", "[gradients][attention][linear]") {
  bd::nn::AttentionConfig c;
  c.n_q = 4, c.n_kv = 2, c.head_dim = 4, c.causal = true, c.rope_theta = 1000;
  auto lr = [](Index in, Index out, unsigned seed) {
    return LowRankLinear<double>(gaussian(in, 5, seed) / 4, gaussian(out, 5, seed + 1) / 2, gaussian(out, 1, seed + 2) / 5);
  };
  const bd::nn::ProjectedAttention<LowRankLinear<double>> low_rank(c, lr(16, 16, 1), lr(16, 8, 4), lr(16, 8, 7), lr(16, 16, 10));
  check_attention(low_rank, 7, 7, false, 80);
  const auto bd_form = low_rank.map_projections([](const LowRankLinear<double>& l) { return BDLinear<double>::from_low_rank(l); });
  check_attention(bd_form, 7, 7, false, 90);
}

/// dQ, dK, dV of O = softmax(mask(Q·Kᵀ·scale))·V head by head, written out in double from the
/// whole L × L matrices: dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O))·scale, dQ = dS·K, dK = dSᵀ·Q.
bd::nn::AttentionInputGrads<double> explicit_attention_backward(const MatrixXd& Q, const MatrixXd& K, const MatrixXd& V,
                                                                const MatrixXd& dO, const bd::nn::AttendSpec& s) {
  bd::nn::AttentionInputGrads<double> g{MatrixXd::Zero(Q.rows(), Q.cols()), MatrixXd::Zero(K.rows(), K.cols()),
                                        MatrixXd::Zero(V.rows(), V.cols())};
  const Index d = s.d_qk;
  for (Index h = 0; h < s.n_q; ++h) {
    const Index kh = h * s.n_k / s.n_q;
    MatrixXd S = Q.middleCols(h * d, d) * K.middleCols(kh * d, d).transpose() * s.scale;
    for (Index i = 0; i < S.rows(); ++i)
      for (Index j = 0; j < S.cols(); ++j)
        if (s.causal && s.first_key_position + j > s.first_query_position + i) S(i, j) = -std::numeric_limits<double>::infinity();
    MatrixXd P = (S.colwise() - S.rowwise().maxCoeff()).array().exp();
    P = P.array().colwise() / P.rowwise().sum().array();
    const MatrixXd dOh = dO.middleCols(h * d, d), Vh = V.middleCols(kh * d, d);
    const MatrixXd O = P * Vh;
    const MatrixXd dS = (P.array() * ((dOh * Vh.transpose()).colwise() - (dOh.array() * O.array()).rowwise().sum().matrix())
                                          .array()) * s.scale;
    g.dV.middleCols(kh * d, d) += P.transpose() * dOh;
    g.dQ.middleCols(h * d, d) = dS * K.middleCols(kh * d, d);
    g.dK.middleCols(kh * d, d) += dS.transpose() * Q.middleCols(h * d, d);
  }
  return g;
}

TEST_CASE("attention's backward equals the softmax's gradient written out: causal blocks before, on and past the diagonal",
          "[gradients][attention]") {
  // The backward takes a block of queries' keys in three kinds (attention_backward.hpp): before
  // its diagonal (all visible), level with it (lower triangle only, whose upper tiles are never
  // computed) and, where the diagonal leaves the keys, masked entry by entry. 150 queries make
  // two blocks of 128 and 22.
  struct Case {
    const char* name;
    Index Lq, Lk, first_query, first_key;
    bool causal;
  };
  for (const Case& c : {Case{"self-attention", 150, 150, 0, 0, true}, Case{"queries 40 positions on", 150, 190, 40, 0, true},
                        Case{"queries past the last key", 150, 100, 0, 0, true}, Case{"keys starting later", 150, 150, 30, 20, true},
                        Case{"not causal", 150, 90, 0, 0, false}}) {
    INFO(c.name);
    bd::nn::AttendSpec s;
    s.n_q = 4, s.n_k = 2, s.d_qk = s.d_v = 8, s.scale = 0.35, s.causal = c.causal;
    s.first_query_position = c.first_query, s.first_key_position = c.first_key;
    const MatrixXd Q = gaussian(c.Lq, 32, 1), K = gaussian(c.Lk, 16, 2), V = gaussian(c.Lk, 16, 3), dO = gaussian(c.Lq, 32, 4);
    std::vector<double> lse;
    const MatrixXd O = bd::nn::attend_with_lse<double>(Q, K, V, s, lse);
    const auto g = bd::nn::attend_backward<double>(Q, K, V, O, dO, lse, s);
    const auto want = explicit_attention_backward(Q, K, V, dO, s);
    CHECK(bd_test::max_rel(g.dQ, want.dQ) < 1e-12);
    CHECK(bd_test::max_rel(g.dK, want.dK) < 1e-12);
    CHECK(bd_test::max_rel(g.dV, want.dV) < 1e-12);
  }
}

TEST_CASE("backward refuses MLA and shapes that do not fit", "[gradients][bad-input]") {
  bd_test::LayerSpec s;
  s.d_model_kv = 40, s.rope_dim = 4;
  const auto mla = bd_test::random_attention(s, 3);
  BD_CHECK_THROWS_CONTAINING(mla.backward(gaussian(3, 48, 1), gaussian(3, 48, 2)), bd::RefusedError, Contains("MLA"));
  const auto mha = bd_test::random_attention(bd_test::LayerSpec{}, 4);
  BD_CHECK_THROWS_CONTAINING(mha.backward(gaussian(3, 48, 1), gaussian(2, 48, 2)), bd::ShapeError,
                             Contains("dy is 2x48, expected 3x48"));
  const DenseLinear<double> linear(gaussian(5, 4, 1));
  BD_CHECK_THROWS_CONTAINING(linear.backward(gaussian(2, 5, 1), gaussian(2, 3, 2)), bd::ShapeError,
                             Contains("output is 2x3, expected 2x4"));
}
