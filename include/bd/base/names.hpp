// bd/base/names.hpp — an enumeration's words for users, spelled once: a table of (enumerator,
// name) from which its to_string, its parse, the list in a parse error ("expected a, b or c") and
// a command's usage text ("a|b|c") all come.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "bd/base/error.hpp"

namespace bd::detail {

template <typename E>
using Named = std::pair<E, const char*>;

/// The name of `e` in `table` ("?" for a value the table lacks).
template <typename E, std::size_t N>
constexpr const char* name_in(const Named<E> (&table)[N], E e) {
  for (const auto& entry : table)
    if (entry.first == e) return entry.second;
  return "?";
}

/// Every name in order: "a, b or c" by default, "a|b|c" with ("|", "|").
template <typename E, std::size_t N>
std::string names_in(const Named<E> (&table)[N], const char* separator = ", ", const char* last = " or ") {
  std::string out;
  for (std::size_t i = 0; i < N; ++i) {
    if (i > 0) out += i + 1 == N ? last : separator;
    out += table[i].second;
  }
  return out;
}

/// The entry named `name`, or nullptr: for callers whose refusal is not parse_in's.
template <typename E, std::size_t N>
constexpr const Named<E>* find_in(const Named<E> (&table)[N], std::string_view name) {
  for (const auto& entry : table)
    if (name == entry.second) return &entry;
  return nullptr;
}

/// The enumerator named `name`; RangeError "unknown <what> 'name': expected a, b or c" otherwise.
template <typename E, std::size_t N>
E parse_in(const Named<E> (&table)[N], std::string_view name, const char* what) {
  if (const Named<E>* entry = find_in(table, name)) return entry->first;
  throw RangeError(message("unknown ", what, " '", name, "': expected ", names_in(table)));
}

}  // namespace bd::detail
