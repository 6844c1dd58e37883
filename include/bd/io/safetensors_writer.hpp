// bd/io/safetensors_writer.hpp — writes safetensors files (the format: bd/io/safetensors.hpp),
// atomically: streamed, header first, by FileWriter; built in memory by Writer.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "bd/base/error.hpp"
#include "bd/io/atomic_file.hpp"
#include "bd/io/dtype.hpp"

namespace bd::io {

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

}  // namespace detail

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
