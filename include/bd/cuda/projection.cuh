// bd/cuda/projection.cuh — host side of the BD projection on a GPU, in CUTLASS's manner: the
// caller fills Arguments (device pointers, sizes, window offset), asks can_implement() for a
// reason if anything is unsupported, and run(stream) launches and reports the failed call.
//
//   BDProjection<T>        the tensor-core kernel (projection_kernel.cuh)
//   CublasBDProjection<T>  the same result through cuBLAS, as reference and fallback: broadcast
//                          the window into K', then K' += X[:, rest piece]·C[piece rows] with one
//                          cublasGemmEx per piece of rest (two when the window is in the middle).
//   CublasDense<T>         K = X·W with one cublasGemmEx: the dense baseline.
//   (CublasLtBDProjection<T>, the cuBLASLt path, is in cublaslt_projection.cuh; HopperBDProjection<T>,
//   the sm_90a wgmma/TMA kernel, in hopper_projection.cuh.)
// T is __half or __nv_bfloat16; every matrix is row-major and every pointer is device memory.
//
// Checks come in two kinds. check(args) looks only at the arguments (sizes, offsets, alignment,
// overlap, grid limits) and runs on the host without a device, which is how the cuda-host tests
// exercise every refusal. The device (present? sm_80?) is queried once, when an implementation is
// constructed; run() repeats only the argument check, so nothing queries the device per launch.
//
// Errors are attributed honestly: run() does not launch over an error the caller left pending
// (it would otherwise report it, and clear it, as its own), and a borrowed cuBLAS handle gets its
// caller's stream back when run() returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bd/cuda/device.cuh"
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

inline std::string describe(long long value) { return std::to_string(value); }

inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(a), q = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && p < q + b_bytes && q < p + a_bytes;
}

/// Checks shared by every implementation, on the arguments alone (no device query): sizes in range,
/// offsets and pointers as the 16-byte accesses need them, out not overlapping what it is computed from.
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
  const long long N = (long long)a.heads * a.head_dim;
  if (N > INT32_MAX) return Status::failure(w + "heads·head_dim = " + describe(N) + " exceeds what 32-bit dimensions address");
  if (a.rows == 0) return Status::success();
  if (!a.x || !a.out || (!a.coeff && a.input_dim > a.head_dim)) return Status::failure(w + "a null device pointer (x, coeff or out)");
  if (!aligned16(a.x) || !aligned16(a.out) || (a.coeff && !aligned16(a.coeff)))
    return Status::failure(w + "x, coeff and out must be 16-byte aligned device pointers");
  const std::size_t out_bytes = std::size_t(a.rows) * std::size_t(N) * sizeof(T);
  if (overlap(a.out, out_bytes, a.x, std::size_t(a.rows) * std::size_t(a.input_dim) * sizeof(T)))
    return Status::failure(w + "out overlaps x; K' must be written to a separate buffer");
  if (overlap(a.out, out_bytes, a.coeff, std::size_t(a.input_dim - a.head_dim) * std::size_t(N) * sizeof(T)))
    return Status::failure(w + "out overlaps coeff; K' must be written to a separate buffer");
  return Status::success();
}

/// The check of a planned implementation's run(): arguments of the shape plan() was given.
template <typename T>
Status check_planned(const ProjectionArguments<T>& a, const ProjectionArguments<T>& planned, bool is_planned, const char* who) {
  if (is_planned && a.rows == planned.rows && a.input_dim == planned.input_dim && a.head_dim == planned.head_dim &&
      a.heads == planned.heads && a.window_offset == planned.window_offset)
    return Status::success();
  return Status::failure(std::string(who) + ": run() with a shape plan() was not given; call plan() for rows " + describe(a.rows) +
                         ", input_dim " + describe(a.input_dim) + ", head_dim " + describe(a.head_dim) + ", heads " +
                         describe(a.heads) + ", window_offset " + describe(a.window_offset) + " first");
}

/// The device check every implementation makes against the DeviceInfo it cached.
inline Status check_device(const DeviceInfo& device, int min_capability, const char* who, const char* needs) {
  if (!device.present()) return Status::failure(std::string(who) + ": no CUDA device is present");
  if (device.capability < min_capability)
    return Status::failure(std::string(who) + ": needs compute capability " + describe(min_capability / 10) + "." +
                           describe(min_capability % 10) + " or newer (" + needs + "); the device has " + device.capability_text());
  return Status::success();
}

/// Refuses to launch while an error the caller left is pending: a launch checked afterwards with
/// cudaGetLastError would report that error as its own and clear it from the caller's sight.
inline Status no_pending_error(const char* who) {
  const cudaError_t pending = cudaPeekAtLastError();
  if (pending == cudaSuccess) return Status::success();
  return Status::failure(std::string(who) + ": not launched: a CUDA error from before this call is pending (" +
                         cudaGetErrorName(pending) + ": " + cudaGetErrorString(pending) +
                         "); read and clear it with cudaGetLastError() first");
}

/// Launches `kernel(params)` and returns this launch's own status (cudaLaunchKernel reports it
/// directly; the error state it also sets is consumed, since it is ours).
template <typename Kernel>
Status launch(Kernel* kernel, dim3 grid, dim3 block, kernel::ProjectionParams params, cudaStream_t stream, const char* what) {
  void* args[] = {&params};
  const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, 0, stream);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return check(e, what);
}

/// Points a borrowed cuBLAS handle at `stream` for one call, with reductions in fp32, and gives the
/// caller's stream and math mode back. cuBLAS's default math mode lets a split-K GEMM add its
/// partial sums in the output type (half or bfloat16);
/// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION keeps them in the compute type (fp32), for
/// the BD paths and the dense baseline alike.
class HandleScope {
public:
  HandleScope(cublasHandle_t handle, cudaStream_t stream, const char* who) : handle_(handle) {
    const std::string w(who);
    status_ = check(cublasGetStream(handle_, &saved_stream_), (w + ": cublasGetStream").c_str());
    if (status_) status_ = check(cublasGetMathMode(handle_, &saved_mode_), (w + ": cublasGetMathMode").c_str());
    if (status_) {
      status_ = check(cublasSetStream(handle_, stream), (w + ": cublasSetStream").c_str());
      restore_stream_ = status_.ok();
    }
    if (status_) {
      const auto mode = static_cast<cublasMath_t>(saved_mode_ | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
      status_ = check(cublasSetMathMode(handle_, mode), (w + ": cublasSetMathMode").c_str());
      restore_mode_ = status_.ok();
    }
  }
  ~HandleScope() {
    if (restore_mode_) (void)cublasSetMathMode(handle_, saved_mode_);
    if (restore_stream_) (void)cublasSetStream(handle_, saved_stream_);
  }
  HandleScope(const HandleScope&) = delete;
  HandleScope& operator=(const HandleScope&) = delete;
  const Status& status() const { return status_; }

private:
  cublasHandle_t handle_;
  cudaStream_t saved_stream_ = nullptr;
  cublasMath_t saved_mode_ = CUBLAS_DEFAULT_MATH;
  bool restore_stream_ = false, restore_mode_ = false;
  Status status_ = Status::success();
};

inline kernel::ProjectionParams params_of(const void* x, const void* coeff, void* out, int rows, int input_dim, int head_dim,
                                          int heads, int offset) {
  return {x, coeff, out, rows, input_dim, head_dim, heads, offset};
}

/// The window broadcast into every head's columns of K' (the cuBLAS paths' first step).
template <typename T>
Status broadcast(const ProjectionArguments<T>& a, cudaStream_t stream, const char* what) {
  const long long pairs = (long long)a.rows * a.heads * a.head_dim / 2;
  const unsigned blocks = static_cast<unsigned>(std::min<long long>((pairs + 255) / 256, 65535));
  return launch(&kernel::broadcast_window<T>, dim3(blocks), dim3(256),
                params_of(a.x, a.coeff, a.out, a.rows, a.input_dim, a.head_dim, a.heads, a.window_offset), stream, what);
}

}  // namespace detail

/// The fused tensor-core kernel.
template <typename T>
class BDProjection {
public:
  using Arguments = ProjectionArguments<T>;

  /// Queries the current device once; run() launches on it.
  BDProjection() : device_(DeviceInfo::current()) {}

  /// The argument checks alone, with no device query: sizes, offsets, alignment, overlap, and the
  /// launch grid (at most 65535 row tiles of 128).
  static Status check(const Arguments& a) {
    Status s = detail::check_arguments(a, "BDProjection");
    if (!s) return s;
    const kernel::Grid grid = kernel::grid_for(a.rows, a.heads * a.head_dim);
    if (grid.y > kernel::kMaxGridY)
      return Status::failure("BDProjection: rows = " + detail::describe(a.rows) + " need " + detail::describe(grid.y) +
                             " row tiles of " + detail::describe(kernel::kTileRows) + "; the grid allows " +
                             detail::describe(kernel::kMaxGridY) + " (split the rows into several calls)");
    return Status::success();
  }

  /// Success, or why these arguments or this device cannot run the kernel.
  Status can_implement(const Arguments& a) const {
    Status s = check(a);
    if (!s) return s;
    return detail::check_device(device_, 80, "BDProjection", "mma.sync m16n8k16, cp.async");
  }

  /// Launches on `stream`; returns the launch's status (kernel faults surface at the next sync).
  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = can_implement(a);
    if (!s || a.rows == 0) return s;
    if (!(s = detail::no_pending_error("BDProjection"))) return s;
    const kernel::Grid grid = kernel::grid_for(a.rows, a.heads * a.head_dim);
    return detail::launch(&kernel::bd_projection<T>, dim3(unsigned(grid.x), unsigned(grid.y)), dim3(kernel::kThreads), params(a),
                          stream, "BDProjection: launching bd_projection");
  }

  static kernel::ProjectionParams params(const Arguments& a) {
    return detail::params_of(a.x, a.coeff, a.out, a.rows, a.input_dim, a.head_dim, a.heads, a.window_offset);
  }

  const DeviceInfo& device() const { return device_; }

private:
  DeviceInfo device_;
};

/// The same result through cuBLAS (reference and fallback). The handle is borrowed: its stream and
/// math mode are set for each run and restored after. When the window sits in the middle of X the
/// rest is two pieces, two GEMMs accumulating into K'. cuBLAS's GEMM with C = D was seen (H100,
/// CUDA 13.0) to round like round(round(A·B) + C), so each piece adds a rounding of its product
/// and of its sum: this path is a reference, not the exact one (the fused kernel and cuBLASLt's
/// gathered call round K' once).
template <typename T>
class CublasBDProjection {
public:
  using Arguments = ProjectionArguments<T>;
  explicit CublasBDProjection(cublasHandle_t handle) : handle_(handle), device_(DeviceInfo::current()) {}

  static Status check(const Arguments& a) { return detail::check_arguments(a, "CublasBDProjection"); }

  Status can_implement(const Arguments& a) const {
    Status s = check(a);
    if (!s) return s;
    return detail::check_device(device_, 0, "CublasBDProjection", "");
  }

  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = can_implement(a);
    if (!s || a.rows == 0) return s;
    if (!(s = detail::no_pending_error("CublasBDProjection"))) return s;
    if (!(s = detail::broadcast(a, stream, "CublasBDProjection: launching broadcast_window"))) return s;
    const detail::HandleScope on_stream(handle_, stream, "CublasBDProjection");
    if (!on_stream.status()) return on_stream.status();
    // Column-major view: K'ᵀ (N × L, ld N) += Cᵀ[:, piece] (N × k, ld N) · Xᵀ[piece, :] (k × L, ld d).
    const int N = a.heads * a.head_dim, o = a.window_offset, right = a.input_dim - a.head_dim - o;
    const float one = 1.0f;
    const auto gemm = [&](int k, const T* c_rows, const T* x_cols, const char* what) {
      if (k == 0) return Status::success();
      return bd::cuda::check(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, N, a.rows, k, &one, c_rows, DataType<T>::value, N,
                                          x_cols, DataType<T>::value, a.input_dim, &one, a.out, DataType<T>::value, N,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             what);
    };
    if (!(s = gemm(o, a.coeff, a.x, "CublasBDProjection: cublasGemmEx (channels left of the window)"))) return s;
    return gemm(right, a.coeff + (long long)o * N, a.x + o + a.head_dim,
                "CublasBDProjection: cublasGemmEx (channels right of the window)");
  }

private:
  cublasHandle_t handle_;
  DeviceInfo device_;
};

/// K = X·W (rows × out_dim) with one cublasGemmEx, fp32 accumulation: the dense baseline. The
/// handle is borrowed, as for CublasBDProjection.
template <typename T>
class CublasDense {
public:
  explicit CublasDense(cublasHandle_t handle) : handle_(handle) {}

  Status run(const T* x, const T* w, T* out, int rows, int input_dim, int out_dim, cudaStream_t stream = nullptr) const {
    if (rows < 0 || input_dim <= 0 || out_dim <= 0)
      return Status::failure("CublasDense: rows " + std::to_string(rows) + ", input_dim " + std::to_string(input_dim) +
                             ", out_dim " + std::to_string(out_dim) + ": expected rows ≥ 0 and positive widths");
    if (rows == 0) return Status::success();
    const detail::HandleScope on_stream(handle_, stream, "CublasDense");
    if (!on_stream.status()) return on_stream.status();
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
