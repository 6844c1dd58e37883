// bd/io/atomic_file.hpp — files and folders that appear whole or not at all: written under a
// temporary name beside the target and renamed onto it at commit; removed when commit is not
// reached (an exception, a refusal). Every file bd writes goes through here.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
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

namespace bd::io {

namespace detail {

using bd::detail::message;

/// A file written under a temporary name beside `path` and renamed onto it by commit(): readers
/// see the old file or the complete new one, and a failure (or destruction before commit) leaves
/// nothing behind.
class TempFile {
public:
  explicit TempFile(std::string path) : path_(std::move(path)) {
#ifdef BD_IO_POSIX
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
#ifdef BD_IO_POSIX
    if (fd_ >= 0) ::close(fd_);
#else
    out_.close();
#endif
    std::remove(tmp_.c_str());
  }

  void write(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
#ifdef BD_IO_POSIX
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
#ifdef BD_IO_POSIX
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
#if defined(__linux__) && defined(BD_IO_POSIX)
    constexpr std::size_t chunk = std::size_t(64) << 20;
    if (written_ - flushed_ < chunk) return;
    ::sync_file_range(fd_, static_cast<off64_t>(flushed_), static_cast<off64_t>(written_ - flushed_), SYNC_FILE_RANGE_WRITE);
    flushed_ = written_;
#endif
  }

  /// Flushes to disk and renames onto the final path.
  void commit() {
#ifdef BD_IO_POSIX
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
#ifdef BD_IO_POSIX
  int fd_ = -1;
#else
  std::ofstream out_;
#endif
  std::size_t written_ = 0, flushed_ = 0;
  bool committed_ = false;
};

/// A temporary folder beside `path`, removed with its contents unless renamed onto `path`.
class TempFolder {
public:
  explicit TempFolder(const std::string& path) : path_(path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (fs::exists(path, ec))
      throw IoError(message(path, ": already exists; bd-convert does not overwrite a folder (remove it or choose another name)"));
    std::string tmpl = path + ".tmp.XXXXXX";
    std::vector<char> name(tmpl.begin(), tmpl.end());
    name.push_back('\0');
    if (!::mkdtemp(name.data())) throw IoError(message(path, ": cannot create a temporary folder beside it: ", std::strerror(errno)));
    tmp_ = name.data();
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  ~TempFolder() {
    if (committed_) return;
    std::error_code ec;
    std::filesystem::remove_all(tmp_, ec);
  }
  std::string file(const std::string& name) const { return tmp_ + "/" + name; }
  void commit() {
    ::chmod(tmp_.c_str(), 0755);
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      throw IoError(message(path_, ": renaming the temporary folder onto it failed: ", std::strerror(errno)));
    committed_ = true;
  }

private:
  std::string path_, tmp_;
  bool committed_ = false;
};

}  // namespace detail

/// Writes `text` to `path` atomically (a temporary file beside it, renamed): a report, a config.
inline void write_file_atomically(const std::string& path, std::string_view text) {
  detail::TempFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace bd::io
