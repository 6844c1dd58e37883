// MLA as DeepSeek serves it: query LoRA, the latent cache, absorbed decoding — dense and BD,
// against the dense reference run over the whole sequence.
#include "allocation_counter.hpp"
#include "nn_support.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include <bd/nn/dense_linear.hpp>
#include <bd/nn/latent_permutation.hpp>

using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::Mode;
using bd_test::max_rel;
using Catch::Contains;

namespace {

/// Small shapes of the two DeepSeek families: V2-Lite (no query LoRA) and V3 (query LoRA).
/// Latent 48 > head 8; decoupled RoPE 4; causal, as decoders are.
bd_test::LayerSpec mla(bool q_lora) {
  bd_test::LayerSpec s;
  s.n_q = s.n_kv = 4;
  s.head_dim = 8;
  s.v_head_dim = 8;
  s.d_q = 40;          // model width
  s.d_model_kv = 40;
  s.d_kv = 32;         // latent
  s.d_out = 40;
  s.rope_dim = 4;
  s.causal = true;
  s.q_lora = q_lora ? 24 : 0;
  return s;
}

/// fp64 operators over ≤ 48-term sums: a few hundred ulps of the output's scale at most.
constexpr double kDoubleBound = 1e-12;

}  // namespace

TEST_CASE("MLA dense: absorbed decoding = prefill over the latent cache = the whole-sequence pass", "[mla]") {
  for (const bool q_lora : {false, true}) {
    const auto layer = bd_test::random_attention(mla(q_lora), 3);
    const Eigen::MatrixXd x = bd_test::gaussian(9, 40, 21);
    const Eigen::MatrixXd y = layer.forward(x);
    bd::nn::LatentCache<double> absorbed, prefilled;
    Eigen::MatrixXd y_abs(9, 40), y_pre(9, 40);
    for (Eigen::Index t = 0; t < 9; ++t) {  // one token at a time
      y_abs.row(t) = layer.decode_absorbed(x.row(t), absorbed);
      y_pre.row(t) = layer.prefill(x.row(t), prefilled, bd::nn::PrefillPath::Recompute);
    }
    CHECK(absorbed.length() == 9);
    CHECK(absorbed.latent_dim() == 32);
    CHECK(absorbed.rope_dim() == 4);
    CHECK(max_rel(y_abs, y) <= kDoubleBound);
    CHECK(max_rel(y_pre, y) <= kDoubleBound);
  }
}

TEST_CASE("MLA BD: prefill by Algorithm 2 and absorbed decoding equal the dense reference", "[mla]") {
  for (const bool q_lora : {false, true})
    for (const auto basis : {bd::Basis::Auto, bd::Basis::Pivoted, bd::Basis::First})
      for (const auto mode : {Mode::QKVO, Mode::QK, Mode::VO}) {
        INFO("q_lora " << q_lora << ", basis " << bd::to_string(basis) << ", mode " << bd::nn::to_string(mode));
        const auto layer = bd_test::random_attention(mla(q_lora), 5);
        const auto bd = BDAttention<double>::prepare(layer, BDAttentionOptions{}.with_mode(mode).with_basis(basis)
                                                                .with_cost_policy(bd::nn::CostPolicy::Allow));
        const Eigen::MatrixXd x = bd_test::gaussian(8, 40, 22);
        const Eigen::MatrixXd y = layer.forward(x);
        CHECK(max_rel(bd.forward(x), y) <= kDoubleBound);
        // Chunked prefill: 3 tokens, then 4 against the cached latent, then absorbed decoding.
        bd::nn::LatentCache<double> cache;
        Eigen::MatrixXd out(8, 40);
        out.topRows(3) = bd.prefill(x.topRows(3), cache, bd::nn::PrefillPath::Recompute);
        out.middleRows(3, 4) = bd.prefill(x.middleRows(3, 4), cache, bd::nn::PrefillPath::Recompute);
        out.row(7) = bd.decode_absorbed(x.row(7), cache);
        CHECK(max_rel(out, y) <= kDoubleBound);
        // Several tokens decoded absorbed at once (speculative decoding's verification step).
        bd::nn::LatentCache<double> cache2;
        Eigen::MatrixXd out2(8, 40);
        out2.topRows(2) = bd.decode_absorbed(x.topRows(2), cache2);
        out2.bottomRows(6) = bd.decode_absorbed(x.bottomRows(6), cache2);
        CHECK(max_rel(out2, y) <= kDoubleBound);
      }
}

TEST_CASE("MLA BD in float: absorbed decoding within the fp32 operator bound", "[mla][precision]") {
  const auto layer = bd_test::random_attention(mla(true), 8).cast<float>();
  const auto bd = BDAttention<float>::prepare(layer, BDAttentionOptions{}.with_cost_policy(bd::nn::CostPolicy::Allow));
  const Eigen::MatrixXf x = bd_test::gaussian(6, 40, 23).cast<float>();
  const Eigen::MatrixXf y = layer.forward(x);
  bd::nn::LatentCache<float> cache;
  Eigen::MatrixXf out(6, 40);
  for (Eigen::Index t = 0; t < 6; ++t) out.row(t) = bd.decode_absorbed(x.row(t), cache);
  CHECK(max_rel(out, y) <= bd_test::kFp32OperatorBound);
}

TEST_CASE("MLA absorbed decoding: a token's per-head products allocate nothing (its count does not grow with the heads)",
          "[mla][allocation]") {
  // Absorbed decoding runs two products per head for every token (the queries into the latent,
  // the outputs out of it): 256 a token at DeepSeek-V3's 128 heads. Their argument lists (the
  // segments, the channels, the output columns) come from the layer's call or the Workspace, so
  // a token allocates as often with 16 heads as with 4; what it does allocate (the returned
  // matrices, per-call lists) does not depend on the heads. Dense and BD, float (the served type).
  // The heads are shared out dynamically, so the token on which a thread first computes (and
  // creates its scratch in the workspace, once) is the scheduler's choice: the count taken is the
  // fewest over six tokens after two warm ones, which a per-head allocation would still raise.
  if (!bd_test::counts_allocations()) {
    SUCCEED("this build does not count allocations (AddressSanitizer owns operator new)");
    return;
  }
  const auto per_token = [](Eigen::Index heads, bool bd) {
    bd_test::LayerSpec s = mla(true);
    s.n_q = s.n_kv = heads;
    const auto dense = bd_test::random_attention(s, 9).cast<float>();
    const auto prepared = BDAttention<float>::prepare(dense, BDAttentionOptions{}.with_cost_policy(bd::nn::CostPolicy::Allow));
    const Eigen::MatrixXf x = bd_test::gaussian(8, 40, 24).cast<float>();
    bd::nn::LatentCache<float> cache;
    Eigen::MatrixXf y(1, 40);
    const auto token = [&](Eigen::Index t) {
      y = bd ? prepared.decode_absorbed(x.row(t), cache) : dense.decode_absorbed(x.row(t), cache);
    };
    token(0);  // grows the workspace
    token(1);
    long fewest = std::numeric_limits<long>::max();
    for (Eigen::Index t = 2; t < x.rows(); ++t) {
      const long before = bd_test::allocations();
      token(t);
      fewest = std::min(fewest, bd_test::allocations() - before);
    }
    return fewest;
  };
  for (const bool bd : {false, true}) {
    const long four = per_token(4, bd), sixteen = per_token(16, bd);
    INFO((bd ? "BD" : "dense") << ": " << four << " allocations a token with 4 heads, " << sixteen << " with 16");
    CHECK(sixteen == four);
  }
}

TEST_CASE("MLA: bad caches and layers are refused with a message", "[mla][bad-input]") {
  const auto layer = bd_test::random_attention(mla(false), 3);
  const Eigen::MatrixXd x = bd_test::gaussian(2, 40, 24);
  SECTION("a cache filled by another layer shape") {
    auto other = mla(false);
    other.d_kv = 24;
    const auto narrow = bd_test::random_attention(other, 4);
    bd::nn::LatentCache<double> cache;
    narrow.decode_absorbed(x, cache);
    BD_CHECK_THROWS_CONTAINING(layer.decode_absorbed(x, cache), bd::ShapeError, Contains("another layer shape"));
  }
  SECTION("RoPE widths that differ") {
    auto other = mla(false);
    other.rope_dim = 6;
    const auto wider = bd_test::random_attention(other, 4);
    bd::nn::LatentCache<double> cache;
    wider.prefill(x, cache);
    BD_CHECK_THROWS_CONTAINING(layer.prefill(x, cache), bd::ShapeError, Contains("RoPE keys of 6"));
  }
  SECTION("a layer without a latent") {
    bd_test::LayerSpec plain;
    const auto mha = bd_test::random_attention(plain, 4);
    bd::nn::LatentCache<double> cache;
    BD_CHECK_THROWS_CONTAINING(mha.decode_absorbed(bd_test::gaussian(1, 48, 1), cache), bd::RefusedError,
                               Contains("needs an MLA layer"));
  }
  SECTION("a query LoRA of the wrong width") {
    auto w = layer.weights();
    w.W_qa = bd_test::gaussian(40, 7, 2);
    BD_CHECK_THROWS_CONTAINING(bd::nn::MultiHeadAttention<double>(layer.config(), w), bd::ShapeError,
                               Contains("W_qa is 40x7, expected 40 columns"));
  }
}

namespace {

/// Every value of a stored tensor, sorted: equal for two tensors that hold the same numbers moved.
template <typename M>
std::vector<typename M::Scalar> sorted_values(const M& m) {
  std::vector<typename M::Scalar> v(m.data(), m.data() + m.size());
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

TEST_CASE("MLA with the latent reordered so the QK window is last: the same layer, one K' GEMM", "[mla][latent-order]") {
  for (const bool q_lora : {false, true})
    for (const auto basis : {bd::Basis::First, bd::Basis::ResidualMin, bd::Basis::OffsetSearch})
      for (const auto mode : {Mode::QKVO, Mode::QK, Mode::VO}) {
        INFO("q_lora " << q_lora << ", basis " << bd::to_string(basis) << ", mode " << bd::nn::to_string(mode));
        const auto layer = bd_test::random_attention(mla(q_lora), 6);
        const auto bd = BDAttention<double>::prepare(layer, BDAttentionOptions{}.with_mode(mode).with_basis(basis)
                                                                .with_cost_policy(bd::nn::CostPolicy::Allow));
        const auto moved = bd::nn::latent_window_last(bd);
        const bd::nn::HeadIndices& window = bd::nn::has_qk(mode) ? moved.layer.qk_indices() : moved.layer.vo_indices();
        CHECK(window.shared);
        CHECK(window.offset == 32 - 8);  // d_kv − d_h: the rest is one piece, one GEMM call
        // The dense layer reordered is the same function; so is the reordered BD layer, in a
        // whole-sequence pass, chunked prefill and absorbed decoding.
        const Eigen::MatrixXd x = bd_test::gaussian(8, 40, 25);
        const Eigen::MatrixXd y = layer.forward(x);
        CHECK(max_rel(bd::nn::permute_latent(layer, moved.order).forward(x), y) <= kDoubleBound);
        CHECK(max_rel(moved.layer.forward(x), y) <= kDoubleBound);
        bd::nn::LatentCache<double> cache;
        Eigen::MatrixXd out(8, 40);
        out.topRows(5) = moved.layer.prefill(x.topRows(5), cache);
        out.bottomRows(3) = moved.layer.decode_absorbed(x.bottomRows(3), cache);
        CHECK(max_rel(out, y) <= kDoubleBound);
        // No number changed: the stored tensors hold the same values, moved.
        CHECK(sorted_values(moved.layer.qk_coeff()) == sorted_values(bd.qk_coeff()));
        CHECK(sorted_values(moved.layer.qk_basis()) == sorted_values(bd.qk_basis()));
        CHECK(sorted_values(moved.layer.vo_coeff()) == sorted_values(bd.vo_coeff()));
        CHECK(sorted_values(moved.layer.vo_basis()) == sorted_values(bd.vo_basis()));
        CHECK(sorted_values(moved.layer.rest().W_dkv) == sorted_values(bd.rest().W_dkv));
      }
}

TEST_CASE("MLA latent reordering: any permutation, per-head bases too, and back again bit for bit", "[mla][latent-order]") {
  const auto layer = bd_test::random_attention(mla(true), 7).cast<float>();
  for (const auto basis : {bd::Basis::Pivoted, bd::Basis::OffsetSearch}) {
    INFO("basis " << bd::to_string(basis));
    const auto bd = BDAttention<float>::prepare(layer, BDAttentionOptions{}.with_basis(basis).with_cost_policy(bd::nn::CostPolicy::Allow));
    std::vector<Eigen::Index> order(32), back(32);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(11));
    for (Eigen::Index j = 0; j < 32; ++j) back[std::size_t(order[std::size_t(j)])] = j;
    const auto shuffled = bd::nn::permute_latent(bd, order);
    const Eigen::MatrixXf x = bd_test::gaussian(6, 40, 26).cast<float>();
    // fp32 operators, as in the float MLA test above: the reordered layer is as close to the
    // dense one as the original BD layer is.
    CHECK(max_rel(shuffled.forward(x), layer.forward(x)) <= bd_test::kFp32OperatorBound);
    const auto restored = bd::nn::permute_latent(shuffled, back);
    CHECK(restored.qk_indices().basis == bd.qk_indices().basis);
    CHECK(restored.vo_indices().basis == bd.vo_indices().basis);
    CHECK(restored.qk_coeff() == bd.qk_coeff());
    CHECK(restored.qk_basis() == bd.qk_basis());
    CHECK(restored.vo_coeff() == bd.vo_coeff());
    CHECK(restored.vo_basis() == bd.vo_basis());
    CHECK(restored.rest().W_dkv == bd.rest().W_dkv);
    CHECK(restored.rest().kv_norm == bd.rest().kv_norm);
  }
}

TEST_CASE("MLA latent reordering refuses what it cannot do, with a message", "[mla][latent-order][bad-input]") {
  const auto layer = bd_test::random_attention(mla(false), 3);
  const auto allow = BDAttentionOptions{}.with_cost_policy(bd::nn::CostPolicy::Allow);
  const auto pivoted = BDAttention<double>::prepare(layer, BDAttentionOptions(allow).with_basis(bd::Basis::Pivoted));
  REQUIRE_FALSE(pivoted.qk_indices().shared);  // random heads pivot to different channels
  BD_CHECK_THROWS_CONTAINING(bd::nn::latent_window_last(pivoted), bd::RefusedError, Contains("per head (pivoted)"));
  const auto first = BDAttention<double>::prepare(layer, BDAttentionOptions(allow).with_basis(bd::Basis::First));
  std::vector<Eigen::Index> order(32);
  std::iota(order.begin(), order.end(), 0);
  order[5] = 4;
  BD_CHECK_THROWS_CONTAINING(bd::nn::permute_latent(first, order), bd::RangeError, Contains("entry 5 is 4 (repeated)"));
  order[5] = 32;
  BD_CHECK_THROWS_CONTAINING(bd::nn::permute_latent(layer, order), bd::RangeError, Contains("out of range"));
  order.pop_back();
  BD_CHECK_THROWS_CONTAINING(bd::nn::permute_latent(first, order), bd::ShapeError,
                             Contains("expected the latent width 32"));
  bd_test::LayerSpec plain;
  const auto mha = BDAttention<double>::prepare(bd_test::random_attention(plain, 4), allow);
  BD_CHECK_THROWS_CONTAINING(bd::nn::latent_window_last(mha), bd::RefusedError, Contains("needs an MLA layer"));
}

TEST_CASE("a layer given a workspace runs its kernels there: its buffers, the same outputs bit for bit", "[mla][workspace]") {
  const auto layer = bd_test::random_attention(mla(true), 7);
  const auto bd = BDAttention<double>::prepare(layer, BDAttentionOptions{}.with_cost_policy(bd::nn::CostPolicy::Allow));
  const bd::nn::DenseLinear<double> linear(bd_test::gaussian(40, 24, 24));
  const Eigen::MatrixXd x = bd_test::gaussian(6, 40, 23);
  bd::Workspace ws;
  // Each call given an emptied workspace, with the process's emptied too: its packing and
  // attention scratch must land in the one given, and not one step below the call may fall back
  // to the process's (which would then hold a thread's buffers); then it must compute what the
  // call given no workspace computes.
  const auto check = [&](const char* what, const auto& on_default, const auto& on_given) {
    INFO(what);
    ws.release();
    bd::default_workspace().release();  // nothing else runs in this process meanwhile
    const Eigen::MatrixXd got = on_given();
    CHECK(ws.threads() >= 1);
    CHECK(bd::default_workspace().threads() == 0);
    const Eigen::MatrixXd expected = on_default();
    CHECK(got == expected);
  };
  check("dense forward", [&] { return layer.forward(x); }, [&] { return layer.forward(x, ws); });
  check("BD forward", [&] { return bd.forward(x); }, [&] { return bd.forward(x, ws); });
  check("linear forward", [&] { return linear.forward(x); }, [&] { return linear.forward(x, ws); });
  bd::nn::LatentCache<double> c1, c2, c3, c4;
  check("BD prefill (recompute)", [&] { return bd.prefill(x, c1, bd::nn::PrefillPath::Recompute); },
        [&] { return bd.prefill(x, c2, bd::nn::PrefillPath::Recompute, ws); });
  check("BD absorbed decoding", [&] { return bd.decode_absorbed(x.topRows(2), c3); },
        [&] { return bd.decode_absorbed(x.topRows(2), c4, ws); });
  const auto plain = bd_test::random_attention(bd_test::LayerSpec{}, 8);
  const Eigen::MatrixXd xp = bd_test::gaussian(5, 48, 25);
  bd::nn::KVCache<double> k1, k2;
  check("cached decoding", [&] { return plain.decode(xp, k1); }, [&] { return plain.decode(xp, k2, ws); });
}
