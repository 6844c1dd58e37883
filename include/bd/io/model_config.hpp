// bd/io/model_config.hpp — reading a model's config.json, the parts every family shares: numbers,
// the refusal (by key and value) of a config feature that changes the layer's output and that bd
// does not implement — a model bd cannot compute is refused, never run as another model — and
// rope_scaling's common fields (nn/rope.hpp's schemes, by Hugging Face's names). Each family's
// own reading is in its file: llama.hpp (llama, mistral, qwen2), deepseek.hpp (deepseek_v2/v3).
// Integers (config_int, config_int_or) are model_folder.hpp's.
#pragma once

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/base/names.hpp"
#include "bd/nn/rope.hpp"

namespace bd::io {

/// A number in config.json (integer or float), `fallback` when absent or null.
inline double config_number(const nlohmann::json& j, const char* key, double fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  const auto& v = j.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()))
    throw FormatError(bd::detail::message(where, ": '", key, "' is ", v.dump(), ", expected a number"));
  return v.get<double>();
}

namespace detail {

using bd::detail::message;

/// YaRN's mscale(s, m) = 0.1·m·ln(s) + 1 for a scale s > 1 (1 otherwise).
inline double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

inline void refuse(const std::string& where, const std::string& key, const nlohmann::json& value, const std::string& why) {
  throw RefusedError(message(where, ": ", key, " = ", value.dump(), " is not implemented by bd (", why,
                             "); refusing rather than computing another model"));
}

/// Whether a config key is present with a value other than null/false (or `neutral`).
inline bool set_to_other_than(const nlohmann::json& j, const char* key, const nlohmann::json& neutral = nullptr) {
  if (!j.contains(key)) return false;
  const auto& v = j.at(key);
  return !v.is_null() && !(v.is_boolean() && !v.get<bool>()) && v != neutral;
}

/// rope_scaling's type ("rope_type", or the older "type"); "default" when there is none.
inline std::string rope_type_name(const nlohmann::json& j, const std::string& where) {
  if (!j.contains("rope_scaling") || j.at("rope_scaling").is_null()) return "default";
  const auto& r = j.at("rope_scaling");
  if (!r.is_object()) throw FormatError(message(where, ": rope_scaling is ", r.dump(), ", expected an object or null"));
  const char* key = r.contains("rope_type") ? "rope_type" : "type";
  if (!r.contains(key) || !r.at(key).is_string())
    throw FormatError(message(where, ": rope_scaling has no rope_type (or type) string"));
  return r.at(key).get<std::string>();
}

/// The scheme with the fields every family reads the same way (factor, the llama3 and yarn
/// parameters); the family fills in the pretraining context and the attention factor.
inline nn::RopeScaling rope_scheme(const nlohmann::json& j, const std::string& type, const std::string& where) {
  nn::RopeScaling s;
  const auto* named = bd::detail::find_in(nn::rope_type_names, type);
  if (!named)
    refuse(where, "rope_scaling.rope_type", type,
           message("bd implements ", bd::detail::names_in(nn::rope_type_names, ", ", " and ")));
  if (named->first == nn::RopeType::Standard) return s;
  const std::string at = where + " rope_scaling";
  const nlohmann::json& r = j.at("rope_scaling");
  s.type = named->first;
  s.factor = config_number(r, "factor", 0, at);
  if (!(s.factor > 0)) throw FormatError(message(at, ": '", type, "' needs a positive factor"));
  s.low_freq_factor = config_number(r, "low_freq_factor", 1, at);
  s.high_freq_factor = config_number(r, "high_freq_factor", 4, at);
  s.beta_fast = config_number(r, "beta_fast", 32, at);
  s.beta_slow = config_number(r, "beta_slow", 1, at);
  if (r.contains("truncate") && r.at("truncate").is_boolean()) s.truncate = r.at("truncate").get<bool>();
  return s;
}

}  // namespace detail

}  // namespace bd::io
