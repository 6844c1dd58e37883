// Checkpoints at scale: sharded folders in and out, the index held to its shards, FP8 block
// scales dequantized exactly, and what bd-convert writes read back into bd::nn.
#include <filesystem>
#include <fstream>
#include <random>

#include <bd/io/bd_checkpoint.hpp>
#include <bd/io/convert.hpp>
#include <bd/io/model_folder.hpp>

#include "convert_support.hpp"

using namespace bd_test_convert;
using bd::io::ModelFolder;
using Catch::Contains;

namespace {

const std::string kShard1 = "model-00001-of-00002.safetensors", kShard2 = "model-00002-of-00002.safetensors";

/// A folder with config.json and two shards: a (F32 2×3, BF16 [4]) and b (F32 3×2).
fs::path two_shards(const std::string& name, const nlohmann::json& weight_map = nullptr) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"hidden_size": 3})";
  Eigen::MatrixXf a(2, 3), b(3, 2);
  a << 1, 2, 3, 4, 5, 6;
  b << 7, 8, 9, 10, 11, 12;
  bd::io::Writer w1, w2;
  w1.add<float>("a", a).add_vector<Eigen::bfloat16>("v", Eigen::VectorXf::LinSpaced(4, 0, 3));
  w2.add<float>("b", b);
  w1.write((dir / kShard1).string());
  w2.write((dir / kShard2).string());
  const nlohmann::json map = weight_map.is_null() ? nlohmann::json{{"a", kShard1}, {"v", kShard1}, {"b", kShard2}} : weight_map;
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  return dir;
}

void write_index(const fs::path& dir, const std::string& text) { std::ofstream(dir / "model.safetensors.index.json") << text; }

}  // namespace

TEST_CASE("a sharded folder reads every tensor from the shard the index names", "[io][folder]") {
  const fs::path dir = two_shards("bd_folder_ok");
  const ModelFolder m = ModelFolder::open(dir.string());
  CHECK(m.sharded());
  CHECK(m.shards().size() == 2);
  CHECK(m.tensor_count() == 3);
  CHECK(m.shard_of("b") == 1);
  CHECK(m.matrix("b", 3, 2)(2, 1) == 12);
  CHECK(m.matrix("a", 2, 3)(1, 0) == 4);
  CHECK(m.matrix("v", 4, 1)(3) == 3);
  BD_CHECK_THROWS_CONTAINING(m.matrix("a", 3, 2), bd::FormatError, Contains("is 2x3, expected 3x2"));
  fs::remove_all(dir);
}

TEST_CASE("a hostile index is refused with the shard and tensor named", "[io][folder][bad-input]") {
  SECTION("a missing shard") {
    const fs::path dir = two_shards("bd_folder_missing");
    fs::remove(dir / kShard2);
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError,
                               Contains("shard '" + kShard2 + "' (holding 'b') is missing"));
  }
  SECTION("a tensor listed twice") {
    const fs::path dir = two_shards("bd_folder_twice");
    write_index(dir, R"({"weight_map": {"a": ")" + kShard1 + R"(", "v": ")" + kShard1 + R"(", "b": ")" + kShard2 +
                         R"(", "a": ")" + kShard2 + R"("}})");
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError, Contains("'a' is listed twice"));
  }
  SECTION("the index names a tensor its shard lacks") {
    const fs::path dir = two_shards("bd_folder_lacks", {{"a", kShard1}, {"v", kShard1}, {"b", kShard1}});
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError,
                               Contains("lists tensor 'b' in shard '" + kShard1 + "', which lacks it"));
  }
  SECTION("a shard holds a tensor the index does not list") {
    const fs::path dir = two_shards("bd_folder_unlisted", {{"a", kShard1}, {"b", kShard2}});
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError,
                               Contains("holds tensor 'v', which weight_map does not list"));
  }
  SECTION("a tensor in two shards") {
    const fs::path dir = two_shards("bd_folder_dup");
    bd::io::Writer w2;
    w2.add<float>("b", Eigen::MatrixXf::Ones(3, 2)).add<float>("a", Eigen::MatrixXf::Ones(2, 3));
    w2.write((dir / kShard2).string());
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError, Contains("tensor 'a' is in shards"));
  }
  SECTION("a shard path that leaves the folder") {
    const fs::path dir = two_shards("bd_folder_path", {{"a", "../" + kShard1}, {"v", kShard1}, {"b", kShard2}});
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError,
                               Contains("expected a file name inside"));
  }
  SECTION("weight_map is not an object, or the index not JSON") {
    const fs::path dir = two_shards("bd_folder_map");
    write_index(dir, R"({"weight_map": ["a"]})");
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError,
                               Contains("lacks the object 'weight_map'"));
    write_index(dir, R"({"weight_map": {"a": 3}})");
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError,
                               Contains("expected a shard file name"));
    write_index(dir, "{\"weight_map\": ");
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError, Contains("not a JSON object"));
  }
  SECTION("a truncated shard is the parser's error, with the shard's path") {
    const fs::path dir = two_shards("bd_folder_trunc");
    fs::resize_file(dir / kShard2, fs::file_size(dir / kShard2) - 3);
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::FormatError, Contains(kShard2));
  }
  SECTION("no weights at all") {
    const fs::path dir = two_shards("bd_folder_none");
    fs::remove(dir / "model.safetensors.index.json");
    BD_CHECK_THROWS_CONTAINING(ModelFolder::open(dir.string()), bd::IoError, Contains("neither model.safetensors nor"));
  }
}

TEST_CASE("FP8 E4M3: every code decodes to its OCP value", "[io][fp8]") {
  using bd::io::fp8_e4m3_value;
  CHECK(fp8_e4m3_value(0x38) == 1.0f);            // e = 7, m = 0
  CHECK(fp8_e4m3_value(0x7E) == 448.0f);          // the largest finite value
  CHECK(fp8_e4m3_value(0x01) == std::ldexp(1.0f, -9));  // the smallest subnormal
  CHECK(fp8_e4m3_value(0x08) == std::ldexp(1.0f, -6));  // the smallest normal
  CHECK(fp8_e4m3_value(0xB8) == -1.0f);
  CHECK(std::isnan(fp8_e4m3_value(0x7F)));
  CHECK(std::isnan(fp8_e4m3_value(0xFF)));
  // Monotone over the positive codes, and exactly representable with 4 significant bits.
  for (int b = 1; b < 0x7F; ++b) {
    const float lo = fp8_e4m3_value(std::uint8_t(b - 1)), hi = fp8_e4m3_value(std::uint8_t(b));
    CHECK(hi > lo);
    int e = 0;
    const float frac = std::frexp(hi, &e);
    CHECK(std::ldexp(frac, 4) == std::floor(std::ldexp(frac, 4)));
  }
  CHECK(bd::io::fp8_e5m2_value(0x3C) == 1.0f);  // binary16 0x3C00
}

TEST_CASE("FP8 block-scaled weights are dequantized exactly, blocks from the config", "[io][fp8]") {
  const fs::path dir = fs::temp_directory_path() / "bd_folder_fp8";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"quantization_config": {"weight_block_size": [2, 4]}})";
  const Eigen::Index rows = 5, cols = 6;  // partial blocks on both axes: scales 3×2
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint8_t>((i * 37 + 11) % 0x7F);  // no NaN
  Eigen::MatrixXf scales(3, 2);
  scales << 0.5f, 3.0f, 1.0f / 3, 7e-3f, 1e4f, 2.0f;
  bd::io::Writer w;
  w.add_bytes("w.weight", bd::io::DType::F8_E4M3, {rows, cols}, std::vector<unsigned char>(codes.begin(), codes.end()));
  w.add<float>("w.weight_scale_inv", scales);
  w.add_bytes("unscaled.weight", bd::io::DType::F8_E4M3, {2, 2}, {0x38, 0x38, 0x38, 0x38});
  w.add_bytes("bad_scales.weight", bd::io::DType::F8_E4M3, {2, 2}, {0x38, 0x38, 0x38, 0x38});
  w.add<float>("bad_scales.weight_scale_inv", Eigen::MatrixXf::Ones(2, 1));
  w.write((dir / "model.safetensors").string());
  const ModelFolder m = ModelFolder::open(dir.string());
  const Eigen::MatrixXd got = m.matrix("w.weight", rows, cols);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j)
      CHECK(got(i, j) == double(bd::io::fp8_e4m3_value(codes[std::size_t(i * cols + j)])) * double(scales(i / 2, j / 4)));
  BD_CHECK_THROWS_CONTAINING(m.matrix("unscaled.weight", 2, 2), bd::FormatError,
                             Contains("has no block scales 'unscaled.weight_scale_inv'"));
  BD_CHECK_THROWS_CONTAINING(m.matrix("bad_scales.weight", 2, 2), bd::FormatError,
                             Contains("expected 1x1 for a 2x2 weight in 2x4 blocks"));
  fs::remove_all(dir);
}

TEST_CASE("an integer tensor where a weight belongs is refused by name, in a file or a shard", "[io][folder][bad-input]") {
  for (const bool sharded : {false, true}) {
    Gpt2Folder folder(sharded ? "bd_convert_int_sharded" : "bd_convert_int");
    {
      const auto st = SafeTensors::open((folder.dir / "model.safetensors").string());
      bd::io::Writer w;
      for (const auto& t : st.tensors()) {
        const unsigned char* b = st.bytes(t.name);
        if (t.name == "h.1.attn.c_proj.weight")  // same bytes, read as I32
          w.add_bytes(t.name, bd::io::DType::I32, t.shape, std::vector<unsigned char>(b, b + (t.end - t.begin)));
        else
          w.add_bytes(t.name, t.dtype, t.shape, std::vector<unsigned char>(b, b + (t.end - t.begin)));
      }
      w.write((folder.dir / "model.safetensors").string());
    }
    if (sharded) shard_folder(folder.dir, 3);
    const std::string out = (folder.dir.parent_path() / (folder.dir.filename().string() + "_out")).string();
    BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(folder.dir.string(), out, options(bd::nn::Mode::QKVO)),
                               bd::FormatError, Contains("tensor 'h.1.attn.c_proj.weight' is I32, expected a floating-point"));
    CHECK_FALSE(fs::exists(out));
    fs::remove_all(folder.dir);
  }
}

TEST_CASE("sharded in, sharded out: same shards, new index, config with a bd record, exact forward", "[io][convert][folder]") {
  Gpt2Folder folder("bd_convert_sharded");
  std::ofstream(folder.dir / "tokenizer.json") << R"({"model": "kept as is"})";
  shard_folder(folder.dir, 2);
  const fs::path out = fs::temp_directory_path() / "bd_convert_sharded_out";
  fs::remove_all(out);
  std::vector<bd::io::ConvertProgress> steps;
  const auto report = bd::io::convert_checkpoint(folder.dir.string(), out.string(), options(bd::nn::Mode::QKVO),
                                                 [&](const bd::io::ConvertProgress& p) { steps.push_back(p); });
  CHECK(report.files_in == 2);
  CHECK(report.files_out == 2);
  // Progress: each shard's copied tensors, then each layer once, counted 1..2 of 2.
  std::size_t layers_seen = 0;
  for (const auto& p : steps)
    if (p.kind == bd::io::ConvertProgress::Kind::Layer) {
      CHECK(p.layer == ++layers_seen);
      CHECK(p.layers == 2);
      CHECK(p.bytes_written > 0);
    }
  CHECK(layers_seen == 2);

  // The folder mirrors the input: its shard files, an index naming every tensor where it is,
  // config.json with the bd record, the tokenizer copied; no temporary left beside it.
  CHECK(fs::exists(out / kShard1));
  CHECK(fs::exists(out / kShard2));
  CHECK(fs::exists(out / "tokenizer.json"));
  CHECK(bd::io::read_json_file((out / "config.json").string()).at("bd").at("mode") == "qkvo");
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    CHECK(e.path().filename().string().rfind("bd_convert_sharded_out.tmp", 0) != 0);
  const ModelFolder m = ModelFolder::open(out.string());  // validates the index against the shards
  CHECK(static_cast<std::int64_t>(m.tensor_count()) == report.tensors_out);
  CHECK_FALSE(m.contains("h.0.attn.c_attn.weight"));
  CHECK(m.metadata().at("bd.format") == "1");

  // Each layer's BD tensors went to the shard of its first consumed tensor, and give the dense
  // attention by the documented rule.
  for (Eigen::Index l = 0; l < kLayers; ++l) {
    const std::string P = "h." + std::to_string(l) + ".attn";
    const SafeTensors& st = m.file_of(P + ".bd_qk.basis");
    for (const char* t : {".bd_qk.coeff", ".bd_qk.indices", ".bd_qk.bias", ".bd_vo.coeff", ".bd_vo.basis", ".bd_vo.bias"})
      CHECK(m.file_of(P + t).source() == st.source());
    const Eigen::MatrixXd X = bd_test::gaussian(9, kD, 80 + unsigned(l));
    const Eigen::MatrixXd y = folder.layers[std::size_t(l)].forward(X);
    const Eigen::MatrixXd y_bd = forward_from_file(st, P, X, true);
    CHECK((y_bd - y).cwiseAbs().template maxCoeff<Eigen::PropagateNaN>() <= 1e-4 * y.cwiseAbs().maxCoeff());  // f32 storage
  }
  // An existing folder is never overwritten.
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(folder.dir.string(), out.string(), options(bd::nn::Mode::QKVO)),
                             bd::IoError, Contains("already exists"));
  fs::remove_all(out);
  fs::remove_all(folder.dir);
}

TEST_CASE("a failing sharded conversion leaves no folder and no temporary", "[io][convert][folder][bad-input]") {
  Gpt2Folder folder("bd_convert_sharded_nan", /*poison=*/true);
  shard_folder(folder.dir, 2);
  const fs::path out = fs::temp_directory_path() / "bd_convert_sharded_nan_out";
  fs::remove_all(out);
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(folder.dir.string(), out.string(), options(bd::nn::Mode::QKVO)),
                             bd::NonFiniteError, Contains("h.1.attn.c_attn.weight"));
  CHECK_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
    CHECK(e.path().filename().string().rfind("bd_convert_sharded_nan_out.tmp", 0) != 0);
  fs::remove_all(folder.dir);
}

TEST_CASE("a BD checkpoint reads back into BDAttention equal to the one prepared in memory", "[io][convert][reader]") {
  Gpt2Folder folder("bd_convert_reader");
  shard_folder(folder.dir, 2);
  for (const auto mode : {bd::nn::Mode::QKVO, bd::nn::Mode::QK, bd::nn::Mode::VO}) {
    const fs::path out = fs::temp_directory_path() / "bd_convert_reader_out";
    fs::remove_all(out);
    bd::io::convert_checkpoint(folder.dir.string(), out.string(), options(mode, "f16"));
    const auto layers = bd::io::load_bd_attention<Eigen::half>(out.string());
    REQUIRE(layers.size() == std::size_t(kLayers));
    for (Eigen::Index l = 0; l < kLayers; ++l) {
      const auto& dense = folder.layers[std::size_t(l)];
      bd::nn::BDAttentionOptions o;
      o.mode = mode;
      const auto in_memory = bd::nn::BDAttention<Eigen::half>::prepare(dense, o);
      const auto& read = layers[std::size_t(l)];
      CHECK(read.mode() == mode);
      const Eigen::MatrixXf X = bd_test::gaussian(7, kD, 90 + unsigned(l)).cast<float>();
      // The same stored tensors, the same arithmetic: bit for bit.
      CHECK(read.forward(X) == in_memory.forward(X));
    }
    fs::remove_all(out);
  }
  // Not a BD checkpoint: said so.
  BD_CHECK_THROWS_CONTAINING(bd::io::load_bd_attention<float>(folder.dir.string()), bd::FormatError,
                             Contains("not a BD checkpoint"));
  fs::remove_all(folder.dir);
}

TEST_CASE("an FP8 checkpoint converts to the same BD tensors as its dequantized f32 twin", "[io][convert][fp8]") {
  // LLaMA-layout weights quantized to E4M3 with 4×4 block scales, and the same values in f64.
  const fs::path fp8 = fs::temp_directory_path() / "bd_convert_fp8", f32 = fs::temp_directory_path() / "bd_convert_fp8_twin";
  const Eigen::Index d = 16, heads = 2, dh = 8;
  for (const auto& dir : {fp8, f32}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "vocab_size": 4, "rope_theta": 10000.0,
      "quantization_config": {"weight_block_size": [4, 4]}})";
  }
  bd::io::Writer wq, wf;
  std::mt19937 rng(5);
  for (const char* name : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    std::vector<unsigned char> codes(static_cast<std::size_t>(d * heads * dh));
    for (auto& c : codes) c = static_cast<unsigned char>(rng() % 0x7F) | static_cast<unsigned char>((rng() & 1) << 7);
    Eigen::MatrixXf scales = Eigen::MatrixXf::Random(4, 4).cwiseAbs().array() + 0.01f;
    Eigen::MatrixXd values(d, d);  // the product of a 4-bit and a 24-bit significand: exact in double, not in float
    for (Eigen::Index i = 0; i < d; ++i)
      for (Eigen::Index j = 0; j < d; ++j)
        values(i, j) = double(bd::io::fp8_e4m3_value(codes[std::size_t(i * d + j)])) * double(scales(i / 4, j / 4));
    const std::string t = std::string("model.layers.0.self_attn.") + name + ".weight";
    wq.add_bytes(t, bd::io::DType::F8_E4M3, {d, d}, codes).add<float>(t + "_scale_inv", scales);
    wf.add<double>(t, values);
  }
  wq.write((fp8 / "model.safetensors").string());
  wf.write((f32 / "model.safetensors").string());
  bd::io::ConvertOptions o;
  o.arch = bd::io::Arch::LLaMA;
  o.mode = bd::nn::Mode::VO;
  o.force = true;
  const std::string a = (fp8.string() + "_out.safetensors"), b = (f32.string() + "_out.safetensors");
  bd::io::convert_checkpoint(fp8.string(), a, o);
  bd::io::convert_checkpoint(f32.string(), b, o);
  const auto A = SafeTensors::open(a), B = SafeTensors::open(b);
  for (const char* t : {"bd_vo.coeff", "bd_vo.basis", "bd_vo.indices"}) {
    const std::string name = std::string("model.layers.0.self_attn.") + t;
    const auto& ia = A.info(name);
    REQUIRE(ia.end - ia.begin == B.info(name).end - B.info(name).begin);
    CHECK(std::memcmp(A.bytes(name), B.bytes(name), ia.end - ia.begin) == 0);
  }
  // The consumed weights' block scales went with them; Q and K stay FP8 with theirs.
  CHECK_FALSE(A.contains("model.layers.0.self_attn.v_proj.weight_scale_inv"));
  CHECK(A.contains("model.layers.0.self_attn.q_proj.weight_scale_inv"));
  CHECK(A.info("model.layers.0.self_attn.q_proj.weight").dtype == bd::io::DType::F8_E4M3);
  for (const auto& p : {fp8, f32}) fs::remove_all(p);
  fs::remove(a);
  fs::remove(b);
}

namespace {

/// A DeepSeek-V2/V3-layout folder (one layer, f32, sharded in two): the whole MLA layer.
fs::path deepseek_folder(const std::string& name, bool q_lora) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  const Eigen::Index d = 40, n = 4, nope = 8, rope = 4, dv = 8, lora = 32, ql = 24;
  nlohmann::json config = {{"model_type", "deepseek_v3"}, {"hidden_size", d}, {"num_attention_heads", n},
                           {"num_hidden_layers", 2},     {"kv_lora_rank", lora}, {"qk_nope_head_dim", nope},
                           {"qk_rope_head_dim", rope},   {"v_head_dim", dv},     {"rope_theta", 10000.0},
                           {"rms_norm_eps", 1e-6},       {"q_lora_rank", q_lora ? nlohmann::json(ql) : nlohmann::json(nullptr)}};
  std::ofstream(dir / "config.json") << config.dump();
  bd::io::Writer w;
  auto g = [](Eigen::Index r, Eigen::Index c, unsigned seed) { return Eigen::MatrixXd(bd_test::gaussian(r, c, seed) / std::sqrt(double(c))); };
  for (int l = 0; l < 2; ++l) {
    const std::string P = "model.layers." + std::to_string(l) + ".self_attn.";
    const unsigned s = 100 + 10 * unsigned(l);
    if (q_lora) {
      w.add<float>(P + "q_a_proj.weight", g(ql, d, s));
      w.add_vector<float>(P + "q_a_layernorm.weight", Eigen::VectorXd(bd_test::gaussian(ql, 1, s + 1).array().abs() + 0.5));
      w.add<float>(P + "q_b_proj.weight", g(n * (nope + rope), ql, s + 2));
    } else {
      w.add<float>(P + "q_proj.weight", g(n * (nope + rope), d, s + 2));
    }
    w.add<float>(P + "kv_a_proj_with_mqa.weight", g(lora + rope, d, s + 3));
    w.add_vector<float>(P + "kv_a_layernorm.weight", Eigen::VectorXd(bd_test::gaussian(lora, 1, s + 4).array().abs() + 0.5));
    w.add<float>(P + "kv_b_proj.weight", g(n * (nope + dv), lora, s + 5));
    w.add<float>(P + "o_proj.weight", g(d, n * dv, s + 6));
  }
  w.write((dir / "model.safetensors").string());
  shard_folder(dir, 2);
  return dir;
}

}  // namespace

TEST_CASE("DeepSeek-V2/V3 folders, with and without query LoRA, read back as MLA that prefills and decodes absorbed",
          "[io][convert][reader][deepseek][mla]") {
  for (const bool q_lora : {false, true})
    for (const auto mode : {bd::nn::Mode::QKVO, bd::nn::Mode::QK, bd::nn::Mode::VO}) {
      INFO("q_lora " << q_lora << ", mode " << bd::nn::to_string(mode));
      const fs::path in = deepseek_folder("bd_convert_ds", q_lora), out = fs::temp_directory_path() / "bd_convert_ds_out";
      fs::remove_all(out);
      auto o = options(mode);
      o.arch = bd::io::Arch::DeepSeekV2;
      bd::io::convert_checkpoint(in.string(), out.string(), o);
      const auto dense = bd::io::load_attention<double>(in.string(), bd::io::Arch::DeepSeekV2);
      const auto layers = bd::io::load_bd_attention<float>(out.string());
      REQUIRE(layers.size() == 2);
      for (std::size_t l = 0; l < 2; ++l) {
        const Eigen::MatrixXd x = bd_test::gaussian(6, 40, 120 + unsigned(l));
        const Eigen::MatrixXd y = dense[l].forward(x);  // the reference, in double
        const Eigen::MatrixXf xf = x.cast<float>();
        CHECK(bd_test::max_rel(layers[l].forward(xf), y) <= bd_test::kFp32OperatorBound);
        bd::nn::LatentCache<float> cache;
        Eigen::MatrixXf got(6, 40);
        got.topRows(4) = layers[l].prefill(xf.topRows(4), cache);
        got.row(4) = layers[l].decode_absorbed(xf.row(4), cache);
        got.row(5) = layers[l].decode_absorbed(xf.row(5), cache);
        CHECK(bd_test::max_rel(got, y) <= bd_test::kFp32OperatorBound);
      }
      fs::remove_all(out);
      fs::remove_all(in);
    }
}

TEST_CASE("DeepSeek folder converted with the latent window last: one K' call per layer, the same layer as in memory",
          "[io][convert][deepseek][mla][latent-order]") {
  const fs::path in = deepseek_folder("bd_convert_ds_wl", true), out = fs::temp_directory_path() / "bd_convert_ds_wl_out";
  fs::remove_all(out);
  auto o = options(bd::nn::Mode::QKVO);
  o.arch = bd::io::Arch::DeepSeekV2;
  o.decomposition.basis = bd::Basis::OffsetSearch;
  o.latent_window_last = true;
  const auto report = bd::io::convert_checkpoint(in.string(), out.string(), o);
  CHECK(report.to_json()["latent_window_last"] == true);
  CHECK(nlohmann::json::parse(std::ifstream(out / "config.json"))["bd"]["latent_window_last"] == true);
  const auto dense = bd::io::load_attention<double>(in.string(), bd::io::Arch::DeepSeekV2);
  const auto layers = bd::io::load_bd_attention<float>(out.string());
  REQUIRE(layers.size() == 2);
  for (std::size_t l = 0; l < 2; ++l) {
    INFO("layer " << l);
    CHECK(layers[l].qk_indices().shared);
    CHECK(layers[l].qk_indices().offset == 32 - 8);  // d_c − d_h: the rest is one piece
    CHECK(report.layers[l].qk.window == "rows 24..31 (latent reordered)");
    const Eigen::MatrixXd x = bd_test::gaussian(6, 40, 130 + unsigned(l));
    const Eigen::MatrixXd y = dense[l].forward(x);
    const Eigen::MatrixXf xf = x.cast<float>();
    CHECK(bd_test::max_rel(layers[l].forward(xf), y) <= bd_test::kFp32OperatorBound);
    bd::nn::LatentCache<float> cache;
    Eigen::MatrixXf got(6, 40);
    got.topRows(4) = layers[l].prefill(xf.topRows(4), cache);
    got.bottomRows(2) = layers[l].decode_absorbed(xf.bottomRows(2), cache);
    CHECK(bd_test::max_rel(got, y) <= bd_test::kFp32OperatorBound);
    // The folder holds exactly the in-memory layer reordered: kv_a_proj's latent rows and the
    // latent norm were written in the new order, so the forward pass agrees bit for bit.
    bd::nn::BDAttentionOptions bo;
    bo.mode = bd::nn::Mode::QKVO;
    bo.decomposition = o.decomposition;
    const auto moved = bd::nn::latent_window_last(bd::nn::BDAttention<float>::prepare(dense[l], bo));
    CHECK(layers[l].forward(xf) == moved.layer.forward(xf));
  }
  fs::remove_all(out);

  // What it cannot do is refused before anything is written.
  o.mode = bd::nn::Mode::QK;
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(in.string(), out.string(), o), bd::RefusedError,
                             Contains("mode qkvo"));
  CHECK_FALSE(fs::exists(out));
  o.mode = bd::nn::Mode::QKVO;
  o.decomposition.basis = bd::Basis::Pivoted;
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(in.string(), out.string(), o), bd::RefusedError,
                             Contains("per head (pivoted)"));
  CHECK_FALSE(fs::exists(out));
  fs::remove_all(in);
}
