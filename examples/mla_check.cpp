// Checks BD on every MLA layer of a DeepSeek-V2/V3-layout checkpoint, as the model is served.
//
//   mla_check MODEL_DIR [--tokens N] [--dtype f64|f32|f16|bf16] [--basis first|…|auto] [--mode qk|vo|qkvo]
//
// For each attention layer (read one at a time: config.json and model.safetensors or shards),
// seeded random hidden states x (N tokens), the dense MLA layer in double as the reference
// (whole sequence), and the BD layer stored in the chosen type run two ways over the latent
// cache: prefill by Algorithm 2 (K'/V' from the cached latent) and absorbed decoding one token
// at a time. Prints a table and, as its last line, one JSON object: layers, prefill_max_rel_err
// and decode_max_rel_err (max |BD − reference| / max |reference| over all layers and tokens),
// cache_values_per_token {dense, bd} (the latent and RoPE key: the same), and
// decode_flops_per_token {dense, bd} (absorbed projections of one layer, bd::nn::mla_cost).
#include <bd/io/checkpoint.hpp>
#include <bd/nn/bd_attention.hpp>
#include <bd/nn/cost_model.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

namespace {

struct Args {
  std::string dir, basis = "auto";
  bd::Storage storage = bd::Storage::BF16;
  bd::nn::Mode mode = bd::nn::Mode::QKVO;
  int tokens = 16;
};

struct LayerResult {
  double prefill = 0, decode = 0, seconds = 0, nmse_qk = 0, nmse_vo = 0;
};

double max_rel(const Eigen::MatrixXd& a, const Eigen::MatrixXd& ref) {
  return (a - ref).cwiseAbs().maxCoeff() / ref.cwiseAbs().maxCoeff();
}

template <typename S>
LayerResult check_layer(const bd::nn::MultiHeadAttention<double>& dense, const Args& a, unsigned seed) {
  LayerResult r;
  bd::nn::BDAttentionOptions opts;
  opts.mode = a.mode;
  opts.decomposition.basis = bd::parse_basis(a.basis);
  const auto start = std::chrono::steady_clock::now();
  const auto bd = bd::nn::BDAttention<S>::prepare(dense, opts);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.nmse_qk = bd.qk_report().mean_nmse;
  r.nmse_vo = bd.vo_report().mean_nmse;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  Eigen::MatrixXd x(a.tokens, dense.input_dim());
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);  // hidden states of unit RMS
  const Eigen::MatrixXd y = dense.forward(x);
  using A = typename bd::nn::BDAttention<S>::A;
  const bd::nn::MatrixA<A> xa = x.cast<A>();
  bd::nn::LatentCache<A> prefill_cache, decode_cache;
  r.prefill = max_rel(bd.prefill(xa, prefill_cache).template cast<double>(), y);
  Eigen::MatrixXd decoded(a.tokens, y.cols());
  for (int t = 0; t < a.tokens; ++t) decoded.row(t) = bd.decode_absorbed(xa.row(t), decode_cache).template cast<double>();
  r.decode = max_rel(decoded, y);
  return r;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s MODEL_DIR [--tokens N] [--dtype f64|f32|f16|bf16] [--basis first|last|residual-min|offset-search|"
               "pivoted|auto] [--mode qk|vo|qkvo]\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const bool value = i + 1 < argc;
      if (arg == "--tokens" && value) a.tokens = std::atoi(argv[++i]);
      else if (arg == "--dtype" && value) a.storage = bd::parse_storage(argv[++i]);
      else if (arg == "--basis" && value) a.basis = argv[++i];
      else if (arg == "--mode" && value) a.mode = bd::nn::parse_mode(argv[++i]);
      else if (!arg.empty() && arg[0] != '-' && a.dir.empty()) a.dir = arg;
      else return usage(argv[0]);
    }
    if (a.dir.empty() || a.tokens < 1) return usage(argv[0]);
    bd::parse_basis(a.basis);
  } catch (const bd::Error& e) {
    std::fprintf(stderr, "mla_check: %s\n", e.what());
    return 2;
  }
  try {
    const bd::io::ModelFolder folder = bd::io::ModelFolder::open(a.dir);
    const auto layouts = bd::io::attention_layers(bd::io::Arch::DeepSeekV2, folder);
    std::printf("%s: %zu MLA layers; BD %s stored in %s, basis %s, %d tokens; reference: the dense layer in double\n\n",
                a.dir.c_str(), layouts.size(), bd::nn::to_string(a.mode), bd::to_string(a.storage), a.basis.c_str(), a.tokens);
    std::printf("%-30s %12s %12s %14s %14s %9s\n", "layer", "NMSE QK", "NMSE VO", "prefill err", "decode err", "prep s");
    double prefill = 0, decode = 0;
    bd::nn::MLACost cost;
    for (std::size_t l = 0; l < layouts.size(); ++l) {
      const bd::nn::MultiHeadAttention<double> dense(layouts[l].config, layouts[l].load());
      if (l == 0) cost = bd::nn::mla_cost(bd::nn::AttentionShape::of(dense.config(), dense.weights()), a.mode);
      const unsigned seed = 1000 + static_cast<unsigned>(l);
      const LayerResult r =
          bd::dispatch(a.storage, [&](auto t) { return check_layer<typename decltype(t)::type>(dense, a, seed); });
      folder.release_prefix(layouts[l].prefix + ".");
      std::printf("%-30s %12.3g %12.3g %14.3g %14.3g %9.2f\n", layouts[l].prefix.c_str(), r.nmse_qk, r.nmse_vo, r.prefill,
                  r.decode, r.seconds);
      std::fflush(stdout);
      prefill = std::max(prefill, r.prefill);
      decode = std::max(decode, r.decode);
    }
    std::printf("\n%s\n", cost.describe().c_str());
    nlohmann::ordered_json out;
    out["layers"] = layouts.size();
    out["prefill_max_rel_err"] = prefill;
    out["decode_max_rel_err"] = decode;
    out["cache_values_per_token"] = {{"dense", cost.cache_values}, {"bd", cost.cache_values}};
    out["decode_flops_per_token"] = {{"dense", cost.decode_dense}, {"bd", cost.decode_bd}};
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mla_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
