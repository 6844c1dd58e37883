// bd-convert's core on a GPT-2-layout checkpoint built here with random weights: the written
// tensors follow the documented format, and a forward computed from them by the documented rule
// alone equals the dense attention.
#include <filesystem>
#include <fstream>

#include <bd/io/convert.hpp>

#include "convert_support.hpp"

namespace fs = std::filesystem;
using bd::io::SafeTensors;
using bd::Basis;
using Catch::Contains;

using namespace bd_test_convert;

TEST_CASE("GPT-2 qkvo: the written tensors give a forward equal to the dense attention", "[convert][gpt2]") {
  Gpt2Folder folder("bd_convert_gpt2");
  const auto out = (folder.dir / "bd.safetensors").string();
  const auto report = bd::io::convert_checkpoint(folder.dir.string(), out, options(bd::nn::Mode::QKVO));
  REQUIRE(report.layers.size() == 2);
  // --report's JSON says where preparation spent its time, per product family and phase, and
  // the phases cannot add up to more than the layer took.
  const auto json = report.to_json();
  for (const auto& layer : json.at("layers")) {
    double phases = 0;
    for (const char* family : {"qk", "vo"})
      for (const char* phase : {"factor", "score", "fit", "round", "error"}) {
        const double s = layer.at(family).at("phases_s").at(phase).get<double>();
        CHECK(s >= 0);
        phases += s;
      }
    CHECK(phases > 0);
    CHECK(phases <= layer.at("seconds").get<double>());
  }
  const auto st = SafeTensors::open(out);
  CHECK(st.metadata().at("bd.format") == "1");
  CHECK(st.metadata().at("format") == "pt");
  CHECK(st.metadata().at("bd.mode") == "qkvo");
  CHECK_FALSE(st.contains("h.0.attn.c_attn.weight"));
  CHECK_FALSE(st.contains("h.0.attn.c_proj.bias"));
  for (Eigen::Index l = 0; l < kLayers; ++l) {
    const std::string P = "h." + std::to_string(l) + ".attn";
    CHECK(st.info(P + ".bd_qk.basis").shape == std::vector<std::int64_t>{kD, kHeads * kHeadDim});
    CHECK(st.info(P + ".bd_qk.coeff").shape == std::vector<std::int64_t>{kD - kHeadDim, kHeads * kHeadDim});
    CHECK(st.info(P + ".bd_qk.indices").dtype == bd::io::DType::I32);
    CHECK(st.info(P + ".bd_qk.indices").shape == std::vector<std::int64_t>{kHeads, kHeadDim});
    CHECK(st.info(P + ".bd_vo.basis").shape == std::vector<std::int64_t>{kHeads * kHeadDim, kD});
    const Eigen::MatrixXd X = bd_test::gaussian(9, kD, 40 + unsigned(l));
    const Eigen::MatrixXd y = forward_from_file(st, P, X, /*causal=*/true);
    CHECK(bd_test::max_rel(y, folder.layers[std::size_t(l)].forward(X)) <= bd_test::kFp32OperatorBound);
  }
  // Everything else is copied byte for byte.
  const auto in = SafeTensors::open((folder.dir / "model.safetensors").string());
  for (const char* name : {"wte.weight", "h.1.ln_1.weight"})
    CHECK(std::equal(in.bytes(name), in.bytes(name) + (in.info(name).end - in.info(name).begin), st.bytes(name)));
  fs::remove_all(folder.dir);
}

TEST_CASE("GPT-2 qk only keeps the value part of the fused c_attn, vo only keeps q|k", "[convert][gpt2]") {
  Gpt2Folder folder("bd_convert_gpt2_parts");
  const auto in = SafeTensors::open((folder.dir / "model.safetensors").string());
  const Eigen::MatrixXd c_attn = in.matrix<double>("h.0.attn.c_attn.weight");

  const auto qk_out = (folder.dir / "qk.safetensors").string();
  bd::io::convert_checkpoint(folder.dir.string(), qk_out, options(bd::nn::Mode::QK, "bf16"));
  const auto qk = SafeTensors::open(qk_out);
  CHECK(qk.info("h.0.attn.bd_qk.basis").dtype == bd::io::DType::BF16);
  CHECK(qk.matrix<double>("h.0.attn.c_attn_v.weight") == c_attn.rightCols(kD));
  CHECK(qk.info("h.0.attn.c_attn_v.bias").shape == std::vector<std::int64_t>{kD});
  CHECK(qk.contains("h.0.attn.c_proj.weight"));
  CHECK_FALSE(qk.contains("h.0.attn.bd_vo.basis"));

  const auto vo_out = (folder.dir / "vo.safetensors").string();
  bd::io::convert_checkpoint(folder.dir.string(), vo_out, options(bd::nn::Mode::VO, "f16"));
  const auto vo = SafeTensors::open(vo_out);
  CHECK(vo.matrix<double>("h.1.attn.c_attn_qk.weight") == in.matrix<double>("h.1.attn.c_attn.weight").leftCols(2 * kD));
  CHECK_FALSE(vo.contains("h.1.attn.c_proj.weight"));
  CHECK(vo.info("h.1.attn.bd_vo.bias").dtype == bd::io::DType::F16);
  fs::remove_all(folder.dir);
}

TEST_CASE("a conversion that fails leaves no output file and no temporary", "[convert][bad-input]") {
  Gpt2Folder folder("bd_convert_gpt2_nan", /*poison=*/true);
  const auto out = folder.dir / "bd.safetensors";
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(folder.dir.string(), out.string(), options(bd::nn::Mode::QKVO)), bd::NonFiniteError,
                             Contains("h.1.attn") && Contains("nan"));
  CHECK_FALSE(fs::exists(out));
  CHECK(std::distance(fs::directory_iterator(folder.dir), {}) == 2);  // config.json and model.safetensors
  fs::remove_all(folder.dir);
}

TEST_CASE("a checkpoint of another architecture is named as such", "[convert][bad-input]") {
  Gpt2Folder folder("bd_convert_wrong_arch");
  auto o = options(bd::nn::Mode::VO);
  o.arch = bd::io::Arch::BERT;
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(folder.dir.string(), (folder.dir / "x.safetensors").string(), o), bd::FormatError,
                             Contains("config lacks a positive integer 'hidden_size'"));
  BD_CHECK_THROWS_CONTAINING(bd::io::parse_arch("t5"), bd::RangeError,
                             Contains("expected gpt2, bert, llama or deepseek-v2"));
  fs::remove_all(folder.dir);
}

TEST_CASE("BERT layout qkvo: nn.Linear [out, in] weights, biases, bidirectional attention", "[convert][bert]") {
  const fs::path dir = fs::temp_directory_path() / "bd_convert_bert";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "bert", "hidden_size": 48, "num_attention_heads": 4, "num_hidden_layers": 1})";
  bd_test::LayerSpec s;
  s.d_q = s.d_kv = s.d_out = kD;
  s.n_q = s.n_kv = kHeads;
  s.head_dim = kHeadDim;
  s.biases = true;
  const auto layer = bd_test::random_attention(s, 70).cast<float>().cast<double>();
  const auto& lw = layer.weights();
  const std::string P = "bert.encoder.layer.0.attention";
  bd::io::Writer w;
  w.add<float>(P + ".self.query.weight", lw.Wq.transpose()).add_vector<float>(P + ".self.query.bias", lw.bq);
  w.add<float>(P + ".self.key.weight", lw.Wk.transpose()).add_vector<float>(P + ".self.key.bias", lw.bk);
  w.add<float>(P + ".self.value.weight", lw.Wv.transpose()).add_vector<float>(P + ".self.value.bias", lw.bv);
  w.add<float>(P + ".output.dense.weight", lw.Wo.transpose()).add_vector<float>(P + ".output.dense.bias", lw.bo);
  w.add_vector<float>(P + ".output.LayerNorm.weight", Eigen::VectorXd::Ones(kD));
  w.write((dir / "model.safetensors").string());
  auto o = options(bd::nn::Mode::QKVO);
  o.arch = bd::io::Arch::BERT;
  const auto out = (dir / "bd.safetensors").string();
  bd::io::convert_checkpoint(dir.string(), out, o);
  const auto st = SafeTensors::open(out);
  CHECK_FALSE(st.contains(P + ".self.key.bias"));
  CHECK(st.contains(P + ".output.LayerNorm.weight"));
  const Eigen::MatrixXd X = bd_test::gaussian(7, kD, 71);
  const Eigen::MatrixXd y = forward_from_file(st, P, X, /*causal=*/false);
  CHECK(bd_test::max_rel(y, layer.forward(X)) <= bd_test::kFp32OperatorBound);
  fs::remove_all(dir);
}

TEST_CASE("DeepSeek-V2 layout: no-RoPE QK and VO from kv_b_proj, RoPE rows kept", "[convert][deepseek]") {
  const fs::path dir = fs::temp_directory_path() / "bd_convert_deepseek";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Eigen::Index d = 64, n = 4, nope = 8, rope = 4, dv = 6, lora = 32;
  std::ofstream(dir / "config.json") << R"({"model_type": "deepseek_v2", "hidden_size": 64, "num_attention_heads": 4,
    "num_hidden_layers": 1, "kv_lora_rank": 32, "q_lora_rank": null, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
    "v_head_dim": 6, "rope_theta": 10000})";
  const std::string P = "model.layers.0.self_attn";
  const Eigen::MatrixXd q = bd_test::gaussian(n * (nope + rope), d, 80).cast<float>().cast<double>();
  const Eigen::MatrixXd kv_b = bd_test::gaussian(n * (nope + dv), lora, 81).cast<float>().cast<double>();
  const Eigen::MatrixXd o = bd_test::gaussian(d, n * dv, 82).cast<float>().cast<double>();
  bd::io::Writer w;
  w.add<float>(P + ".q_proj.weight", q).add<float>(P + ".kv_b_proj.weight", kv_b).add<float>(P + ".o_proj.weight", o);
  w.add<float>(P + ".kv_a_proj_with_mqa.weight", bd_test::gaussian(lora + rope, d, 83));
  w.add_vector<float>(P + ".kv_a_layernorm.weight", Eigen::VectorXd::Ones(lora));
  w.write((dir / "model.safetensors").string());
  auto opts = options(bd::nn::Mode::QKVO);
  opts.arch = bd::io::Arch::DeepSeekV2;
  const auto out = (dir / "bd.safetensors").string();
  bd::io::convert_checkpoint(dir.string(), out, opts);
  const auto st = SafeTensors::open(out);
  CHECK(st.info(P + ".bd_qk.basis").shape == std::vector<std::int64_t>{d, n * nope});
  CHECK(st.info(P + ".bd_qk.coeff").shape == std::vector<std::int64_t>{lora - nope, n * nope});
  CHECK(st.info(P + ".bd_vo.basis").shape == std::vector<std::int64_t>{n * dv, d});
  CHECK_FALSE(st.contains(P + ".q_proj.weight"));
  CHECK_FALSE(st.contains(P + ".kv_b_proj.weight"));
  CHECK(st.contains(P + ".kv_a_proj_with_mqa.weight"));
  const Eigen::MatrixXd basis = st.matrix<double>(P + ".bd_qk.basis"), coeff = st.matrix<double>(P + ".bd_qk.coeff");
  const std::vector<double> idx = st.values<double>(P + ".bd_qk.indices");
  const Eigen::MatrixXd q_rope_kept = st.matrix<double>(P + ".q_rope_proj.weight");
  for (Eigen::Index h = 0; h < n; ++h) {
    // Per head: W = Wq_nope,h·W_uk,hᵀ (d × lora); its columns idx[h] are the basis, the rest basis·coeffᵀ.
    const Eigen::MatrixXd Wq = q.middleRows(h * (nope + rope), nope).transpose();
    const Eigen::MatrixXd Wuk = kv_b.middleRows(h * (nope + dv), nope).transpose();
    const Eigen::MatrixXd W = Wq * Wuk.transpose();
    const Eigen::MatrixXd B = basis.middleCols(h * nope, nope);
    const Eigen::MatrixXd rest = B * coeff.middleCols(h * nope, nope).transpose();
    Eigen::MatrixXd rebuilt(d, lora);
    Eigen::Index next = 0;
    for (Eigen::Index c = 0; c < lora; ++c) {
      Eigen::Index k = 0;
      while (k < nope && static_cast<Eigen::Index>(idx[std::size_t(h * nope + k)]) != c) ++k;
      rebuilt.col(c) = k < nope ? Eigen::VectorXd(B.col(k)) : Eigen::VectorXd(rest.col(next++));
    }
    // f32 storage of B and C: a few units of 2^-24 relative, amplified by ‖C‖ of a random basis.
    CHECK((rebuilt - W).squaredNorm() / W.squaredNorm() < 1e-11);
    CHECK(q_rope_kept.middleRows(h * rope, rope) == q.middleRows(h * (nope + rope) + nope, rope));
  }
  opts.mode = bd::nn::Mode::VO;
  bd::io::convert_checkpoint(dir.string(), out, opts);  // overwrites atomically
  const auto vo = SafeTensors::open(out);
  CHECK(vo.contains(P + ".q_proj.weight"));
  CHECK(vo.matrix<double>(P + ".kv_b_proj_k.weight").rows() == n * nope);
  CHECK(vo.matrix<double>(P + ".kv_b_proj_k.weight").topRows(nope) == kv_b.topRows(nope));
  fs::remove_all(dir);
}

TEST_CASE("format v1's record: the options bd-convert was given are read back from the file's metadata", "[convert][format]") {
  bd::io::ConvertOptions o;
  o.arch = bd::io::Arch::DeepSeekV2;
  o.mode = bd::nn::Mode::QKVO;
  o.storage = bd::Storage::BF16;
  o.decomposition.basis = Basis::Pivoted;
  o.decomposition.align = 32;
  o.force = true;
  o.latent_window_last = true;
  const auto meta = bd::io::format::metadata(o);
  CHECK(meta.at("bd.format") == "1");
  CHECK(meta.at("bd.arch") == "deepseek-v2");
  CHECK(meta.at("bd.dtype") == "bf16");
  CHECK(meta.at("bd.align") == "32");
  CHECK(meta.at("bd.force") == "true");
  const bd::io::ConvertOptions back = bd::io::format::options_from(meta, "test");
  CHECK(nlohmann::json(back) == nlohmann::json(o));
  CHECK(back.storage == bd::Storage::BF16);
  CHECK(back.decomposition.align == 32);
  CHECK(back.latent_window_last);
  // The same record in config.json's "bd" object reads back alike.
  CHECK(nlohmann::json(o).get<bd::io::ConvertOptions>().mode == bd::nn::Mode::QKVO);

  auto without = meta;
  without.erase("bd.mode");
  BD_CHECK_THROWS_CONTAINING(bd::io::format::options_from(without, "x.safetensors"), bd::FormatError,
                             Contains("x.safetensors: metadata lacks 'bd.mode'"));
  auto other = meta;
  other["bd.format"] = "2";
  BD_CHECK_THROWS_CONTAINING(bd::io::format::options_from(other, "x"), bd::FormatError,
                             Contains("bd.format is '2', this bd reads format 1"));
  auto bad = meta;
  bad["bd.dtype"] = "fp8";
  BD_CHECK_THROWS_CONTAINING(bd::io::format::options_from(bad, "x"), bd::FormatError,
                             Contains("unknown storage type 'fp8'"));
  bad = meta;
  bad["bd.align"] = "sixteen";
  BD_CHECK_THROWS_CONTAINING(bd::io::format::options_from(bad, "x"), bd::FormatError,
                             Contains("does not read as a conversion record"));
  CHECK_FALSE(bd::io::format::has_record({{"format", "pt"}}));

  // The names every reader and writer use.
  const auto qk = bd::io::format::tensor_names("model.layers.3.self_attn", bd::io::format::Family::QK);
  CHECK(qk.basis == "model.layers.3.self_attn.bd_qk.basis");
  CHECK(qk.indices == "model.layers.3.self_attn.bd_qk.indices");
  CHECK(bd::io::format::marker("h.0.attn", bd::nn::Mode::VO) == "h.0.attn.bd_vo.coeff");
}

TEST_CASE("a conversion stored in f64 reads back as it was prepared", "[convert][format]") {
  Gpt2Folder folder("bd_convert_gpt2_f64");
  const auto out = (folder.dir / "bd.safetensors").string();
  bd::io::convert_checkpoint(folder.dir.string(), out, options(bd::nn::Mode::QKVO, "f64"));
  const auto st = SafeTensors::open(out);
  CHECK(st.info("h.0.attn.bd_vo.basis").dtype == bd::io::DType::F64);
  CHECK(bd::io::format::options_from(st.metadata(), out).storage == bd::Storage::F64);
  const Eigen::MatrixXd X = bd_test::gaussian(5, kD, 77);
  const Eigen::MatrixXd y = forward_from_file(st, "h.0.attn", X, /*causal=*/true);
  CHECK(bd_test::max_rel(y, folder.layers[0].forward(X)) <= 1e-9);  // double storage: preparation's error alone
  fs::remove_all(folder.dir);
}
