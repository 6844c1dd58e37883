// Grouped-query attention with BD's windows per key/value group (VO: exact under RoPE), dense
// against BD in the same executable, with the same threads and precision (fp32):
//
//   gqa_v/<model>/<impl>/<L>        the value projection alone, L tokens into a preallocated V:
//                                   dense_kernel (x·Wv on bd's kernel), dense_openblas (sgemm),
//                                   bd (V'_g = x[:, S_g] + x[:, R_g]·C_g on bd's kernel, n_kv heads);
//   gqa_layer/<model>/<mha|bda>/<L> one causal self-attention forward with RoPE over L tokens.
//
// Shapes (random weights; speed does not depend on the values, BD on the first rows):
// Llama-3-8B, d = 4096, 32 query heads on 8 key/value heads, d_h = 128, RoPE θ = 500000;
// Qwen2-0.5B, d = 896, 14 query heads on 2, d_h = 64, RoPE θ = 1000000 (without its q/k/v biases).
// theoretical_ratio is dense FLOPs over BD's for what the benchmark times, by the paper's count
// (a length-d dot product is 2d − 1 operations; BD's outputs cost 2(d − d_h)): for the value
// projection (2d − 1)/(2(d − d_h)) — 1.032 at Llama-3-8B's shape, 1.076 at Qwen2-0.5B's — and
// for the whole layer that gain diluted by q, k, o and the attention itself.
#include <benchmark/benchmark.h>

#include <cmath>
#include <map>
#include <string>

#include <bd/kernel/matmul.hpp>
#include <bd/nn/bd_attention.hpp>
#include <bd/nn/multi_head_attention.hpp>
#include <bd/nn/projection.hpp>

#ifdef BD_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace {

using Eigen::Index;

struct GqaShape {
  const char* name;
  Index d, n_q, n_kv, d_h;
  double rope_theta;
};

constexpr GqaShape kShapes[] = {{"llama3-8b", 4096, 32, 8, 128, 500000.0}, {"qwen2-0.5b", 896, 14, 2, 64, 1000000.0}};

struct GqaPair {
  bd::nn::MultiHeadAttention<float> dense;
  bd::nn::BDAttention<float> bd;
};

const GqaPair& gqa_pair(const GqaShape& s) {
  static std::map<std::string, GqaPair> cache;
  auto it = cache.find(s.name);
  if (it == cache.end()) {
    bd::nn::AttentionConfig c;
    c.n_q = s.n_q;
    c.n_kv = s.n_kv;
    c.head_dim = s.d_h;
    c.rope_theta = s.rope_theta;
    c.causal = true;
    bd::nn::AttentionWeights<float> w;
    const float scale = 1.732f / std::sqrt(float(s.d));  // uniform with variance 1/d
    w.Wq = Eigen::MatrixXf::Random(s.d, s.n_q * s.d_h) * scale;
    w.Wk = Eigen::MatrixXf::Random(s.d, s.n_kv * s.d_h) * scale;
    w.Wv = Eigen::MatrixXf::Random(s.d, s.n_kv * s.d_h) * scale;
    w.Wo = Eigen::MatrixXf::Random(s.n_q * s.d_h, s.d) * (1.732f / std::sqrt(float(s.n_q * s.d_h)));
    bd::nn::MultiHeadAttention<float> dense(c, std::move(w));
    auto bda = bd::nn::BDAttention<float>::prepare(
        dense, bd::nn::BDAttentionOptions{}.with_mode(bd::nn::Mode::VO).with_basis(bd::Basis::First));
    it = cache.emplace(s.name, GqaPair{std::move(dense), std::move(bda)}).first;
  }
  return it->second;
}

double dot(double length) { return 2.0 * length - 1.0; }

void value_projection(benchmark::State& state, const GqaShape& s, const std::string& impl) {
  const GqaPair& pair = gqa_pair(s);
  const Index L = state.range(0), N = s.n_kv * s.d_h;
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, s.d);
  Eigen::MatrixXf v(L, N);
  const Eigen::MatrixXf& Wv = pair.dense.weights().Wv;
  for (auto _ : state) {
    if (impl == "bd") {
      bd::nn::bd_project_into<float, float>(x, pair.bd.vo_indices(), pair.bd.vo_coeff(), v);
    } else if (impl == "dense_kernel") {
      bd::kernel::linear_into<float, float>(x.data(), L, L, s.d, Wv.data(), s.d, false, N, nullptr, v.data(), L);
#ifdef BD_HAVE_OPENBLAS
    } else if (impl == "dense_openblas") {
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, int(L), int(N), int(s.d), 1.0f, x.data(), int(L), Wv.data(),
                  int(s.d), 0.0f, v.data(), int(L));
#endif
    }
    benchmark::DoNotOptimize(v.data());
    benchmark::ClobberMemory();
  }
  const double dense = double(N) * dot(double(s.d)), bd = double(N) * 2.0 * double(s.d - s.d_h);
  state.counters["FLOP/s"] =
      benchmark::Counter((impl == "bd" ? bd : dense) * double(L), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = dense / bd;
  state.counters["v_heads"] = double(pair.bd.vo_indices().heads());  // n_kv: the cache is the dense cache
}

/// FLOPs of one causal layer over L tokens: q, k, v and o projections and attention (query i
/// sees i + 1 keys, (L + 1)/2 on average); BD changes only v.
double layer_flops(const GqaShape& s, double L, bool bd) {
  const double nq = double(s.n_q), nkv = double(s.n_kv), dh = double(s.d_h), d = double(s.d);
  const double v = nkv * dh * (bd ? 2.0 * (d - dh) : dot(d));
  const double per_token = nq * dh * dot(d) + nkv * dh * dot(d) + v + d * dot(nq * dh);
  return L * per_token + L * (L + 1) / 2 * nq * 2.0 * 2.0 * dh;
}

void layer(benchmark::State& state, const GqaShape& s, bool bd) {
  const GqaPair& pair = gqa_pair(s);
  const Index L = state.range(0);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, s.d);
  for (auto _ : state) {
    Eigen::MatrixXf y = bd ? pair.bd.forward(x) : pair.dense.forward(x);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["FLOP/s"] = benchmark::Counter(layer_flops(s, double(L), bd), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = layer_flops(s, double(L), false) / layer_flops(s, double(L), true);
}

int register_all() {
  for (const GqaShape& s : kShapes) {
    std::vector<std::string> impls{"dense_kernel", "bd"};
#ifdef BD_HAVE_OPENBLAS
    impls.insert(impls.begin() + 1, "dense_openblas");
#endif
    for (const std::string& impl : impls)
      benchmark::RegisterBenchmark(("gqa_v/" + std::string(s.name) + "/" + impl).c_str(),
                                   [s, impl](benchmark::State& st) { value_projection(st, s, impl); })
          ->Arg(1024)->Arg(4096)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
    for (const bool bd : {false, true})
      benchmark::RegisterBenchmark(("gqa_layer/" + std::string(s.name) + (bd ? "/bda" : "/mha")).c_str(),
                                   [s, bd](benchmark::State& st) { layer(st, s, bd); })
          ->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
  }
  return 0;
}

const int registered = register_all();

}  // namespace
