// bd/base/error.hpp — the exceptions bd throws, and how their messages are built. The bottom
// layer: kernel, core and everything above include it; it includes nothing of bd.
//
// Every message names the argument, what was found and what was expected, so that a person
// can act on it without reading bd's source. All derive from bd::Error, itself a
// std::runtime_error, so `catch (const std::exception&)` sees them too.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace bd {

/// Base of every bd exception.
class Error : public std::runtime_error {
public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A matrix or vector has the wrong shape, or shapes disagree with each other.
class ShapeError : public Error { using Error::Error; };
/// A rank, an alignment, an index or another integer argument is out of its range.
class RangeError : public Error { using Error::Error; };
/// An input holds NaN or Inf, or a value overflows the storage type.
class NonFiniteError : public Error { using Error::Error; };
/// The chosen basis block is singular or numerically rank-deficient (for example a zero head).
class SingularBasisError : public Error { using Error::Error; };
/// A transformation is refused because it is not exact for this model (for example QK under RoPE)
/// or because the cost model says it makes the model slower or its cache larger.
class RefusedError : public Error { using Error::Error; };
/// A file is malformed, truncated or hostile.
class FormatError : public Error { using Error::Error; };
/// A file or folder cannot be opened, read, written or renamed (a missing path, permissions, a
/// full disk): the operating system's reason is in the message.
class IoError : public Error { using Error::Error; };

namespace detail {

/// One piece of a message: text, or a number written as `std::ostream`'s defaults write it
/// (integers in decimal, floating point as "%g", six significant digits; bool as 1 or 0; a char
/// as itself). Numbers are written into the piece itself, so building one allocates nothing.
class MessagePart {
public:
  MessagePart(const char* text) : text_(text) {}
  MessagePart(const std::string& text) : text_(text) {}
  MessagePart(std::string_view text) : text_(text) {}
  MessagePart(char c) : text_(digits_, 1) { digits_[0] = c; }
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, char>, int> = 0>
  MessagePart(T value) {
    if constexpr (std::is_signed_v<T>) {
      write("%lld", static_cast<long long>(value));
    } else {
      write("%llu", static_cast<unsigned long long>(value));
    }
  }
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  MessagePart(T value) {
    if constexpr (std::is_same_v<T, long double>) {
      write("%Lg", value);
    } else {
      write("%g", static_cast<double>(value));
    }
  }
  MessagePart(const MessagePart&) = delete;
  MessagePart& operator=(const MessagePart&) = delete;

  std::string_view text() const { return text_; }

private:
  template <typename N>
  void write(const char* format, N value) {
    const int n = std::snprintf(digits_, sizeof digits_, format, value);
    text_ = std::string_view(digits_, n < 0 ? 0 : static_cast<std::size_t>(n));
  }
  char digits_[48];
  std::string_view text_;
};

/// The pieces, joined: one function for every message, whatever its pieces' types.
inline std::string join_message(std::initializer_list<std::string_view> pieces) {
  std::size_t length = 0;
  for (std::string_view piece : pieces) length += piece.size();
  std::string joined;
  joined.reserve(length);
  for (std::string_view piece : pieces) joined.append(piece.data(), piece.size());
  return joined;
}

/// Builds a message from pieces: bd::detail::message("rank ", r, " is ..."). Each piece is text
/// or a number (MessagePart); the pieces' types reach no code but MessagePart's constructors, so
/// a message costs its call site a few instructions rather than a stream per combination of types.
template <typename... Parts>
std::string message(const Parts&... parts) {
  return join_message({MessagePart(parts).text()...});
}

}  // namespace detail
}  // namespace bd
