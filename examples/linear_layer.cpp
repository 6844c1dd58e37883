// BDLinear: a low-rank layer (SVD pruning, a merged LoRA) in BD form — fewer weights, same outputs.
#include <bd/nn/bd_linear.hpp>

#include <cstdio>

int main() {
  using namespace bd::nn;
  // LLaMA2-7B's 4096×4096 projection pruned to the rank that keeps 80 % of its parameters.
  const int d_in = 1024, d_out = 1024, rank = 410;  // scaled down 4× to run in a moment
  const LowRankLinear<float> low_rank(Eigen::MatrixXf::Random(d_in, rank) * 0.05f,
                                      Eigen::MatrixXf::Random(d_out, rank) * 0.05f, Eigen::VectorXf::Random(d_out));
  const auto bd_layer = BDLinear<float>::from_low_rank(low_rank, bd::Options{}.with_basis(bd::Basis::Pivoted));
  std::printf("parameters: low-rank %ld, BD %ld (%.1f %% fewer; r/(d_in + d_out) = %.1f %%)\n",
              long(low_rank.parameters()), long(bd_layer.parameters()),
              100.0 * (1 - double(bd_layer.parameters()) / double(low_rank.parameters())), 100.0 * rank / (d_in + d_out));
  const Eigen::MatrixXf x = Eigen::MatrixXf::Random(16, d_in);
  const Eigen::MatrixXf y = low_rank.forward(x), y_bd = bd_layer.forward(x);
  const float rel = (y_bd - y).cwiseAbs().maxCoeff() / y.cwiseAbs().maxCoeff();
  std::printf("max |BD − low-rank| / max |low-rank| = %.2e (BD NMSE of W in f32: %.2e)\n", rel, bd_layer.report().nmse);
  return rel < 1e-4f ? 0 : 1;
}
