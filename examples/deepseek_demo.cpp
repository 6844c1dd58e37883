// Decomposes every attention layer of a synthetic model with DeepSeek-V2-Lite's shapes and
// prints, per basis strategy, the parameters saved, the NMSE and the preparation time. It checks
// what it prints: BD saves exactly r² parameters per head and product (r = d_h), and, with
// --max-nmse, every strategy's NMSE is at most that (exit 1 otherwise).
//
//   deepseek_demo [--layers N] [--dtype f64|f32|f16|bf16] [--strategies first,last,...] [--max-nmse X]
#include <bd/bd.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "synthetic_deepseek.hpp"  // demo data (examples/)

namespace {

struct Row {
  std::string strategy;
  double nmse_qk = 0, nmse_vo = 0, seconds = 0;
  long long params_before = 0, params_after = 0, r_squared = 0;
  std::string window_note;
};

template <typename Scalar>
Row run(bd::Basis basis, const std::vector<synthetic::AttentionLayerFactors>& layers) {
  Row row;
  row.strategy = bd::to_string(basis);
  const bd::Options qk = bd::Options{}.with_side(bd::Side::Col).with_basis(basis);
  const bd::Options vo = bd::Options{}.with_side(bd::Side::Row).with_basis(basis);
  const auto start = std::chrono::steady_clock::now();
  int shared = 0;
  bd::Workspace ws;  // preparation's scratch, reused by every layer
  for (const auto& layer : layers) {
    const auto q = bd::decompose_shared<Scalar>(layer.q, layer.uk, qk, ws);
    const auto v = bd::decompose_shared<Scalar>(layer.uv, layer.o, vo, ws);
    row.nmse_qk += q.mean_nmse() / static_cast<double>(layers.size());
    row.nmse_vo += v.mean_nmse() / static_cast<double>(layers.size());
    shared += q.shared() + v.shared();
    // Dense: Wq, W_uk, W_uv, Wo per head; BD: the decompositions replace all four.
    for (std::size_t h = 0; h < layer.q.size(); ++h) {
      row.params_before += layer.q[h].size() + layer.uk[h].size() + layer.uv[h].size() + layer.o[h].size();
      row.r_squared += layer.q[h].cols() * layer.q[h].cols() + layer.uv[h].cols() * layer.uv[h].cols();
    }
    row.params_after += q.parameters() + v.parameters();
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  row.window_note = std::to_string(shared) + "/" + std::to_string(2 * layers.size()) + " shared";
  return row;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--layers N (1..27)] [--dtype f64|f32|f16|bf16] [--strategies first,last,residual-min,offset-search,pivoted,auto] [--max-nmse X]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int layer_count = synthetic::DeepSeekV2Lite::layers;
  bd::Storage storage = bd::Storage::F16;
  std::vector<std::string> strategies{"first", "residual-min", "offset-search", "pivoted", "auto"};
  double max_nmse = -1;  // no check
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--layers") && has_value) layer_count = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dtype") && has_value) {
      try {
        storage = bd::parse_storage(argv[++i]);
      } catch (const bd::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return usage(argv[0]);
      }
    }
    else if (!std::strcmp(argv[i], "--strategies") && has_value) strategies = split(argv[++i]);
    else if (!std::strcmp(argv[i], "--max-nmse") && has_value) max_nmse = std::atof(argv[++i]);
    else return usage(argv[0]);
  }
  if (layer_count < 1 || layer_count > synthetic::DeepSeekV2Lite::layers)
    return usage(argv[0]);

  std::printf("Synthetic DeepSeek-V2-Lite attention: %d layers x 16 heads, hidden 2048, latent 512, head dim 128\n"
              "QK column form, VO row form, windows on the 512-wide latent; stored in %s; %d threads\n\n",
              layer_count, bd::to_string(storage), bd::max_threads());
  std::vector<synthetic::AttentionLayerFactors> layers;
  for (int l = 0; l < layer_count; ++l) layers.push_back(synthetic::synthetic_layer(static_cast<unsigned>(l)));

  std::printf("%-14s %12s %12s %9s %11s %11s %9s  %s\n", "strategy", "params", "BD params", "saved", "NMSE QK", "NMSE VO",
              "time (s)", "windows");
  try {
    for (const auto& name : strategies) {
      const bd::Basis basis = bd::parse_basis(name);
      const Row row = bd::dispatch(storage, [&](auto t) { return run<typename decltype(t)::type>(basis, layers); });
      std::printf("%-14s %12lld %12lld %8.1f%% %11.3g %11.3g %9.2f  %s\n", row.strategy.c_str(), row.params_before,
                  row.params_after, 100.0 * (1.0 - double(row.params_after) / double(row.params_before)), row.nmse_qk,
                  row.nmse_vo, row.seconds, row.window_note.c_str());
      std::fflush(stdout);
      if (row.params_before - row.params_after != row.r_squared) {
        std::fprintf(stderr, "error: %s saved %lld parameters, expected r^2 per head and product: %lld\n", row.strategy.c_str(),
                     row.params_before - row.params_after, row.r_squared);
        return 1;
      }
      if (max_nmse >= 0 && !(std::max(row.nmse_qk, row.nmse_vo) <= max_nmse)) {
        std::fprintf(stderr, "error: %s: NMSE above --max-nmse %g\n", row.strategy.c_str(), max_nmse);
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
