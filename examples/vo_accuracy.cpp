// The accuracy table of docs/benchmarks.md ("Accuracy on real trained weights") on a real Hugging Face LLaMA checkpoint: NMSE of the VO
// product of every query head (Wv rows of its key/value group times its Wo columns), per basis
// strategy and storage type, averaged over heads, computed in double against the exact product.
//
//   vo_accuracy MODEL_DIR        (e.g. examples/models/stories260K)
#include <bd/bd.hpp>
#include <bd/io/safetensors.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

struct Heads {
  std::vector<Eigen::MatrixXd> U, V;  // per query head: W = U·Vᵀ (d×d, rank d_h)
  int layers = 0, heads = 0;
};

Heads load(const std::string& dir) {
  std::ifstream config_file(dir + "/config.json");
  if (!config_file) throw bd::FormatError(dir + "/config.json: cannot open");
  const auto config = nlohmann::json::parse(config_file);
  const int layers = config.at("num_hidden_layers"), heads = config.at("num_attention_heads");
  const int kv_heads = config.value("num_key_value_heads", heads);
  const int head_dim = config.at("hidden_size").get<int>() / heads;
  const auto st = bd::io::SafeTensors::open(dir + "/model.safetensors");
  Heads out;
  out.layers = layers;
  out.heads = heads;
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    const Eigen::MatrixXd wv = st.matrix<double>(p + "v_proj.weight"), wo = st.matrix<double>(p + "o_proj.weight");
    for (int h = 0; h < heads; ++h) {
      const int group = h / (heads / kv_heads);
      out.U.push_back(wv.middleRows(group * head_dim, head_dim).transpose());
      out.V.push_back(wo.middleCols(h * head_dim, head_dim));
    }
  }
  return out;
}

template <typename Scalar>
double floor_nmse(const Heads& m) {
  double sum = 0;
  for (std::size_t h = 0; h < m.U.size(); ++h) {
    const Eigen::MatrixXd W = m.U[h] * m.V[h].transpose();
    const Eigen::MatrixXd R = bd::rounded_in_double<Scalar>(m.U[h]) * bd::rounded_in_double<Scalar>(m.V[h]).transpose();
    sum += (R - W).squaredNorm() / W.squaredNorm();
  }
  return sum / static_cast<double>(m.U.size());
}

template <typename Scalar>
double per_head(const Heads& m, const bd::Options& opts) {
  double sum = 0;
  for (std::size_t h = 0; h < m.U.size(); ++h) sum += bd::decompose_product<Scalar>(m.U[h], m.V[h], opts).report().nmse;
  return sum / static_cast<double>(m.U.size());
}

template <typename Scalar>
double shared(const Heads& m, const bd::Options& opts) {
  double sum = 0;
  for (int l = 0; l < m.layers; ++l) {
    const auto first = static_cast<std::ptrdiff_t>(l) * m.heads;
    const std::vector<Eigen::MatrixXd> U(m.U.begin() + first, m.U.begin() + first + m.heads);
    const std::vector<Eigen::MatrixXd> V(m.V.begin() + first, m.V.begin() + first + m.heads);
    sum += bd::decompose_shared<Scalar>(U, V, opts).mean_nmse();
  }
  return sum / m.layers;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  try {
    const Heads m = load(argv[1]);
    const int align = static_cast<int>(m.U.front().cols());
    std::printf("VO of %zu query heads (%d layers), d = %ld, d_h = %ld; mean NMSE over heads, in double\n\n", m.U.size(),
                m.layers, static_cast<long>(m.U.front().rows()), static_cast<long>(m.U.front().cols()));
    std::printf("| method | fp32 | fp16 | bf16 |\n|---|---|---|---|\n");
    std::printf("| floor: Wv and Wo rounded to the type, then multiplied | %.2e | %.2e | %.2e |\n", floor_nmse<float>(m),
                floor_nmse<Eigen::half>(m), floor_nmse<Eigen::bfloat16>(m));
    struct Method {
      const char* name;
      bd::Basis basis;
      bool shared;
    };
    const Method methods[] = {
        {"shared window, residual-min {first, last}", bd::Basis::ResidualMin, true},
        {"shared window, offset search (align = d_h)", bd::Basis::OffsetSearch, true},
        {"per head, first window", bd::Basis::First, false},
        {"per head, offset search (align = d_h)", bd::Basis::OffsetSearch, false},
        {"per head, pivoted (QR with column pivoting)", bd::Basis::Pivoted, false},
    };
    for (const Method& method : methods) {
      const bd::Options opts = bd::Options{}.with_basis(method.basis).with_align(align);
      auto f = method.shared ? shared<float> : per_head<float>;
      auto h = method.shared ? shared<Eigen::half> : per_head<Eigen::half>;
      auto b = method.shared ? shared<Eigen::bfloat16> : per_head<Eigen::bfloat16>;
      std::printf("| %s | %.2e | %.2e | %.2e |\n", method.name, f(m, opts), h(m, opts), b(m, opts));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
