// bd/nn/types.hpp — the matrix types every layer speaks, named once: activations in A (float or
// double) and weights stored in S (float, double, Eigen::half, Eigen::bfloat16).
#pragma once

#include <Eigen/Core>

#include "bd/base/index.hpp"
#include "bd/base/workspace.hpp"

namespace bd::nn {

using bd::Index;

/// Every layer call that runs kernels takes, last, the workspace they keep their buffers in
/// (packing space, attention's scratch): a server gives each worker its own; a call given none
/// uses the process's default_workspace(). Internal steps take it without a default, so that
/// nothing below a layer's call falls back to the process's workspace by omission.
using bd::default_workspace;
using bd::Workspace;

/// Activations: L × width, column-major, in the compute type A.
template <typename A>
using MatrixA = Eigen::Matrix<A, Eigen::Dynamic, Eigen::Dynamic>;

/// A read-only view of activations where they lie (a block, a cache's rows).
template <typename A>
using ConstRef = Eigen::Ref<const MatrixA<A>>;

/// Weights and biases as stored: in S, converted to A while a kernel packs them.
template <typename S>
using StoredMatrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
template <typename S>
using StoredVector = Eigen::Matrix<S, Eigen::Dynamic, 1>;

/// Activations a layer keeps in its Workspace between calls: the attention forward's Q, K, V and
/// O (64 MB each for DeepSeek-V3's layer over 1024 tokens). Fresh matrices that large are mapped
/// by the allocator on every call (above glibc's largest mmap threshold, 32 MiB) and faulted in
/// page by page, while this buffer only grows. take() hands out
/// rows × cols of it, uninitialised, valid until its next take().
template <typename A>
class ScratchMatrix {
public:
  Eigen::Map<MatrixA<A>> take(Index rows, Index cols) {
    return Eigen::Map<MatrixA<A>>(buffer_.reserve(static_cast<std::size_t>(rows * cols)), rows, cols);
  }

private:
  ScratchBuffer<A> buffer_;
};

}  // namespace bd::nn
