// bd/cuda/projection.cuh — host side of the BD projection on a GPU, in CUTLASS's manner: the
// caller fills Arguments (device pointers, sizes, window offset), asks can_implement() for a
// reason if anything is unsupported, and run(stream) launches and reports the failed call.
//
//   BDProjection<T>        the tensor-core kernel (projection_kernel.cuh)
//   CublasBDProjection<T>  the same result through cuBLAS, as reference and fallback: broadcast
//                          the window into K', then K' += X[:, rest piece]·C[piece rows] with one
//                          cublasGemmEx per piece of rest (two when the window is in the middle).
//   CublasDense<T>         K = X·W with one cublasGemmEx: the dense baseline.
// T is __half or __nv_bfloat16; every matrix is row-major and every pointer is device memory.
//
// On cuBLASLt: its matmul D = α·A·B + β·C takes C and D as separate descriptors, so the window
// could in principle be C with ldc = d and a zero batch stride across heads, saving the
// broadcast pass. Whether its heuristics return an algorithm for a C whose layout differs from D's
// can only be asked of a GPU, and this code has not yet run on one; the fallback therefore uses
// plain cublasGemmEx with β = 1, which is certain to be supported.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bd/cuda/projection_kernel.cuh"
#include "bd/cuda/status.cuh"

namespace bd::cuda {

template <typename T>
struct DataType;
template <>
struct DataType<__half> {
  static constexpr cudaDataType_t value = CUDA_R_16F;
  static constexpr const char* name = "half";
};
template <>
struct DataType<__nv_bfloat16> {
  static constexpr cudaDataType_t value = CUDA_R_16BF;
  static constexpr const char* name = "bfloat16";
};

/// K' (rows × heads·head_dim) = X[:, window] + X[:, rest]·C for every head; see the file comment.
template <typename T>
struct ProjectionArguments {
  const T* x = nullptr;      ///< X, rows × input_dim
  const T* coeff = nullptr;  ///< C, (input_dim − head_dim) × heads·head_dim, rows in rest order
  T* out = nullptr;          ///< K', rows × heads·head_dim
  int rows = 0;              ///< L
  int input_dim = 0;         ///< d
  int head_dim = 0;          ///< d_h
  int heads = 0;             ///< n
  int window_offset = 0;     ///< o: the window is X[:, o : o + d_h]
};

namespace detail {

inline std::string describe(int value) { return std::to_string(value); }

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// Checks shared by every implementation: sizes in range, offsets and pointers as the 16-byte
/// accesses need them.
template <typename T>
Status check_arguments(const ProjectionArguments<T>& a, const char* who) {
  const std::string w = std::string(who) + ": ";
  if (a.rows < 0) return Status::failure(w + "rows = " + describe(a.rows) + ", expected ≥ 0");
  if (a.heads <= 0 || a.head_dim <= 0)
    return Status::failure(w + "heads = " + describe(a.heads) + ", head_dim = " + describe(a.head_dim) + ", expected both > 0");
  if (a.head_dim > a.input_dim)
    return Status::failure(w + "head_dim " + describe(a.head_dim) + " exceeds input_dim " + describe(a.input_dim));
  // offset > d − d_h, not offset + d_h > d: the sum overflows int for an offset near INT_MAX
  // (head_dim ≤ input_dim is checked above, so the difference cannot).
  if (a.window_offset < 0 || a.window_offset > a.input_dim - a.head_dim)
    return Status::failure(w + "window_offset " + describe(a.window_offset) + " puts the window outside [0, " +
                           describe(a.input_dim) + "); expected 0 ≤ offset ≤ input_dim − head_dim = " +
                           describe(a.input_dim - a.head_dim));
  if (a.input_dim % 8 || a.head_dim % 8 || a.window_offset % 8)
    return Status::failure(w + "input_dim " + describe(a.input_dim) + ", head_dim " + describe(a.head_dim) + " and window_offset " +
                           describe(a.window_offset) + " must be multiples of 8 (16-byte accesses)");
  if ((long long)a.heads * a.head_dim > INT32_MAX)
    return Status::failure(w + "heads·head_dim exceeds what 32-bit cuBLAS dimensions address");
  if (a.rows == 0) return Status::success();
  if (!a.x || !a.out || (!a.coeff && a.input_dim > a.head_dim)) return Status::failure(w + "a null device pointer (x, coeff or out)");
  if (!aligned16(a.x) || !aligned16(a.out) || (a.coeff && !aligned16(a.coeff)))
    return Status::failure(w + "x, coeff and out must be 16-byte aligned device pointers");
  return Status::success();
}

}  // namespace detail

/// The fused tensor-core kernel.
template <typename T>
class BDProjection {
public:
  using Arguments = ProjectionArguments<T>;

  /// Success, or why these arguments (or this device) cannot run the kernel.
  static Status can_implement(const Arguments& a) {
    Status s = detail::check_arguments(a, "BDProjection");
    if (!s) return s;
    const int cc = device_capability();
    if (cc == 0) return Status::failure("BDProjection: no CUDA device is present");
    if (cc < 80)
      return Status::failure("BDProjection: needs compute capability 8.0 or newer (mma.sync m16n8k16, cp.async); the device has " +
                             std::to_string(cc / 10) + "." + std::to_string(cc % 10));
    return Status::success();
  }

  /// Launches on `stream`; returns the launch's status (kernel faults surface at the next sync).
  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = can_implement(a);
    if (!s || a.rows == 0) return s;
    const int N = a.heads * a.head_dim;
    const dim3 grid((N + kernel::kTileCols - 1) / kernel::kTileCols, (a.rows + kernel::kTileRows - 1) / kernel::kTileRows);
    if (grid.y > 65535u) return Status::failure("BDProjection: rows " + std::to_string(a.rows) + " exceed 65535 row tiles of 128");
    kernel::bd_projection<T><<<grid, kernel::kThreads, 0, stream>>>(params(a));
    return check(cudaGetLastError(), "BDProjection: launching bd_projection");
  }

  static kernel::ProjectionParams params(const Arguments& a) {
    return {a.x, a.coeff, a.out, a.rows, a.input_dim, a.head_dim, a.heads, a.window_offset};
  }
};

/// The same result through cuBLAS (reference and fallback). The handle is borrowed.
template <typename T>
class CublasBDProjection {
public:
  using Arguments = ProjectionArguments<T>;
  explicit CublasBDProjection(cublasHandle_t handle) : handle_(handle) {}

  static Status can_implement(const Arguments& a) {
    Status s = detail::check_arguments(a, "CublasBDProjection");
    if (!s) return s;
    if (device_capability() == 0) return Status::failure("CublasBDProjection: no CUDA device is present");
    return Status::success();
  }

  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = can_implement(a);
    if (!s || a.rows == 0) return s;
    const int N = a.heads * a.head_dim, o = a.window_offset, right = a.input_dim - a.head_dim - o;
    const long long pairs = (long long)a.rows * N / 2;
    const int blocks = static_cast<int>(std::min<long long>((pairs + 255) / 256, 65535));
    kernel::broadcast_window<T><<<blocks, 256, 0, stream>>>(BDProjection<T>::params(a));
    if (!(s = check(cudaGetLastError(), "CublasBDProjection: launching broadcast_window"))) return s;
    if (!(s = check(cublasSetStream(handle_, stream), "CublasBDProjection: cublasSetStream"))) return s;
    // Column-major view: K'ᵀ (N × L, ld N) += Cᵀ[:, piece] (N × k, ld N) · Xᵀ[piece, :] (k × L, ld d).
    const float one = 1.0f;
    const auto gemm = [&](int k, const T* c_rows, const T* x_cols, const char* what) {
      if (k == 0) return Status::success();
      return check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, N, a.rows, k, &one, c_rows, DataType<T>::value, N, x_cols,
                                DataType<T>::value, a.input_dim, &one, a.out, DataType<T>::value, N, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   what);
    };
    if (!(s = gemm(o, a.coeff, a.x, "CublasBDProjection: cublasGemmEx (channels left of the window)"))) return s;
    return gemm(right, a.coeff + (long long)o * N, a.x + o + a.head_dim,
                "CublasBDProjection: cublasGemmEx (channels right of the window)");
  }

private:
  cublasHandle_t handle_;
};

/// K = X·W (rows × out_dim) with one cublasGemmEx, fp32 accumulation: the dense baseline.
template <typename T>
class CublasDense {
public:
  explicit CublasDense(cublasHandle_t handle) : handle_(handle) {}

  Status run(const T* x, const T* w, T* out, int rows, int input_dim, int out_dim, cudaStream_t stream = nullptr) const {
    if (rows < 0 || input_dim <= 0 || out_dim <= 0)
      return Status::failure("CublasDense: rows " + std::to_string(rows) + ", input_dim " + std::to_string(input_dim) +
                             ", out_dim " + std::to_string(out_dim) + ": expected rows ≥ 0 and positive widths");
    if (rows == 0) return Status::success();
    Status s = check(cublasSetStream(handle_, stream), "CublasDense: cublasSetStream");
    if (!s) return s;
    const float one = 1.0f, zero = 0.0f;
    return check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, out_dim, rows, input_dim, &one, w, DataType<T>::value, out_dim, x,
                              DataType<T>::value, input_dim, &zero, out, DataType<T>::value, out_dim, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "CublasDense: cublasGemmEx");
  }

private:
  cublasHandle_t handle_;
};

}  // namespace bd::cuda
