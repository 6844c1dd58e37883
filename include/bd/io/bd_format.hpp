// bd/io/bd_format.hpp — the BD checkpoint format, version 1: the one place its tensor names,
// metadata keys and version are spelled. The writer (io/convert.hpp), the reader
// (io/bd_checkpoint.hpp) and layer discovery (io/checkpoint.hpp) all go through it.
//
// Tensors (x·W orientation, [in, out]; n_q query heads, d_h head size; P a layer's prefix; h the
// heads of K' and V': n_kv with windows per key/value group — bd.windows "per-group", the
// default — or n_q with a window per query head, "per-head"; the indices' first dimension says which):
//   P.bd_qk.basis    [d_q_in, n_q·d_h]          replaces the query projection
//   P.bd_qk.coeff    [d_k_in − d_h, h·d_h]      replaces the key projection
//   P.bd_qk.indices  I32 [h, d_h]               key-input channels of each K' head's basis, ascending
//   P.bd_qk.bias     [n_q·d_h]                  when the model has a query bias (β = bq·Wk[S]ᵀ)
//   P.bd_vo.coeff    [d_v_in − d_h, h·d_h]      replaces the value projection
//   P.bd_vo.basis    [n_q·d_h, d_out]           replaces the output projection
//   P.bd_vo.indices  I32 [h, d_h]
//   P.bd_vo.bias     [d_out]                    when the model has an output or value bias
//   K'_k = X[:, indices[k]] + X[:, other channels, ascending]·coeff[:, k·d_h:(k+1)·d_h]  (V' alike);
//   query head q attends with K'_k and V'_k, k = q·h/n_q (as dense GQA with K and V);
//   Q' = X·bd_qk.basis + bd_qk.bias;  y = [O'_1 … O'_n]·bd_vo.basis + bd_vo.bias;  softmax scale unchanged.
// The tensors these replace are absent; every other tensor is the source's, unchanged, except
// the kept parts io/checkpoint.hpp names (slices of fused tensors that stay dense).
//
// Record: the conversion's options (ConvertOptions below), written once as JSON by to_json and
// stored twice from it: in every safetensors file's metadata as "bd.<key>" strings beside
// "bd.format" = "1", and in a folder's config.json as its "bd" object (with "format").
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/core/options.hpp"
#include "bd/core/scalar.hpp"
#include "bd/io/arch.hpp"
#include "bd/nn/bd_mode.hpp"

namespace bd::io {

/// What a conversion is asked to do; recorded in what it writes (format::metadata, config.json).
struct ConvertOptions {
  Arch arch = Arch::LLaMA;
  nn::Mode mode = nn::Mode::VO;
  Storage storage = Storage::F32;  ///< the type of the written BD tensors
  bd::Options decomposition{};     ///< recorded: basis and align
  bool force = false;              ///< accept QK under RoPE and modes the cost model advises against
  nn::Windows windows = nn::Windows::PerGroup;  ///< GQA: windows per key/value group or per query head
  /// deepseek-v2, mode qkvo: reorder each layer's latent channels so the QK window is last
  /// (nn/latent_permutation.hpp; K' is then one GEMM call on a GPU). kv_a_proj_with_mqa's latent
  /// rows and kv_a_layernorm are written reordered; shared-window bases only (not pivoted).
  bool latent_window_last = false;
};

template <typename Json>
void to_json(Json& j, const ConvertOptions& o) {
  j = Json{{"arch", to_string(o.arch)},
           {"mode", nn::to_string(o.mode)},
           {"dtype", to_string(o.storage)},
           {"basis", bd::to_string(o.decomposition.basis)},
           {"align", o.decomposition.align},
           {"force", o.force},
           {"windows", nn::to_string(o.windows)},
           {"latent_window_last", o.latent_window_last}};
}

/// Reads what to_json wrote; arch, mode and dtype are required, the rest default.
template <typename Json>
void from_json(const Json& j, ConvertOptions& o) {
  o = ConvertOptions{};
  o.arch = parse_arch(j.at("arch").template get<std::string>());
  o.mode = nn::parse_mode(j.at("mode").template get<std::string>());
  o.storage = parse_storage(j.at("dtype").template get<std::string>());
  if (j.contains("basis")) o.decomposition.basis = parse_basis(j.at("basis").template get<std::string>());
  if (j.contains("align")) o.decomposition.align = j.at("align").template get<Index>();
  if (j.contains("force")) o.force = j.at("force").template get<bool>();
  // Records before bd.windows existed were converted per query head.
  o.windows = j.contains("windows") ? nn::parse_windows(j.at("windows").template get<std::string>()) : nn::Windows::PerHead;
  if (j.contains("latent_window_last")) o.latent_window_last = j.at("latent_window_last").template get<bool>();
}

namespace format {

inline constexpr const char* version = "1";
inline constexpr const char* version_key = "bd.format";

/// The two products a layer's attention holds, each stored as one family of tensors.
using Family = nn::Family;

struct TensorNames {
  std::string basis, coeff, indices, bias;
};

inline TensorNames tensor_names(const std::string& prefix, Family f) {
  const std::string p = prefix + (f == Family::QK ? ".bd_qk." : ".bd_vo.");
  return {p + "basis", p + "coeff", p + "indices", p + "bias"};
}

/// The tensor whose presence marks a layer converted in `mode`: its first family's coefficients.
inline std::string marker(const std::string& prefix, nn::Mode mode) {
  return tensor_names(prefix, nn::has_qk(mode) ? Family::QK : Family::VO).coeff;
}

/// The safetensors metadata that records `o`: "bd.format" and "bd.<key>" for each key of to_json(o).
inline std::map<std::string, std::string> metadata(const ConvertOptions& o) {
  std::map<std::string, std::string> out{{version_key, version}};
  nlohmann::json record;
  to_json(record, o);
  for (auto it = record.cbegin(); it != record.cend(); ++it)
    out["bd." + it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
  return out;
}

/// Whether safetensors metadata carries a BD record (of any version).
inline bool has_record(const std::map<std::string, std::string>& meta) { return meta.count(version_key) != 0; }

/// The options a file's metadata records. Throws FormatError naming `where` when the record is
/// missing, of another version, or unreadable.
inline ConvertOptions options_from(const std::map<std::string, std::string>& meta, const std::string& where) {
  using bd::detail::message;
  const auto it = meta.find(version_key);
  if (it == meta.end())
    throw FormatError(message(where, ": metadata lacks '", version_key,
                              "': not a BD checkpoint (bd-convert writes bd.format, bd.arch, bd.mode, bd.dtype)"));
  if (it->second != version)
    throw FormatError(message(where, ": bd.format is '", it->second, "', this bd reads format ", version));
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, value] : meta)
    if (key.rfind("bd.", 0) == 0 && key != version_key)  // strings stored bare, numbers and booleans as JSON
      j[key.substr(3)] = nlohmann::json::accept(value) ? nlohmann::json::parse(value) : nlohmann::json(value);
  for (const char* key : {"arch", "mode", "dtype"})
    if (!j.contains(key))
      throw FormatError(message(where, ": metadata lacks 'bd.", key, "' (bd-convert writes bd.format, bd.arch, bd.mode, bd.dtype)"));
  try {
    return j.get<ConvertOptions>();
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(message(where, ": the bd.* metadata does not read as a conversion record: ", e.what()));
  } catch (const RangeError& e) {  // an unknown arch, mode, dtype or basis name
    throw FormatError(message(where, ": the bd.* metadata: ", e.what()));
  }
}

}  // namespace format
}  // namespace bd::io
