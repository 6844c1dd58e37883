// bd/io/model_folder.hpp — a Hugging Face model folder: config.json and its weights, in one
// model.safetensors or in shards listed by model.safetensors.index.json
//   {"metadata": {...}, "weight_map": {"tensor name": "model-00001-of-00004.safetensors", ...}}.
//
// Every shard is memory-mapped and validated when the folder is opened, and the index is held
// to what the shards contain: a shard it names must exist (a plain file name in the folder), a
// tensor must be listed once, in the shard that holds it, and every tensor of a shard must be
// listed. Nothing is read beyond the headers until a tensor is asked for. A single .safetensors
// file may stand for a folder; its config.json is the one beside it.
//
// Weights come out in double, checked against the shape config.json implies, finite, and of a
// floating-point dtype (an integer tensor where a weight belongs is refused, with its name).
// FP8 E4M3 weights (DeepSeek-V3) carry block scales in `<name>_scale_inv` (F32, one per
// b_r × b_c block; b from config's quantization_config.weight_block_size, else 128 × 128):
// w = fp8 · scale_inv, exact in double (a 4-bit by 24-bit significand product).
#pragma once

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <sys/stat.h>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/core/validate.hpp"
#include "bd/io/safetensors.hpp"

namespace bd::io {

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(bd::detail::message(path, ": cannot open"));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw FormatError(bd::detail::message(path, ": not a JSON object"));
  return j;
}

/// The first of `keys` present in config.json, a positive integer.
inline Eigen::Index config_int(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& where) {
  for (const char* k : keys) {
    if (!j.contains(k)) continue;
    const auto& v = j.at(k);
    if (!v.is_number_integer() || v.get<long long>() <= 0)
      throw FormatError(bd::detail::message(where, ": '", k, "' is ", v.dump(), ", expected a positive integer"));
    return v.get<Eigen::Index>();
  }
  throw FormatError(bd::detail::message(where, ": config lacks a positive integer '", *keys.begin(), "'"));
}

/// As config_int, with a default when the key is absent (or null, as some configs write it).
inline Eigen::Index config_int_or(const nlohmann::json& j, const char* key, Eigen::Index fallback, const std::string& where) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return config_int(j, {key}, where);
}

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

class ModelFolder {
public:
  struct Shard {
    std::string file;  ///< name inside the folder
    SafeTensors tensors;
  };

  static constexpr const char* single_file = "model.safetensors";
  static constexpr const char* index_file = "model.safetensors.index.json";

  /// Opens a model folder; or a single .safetensors file, with the config.json beside it.
  static ModelFolder open(const std::string& path) {
    using bd::detail::message;
    if (file_exists(path)) {
      const std::size_t slash = path.find_last_of('/');
      const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
      ModelFolder m;
      m.dir_ = dir;
      m.config_path_ = dir + "/config.json";
      m.config_ = read_json_file(m.config_path_);
      m.shards_.push_back({path.substr(slash == std::string::npos ? 0 : slash + 1), SafeTensors::open(path)});
      for (const auto& t : m.shards_.front().tensors.tensors()) m.where_[t.name] = 0;
      return m;
    }
    const std::string& dir = path;
    ModelFolder m;
    m.dir_ = dir;
    m.config_path_ = dir + "/config.json";
    m.config_ = read_json_file(m.config_path_);
    if (file_exists(dir + "/" + index_file)) {
      m.open_index();
    } else if (file_exists(dir + "/" + single_file)) {
      m.shards_.push_back({single_file, SafeTensors::open(dir + "/" + single_file)});
      for (const auto& t : m.shards_.front().tensors.tensors()) m.where_[t.name] = 0;
    } else {
      throw IoError(message(dir, ": neither ", single_file, " nor ", index_file, " (a Hugging Face model folder has one)"));
    }
    return m;
  }

  const std::string& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  const std::string& config_path() const { return config_path_; }
  bool sharded() const { return sharded_; }
  const std::vector<Shard>& shards() const { return shards_; }
  /// Metadata of the first shard (the format's own records, e.g. {"format": "pt"} or bd.*).
  const std::map<std::string, std::string>& metadata() const { return shards_.front().tensors.metadata(); }

  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  std::size_t tensor_count() const { return where_.size(); }

  std::size_t shard_of(const std::string& name) const {
    const auto it = where_.find(name);
    if (it == where_.end())
      throw FormatError(bd::detail::message(dir_, ": no tensor named '", name, "' in ", sharded_ ? index_file : single_file));
    return it->second;
  }
  const SafeTensors& file_of(const std::string& name) const { return shards_[shard_of(name)].tensors; }
  const TensorInfo& info(const std::string& name) const { return file_of(name).info(name); }

  /// Name of the FP8 block scales of `name` ("x.weight" → "x.weight_scale_inv").
  static std::string scale_name(const std::string& name) { return name + "_scale_inv"; }

  /// Checks, without reading its data, that a weight is rows × cols ([n] reads as n × 1) and
  /// of a floating-point dtype.
  const TensorInfo& require_weight(const std::string& name, Eigen::Index rows, Eigen::Index cols) const {
    using bd::detail::message;
    const SafeTensors& st = file_of(name);
    const TensorInfo& t = st.info(name);
    if (t.shape.size() > 2)
      throw FormatError(message(st.source(), ": tensor '", name, "' has ", t.shape.size(), " dimensions, expected a matrix ",
                                rows, "x", cols, " from config.json"));
    const auto [r, c] = t.matrix_shape();
    if (r != rows || c != cols)
      throw FormatError(message(st.source(), ": tensor '", name, "' is ", r, "x", c, ", expected ", rows, "x", cols,
                                " from config.json"));
    if (!is_floating_point(t.dtype))
      throw FormatError(message(st.source(), ": tensor '", name, "' is ", to_string(t.dtype),
                                ", expected a floating-point weight (F32, F16, BF16, F64 or F8_E4M3 with block scales)"));
    return t;
  }

  /// A weight in double, checked as require_weight says, finite, FP8 block scales applied.
  Eigen::MatrixXd matrix(const std::string& name, Eigen::Index rows, Eigen::Index cols) const {
    const TensorInfo& t = require_weight(name, rows, cols);
    Eigen::MatrixXd m = file_of(name).matrix<double>(name);
    if (t.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E5M2) scale_blocks(name, m, /*transposed=*/false);
    bd::detail::require_finite(m, name);
    return m;
  }

  /// An nn.Linear weight stored [out, in], in x·W orientation (in × out), checked like matrix():
  /// its row-major bytes are a column-major in × out matrix already, decoded without a shuffle.
  Eigen::MatrixXd linear(const std::string& name, Eigen::Index out, Eigen::Index in) const {
    const TensorInfo& t = require_weight(name, out, in);
    Eigen::MatrixXd w(in, out);
    detail::decode_into(file_of(name).bytes(name), t.dtype, t.numel, w.data());
    if (t.dtype == DType::F8_E4M3 || t.dtype == DType::F8_E5M2) scale_blocks(name, w, /*transposed=*/true);
    bd::detail::require_finite(w, name);
    return w;
  }

  /// A vector [n] in double when the tensor exists.
  std::optional<Eigen::VectorXd> optional_vector(const std::string& name, Eigen::Index n) const {
    if (!contains(name)) return std::nullopt;
    return Eigen::VectorXd(matrix(name, n, 1));
  }

  /// Drops the mapped pages of a tensor (and of its block scales) from this process.
  void release(const std::string& name) const {
    file_of(name).release(name);
    if (contains(scale_name(name))) file_of(scale_name(name)).release(scale_name(name));
  }

  /// Drops the mapped pages of every tensor whose name starts with `prefix` (a layer's).
  void release_prefix(const std::string& prefix) const {
    for (auto it = where_.lower_bound(prefix); it != where_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      shards_[it->second].tensors.release(it->first);
  }

private:
  void open_index() {
    using bd::detail::message;
    sharded_ = true;
    const std::string path = dir_ + "/" + index_file;
    std::ifstream in(path);
    if (!in) throw IoError(message(path, ": cannot open"));
    // A name listed twice would silently keep its last shard in a JSON object: refuse it.
    std::string top, duplicate;
    std::set<std::string> listed;
    nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
        const auto& key = parsed.get_ref<const std::string&>();
        if (depth == 1) top = key;
        else if (depth == 2 && top == "weight_map" && !listed.insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    };
    const nlohmann::json index = nlohmann::json::parse(in, on_event, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) throw FormatError(message(path, ": not a JSON object"));
    if (!duplicate.empty()) throw FormatError(message(path, ": tensor '", duplicate, "' is listed twice in weight_map"));
    if (!index.contains("weight_map") || !index.at("weight_map").is_object())
      throw FormatError(message(path, ": lacks the object 'weight_map' (tensor name → shard file)"));
    // Shards in file-name order (model-00001-of-…, …), whatever order the index lists tensors in.
    std::map<std::string, std::size_t> shard_index;
    std::set<std::string> files;
    for (const auto& [name, file] : index.at("weight_map").items())
      if (file.is_string()) files.insert(file.get<std::string>());
    for (const std::string& f : files)
      if (!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos && f.find('\\') == std::string::npos &&
          file_exists(dir_ + "/" + f)) {
        shard_index.emplace(f, shards_.size());
        shards_.push_back({f, SafeTensors::open(dir_ + "/" + f)});
      }
    for (const auto& [name, file] : index.at("weight_map").items()) {
      if (!file.is_string())
        throw FormatError(message(path, ": weight_map['", name, "'] is ", file.dump(), ", expected a shard file name"));
      const std::string f = file.get<std::string>();
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\\') != std::string::npos)
        throw FormatError(message(path, ": weight_map['", name, "'] names '", f,
                                  "', expected a file name inside the model folder (no path)"));
      const auto it = shard_index.find(f);  // every existing shard was opened above
      if (it == shard_index.end())
        throw FormatError(message(path, ": shard '", f, "' (holding '", name, "') is missing from ", dir_));
      const SafeTensors& st = shards_[it->second].tensors;
      if (!st.contains(name))
        throw FormatError(message(path, ": lists tensor '", name, "' in shard '", f, "', which lacks it"));
      where_[name] = it->second;
    }
    if (shards_.empty()) throw FormatError(message(path, ": weight_map is empty"));
    for (std::size_t s = 0; s < shards_.size(); ++s)
      for (const auto& t : shards_[s].tensors.tensors()) {
        const auto it = where_.find(t.name);
        if (it == where_.end())
          throw FormatError(message(path, ": shard '", shards_[s].file, "' holds tensor '", t.name,
                                    "', which weight_map does not list"));
        if (it->second != s)
          throw FormatError(message(path, ": tensor '", t.name, "' is in shards '", shards_[s].file, "' and '",
                                    shards_[it->second].file, "'; weight_map names the second"));
      }
  }

  /// m ← m ⊙ scales expanded over b_r × b_c blocks of the stored tensor (m holds its transpose
  /// when `transposed`).
  void scale_blocks(const std::string& name, Eigen::MatrixXd& m, bool transposed) const {
    using bd::detail::message;
    const std::string scales = scale_name(name);
    if (!contains(scales))
      throw FormatError(message(file_of(name).source(), ": FP8 tensor '", name, "' has no block scales '", scales, "'"));
    Eigen::Index br = 128, bc = 128;
    if (config_.contains("quantization_config") && config_.at("quantization_config").is_object()) {
      const auto& q = config_.at("quantization_config");
      if (q.contains("weight_block_size")) {
        const auto& b = q.at("weight_block_size");
        if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
            b[0].get<long long>() <= 0 || b[1].get<long long>() <= 0)
          throw FormatError(message(config_path_, ": quantization_config.weight_block_size is ", b.dump(),
                                    ", expected [rows, cols] of positive integers"));
        br = b[0].get<Eigen::Index>();
        bc = b[1].get<Eigen::Index>();
      }
    }
    const Eigen::Index rows = transposed ? m.cols() : m.rows(), cols = transposed ? m.rows() : m.cols();
    const Eigen::Index gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
    const TensorInfo& s = info(scales);
    const auto [sr, sc] = s.matrix_shape();
    if (s.dtype != DType::F32 && s.dtype != DType::BF16 && s.dtype != DType::F16)
      throw FormatError(message(file_of(scales).source(), ": block scales '", scales, "' are ", to_string(s.dtype),
                                ", expected F32"));
    if (s.shape.size() != 2 || sr != gr || sc != gc)
      throw FormatError(message(file_of(scales).source(), ": block scales '", scales, "' are ", sr, "x", sc, ", expected ", gr,
                                "x", gc, " for a ", rows, "x", cols, " weight in ", br, "x", bc, " blocks"));
    const Eigen::MatrixXd scale = file_of(scales).matrix<double>(scales);
    bd::detail::require_finite(scale, scales);
    for (Eigen::Index j = 0; j < m.cols(); ++j)
      for (Eigen::Index i = 0; i < m.rows(); ++i) m(i, j) *= transposed ? scale(j / br, i / bc) : scale(i / br, j / bc);
  }

  std::string dir_, config_path_;
  nlohmann::json config_;
  bool sharded_ = false;
  std::vector<Shard> shards_;
  std::map<std::string, std::size_t> where_;
};

}  // namespace bd::io
