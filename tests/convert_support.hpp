// Support for the conversion tests: a GPT-2 checkpoint folder with random weights, and the
// documented format's forward computed from a converted file by its rule alone (defined in
// convert_support.cpp, compiled once per build: see support.hpp).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <bd/io/convert.hpp>

#include "nn_support.hpp"

namespace bd_test_convert {

namespace fs = std::filesystem;
using bd::io::SafeTensors;


constexpr Eigen::Index kD = 48, kHeads = 4, kHeadDim = 12, kLayers = 2;

/// A GPT-2 checkpoint folder: config.json and model.safetensors (Conv1D weights [in, out]).
struct Gpt2Folder {
  fs::path dir;
  std::vector<bd::nn::MultiHeadAttention<double>> layers;  // the dense attention, for the oracle

  explicit Gpt2Folder(const std::string& name, bool poison = false);
};

bd::io::ConvertOptions options(bd::nn::Mode mode, const std::string& dtype = "f32");

/// X[:, idx_h] + X[:, other channels ascending]·coeff[:, h·d:(h+1)·d], straight from the format spec.
Eigen::MatrixXd bd_projection(const Eigen::MatrixXd& X, const Eigen::MatrixXd& coeff, const std::vector<double>& indices,
                              Eigen::Index heads, Eigen::Index d);

/// One attention layer's output computed from a converted file by the documented rule alone
/// (nothing from bd's operator classes but the softmax core): Q' = X·basis + bias, K'/V' by
/// bd_projection, y = softmax(Q'·K'ᵀ/√d_h)·V'·bd_vo.basis + bd_vo.bias.
Eigen::MatrixXd forward_from_file(const SafeTensors& st, const std::string& P, const Eigen::MatrixXd& X, bool causal);

/// Splits DIR/model.safetensors into `shards` files (tensors dealt round-robin in data order,
/// so a layer's tensors straddle shards) and writes model.safetensors.index.json.
void shard_folder(const fs::path& dir, int shards);

}  // namespace bd_test_convert
