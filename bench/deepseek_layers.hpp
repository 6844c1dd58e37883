// The synthetic DeepSeek layers the preparation benchmarks share (bench_prepare.cpp,
// bench_prepare_floor.cpp): made once per process (all 27 layers of V2-Lite hold about 1 GiB).
#pragma once

#include <vector>

#include "synthetic_deepseek.hpp"  // demo data (examples/)

namespace bd_bench {

/// All 27 layers of a synthetic DeepSeek-V2-Lite (exact shapes).
inline const std::vector<synthetic::AttentionLayerFactors>& v2_lite_layers() {
  static const auto layers = [] {
    std::vector<synthetic::AttentionLayerFactors> out;
    for (int l = 0; l < synthetic::DeepSeekV2Lite::layers; ++l) out.push_back(synthetic::synthetic_layer(l));
    return out;
  }();
  return layers;
}

/// One layer of a synthetic DeepSeek-V3 (128 heads; the query side is the q LoRA latent).
inline const std::vector<synthetic::AttentionLayerFactors>& v3_layer() {
  static const std::vector<synthetic::AttentionLayerFactors> layers{synthetic::synthetic_v3_layer(0)};
  return layers;
}

}  // namespace bd_bench
