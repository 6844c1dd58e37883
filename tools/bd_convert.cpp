// bd-convert — converts a Hugging Face checkpoint's attention to Basis Decomposition form.
//
//   bd-convert --arch ARCH --mode MODE [--dtype TYPE] [--basis BASIS] [--align N]
//              [--windows WINDOWS] [--latent-window-last] [--force] [--quiet]
//              [--report FILE.json] INPUT OUTPUT
//   bd-convert --demo [--layers N] [--dtype f16|bf16|f32] [--compute f32|bf16]
//
// The names each option takes come from the library's tables (arch_names, mode_names,
// storage_names, basis_names, windows_names) and are listed by --help.
//
// INPUT is a Hugging Face model folder (config.json and model.safetensors, or shards with
// model.safetensors.index.json). OUTPUT ending in .safetensors is one file; otherwise a new
// folder mirroring INPUT. Progress goes to stderr, one line per layer; the table to stdout.
//
// Exit codes: 0 success, 1 bad input or a refused conversion, 2 usage errors.
#include <bd/core/heap.hpp>
#include <bd/io/convert.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "synthetic_deepseek.hpp"  // demo data (examples/)

namespace {

/// An option's names, "a|b|c", from the library's table of them; `skip` is left out.
template <typename E, std::size_t N>
std::string choices(const std::pair<E, const char*> (&table)[N], std::optional<E> skip = std::nullopt) {
  std::string out;
  for (const auto& [value, name] : table)
    if (value != skip) out += (out.empty() ? "" : "|") + std::string(name);
  return out;
}

std::string usage() {
  // --basis window takes the window at Options::offset, which bd-convert does not set: not offered.
  return "usage: bd-convert --arch " + choices(bd::io::arch_names) + " --mode " + choices(bd::nn::mode_names) +
         " [--dtype " + choices(bd::storage_names) + "]\n"
         "                  [--basis " + choices(bd::basis_names, std::optional(bd::Basis::Window)) + "] [--align N]\n"
         "                  [--windows " + choices(bd::nn::windows_names) + "] [--latent-window-last] [--force] [--quiet]\n"
         "                  [--report FILE.json] INPUT OUTPUT\n"
         "       bd-convert --demo [--layers N] [--dtype TYPE] [--compute f32|bf16]\n"
         "INPUT is a model folder: config.json and model.safetensors, or shards listed by\n"
         "model.safetensors.index.json. OUTPUT ending in .safetensors is one file; otherwise a new\n"
         "folder with the same shards, a new index and config.json (with a \"bd\" record).\n"
         "--latent-window-last (deepseek-v2, mode qkvo): reorder each layer's latent channels so the\n"
         "QK window is last, making K' one GEMM call on a GPU (kv_a_proj and its norm written reordered).\n"
         "--windows (grouped-query attention): per-group (default) chooses one window per key/value\n"
         "head, so K'/V' and the KV cache keep the dense model's heads; per-head one per query head.\n";
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

double megabytes(std::uint64_t bytes) { return double(bytes) / 1e6; }

void progress_line(const bd::io::ConvertProgress& p) {
  if (p.kind == bd::io::ConvertProgress::Kind::Copied)
    std::fprintf(stderr, "bd-convert: copied %s unchanged: %.1f MB in %.2f s\n", p.what.c_str(), megabytes(p.bytes_written),
                 p.seconds);
  else
    std::fprintf(stderr, "bd-convert: [%zu/%zu] %s: %.2f s, read %.1f MB, wrote %.1f MB\n", p.layer, p.layers, p.what.c_str(),
                 p.seconds, megabytes(p.bytes_read), megabytes(p.bytes_written));
}

/// The one table bd-convert prints, a row per layer (the demo adds its check's error column).
class LayerTable {
public:
  explicit LayerTable(bool with_error) : with_error_(with_error) {
    std::printf("%-34s %-18s %-18s %10s %10s %12s %12s", "layer", "QK window", "VO window", "NMSE QK", "NMSE VO", "params in",
                "params out");
    if (with_error_) std::printf(" %12s", "max rel err");
    std::printf(" %8s\n", "time s");
  }

  void row(const bd::io::LayerReport& l, double error = 0) {
    std::printf("%-34s %-18s %-18s %10s %10s %12lld %12lld", l.prefix.c_str(), window(l.qk).c_str(), window(l.vo).c_str(),
                nmse(l.qk).c_str(), nmse(l.vo).c_str(), (long long)l.params_before, (long long)l.params_after);
    if (with_error_) std::printf(" %12.3g", error);
    std::printf(" %8.3f\n", l.seconds);
    std::fflush(stdout);
    before_ += l.params_before;
    after_ += l.params_after;
    if (warnings_.empty()) warnings_ = l.warnings;
  }

  void total() const {
    const double change = before_ ? 100.0 * double(after_ - before_) / double(before_) : 0.0;
    std::printf("total: %lld -> %lld parameters in the converted tensors (%.1f %% %s)\n", (long long)before_,
                (long long)after_, change < 0 ? -change : change, change <= 0 ? "fewer" : "more");
    for (const auto& w : warnings_) std::printf("cost model (forced): %s\n", w.c_str());
  }

private:
  static std::string window(const bd::nn::ProductReport& p) { return p.decomposed ? p.window : "-"; }
  static std::string nmse(const bd::nn::ProductReport& p) {
    if (!p.decomposed) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", p.mean_nmse);
    return buf;
  }
  bool with_error_;
  std::int64_t before_ = 0, after_ = 0;
  std::vector<std::string> warnings_;
};

/// The built-in default: a synthetic DeepSeek-V2-Lite attention stack (MLA with decoupled RoPE),
/// converted to BD (qkvo) in memory, stored in T and computing in `compute`, and verified against
/// the dense layer in fp32.
template <typename T>
int demo(int layers, bd::kernel::Compute compute) {
  using S = synthetic::DeepSeekV2Lite;
  const int rope = 64;
  const char* type = bd::scalar_traits<T>::name;
  std::printf("bd-convert --demo: synthetic DeepSeek-V2-Lite attention, %d layers x %d heads, hidden %d, latent %d,\n"
              "qk_nope %d, qk_rope %d, v %d; BD qkvo (auto basis), stored in %s, %s compute, verified against the dense\n"
              "layer in fp32\n\n",
              layers, S::heads, S::hidden, S::latent, S::head_dim, rope, S::head_dim, type, bd::kernel::to_string(compute));
  LayerTable table(true);
  std::mt19937_64 rng(7);
  double worst = 0, worst_dense = 0;
  bd::Workspace ws;  // preparation's scratch, reused by every layer
  for (int l = 0; l < layers; ++l) {
    const auto f = synthetic::synthetic_layer(static_cast<unsigned>(l));
    bd::nn::AttentionConfig c;
    c.n_q = c.n_kv = S::heads;
    c.head_dim = c.v_head_dim = S::head_dim;
    c.rope_dim = rope;
    c.causal = true;
    bd::nn::AttentionWeights<float> w;
    w.W_dkv = synthetic::gaussian(S::hidden, S::latent, 1.0f / std::sqrt(float(S::hidden)), rng);
    w.kv_norm = Eigen::VectorXf::Ones(S::latent);
    w.Wq.resize(S::hidden, S::heads * S::head_dim);
    w.Wk.resize(S::latent, S::heads * S::head_dim);
    w.Wv.resize(S::latent, S::heads * S::head_dim);
    w.Wo.resize(S::heads * S::head_dim, S::hidden);
    for (int h = 0; h < S::heads; ++h) {
      w.Wq.middleCols(h * S::head_dim, S::head_dim) = f.q[std::size_t(h)];
      w.Wk.middleCols(h * S::head_dim, S::head_dim) = f.uk[std::size_t(h)];
      w.Wv.middleCols(h * S::head_dim, S::head_dim) = f.uv[std::size_t(h)];
      w.Wo.middleRows(h * S::head_dim, S::head_dim) = f.o[std::size_t(h)].transpose();
    }
    w.Wq_rope = synthetic::gaussian(S::hidden, S::heads * rope, 1.0f / std::sqrt(float(S::hidden)), rng);
    w.Wk_rope = synthetic::gaussian(S::hidden, rope, 1.0f / std::sqrt(float(S::hidden)), rng);
    const bd::nn::MultiHeadAttention<float> dense(c, w);
    const auto start = std::chrono::steady_clock::now();
    auto bda = bd::nn::BDAttention<T>::prepare(dense, bd::nn::BDAttentionOptions{}.with_mode(bd::nn::Mode::QKVO), ws);
    bda.set_compute(compute);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const Eigen::MatrixXf x = synthetic::gaussian(16, S::hidden, 1.0f, rng);
    const Eigen::MatrixXf y = dense.forward(x), y_bd = bda.forward(x);
    const double err = (y_bd - y).cwiseAbs().maxCoeff() / y.cwiseAbs().maxCoeff();
    worst = std::max(worst, err);
    // The dense layer stored and computing as BD does: the yardstick of the type and compute.
    auto dense_in_type = dense.template cast<T>();
    dense_in_type.set_compute(compute);
    const Eigen::MatrixXf y_dense = dense_in_type.forward(x);
    worst_dense = std::max(worst_dense, double((y_dense - y).cwiseAbs().maxCoeff() / y.cwiseAbs().maxCoeff()));
    bd::io::LayerReport report;
    report.prefix = "layer " + std::to_string(l);
    report.qk = bda.qk_report();
    report.vo = bda.vo_report();
    report.params_before = w.Wq.size() + w.Wk.size() + w.Wv.size() + w.Wo.size();
    report.params_after = bda.parameters();
    report.seconds = seconds;
    table.row(report, err);
  }
  table.total();
  std::printf("\nworst max |BD − dense| / max |dense| over all layers, %s storage and %s compute against the fp32 dense "
              "layer: %.3g (the dense layer stored and computing so: %.3g)\n",
              type, bd::kernel::to_string(compute), worst, worst_dense);
  // f16 storage: each weight carries 2^-11 relative error; outputs of a few such terms stay below
  // 1 %. bf16 (storage or compute, 2^-8) errs more: BD is held to twice the dense layer's own error
  // in the same type (its basis's conditioning, docs/benchmarks.md).
  return worst < 1e-2 || worst <= 2 * worst_dense ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bd::keep_freed_heap();  // preparation's freed temporaries stay for reuse (bd/core/heap.hpp)
  bd::io::ConvertOptions opts;
  std::string input, output, report_path;
  bool have_arch = false, have_mode = false, run_demo = false, quiet = false;
  int demo_layers = synthetic::DeepSeekV2Lite::layers;
  bd::Storage demo_storage = bd::Storage::F16;
  bd::kernel::Compute compute = bd::kernel::Compute::F32;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw UsageError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--arch") opts.arch = bd::io::parse_arch(value()), have_arch = true;
      else if (a == "--mode") opts.mode = bd::nn::parse_mode(value()), have_mode = true;
      else if (a == "--dtype") opts.storage = demo_storage = bd::parse_storage(value());
      else if (a == "--compute") compute = bd::kernel::parse_compute(value());
      else if (a == "--basis") opts.decomposition.basis = bd::parse_basis(value());
      else if (a == "--align") {
        const std::string v = value();
        char* end = nullptr;
        const long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end || n <= 0) throw UsageError("--align needs a positive integer, got '" + v + "'");
        opts.decomposition.align = n;
      } else if (a == "--force") opts.force = true;
      else if (a == "--windows") opts.windows = bd::nn::parse_windows(value());
      else if (a == "--latent-window-last") opts.latent_window_last = true;
      else if (a == "--quiet") quiet = true;
      else if (a == "--report") report_path = value();
      else if (a == "--demo") run_demo = true;
      else if (a == "--layers") demo_layers = std::atoi(value().c_str());
      else if (a == "--help" || a == "-h") {
        std::printf("%s", usage().c_str());
        return 0;
      } else if (!a.empty() && a[0] == '-') throw UsageError("unknown option " + a);
      else if (input.empty()) input = a;
      else if (output.empty()) output = a;
      else throw UsageError("unexpected argument " + a);
    }
    if (run_demo) {
      if (demo_layers < 1 || demo_layers > synthetic::DeepSeekV2Lite::layers) throw UsageError("--layers must be 1..27");
      if (demo_storage == bd::Storage::F64) throw UsageError("--demo stores BD in f16, bf16 or f32");
    } else {
      if (compute != bd::kernel::Compute::F32) throw UsageError("--compute applies to --demo's verification");
      if (!have_arch || !have_mode) throw UsageError("--arch and --mode are required");
      if (input.empty() || output.empty()) throw UsageError("INPUT and OUTPUT are required");
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "bd-convert: %s\n%s", e.what(), usage().c_str());
    return 2;
  } catch (const bd::Error& e) {  // an unknown --arch, --mode, --dtype or --basis name
    std::fprintf(stderr, "bd-convert: %s\n%s", e.what(), usage().c_str());
    return 2;
  }

  try {
    if (run_demo) {
      return bd::dispatch(demo_storage, [&](auto t) {
        using T = typename decltype(t)::type;
        if constexpr (std::is_same_v<T, double>) return 2;
        else return demo<T>(demo_layers, compute);
      });
    }
    const auto report = bd::io::convert_checkpoint(input, output, opts, quiet ? nullptr : progress_line);
    LayerTable table(false);
    for (const auto& l : report.layers) table.row(l);
    table.total();
    std::printf("wrote %s (%lld tensors in %zu file%s; %lld in %zu in the input)\n", output.c_str(), (long long)report.tensors_out,
                report.files_out, report.files_out == 1 ? "" : "s", (long long)report.tensors_in, report.files_in);
    std::printf("%.1f s: read %.1f MB, wrote %.1f MB (%.0f MB/s)\n", report.seconds, megabytes(report.bytes_in),
                megabytes(report.bytes_out), megabytes(report.bytes_in + report.bytes_out) / std::max(report.seconds, 1e-9));
    if (!report_path.empty()) report.write_json(report_path);
  } catch (const bd::RefusedError& e) {
    std::fprintf(stderr, "bd-convert: %s\nbd-convert: nothing was written; --force converts it anyway\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bd-convert: %s\nbd-convert: nothing was written\n", e.what());
    return 1;
  }
  return 0;
}
