// examples/synthetic_deepseek.hpp — synthetic attention weights at DeepSeek's published shapes,
// for the demonstrations (deepseek_demo, bd-convert --demo) and benchmarks that need a model's
// sizes without its checkpoint: demo data, not part of the library's headers.
//
// DeepSeek-V2-Lite's exact shapes (hidden 2048, 16 heads,
// kv_lora_rank 512, qk_nope_head_dim 128, v_head_dim 128, 27 layers). K and V come from the
// 512-wide latent c, so per head QK is Wq_h (2048×128)·W_uk,hᵀ (128×512) and VO is
// W_uv,h (512×128)·Wo_h (128×2048). Gaussian entries with the usual 1/sqrt(fan_in) scale.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include <Eigen/Core>

namespace synthetic {

struct DeepSeekV2Lite {
  static constexpr int layers = 27, heads = 16, hidden = 2048, latent = 512, head_dim = 128;
};

struct AttentionLayerFactors {
  std::vector<Eigen::MatrixXf> q, uk;  // QK: W = q[h]·uk[h]ᵀ (hidden × latent)
  std::vector<Eigen::MatrixXf> uv, o;  // VO: W = uv[h]·o[h]ᵀ (latent × hidden)
};

inline Eigen::MatrixXf gaussian(Eigen::Index rows, Eigen::Index cols, float scale, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  return Eigen::MatrixXf::NullaryExpr(rows, cols, [&]() { return normal(rng); });
}

/// DeepSeek-V3/R1 (config.json of deepseek-ai/DeepSeek-V3): 61 layers, 128 heads, hidden 7168,
/// q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, v_head_dim 128. With the query LoRA,
/// QK per head is W_qb,h (1536×128, from the normalised query latent)·W_uk,hᵀ.
struct DeepSeekV3 {
  static constexpr int layers = 61, heads = 128, hidden = 7168, q_lora = 1536, latent = 512, head_dim = 128;
};

/// One layer of synthetic weights: per head q (query side × d_h; the query side is `hidden`
/// without a query LoRA, `q_lora` with one), uk, uv (latent × d_h) and o (hidden × d_h),
/// Gaussian with the usual 1/sqrt(fan_in) scale, seeded by `seed` + layer.
inline AttentionLayerFactors synthetic_layer_of(int heads, int query, int hidden, int latent, int head_dim,
                                                unsigned seed) {
  std::mt19937_64 rng(seed);
  AttentionLayerFactors f;
  for (int h = 0; h < heads; ++h) {
    f.q.push_back(gaussian(query, head_dim, 1.0f / std::sqrt(float(query)), rng));
    f.uk.push_back(gaussian(latent, head_dim, 1.0f / std::sqrt(float(latent)), rng));
    f.uv.push_back(gaussian(latent, head_dim, 1.0f / std::sqrt(float(latent)), rng));
    f.o.push_back(gaussian(hidden, head_dim, 1.0f / std::sqrt(float(head_dim * heads)), rng));
  }
  return f;
}

/// One layer at V3's shapes (q holds W_qb,h: the query side is q_lora wide).
inline AttentionLayerFactors synthetic_v3_layer(unsigned layer) {
  using S = DeepSeekV3;
  return synthetic_layer_of(S::heads, S::q_lora, S::hidden, S::latent, S::head_dim, 5000 + layer);
}

inline AttentionLayerFactors synthetic_layer(unsigned layer) {
  using S = DeepSeekV2Lite;
  return synthetic_layer_of(S::heads, S::hidden, S::hidden, S::latent, S::head_dim, 1000 + layer);
}

}  // namespace synthetic
