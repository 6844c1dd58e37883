// bd/nn/bd_mode.hpp — what BD decomposes in an attention layer (Mode: QK, VO or both, each a
// product Family) and where its windows are chosen under grouped-query attention (Windows): the
// words a layer, the cost model, the checkpoint format and bd-convert share.
#pragma once

#include <string>

#include "bd/base/error.hpp"

namespace bd::nn {

/// Which products of an attention layer are decomposed.
enum class Mode { QK, VO, QKVO };

inline const char* to_string(Mode m) { return m == Mode::QK ? "qk" : m == Mode::VO ? "vo" : "qkvo"; }
inline Mode parse_mode(const std::string& s) {
  if (s == "qk") return Mode::QK;
  if (s == "vo") return Mode::VO;
  if (s == "qkvo") return Mode::QKVO;
  throw RangeError("unknown attention mode '" + s + "': expected qk, vo or qkvo");
}
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
  // bd 0.1's spellings, kept for one release:
  per_group [[deprecated("spelled Windows::PerGroup since bd 0.2")]] = PerGroup,
  per_head [[deprecated("spelled Windows::PerHead since bd 0.2")]] = PerHead,
};
inline const char* to_string(Windows w) { return w == Windows::PerGroup ? "per-group" : "per-head"; }
inline Windows parse_windows(const std::string& s) {
  if (s == "per-group") return Windows::PerGroup;
  if (s == "per-head") return Windows::PerHead;
  throw RangeError("unknown windows '" + s + "': expected per-group or per-head");
}

}  // namespace bd::nn
