// bd/base/error.hpp — the exceptions bd throws, and how their messages are built. The bottom
// layer: kernel, core and everything above include it; it includes nothing of bd.
//
// Every message names the argument, what was found and what was expected, so that a person
// can act on it without reading bd's source. All derive from bd::Error, itself a
// std::runtime_error, so `catch (const std::exception&)` sees them too.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

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

/// Builds a message from streamable pieces: bd::detail::message("rank ", r, " is ...").
template <typename... Parts>
std::string message(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

}  // namespace detail
}  // namespace bd
