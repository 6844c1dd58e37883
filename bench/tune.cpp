// bd_tune: sweeps the tuning of bd's kernels (kernel/context.hpp) on the machine at hand and
// prints the row to add to the table, so that whoever lands on a new CPU records it in minutes.
//
//   bd_tune [--rounds N] [--quick]       the instruction set in use (BD_CPU forces another)
//
// Each parameter is swept in turn over its candidates, the others held at the best found so far
// (coordinate descent from the CPU's current row), on the workloads it moves:
//   gemm       the dense key projection at DeepSeek-V3's shape (1024 × 512 × 16384) and the fused
//              BD projection (basis start, 384 gathered channels), bd's two hot products
//   attention  a causal prefill (1024 tokens, 16 heads, depth 192, values 128) and absorbed MLA
//              decoding's attention (128 rows against a 16k-key latent, values in place)
//   decoding   one token's projection (1 × 4096 × 11008, the weights from memory) and few-row
//              attention (4 rows against 16k keys)
// Every candidate is timed paired with the incumbent, alternating, over `rounds` rounds; it wins
// when the median of its per-round ratios is below 0.97 (these VMs drift ±15 % over minutes, and
// pairing is what a drift cannot move). The figures are this machine's: a row goes into the
// table with them in docs/benchmarks.md, not in a comment.
#include <bd/kernel/context.hpp>
#include <bd/kernel/flash_attention.hpp>
#include <bd/kernel/gemm.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using bd::Index;
using bd::kernel::Tuning;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

/// The workloads, their operands made once.
struct Workloads {
  // gemm: X (1024 × 512), W (512 × 16384), C (384 × 16384); the basis a window at 256
  static constexpr Index L = 1024, d = 512, dh = 128, heads = 128, N = heads * dh;
  std::vector<float> x = random_values(L * d, 1), w = random_values(d * N, 2), c = random_values((d - dh) * N, 3);
  std::vector<float> out = std::vector<float>(std::size_t(L * N));
  std::vector<Index> all, rest, init;
  // attention
  static constexpr Index Lp = 1024, hp = 16, dqk = 192, dv = 128, Lk = 16384, latent = 512, rope = 64;
  std::vector<float> q = random_values(Lp * hp * dqk, 4), k = random_values(Lp * hp * dqk, 5), v = random_values(Lp * hp * dv, 6);
  std::vector<float> o = std::vector<float>(std::size_t(Lp * hp * dv));
  std::vector<float> qa = random_values(heads * latent, 7), qr = random_values(heads * rope, 8);
  std::vector<float> cache = random_values(Lk * latent, 9), cache_rope = random_values(Lk * rope, 10);
  std::vector<float> oa = std::vector<float>(std::size_t(heads * latent));
  // decoding: 1 × 4096 × 11008, six copies of the weights (over 1 GB) so that each call reads from memory
  static constexpr Index depth = 4096, cols = 11008, copies = 6;
  std::vector<std::vector<float>> weights;
  std::vector<float> token = random_values(depth, 11), token_out = std::vector<float>(cols);
  std::vector<float> q4 = random_values(4 * latent, 12), o4 = std::vector<float>(std::size_t(4 * latent));
  int copy = 0;

  Workloads() {
    all.resize(d), std::iota(all.begin(), all.end(), Index(0));
    for (Index ch = 0; ch < d; ++ch)
      if (ch < 256 || ch >= 256 + dh) rest.push_back(ch);
    for (Index col = 0; col < N; ++col) init.push_back(256 + col % dh);
    for (Index i = 0; i < copies; ++i) weights.push_back(random_values(depth * cols, unsigned(20 + i)));
  }

  void dense() {
    bd::kernel::GemmArguments<float, float> a;
    a.rows = L, a.x = x.data(), a.ldx = L, a.b = w.data(), a.ldb = d, a.out = out.data(), a.ldo = L;
    a.segments.push_back({all.data(), d, 0, N});
    bd::kernel::gemm(a);
  }
  void bd_projection() {
    bd::kernel::GemmArguments<float, float> a;
    a.rows = L, a.x = x.data(), a.ldx = L, a.b = c.data(), a.ldb = d - dh, a.out = out.data(), a.ldo = L;
    a.init_channels = init.data();
    a.segments.push_back({rest.data(), d - dh, 0, N});
    bd::kernel::gemm(a);
  }
  void prefill() {
    bd::kernel::AttentionArguments<float> a;
    a.q_len = a.k_len = Lp, a.n_q = a.n_k = a.n_v = hp, a.d_qk = dqk, a.d_v = dv;
    a.q = q.data(), a.ldq = Lp, a.k = k.data(), a.ldk = Lp, a.v = v.data(), a.ldv = Lp, a.out = o.data(), a.ldo = Lp;
    a.scale = 0.07f, a.causal = true;
    bd::kernel::flash_attention(a);
  }
  void absorbed(Index rows) {  // `rows` heads against the latent, values its first channels
    bd::kernel::AttentionArguments<float> a;
    a.q_len = 1, a.k_len = Lk, a.n_q = rows, a.d_qk = latent, a.d_rope = rope, a.d_v = latent;
    a.q = rows == heads ? qa.data() : q4.data(), a.ldq = 1, a.qr = qr.data(), a.ldqr = 1;
    a.k = cache.data(), a.ldk = Lk, a.kr = cache_rope.data(), a.ldkr = Lk, a.v = cache.data(), a.ldv = Lk;
    a.values_are_keys = true;
    a.out = rows == heads ? oa.data() : o4.data(), a.ldo = 1, a.scale = 0.05f;
    bd::kernel::flash_attention(a);
  }
  void decode() {
    bd::kernel::GemmArguments<float, float> a;
    std::vector<Index>& channels = decode_channels();
    a.rows = 1, a.x = token.data(), a.ldx = 1, a.b = weights[std::size_t(copy)].data(), a.ldb = depth;
    a.out = token_out.data(), a.ldo = 1;
    a.segments.push_back({channels.data(), depth, 0, cols});
    bd::kernel::gemm(a);
    copy = (copy + 1) % int(copies);
  }
  static std::vector<Index>& decode_channels() {
    static std::vector<Index> c = [] {
      std::vector<Index> v(depth);
      std::iota(v.begin(), v.end(), Index(0));
      return v;
    }();
    return c;
  }
};

double seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

/// The median over `rounds` of (time with `candidate`) / (time with `incumbent`), each round
/// running the workload under both, in alternating order.
double paired_ratio(bd::kernel::Isa isa, const Tuning& incumbent, const Tuning& candidate, const std::function<void()>& work,
                    int rounds) {
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    double t[2];
    for (int i = 0; i < 2; ++i) {
      const int which = (r + i) % 2;
      bd::kernel::use_tuning(isa, which ? candidate : incumbent);
      t[which] = seconds(work);
    }
    ratios.push_back(t[1] / t[0]);
  }
  bd::kernel::use_tuning(isa, incumbent);
  return median(ratios);
}

struct Parameter {
  const char* key;
  std::vector<Index> candidates;
  std::function<void()> work;
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--quick")) {
      rounds = 3;
    } else {
      std::fprintf(stderr, "usage: bd_tune [--rounds N] [--quick]\n");
      return 2;
    }
  }
  const bd::kernel::Isa isa = bd::kernel::active_isa();
  const bd::kernel::Context& context = bd::kernel::active_context();
  std::printf("bd_tune: %s\nstarting from: BD_TUNING=%s\npaired medians of %d rounds, candidate / incumbent "
              "(< 0.97 wins)\n\n",
              context.describe().c_str(), bd::kernel::to_string(context.tuning).c_str(), rounds);
  Workloads w;
  const auto both = [&](std::function<void()> a, std::function<void()> b) { return [a, b] { a(), b(); }; };
  const std::vector<Parameter> parameters = {
      {"mc", {48, 96, 144, 192, 288}, both([&] { w.dense(); }, [&] { w.bd_projection(); })},
      {"kc_max", {256, 384, 512, 768}, both([&] { w.dense(); }, [&] { w.bd_projection(); })},
      {"nc", {384, 768, 1536, 3072}, both([&] { w.dense(); }, [&] { w.bd_projection(); })},
      {"tile_prefetch", {0, 256, 512, 768}, both([&] { w.dense(); }, [&] { w.prefill(); })},
      {"keys_in_place", {0, 1}, both([&] { w.prefill(); }, [&] { w.absorbed(Workloads::heads); })},
      {"values_in_place", {0, 1}, [&] { w.absorbed(Workloads::heads); }},
      {"pack_prefetch", {0, 16, 32, 64}, both([&] { w.prefill(); }, [&] { w.absorbed(Workloads::heads); })},
      {"key_block", {64 << 10, 128 << 10, 256 << 10, 512 << 10}, both([&] { w.prefill(); }, [&] { w.absorbed(Workloads::heads); })},
      {"stream_prefetch", {0, 1024, 2048, 4096}, [&] { w.absorbed(4); }},
      {"row_walk", {4096, 8192, 16384, 1 << 20}, [&] { w.decode(); }},
      {"skinny_group", {32, 64, 128, 256}, [&] { w.decode(); }},
  };
  Tuning best = context.tuning;
  for (const Parameter& p : parameters) {
    const std::string current = bd::kernel::to_string(best);
    std::printf("%-16s", p.key);
    for (Index value : p.candidates) {
      std::string spec = std::string(p.key) + "=" + std::to_string(value);
      if (!std::strcmp(p.key, "kc_max")) spec = "kc_min=" + std::to_string(std::min(best.kc_min, value)) + "," + spec;
      const Tuning candidate = bd::kernel::parse_tuning(spec, best, "bd_tune");
      if (bd::kernel::to_string(candidate) == current) {
        std::printf("  %lld: (current)", static_cast<long long>(value));
        continue;
      }
      p.work();  // warm the candidate's buffers
      const double ratio = paired_ratio(isa, best, candidate, p.work, rounds);
      std::printf("  %lld: %.3f", static_cast<long long>(value), ratio);
      std::fflush(stdout);
      if (ratio < 0.97) best = candidate;
    }
    std::printf("\n");
  }
  std::printf("\nthe row (BD_TUNING's spelling; a table row in kernel/context.hpp lists what differs from the model):\n"
              "BD_TUNING=%s\n",
              bd::kernel::to_string(best).c_str());
  return 0;
}
