// Evaluates BD attention on a real Hugging Face LLaMA checkpoint: the paper's perplexity table.
//
//   eval_llama MODEL_DIR [--mode vo|qk|qkvo] [--dtype f64|f32|f16|bf16] [--compute f32|bf16]
//              [--basis first|last|residual-min|offset-search|pivoted|auto] [--windows per-group|per-head]
//              [--force] [--table]
//              [--max-logit-error E]
//
// Runs the dense model in fp32 (L_exact), the dense model and the BD model with every weight
// stored in the chosen type and computing in the chosen arithmetic (bf16: every projection's
// operands rounded once to bfloat16; f16 storage refuses it), and prints a table and, as its
// last line, one JSON object. BD is
// evaluated even where the cost model advises against it; the verdict is printed. --table
// runs every dtype × basis for the mode and prints a markdown table instead.
//
// MODEL_DIR may also be a checkpoint bd-convert wrote (--arch llama): its BD model is loaded as
// stored and evaluated against the reference logits, when the folder has reference.safetensors.
// --max-logit-error E makes it a check: exit 1 when the BD model's logit error exceeds E, or when
// there is no reference to measure it against.
#include <bd/io/bd_checkpoint.hpp>
#include <bd/io/llama.hpp>
#include <bd/nn/metrics.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using bd::nn::BDAttentionOptions;

struct Args {
  std::string dir, basis = "auto", windows = "per-group";
  bd::Storage storage = bd::Storage::F32;
  bd::kernel::Compute compute = bd::kernel::Compute::F32;
  bd::nn::Mode mode = bd::nn::Mode::VO;
  bool force = false, table = false;
  double max_logit_error = -1;  ///< < 0: report only
};

struct Result {
  double dense_ppl = 0, bd_ppl = 0, dense_err = 0, bd_err = 0, bd_nmse = 0;
  std::vector<std::string> warnings;
  std::string basis_note;
};

struct Reference {
  std::vector<int> tokens;
  Eigen::MatrixXf logits;
  bool present = false;
};

template <typename S>
Result evaluate(const bd::nn::LlamaModel<float>& model, const std::vector<int>& tokens, const Eigen::MatrixXf& exact,
                const BDAttentionOptions& opts, bd::kernel::Compute compute) {
  Result r;
  auto dense = model.cast<S>();
  dense.set_compute(compute);
  const Eigen::MatrixXf dense_logits = dense.logits(tokens).template cast<float>();
  r.dense_ppl = bd::nn::perplexity(dense_logits, tokens);
  r.dense_err = bd::nn::logit_relative_error(dense_logits, exact);
  auto bd_model = model.with_bd_attention<S>(opts);
  bd_model.set_compute(compute);
  const Eigen::MatrixXf bd_logits = bd_model.logits(tokens).template cast<float>();
  r.bd_ppl = bd::nn::perplexity(bd_logits, tokens);
  r.bd_err = bd::nn::logit_relative_error(bd_logits, exact);
  const auto& first = bd_model.layers.front().attention;
  r.warnings = first.warnings();
  double nmse = 0;
  int products = 0;
  for (const auto& layer : bd_model.layers) {
    for (const auto* report : {&layer.attention.qk_report(), &layer.attention.vo_report()}) {
      if (!report->decomposed) continue;
      nmse += report->mean_nmse;
      ++products;
      if (r.basis_note.empty()) r.basis_note = report->reason;
    }
  }
  r.bd_nmse = products ? nmse / products : 0;
  return r;
}

Result run(const Args& a, const bd::nn::LlamaModel<float>& model, const std::vector<int>& tokens,
           const Eigen::MatrixXf& exact) {
  BDAttentionOptions opts;
  opts.mode = a.mode;
  opts.force = a.force;
  opts.cost_policy = bd::nn::CostPolicy::Warn;
  opts.decomposition.basis = bd::parse_basis(a.basis);
  opts.windows = bd::nn::parse_windows(a.windows);
  opts.decomposition.align = model.config.head_dim;
  return bd::dispatch(a.storage,
                      [&](auto t) { return evaluate<typename decltype(t)::type>(model, tokens, exact, opts, a.compute); });
}

std::vector<int> reference_tokens(const std::string& dir, Reference& ref, Eigen::Index vocab) {
  std::vector<int> tokens;
  if (std::filesystem::exists(dir + "/reference.safetensors")) {
    const auto st = bd::io::SafeTensors::open(dir + "/reference.safetensors");
    ref.tokens = st.values<int>("tokens");
    ref.logits = st.matrix<float>("logits");
    ref.present = true;
    tokens = ref.tokens;
  } else {
    for (int i = 0; i < 64; ++i) tokens.push_back(static_cast<int>((i * 7919) % vocab));
  }
  return tokens;
}

/// A BD checkpoint as bd-convert stored it: perplexity, and the logits against the reference.
template <typename S>
int evaluate_converted(const std::string& dir, double max_logit_error, bd::kernel::Compute compute) {
  auto model = bd::io::load_bd_llama<S>(dir);
  model.set_compute(compute);
  Reference ref;
  const std::vector<int> tokens = reference_tokens(dir, ref, model.config.vocab);
  const Eigen::MatrixXf logits = model.logits(tokens).template cast<float>();
  const auto& c = model.config;
  std::printf("%s: BD checkpoint (%s), %ld layers, d = %ld, %ld query heads on %ld key/value heads, d_h = %ld\n", dir.c_str(),
              bd::nn::to_string(model.layers.front().attention.mode()), long(c.layers), long(c.hidden), long(c.heads),
              long(c.kv_heads), long(c.head_dim));
  const double ppl = bd::nn::perplexity(logits, tokens);
  const double err = ref.present ? bd::nn::logit_relative_error(logits, ref.logits) : -1.0;
  std::printf("%-30s %12s %18s\n%-30s %12.6f %18s\n", "model", "perplexity", "logit rel. error", "BD, as stored", ppl,
              ref.present ? std::to_string(err).c_str() : "(no reference)");
  nlohmann::ordered_json out;
  out["bd_checkpoint"] = true;
  out["bd_ppl"] = ppl;
  out["bd_logit_rel_err"] = ref.present ? nlohmann::json(err) : nlohmann::json(nullptr);
  std::printf("%s\n", out.dump().c_str());
  if (max_logit_error < 0) return 0;
  if (!ref.present) {
    std::fprintf(stderr, "error: --max-logit-error %g asked, but %s has no reference.safetensors to measure against\n",
                 max_logit_error, dir.c_str());
    return 1;
  }
  if (!(err <= max_logit_error)) {
    std::fprintf(stderr, "error: the BD checkpoint's logit error %g exceeds --max-logit-error %g\n", err, max_logit_error);
    return 1;
  }
  return 0;
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s MODEL_DIR [--mode vo|qk|qkvo] [--dtype f64|f32|f16|bf16] [--compute f32|bf16]\n"
               "       [--basis first|last|residual-min|offset-search|pivoted|auto] [--windows per-group|per-head]\n"
               "       [--force] [--table]\n"
               "       [--max-logit-error E]   (a converted checkpoint: exit 1 above E)\n",
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
      if (arg == "--mode" && value) a.mode = bd::nn::parse_mode(argv[++i]);
      else if (arg == "--dtype" && value) a.storage = bd::parse_storage(argv[++i]);
      else if (arg == "--compute" && value) a.compute = bd::kernel::parse_compute(argv[++i]);
      else if (arg == "--basis" && value) a.basis = argv[++i];
      else if (arg == "--windows" && value) a.windows = argv[++i];
      else if (arg == "--force") a.force = true;
      else if (arg == "--table") a.table = true;
      else if (arg == "--max-logit-error" && value) a.max_logit_error = std::stod(argv[++i]);
      else if (!arg.empty() && arg[0] != '-' && a.dir.empty()) a.dir = arg;
      else return usage(argv[0]);
    }
    if (a.dir.empty()) return usage(argv[0]);
    bd::parse_basis(a.basis);
    bd::nn::parse_windows(a.windows);
  } catch (const bd::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception&) {  // --max-logit-error not a number
    return usage(argv[0]);
  }

  try {
    if (bd::io::is_bd_checkpoint(a.dir)) {
      const bd::Storage stored = bd::io::recorded_options(bd::io::ModelFolder::open(a.dir)).storage;
      return bd::dispatch(stored, [&](auto t) {
        return evaluate_converted<typename decltype(t)::type>(a.dir, a.max_logit_error, a.compute);
      });
    }
    const auto model = bd::io::load_llama<float>(a.dir);
    Reference ref;
    const std::vector<int> tokens = reference_tokens(a.dir, ref, model.config.vocab);
    const Eigen::MatrixXf exact = model.logits(tokens);
    const double reference_diff = ref.present ? double((exact - ref.logits).cwiseAbs().maxCoeff()) : -1.0;
    const auto& c = model.config;
    std::printf("%s: %ld layers, d = %ld, %ld query heads on %ld key/value heads, d_h = %ld, RoPE theta %g\n",
                a.dir.c_str(), long(c.layers), long(c.hidden), long(c.heads), long(c.kv_heads), long(c.head_dim),
                c.rope_theta);
    if (ref.present) std::printf("dense fp32 against reference.safetensors: max |diff| = %.3g\n", reference_diff);

    if (a.table) {
      std::printf("\n| dtype | basis | dense ppl | BD ppl | ppl change | dense logit err | BD logit err | ratio |\n"
                  "|---|---|---|---|---|---|---|---|\n");
      for (const bd::Storage storage : {bd::Storage::F32, bd::Storage::F16, bd::Storage::BF16}) {
        for (const char* basis : {"first", "residual-min", "offset-search", "pivoted", "auto"}) {
          Args row = a;
          row.storage = storage;
          row.basis = basis;
          const Result r = run(row, model, tokens, exact);
          std::printf("| %s | %s | %.6f | %.6f | %+.2e | %.3g | %.3g | %s |\n", bd::to_string(storage), basis, r.dense_ppl, r.bd_ppl,
                      (r.bd_ppl - r.dense_ppl) / r.dense_ppl, r.dense_err, r.bd_err,
                      r.dense_err > 0 ? (std::to_string(r.bd_err / r.dense_err).substr(0, 4) + "x").c_str() : "-");
        }
      }
      return 0;
    }

    const Result r = run(a, model, tokens, exact);
    for (const auto& w : r.warnings) std::printf("cost model: BD is not worthwhile here: %s\n", w.c_str());
    if (r.warnings.empty()) std::printf("cost model: BD %s saves work and cache here\n", bd::nn::to_string(a.mode));
    std::printf("basis: %s\n\n", r.basis_note.c_str());
    std::printf("%-30s %12s %18s\n", "model", "perplexity", "logit rel. error");
    std::printf("%-30s %12.6f %18s\n", "dense fp32 (L_exact)", bd::nn::perplexity(exact, tokens), "0");
    const std::string in_type = std::string(bd::to_string(a.storage)) +
                                (a.compute == bd::kernel::Compute::BF16 ? ", bf16 compute" : "");
    std::printf("%-30s %12.6f %18.3g\n", ("dense " + in_type).c_str(), r.dense_ppl, r.dense_err);
    std::printf("%-30s %12.6f %18.3g   (mean product NMSE %.3g)\n",
                ("BD " + std::string(bd::nn::to_string(a.mode)) + " " + in_type + " " + a.basis).c_str(), r.bd_ppl, r.bd_err,
                r.bd_nmse);
    nlohmann::ordered_json out;
    out["reference_max_abs_diff"] = ref.present ? nlohmann::json(reference_diff) : nlohmann::json(nullptr);
    out["dense_ppl"] = r.dense_ppl;
    out["bd_ppl"] = r.bd_ppl;
    out["dense_logit_rel_err"] = r.dense_err;
    out["bd_logit_rel_err"] = r.bd_err;
    out["compute"] = bd::kernel::to_string(a.compute);
    std::printf("%s\n", out.dump().c_str());
  } catch (const bd::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
