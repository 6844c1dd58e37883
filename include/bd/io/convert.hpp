// bd/io/convert.hpp — converts a checkpoint's attention layers to BD form (bd-convert's core).
//
// What it writes is format v1 (bd/io/bd_format.hpp): the BD tensors replace the ones they are
// computed from; every other tensor is copied unchanged. A kept part of an FP8 tensor (the RoPE
// rows of a quantized query projection) is written dequantized, in the BD tensors' dtype; the
// block scales of consumed tensors go with them.
//
// Streaming: the plan (every output tensor's name, dtype and shape) comes from config.json and
// the input headers, so each output file's header is written first and its data after, in
// order: unconverted tensors copied from the input file by the kernel (copy_file_range), never
// through the heap; then one layer at a time read (memory-mapped), prepared, written and
// released. Peak memory is one layer's working set (its weights in double, the preparation's
// workspace, its BD tensors) plus the headers, whatever the model's size.
//
// Output: OUTPUT ending in .safetensors is one file (every input shard's tensors in it);
// otherwise a folder mirroring the input: the same shard files, each holding its layers' BD
// tensors (a layer goes to the shard of its first consumed tensor), a new
// model.safetensors.index.json, config.json with a "bd" record, and the folder's other files
// copied. Both are atomic: a temporary file or folder beside OUTPUT, renamed at the end, and
// removed when anything fails. An existing folder is never overwritten.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bd/base/deferred.hpp"
#include "bd/base/workspace.hpp"
#include "bd/core/scalar.hpp"
#include "bd/io/bd_format.hpp"
#include "bd/io/checkpoint.hpp"
#include "bd/io/model_folder.hpp"
#include "bd/io/atomic_file.hpp"
#include "bd/io/safetensors.hpp"
#include "bd/io/safetensors_writer.hpp"
#include "bd/nn/bd_attention.hpp"
#include "bd/nn/latent_permutation.hpp"

namespace bd::io {

/// One converted layer: its two products as BDAttention reports them, and what it cost.
struct LayerReport {
  std::string prefix;
  nn::ProductReport qk, vo;  ///< `decomposed` false for a family the mode leaves dense
  std::int64_t params_before = 0, params_after = 0;
  double seconds = 0;                                 ///< read, prepare and write this layer
  std::uint64_t bytes_read = 0, bytes_written = 0;   ///< its consumed tensors, its BD tensors and kept parts
  std::vector<std::string> warnings;
};

template <typename Json>
void to_json(Json& j, const LayerReport& l) {
  j = Json::object();
  j["prefix"] = l.prefix;
  for (const auto& [key, p] : {std::pair<const char*, const nn::ProductReport&>{"qk", l.qk}, {"vo", l.vo}})
    if (p.decomposed)
      j[key] = {{"window", p.window},
                {"nmse", p.mean_nmse},
                {"max_nmse", p.max_nmse},
                {"phases_s",
                 {{"factor", p.phases.factor},
                  {"score", p.phases.score},
                  {"fit", p.phases.fit},
                  {"round", p.phases.round},
                  {"error", p.phases.error}}}};
  j["params_before"] = l.params_before;
  j["params_after"] = l.params_after;
  j["seconds"] = l.seconds;
  j["bytes_read"] = l.bytes_read;
  j["bytes_written"] = l.bytes_written;
  j["warnings"] = l.warnings;
}

/// What bd-convert reports as it goes: a layer done, or an input file's unconverted tensors copied.
struct ConvertProgress {
  enum class Kind { Copied, Layer } kind = Kind::Layer;
  std::string what;                ///< the layer prefix, or the input file copied from
  std::size_t layer = 0, layers = 0;  ///< layers done so far, of all
  double seconds = 0;              ///< this step
  std::uint64_t bytes_read = 0, bytes_written = 0;  ///< this step
};

struct ConvertReport {
  ConvertOptions options;
  std::vector<LayerReport> layers;
  std::int64_t tensors_in = 0, tensors_out = 0;
  std::size_t files_in = 0, files_out = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;  ///< tensor data read and written (headers aside)
  double seconds = 0;

  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json j = options;
    j["tensors_in"] = tensors_in;
    j["tensors_out"] = tensors_out;
    j["files_in"] = files_in;
    j["files_out"] = files_out;
    j["bytes_in"] = bytes_in;
    j["bytes_out"] = bytes_out;
    j["seconds"] = seconds;
    std::int64_t before = 0, after = 0;
    j["layers"] = layers;
    for (const auto& l : layers) {
      before += l.params_before;
      after += l.params_after;
    }
    j["params_before"] = before;
    j["params_after"] = after;
    return j;
  }

  /// Writes to_json() to `path` atomically.
  void write_json(const std::string& path) const { write_file_atomically(path, to_json().dump(2) + "\n"); }
};

namespace detail {

/// The file dtype of a storage type.
inline DType dtype_of(Storage s) {
  return dispatch(s, [](auto t) { return io::dtype_of<typename decltype(t)::type>(); });
}

template <typename S>
std::vector<unsigned char> raw(const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& m) {
  const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> rm = m;
  std::vector<unsigned char> out(static_cast<std::size_t>(rm.size()) * sizeof(S));
  if (rm.size()) std::memcpy(out.data(), rm.data(), out.size());
  return out;
}

/// The shape of a kept part: rows (axis 0) or columns (axis 1) of its source.
inline std::vector<std::int64_t> kept_shape(const TensorInfo& t, const KeptPart& k) {
  const auto n = static_cast<std::int64_t>(k.indices.size());
  const auto [rows, cols] = t.matrix_shape();
  if (k.axis == 0) return t.shape.size() == 1 ? std::vector<std::int64_t>{n} : std::vector<std::int64_t>{n, cols};
  return {rows, n};
}

inline bool quantized(DType t) { return t == DType::F8_E4M3 || t == DType::F8_E5M2; }

/// The kept part's bytes: the stored bytes of its rows or columns, or — from an FP8 source —
/// the dequantized values in `out` (the BD tensors' dtype).
BD_DEFERRED std::vector<unsigned char> kept_bytes(const ModelFolder& m, const KeptPart& k, Storage out) {
  const TensorInfo& t = m.info(k.source);
  const auto [rows, cols] = t.matrix_shape();
  if (quantized(t.dtype)) {
    const Eigen::MatrixXd w = m.matrix(k.source, rows, cols);
    const Eigen::MatrixXd part = k.axis == 0 ? Eigen::MatrixXd(w(k.indices, Eigen::all)) : Eigen::MatrixXd(w(Eigen::all, k.indices));
    return dispatch(out, [&](auto t) {
      using S = typename decltype(t)::type;
      return raw<S>(round_matrix<S>(part));
    });
  }
  const std::size_t size = dtype_size(t.dtype);
  const unsigned char* src = m.file_of(k.source).bytes(k.source);
  std::vector<unsigned char> bytes;
  if (k.axis == 0) {
    for (Eigen::Index r : k.indices)
      bytes.insert(bytes.end(), src + static_cast<std::size_t>(r * cols) * size, src + static_cast<std::size_t>((r + 1) * cols) * size);
  } else {
    for (Eigen::Index r = 0; r < rows; ++r)
      for (Eigen::Index c : k.indices)
        bytes.insert(bytes.end(), src + static_cast<std::size_t>(r * cols + c) * size,
                     src + static_cast<std::size_t>(r * cols + c + 1) * size);
  }
  return bytes;
}

inline std::vector<std::int32_t> indices_i32(const nn::HeadIndices& idx) {
  std::vector<std::int32_t> out;
  for (const auto& head : idx.basis)
    for (Eigen::Index i : head) out.push_back(static_cast<std::int32_t>(i));
  return out;
}

/// A layer's output tensors in file order: the BD tensors (format v1), then its kept parts.
struct LayerPlan {
  std::vector<TensorSpec> specs;
  std::vector<KeptPart> kept;
  std::set<std::string> consumed;  ///< input tensors the layer replaces (with FP8 block scales)
};

BD_DEFERRED LayerPlan plan_layer(const ModelFolder& m, const AttentionLayout& a, const ConvertOptions& opts) {
  LayerPlan p;
  const DType dt = dtype_of(opts.storage);
  const bool qk = nn::has_qk(opts.mode), vo = nn::has_vo(opts.mode);
  const std::int64_t n = a.config.n_q, dh = a.config.head_dim, dv = a.config.value_dim();
  const std::int64_t h = opts.windows == nn::Windows::PerGroup ? a.config.n_kv : n;  // heads of K' and V'
  const std::string& P = a.prefix;
  if (qk) {  // in the order convert_layer writes them
    const format::TensorNames t = format::tensor_names(P, format::Family::QK);
    p.specs.push_back({t.basis, dt, {a.d_q, n * dh}});
    p.specs.push_back({t.coeff, dt, {a.d_kv - dh, h * dh}});
    p.specs.push_back({t.indices, DType::I32, {h, dh}});
    if (a.query_bias) p.specs.push_back({t.bias, dt, {n * dh}});
  }
  if (vo) {
    const format::TensorNames t = format::tensor_names(P, format::Family::VO);
    p.specs.push_back({t.coeff, dt, {a.d_kv - dv, h * dv}});
    p.specs.push_back({t.basis, dt, {n * dv, a.d_out}});
    p.specs.push_back({t.indices, DType::I32, {h, dv}});
    if (a.value_or_output_bias) p.specs.push_back({t.bias, dt, {a.d_out}});
  }
  if (qk) p.kept.insert(p.kept.end(), a.keep_with_qk.begin(), a.keep_with_qk.end());
  if (qk && !vo) p.kept.insert(p.kept.end(), a.keep_without_vo.begin(), a.keep_without_vo.end());
  if (vo && !qk) p.kept.insert(p.kept.end(), a.keep_without_qk.begin(), a.keep_without_qk.end());
  if (opts.latent_window_last) {
    if (a.latent_parts.empty() || opts.mode != nn::Mode::QKVO)
      throw RefusedError(message(P, ": the latent window last needs an MLA layer (deepseek-v2) converted in mode qkvo, so that "
                                    "nothing else reads the latent in its old order"));
    p.kept.insert(p.kept.end(), a.latent_parts.begin(), a.latent_parts.end());
    for (const KeptPart& k : a.latent_parts) p.consumed.insert(k.source);
  }
  for (const KeptPart& k : p.kept) {
    const TensorInfo& t = m.info(k.source);
    p.specs.push_back({k.name, quantized(t.dtype) ? dt : t.dtype, kept_shape(t, k)});
  }
  if (qk) p.consumed.insert(a.qk_sources.begin(), a.qk_sources.end());
  if (vo) p.consumed.insert(a.vo_sources.begin(), a.vo_sources.end());
  for (const std::string& name : std::set<std::string>(p.consumed))
    if (m.contains(ModelFolder::scale_name(name))) p.consumed.insert(ModelFolder::scale_name(name));
  return p;
}

/// Prepares one layer and returns its output tensors' bytes in the plan's order.
template <typename S>
std::vector<std::vector<unsigned char>> convert_layer(const ModelFolder& m, const AttentionLayout& layout, const LayerPlan& plan,
                                                      const ConvertOptions& opts, Workspace& ws, LayerReport& report) {
  std::vector<std::vector<unsigned char>> out;
  nn::BDAttention<S> bda;
  {
    const nn::MultiHeadAttention<double> dense(layout.config, layout.load());
    nn::BDAttentionOptions bo;
    bo.mode = opts.mode;
    bo.decomposition = opts.decomposition;
    bo.force = opts.force;
    bo.windows = opts.windows;
    bo.cost_policy = opts.force ? nn::CostPolicy::Warn : nn::CostPolicy::Refuse;
    try {
      bda = nn::BDAttention<S>::prepare(dense, bo, ws);
    } catch (const Error& e) {
      throw RefusedError(message(layout.prefix, ": ", e.what()));
    }
  }
  report.warnings = bda.warnings();
  report.qk = bda.qk_report();
  report.vo = bda.vo_report();
  std::vector<Eigen::Index> order;  // the latent's new channel order, when reordered
  if (opts.latent_window_last) {
    try {
      auto moved = nn::latent_window_last(bda);
      order = std::move(moved.order);
      bda = std::move(moved.layer);
    } catch (const Error& e) {
      throw RefusedError(message(layout.prefix, ": ", e.what()));
    }
    report.qk.window = bda.qk_indices().describe() + " (latent reordered)";
    report.vo.window = bda.vo_indices().describe() + " (latent reordered)";
  }
  auto add = [&](const auto& matrix) {
    out.push_back(raw<S>(matrix));
    report.params_after += static_cast<std::int64_t>(matrix.size());
  };
  auto add_indices = [&](const nn::HeadIndices& idx) {
    const std::vector<std::int32_t> v = indices_i32(idx);
    std::vector<unsigned char> bytes(v.size() * sizeof(std::int32_t));
    if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
    out.push_back(std::move(bytes));
  };
  using Stored = typename nn::BDAttention<S>::Stored;
  if (nn::has_qk(opts.mode)) {
    add(bda.qk_basis());
    add(bda.qk_coeff());
    add_indices(bda.qk_indices());
    if (bda.qk_bias().size()) out.push_back(raw<S>(Stored(bda.qk_bias())));
  }
  if (nn::has_vo(opts.mode)) {
    add(bda.vo_coeff());
    add(bda.vo_basis());
    add_indices(bda.vo_indices());
    if (bda.vo_bias().size()) out.push_back(raw<S>(Stored(bda.vo_bias())));
  }
  for (KeptPart k : plan.kept) {
    const bool latent = !order.empty() && std::any_of(layout.latent_parts.begin(), layout.latent_parts.end(),
                                                      [&](const KeptPart& l) { return l.source == k.source; });
    if (latent) {  // new latent row j is old row order[j]; the RoPE key's rows after them stay
      const std::vector<Eigen::Index> whole = k.indices;
      for (std::size_t j = 0; j < order.size(); ++j) k.indices[j] = whole[std::size_t(order[j])];
    }
    out.push_back(kept_bytes(m, k, opts.storage));
    report.params_after += static_cast<std::int64_t>(out.back().size() / dtype_size(plan.specs[out.size() - 1].dtype));
  }
  return out;
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace detail

/// Converts every attention layer of the model folder `input_dir` (see the file comment for
/// the output, its atomicity and the memory bound). `progress` is called after each input
/// file's tensors are copied and after each layer.
BD_DEFERRED ConvertReport convert_checkpoint(const std::string& input_dir, const std::string& output, const ConvertOptions& opts,
                                        const std::function<void(const ConvertProgress&)>& progress = {}) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const ModelFolder m = ModelFolder::open(input_dir);
  const std::vector<AttentionLayout> layouts = attention_layers(opts.arch, m);
  const bool folder_out = !detail::ends_with(output, ".safetensors");

  // The plan: what each output file holds, from the headers alone.
  std::vector<detail::LayerPlan> plans;
  std::set<std::string> consumed;
  for (const AttentionLayout& a : layouts) {
    plans.push_back(detail::plan_layer(m, a, opts));
    consumed.insert(plans.back().consumed.begin(), plans.back().consumed.end());
  }
  const std::size_t files = folder_out ? m.shards().size() : 1;
  std::vector<std::vector<std::size_t>> layers_of(files);
  for (std::size_t l = 0; l < layouts.size(); ++l) {
    const auto& sources = nn::has_qk(opts.mode) ? layouts[l].qk_sources : layouts[l].vo_sources;
    layers_of[folder_out ? m.shard_of(sources.front()) : 0].push_back(l);
  }

  ConvertReport report;
  report.options = opts;
  report.tensors_in = static_cast<std::int64_t>(m.tensor_count());
  report.files_in = m.shards().size();
  report.files_out = files;
  std::map<std::string, std::string> metadata = m.metadata();
  for (const auto& [key, value] : format::metadata(opts)) metadata[key] = value;

  std::optional<detail::TempFolder> folder;
  if (folder_out) folder.emplace(output);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  Workspace ws;  // preparation's scratch, reused by every layer
  for (std::size_t f = 0; f < files; ++f) {
    // Unconverted tensors of this file's input shard(s), in their order, then its layers.
    std::vector<std::pair<std::size_t, const TensorInfo*>> copies;
    for (std::size_t s = 0; s < m.shards().size(); ++s) {
      if (folder_out && s != f) continue;
      for (const TensorInfo& t : m.shards()[s].tensors.tensors())
        if (!consumed.count(t.name)) copies.push_back({s, &t});
    }
    std::vector<TensorSpec> specs;
    for (const auto& [s, t] : copies) specs.push_back({t->name, t->dtype, t->shape});
    for (std::size_t l : layers_of[f]) specs.insert(specs.end(), plans[l].specs.begin(), plans[l].specs.end());
    const std::string file_name = folder_out ? m.shards()[f].file : output;
    for (const TensorSpec& t : specs) weight_map[t.name] = file_name;
    report.tensors_out += static_cast<std::int64_t>(specs.size());
    FileWriter writer(folder_out ? folder->file(file_name) : output, specs, metadata);

    auto step_start = clock::now();
    std::uint64_t copied = 0;
    for (const auto& [s, t] : copies) {
      const SafeTensors& st = m.shards()[s].tensors;
      writer.copy(t->name, st.source(), st.data_offset() + t->begin, t->end - t->begin);
      copied += t->end - t->begin;
    }
    report.bytes_in += copied;
    report.bytes_out += copied;
    if (progress && !copies.empty())
      progress({ConvertProgress::Kind::Copied, folder_out ? m.shards()[f].file : std::string("unconverted tensors"),
                report.layers.size(), layouts.size(), std::chrono::duration<double>(clock::now() - step_start).count(), copied,
                copied});

    for (std::size_t l : layers_of[f]) {
      step_start = clock::now();
      const AttentionLayout& layout = layouts[l];
      const detail::LayerPlan& plan = plans[l];
      LayerReport lr;
      lr.prefix = layout.prefix;
      std::vector<std::vector<unsigned char>> bytes = dispatch(opts.storage, [&](auto t) {
        return detail::convert_layer<typename decltype(t)::type>(m, layout, plan, opts, ws, lr);
      });
      for (const std::string& name : plan.consumed) {
        const TensorInfo& t = m.info(name);
        if (!detail::ends_with(name, "_scale_inv")) lr.params_before += static_cast<std::int64_t>(t.numel);
        lr.bytes_read += t.end - t.begin;
      }
      for (std::size_t i = 0; i < bytes.size(); ++i) {
        writer.write(plan.specs[i].name, bytes[i].data(), bytes[i].size());
        lr.bytes_written += bytes[i].size();
      }
      bytes.clear();
      m.release_prefix(layout.prefix + ".");  // everything the layer read (kept parts included)
      lr.seconds = std::chrono::duration<double>(clock::now() - step_start).count();
      report.bytes_in += lr.bytes_read;
      report.bytes_out += lr.bytes_written;
      report.layers.push_back(std::move(lr));
      if (progress)
        progress({ConvertProgress::Kind::Layer, layout.prefix, report.layers.size(), layouts.size(), report.layers.back().seconds,
                  report.layers.back().bytes_read, report.layers.back().bytes_written});
    }
    writer.commit();
  }

  if (folder_out) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", report.bytes_out}, {format::version_key, format::version}};
    index["weight_map"] = weight_map;
    write_file_atomically(folder->file(ModelFolder::index_file), index.dump(2) + "\n");
    nlohmann::ordered_json config = nlohmann::ordered_json::parse(m.config().dump());
    config["bd"] = opts;
    config["bd"]["format"] = format::version;
    write_file_atomically(folder->file("config.json"), config.dump(2) + "\n");
    // The folder's other files (tokenizer, generation config, …) unchanged.
    std::set<std::string> written{"config.json", ModelFolder::index_file};
    for (const auto& s : m.shards()) written.insert(s.file);
    for (const auto& entry : std::filesystem::directory_iterator(input_dir)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || written.count(name) || name == ModelFolder::single_file) continue;
      detail::TempFile copy(folder->file(name));
      copy.copy_from(entry.path().string(), 0, static_cast<std::size_t>(entry.file_size()));
      copy.commit();
    }
    folder->commit();
  }
  report.seconds = std::chrono::duration<double>(clock::now() - start).count();
  return report;
}

/// The instantiations bd::compiled holds (src/compiled_io.cpp), extern under BD_COMPILED_LIB.
#define BD_CONVERT_INSTANTIATIONS(prefix)                                                                           \
  prefix std::vector<unsigned char> detail::kept_bytes<>(const ModelFolder&, const KeptPart&, Storage);           \
  prefix detail::LayerPlan detail::plan_layer<>(const ModelFolder&, const AttentionLayout&, const ConvertOptions&);       \
  prefix ConvertReport convert_checkpoint<>(const std::string&, const std::string&, const ConvertOptions&,          \
                                            const std::function<void(const ConvertProgress&)>&);
#ifdef BD_COMPILED_LIB
BD_CONVERT_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::io
