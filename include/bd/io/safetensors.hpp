// bd/io/safetensors.hpp — reads safetensors files: the parser (memory-mapped; writers are in
// bd/io/safetensors_writer.hpp, element types in bd/io/dtype.hpp).
//
// Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data.
//   { "__metadata__": {"k": "v", ...},
//     "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ... }
// Offsets are relative to the first byte after the header. Writers pad the JSON with spaces
// so the data starts on a multiple of 8.
//
// The file is hostile input. The parser rejects, with a message naming the tensor and the
// problem: a header length beyond the file or above 100 MB, invalid UTF-8 or JSON, unknown
// dtypes or fields, negative, non-integer or overflowing shapes, offsets out of range,
// reversed, overlapping or leaving holes, a span that is not shape × dtype size, trailing
// bytes, non-string metadata, duplicate names. It never allocates more than the header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/io/dtype.hpp"
#include "bd/io/mapped_file.hpp"

namespace bd::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::size_t begin = 0, end = 0;  ///< byte offsets relative to the data section
  std::size_t numel = 1;

  /// Rows and columns when the tensor is read as a matrix: [r, c] → r×c, [n] → n×1, [] → 1×1.
  std::pair<Eigen::Index, Eigen::Index> matrix_shape() const {
    if (shape.size() == 2) return {shape[0], shape[1]};
    if (shape.size() == 1) return {shape[0], 1};
    return {1, 1};
  }
};

/// Largest header the parser accepts (the format's reference implementation uses the same).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

namespace detail {

using bd::detail::message;

/// Strict UTF-8 validation (no overlongs, no surrogates, nothing above U+10FFFF).
inline bool valid_utf8(const unsigned char* s, std::size_t n, std::size_t& bad) {
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    std::size_t len;
    std::uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
    else { bad = i; return false; }
    if (i + len > n) { bad = i; return false; }
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) { bad = i; return false; }
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    const std::uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { bad = i; return false; }
    i += len;
  }
  return true;
}

inline std::uint64_t read_le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline std::int64_t json_nonnegative_int(const nlohmann::json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw FormatError(message(what, " is ", u, ": too large"));
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) {
    const auto s = v.get<std::int64_t>();
    if (s < 0) throw FormatError(message(what, " is ", s, ": expected a non-negative integer"));
    return s;
  }
  throw FormatError(message(what, " is ", v.dump(), ": expected a non-negative integer"));
}

}  // namespace detail

/// A parsed safetensors file. Cheap to copy (shares the mapping).
class SafeTensors {
public:
  template <typename T>
  using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Memory-maps and validates a file.
  static SafeTensors open(const std::string& path) {
    SafeTensors st;
    st.source_ = path;
    st.bytes_ = detail::Bytes::map_file(path);
    st.parse();
    return st;
  }

  /// Validates bytes held in memory (tests, fuzzing); `source` names them in messages.
  static SafeTensors from_bytes(std::vector<unsigned char> bytes, std::string source = "<memory>") {
    SafeTensors st;
    st.source_ = std::move(source);
    st.bytes_ = std::make_shared<detail::Bytes>(std::move(bytes));
    st.parse();
    return st;
  }

  const std::string& source() const { return source_; }
  /// Tensors in the order of their data.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }

  const TensorInfo& info(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end())
      throw FormatError(detail::message(source_, ": no tensor named '", name, "' (the file has ", tensors_.size(),
                                        " tensors", tensors_.empty() ? "" : ", e.g. '" + tensors_.front().name + "'",
                                        ")"));
    return tensors_[it->second];
  }

  /// The tensor's raw little-endian bytes.
  const unsigned char* bytes(const std::string& name) const { return data_ + info(name).begin; }

  /// A view without copy, when the stored dtype is T and the bytes are aligned for T.
  template <typename T>
  Eigen::Map<const RowMajor<T>> view(const std::string& name) const {
    const TensorInfo& t = require_matrix(name);
    if (t.dtype != dtype_of<T>())
      throw FormatError(detail::message(source_, ": tensor '", name, "' is ", to_string(t.dtype), ", not ",
                                        to_string(dtype_of<T>()), "; use matrix<T>() to convert"));
    const unsigned char* p = data_ + t.begin;
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0)
      throw FormatError(detail::message(source_, ": tensor '", name, "' is not aligned for a view; use matrix<T>()"));
    const auto [rows, cols] = t.matrix_shape();
    return Eigen::Map<const RowMajor<T>>(reinterpret_cast<const T*>(p), rows, cols);
  }

  /// The tensor converted to T (any numeric dtype; rank ≤ 2: [r, c] → r×c, [n] → n×1).
  template <typename T = float>
  Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic> matrix(const std::string& name) const {
    const TensorInfo& t = require_matrix(name);
    const auto [rows, cols] = t.matrix_shape();
    RowMajor<T> out(rows, cols);
    detail::decode_into(data_ + t.begin, t.dtype, t.numel, out.data());
    return out;
  }

  /// Byte offset of the data section in the file (tensor spans are relative to it).
  std::size_t data_offset() const { return static_cast<std::size_t>(data_ - bytes_->data()); }

  /// Lets the operating system drop the tensor's mapped pages from this process (see Bytes::release).
  void release(const std::string& name) const {
    const TensorInfo& t = info(name);
    bytes_->release(data_offset() + t.begin, t.end - t.begin);
  }

  /// A 1-D (or any) tensor as a flat vector in storage order.
  template <typename T = float>
  std::vector<T> values(const std::string& name) const {
    const TensorInfo& t = info(name);
    std::vector<T> out(t.numel);
    const std::size_t size = dtype_size(t.dtype);
    for (std::size_t i = 0; i < t.numel; ++i) out[i] = detail::decode<T>(data_ + t.begin + i * size, t.dtype);
    return out;
  }

private:
  const TensorInfo& require_matrix(const std::string& name) const {
    const TensorInfo& t = info(name);
    if (t.shape.size() > 2)
      throw FormatError(detail::message(source_, ": tensor '", name, "' has ", t.shape.size(),
                                        " dimensions, expected at most 2 to read it as a matrix"));
    return t;
  }

  void parse() {
    using detail::message;
    const unsigned char* file = bytes_->data();
    const std::size_t size = bytes_->size();
    if (size < 8)
      throw FormatError(message(source_, ": truncated: ", size, " bytes, expected at least 8 (the header length)"));
    const std::uint64_t n = detail::read_le64(file);
    if (n > max_header_bytes)
      throw FormatError(message(source_, ": header length ", n, " exceeds the ", max_header_bytes, "-byte limit"));
    if (n > size - 8)
      throw FormatError(message(source_, ": header length ", n, " runs past the end of the file (", size - 8,
                                " bytes after the length); the file is truncated or not safetensors"));
    const unsigned char* header = file + 8;
    std::size_t bad = 0;
    if (!detail::valid_utf8(header, n, bad))
      throw FormatError(message(source_, ": header is not valid UTF-8 (byte ", bad, " of the header)"));

    // Duplicate names are rejected while parsing: a JSON object would silently keep the last one.
    std::set<std::string> seen;
    std::string duplicate;
    nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                     nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    };
    const nlohmann::json root =
        nlohmann::json::parse(header, header + n, on_event, /*allow_exceptions=*/false, /*ignore_comments=*/false);
    if (root.is_discarded()) throw FormatError(message(source_, ": header is not valid JSON"));
    if (!duplicate.empty()) throw FormatError(message(source_, ": tensor '", duplicate, "' is defined twice in the header"));
    if (!root.is_object()) throw FormatError(message(source_, ": header is JSON but not an object"));

    data_ = header + n;
    const std::size_t data_size = size - 8 - static_cast<std::size_t>(n);
    for (const auto& [key, value] : root.items()) {
      if (key == "__metadata__") {
        if (!value.is_object()) throw FormatError(message(source_, ": __metadata__ must be an object of strings"));
        for (const auto& [mk, mv] : value.items()) {
          if (!mv.is_string())
            throw FormatError(message(source_, ": __metadata__ entry '", mk, "' is ", mv.type_name(), ", expected a string"));
          metadata_[mk] = mv.get<std::string>();
        }
        continue;
      }
      tensors_.push_back(parse_tensor(key, value, data_size));
    }

    // Coverage: sorted by offsets, the spans must tile [0, data_size) exactly.
    std::sort(tensors_.begin(), tensors_.end(),
              [](const TensorInfo& a, const TensorInfo& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
    std::size_t cursor = 0;
    for (const TensorInfo& t : tensors_) {
      if (t.begin < cursor)
        throw FormatError(message(source_, ": tensor '", t.name, "' [", t.begin, ", ", t.end,
                                  ") overlaps the tensor before it (which ends at ", cursor, ")"));
      if (t.begin > cursor)
        throw FormatError(message(source_, ": a hole of ", t.begin - cursor, " bytes before tensor '", t.name, "' (at ",
                                  cursor, "); tensors must be contiguous"));
      cursor = t.end;
    }
    if (cursor != data_size)
      throw FormatError(message(source_, ": ", data_size - cursor, " trailing bytes after the last tensor (data ends at ",
                                cursor, " of ", data_size, ")"));
    for (std::size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  }

  TensorInfo parse_tensor(const std::string& name, const nlohmann::json& value, std::size_t data_size) const {
    using detail::message;
    const std::string where = message(source_, ": tensor '", name, "'");
    if (!value.is_object()) throw FormatError(message(where, " is ", value.type_name(), ", expected an object"));
    for (const auto& [field, ignored] : value.items()) {
      (void)ignored;
      if (field != "dtype" && field != "shape" && field != "data_offsets")
        throw FormatError(message(where, " has an unexpected field '", field, "' (expected dtype, shape, data_offsets)"));
    }
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!value.contains(field)) throw FormatError(message(where, " lacks the field '", field, "'"));

    TensorInfo t;
    t.name = name;
    const auto& dtype = value.at("dtype");
    if (!dtype.is_string() || !parse_dtype(dtype.get<std::string>(), t.dtype))
      throw FormatError(message(where, " has unknown dtype ", dtype.dump(),
                                " (expected F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8 or BOOL)"));
    const auto& shape = value.at("shape");
    if (!shape.is_array()) throw FormatError(message(where, ": shape is ", shape.dump(), ", expected an array"));
    std::uint64_t numel = 1;
    for (const auto& dim : shape) {
      const std::int64_t d = detail::json_nonnegative_int(dim, message(where, ": a shape dimension"));
      t.shape.push_back(d);
      // Overflow guard: the element count times the dtype size must fit, and cannot exceed the data.
      if (d != 0 && numel > (std::numeric_limits<std::uint64_t>::max() / 16) / static_cast<std::uint64_t>(d))
        throw FormatError(message(where, ": shape ", shape.dump(), " overflows the element count"));
      numel *= static_cast<std::uint64_t>(d);
    }
    const auto& offsets = value.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2)
      throw FormatError(message(where, ": data_offsets is ", offsets.dump(), ", expected [begin, end]"));
    const auto begin = static_cast<std::uint64_t>(detail::json_nonnegative_int(offsets[0], where + ": data_offsets[0]"));
    const auto end = static_cast<std::uint64_t>(detail::json_nonnegative_int(offsets[1], where + ": data_offsets[1]"));
    if (end < begin) throw FormatError(message(where, ": data_offsets [", begin, ", ", end, "] are reversed"));
    if (end > data_size)
      throw FormatError(message(where, ": data_offsets [", begin, ", ", end, "] run past the data section (", data_size,
                                " bytes)"));
    const std::uint64_t expected = numel * dtype_size(t.dtype);
    if (end - begin != expected)
      throw FormatError(message(where, ": spans ", end - begin, " bytes but shape ", shape.dump(), " of ",
                                to_string(t.dtype), " needs ", expected));
    t.begin = static_cast<std::size_t>(begin);
    t.end = static_cast<std::size_t>(end);
    t.numel = static_cast<std::size_t>(numel);
    return t;
  }

  std::string source_;
  std::shared_ptr<detail::Bytes> bytes_;
  const unsigned char* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace bd::io
