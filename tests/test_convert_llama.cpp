// Converting the real stories260K checkpoint (LLaMA layout, GQA 2:1, RoPE) with --mode vo:
// the per-head products rebuilt from the written tensors by the documented rule match the
// originals within the core bounds; QK is refused under RoPE; the cost model refuses VO (GQA)
// unless forced.
#include <filesystem>

#include <bd/io/bd_checkpoint.hpp>
#include <bd/io/convert.hpp>
#include <bd/io/llama.hpp>

#include "support.hpp"

namespace fs = std::filesystem;
using Catch::Contains;

namespace {

bd::io::ConvertOptions llama_vo(const std::string& dtype) {
  bd::io::ConvertOptions o;
  o.arch = bd::io::Arch::LLaMA;
  o.mode = bd::nn::Mode::VO;
  o.storage = bd::parse_storage(dtype);
  o.force = false;  // GQA 2:1: VO with windows per key/value group (the default) needs no --force
  // The default, auto: no shared window of a layer meets 10x the type's rounding floor on these
  // weights, so each head gets its own pivoted basis; the core bounds are per-head bounds.
  o.decomposition.align = 8;
  return o;
}

/// Mean NMSE over heads of W_h = Wv_g·Wo_h rebuilt from the written tensors: rows indices[k] of
/// W_h are rows h·d_h.. of bd_vo.basis, the other rows (ascending) are coeff_k·basis_h, k the
/// head's window (k = g per key/value group, k = h per query head: the file's indices say which).
double rebuilt_nmse(const std::string& dir, const std::string& converted) {
  const auto in = bd::io::SafeTensors::open(dir + "/model.safetensors");
  const auto out = bd::io::SafeTensors::open(converted);
  const Eigen::Index d = 64, dh = 8, heads = 8;
  double sum = 0;
  int count = 0;
  for (int l = 0; l < 5; ++l) {
    const std::string P = "model.layers." + std::to_string(l) + ".self_attn";
    const Eigen::MatrixXd wv = in.matrix<double>(P + ".v_proj.weight"), wo = in.matrix<double>(P + ".o_proj.weight");
    const Eigen::MatrixXd basis = out.matrix<double>(P + ".bd_vo.basis"), coeff = out.matrix<double>(P + ".bd_vo.coeff");
    const std::vector<double> indices = out.values<double>(P + ".bd_vo.indices");
    const Eigen::Index per = heads / (Eigen::Index(indices.size()) / dh);  // query heads per window
    for (Eigen::Index h = 0; h < heads; ++h) {
      const Eigen::Index k = h / per;
      const Eigen::MatrixXd W = wv.middleRows((h / 2) * dh, dh).transpose() * wo.middleCols(h * dh, dh).transpose();
      Eigen::MatrixXd rebuilt(d, d);
      std::vector<Eigen::Index> S;
      for (Eigen::Index j = 0; j < dh; ++j) S.push_back(static_cast<Eigen::Index>(indices[std::size_t(k * dh + j)]));
      const Eigen::MatrixXd B = basis.middleRows(h * dh, dh);
      const Eigen::MatrixXd CB = coeff.middleCols(k * dh, dh) * B;
      Eigen::Index next = 0;
      for (Eigen::Index r = 0; r < d; ++r) {
        const auto at = std::find(S.begin(), S.end(), r);
        rebuilt.row(r) = at != S.end() ? Eigen::RowVectorXd(B.row(at - S.begin())) : Eigen::RowVectorXd(CB.row(next++));
      }
      sum += (rebuilt - W).squaredNorm() / W.squaredNorm();
      ++count;
    }
  }
  return sum / count;
}

}  // namespace

TEST_CASE("stories260K --mode vo: products rebuilt from the file meet the core bounds", "[convert][real-model]") {
  const std::string dir = bd_test::require_model("stories260K");
  const fs::path tmp = fs::temp_directory_path() / "bd_convert_stories";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  for (const auto& [dtype, bound] : {std::pair<std::string, double>{"f32", 2e-14}, {"f16", 1e-6}, {"bf16", 6e-5}}) {
    const std::string out = (tmp / (dtype + ".safetensors")).string();
    const auto report = bd::io::convert_checkpoint(dir, out, llama_vo(dtype));
    CHECK(report.layers.size() == 5);
    CHECK(report.layers.front().warnings.empty());
    const double nmse = rebuilt_nmse(dir, out);
    WARN("stories260K vo " << dtype << ": mean NMSE rebuilt from the file " << nmse);
    CHECK(nmse <= bound);
    const auto st = bd::io::SafeTensors::open(out);
    CHECK_FALSE(st.contains("model.layers.0.self_attn.v_proj.weight"));
    CHECK_FALSE(st.contains("model.layers.0.self_attn.o_proj.weight"));
    CHECK(st.contains("model.layers.0.self_attn.q_proj.weight"));
    // One window per key/value head: V' (and the cache) keeps the model's 4 heads.
    CHECK(st.info("model.layers.4.self_attn.bd_vo.indices").shape == std::vector<std::int64_t>{4, 8});
    CHECK(st.info("model.layers.4.self_attn.bd_vo.coeff").shape == std::vector<std::int64_t>{56, 32});
  }
  // A window per query head, forced past the cost model: 8 heads of V', with its warning.
  const std::string out = (tmp / "per_head.safetensors").string();
  auto per_head = llama_vo("f32");
  per_head.windows = bd::nn::Windows::PerHead;
  per_head.force = true;
  const auto report = bd::io::convert_checkpoint(dir, out, per_head);
  REQUIRE_FALSE(report.layers.front().warnings.empty());
  CHECK_THAT(report.layers.front().warnings.front(), Contains("K'/V' need 8 heads instead of 4"));
  CHECK(rebuilt_nmse(dir, out) <= 2e-14);
  const auto st = bd::io::SafeTensors::open(out);
  CHECK(bd::io::format::options_from(st.metadata(), out).windows == bd::nn::Windows::PerHead);  // recorded
  CHECK(st.info("model.layers.4.self_attn.bd_vo.indices").shape == std::vector<std::int64_t>{8, 8});
  fs::remove_all(tmp);
}

TEST_CASE("stories260K: QK is refused under RoPE, VO per query head without --force by the cost model", "[convert][real-model]") {
  const std::string dir = bd_test::require_model("stories260K");
  const std::string out = (fs::temp_directory_path() / "bd_refused.safetensors").string();
  auto qk = llama_vo("f32");
  qk.mode = bd::nn::Mode::QK;
  qk.force = false;
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(dir, out, qk), bd::RefusedError, Contains("RoPE"));
  auto vo = llama_vo("f32");
  vo.windows = bd::nn::Windows::PerHead;
  BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(dir, out, vo), bd::RefusedError,
                             Contains("model.layers.0.self_attn") && Contains("cost model"));
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("stories260K converted to a folder loads back with the in-memory BD model's logits", "[convert][real-model][reader]") {
  const std::string dir = bd_test::require_model("stories260K");
  const fs::path out = fs::temp_directory_path() / "bd_convert_stories_folder";
  const std::vector<int> tokens = {1, 40, 7, 301, 12, 5, 88, 140, 3, 9};
  const auto model = bd::io::load_llama<float>(dir);
  for (const std::string dtype : {"f32", "f16"}) {
    fs::remove_all(out);
    const auto o = llama_vo(dtype);
    bd::io::convert_checkpoint(dir, out.string(), o);
    bd::nn::BDAttentionOptions bo;
    bo.mode = o.mode;
    bo.decomposition = o.decomposition;
    // The same stored tensors read back: the same logits, bit for bit.
    if (dtype == "f32") {
      const auto read = bd::io::load_bd_llama<float>(out.string());
      CHECK(read.logits(tokens) == model.with_bd_attention<float>(bo).logits(tokens));
    } else {
      const auto read = bd::io::load_bd_llama<Eigen::half>(out.string());
      CHECK(read.logits(tokens) == model.with_bd_attention<Eigen::half>(bo).logits(tokens));
    }
  }
  // Windows per query head (forced): read back as such, the same logits as in memory.
  fs::remove_all(out);
  auto o = llama_vo("f32");
  o.windows = bd::nn::Windows::PerHead;
  o.force = true;
  bd::io::convert_checkpoint(dir, out.string(), o);
  const auto read = bd::io::load_bd_llama<float>(out.string());
  CHECK(read.layers.front().attention.windows() == bd::nn::Windows::PerHead);
  bd::nn::BDAttentionOptions bo;
  bo.mode = o.mode;
  bo.decomposition = o.decomposition;
  bo.windows = o.windows;
  bo.cost_policy = bd::nn::CostPolicy::Allow;
  CHECK(read.logits(tokens) == model.with_bd_attention<float>(bo).logits(tokens));
  fs::remove_all(out);
}
