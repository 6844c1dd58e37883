// bd/io/safetensors.hpp — read (memory-mapped) and write safetensors files.
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
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
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

#include "bd/core/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define BD_SAFETENSORS_MMAP 1
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "bd/io/safetensors.hpp assumes a little-endian host (safetensors data is little-endian)"
#endif

namespace bd::io {

/// F8_E4M3 is OCP FP8 E4M3 "fn" (no infinities; S.1111.111 is NaN; largest 448), the type of
/// DeepSeek-V3's weights; F8_E5M2 is IEEE-like (the top byte of a binary16).
enum class DType { F64, F32, F16, BF16, F8_E4M3, F8_E5M2, I64, I32, I16, I8, U8, BOOL };

inline constexpr DType all_dtypes[] = {DType::F64,     DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2,
                                       DType::I64,     DType::I32, DType::I16, DType::I8,   DType::U8,      DType::BOOL};

inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::F8_E4M3: case DType::F8_E5M2: case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

inline bool is_floating_point(DType t) {
  switch (t) {
    case DType::F64: case DType::F32: case DType::F16: case DType::BF16: case DType::F8_E4M3: case DType::F8_E5M2:
      return true;
    default: return false;
  }
}

inline const char* to_string(DType t) {
  switch (t) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

inline bool parse_dtype(std::string_view s, DType& out) {
  for (DType t : all_dtypes) {
    if (s == to_string(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

/// The dtype that stores C++ type T.
template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  else if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, Eigen::half>) return DType::F16;
  else if constexpr (std::is_same_v<T, Eigen::bfloat16>) return DType::BF16;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::I64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<T, std::int16_t>) return DType::I16;
  else if constexpr (std::is_same_v<T, std::int8_t>) return DType::I8;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::U8;
  else static_assert(!sizeof(T), "no safetensors dtype for this type");
}

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

/// Owns the bytes of a file: a read-only mapping, or a buffer.
class Bytes {
public:
  Bytes() = default;
  explicit Bytes(std::vector<unsigned char> buffer) : buffer_(std::move(buffer)) {
    data_ = buffer_.data();
    size_ = buffer_.size();
  }
  static std::shared_ptr<Bytes> map_file(const std::string& path) {
    auto out = std::make_shared<Bytes>();
#ifdef BD_SAFETENSORS_MMAP
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(message(path, ": cannot open: ", std::strerror(errno)));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw IoError(message(path, ": not a regular file"));
    }
    out->size_ = static_cast<std::size_t>(st.st_size);
    if (out->size_ > 0) {
      void* p = ::mmap(nullptr, out->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        throw IoError(message(path, ": mmap failed: ", std::strerror(errno)));
      }
      out->mapping_ = p;
      out->data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
#else
    std::ifstream in(path, std::ios::binary);
    if (!in) throw IoError(message(path, ": cannot open"));
    out->buffer_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    out->data_ = out->buffer_.data();
    out->size_ = out->buffer_.size();
#endif
    return out;
  }
  ~Bytes() {
#ifdef BD_SAFETENSORS_MMAP
    if (mapping_) ::munmap(mapping_, size_);
#endif
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;

  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

  /// Drops the mapped pages of [offset, offset + n) from this process (they stay in the page
  /// cache and fault back in if read again): streaming a model through a mapping then costs
  /// resident memory for what is in use, not for everything read so far.
  void release(std::size_t offset, std::size_t n) const {
#ifdef BD_SAFETENSORS_MMAP
    if (!mapping_ || n == 0) return;
    static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t begin = offset / page * page, end = std::min(size_, offset + n);
    ::madvise(static_cast<unsigned char*>(mapping_) + begin, end - begin, MADV_DONTNEED);
#else
    (void)offset;
    (void)n;
#endif
  }

private:
  std::vector<unsigned char> buffer_;
  void* mapping_ = nullptr;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

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

/// OCP FP8 E4M3fn: bias 7, subnormals m·2⁻⁹, S.1111.111 NaN, no infinities. Exact in float.
inline float fp8_e4m3_value(std::uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
  else if (e == 0) v = std::ldexp(float(m), -9);
  else v = std::ldexp(float(8 + m), e - 10);  // (1 + m/8)·2^(e−7)
  return (b & 0x80) ? -v : v;
}

/// FP8 E5M2 is the top byte of a binary16.
inline float fp8_e5m2_value(std::uint8_t b) {
  return static_cast<float>(Eigen::half(Eigen::half_impl::raw_uint16_to_half(static_cast<std::uint16_t>(b << 8))));
}

template <typename T>
T decode(const unsigned char* p, DType t) {
  auto load = [p](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case DType::F64: return static_cast<T>(load(double{}));
    case DType::F32: return static_cast<T>(load(float{}));
    case DType::F16: return static_cast<T>(static_cast<float>(Eigen::half(Eigen::half_impl::raw_uint16_to_half(load(std::uint16_t{})))));
    case DType::BF16:
      return static_cast<T>(
          static_cast<float>(Eigen::bfloat16(Eigen::bfloat16_impl::raw_uint16_to_bfloat16(load(std::uint16_t{})))));
    case DType::F8_E4M3: return static_cast<T>(fp8_e4m3_value(*p));
    case DType::F8_E5M2: return static_cast<T>(fp8_e5m2_value(*p));
    case DType::I64: return static_cast<T>(load(std::int64_t{}));
    case DType::I32: return static_cast<T>(load(std::int32_t{}));
    case DType::I16: return static_cast<T>(load(std::int16_t{}));
    case DType::I8: return static_cast<T>(load(std::int8_t{}));
    case DType::U8: case DType::BOOL: return static_cast<T>(load(std::uint8_t{}));
  }
  return T{};
}

/// Decodes n stored values into out (the dtype switch outside the loop).
template <typename T>
void decode_into(const unsigned char* p, DType t, std::size_t n, T* out) {
  auto each = [&](auto to_value, std::size_t size) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(to_value(p + i * size));
  };
  auto load = [](auto tag) {
    return [](const unsigned char* q) {
      decltype(tag) v;
      std::memcpy(&v, q, sizeof v);
      return v;
    };
  };
  switch (t) {
    case DType::F64: return each(load(double{}), 8);
    case DType::F32: return each(load(float{}), 4);
    case DType::F16:
      return each([](const unsigned char* q) { std::uint16_t b; std::memcpy(&b, q, 2);
                                               return static_cast<float>(Eigen::half(Eigen::half_impl::raw_uint16_to_half(b))); }, 2);
    case DType::BF16:
      return each([](const unsigned char* q) { std::uint16_t b; std::memcpy(&b, q, 2);
                                               const std::uint32_t w = std::uint32_t(b) << 16; float f; std::memcpy(&f, &w, 4);
                                               return f; }, 2);
    default:
      for (std::size_t i = 0; i < n; ++i) out[i] = decode<T>(p + i * dtype_size(t), t);
  }
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

/// A tensor of a file to be written: what its header entry says.
struct TensorSpec {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;

  std::size_t bytes() const {
    std::size_t n = dtype_size(dtype);
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
};

namespace detail {

/// The 8-byte length and the JSON header (padded with spaces so the data starts on a multiple
/// of 8) of a file holding `tensors` contiguously, in this order.
inline std::string header_bytes(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  std::set<std::string> names;
  for (const TensorSpec& t : tensors) {
    for (auto d : t.shape)
      if (d < 0) throw ShapeError(message("tensor '", t.name, "': negative dimension ", d));
    if (t.name == "__metadata__" || !names.insert(t.name).second)
      throw ShapeError(message("tensor '", t.name, "' added twice (or reserved name)"));
    header[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(std::uint64_t(json.size()) >> (8 * i));
  return out + json;
}

/// A file written under a temporary name beside `path` and renamed onto it by commit(): readers
/// see the old file or the complete new one, and a failure (or destruction before commit) leaves
/// nothing behind.
class TempFile {
public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
#ifdef BD_SAFETENSORS_MMAP
    std::string tmpl = path_ + ".tmp.XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    fd_ = ::mkstemp(name.data());
    if (fd_ < 0) throw IoError(message(path_, ": cannot create a temporary file beside it: ", std::strerror(errno)));
    tmp_ = name.data();
#else
    tmp_ = path_ + ".tmp";
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!out_) throw IoError(message(path_, ": cannot create ", tmp_));
#endif
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (committed_) return;
#ifdef BD_SAFETENSORS_MMAP
    if (fd_ >= 0) ::close(fd_);
#else
    out_.close();
#endif
    std::remove(tmp_.c_str());
  }

  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
#ifdef BD_SAFETENSORS_MMAP
    std::size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd_, p + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw IoError(message(path_, ": write failed: ", std::strerror(errno)));
      done += static_cast<std::size_t>(w);
    }
#else
    out_.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
    if (!out_) throw IoError(message(path_, ": write failed"));
#endif
    written_ += n;
  }

  /// Appends bytes [offset, offset + n) of the file `source`, in the kernel where it can
  /// (copy_file_range), else through a 4 MiB buffer: never the whole span in memory.
  void copy_from(const std::string& source, std::size_t offset, std::size_t n) {
#ifdef BD_SAFETENSORS_MMAP
    const int in = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) throw IoError(message(source, ": cannot open: ", std::strerror(errno)));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{in};
    std::size_t done = 0;
#if defined(__linux__)
    bool kernel_copy = true;
    while (kernel_copy && done < n) {
      off64_t from = static_cast<off64_t>(offset + done);
      const ssize_t c = ::copy_file_range(in, &from, fd_, nullptr, n - done, 0);
      if (c < 0 && errno == EINTR) continue;
      if (c < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) kernel_copy = false;
      else if (c < 0) throw IoError(message(path_, ": copying from ", source, " failed: ", std::strerror(errno)));
      else if (c == 0) throw IoError(message(source, ": ended early (", offset + done, " of ", offset + n, " bytes)"));
      else {
        done += static_cast<std::size_t>(c);
        written_ += static_cast<std::size_t>(c);
      }
    }
#endif
    std::vector<unsigned char> buffer(std::min<std::size_t>(n - done, std::size_t(4) << 20));
    while (done < n) {
      const ssize_t r = ::pread(in, buffer.data(), std::min(buffer.size(), n - done), static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw IoError(message(source, ": read failed: ", std::strerror(errno)));
      if (r == 0) throw IoError(message(source, ": ended early (", offset + done, " of ", offset + n, " bytes)"));
      write(buffer.data(), static_cast<std::size_t>(r));  // counts into written_
      done += static_cast<std::size_t>(r);
    }
#else
    std::ifstream in(source, std::ios::binary);
    if (!in) throw IoError(message(source, ": cannot open"));
    in.seekg(static_cast<std::streamoff>(offset));
    std::vector<char> buffer(std::min<std::size_t>(n, std::size_t(4) << 20));
    for (std::size_t done = 0; done < n;) {
      const std::size_t k = std::min(buffer.size(), n - done);
      if (!in.read(buffer.data(), static_cast<std::streamsize>(k))) throw IoError(message(source, ": read failed"));
      write(buffer.data(), k);
      done += k;
    }
#endif
  }

  std::size_t written() const { return written_; }

  /// Starts the disk write-back of what was written since the last call, every 64 MiB, without
  /// waiting for it: commit()'s fsync then finds most of a multi-gigabyte file on disk already,
  /// and the write-back overlaps the caller's work instead of following it.
  void start_writeback() {
#if defined(__linux__) && defined(BD_SAFETENSORS_MMAP)
    constexpr std::size_t chunk = std::size_t(64) << 20;
    if (written_ - flushed_ < chunk) return;
    ::sync_file_range(fd_, static_cast<off64_t>(flushed_), static_cast<off64_t>(written_ - flushed_), SYNC_FILE_RANGE_WRITE);
    flushed_ = written_;
#endif
  }

  /// Flushes to disk and renames onto the final path.
  void commit() {
#ifdef BD_SAFETENSORS_MMAP
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0 || ::close(fd) != 0)
      throw IoError(message(path_, ": flushing the temporary file failed: ", std::strerror(errno)));
    ::chmod(tmp_.c_str(), 0644);
#else
    out_.close();
    if (!out_) throw IoError(message(path_, ": flushing the temporary file failed"));
    std::remove(path_.c_str());
#endif
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw IoError(message(path_, ": rename from the temporary file failed: ", std::strerror(errno)));
    committed_ = true;
  }

private:
  std::string path_, tmp_;
#ifdef BD_SAFETENSORS_MMAP
  int fd_ = -1;
#else
  std::ofstream out_;
#endif
  std::size_t written_ = 0, flushed_ = 0;
  bool committed_ = false;
};

}  // namespace detail

/// Writes `text` to `path` atomically (a temporary file beside it, renamed): a report, a config.
inline void write_file_atomically(const std::string& path, std::string_view text) {
  detail::TempFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

/// Writes a safetensors file whose tensor list is known before any data: the header first,
/// then each tensor's bytes in order — from memory, or copied from a span of another file
/// without passing through the heap. It holds the header, never the data; commit() makes the
/// file appear atomically, and nothing is left behind when it is not reached.
class FileWriter {
public:
  FileWriter(std::string path, std::vector<TensorSpec> tensors, const std::map<std::string, std::string>& metadata = {})
      : tensors_(std::move(tensors)), file_(std::move(path)) {
    const std::string header = detail::header_bytes(tensors_, metadata);
    file_.write(header.data(), header.size());
  }

  /// The next tensor's bytes, in the order given to the constructor.
  void write(const std::string& name, const void* data, std::size_t n) {
    next(name, n);
    if (n) file_.write(data, n);
    file_.start_writeback();
  }

  /// The next tensor's bytes, copied from [offset, offset + n) of the file `source`.
  void copy(const std::string& name, const std::string& source, std::size_t offset, std::size_t n) {
    next(name, n);
    if (n) file_.copy_from(source, offset, n);
    file_.start_writeback();
  }

  /// Name of the tensor to be written next (empty when all are).
  const std::string& expected() const {
    static const std::string none;
    return next_ < tensors_.size() ? tensors_[next_].name : none;
  }
  std::size_t bytes_written() const { return file_.written(); }

  void commit() {
    if (next_ != tensors_.size())
      throw ShapeError(bd::detail::message("safetensors writer: committed after ", next_, " of ", tensors_.size(),
                                           " tensors (next: '", tensors_[next_].name, "')"));
    file_.commit();
  }

private:
  void next(const std::string& name, std::size_t n) {
    using bd::detail::message;
    if (next_ >= tensors_.size()) throw ShapeError(message("safetensors writer: tensor '", name, "' is beyond the planned list"));
    const TensorSpec& t = tensors_[next_];
    if (t.name != name) throw ShapeError(message("safetensors writer: got tensor '", name, "', expected '", t.name, "' next"));
    if (t.bytes() != n)
      throw ShapeError(message("safetensors writer: tensor '", name, "' has ", n, " bytes, its header entry says ", t.bytes()));
    ++next_;
  }

  std::vector<TensorSpec> tensors_;
  std::size_t next_ = 0;
  detail::TempFile file_;
};

/// Builds a safetensors file in memory and writes it atomically (small files: tests, reports).
class Writer {
public:
  /// Adds raw little-endian bytes; their size must equal shape × dtype size.
  Writer& add_bytes(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                    std::vector<unsigned char> bytes) {
    TensorSpec spec{name, dtype, std::move(shape)};
    for (auto d : spec.shape)
      if (d < 0) throw ShapeError(bd::detail::message("tensor '", name, "': negative dimension ", d));
    if (spec.bytes() != bytes.size())
      throw ShapeError(bd::detail::message("tensor '", name, "': ", bytes.size(), " bytes for ", spec.bytes() / dtype_size(dtype),
                                           " elements of ", to_string(dtype)));
    if (name == "__metadata__" || !names_.insert(name).second)
      throw ShapeError(bd::detail::message("tensor '", name, "' added twice (or reserved name)"));
    entries_.push_back({std::move(spec), std::move(bytes)});
    return *this;
  }

  /// Adds a matrix stored as T (row-major on disk, shape [rows, cols]).
  template <typename T, typename Derived>
  Writer& add(const std::string& name, const Eigen::MatrixBase<Derived>& m) {
    const RowMajorCopy<T> rm = m.template cast<T>();
    return add_flat<T>(name, {static_cast<std::int64_t>(m.rows()), static_cast<std::int64_t>(m.cols())}, rm.data(),
                       static_cast<std::size_t>(rm.size()));
  }

  /// Adds a 1-D tensor [n] stored as T.
  template <typename T, typename Derived>
  Writer& add_vector(const std::string& name, const Eigen::MatrixBase<Derived>& v) {
    const Eigen::Matrix<T, Eigen::Dynamic, 1> values = v.template cast<T>();
    return add_flat<T>(name, {static_cast<std::int64_t>(values.size())}, values.data(), static_cast<std::size_t>(values.size()));
  }

  /// Adds a tensor of any shape from values in storage order.
  template <typename T>
  Writer& add_flat(const std::string& name, std::vector<std::int64_t> shape, const T* values, std::size_t count) {
    std::vector<unsigned char> bytes(count * sizeof(T));
    if (count) std::memcpy(bytes.data(), values, bytes.size());
    return add_bytes(name, dtype_of<T>(), std::move(shape), std::move(bytes));
  }

  std::size_t size() const { return entries_.size(); }

  Writer& set_metadata(const std::string& key, const std::string& value) {
    metadata_[key] = value;
    return *this;
  }

  std::vector<unsigned char> to_bytes() const {
    std::vector<TensorSpec> specs;
    for (const Entry& e : entries_) specs.push_back(e.spec);
    const std::string header = detail::header_bytes(specs, metadata_);
    std::vector<unsigned char> out(header.begin(), header.end());
    for (const Entry& e : entries_) out.insert(out.end(), e.bytes.begin(), e.bytes.end());
    return out;
  }

  /// Writes the file atomically (see detail::TempFile).
  void write(const std::string& path) const { write_atomically(path, to_bytes()); }

  static void write_atomically(const std::string& path, const std::vector<unsigned char>& bytes) {
    detail::TempFile file(path);
    file.write(bytes.data(), bytes.size());
    file.commit();
  }

private:
  template <typename T>
  using RowMajorCopy = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  struct Entry {
    TensorSpec spec;
    std::vector<unsigned char> bytes;
  };
  std::vector<Entry> entries_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace bd::io
