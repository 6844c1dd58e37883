// bd/cuda/cublaslt_projection.cuh — the BD projection on NVIDIA's own GEMM kernels (cuBLASLt,
// wgmma/TMA on Hopper), with the window folded into the GEMM's C input instead of a broadcast pass:
//
//     D_h = X[:, piece]·C_h[piece rows] + X[:, window]      for every head h, one batched call,
//
// in cuBLASLt's column-major view D_hᵀ (d_h × L, ld n·d_h, batch stride d_h) =
// C_hᵀ (d_h × k, ld n·d_h, batch stride d_h) · X_pieceᵀ (k × L, ld d, batch stride 0)
// + windowᵀ (d_h × L, ld d, batch stride 0). C and D are separate descriptors in cublasLtMatmul,
// so the window can be C with its own leading dimension and a zero batch stride. When the window
// sits in the middle of X, the rest has two pieces: the second call accumulates in place (C = D).
//
// Whether cuBLASLt's heuristics return an algorithm for a stride-0 C whose layout differs from D's
// is asked once, in plan(); if they return none, the plan falls back to broadcasting the window
// into K' (one small kernel) and accumulating every piece in place, and plan_summary() says which.
// T is __half or __nv_bfloat16; fp32 accumulation; row-major device matrices as in projection.cuh.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <cublasLt.h>

#include "bd/cuda/projection.cuh"

namespace bd::cuda {

template <typename T>
class CublasLtBDProjection {
public:
  using Arguments = ProjectionArguments<T>;

  /// `handle` and `workspace` (device memory, may be null with 0 bytes) are borrowed. cuBLASLt
  /// offers more algorithms with a workspace; NVIDIA suggests 32 MiB on Hopper.
  CublasLtBDProjection(cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes), device_(DeviceInfo::current()) {}

  static Status check(const Arguments& a) { return detail::check_arguments(a, "CublasLtBDProjection"); }

  /// Builds the descriptors and asks the heuristics for one algorithm per call this shape needs:
  /// once per shape, outside any timed loop. run() then accepts arguments of the same rows,
  /// input_dim, head_dim, heads and window_offset, with any (valid) pointers.
  Status plan(const Arguments& a) {
    calls_.clear();
    planned_ = false;
    Status s = check(a);
    if (!s) return s;
    if (!(s = detail::check_device(device_, 0, "CublasLtBDProjection", ""))) return s;
    shape_ = a;
    if (a.rows == 0) {  // cuBLASLt has no layout for zero columns, and there is nothing to compute
      summary_ = "no rows: nothing to compute";
      broadcast_ = false;
      planned_ = true;
      return Status::success();
    }
    const int o = a.window_offset, right = a.input_dim - a.head_dim - o;
    // The pieces of rest: channels [0, o) with coefficient rows [0, o), and channels
    // [o + d_h, d) with rows [o, d − d_h).
    struct Piece {
      int k, coeff_row, channel;
    };
    std::vector<Piece> pieces;
    if (o > 0) pieces.push_back({o, 0, 0});
    if (right > 0) pieces.push_back({right, o, o + a.head_dim});
    broadcast_ = pieces.empty();
    if (!pieces.empty()) {
      Call first;
      s = make_call(a, pieces[0].k, pieces[0].coeff_row, pieces[0].channel, /*window_as_c=*/true, first);
      if (s) {
        calls_.push_back(std::move(first));
        summary_ = "window as cuBLASLt's C input (batch stride 0): accepted by the heuristics";
      } else {
        broadcast_ = true;
        summary_ = "window as cuBLASLt's C input refused (" + s.message() + "); window broadcast, then every piece in place";
      }
    } else {
      summary_ = "the window is all of X: the window broadcast alone";
    }
    for (std::size_t i = broadcast_ ? 0 : 1; i < pieces.size(); ++i) {
      Call call;
      if (!(s = make_call(a, pieces[i].k, pieces[i].coeff_row, pieces[i].channel, /*window_as_c=*/false, call))) {
        calls_.clear();
        return s;
      }
      calls_.push_back(std::move(call));
    }
    planned_ = true;
    return Status::success();
  }

  /// Runs the planned calls on `stream`.
  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = check(a);
    if (!s) return s;
    if (!planned_ || a.rows != shape_.rows || a.input_dim != shape_.input_dim || a.head_dim != shape_.head_dim ||
        a.heads != shape_.heads || a.window_offset != shape_.window_offset)
      return Status::failure("CublasLtBDProjection: run() with a shape plan() was not given; call plan() for rows " +
                             detail::describe(a.rows) + ", input_dim " + detail::describe(a.input_dim) + ", head_dim " +
                             detail::describe(a.head_dim) + ", heads " + detail::describe(a.heads) + ", window_offset " +
                             detail::describe(a.window_offset) + " first");
    if (a.rows == 0) return Status::success();
    if (!(s = detail::no_pending_error("CublasLtBDProjection"))) return s;
    if (broadcast_ && !(s = detail::broadcast(a, stream, "CublasLtBDProjection: launching broadcast_window"))) return s;
    const float one = 1.0f;
    const long long N = (long long)a.heads * a.head_dim;
    for (const Call& call : calls_) {
      const void* c_input = call.window_as_c ? static_cast<const void*>(a.x + a.window_offset) : static_cast<const void*>(a.out);
      s = bd::cuda::check(cublasLtMatmul(handle_, call.op.get(), &one, a.coeff + (long long)call.coeff_row * N, call.a.get(),
                                         a.x + call.channel, call.b.get(), &one, c_input, call.c.get(), a.out, call.d.get(),
                                         &call.algo, workspace_, workspace_bytes_, stream),
                          call.window_as_c ? "CublasLtBDProjection: cublasLtMatmul (first piece, window as C)"
                                           : "CublasLtBDProjection: cublasLtMatmul (piece accumulated in place)");
      if (!s) return s;
    }
    return Status::success();
  }

  /// What plan() chose, and whether cuBLASLt accepted the stride-0 window as C.
  const std::string& plan_summary() const { return summary_; }
  bool window_as_c() const { return planned_ && !broadcast_; }

private:
  template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
  struct Destroyer {
    void operator()(Handle h) const { (void)Destroy(h); }
  };
  using OpDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                 Destroyer<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
  using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                 Destroyer<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
  using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                     Destroyer<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

  struct Call {
    int coeff_row = 0, channel = 0;
    bool window_as_c = false;
    OpDesc op;
    Layout a, b, c, d;
    cublasLtMatmulAlgo_t algo{};
  };

  /// A column-major layout rows × cols, leading dimension ld, `batch` matrices `stride` apart.
  static Status make_layout(Layout& out, std::uint64_t rows, std::uint64_t cols, std::int64_t ld, int batch, std::int64_t stride,
                            const char* what) {
    cublasLtMatrixLayout_t raw = nullptr;
    Status s = bd::cuda::check(cublasLtMatrixLayoutCreate(&raw, DataType<T>::value, rows, cols, ld), what);
    if (!s) return s;
    out.reset(raw);
    s = bd::cuda::check(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch), what);
    if (!s) return s;
    return bd::cuda::check(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                           what);
  }

  Status make_call(const Arguments& a, int k, int coeff_row, int channel, bool window_as_c, Call& call) const {
    const std::string who = "CublasLtBDProjection: ";
    const std::int64_t N = (std::int64_t)a.heads * a.head_dim;
    call.coeff_row = coeff_row, call.channel = channel, call.window_as_c = window_as_c;
    cublasLtMatmulDesc_t op = nullptr;
    Status s = bd::cuda::check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "CublasLtBDProjection: cublasLtMatmulDescCreate");
    if (!s) return s;
    call.op.reset(op);
    const char* what = "CublasLtBDProjection: cublasLtMatrixLayoutCreate";
    if (!(s = make_layout(call.a, a.head_dim, k, N, a.heads, a.head_dim, what))) return s;  // C_hᵀ piece
    if (!(s = make_layout(call.b, k, a.rows, a.input_dim, a.heads, 0, what))) return s;     // X_pieceᵀ, shared
    if (!(s = make_layout(call.d, a.head_dim, a.rows, N, a.heads, a.head_dim, what))) return s;
    if (window_as_c) {
      if (!(s = make_layout(call.c, a.head_dim, a.rows, a.input_dim, a.heads, 0, what))) return s;  // windowᵀ, shared
    } else {
      if (!(s = make_layout(call.c, a.head_dim, a.rows, N, a.heads, a.head_dim, what))) return s;  // D itself
    }
    cublasLtMatmulPreference_t pref_raw = nullptr;
    if (!(s = bd::cuda::check(cublasLtMatmulPreferenceCreate(&pref_raw), "CublasLtBDProjection: cublasLtMatmulPreferenceCreate")))
      return s;
    const Preference pref(pref_raw);
    const std::uint64_t bytes = workspace_bytes_;
    if (!(s = bd::cuda::check(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes),
                              "CublasLtBDProjection: cublasLtMatmulPreferenceSetAttribute")))
      return s;
    // The heuristics assume 256-byte aligned A, B, C, D unless told otherwise; ours are offsets of
    // multiples of 8 elements from 16-byte aligned pointers (window, pieces, heads' batch stride).
    const std::uint32_t alignment = 16;
    for (const auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      if (!(s = bd::cuda::check(cublasLtMatmulPreferenceSetAttribute(pref_raw, attribute, &alignment, sizeof alignment),
                                "CublasLtBDProjection: cublasLtMatmulPreferenceSetAttribute (alignment)")))
        return s;
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    if (!(s = bd::cuda::check(cublasLtMatmulAlgoGetHeuristic(handle_, op, call.a.get(), call.b.get(), call.c.get(), call.d.get(), pref_raw,
                                                             1, &result, &returned),
                              "CublasLtBDProjection: cublasLtMatmulAlgoGetHeuristic")))
      return s;
    if (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS)
      return Status::failure(who + "cublasLtMatmulAlgoGetHeuristic returned no algorithm for k = " + detail::describe(k) +
                             (window_as_c ? " with the window as C (ld d, batch stride 0)" : " accumulating in place"));
    call.algo = result.algo;
    return Status::success();
  }

  cublasLtHandle_t handle_;
  void* workspace_;
  std::size_t workspace_bytes_;
  DeviceInfo device_;
  Arguments shape_{};
  std::vector<Call> calls_;
  bool broadcast_ = false, planned_ = false;
  std::string summary_ = "not planned";
};

}  // namespace bd::cuda
