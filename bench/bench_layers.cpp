// Whole layers, dense against BD, in the same executable with the same threads and precision (fp32):
//
//   attention/<mha|bda>/<L>      one causal self-attention forward over L tokens (peak_MB: the
//                                memory it adds at its peak over the resident weights);
//   decode/<mha|bda>/<context>   one new token against a KV cache of `context` tokens;
//   attention/interleaved/<L>, decode/interleaved/<context>
//                                the dense and the BD layer called in turn within one benchmark
//                                (interleaved.hpp): each one's median, their ratio and its share
//                                of the FLOP ratio, from the same seconds of the machine; the
//                                forward's rotation holds the GEMM yardstick too (its share);
//   decode/interleaved_kv_bf16/<context>  BD's token on a KV cache stored in f32 and on one stored
//                                in bf16, in turn: bf16_vs_f32;
//   attention/interleaved_bf16/<L>  the same with both layers stored in bf16 and computing in bf16
//                                (their projections and attention) and the yardstick GEMM in
//                                bf16 too: the shares of the bf16 GEMM rate;
//   attention/flash/<L>          the layers' attention alone (flash attention, causal), with the
//                                GEMM yardstick in turn: its share of the GEMM rate;
//   attention/flash_bf16/<L>     the same in bf16 compute beside the bf16 GEMM and the f32
//                                attention: its share of the bf16 GEMM rate, bf16_over_f32;
//   gemm/bd_kernel/<L>           the dense GEMM rate of bd's kernel in the same run (the yardstick);
//   linear/<impl>/<shape>        L = 1024 tokens through a LLaMA2-7B projection at the rank that
//                                keeps 80 % of its parameters (the paper's low-rank table);
//                                every implementation writes into a preallocated y; *_kernel are
//                                the dense and low-rank twins on bd's own kernel (lowrank_kernel
//                                is LowRankLinear), dense and lowrank Eigen's products;
//   linear_cpu_<isa>/bd/<shape>  BDLinear with its kernels forced to each instruction set;
//   linear/interleaved/<shape>   BDLinear and its low-rank twins (bd's kernel, OpenBLAS) called in
//                                turn within one benchmark (interleaved.hpp): medians and ratios
//                                from the same seconds of the machine, and paired_speedup (the
//                                median of each iteration's faster twin over its BD call).
//   linear/interleaved_bf16/<shape>  BDLinear and its low-rank twin on bd's kernel, both stored
//                                in bf16 and computing in bf16, and BDLinear in f32, in turn:
//                                BD's share of its theory in bf16, and bf16 against f32.
//
// The attention layer is DeepSeek-V3's MLA at full size except its query LoRA (queries straight
// from x, decoded with the per-head K'/V' cache; bench_mla.cpp runs V3 as it is served, with the
// query LoRA and the latent cache): hidden 7168, 128 heads, latent 512, d_h = 128, decoupled RoPE 64.
// BD (QK and VO, first-rows basis: speed does not depend on which rows) changes only the key and
// value projections out of the latent, K'/V' = c[:, S] + c[:, R]·C, so the layer's speedup is
// bounded by their share of its work, which the `kv_share` counter reports (from the FLOP count).
#include <benchmark/benchmark.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <bd/nn/bd_attention.hpp>
#include <bd/kernel/flash_attention.hpp>
#include <bd/kernel/matmul.hpp>
#include <bd/nn/bd_linear.hpp>
#include <bd/nn/multi_head_attention.hpp>

#ifdef BD_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef BD_HAVE_BLIS
#include "blis_baseline.hpp"
#endif
#include "bf16_layers.hpp"
#include "interleaved.hpp"

namespace {

using bd::nn::AttentionConfig;
using bd::nn::AttentionWeights;
using bd::nn::BDAttention;
using bd::nn::MultiHeadAttention;
using Eigen::Index;

// DeepSeek-V3 attention (config.json of deepseek-ai/DeepSeek-V3), without q_lora_rank here.
constexpr Index kHidden = 7168, kHeads = 128, kLatent = 512, kHeadDim = 128, kRopeDim = 64;

struct AttentionPair {
  MultiHeadAttention<float> dense;
  BDAttention<float> bd;
};

const AttentionPair& attention_pair() {
  static const AttentionPair pair = [] {
    AttentionConfig c;
    c.n_q = c.n_kv = kHeads;
    c.head_dim = c.v_head_dim = kHeadDim;
    c.rope_dim = kRopeDim;
    c.causal = true;
    AttentionWeights<float> w;
    const auto gaussian = [](Index rows, Index cols, float scale) -> Eigen::MatrixXf {
      return Eigen::MatrixXf::Random(rows, cols) * (scale * 1.732f);  // uniform with variance scale²
    };
    w.Wq = gaussian(kHidden, kHeads * kHeadDim, 1 / std::sqrt(float(kHidden)));
    w.Wk = gaussian(kLatent, kHeads * kHeadDim, 1 / std::sqrt(float(kLatent)));
    w.Wv = gaussian(kLatent, kHeads * kHeadDim, 1 / std::sqrt(float(kLatent)));
    w.Wo = gaussian(kHeads * kHeadDim, kHidden, 1 / std::sqrt(float(kHeads * kHeadDim)));
    w.W_dkv = gaussian(kHidden, kLatent, 1 / std::sqrt(float(kHidden)));
    w.kv_norm = Eigen::VectorXf::Ones(kLatent);
    w.Wq_rope = gaussian(kHidden, kHeads * kRopeDim, 1 / std::sqrt(float(kHidden)));
    w.Wk_rope = gaussian(kHidden, kRopeDim, 1 / std::sqrt(float(kHidden)));
    MultiHeadAttention<float> dense(c, std::move(w));
    auto bd = BDAttention<float>::prepare(dense, bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
    return AttentionPair{std::move(dense), std::move(bd)};
  }();
  return pair;
}

/// FLOPs of one dense layer over L query tokens and `keys` keys, and the part in K/V projections.
struct LayerFlops {
  double total, kv;
};
/// The attention's own FLOPs, scores and P·V, for L query tokens seeing `keys` keys on average.
double attend_flops(double L, double keys) { return 2 * L * keys * kHeads * (kHeadDim + kRopeDim + kHeadDim); }

LayerFlops attention_flops(double L, double keys, bool bd) {
  const double n_dh = double(kHeads * kHeadDim);
  const double kv = 2 * L * 2 * (bd ? kLatent - kHeadDim : kLatent) * n_dh;           // K and V
  const double proj = 2 * L * (kHidden * (n_dh + kHeads * kRopeDim + kLatent + kRopeDim) + n_dh * kHidden);
  const double attend = attend_flops(L, keys);
  return {proj + kv + attend, kv};
}

void layer_counters(benchmark::State& state, const LayerFlops& f, const LayerFlops& dense) {
  state.counters["FLOP/s"] = benchmark::Counter(f.total, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["kv_share"] = dense.kv / dense.total;
  state.counters["theoretical_ratio"] = dense.total / f.total;
}

/// The memory a step adds at its peak over what was resident before it (Linux: VmHWM, reset
/// through /proc/self/clear_refs; 0 where that is not available), in MB. Free heap memory is
/// handed back first (malloc_trim: preparing the layers leaves gigabytes of it resident in the
/// allocator's arenas, which the step would reuse unseen).
class PeakMemory {
public:
  PeakMemory() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM ← VmRSS
    before_ = status_kb("VmRSS:");
  }
  double extra_mb() const { return double(status_kb("VmHWM:") - before_) / 1024.0; }

private:
  static long status_kb(const char* key) {
    std::ifstream f("/proc/self/status");
    for (std::string line; std::getline(f, line);)
      if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
    return 0;
  }
  long before_ = 0;
};

void attention(benchmark::State& state, bool bd) {
  const AttentionPair& pair = attention_pair();
  const Index L = state.range(0);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, kHidden);
  const PeakMemory memory;
  // A workspace of this run's own, so that the peak counts the buffers the forward keeps there
  // (Q, K, V, O); one call untimed first sizes them, as a server's first request would.
  bd::Workspace ws;
  const auto forward = [&] { return bd ? pair.bd.forward(x, ws) : pair.dense.forward(x, ws); };
  benchmark::DoNotOptimize(forward().data());
  for (auto _ : state) {
    Eigen::MatrixXf y = forward();
    benchmark::DoNotOptimize(y.data());
  }
  // What the forward holds at its peak beyond the weights: Q, K, V, the RoPE parts, O and y —
  // O(L·d); an L×L score matrix per head would add L²·heads·4 bytes.
  state.counters["peak_MB"] = memory.extra_mb();
  state.counters["LxL_per_head_MB"] = double(L) * double(L) * double(kHeads) * 4 / (1024.0 * 1024.0);
  // Causal: query i sees i + 1 keys, (L + 1)/2 on average — the work the layer must do (the
  // flash core skips the tiles above the diagonal).
  const double keys = (double(L) + 1) / 2;
  layer_counters(state, attention_flops(double(L), keys, bd), attention_flops(double(L), keys, false));
}

/// A cache of `context` tokens of K (K' for BD: one per query head here, as n_q = n_kv), V and
/// the shared RoPE key; their values do not change the work. One token more than `context` is
/// appended and dropped again, so the cache already has room for the decoded token: no iteration
/// times the cache's growth (a copy of all of it). Stored in `storage`: f32, or bf16.
bd::nn::KVCache<float> filled_cache(Index context, bd::Storage storage = bd::Storage::F32) {
  bd::nn::KVCache<float> cache(storage);
  cache.append(Eigen::MatrixXf::Constant(context + 1, kHeads * kHeadDim, 0.01f),
               Eigen::MatrixXf::Constant(context + 1, kHeads * kHeadDim, 0.01f),
               Eigen::MatrixXf::Constant(context + 1, kRopeDim, 0.01f));
  cache.truncate(context);
  return cache;
}

void decode(benchmark::State& state, bool bd) {
  const AttentionPair& pair = attention_pair();
  const Index context = state.range(0);
  bd::nn::KVCache<float> cache = filled_cache(context);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(1, kHidden);
  for (auto _ : state) {
    Eigen::MatrixXf y = bd ? pair.bd.decode(x, cache) : pair.dense.decode(x, cache);
    benchmark::DoNotOptimize(y.data());
    cache.truncate(context);
  }
  layer_counters(state, attention_flops(1, double(context + 1), bd), attention_flops(1, double(context + 1), false));
}

/// The counters of an interleaved pair: t = {dense, BD} medians in seconds.
void interleaved_counters(benchmark::State& state, const std::vector<double>& t, const LayerFlops& dense, const LayerFlops& bd) {
  bd_bench::pair_counters(state, t[0], t[1], dense.total / bd.total);
  state.counters["kv_share"] = dense.kv / dense.total;
}

/// The layer's largest product, the output projection (L × 16384 by 16384 × 7168), as a plain
/// GEMM on bd's kernel: the yardstick of the layers' FLOP rates (gemm_rate, attention_interleaved).
struct OutputProjectionGemm {
  Index L, depth = kHeads * kHeadDim;
  Eigen::MatrixXf x, w, y;
  bd::kernel::Compute compute;
  explicit OutputProjectionGemm(Index rows, bd::kernel::Compute c = bd::kernel::Compute::F32)
      : L(rows), x(Eigen::MatrixXf::Random(rows, depth)), w(Eigen::MatrixXf::Random(depth, kHidden)), y(rows, kHidden),
        compute(c) {}
  void operator()() {
    bd::kernel::linear_into<float, float>(x.data(), L, L, depth, w.data(), depth, false, kHidden, nullptr, y.data(), L, 0,
                                          bd::default_workspace(), compute);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  double flops() const { return 2.0 * double(L) * double(depth) * double(kHidden); }
};

/// attention/interleaved/<L>: the dense and the BD forward over L tokens and, third, the layer's
/// largest GEMM on bd's kernel (the output projection, L × 16384 by 16384 × 7168, gemm_rate's),
/// called in turn: each layer's FLOP rate as a share of the GEMM rate measured in the same
/// seconds (`mha_share_of_gemm`, `bda_share_of_gemm`), which a run-to-run GEMM figure beside
/// it cannot give on a machine whose speed drifts within the hour.
void attention_interleaved(benchmark::State& state) {
  const AttentionPair& pair = attention_pair();
  const Index L = state.range(0);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, kHidden);
  OutputProjectionGemm gemm(L);
  const auto call = [&](bool bd) {
    return [&, bd] {
      Eigen::MatrixXf y = bd ? pair.bd.forward(x) : pair.dense.forward(x);
      benchmark::DoNotOptimize(y.data());
    };
  };
  const std::vector<double> t = bd_bench::time_interleaved(state, {call(false), call(true), [&] { gemm(); }});
  const double keys = (double(L) + 1) / 2;
  const LayerFlops dense = attention_flops(double(L), keys, false), bd = attention_flops(double(L), keys, true);
  interleaved_counters(state, t, dense, bd);
  const double rate = gemm.flops() / t[2];
  state.counters["gemm_GFLOP/s"] = rate * 1e-9;
  state.counters["mha_share_of_gemm"] = dense.total / t[0] / rate;
  state.counters["bda_share_of_gemm"] = bd.total / t[1] / rate;
}

/// The pair stored in bf16 and computing in bf16 (bf16_layers.hpp).
const bd_bench::Bf16LayerPair& bf16_attention_pair() {
  static const bd_bench::Bf16LayerPair pair = bd_bench::bf16_layer_pair(attention_pair().dense);
  return pair;
}

/// attention/interleaved_bf16/<L>: attention_interleaved's three calls in bf16: the two layers
/// stored and computing in bf16, the output projection's GEMM on bf16 weights in bf16 compute.
void attention_interleaved_bf16(benchmark::State& state) {
  const bd_bench::Bf16LayerPair& pair = bf16_attention_pair();
  const Index L = state.range(0), depth = kHeads * kHeadDim;
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(L, kHidden), o = Eigen::MatrixXf::Random(L, depth);
  const Eigen::Matrix<Eigen::bfloat16, -1, -1> w = Eigen::MatrixXf::Random(depth, kHidden).cast<Eigen::bfloat16>();
  Eigen::MatrixXf y(L, kHidden);
  const auto call = [&](bool bd) {
    return [&, bd] {
      Eigen::MatrixXf out = bd ? pair.bd.forward(x) : pair.dense.forward(x);
      benchmark::DoNotOptimize(out.data());
    };
  };
  const auto gemm = [&] {
    bd::kernel::linear_into<float, Eigen::bfloat16>(o.data(), L, L, depth, w.data(), depth, false, kHidden, nullptr, y.data(), L, 0,
                                                    bd::default_workspace(), bd::kernel::Compute::BF16);
    benchmark::DoNotOptimize(y.data());
  };
  const std::vector<double> t = bd_bench::time_interleaved(state, {call(false), call(true), gemm});
  const double keys = (double(L) + 1) / 2;
  const LayerFlops dense = attention_flops(double(L), keys, false), bd = attention_flops(double(L), keys, true);
  interleaved_counters(state, t, dense, bd);
  const double rate = 2.0 * double(L) * double(depth) * double(kHidden) / t[2];
  state.counters["gemm_bf16_GFLOP/s"] = rate * 1e-9;
  state.counters["mha_share_of_gemm"] = dense.total / t[0] / rate;
  state.counters["bda_share_of_gemm"] = bd.total / t[1] / rate;
}

/// attention/flash/<L>: the layer's attention alone — flash attention's causal softmax(Q·Kᵀ)·V for
/// its 128 heads over L tokens (d_qk 128 + RoPE 64, d_v 128), as the forward calls it — and the
/// output projection's GEMM (gemm_rate's) in turn: its FLOP rate (the causal half of the scores
/// and P·V, what the kernel must do) and its share of the GEMM's from the same seconds.
/// attention/flash_bf16/<L>: the same attention in bf16 compute beside the same in f32 and the
/// GEMM in bf16: its share of the bf16 GEMM rate, and `bf16_over_f32` (paired).
void flash_interleaved(benchmark::State& state, bd::kernel::Compute compute) {
  using bd::kernel::Compute;
  const Index L = state.range(0);
  const Eigen::MatrixXf q = Eigen::MatrixXf::Random(L, kHeads * kHeadDim), qr = Eigen::MatrixXf::Random(L, kHeads * kRopeDim);
  const Eigen::MatrixXf k = Eigen::MatrixXf::Random(L, kHeads * kHeadDim), kr = Eigen::MatrixXf::Random(L, kRopeDim);
  const Eigen::MatrixXf v = Eigen::MatrixXf::Random(L, kHeads * kHeadDim);
  Eigen::MatrixXf out(L, kHeads * kHeadDim);
  bd::kernel::AttentionArguments<float> a;
  a.q_len = a.k_len = L;
  a.n_q = a.n_k = a.n_v = kHeads;
  a.d_qk = a.d_v = kHeadDim, a.d_rope = kRopeDim;
  a.q = q.data(), a.qr = qr.data(), a.k = k.data(), a.kr = kr.data(), a.v = v.data(), a.out = out.data();
  a.ldq = a.ldqr = a.ldk = a.ldkr = a.ldv = a.ldo = L;
  a.scale = 1 / std::sqrt(float(kHeadDim + kRopeDim));
  a.causal = true;
  OutputProjectionGemm gemm(L, compute);
  const auto flash = [&](Compute c) {
    return [&, c] {
      bd::kernel::AttentionArguments<float> call = a;
      call.compute = c;
      bd::kernel::flash_attention(call);
      benchmark::DoNotOptimize(out.data());
    };
  };
  std::vector<std::vector<double>> seconds;
  std::vector<std::function<void()>> calls{flash(compute), [&] { gemm(); }};
  if (compute == Compute::BF16) calls.push_back(flash(Compute::F32));
  const std::vector<double> t = bd_bench::time_interleaved(state, calls, {}, &seconds);
  const double flops = attend_flops(double(L), (double(L) + 1) / 2);
  const double rate = gemm.flops() / t[1];
  state.counters["flash_ms"] = t[0] * 1e3;
  state.counters["flash_GFLOP/s"] = flops / t[0] * 1e-9;
  state.counters["gemm_GFLOP/s"] = rate * 1e-9;
  state.counters["share_of_gemm"] = flops / t[0] / rate;
  if (compute == Compute::BF16) {
    state.counters["flash_f32_ms"] = t[2] * 1e3;
    state.counters["bf16_over_f32"] = bd_bench::paired_ratio(seconds[0], seconds[2]);
  }
}

/// decode/interleaved/<context>: one token through the dense and the BD layer, called in turn.
/// Both read one cache — K and K' (V and V') have the same shape here and their values do not
/// change the work — so the run holds one cache (2 GiB at 16k context), not two.
void decode_interleaved(benchmark::State& state) {
  const AttentionPair& pair = attention_pair();
  const Index context = state.range(0);
  bd::nn::KVCache<float> cache = filled_cache(context);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(1, kHidden);
  const auto call = [&](bool bd) {
    return [&, bd] {
      Eigen::MatrixXf y = bd ? pair.bd.decode(x, cache) : pair.dense.decode(x, cache);
      benchmark::DoNotOptimize(y.data());
      cache.truncate(context);
    };
  };
  const std::vector<double> t = bd_bench::time_interleaved(state, {call(false), call(true)});
  interleaved_counters(state, t, attention_flops(1, double(context + 1), false), attention_flops(1, double(context + 1), true));
}

/// decode/interleaved_kv_bf16/<context>: BD's decoded token on a KV cache stored in f32 and on one
/// stored in bf16 (half the bytes a token reads), in turn; the layer computes in f32 on both.
/// Counters: each median (ms), bf16_vs_f32 (< 1: the bf16 cache faster) and its paired median.
void decode_kv_bf16(benchmark::State& state) {
  const AttentionPair& pair = attention_pair();
  const Index context = state.range(0);
  bd::nn::KVCache<float> f32 = filled_cache(context), bf16 = filled_cache(context, bd::Storage::BF16);
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(1, kHidden);
  const auto call = [&](bd::nn::KVCache<float>& cache) {
    return [&] {
      Eigen::MatrixXf y = pair.bd.decode(x, cache);
      benchmark::DoNotOptimize(y.data());
      cache.truncate(context);
    };
  };
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(state, {call(f32), call(bf16)}, {}, &seconds);
  state.counters["f32_cache_ms"] = t[0] * 1e3;
  state.counters["bf16_cache_ms"] = t[1] * 1e3;
  state.counters["bf16_vs_f32"] = t[1] / t[0];
  state.counters["paired_bf16_vs_f32"] = bd_bench::paired_ratio(seconds[1], seconds[0]);
}

/// The machine's dense GEMM rate on bd's kernel in the same run, at the layer's largest product
/// (the output projection, L × 16384 by 16384 × 7168): the yardstick of the layers' FLOP/s.
void gemm_rate(benchmark::State& state) {
  OutputProjectionGemm gemm(state.range(0));
  for (auto _ : state) gemm();
  state.counters["FLOP/s"] = benchmark::Counter(gemm.flops(), benchmark::Counter::kIsIterationInvariantRate);
}

// ---- linear ----------------------------------------------------------------------------------

constexpr Index kTokens = 1024;

struct LinearShape {
  Index d_in, d_out;
  Index rank() const { return Index(0.8 * double(d_in) * double(d_out) / double(d_in + d_out)); }  // 80 % of d_in·d_out
  std::string name() const { return std::to_string(d_in) + "x" + std::to_string(d_out); }
};

struct LinearLayers {
  Eigen::MatrixXf W;
  bd::nn::LowRankLinear<float> low_rank;
  bd::nn::BDLinear<float> bd;
};

const LinearLayers& linear_layers(const LinearShape& s) {
  static std::map<Index, LinearLayers> cache;
  auto it = cache.find(s.d_out);
  if (it == cache.end()) {
    const Index r = s.rank();
    Eigen::MatrixXf U = Eigen::MatrixXf::Random(s.d_in, r) / std::sqrt(float(s.d_in));
    Eigen::MatrixXf V = Eigen::MatrixXf::Random(s.d_out, r) / std::sqrt(float(r));
    LinearLayers layers;
    layers.W = U * V.transpose();
    layers.low_rank = bd::nn::LowRankLinear<float>(U, V);
    bd::Options opts;
    opts.basis = bd::Basis::First;
    layers.bd = bd::nn::BDLinear<float>::from_low_rank(layers.low_rank, opts);
    it = cache.emplace(s.d_out, std::move(layers)).first;
  }
  return it->second;
}

/// Buffers of one linear benchmark: L tokens in, the output, the low-rank twins' hidden layer.
struct LinearRun {
  explicit LinearRun(const LinearShape& s)
      : x(Eigen::MatrixXf::Random(kTokens, s.d_in)), y(kTokens, s.d_out), h(kTokens, s.rank()) {
    y.setConstant(1.0f), h.setConstant(1.0f);  // every page written before the timing starts
    benchmark::DoNotOptimize(y.data()), benchmark::DoNotOptimize(h.data());
  }
  Eigen::MatrixXf x, y, h;
};

/// One call of `impl` on shape s, into run's buffers.
std::function<void()> linear_call(const std::string& impl, const LinearShape& s, LinearRun& run) {
  const LinearLayers& layers = linear_layers(s);
  return [impl, s, &layers, &run, Vt = Eigen::MatrixXf(layers.low_rank.V().transpose())]() {  // Vt: r × d_out, for the BLAS calls
    const Index r = s.rank();
    const Eigen::MatrixXf &x = run.x, &U = layers.low_rank.U();
    Eigen::MatrixXf &y = run.y, &h = run.h;
    (void)r, (void)U, (void)Vt;
    if (impl == "dense") {
      y.noalias() = x * layers.W;
    } else if (impl == "lowrank") {  // Eigen's products, at the speed of the build's flags
      h.noalias() = x * U;
      y.noalias() = h * Vt;
    } else if (impl == "lowrank_kernel") {  // the low-rank twin on bd's own kernel: LowRankLinear
      layers.low_rank.forward_into(x, y);
    } else if (impl == "dense_kernel") {
      bd::kernel::linear_into<float, float>(x.data(), kTokens, kTokens, s.d_in, layers.W.data(), s.d_in, false, s.d_out,
                                            nullptr, y.data(), kTokens);
    } else if (impl == "bd") {
      layers.bd.forward_into(x, y);
#ifdef BD_HAVE_OPENBLAS
    } else if (impl == "dense_openblas") {
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, int(kTokens), int(s.d_out), int(s.d_in), 1.0f, x.data(),
                  int(kTokens), layers.W.data(), int(s.d_in), 0.0f, y.data(), int(kTokens));
    } else if (impl == "lowrank_openblas") {
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, int(kTokens), int(r), int(s.d_in), 1.0f, x.data(),
                  int(kTokens), U.data(), int(s.d_in), 0.0f, h.data(), int(kTokens));
      cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, int(kTokens), int(s.d_out), int(r), 1.0f, h.data(),
                  int(kTokens), Vt.data(), int(r), 0.0f, y.data(), int(kTokens));
#endif
#ifdef BD_HAVE_BLIS
    } else if (impl == "dense_blis") {
      bd_bench::blis_sgemm(kTokens, s.d_out, s.d_in, x.data(), kTokens, layers.W.data(), s.d_in, y.data(), kTokens);
    } else if (impl == "lowrank_blis") {
      bd_bench::blis_sgemm(kTokens, r, s.d_in, x.data(), kTokens, U.data(), s.d_in, h.data(), kTokens);
      bd_bench::blis_sgemm(kTokens, s.d_out, r, h.data(), kTokens, Vt.data(), r, y.data(), kTokens);
#endif
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  };
}

/// FLOPs per token of the dense layer, its low-rank twin and BD.
struct LinearFlops {
  double dense, low, bd;
  explicit LinearFlops(const LinearShape& s) {
    const double r = double(s.rank());
    dense = 2.0 * double(s.d_in) * double(s.d_out), low = 2.0 * r * double(s.d_in + s.d_out), bd = 2.0 * r * (double(s.d_in + s.d_out) - r);
  }
};

void linear(benchmark::State& state, const std::string& impl, const LinearShape& s) {
  LinearRun run(s);
  const std::function<void()> call = linear_call(impl, s, run);
  for (auto _ : state) call();
  const LinearFlops f(s);
  const double flops = impl.rfind("dense", 0) == 0 ? f.dense : impl.rfind("lowrank", 0) == 0 ? f.low : f.bd;
  state.counters["FLOP/s"] = benchmark::Counter(flops * double(kTokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["theoretical_ratio"] = f.low / f.bd;  // BD against the low-rank layer it equals
  state.counters["rank"] = double(s.rank());
}

/// linear/interleaved/<shape>: BDLinear, its low-rank twin on bd's kernel, and that twin on
/// OpenBLAS (where built), one call each per iteration in balanced orders (interleaved.hpp;
/// OpenBLAS settles, untimed, after its call); BD against the faster twin is the figure the
/// targets name.
void linear_interleaved(benchmark::State& state, const LinearShape& s) {
  LinearRun run(s);
  std::vector<std::function<void()>> calls{linear_call("bd", s, run), linear_call("lowrank_kernel", s, run)};
  std::vector<double> settle;
#ifdef BD_HAVE_OPENBLAS
  calls.push_back(linear_call("lowrank_openblas", s, run));
  settle = {0, 0, bd_bench::kOpenBlasSettleSeconds};
#endif
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(state, calls, settle, &seconds);
  const LinearFlops f(s);
  const double twin = calls.size() > 2 ? std::min(t[1], t[2]) : t[1];
  // Paired: each iteration's faster twin over that iteration's BD call, the median of those
  // ratios (interleaved.hpp's paired_ratio), so that a drift of the machine between iterations
  // cancels in every ratio and not only in the medians'.
  const std::vector<double> twin_seconds = calls.size() > 2 ? bd_bench::faster_of(seconds[1], seconds[2]) : seconds[1];
  const double paired = bd_bench::paired_ratio(twin_seconds, seconds[0]);
  state.counters["bd_ms"] = t[0] * 1e3;
  state.counters["lowrank_kernel_ms"] = t[1] * 1e3;
  if (calls.size() > 2) state.counters["lowrank_openblas_ms"] = t[2] * 1e3;
  state.counters["speedup"] = twin / t[0];  // against the faster low-rank twin
  state.counters["theoretical_ratio"] = f.low / f.bd;
  state.counters["share_of_theory"] = twin / t[0] / (f.low / f.bd);
  state.counters["paired_speedup"] = paired;
  state.counters["paired_share_of_theory"] = paired / (f.low / f.bd);
  state.counters["rank"] = double(s.rank());
}

/// linear/interleaved_bf16/<shape>: BDLinear and LowRankLinear stored in bf16 and computing in
/// bf16 (from the same factors as linear_layers'), and the f32 BDLinear, one call each per
/// iteration in balanced orders.
void linear_interleaved_bf16(benchmark::State& state, const LinearShape& s) {
  using Bf16 = Eigen::bfloat16;
  const LinearLayers& f32 = linear_layers(s);
  bd::nn::LowRankLinear<Bf16> low_rank(f32.low_rank.U().cast<Bf16>(), Eigen::MatrixXf(f32.low_rank.V()).cast<Bf16>());
  bd::Options opts;
  opts.basis = bd::Basis::First;
  bd::nn::BDLinear<Bf16> bd_layer = bd::nn::BDLinear<Bf16>::from_low_rank(f32.low_rank, opts);
  low_rank.set_compute(bd::kernel::Compute::BF16), bd_layer.set_compute(bd::kernel::Compute::BF16);
  LinearRun run(s);
  const std::vector<std::function<void()>> calls{[&] { bd_layer.forward_into(run.x, run.y); },
                                                 [&] { low_rank.forward_into(run.x, run.y); },
                                                 [&] { f32.bd.forward_into(run.x, run.y); }};
  for (const auto& call : calls) call();  // warm: each layer's workspace
  std::vector<std::vector<double>> seconds;
  const std::vector<double> t = bd_bench::time_interleaved(state, calls, {}, &seconds);
  const LinearFlops f(s);
  state.counters["bd_bf16_ms"] = t[0] * 1e3;
  state.counters["lowrank_bf16_ms"] = t[1] * 1e3;
  state.counters["bd_f32_ms"] = t[2] * 1e3;
  state.counters["speedup"] = t[1] / t[0];
  state.counters["theoretical_ratio"] = f.low / f.bd;
  state.counters["share_of_theory"] = t[1] / t[0] / (f.low / f.bd);
  state.counters["paired_share_of_theory"] = bd_bench::paired_ratio(seconds[1], seconds[0]) / (f.low / f.bd);
  state.counters["paired_bf16_vs_f32"] = bd_bench::paired_ratio(seconds[2], seconds[0]);
}

int register_all() {
  for (const bool bd : {false, true}) {
    const std::string name = bd ? "bda" : "mha";
    benchmark::RegisterBenchmark(("attention/" + name).c_str(), [bd](benchmark::State& s) { attention(s, bd); })
        ->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
    benchmark::RegisterBenchmark(("decode/" + name).c_str(), [bd](benchmark::State& s) { decode(s, bd); })
        ->Arg(1024)->Arg(4096)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
  }
  benchmark::RegisterBenchmark("attention/interleaved", attention_interleaved)
      ->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
  benchmark::RegisterBenchmark("attention/interleaved_bf16", attention_interleaved_bf16)
      ->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
  benchmark::RegisterBenchmark("attention/flash", flash_interleaved, bd::kernel::Compute::F32)
      ->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  benchmark::RegisterBenchmark("attention/flash_bf16", flash_interleaved, bd::kernel::Compute::BF16)
      ->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  benchmark::RegisterBenchmark("decode/interleaved", decode_interleaved)
      ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
  benchmark::RegisterBenchmark("decode/interleaved_kv_bf16", decode_kv_bf16)
      ->Arg(1024)->Arg(16384)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(3.0);
  benchmark::RegisterBenchmark("gemm/bd_kernel", gemm_rate)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
  std::vector<std::string> impls{"dense", "dense_kernel", "lowrank", "lowrank_kernel", "bd"};
#ifdef BD_HAVE_OPENBLAS
  impls.insert(impls.begin() + 1, "dense_openblas");
  impls.insert(impls.begin() + 3, "lowrank_openblas");
#endif
#ifdef BD_HAVE_BLIS
  bd_bench::blis_set_threads(Eigen::nbThreads());
  impls.insert(impls.begin() + 1, "dense_blis");
  impls.insert(impls.end() - 1, "lowrank_blis");
#endif
  for (const LinearShape s : {LinearShape{4096, 4096}, LinearShape{4096, 11008}}) {
    for (const auto& impl : impls)
      benchmark::RegisterBenchmark(("linear/" + impl + "/" + s.name()).c_str(),
                                   [impl, s](benchmark::State& st) { linear(st, impl, s); })
          ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
    benchmark::RegisterBenchmark(("linear/interleaved/" + s.name()).c_str(),
                                 [s](benchmark::State& st) { linear_interleaved(st, s); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(4.0);
    benchmark::RegisterBenchmark(("linear/interleaved_bf16/" + s.name()).c_str(),
                                 [s](benchmark::State& st) { linear_interleaved_bf16(st, s); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(4.0);
    // The BD_CPU sweep: BDLinear on each instruction set this CPU runs.
    for (bd::kernel::Isa isa : {bd::kernel::Isa::Portable, bd::kernel::Isa::AVX2, bd::kernel::Isa::AVX512}) {
      if (!bd::kernel::cpu_has(isa)) continue;
      benchmark::RegisterBenchmark((std::string("linear_cpu_") + bd::kernel::to_string(isa) + "/bd/" + s.name()).c_str(),
                                   [isa, s](benchmark::State& st) {
                                     const bd::kernel::Isa before = bd::kernel::active_isa();
                                     bd::kernel::use_isa(isa);
                                     linear(st, "bd", s);
                                     bd::kernel::use_isa(before);
                                   })
          ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.3);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
