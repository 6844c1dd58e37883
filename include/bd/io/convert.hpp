// bd/io/convert.hpp — converts a checkpoint's attention layers to BD form (bd-convert's core).
//
// Output format, version "1" (x·W orientation, [in, out]; n_q query heads, d_h head size):
//   P.bd_qk.basis    [d_q_in, n_q·d_h]          replaces the query projection
//   P.bd_qk.coeff    [d_k_in − d_h, n_q·d_h]    replaces the key projection
//   P.bd_qk.indices  I32 [n_q, d_h]             key-input channels of each head's basis, ascending
//   P.bd_qk.bias     [n_q·d_h]                  when the model has a query bias (β = bq·Wk[S]ᵀ)
//   P.bd_vo.coeff    [d_v_in − d_h, n_q·d_h]    replaces the value projection
//   P.bd_vo.basis    [n_q·d_h, d_out]           replaces the output projection
//   P.bd_vo.indices  I32 [n_q, d_h]
//   P.bd_vo.bias     [d_out]                    when the model has an output or value bias
//   K'_h = X[:, indices[h]] + X[:, other channels, ascending]·coeff[:, h·d_h:(h+1)·d_h]  (V' alike)
//   Q' = X·bd_qk.basis + bd_qk.bias;  y = [O'_1 … O'_n]·bd_vo.basis + bd_vo.bias;  softmax scale unchanged.
// Tensors these replace are removed; every other tensor is copied unchanged.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bd/core/scalar.hpp"
#include "bd/io/checkpoint.hpp"
#include "bd/io/safetensors.hpp"
#include "bd/nn/bd_attention.hpp"

namespace bd::io {

struct ConvertOptions {
  Arch arch = Arch::LLaMA;
  nn::Mode mode = nn::Mode::VO;
  std::string dtype = "f32";  ///< f32, f16 or bf16: the type of the written BD tensors
  bd::Options decomposition{};
  bool force = false;  ///< accept QK under RoPE and modes the cost model advises against
};

struct ProductSummary {
  bool converted = false;
  std::string window;  ///< "rows 56..63" for a shared window, "per-head pivoted" otherwise
  double nmse = 0;     ///< mean over heads
  bd::PhaseTimes phases;  ///< preparation's time per phase
};

struct LayerReport {
  std::string prefix;
  ProductSummary qk, vo;
  std::int64_t params_before = 0, params_after = 0;
  double seconds = 0;
  std::vector<std::string> warnings;
};

struct ConvertReport {
  ConvertOptions options;
  std::vector<LayerReport> layers;
  std::int64_t tensors_in = 0, tensors_out = 0;

  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j;
    j["arch"] = to_string(options.arch);
    j["mode"] = nn::to_string(options.mode);
    j["dtype"] = options.dtype;
    j["basis"] = bd::to_string(options.decomposition.basis);
    j["align"] = options.decomposition.align;
    j["force"] = options.force;
    j["tensors_in"] = tensors_in;
    j["tensors_out"] = tensors_out;
    std::int64_t before = 0, after = 0;
    auto& layers_json = j["layers"] = nlohmann::ordered_json::array();
    for (const auto& l : layers) {
      nlohmann::ordered_json x;
      x["prefix"] = l.prefix;
      for (const auto& [key, p] : {std::pair<const char*, const ProductSummary&>{"qk", l.qk}, {"vo", l.vo}})
        if (p.converted)
          x[key] = {{"window", p.window},
                    {"nmse", p.nmse},
                    {"phases_s",
                     {{"factor", p.phases.factor},
                      {"score", p.phases.score},
                      {"fit", p.phases.fit},
                      {"round", p.phases.round},
                      {"error", p.phases.error}}}};
      x["params_before"] = l.params_before;
      x["params_after"] = l.params_after;
      x["seconds"] = l.seconds;
      x["warnings"] = l.warnings;
      layers_json.push_back(x);
      before += l.params_before;
      after += l.params_after;
    }
    j["params_before"] = before;
    j["params_after"] = after;
    return j;
  }
};

namespace detail {

template <typename S>
std::vector<unsigned char> raw(const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& m) {
  const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rm = m;
  std::vector<unsigned char> out(static_cast<std::size_t>(rm.size()) * sizeof(S));
  if (rm.size()) std::memcpy(out.data(), rm.data(), out.size());
  return out;
}

/// Bytes of the given rows (axis 0) or columns (axis 1) of a stored tensor, same dtype.
inline void add_kept_part(Writer& w, const SafeTensors& st, const KeptPart& k) {
  const TensorInfo& t = st.info(k.source);
  const std::size_t size = dtype_size(t.dtype);
  const auto [rows, cols] = t.matrix_shape();
  const unsigned char* src = st.bytes(k.source);
  std::vector<unsigned char> out;
  std::vector<std::int64_t> shape;
  const auto n = static_cast<std::int64_t>(k.indices.size());
  if (k.axis == 0) {
    for (Eigen::Index r : k.indices)
      out.insert(out.end(), src + static_cast<std::size_t>(r * cols) * size, src + static_cast<std::size_t>((r + 1) * cols) * size);
    shape = t.shape.size() == 1 ? std::vector<std::int64_t>{n} : std::vector<std::int64_t>{n, cols};
  } else {
    for (Eigen::Index r = 0; r < rows; ++r)
      for (Eigen::Index c : k.indices)
        out.insert(out.end(), src + static_cast<std::size_t>(r * cols + c) * size, src + static_cast<std::size_t>(r * cols + c + 1) * size);
    shape = {rows, n};
  }
  w.add_bytes(k.name, t.dtype, shape, std::move(out));
}

inline std::string window_of(const nn::HeadIndices& idx) {
  if (idx.shared) return message("rows ", idx.offset, "..", idx.offset + idx.head_dim - 1);
  return "per-head pivoted";
}

inline std::vector<std::int32_t> indices_i32(const nn::HeadIndices& idx) {
  std::vector<std::int32_t> out;
  for (const auto& head : idx.basis)
    for (Eigen::Index i : head) out.push_back(static_cast<std::int32_t>(i));
  return out;
}

template <typename S>
LayerReport convert_layer(const AttentionLayout& layout, const ConvertOptions& opts, Writer& out) {
  const auto start = std::chrono::steady_clock::now();
  LayerReport report;
  report.prefix = layout.prefix;
  const nn::MultiHeadAttention<double> dense(layout.config, layout.weights);
  nn::BDAttentionOptions bo;
  bo.mode = opts.mode;
  bo.decomposition = opts.decomposition;
  bo.force = opts.force;
  bo.cost_policy = opts.force ? nn::CostPolicy::Warn : nn::CostPolicy::Refuse;
  nn::BDAttention<S> bda;
  try {
    bda = nn::BDAttention<S>::prepare(dense, bo);
  } catch (const Error& e) {
    throw RefusedError(message(layout.prefix, ": ", e.what()));
  }
  report.warnings = bda.warnings();
  const std::string& P = layout.prefix;
  const auto n_q = static_cast<std::int64_t>(layout.config.n_q);
  auto add = [&](const std::string& name, const auto& m) {
    out.add_bytes(name, dtype_of<S>(), {static_cast<std::int64_t>(m.rows()), static_cast<std::int64_t>(m.cols())}, raw<S>(m));
    report.params_after += static_cast<std::int64_t>(m.size());
  };
  auto add_vector = [&](const std::string& name, const auto& v) {
    out.add_bytes(name, dtype_of<S>(), {static_cast<std::int64_t>(v.size())}, raw<S>(typename nn::BDAttention<S>::Stored(v)));
  };
  if (nn::has_qk(opts.mode)) {
    add(P + ".bd_qk.basis", bda.qk_basis());
    add(P + ".bd_qk.coeff", bda.qk_coeff());
    const auto idx = indices_i32(bda.qk_indices());
    out.add_flat<std::int32_t>(P + ".bd_qk.indices", {n_q, static_cast<std::int64_t>(layout.config.head_dim)}, idx.data(), idx.size());
    if (bda.qk_bias().size()) add_vector(P + ".bd_qk.bias", bda.qk_bias());
    report.qk = {true, window_of(bda.qk_indices()), bda.qk_report().mean_nmse, bda.qk_report().phases};
  }
  if (nn::has_vo(opts.mode)) {
    add(P + ".bd_vo.coeff", bda.vo_coeff());
    add(P + ".bd_vo.basis", bda.vo_basis());
    const auto idx = indices_i32(bda.vo_indices());
    out.add_flat<std::int32_t>(P + ".bd_vo.indices", {n_q, static_cast<std::int64_t>(layout.config.value_dim())}, idx.data(), idx.size());
    if (bda.vo_bias().size()) add_vector(P + ".bd_vo.bias", bda.vo_bias());
    report.vo = {true, window_of(bda.vo_indices()), bda.vo_report().mean_nmse, bda.vo_report().phases};
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace detail

/// Reads INPUT_DIR/{config.json, model.safetensors}, converts every attention layer, writes
/// `output` atomically (nothing is written when anything fails). `progress(done, total)` is
/// called after each layer.
inline ConvertReport convert_checkpoint(const std::string& input_dir, const std::string& output, const ConvertOptions& opts,
                                        const std::function<void(std::size_t, std::size_t)>& progress = {}) {
  if (opts.dtype != "f32" && opts.dtype != "f16" && opts.dtype != "bf16")
    throw RangeError("unknown dtype '" + opts.dtype + "': expected f32, f16 or bf16");
  const std::string config_path = input_dir + "/config.json";
  const nlohmann::json config = read_json_file(config_path);
  const SafeTensors st = SafeTensors::open(input_dir + "/model.safetensors");
  const std::vector<AttentionLayout> layouts = attention_layers(opts.arch, config, st, config_path);

  ConvertReport report;
  report.options = opts;
  report.tensors_in = static_cast<std::int64_t>(st.tensors().size());
  Writer converted;  // the BD tensors and kept parts, in layer order
  std::set<std::string> removed;
  const bool qk = nn::has_qk(opts.mode), vo = nn::has_vo(opts.mode);
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    const AttentionLayout& layout = layouts[l];
    LayerReport lr = opts.dtype == "f32"   ? detail::convert_layer<float>(layout, opts, converted)
                     : opts.dtype == "f16" ? detail::convert_layer<Eigen::half>(layout, opts, converted)
                                           : detail::convert_layer<Eigen::bfloat16>(layout, opts, converted);
    std::set<std::string> consumed;
    if (qk) consumed.insert(layout.qk_sources.begin(), layout.qk_sources.end());
    if (vo) consumed.insert(layout.vo_sources.begin(), layout.vo_sources.end());
    for (const auto& name : consumed) lr.params_before += static_cast<std::int64_t>(st.info(name).numel);
    removed.insert(consumed.begin(), consumed.end());
    std::vector<KeptPart> kept;
    if (qk) kept.insert(kept.end(), layout.keep_with_qk.begin(), layout.keep_with_qk.end());
    if (qk && !vo) kept.insert(kept.end(), layout.keep_without_vo.begin(), layout.keep_without_vo.end());
    if (vo && !qk) kept.insert(kept.end(), layout.keep_without_qk.begin(), layout.keep_without_qk.end());
    for (const KeptPart& k : kept) {
      detail::add_kept_part(converted, st, k);
      lr.params_after += static_cast<std::int64_t>(k.indices.size()) *
                         static_cast<std::int64_t>(st.info(k.source).numel / static_cast<std::size_t>(
                             k.axis == 0 ? st.info(k.source).matrix_shape().first : st.info(k.source).matrix_shape().second));
    }
    report.layers.push_back(std::move(lr));
    if (progress) progress(l + 1, layouts.size());
  }

  // Every tensor not consumed, unchanged (same dtype, shape and bytes), then the BD tensors.
  Writer out;
  for (const auto& [k, v] : st.metadata()) out.set_metadata(k, v);
  out.set_metadata("bd.format", "1");
  out.set_metadata("bd.arch", to_string(opts.arch));
  out.set_metadata("bd.mode", nn::to_string(opts.mode));
  out.set_metadata("bd.dtype", opts.dtype);
  out.set_metadata("bd.basis", bd::to_string(opts.decomposition.basis));
  out.set_metadata("bd.align", std::to_string(opts.decomposition.align));
  out.set_metadata("bd.force", opts.force ? "true" : "false");
  std::vector<const TensorInfo*> order;
  for (const auto& t : st.tensors()) order.push_back(&t);
  for (const TensorInfo* t : order) {
    if (removed.count(t->name)) continue;
    const unsigned char* b = st.bytes(t->name);
    out.add_bytes(t->name, t->dtype, t->shape, std::vector<unsigned char>(b, b + (t->end - t->begin)));
  }
  out.append(std::move(converted));
  report.tensors_out = static_cast<std::int64_t>(out.size());
  out.write(output);
  return report;
}

}  // namespace bd::io
