// convert_support.hpp's folder, options and the format's forward, compiled once per test build
// (bd_test_convert_support).
#include "convert_support.hpp"

#include <algorithm>
#include <fstream>
#include <limits>

namespace bd_test_convert {

Gpt2Folder::Gpt2Folder(const std::string& name, bool poison) : dir(fs::temp_directory_path() / name) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "gpt2", "n_embd": 48, "n_head": 4, "n_layer": 2})";
  bd::io::Writer w;
  w.add<float>("wte.weight", bd_test::gaussian(10, kD, 1));
  for (Eigen::Index l = 0; l < kLayers; ++l) {
    bd_test::LayerSpec s;
    s.d_q = s.d_kv = s.d_out = kD;
    s.n_q = s.n_kv = kHeads;
    s.head_dim = kHeadDim;
    s.biases = true;
    s.causal = true;
    const auto layer = bd_test::random_attention(s, 30 + unsigned(l)).cast<float>().cast<double>();
    layers.push_back(layer);
    const auto& lw = layer.weights();
    Eigen::MatrixXd c_attn(kD, 3 * kD);
    c_attn << lw.Wq, lw.Wk, lw.Wv;
    if (poison && l == 1) c_attn(3, 100) = std::numeric_limits<double>::quiet_NaN();
    Eigen::VectorXd c_attn_bias(3 * kD);
    c_attn_bias << lw.bq, lw.bk, lw.bv;
    const std::string p = "h." + std::to_string(l) + ".";
    w.add_vector<float>(p + "ln_1.weight", Eigen::VectorXd::Ones(kD));
    w.add<float>(p + "attn.c_attn.weight", c_attn);
    w.add_vector<float>(p + "attn.c_attn.bias", c_attn_bias);
    w.add<float>(p + "attn.c_proj.weight", lw.Wo);
    w.add_vector<float>(p + "attn.c_proj.bias", lw.bo);
  }
  w.set_metadata("format", "pt");
  w.write((dir / "model.safetensors").string());
}

bd::io::ConvertOptions options(bd::nn::Mode mode, const std::string& dtype) {
  bd::io::ConvertOptions o;
  o.arch = bd::io::Arch::GPT2;
  o.mode = mode;
  o.storage = bd::parse_storage(dtype);
  return o;
}

Eigen::MatrixXd bd_projection(const Eigen::MatrixXd& X, const Eigen::MatrixXd& coeff, const std::vector<double>& indices,
                              Eigen::Index heads, Eigen::Index d) {
  Eigen::MatrixXd out(X.rows(), heads * d);
  for (Eigen::Index h = 0; h < heads; ++h) {
    std::vector<Eigen::Index> basis, rest;
    for (Eigen::Index k = 0; k < d; ++k) basis.push_back(static_cast<Eigen::Index>(indices[std::size_t(h * d + k)]));
    for (Eigen::Index c = 0; c < X.cols(); ++c)
      if (std::find(basis.begin(), basis.end(), c) == basis.end()) rest.push_back(c);
    out.middleCols(h * d, d) = X(Eigen::all, basis) + X(Eigen::all, rest) * coeff.middleCols(h * d, d);
  }
  return out;
}

Eigen::MatrixXd forward_from_file(const SafeTensors& st, const std::string& P, const Eigen::MatrixXd& X, bool causal) {
  Eigen::MatrixXd Q = X * st.matrix<double>(P + ".bd_qk.basis");
  Q.rowwise() += Eigen::RowVectorXd(st.matrix<double>(P + ".bd_qk.bias").transpose());
  const Eigen::MatrixXd K = bd_projection(X, st.matrix<double>(P + ".bd_qk.coeff"), st.values<double>(P + ".bd_qk.indices"), kHeads, kHeadDim);
  const Eigen::MatrixXd V = bd_projection(X, st.matrix<double>(P + ".bd_vo.coeff"), st.values<double>(P + ".bd_vo.indices"), kHeads, kHeadDim);
  bd::nn::AttendSpec spec;
  spec.n_q = spec.n_k = kHeads;
  spec.d_qk = spec.d_v = kHeadDim;
  spec.scale = 1.0 / std::sqrt(double(kHeadDim));  // unchanged
  spec.causal = causal;
  Eigen::MatrixXd y = bd::nn::attend<double>(Q, K, V, spec) * st.matrix<double>(P + ".bd_vo.basis");
  y.rowwise() += Eigen::RowVectorXd(st.matrix<double>(P + ".bd_vo.bias").transpose());
  return y;
}


void shard_folder(const fs::path& dir, int shards) {
  const auto st = SafeTensors::open((dir / "model.safetensors").string());
  std::vector<bd::io::Writer> writers(static_cast<std::size_t>(shards));
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  std::size_t i = 0;
  for (const auto& t : st.tensors()) {
    const std::size_t s = i++ % static_cast<std::size_t>(shards);
    const unsigned char* b = st.bytes(t.name);
    writers[s].add_bytes(t.name, t.dtype, t.shape, std::vector<unsigned char>(b, b + (t.end - t.begin)));
    map[t.name] = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
  }
  for (int s = 0; s < shards; ++s)
    writers[std::size_t(s)].write((dir / ("model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors")).string());
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::ordered_json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(1);
  fs::remove(dir / "model.safetensors");
}

}  // namespace bd_test_convert
