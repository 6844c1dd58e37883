// Model families exactly as their own code computes them. The references here are written from
// the published formulas and forwards (Hugging Face's rotary initialisation and LlamaAttention,
// DeepSeek's modeling_deepseek.py: DeepseekV2Attention with its YaRN tables and interleaved RoPE
// channels), in double, sharing no code with bd; bd reads the same checkpoint folders through
// bd::io and must agree to 1e-12. Every config feature bd does not implement is refused by name.
#include <bd/io/bd_checkpoint.hpp>
#include <bd/io/convert.hpp>
#include <bd/io/llama.hpp>
#include <bd/io/model_config.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "convert_support.hpp"

namespace fs = std::filesystem;
using bd::nn::RopeScaling;
using bd::nn::RopeType;
using Catch::Contains;
using Eigen::Index;
using Eigen::MatrixXd;
using Eigen::VectorXd;

namespace {

constexpr double kPi = 3.14159265358979323846;

// ---- the published RoPE formulas, written out ---------------------------------------------

/// base^(−arange(0, dim, 2)/dim).
VectorXd plain_inv_freq(Index dim, double base) {
  VectorXd f(dim / 2);
  for (Index i = 0; i < dim / 2; ++i) f(i) = 1.0 / std::pow(base, double(2 * i) / double(dim));
  return f;
}

/// Llama 3.1's frequencies (the reference's where / smooth_factor / is_medium_freq steps).
VectorXd llama3_inv_freq(Index dim, double base, double factor, double low, double high, double old_context) {
  const VectorXd inv = plain_inv_freq(dim, base);
  VectorXd out(inv.size());
  for (Index i = 0; i < inv.size(); ++i) {
    const double wavelen = 2 * kPi / inv(i);
    const double scaled = wavelen > old_context / low ? inv(i) / factor : inv(i);
    const double smooth = (old_context / wavelen - low) / (high - low);
    const double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < old_context / high) && !(wavelen > old_context / low);
    out(i) = medium ? smoothed : scaled;
  }
  return out;
}

/// YaRN's frequencies as DeepSeek's DeepseekV2YarnRotaryEmbedding computes them.
VectorXd yarn_inv_freq(Index dim, double base, double factor, double original, double beta_fast, double beta_slow) {
  auto correction_dim = [&](double rot) { return (double(dim) * std::log(original / (rot * 2 * kPi))) / (2 * std::log(base)); };
  const double low = std::max(std::floor(correction_dim(beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;
  VectorXd out(dim / 2);
  for (Index i = 0; i < dim / 2; ++i) {
    const double freq_extra = 1.0 / std::pow(base, double(2 * i) / double(dim));
    const double freq_inter = 1.0 / (factor * std::pow(base, double(2 * i) / double(dim)));
    const double mask = 1.0 - std::min(1.0, std::max(0.0, (double(i) - low) / (high - low)));
    out(i) = freq_inter * (1 - mask) + freq_extra * mask;
  }
  return out;
}

double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

/// cos and sin tables (positions × dim) of emb = cat(freqs, freqs), times `scale`.
std::pair<MatrixXd, MatrixXd> cos_sin(const VectorXd& inv_freq, Index first, Index count, double scale = 1) {
  const Index half = inv_freq.size();
  MatrixXd c(count, 2 * half), s(count, 2 * half);
  for (Index t = 0; t < count; ++t)
    for (Index i = 0; i < half; ++i) {
      const double f = double(first + t) * inv_freq(i);
      c(t, i) = c(t, i + half) = std::cos(f) * scale;
      s(t, i) = s(t, i + half) = std::sin(f) * scale;
    }
  return {c, s};
}

/// x·cos + rotate_half(x)·sin on a rows × dim block (one head), after de-interleaving the
/// channels (view (d/2, 2) → transpose → reshape) when asked.
MatrixXd rotary(MatrixXd x, const MatrixXd& c, const MatrixXd& s, bool deinterleave) {
  const Index d = x.cols(), half = d / 2;
  if (deinterleave) {
    MatrixXd y(x.rows(), d);
    for (Index i = 0; i < half; ++i) y.col(i) = x.col(2 * i), y.col(half + i) = x.col(2 * i + 1);
    x = y;
  }
  MatrixXd rotated(x.rows(), d);
  rotated << -x.rightCols(half), x.leftCols(half);
  return (x.array() * c.array() + rotated.array() * s.array()).matrix();
}

MatrixXd rms(const MatrixXd& x, const VectorXd& g, double eps) {
  MatrixXd out(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i) out.row(i) = x.row(i) / std::sqrt(x.row(i).squaredNorm() / double(x.cols()) + eps);
  return out * g.asDiagonal();
}

/// softmax(scores + causal mask) row by row; query t sits at position q0 + t, key j at j.
MatrixXd causal_softmax(MatrixXd scores, Index q0) {
  for (Index t = 0; t < scores.rows(); ++t) {
    for (Index j = q0 + t + 1; j < scores.cols(); ++j) scores(t, j) = -std::numeric_limits<double>::infinity();
    const double top = scores.row(t).maxCoeff();
    scores.row(t) = (scores.row(t).array() - top).exp().matrix();
    scores.row(t) /= scores.row(t).sum();
  }
  return scores;
}

MatrixXd gauss(Index r, Index c, unsigned seed) { return bd_test::gaussian(r, c, seed) / std::sqrt(double(c)); }

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// ---- DeepSeek ---------------------------------------------------------------------------------

/// One DeepSeek MLA layer as its checkpoint stores it ([out, in]), and DeepseekV2Attention.forward
/// over it in double.
struct DeepSeekLayer {
  Index d = 40, n = 4, nope = 8, rope = 8, dv = 6, lora = 24, ql = 0, max_positions = 163840;
  double theta = 10000, eps = 1e-6;
  nlohmann::json rope_scaling;
  MatrixXd q_a, q_b, q, kv_a, kv_b, o;
  VectorXd q_a_norm, kv_a_norm;

  DeepSeekLayer(Index q_lora, nlohmann::json scaling, unsigned seed) : ql(q_lora), rope_scaling(std::move(scaling)) {
    if (ql) {
      q_a = gauss(ql, d, seed), q_b = gauss(n * (nope + rope), ql, seed + 1);
      q_a_norm = (bd_test::gaussian(ql, 1, seed + 2).array().abs() + 0.5).matrix();
    } else {
      q = gauss(n * (nope + rope), d, seed + 1);
    }
    kv_a = gauss(lora + rope, d, seed + 3);
    kv_a_norm = (bd_test::gaussian(lora, 1, seed + 4).array().abs() + 0.5).matrix();
    kv_b = gauss(n * (nope + dv), lora, seed + 5);
    o = gauss(d, n * dv, seed + 6);
  }

  nlohmann::json config() const {
    return {{"model_type", ql ? "deepseek_v3" : "deepseek_v2"}, {"hidden_size", d}, {"num_attention_heads", n},
            {"num_hidden_layers", 1}, {"kv_lora_rank", lora}, {"q_lora_rank", ql ? nlohmann::json(ql) : nlohmann::json(nullptr)},
            {"qk_nope_head_dim", nope}, {"qk_rope_head_dim", rope}, {"v_head_dim", dv}, {"rope_theta", theta},
            {"rms_norm_eps", eps}, {"max_position_embeddings", max_positions}, {"rope_scaling", rope_scaling}};
  }

  fs::path write(const std::string& name) const {
    const fs::path dir = fresh_dir(name);
    std::ofstream(dir / "config.json") << config().dump();
    bd::io::Writer w;
    const std::string P = "model.layers.0.self_attn.";
    if (ql) {
      w.add<double>(P + "q_a_proj.weight", q_a);
      w.add_vector<double>(P + "q_a_layernorm.weight", q_a_norm);
      w.add<double>(P + "q_b_proj.weight", q_b);
    } else {
      w.add<double>(P + "q_proj.weight", q);
    }
    w.add<double>(P + "kv_a_proj_with_mqa.weight", kv_a);
    w.add_vector<double>(P + "kv_a_layernorm.weight", kv_a_norm);
    w.add<double>(P + "kv_b_proj.weight", kv_b);
    w.add<double>(P + "o_proj.weight", o);
    w.write((dir / "model.safetensors").string());
    return dir;
  }

  /// The outputs of tokens q0 … x.rows() − 1 of the sequence x (positions 0 …).
  MatrixXd forward(const MatrixXd& x, Index q0) const {
    const Index L = x.rows(), Lq = L - q0;
    const double factor = rope_scaling.is_null() ? 1.0 : rope_scaling.value("factor", 1.0);
    double softmax_scale = 1.0 / std::sqrt(double(nope + rope));
    VectorXd inv_freq = plain_inv_freq(rope, theta);
    double cos_scale = 1;
    if (!rope_scaling.is_null()) {
      const double mscale = rope_scaling.value("mscale", 1.0), mscale_all_dim = rope_scaling.value("mscale_all_dim", 0.0);
      if (mscale_all_dim != 0) softmax_scale *= yarn_get_mscale(factor, mscale_all_dim) * yarn_get_mscale(factor, mscale_all_dim);
      inv_freq = yarn_inv_freq(rope, theta, factor, rope_scaling.value("original_max_position_embeddings", 4096.0),
                               rope_scaling.value("beta_fast", 32.0), rope_scaling.value("beta_slow", 1.0));
      cos_scale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim);
    }
    const MatrixXd xq = x.bottomRows(Lq);
    const MatrixXd qs = ql ? MatrixXd(rms(xq * q_a.transpose(), q_a_norm, eps) * q_b.transpose()) : MatrixXd(xq * q.transpose());
    const MatrixXd compressed = x * kv_a.transpose();  // L × (lora + rope)
    const MatrixXd kv = rms(compressed.leftCols(lora), kv_a_norm, eps) * kv_b.transpose();
    const auto [cq, sq] = cos_sin(inv_freq, q0, Lq, cos_scale);
    const auto [ck, sk] = cos_sin(inv_freq, 0, L, cos_scale);
    const MatrixXd k_pe = rotary(compressed.rightCols(rope), ck, sk, true);
    MatrixXd heads(Lq, n * dv);
    for (Index h = 0; h < n; ++h) {
      const MatrixXd q_nope = qs.middleCols(h * (nope + rope), nope);
      const MatrixXd q_pe = rotary(qs.middleCols(h * (nope + rope) + nope, rope), cq, sq, true);
      const MatrixXd k_nope = kv.middleCols(h * (nope + dv), nope), v = kv.middleCols(h * (nope + dv) + nope, dv);
      const MatrixXd p = causal_softmax((q_nope * k_nope.transpose() + q_pe * k_pe.transpose()) * softmax_scale, q0);
      heads.middleCols(h * dv, dv) = p * v;
    }
    return heads * o.transpose();
  }
};

const nlohmann::json kV2LiteYarn = {{"type", "yarn"}, {"factor", 40}, {"mscale", 0.707}, {"mscale_all_dim", 0.707},
                                    {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1}};
const nlohmann::json kV3Yarn = {{"type", "yarn"}, {"factor", 40}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                                {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1}};

// ---- LLaMA family -------------------------------------------------------------------------

/// A one-layer LLaMA-family model ([out, in] weights, q/k/v biases for qwen2), and Hugging Face's
/// LlamaForCausalLM forward over it in double.
struct LlamaFolder {
  Index d = 32, heads = 4, kv_heads = 2, head_dim = 8, ff = 40, vocab = 23, layers = 2;
  double theta = 500000, eps = 1e-5;
  nlohmann::json config;
  bool biases = false;
  MatrixXd embed, head;
  VectorXd final_norm;
  struct Layer {
    MatrixXd q, k, v, o, gate, up, down;
    VectorXd bq, bk, bv, attn_norm, mlp_norm;
  };
  std::vector<Layer> weights;

  LlamaFolder(nlohmann::json scaling, bool qwen_biases, unsigned seed) : biases(qwen_biases) {
    config = {{"model_type", biases ? "qwen2" : "llama"}, {"hidden_size", d}, {"intermediate_size", ff},
              {"num_hidden_layers", layers}, {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
              {"vocab_size", vocab}, {"max_position_embeddings", 64}, {"rms_norm_eps", eps}, {"rope_theta", theta},
              {"hidden_act", "silu"}, {"tie_word_embeddings", false}, {"rope_scaling", std::move(scaling)}};
    embed = bd_test::gaussian(vocab, d, seed);
    head = gauss(vocab, d, seed + 1);
    final_norm = (bd_test::gaussian(d, 1, seed + 2).array().abs() + 0.5).matrix();
    for (Index l = 0; l < layers; ++l) {
      const unsigned s = seed + 10 * unsigned(l + 1);
      Layer w{gauss(heads * head_dim, d, s), gauss(kv_heads * head_dim, d, s + 1), gauss(kv_heads * head_dim, d, s + 2),
              gauss(d, heads * head_dim, s + 3), gauss(ff, d, s + 4), gauss(ff, d, s + 5), gauss(d, ff, s + 6),
              {}, {}, {}, (bd_test::gaussian(d, 1, s + 7).array().abs() + 0.5).matrix(),
              (bd_test::gaussian(d, 1, s + 8).array().abs() + 0.5).matrix()};
      if (biases) w.bq = bd_test::gaussian(heads * head_dim, 1, s + 9) / 4, w.bk = bd_test::gaussian(kv_heads * head_dim, 1, s + 10) / 4,
                  w.bv = bd_test::gaussian(kv_heads * head_dim, 1, s + 11) / 4;
      weights.push_back(w);
    }
  }

  fs::path write(const std::string& name) const {
    const fs::path dir = fresh_dir(name);
    std::ofstream(dir / "config.json") << config.dump();
    bd::io::Writer w;
    w.add<double>("model.embed_tokens.weight", embed);
    w.add<double>("lm_head.weight", head);
    w.add_vector<double>("model.norm.weight", final_norm);
    for (Index l = 0; l < layers; ++l) {
      const Layer& x = weights[std::size_t(l)];
      const std::string p = "model.layers." + std::to_string(l) + ".";
      w.add<double>(p + "self_attn.q_proj.weight", x.q);
      w.add<double>(p + "self_attn.k_proj.weight", x.k);
      w.add<double>(p + "self_attn.v_proj.weight", x.v);
      w.add<double>(p + "self_attn.o_proj.weight", x.o);
      if (biases) {
        w.add_vector<double>(p + "self_attn.q_proj.bias", x.bq);
        w.add_vector<double>(p + "self_attn.k_proj.bias", x.bk);
        w.add_vector<double>(p + "self_attn.v_proj.bias", x.bv);
      }
      w.add<double>(p + "mlp.gate_proj.weight", x.gate);
      w.add<double>(p + "mlp.up_proj.weight", x.up);
      w.add<double>(p + "mlp.down_proj.weight", x.down);
      w.add_vector<double>(p + "input_layernorm.weight", x.attn_norm);
      w.add_vector<double>(p + "post_attention_layernorm.weight", x.mlp_norm);
    }
    w.write((dir / "model.safetensors").string());
    return dir;
  }

  /// inv_freq and attention_scaling for a forward over `seq_len` positions, by rope_type.
  std::pair<VectorXd, double> rope(Index seq_len) const {
    const nlohmann::json& r = config["rope_scaling"];
    if (r.is_null()) return {plain_inv_freq(head_dim, theta), 1.0};
    const std::string type = r.value("rope_type", r.value("type", std::string("default")));
    const double factor = r.value("factor", 1.0), max_pos = config["max_position_embeddings"];
    if (type == "linear") return {plain_inv_freq(head_dim, theta) / factor, 1.0};
    if (type == "dynamic") {
      const double n = std::max(double(seq_len), max_pos);
      const double base = theta * std::pow(factor * n / max_pos - (factor - 1), double(head_dim) / double(head_dim - 2));
      return {plain_inv_freq(head_dim, base), 1.0};
    }
    if (type == "llama3")
      return {llama3_inv_freq(head_dim, theta, factor, r["low_freq_factor"], r["high_freq_factor"], r["original_max_position_embeddings"]),
              1.0};
    // yarn, as the current _compute_yarn_parameters reads it.
    const double original = r.value("original_max_position_embeddings", max_pos);
    const double attention = r.contains("attention_factor") ? double(r["attention_factor"]) : yarn_get_mscale(factor, 1.0);
    return {yarn_inv_freq(head_dim, theta, factor, original, r.value("beta_fast", 32.0), r.value("beta_slow", 1.0)), attention};
  }

  /// One layer's attention over the whole sequence (positions 0 …).
  MatrixXd attention(const Layer& w, const MatrixXd& x) const {
    const Index L = x.rows(), group = heads / kv_heads;
    auto lin = [](const MatrixXd& in, const MatrixXd& W, const VectorXd& b) {
      MatrixXd y = in * W.transpose();
      if (b.size()) y.rowwise() += b.transpose();
      return y;
    };
    const MatrixXd Q = lin(x, w.q, w.bq), K = lin(x, w.k, w.bk), V = lin(x, w.v, w.bv);
    const auto [inv_freq, scaling] = rope(L);
    const auto [c, s] = cos_sin(inv_freq, 0, L, scaling);
    MatrixXd out(L, heads * head_dim);
    for (Index h = 0; h < heads; ++h) {
      const Index g = h / group;
      const MatrixXd q = rotary(Q.middleCols(h * head_dim, head_dim), c, s, false);
      const MatrixXd k = rotary(K.middleCols(g * head_dim, head_dim), c, s, false);
      out.middleCols(h * head_dim, head_dim) =
          causal_softmax(q * k.transpose() / std::sqrt(double(head_dim)), 0) * V.middleCols(g * head_dim, head_dim);
    }
    return out * w.o.transpose();
  }

  MatrixXd logits(const std::vector<int>& tokens) const {
    MatrixXd h(Index(tokens.size()), d);
    for (std::size_t i = 0; i < tokens.size(); ++i) h.row(Index(i)) = embed.row(tokens[i]);
    for (const Layer& w : weights) {
      h += attention(w, rms(h, w.attn_norm, eps));
      const MatrixXd x = rms(h, w.mlp_norm, eps);
      const MatrixXd g = x * w.gate.transpose(), u = x * w.up.transpose();
      h += (g.array() / (1 + (-g.array()).exp()) * u.array()).matrix() * w.down.transpose();
    }
    return rms(h, final_norm, eps) * head.transpose();
  }
};

std::vector<int> some_tokens(Index n, Index vocab) {
  std::vector<int> t;
  for (Index i = 0; i < n; ++i) t.push_back(int((5 * i * i + 2 * i + 3) % vocab));
  return t;
}

}  // namespace

// ---- the tables ---------------------------------------------------------------------------

TEST_CASE("RoPE tables equal the published formulas for every scheme, at large positions too", "[io][rope]") {
  struct Case {
    const char* name;
    RopeScaling s;
    Index dim, seq_len;
    double base;
    VectorXd expected;
  };
  RopeScaling linear, dynamic, llama3, yarn;
  linear.type = RopeType::Linear, linear.factor = 4;
  dynamic.type = RopeType::Dynamic, dynamic.factor = 2, dynamic.original_context = 2048;
  llama3.type = RopeType::Llama3, llama3.factor = 8, llama3.low_freq_factor = 1, llama3.high_freq_factor = 4;
  llama3.original_context = 8192;
  yarn.type = RopeType::Yarn, yarn.factor = 40, yarn.original_context = 4096;  // DeepSeek-V2-Lite's
  const double dyn_base = 10000 * std::pow(2.0 * 5000 / 2048 - 1, 128.0 / 126.0);
  const std::vector<Case> cases = {
      {"default", RopeScaling{}, 128, 100, 10000, plain_inv_freq(128, 10000)},
      {"linear", linear, 128, 100, 10000, plain_inv_freq(128, 10000) / 4},
      {"dynamic inside the context", dynamic, 128, 2048, 10000, plain_inv_freq(128, 10000)},
      {"dynamic past the context", dynamic, 128, 5000, 10000, plain_inv_freq(128, dyn_base)},
      {"llama3 (Llama 3.1)", llama3, 128, 100, 500000, llama3_inv_freq(128, 500000, 8, 1, 4, 8192)},
      {"yarn (DeepSeek-V2-Lite)", yarn, 64, 100, 10000, yarn_inv_freq(64, 10000, 40, 4096, 32, 1)},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const std::vector<double> got = bd::nn::rope_frequencies(c.s, c.dim, c.base, c.seq_len);
    REQUIRE(Index(got.size()) == c.dim / 2);
    for (Index i = 0; i < c.dim / 2; ++i) CHECK(got[std::size_t(i)] == Approx(c.expected(i)).epsilon(1e-14));
  }
  // The schemes change what they must: llama3 keeps the fastest frequencies and divides the
  // slowest by 8; YaRN interpolates the slowest, extrapolates the fastest.
  const auto l3 = bd::nn::rope_frequencies(llama3, 128, 500000, 1);
  CHECK(l3.front() == 1.0);
  CHECK(l3.back() == Approx(plain_inv_freq(128, 500000)(63) / 8).epsilon(1e-15));
  // Rotation at large positions: bd's apply_rope against x·cos + rotate_half(x)·sin.
  yarn.attention_factor = 0.9;
  for (Index first : {Index(0), Index(4095), Index(131000)}) {
    INFO("first position " << first);
    const MatrixXd x = bd_test::gaussian(5, 2 * 64, 3);  // two heads of 64
    MatrixXd got = x;
    bd::nn::apply_rope(got, 2, 64, 10000, yarn, first);
    const auto [c, s] = cos_sin(yarn_inv_freq(64, 10000, 40, 4096, 32, 1), first, 5, 0.9);
    for (Index h = 0; h < 2; ++h)
      CHECK(bd_test::max_rel(got.middleCols(h * 64, 64), rotary(x.middleCols(h * 64, 64), c, s, false)) < 1e-13);
  }
}

// ---- DeepSeek ------------------------------------------------------------------------------

TEST_CASE("DeepSeek-V2-Lite and V3 layers (interleaved RoPE, YaRN, query LoRA) equal DeepSeek's own forward",
          "[io][deepseek][rope][mla]") {
  struct Variant {
    const char* name;
    Index q_lora;
    nlohmann::json scaling;
  };
  for (const Variant& v : {Variant{"V2-Lite", 0, kV2LiteYarn}, Variant{"V3", 16, kV3Yarn}, Variant{"no rope_scaling", 0, nullptr}}) {
    INFO(v.name);
    const DeepSeekLayer layer(v.q_lora, v.scaling, 40);
    const fs::path dir = layer.write("bd_deepseek_fidelity");
    const Index context = 300, L = 305;  // decoding starts at position 300
    const MatrixXd x = bd_test::gaussian(L, layer.d, 41);
    const MatrixXd reference = layer.forward(x, 0);
    const auto dense = bd::io::load_attention<double>(dir.string(), bd::io::Arch::DeepSeekV2);
    REQUIRE(dense.size() == 1);
    const auto bd_layer = bd::nn::BDAttention<double>::prepare(dense[0], bd::nn::BDAttentionOptions{}.with_basis(bd::Basis::Pivoted));
    CHECK(bd_test::max_rel(dense[0].forward(x), reference) < 1e-12);
    CHECK(bd_test::max_rel(bd_layer.forward(x), reference) < 1e-12);
    const MatrixXd tail = reference.bottomRows(L - context);
    for (const auto path : {bd::nn::PrefillPath::Recompute, bd::nn::PrefillPath::Absorbed}) {
      bd::nn::LatentCache<double> cache, bd_cache;
      dense[0].prefill(x.topRows(context), cache, path);
      bd_layer.prefill(x.topRows(context), bd_cache, path);
      CHECK(bd_test::max_rel(dense[0].prefill(x.bottomRows(L - context), cache, path), tail) < 1e-12);
      CHECK(bd_test::max_rel(bd_layer.prefill(x.bottomRows(L - context), bd_cache, path), tail) < 1e-12);
    }
    bd::nn::LatentCache<double> cache;
    dense[0].prefill(x.topRows(context), cache);
    MatrixXd decoded(L - context, layer.d);
    for (Index t = context; t < L; ++t) decoded.row(t - context) = bd_layer.decode_absorbed(x.row(t), cache);
    CHECK(bd_test::max_rel(decoded, tail) < 1e-12);
    fs::remove_all(dir);
  }
}

TEST_CASE("a converted DeepSeek checkpoint keeps the RoPE layout and reads back as DeepSeek's own layer", "[io][deepseek][rope][convert]") {
  const DeepSeekLayer layer(16, kV2LiteYarn, 50);
  const fs::path in = layer.write("bd_deepseek_fidelity_in"), out = fs::temp_directory_path() / "bd_deepseek_fidelity_out";
  fs::remove_all(out);
  auto o = bd_test_convert::options(bd::nn::Mode::QKVO);
  o.arch = bd::io::Arch::DeepSeekV2;
  bd::io::convert_checkpoint(in.string(), out.string(), o);
  // The RoPE rows an engine rotates the DeepSeek way pass through as the checkpoint stored them.
  const auto st = bd::io::SafeTensors::open((out / "model.safetensors").string());
  const MatrixXd kept = st.matrix<double>("model.layers.0.self_attn.q_b_rope_proj.weight");
  for (Index h = 0; h < layer.n; ++h)
    CHECK(kept.middleRows(h * layer.rope, layer.rope) == layer.q_b.middleRows(h * (layer.nope + layer.rope) + layer.nope, layer.rope));
  CHECK(nlohmann::json::parse(std::ifstream(out / "config.json"))["rope_scaling"] == kV2LiteYarn);
  const MatrixXd x = bd_test::gaussian(9, layer.d, 51);
  const auto converted = bd::io::load_bd_attention<float>(out.string());  // BD stored in f32
  CHECK(bd_test::max_rel(converted[0].forward(x.cast<float>()), layer.forward(x, 0)) <= bd_test::kFp32OperatorBound);
  fs::remove_all(in);
  fs::remove_all(out);
}

// ---- LLaMA family --------------------------------------------------------------------------

TEST_CASE("LLaMA-family checkpoints with each rope_scaling type equal Hugging Face's forward", "[io][llama][rope]") {
  const nlohmann::json llama31 = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                                  {"original_max_position_embeddings", 16}};
  struct Variant {
    const char* name;
    nlohmann::json scaling;
    bool qwen;
  };
  for (const Variant& v : {Variant{"none", nullptr, false}, Variant{"llama3 (Llama 3.1)", llama31, false},
                           Variant{"linear", {{"type", "linear"}, {"factor", 4.0}}, false},
                           Variant{"dynamic", {{"rope_type", "dynamic"}, {"factor", 2.0}}, false},
                           Variant{"yarn (Qwen2)", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}}, true}}) {
    INFO(v.name);
    const LlamaFolder folder(v.scaling, v.qwen, 60);
    const fs::path dir = folder.write("bd_llama_fidelity");
    const std::vector<int> tokens = some_tokens(v.name == std::string("dynamic") ? 90 : 40, folder.vocab);  // dynamic: past 64
    const MatrixXd reference = folder.logits(tokens);
    const auto model = bd::io::load_llama<double>(dir.string());
    CHECK(bd_test::max_rel(model.logits(tokens), reference) < 1e-12);
    const auto single = bd::io::load_llama<float>(dir.string());
    CHECK(bd_test::max_rel(single.logits(tokens), reference) <= bd_test::kFp32OperatorBound);
    if (v.name != std::string("dynamic")) {  // dynamic's tables follow each call's length, as Hugging Face's do
      decltype(model)::Cache cache;
      MatrixXd decoded(Index(tokens.size()), folder.vocab);
      decoded.topRows(30) = model.decode(std::vector<int>(tokens.begin(), tokens.begin() + 30), cache);
      for (std::size_t t = 30; t < tokens.size(); ++t) decoded.row(Index(t)) = model.decode({tokens[t]}, cache);
      CHECK(bd_test::max_rel(decoded, reference) < 1e-12);
    }
    fs::remove_all(dir);
  }
}

// ---- refusals -------------------------------------------------------------------------------

TEST_CASE("config features bd does not implement are refused by key, and nothing is written", "[io][bad-input][rope]") {
  struct Refused {
    const char* key;
    nlohmann::json value;
    const char* message;
  };
  const std::vector<Refused> cases = {
      {"rope_scaling", {{"rope_type", "longrope"}, {"factor", 2.0}}, "rope_scaling.rope_type = \"longrope\""},
      {"partial_rotary_factor", 0.5, "partial_rotary_factor = 0.5"},
      {"attn_logit_softcapping", 50.0, "attn_logit_softcapping = 50.0"},
      {"final_logit_softcapping", 30.0, "final_logit_softcapping = 30.0"},
      {"use_qk_norm", true, "use_qk_norm = true"},
      {"mlp_bias", true, "mlp_bias = true"},
      {"hidden_act", "gelu", "hidden_act = \"gelu\""},
      {"model_type", "gemma2", "model_type = \"gemma2\""},
  };
  for (const Refused& r : cases) {
    INFO(r.key);
    LlamaFolder folder(nullptr, false, 70);
    folder.config[r.key] = r.value;
    const fs::path dir = folder.write("bd_llama_refused"), out = fs::temp_directory_path() / "bd_llama_refused_out";
    fs::remove_all(out);
    BD_CHECK_THROWS_CONTAINING(bd::io::load_llama<double>(dir.string()), bd::RefusedError,
                               Contains(r.message) && Contains("not implemented by bd"));
    auto o = bd_test_convert::options(bd::nn::Mode::VO);
    o.arch = bd::io::Arch::LLaMA;
    o.force = true;
    BD_CHECK_THROWS_CONTAINING(bd::io::convert_checkpoint(dir.string(), out.string(), o), bd::RefusedError,
                               Contains("not implemented by bd"));
    CHECK_FALSE(fs::exists(out));
    fs::remove_all(dir);
  }
  // A q/k norm found by its tensors, and DeepSeek with a scheme its code does not have.
  {
    LlamaFolder folder(nullptr, false, 71);
    const fs::path dir = folder.write("bd_llama_qk_norm");
    const auto st = bd::io::SafeTensors::open((dir / "model.safetensors").string());
    bd::io::Writer w;
    for (const auto& t : st.tensors()) {
      const unsigned char* b = st.bytes(t.name);
      w.add_bytes(t.name, t.dtype, t.shape, std::vector<unsigned char>(b, b + (t.end - t.begin)));
    }
    w.add_vector<double>("model.layers.0.self_attn.q_norm.weight", VectorXd::Ones(8));
    w.write((dir / "model.safetensors").string());
    BD_CHECK_THROWS_CONTAINING(bd::io::load_llama<double>(dir.string()), bd::RefusedError,
                               Contains("q_norm.weight is a q/k norm"));
    fs::remove_all(dir);
  }
  {
    const DeepSeekLayer layer(0, {{"type", "llama3"}, {"factor", 8.0}}, 72);
    const fs::path dir = layer.write("bd_deepseek_refused");
    BD_CHECK_THROWS_CONTAINING(bd::io::load_attention<double>(dir.string(), bd::io::Arch::DeepSeekV2), bd::RefusedError,
                               Contains("rope_scaling.type = \"llama3\"") && Contains("not implemented by bd"));
    fs::remove_all(dir);
  }
}

TEST_CASE("a sliding window is refused where the sequence outgrows it, and computed exactly within it", "[io][llama][bad-input]") {
  LlamaFolder folder(nullptr, false, 80);
  folder.config["model_type"] = "mistral";
  folder.config["sliding_window"] = 16;
  const fs::path dir = folder.write("bd_mistral_window");
  const auto model = bd::io::load_llama<double>(dir.string());
  const std::vector<int> tokens = some_tokens(17, folder.vocab);
  const std::vector<int> fits(tokens.begin(), tokens.begin() + 16);
  CHECK(bd_test::max_rel(model.logits(fits), folder.logits(fits)) < 1e-12);
  BD_CHECK_THROWS_CONTAINING(model.logits(tokens), bd::RefusedError,
                             Contains("sliding_window = 16: this call reaches 17 tokens"));
  decltype(model)::Cache cache;
  model.decode(fits, cache);
  BD_CHECK_THROWS_CONTAINING(model.decode({tokens[16]}, cache), bd::RefusedError,
                             Contains("bd's attention does not mask keys outside a sliding window"));
  folder.config["model_type"] = "qwen2";  // Qwen2's window only with use_sliding_window
  const fs::path qwen = folder.write("bd_qwen_no_window");
  CHECK(bd_test::max_rel(bd::io::load_llama<double>(qwen.string()).logits(tokens), folder.logits(tokens)) < 1e-12);
  fs::remove_all(dir);
  fs::remove_all(qwen);
}
