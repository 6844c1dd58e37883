// bd_make_checkpoint — writes the synthetic DeepSeek-shaped checkpoint of synthetic_checkpoint.hpp.
//
//   bd_make_checkpoint OUT_DIR [--small | --v3] [--q-lora N] [--layers N] [--shards N]
//
// Default: DeepSeek-V2-Lite's attention at full size (3.45 GB of bf16); --small: a few MB of the
// same structure; --v3: DeepSeek-V3's attention at full size (2 layers unless --layers, one
// shard); --q-lora N: a query LoRA of rank N instead of q_proj.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "synthetic_checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [--small | --v3] [--q-lora N] [--layers N] [--shards N]\n", argv[0]);
    return 2;
  }
  bd_bench::SyntheticCheckpoint c;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    const bool value = i + 1 < argc;
    if (a == "--small") {
      const int q = c.q_lora;
      c = bd_bench::SyntheticCheckpoint::small(q);
    } else if (a == "--v3") {
      c = bd_bench::SyntheticCheckpoint::v3(2);
    } else if (a == "--q-lora" && value) c.q_lora = std::atoi(argv[++i]);
    else if (a == "--layers" && value) c.layers = std::atoi(argv[++i]);
    else if (a == "--shards" && value) c.shards = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (c.layers < 1 || c.shards < 1 || c.shards > c.layers || c.q_lora < 0) {
    std::fprintf(stderr, "--layers, --shards must be positive (shards ≤ layers), --q-lora ≥ 0\n");
    return 2;
  }
  const auto bytes = c.write(argv[1]);
  std::printf("wrote %s: %d layers in %d shards, %.1f MB\n", argv[1], c.layers, c.shards, double(bytes) / 1e6);
  return 0;
}
