// Every way of running attention — the whole sequence, KV-cache decoding in uneven steps, MLA
// prefill and chunked prefill by each path (K/V recomputed from the latent, or absorbed), and
// absorbed decoding — equals the layer computed plainly in double (nn_support.hpp's oracle,
// which shares no code with bd), for dense and BD layers in float, on every micro-kernel this
// CPU runs. Lengths cross the flash core's 64-row tasks, and one crosses its key blocks.
#include "nn_support.hpp"

using bd::nn::BDAttention;
using bd::nn::BDAttentionOptions;
using bd::nn::CostPolicy;
using bd::nn::Mode;
using bd::nn::PrefillPath;
using bd_test::kFp32OperatorBound;
using bd_test::LayerSpec;
using bd_test::max_rel;
using Catch::Contains;
using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::MatrixXf;

namespace {

struct Case {
  const char* name;
  LayerSpec spec;
  Index L, L_kv;  ///< L_kv = 0: self-attention
};

LayerSpec spec_of(Index n_q, Index n_kv, bool causal, bool biases) {
  LayerSpec s;
  s.n_q = n_q, s.n_kv = n_kv, s.causal = causal, s.biases = biases;
  return s;
}

LayerSpec mla_spec(bool q_lora) {
  LayerSpec s;
  s.n_q = s.n_kv = 4;
  s.head_dim = 8, s.v_head_dim = 6;
  s.d_q = s.d_model_kv = s.d_out = 40;
  s.d_kv = 32;
  s.rope_dim = 4;
  s.causal = true;
  s.q_lora = q_lora ? 24 : 0;
  return s;
}

const Case kCases[] = {
    {"MHA", spec_of(4, 4, false, false), 70, 0},
    {"MHA, causal, biases", spec_of(4, 4, true, true), 67, 0},
    {"GQA 8:2, causal", spec_of(8, 2, true, true), 37, 0},
    {"MQA 6:1", spec_of(6, 1, false, true), 13, 0},
    {"cross-attention", spec_of(4, 2, false, true), 9, 71},
    {"MLA", mla_spec(false), 71, 0},
    {"MLA with query LoRA", mla_spec(true), 70, 0},
    {"causal, past one key block", spec_of(2, 2, true, false), 401, 0},
};

BDAttentionOptions allow(Mode m) {
  return BDAttentionOptions{}.with_mode(m).with_basis(bd::Basis::Pivoted).with_cost_policy(CostPolicy::Allow);
}

/// Runs every path `layer` has and checks each against `expected` (the plain double oracle).
template <typename Layer>
void check_paths(const Layer& layer, const LayerSpec& s, const MatrixXf& x, const MatrixXf& x_kv, const MatrixXd& expected,
                 bool self) {
  const Index L = x.rows();
  CHECK(max_rel(layer.forward(x, x_kv), expected) <= kFp32OperatorBound);
  if (!self || !s.causal) return;  // decoding step by step is the whole pass only when tokens cannot see ahead
  // KV-cache decoding: a block, single tokens, then the rest.
  {
    bd::nn::KVCache<float> cache;
    MatrixXf out(L, expected.cols());
    const Index cuts[] = {0, L / 2, L / 2 + 1, L / 2 + 2, L};
    for (int k = 0; k + 1 < 5; ++k) out.middleRows(cuts[k], cuts[k + 1] - cuts[k]) = layer.decode(x.middleRows(cuts[k], cuts[k + 1] - cuts[k]), cache);
    INFO("KV-cache decoding");
    CHECK(max_rel(out, expected) <= kFp32OperatorBound);
  }
  if (!s.d_model_kv) return;
  // MLA: chunked prefill in chunks of 1, 3, 7 and the rest, by each path; then absorbed decoding
  // token by token.
  for (const PrefillPath path : {PrefillPath::Recompute, PrefillPath::Absorbed, PrefillPath::Automatic}) {
    bd::nn::LatentCache<float> cache;
    MatrixXf out(L, expected.cols());
    Index done = 0;
    for (const Index chunk : {Index(1), Index(3), Index(7), L - 11}) {
      out.middleRows(done, chunk) = layer.prefill(x.middleRows(done, chunk), cache, path);
      done += chunk;
    }
    INFO("chunked prefill, path " << bd::nn::to_string(path));
    CHECK(max_rel(out, expected) <= kFp32OperatorBound);
  }
  bd::nn::LatentCache<float> cache;
  MatrixXf out(L, expected.cols());
  for (Index t = 0; t < L; ++t) out.row(t) = layer.decode_absorbed(x.row(t), cache);
  INFO("absorbed decoding");
  CHECK(max_rel(out, expected) <= kFp32OperatorBound);
}

}  // namespace

TEST_CASE("every attention path of dense and BD layers equals the plain double computation, on every ISA",
          "[attention][paths]") {
  unsigned seed = 100;
  for (const Case& k : kCases) {
    seed += 7;
    const auto dense64 = bd_test::random_attention(k.spec, seed);
    const auto dense = dense64.cast<float>();
    const MatrixXd x = bd_test::gaussian(k.L, dense.input_dim(), seed + 1);
    const MatrixXd x_kv = k.L_kv ? bd_test::gaussian(k.L_kv, dense.kv_input_dim(), seed + 2) : x;
    const MatrixXd expected = bd_test::plain_attention(dense64, x, x_kv);
    const MatrixXf xf = x.cast<float>(), x_kvf = x_kv.cast<float>();
    std::vector<BDAttention<float>> bds;
    for (Mode m : {Mode::QK, Mode::VO, Mode::QKVO}) bds.push_back(BDAttention<float>::prepare(dense64, allow(m)));
    bd_test::for_each_isa([&] {
      INFO(k.name << ", L = " << k.L);
      {
        INFO("dense");
        check_paths(dense, k.spec, xf, x_kvf, expected, k.L_kv == 0);
      }
      for (const auto& bda : bds) {
        INFO("BD " << bd::nn::to_string(bda.mode()));
        check_paths(bda, k.spec, xf, x_kvf, expected, k.L_kv == 0);
      }
    });
  }
}

TEST_CASE("one-token and empty contexts: a single key is attended to fully, no key is refused", "[attention][paths]") {
  const LayerSpec s = spec_of(4, 2, true, true);
  const auto dense64 = bd_test::random_attention(s, 5);
  const auto dense = dense64.cast<float>();
  const MatrixXd x = bd_test::gaussian(1, dense.input_dim(), 6);
  CHECK(max_rel(dense.forward(x.cast<float>()), bd_test::plain_attention(dense64, x, x)) <= kFp32OperatorBound);
  // Cross-attention to one key: every query's softmax is that key's value.
  LayerSpec cross = spec_of(4, 2, false, true);
  const auto layer = bd_test::random_attention(cross, 7);
  const MatrixXd xq = bd_test::gaussian(5, layer.input_dim(), 8), one = bd_test::gaussian(1, layer.kv_input_dim(), 9);
  CHECK(max_rel(layer.forward(xq, one), bd_test::plain_attention(layer, xq, one)) <= 1e-12);
  BD_CHECK_THROWS_CONTAINING(layer.forward(xq, MatrixXd(0, layer.kv_input_dim())), bd::ShapeError,
                             Contains("empty context"));
  // No queries: no rows out.
  CHECK(layer.forward(MatrixXd(0, layer.input_dim()), one).rows() == 0);
}

TEST_CASE("chunked MLA prefill: the cost model recomputes long chunks and absorbs short ones, and says so",
          "[attention][paths][cost]") {
  const auto layer = bd_test::random_attention(mla_spec(false), 3);
  // DeepSeek's latent is 4× a head: absorbing costs attention at the latent's width, recomputing
  // costs every context token's K/V. A decoded token over a long context absorbs; a chunk as long
  // as its context recomputes.
  const auto one = layer.plan_chunk(1, 4096), whole = layer.plan_chunk(512, 512);
  CHECK(one.path == PrefillPath::Absorbed);
  CHECK(one.absorbed_flops < one.recompute_flops);
  CHECK(whole.path == PrefillPath::Recompute);
  CHECK(whole.recompute_flops < whole.absorbed_flops);
  const auto bd = BDAttention<double>::prepare(layer, allow(Mode::QKVO));
  // BD makes the K/V up-projection cheaper: recomputing wins at shorter chunks than dense.
  const auto dense_plan = layer.plan_chunk(8, 1024), bd_plan = bd.plan_chunk(8, 1024);
  CHECK(bd_plan.recompute_flops < dense_plan.recompute_flops);
}

TEST_CASE("KV caches refuse appends that do not fit what they hold", "[attention][paths][bad-input]") {
  bd::nn::KVCache<float> cache;
  cache.append(MatrixXf::Ones(2, 8), MatrixXf::Ones(2, 6), MatrixXf(2, 0));
  BD_CHECK_THROWS_CONTAINING(cache.append(MatrixXf::Ones(1, 8), MatrixXf::Ones(2, 6), MatrixXf(1, 0)), bd::ShapeError,
                             Contains("one row per token"));
  BD_CHECK_THROWS_CONTAINING(cache.append(MatrixXf::Ones(1, 4), MatrixXf::Ones(1, 6), MatrixXf(1, 0)), bd::ShapeError,
                             Contains("another layer shape"));
  CHECK(cache.length() == 2);
}

TEST_CASE("MLA prefill recomputes K/V block by block over a context longer than a block", "[attention][paths]") {
  // 1210 tokens: the context's K/V are made in blocks of recompute_block = 1024 and attended to
  // as they are made; the second chunk's causal diagonal falls in the second block.
  const auto dense64 = bd_test::random_attention(mla_spec(true), 31);
  const auto dense = dense64.cast<float>();
  const auto bd = BDAttention<float>::prepare(dense64, allow(Mode::QKVO));
  static_assert(bd::nn::MultiHeadAttention<float>::recompute_block == 1024, "the lengths below straddle one block");
  const MatrixXd x = bd_test::gaussian(1210, dense.input_dim(), 32);
  const MatrixXd expected = bd_test::plain_attention(dense64, x, x);
  const MatrixXf xf = x.cast<float>();
  for (const bool use_bd : {false, true}) {
    bd::nn::LatentCache<float> cache;
    MatrixXf out(1210, expected.cols());
    const auto run = [&](Index from, Index n) {
      out.middleRows(from, n) = use_bd ? bd.prefill(xf.middleRows(from, n), cache, PrefillPath::Recompute)
                                       : dense.prefill(xf.middleRows(from, n), cache, PrefillPath::Recompute);
    };
    run(0, 1150);
    run(1150, 60);
    INFO((use_bd ? "BD" : "dense"));
    CHECK(max_rel(out, expected) <= kFp32OperatorBound);
  }
}

TEST_CASE("one workspace carried through calls of every shape gives each call's result bit for bit", "[attention][paths]") {
  // A layer keeps Q, K, V and the heads' output in its Workspace between calls (they are reused,
  // not allocated afresh): nothing a longer call left there may reach a shorter one's result.
  const auto dense64 = bd_test::random_attention(mla_spec(true), 41);
  const auto dense = dense64.cast<float>();
  const auto bd = BDAttention<float>::prepare(dense64, allow(Mode::QKVO));
  const MatrixXf x = bd_test::gaussian(90, dense.input_dim(), 42).cast<float>();
  for (const bool use_bd : {false, true}) {
    INFO((use_bd ? "BD" : "dense"));
    const auto forward = [&](const MatrixXf& in, bd::Workspace& ws) { return use_bd ? bd.forward(in, ws) : dense.forward(in, ws); };
    const auto prefill = [&](const MatrixXf& in, bd::nn::LatentCache<float>& c, PrefillPath p, bd::Workspace& ws) {
      return use_bd ? bd.prefill(in, c, p, ws) : dense.prefill(in, c, p, ws);
    };
    bd::Workspace carried;
    bd::nn::LatentCache<float> cache, fresh_cache;
    for (const Index L : {Index(90), Index(7), Index(64), Index(1)}) {
      bd::Workspace fresh;
      INFO("forward, L = " << L);
      CHECK(forward(x.topRows(L), carried) == forward(x.topRows(L), fresh));
    }
    Index done = 0;
    for (const Index chunk : {Index(40), Index(3), Index(30)}) {
      for (const PrefillPath path : {PrefillPath::Recompute, PrefillPath::Absorbed}) {
        bd::Workspace fresh;
        bd::nn::LatentCache<float> c1 = cache, c2 = fresh_cache;
        INFO("prefill chunk " << chunk << " after " << done << ", path " << bd::nn::to_string(path));
        CHECK(prefill(x.middleRows(done, chunk), c1, path, carried) == prefill(x.middleRows(done, chunk), c2, path, fresh));
      }
      bd::Workspace fresh;
      prefill(x.middleRows(done, chunk), cache, PrefillPath::Recompute, carried);
      prefill(x.middleRows(done, chunk), fresh_cache, PrefillPath::Recompute, fresh);
      done += chunk;
    }
  }
}
