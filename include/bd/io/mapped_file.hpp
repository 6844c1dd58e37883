// bd/io/mapped_file.hpp — the bytes of a file, memory-mapped read-only (a buffer where there is
// no mmap), with the pages of a span droppable once read: how bd streams model files.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "bd/base/error.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifndef BD_IO_POSIX
#define BD_IO_POSIX 1
#endif
#endif

namespace bd::io::detail {

using bd::detail::message;

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
#ifdef BD_IO_POSIX
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
#ifdef BD_IO_POSIX
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
#ifdef BD_IO_POSIX
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

}  // namespace bd::io::detail
