// bd/nn/bd_mode.hpp — what BD decomposes in an attention layer (Mode: QK, VO or both, each a
// product Family) and where its windows are chosen under grouped-query attention (Windows): the
// words a layer, the cost model, the checkpoint format and bd-convert share.
#pragma once

#include <string>

#include "bd/base/error.hpp"
#include "bd/base/names.hpp"

namespace bd::nn {

/// Which products of an attention layer are decomposed.
enum class Mode { QK, VO, QKVO };

inline constexpr bd::detail::Named<Mode> mode_names[] = {{Mode::QK, "qk"}, {Mode::VO, "vo"}, {Mode::QKVO, "qkvo"}};
inline const char* to_string(Mode m) { return bd::detail::name_in(mode_names, m); }
inline Mode parse_mode(const std::string& s) { return bd::detail::parse_in(mode_names, s, "attention mode"); }
inline bool has_qk(Mode m) { return m != Mode::VO; }
inline bool has_vo(Mode m) { return m != Mode::QK; }

/// One product family of a layer: Wq·Wkᵀ (QK) or Wv·Wo (VO).
enum class Family { QK, VO };

/// Where BD's windows are chosen under grouped-query attention (n_q query heads on n_kv
/// key/value heads). PerGroup: one window and one C per key/value group, so K'/V' have n_kv
/// heads and the cache is the dense layer's (each query head keeps its own basis); PerHead: a
/// window per query head, K'/V' with n_q heads. The same for MHA (n_q = n_kv).
enum class Windows {
  PerGroup, PerHead,
};
inline constexpr bd::detail::Named<Windows> windows_names[] = {{Windows::PerGroup, "per-group"}, {Windows::PerHead, "per-head"}};
inline const char* to_string(Windows w) { return bd::detail::name_in(windows_names, w); }
inline Windows parse_windows(const std::string& s) { return bd::detail::parse_in(windows_names, s, "windows"); }

}  // namespace bd::nn
