// bd/cuda/cublaslt_projection.cuh — the BD projection on NVIDIA's own GEMM kernels (cuBLASLt,
// wgmma/TMA on Hopper), with the window folded into the GEMM's C input instead of a broadcast pass:
//
//     D_h = X_rest·C_h + X[:, window]      for every head h, one batched call,
//
// in cuBLASLt's column-major view D_hᵀ (d_h × L, ld n·d_h, batch stride d_h) =
// C_hᵀ (d_h × K, ld n·d_h, batch stride d_h) · X_restᵀ (K × L, batch stride 0)
// + windowᵀ (d_h × L, ld d, batch stride 0). C and D are separate descriptors in cublasLtMatmul,
// so the window can be C with its own leading dimension and a zero batch stride.
//
// When the window sits in the middle of X, the rest is two pieces of X. Pieces::Gathered (the
// default) first copies them into one contiguous L × (d − d_h) buffer that the object owns (one
// small kernel; L·d elements read against the L·n·d_h it writes) and makes one call: K' written
// once and rounded once. Pieces::InPlace makes one call per piece, the second accumulating into
// K' (C = D): K' crosses memory three times and is rounded twice; it is kept to measure against.
//
// Whether cuBLASLt's heuristics return an algorithm for a stride-0 C whose layout differs from D's
// is asked once, in plan(); if they return none, the plan falls back to broadcasting the window
// into K' (one small kernel) and accumulating into it, and plan_summary() says which. Split-K
// reductions are held to fp32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE): a reduction in the
// output type would round partial sums to half or bfloat16.
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

/// How the cuBLASLt path treats a rest in two pieces (a window in the middle of X).
enum class Pieces {
  Gathered,  ///< copy both pieces into one buffer, one GEMM: K' written and rounded once
  InPlace,   ///< one GEMM per piece, the second accumulating into K'
};

template <typename T>
class CublasLtBDProjection {
public:
  using Arguments = ProjectionArguments<T>;

  /// `handle` and `workspace` (device memory, may be null with 0 bytes) are borrowed. cuBLASLt
  /// offers more algorithms with a workspace; NVIDIA suggests 32 MiB on Hopper.
  CublasLtBDProjection(cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes, Pieces pieces = Pieces::Gathered)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes), mode_(pieces), device_(DeviceInfo::current()) {}

  static Status check(const Arguments& a) { return detail::check_arguments(a, "CublasLtBDProjection"); }

  /// Builds the descriptors and asks the heuristics for one algorithm per call this shape needs:
  /// once per shape, outside any timed loop. run() then accepts arguments of the same rows,
  /// input_dim, head_dim, heads and window_offset, with any (valid) pointers.
  Status plan(const Arguments& a) {
    block_.calls.clear();
    tail_.calls.clear();
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
    gather_ = mode_ == Pieces::Gathered && o > 0 && right > 0;
    rest_.reset();
    if (gather_) {
      // One piece: the gathered rest (channel −1: read from the buffer, ld d − d_h).
      const int K = a.input_dim - a.head_dim;
      void* buffer = nullptr;
      if (!(s = bd::cuda::check(cudaMalloc(&buffer, std::size_t(a.rows) * K * sizeof(T)),
                                "CublasLtBDProjection: cudaMalloc (the gathered rest, rows × (input_dim − head_dim))")))
        return s;
      rest_.reset(static_cast<T*>(buffer));
      pieces.push_back({K, 0, -1});
    } else {
      if (o > 0) pieces.push_back({o, 0, 0});
      if (right > 0) pieces.push_back({right, o, o + a.head_dim});
    }
    broadcast_ = pieces.empty();
    // Rows go in blocks of at most kRowBlock: every head's batch reads the same X_rest and window
    // rows, which stay in L2 across the batch only while a block's share of them fits (L2 is
    // 50 MB on an H100; 16384 rows of rest and window take 16 MB at d = 512).
    block_.rows = std::min(a.rows, kRowBlock);
    tail_.rows = a.rows % block_.rows;
    const auto build = [&](Plan& plan, bool window_as_c) -> Status {
      plan.calls.clear();
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        Call call;
        Status made = make_call(a, plan.rows, pieces[i].k, pieces[i].coeff_row, pieces[i].channel, window_as_c && i == 0, call);
        if (!made) return made;
        plan.calls.push_back(std::move(call));
      }
      return Status::success();
    };
    if (!pieces.empty()) {
      s = build(block_, /*window_as_c=*/true);
      if (s) {
        summary_ = std::string("window as cuBLASLt's C input (batch stride 0): accepted by the heuristics") +
                   (gather_ ? "; the two pieces of rest gathered, one call" : pieces.size() > 1 ? "; one call per piece" : "");
      } else {
        broadcast_ = true;
        summary_ = "window as cuBLASLt's C input refused (" + s.message() + "); window broadcast, then every piece in place";
        if (!(s = build(block_, false))) return s;
      }
      if (tail_.rows > 0 && !(s = build(tail_, !broadcast_))) {
        block_.calls.clear();
        return s;
      }
    } else {
      summary_ = "the window is all of X: the window broadcast alone";
    }
    if (a.rows > kRowBlock) summary_ += "; rows in blocks of " + detail::describe(kRowBlock);
    planned_ = true;
    return Status::success();
  }

  /// Runs the planned calls on `stream`.
  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = check(a);
    if (!s) return s;
    if (!(s = detail::check_planned(a, shape_, planned_, "CublasLtBDProjection"))) return s;
    if (a.rows == 0) return Status::success();
    if (!(s = detail::no_pending_error("CublasLtBDProjection"))) return s;
    if (gather_) {
      const long long chunks = (long long)a.rows * (a.input_dim - a.head_dim) / 8;
      const unsigned blocks = static_cast<unsigned>(std::min<long long>((chunks + 255) / 256, 65535));
      if (!(s = detail::launch(&kernel::gather_rest<T>, dim3(blocks), dim3(256),
                               detail::params_of(a.x, nullptr, rest_.get(), a.rows, a.input_dim, a.head_dim, a.heads, a.window_offset),
                               stream, "CublasLtBDProjection: launching gather_rest")))
        return s;
    }
    if (broadcast_ && !(s = detail::broadcast(a, stream, "CublasLtBDProjection: launching broadcast_window"))) return s;
    const float one = 1.0f;
    const long long N = (long long)a.heads * a.head_dim, K = a.input_dim - a.head_dim;
    for (long long r0 = 0; r0 < a.rows; r0 += block_.rows) {
      const Plan& plan = a.rows - r0 >= block_.rows ? block_ : tail_;
      const T* x = a.x + r0 * a.input_dim;
      T* out = a.out + r0 * N;
      for (const Call& call : plan.calls) {
        const void* c_input = call.window_as_c ? static_cast<const void*>(x + a.window_offset) : static_cast<const void*>(out);
        const T* b_input = call.channel < 0 ? rest_.get() + r0 * K : x + call.channel;
        s = bd::cuda::check(cublasLtMatmul(handle_, call.op.get(), &one, a.coeff + (long long)call.coeff_row * N, call.a.get(), b_input,
                                           call.b.get(), &one, c_input, call.c.get(), out, call.d.get(), &call.algo, workspace_,
                                           workspace_bytes_, stream),
                            call.window_as_c ? "CublasLtBDProjection: cublasLtMatmul (first piece, window as C)"
                                             : "CublasLtBDProjection: cublasLtMatmul (piece accumulated in place)");
        if (!s) return s;
      }
    }
    return Status::success();
  }

  /// What plan() chose, and whether cuBLASLt accepted the stride-0 window as C.
  const std::string& plan_summary() const { return summary_; }
  bool window_as_c() const { return planned_ && !broadcast_; }
  /// Whether run() gathers the two pieces of rest into one buffer first.
  bool gathers() const { return planned_ && gather_; }

private:
  template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
  struct Destroyer {
    void operator()(Handle h) const { (void)Destroy(h); }
  };
  using OpDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                 Destroyer<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
  using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                 Destroyer<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
  struct Free {
    void operator()(T* p) const { (void)cudaFree(p); }
  };
  using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                     Destroyer<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

  static constexpr int kRowBlock = 16384;

  struct Call {
    int coeff_row = 0, channel = 0;
    bool window_as_c = false;
    OpDesc op;
    Layout a, b, c, d;
    cublasLtMatmulAlgo_t algo{};
  };
  /// The calls for one block of `rows` rows.
  struct Plan {
    int rows = 0;
    std::vector<Call> calls;
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

  Status make_call(const Arguments& a, int rows, int k, int coeff_row, int channel, bool window_as_c, Call& call) const {
    const std::string who = "CublasLtBDProjection: ";
    const std::int64_t N = (std::int64_t)a.heads * a.head_dim;
    call.coeff_row = coeff_row, call.channel = channel, call.window_as_c = window_as_c;
    cublasLtMatmulDesc_t op = nullptr;
    Status s = bd::cuda::check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "CublasLtBDProjection: cublasLtMatmulDescCreate");
    if (!s) return s;
    call.op.reset(op);
    const char* what = "CublasLtBDProjection: cublasLtMatrixLayoutCreate";
    if (!(s = make_layout(call.a, a.head_dim, k, N, a.heads, a.head_dim, what))) return s;  // C_hᵀ piece
    const std::int64_t ld_b = channel < 0 ? k : a.input_dim;  // the gathered rest, or a piece of X
    if (!(s = make_layout(call.b, k, rows, ld_b, a.heads, 0, what))) return s;               // X_pieceᵀ, shared
    if (!(s = make_layout(call.d, a.head_dim, rows, N, a.heads, a.head_dim, what))) return s;
    if (window_as_c) {
      if (!(s = make_layout(call.c, a.head_dim, rows, a.input_dim, a.heads, 0, what))) return s;  // windowᵀ, shared
    } else {
      if (!(s = make_layout(call.c, a.head_dim, rows, N, a.heads, a.head_dim, what))) return s;  // D itself
    }
    cublasLtMatmulPreference_t pref_raw = nullptr;
    if (!(s = bd::cuda::check(cublasLtMatmulPreferenceCreate(&pref_raw), "CublasLtBDProjection: cublasLtMatmulPreferenceCreate")))
      return s;
    const Preference pref(pref_raw);
    const std::uint64_t bytes = workspace_bytes_;
    if (!(s = bd::cuda::check(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes),
                              "CublasLtBDProjection: cublasLtMatmulPreferenceSetAttribute")))
      return s;
    // Split-K partial sums added in fp32, never in half or bfloat16 (see the file comment).
    const std::uint32_t reductions = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (!(s = bd::cuda::check(cublasLtMatmulPreferenceSetAttribute(pref_raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                                                   sizeof reductions),
                              "CublasLtBDProjection: cublasLtMatmulPreferenceSetAttribute (reduction scheme)")))
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
  Pieces mode_;
  DeviceInfo device_;
  std::unique_ptr<T, Free> rest_;  ///< the gathered rest, rows × (input_dim − head_dim), when gather_
  Arguments shape_{};
  Plan block_, tail_;
  bool broadcast_ = false, planned_ = false, gather_ = false;
  std::string summary_ = "not planned";
};

}  // namespace bd::cuda
