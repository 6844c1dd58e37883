// Training a language model with MHA or with BD attention (the paper's §5.2): the whole model's
// gradient against finite differences, BDA starting from the function MHA starts from with d_h²
// fewer parameters per head and product, a short training run that learns, bit-for-bit
// reproducible under one seed, and the corpus refusals.
#include <bd/train/corpus.hpp>
#include <bd/train/language_model.hpp>
#include <bd/train/optimizer.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "support.hpp"

using bd::train::Corpus;
using bd::train::LanguageModel;
using bd::train::ModelConfig;
using Catch::Contains;
using Eigen::Index;

namespace {

using MHA = bd::nn::MultiHeadAttention<double>;

ModelConfig tiny() {
  ModelConfig c;
  c.vocab = 20, c.dim = 12, c.heads = 3, c.layers = 2, c.ffn = 10, c.context = 9;
  return c;
}

std::vector<int> windows(Index count, Index window, Index vocab, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> t;
  for (Index i = 0; i < count * window; ++i) t.push_back(int(rng() % std::uint64_t(vocab)));
  return t;
}

/// Relative gradient error of every tensor of a model, sampled entries, by central differences.
template <typename Model>
double worst_gradient_error(Model& model, const std::vector<int>& batch) {
  auto& p = model.parameters();
  p.zero_gradient();
  model.loss_and_gradient(batch);
  const Eigen::VectorXd grad = p.gradient();
  Eigen::VectorXd theta = p.values();
  const double scale = grad.cwiseAbs().maxCoeff();
  double worst = 0;
  std::mt19937_64 rng(5);
  for (int s = 0; s < 60; ++s) {
    const Index i = Index(rng() % std::uint64_t(theta.size()));
    const double v = theta[i], h = 1e-6;
    theta[i] = v + h, p.set_values(theta);
    const double up = model.loss(batch);
    theta[i] = v - h, p.set_values(theta);
    const double down = model.loss(batch);
    theta[i] = v, p.set_values(theta);
    worst = std::max(worst, std::abs((up - down) / (2 * h) - grad[i]) / scale);
  }
  return worst;
}

std::string license_text() {
  std::ifstream in(std::string(BD_SOURCE_DIR) + "/LICENSE");
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("the language model's gradient equals finite differences, MHA and BDA", "[train][gradients]") {
  LanguageModel<MHA> mha(tiny(), 3);
  const std::vector<int> batch = windows(2, 10, 20, 4);
  CHECK(worst_gradient_error(mha, batch) <= 1e-6);
  auto bda = mha.to_bd(bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
  CHECK(worst_gradient_error(bda, batch) <= 1e-6);
}

TEST_CASE("BDA starts from MHA's function with d_h^2 fewer parameters per head and product", "[train]") {
  const ModelConfig c = tiny();
  LanguageModel<MHA> mha(c, 7);
  const auto bda = mha.to_bd(bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
  const std::vector<int> batch = windows(3, 10, 20, 8);
  CHECK(bda.loss(batch) == Approx(mha.loss(batch)).epsilon(1e-12));
  const Index dh = c.dim / c.heads;
  CHECK(mha.parameter_count() - bda.parameter_count() == c.layers * c.heads * 2 * dh * dh);
  CHECK(mha.attention_parameter_count() - bda.attention_parameter_count() == c.layers * c.heads * 2 * dh * dh);
  // In float: the same up to the rounding of B and C.
  LanguageModel<bd::nn::MultiHeadAttention<float>> mha32(c, 7);
  const auto bda32 = mha32.to_bd(bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
  CHECK(bda32.loss(batch) == Approx(mha32.loss(batch)).epsilon(1e-5));
}

TEST_CASE("a short training run learns, and the same seed gives the same loss to the last bit", "[train]") {
  // 300 steps on the Apache-2.0 license text (11 KB of English). The bound: the byte-frequency
  // (unigram) entropy of the training text, which any model that ignores context cannot beat
  // in expectation; learning the text's context takes the loss below it.
  const Corpus corpus(license_text(), 33);
  const std::string text = license_text();
  std::map<unsigned char, double> counts;
  const std::size_t n_train = corpus.train_bytes();
  for (std::size_t i = 0; i < n_train; ++i) counts[static_cast<unsigned char>(text[i])] += 1;
  double unigram = 0;
  for (const auto& [byte, count] : counts) unigram -= count / double(n_train) * std::log(count / double(n_train));
  ModelConfig c;
  c.dim = 32, c.heads = 4, c.layers = 2, c.ffn = 64, c.context = 32;
  auto run = [&](bool bd_attention) {
    LanguageModel<bd::nn::MultiHeadAttention<float>> mha(c, 11);
    auto bda = mha.to_bd(bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::First));
    std::mt19937_64 rng(12);
    const bd::train::NoamSchedule lr{2.0, double(c.dim), 50};
    double last = 0;
    auto train = [&](auto& model) {
      bd::train::Adam<float> adam(model.parameter_count());
      for (long step = 1; step <= 300; ++step) {
        model.parameters().zero_gradient();
        const double loss = model.loss_and_gradient(corpus.training_batch(8, rng));
        bd::train::clip_gradient(model.parameters(), 1.0);
        adam.step(model.parameters(), lr(step));
        last = step > 250 ? last + loss / 50 : 0;  // the mean of the last 50 steps
      }
    };
    if (bd_attention) train(bda);
    else train(mha);
    return last;
  };
  for (const bool bd_attention : {false, true}) {
    INFO((bd_attention ? "BDA" : "MHA") << ", unigram entropy " << unigram << " nats");
    const double first = run(bd_attention), second = run(bd_attention);
    WARN((bd_attention ? "BDA" : "MHA") << ": mean training loss over steps 251-300 " << first << " nats, unigram entropy "
                                      << unigram);
    CHECK(first < unigram);
    CHECK(first == second);  // bit for bit
  }
}

TEST_CASE("a corpus that is missing, empty or shorter than one sequence is refused with a clear message", "[train][bad-input]") {
  CHECK_THROWS_WITH(Corpus::read("/nonexistent/corpus.txt"), Contains("/nonexistent/corpus.txt: cannot open the corpus"));
  CHECK_THROWS_WITH(Corpus("", 129, 0.1, "empty.txt"), Contains("empty.txt is empty"));
  CHECK_THROWS_WITH(Corpus(std::string(500, 'a'), 129, 0.1, "short.txt"),
                    Contains("short.txt holds 500 bytes: too short for one sequence of 129 bytes"));
  CHECK_NOTHROW(Corpus(std::string(1500, 'a'), 129, 0.1, "enough.txt"));
  ModelConfig bad = tiny();
  bad.heads = 5;
  CHECK_THROWS_WITH(LanguageModel<MHA>(bad, 1), Contains("dim a multiple of heads"));
  LanguageModel<MHA> model(tiny(), 1);
  CHECK_THROWS_WITH(model.loss(std::vector<int>(15, 1)), Contains("not whole windows of 10"));
  CHECK_THROWS_WITH(model.loss(std::vector<int>(10, 20)), Contains("token 20 outside the vocabulary of 20"));
}

TEST_CASE("a checkpoint saved through bd::io loads back into the same model", "[train][io]") {
  LanguageModel<MHA> a(tiny(), 21), b(tiny(), 22);
  const auto bda = a.to_bd(bd::nn::BDAttentionOptions{});
  const std::string path = (std::filesystem::temp_directory_path() / "bd_train_checkpoint.safetensors").string();
  a.save(path);
  const std::vector<int> batch = windows(2, 10, 20, 23);
  CHECK(b.loss(batch) != a.loss(batch));
  b.load(path);
  CHECK(b.loss(batch) == a.loss(batch));
  auto other = b.to_bd(bd::nn::BDAttentionOptions{});
  CHECK_THROWS_AS(other.load(path), bd::FormatError);  // BDA's tensors are not MHA's
  std::filesystem::remove(path);
  (void)bda;
}
