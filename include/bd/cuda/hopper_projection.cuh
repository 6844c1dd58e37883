// bd/cuda/hopper_projection.cuh — host side of the Hopper (sm_90a) BD projection
// (hopper_kernel.cuh): K' = X[:, window] + X[:, rest]·C with wgmma, TMA and the accumulators
// started from the window, in the manner of projection.cuh's implementations:
//
//     HopperBDProjection<T> impl;           // queries the device once
//     impl.plan(args);                      // C stored K-major, tensor maps, the configuration chosen by timing
//     impl.run(args, stream);               // any X and K' of the planned shape
//
// Shapes: d_h ∈ {64, 128, 256}, d and the window offset multiples of 64, d − d_h ≥ 64 (every
// window after nn/latent_permutation.hpp's reordering, first and last windows at DeepSeek's and
// LLaMA's shapes); other shapes keep BDProjection or CublasLtBDProjection, and check() says why.
// The device must be compute capability 9.0 and this binary must hold sm_90a code (CMake's
// default architectures include 90a-real): can_implement() says which is missing.
//
// plan() snapshots the coefficients (it transposes C into a buffer the object owns); run() with
// another coeff pointer is refused, so that new weights are planned, not silently ignored. X and
// K' may change between runs: their tensor maps are re-encoded on the host when they do (no
// device call). cuTensorMapEncodeTiled is reached through cudaGetDriverEntryPointByVersion, so
// nothing links libcuda.
#pragma once

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bd/cuda/hopper_kernel.cuh"
#include "bd/cuda/projection.cuh"

namespace bd::cuda {

/// A launch configuration of the Hopper kernel: CTAs per cluster (1, 2 or 4: the Cᵀ tile
/// multicast to all), stages of the load ring (3, or 4 with the output staged in two rounds) and
/// how outputs are stored (1: staged in shared memory for TMA stores, 2: direct from registers;
/// hopper::Store). 0 in any field: plan() chooses it by timing. Direct stores are emulated and
/// tested on the host but not yet run on a GPU, so the default asks for staged ones; {0, 0, 0}
/// times both.
struct HopperConfig {
  int cluster = 0;
  int stages = 0;
  int store = int(hopper::Store::staged);
};

template <typename T>
class HopperBDProjection {
public:
  using Arguments = ProjectionArguments<T>;

  /// Queries the current device once: capability, multiprocessors, whether this binary carries the
  /// sm_90a kernel for it (a one-thread probe launch), and the driver's tensor-map encoder.
  HopperBDProjection() : device_(DeviceInfo::current()) {
    if (device_.capability != 90) return;
    if (cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_.ordinal) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    int* flag = nullptr;
    int host_flag = 0;
    if (cudaMalloc(&flag, sizeof(int)) == cudaSuccess) {
      hopper::hopper_probe<0><<<1, 1>>>(flag);
      if (cudaMemcpy(&host_flag, flag, sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) host_flag = 0;
      cudaFree(flag);
    }
    (void)cudaGetLastError();
    has_code_ = host_flag == 1;
    cudaDriverEntryPointQueryResult found{};
    void* entry = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      encode_ = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(entry);
    (void)cudaGetLastError();
  }

  /// The argument checks alone, with no device query: projection.cuh's, and the shapes this kernel
  /// computes.
  static Status check(const Arguments& a) {
    Status s = detail::check_arguments(a, "HopperBDProjection");
    if (!s) return s;
    if (!hopper::supported_shape(a.input_dim, a.head_dim, a.window_offset))
      return Status::failure("HopperBDProjection: input_dim " + detail::describe(a.input_dim) + ", head_dim " +
                             detail::describe(a.head_dim) + ", window_offset " + detail::describe(a.window_offset) +
                             ": the sm_90a kernel needs head_dim 64, 128 or 256, input_dim and window_offset multiples of 64, "
                             "and input_dim − head_dim ≥ 64 (BDProjection and CublasLtBDProjection take other shapes)");
    return Status::success();
  }

  /// Success, or why these arguments or this device cannot run the kernel.
  Status can_implement(const Arguments& a) const {
    Status s = check(a);
    if (!s) return s;
    if (!device_.present()) return Status::failure("HopperBDProjection: no CUDA device is present");
    if (device_.capability != 90)
      return Status::failure("HopperBDProjection: needs compute capability 9.0 (H100/H200: wgmma, TMA, sm_90a code); the device has " +
                             device_.capability_text());
    if (!has_code_)
      return Status::failure("HopperBDProjection: this binary holds no sm_90a code for the kernel; build with CUDA architectures "
                             "that include 90a-real (bd's default)");
    if (!encode_) return Status::failure("HopperBDProjection: the driver offers no cuTensorMapEncodeTiled (driver older than CUDA 12.0)");
    return Status::success();
  }

  /// Prepares the shape of `a` (rows, dims, window) and its coefficients: Cᵀ stored K-major, the
  /// tensor maps encoded, and the configuration as given or, for fields left 0, the fastest of the
  /// candidates timed on `a` (median of 5 runs after 2 warm-ups each; this writes K' — the right
  /// K' — a few times).
  Status plan(const Arguments& a, HopperConfig config = {}, cudaStream_t stream = nullptr) {
    planned_ = false;
    Status s = can_implement(a);
    if (!s) return s;
    if (config.cluster != 0 && config.cluster != 1 && config.cluster != 2 && config.cluster != 4)
      return Status::failure("HopperBDProjection: cluster = " + detail::describe(config.cluster) +
                             ", expected 0 (choose by timing), 1, 2 or 4");
    if (config.stages != 0 && config.stages != 3 && config.stages != 4)
      return Status::failure("HopperBDProjection: stages = " + detail::describe(config.stages) + ", expected 0 (choose by timing), 3 or 4");
    if (config.store != 0 && config.store != int(hopper::Store::staged) && config.store != int(hopper::Store::direct))
      return Status::failure("HopperBDProjection: store = " + detail::describe(config.store) +
                             ", expected 0 (choose by timing), 1 (staged, TMA stores) or 2 (direct from registers)");
    shape_ = a;
    const int N = a.heads * a.head_dim, K = a.input_dim - a.head_dim;
    void* buffer = nullptr;
    if (!(s = bd::cuda::check(cudaMalloc(&buffer, std::size_t(N) * K * sizeof(T)),
                              "HopperBDProjection: cudaMalloc (Cᵀ, heads·head_dim × (input_dim − head_dim))")))
      return s;
    coeff_t_.reset(static_cast<T*>(buffer));
    const dim3 blocks(unsigned((N + 31) / 32), unsigned((K + 31) / 32));
    hopper::transpose<T><<<blocks, dim3(32, 8), 0, stream>>>(a.coeff, coeff_t_.get(), K, N);
    if (!(s = bd::cuda::check(cudaGetLastError(), "HopperBDProjection: launching the transpose of C"))) return s;
    if (!(s = bd::cuda::check(cudaStreamSynchronize(stream), "HopperBDProjection: transposing C"))) return s;
    std::vector<HopperConfig> candidates;
    for (int store : {int(hopper::Store::staged), int(hopper::Store::direct)})
      for (int stages : {3, 4})
        for (int cluster : {1, 2, 4})
          if ((config.stages == 0 || config.stages == stages) && (config.cluster == 0 || config.cluster == cluster) &&
              (config.store == 0 || config.store == store))
            candidates.push_back({cluster, stages, store});
    for (const HopperConfig& c : candidates) {
      if (!(s = configure_kernel(c))) return s;
      if (!(s = encode_coefficients(c.cluster, maps_[map_index(c.cluster)]))) return s;
    }
    config_ = candidates.front();
    planned_ = true;
    const auto describe = [](const HopperConfig& c) {
      return "cluster " + detail::describe(c.cluster) + ", " + detail::describe(c.stages) + " stages, " +
             (c.store == int(hopper::Store::direct) ? "direct stores" : "staged stores");
    };
    if (a.rows == 0 || candidates.size() == 1) {
      summary_ = describe(config_) + " (as asked)";
      return Status::success();
    }
    cudaEvent_t start, stop;
    if (!(s = bd::cuda::check(cudaEventCreate(&start), "HopperBDProjection: cudaEventCreate"))) return s;
    if (!(s = bd::cuda::check(cudaEventCreate(&stop), "HopperBDProjection: cudaEventCreate"))) {
      cudaEventDestroy(start);
      return s;
    }
    float best = 0;
    HopperConfig best_config = config_;
    std::string timings;
    for (const HopperConfig& c : candidates) {
      config_ = c;
      std::vector<float> ms;
      for (int r = 0; r < 7 && s; ++r) {
        cudaEventRecord(start, stream);
        s = run(a, stream);
        cudaEventRecord(stop, stream);
        if (s) s = bd::cuda::check(cudaEventSynchronize(stop), "HopperBDProjection: timing a configuration");
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        if (r >= 2) ms.push_back(t);
      }
      if (!s) break;
      std::sort(ms.begin(), ms.end());
      const float median = ms[ms.size() / 2];
      timings += (timings.empty() ? "" : "; ") + describe(c) + " (grid " + detail::describe(grid(c)) + "): " +
                 std::to_string(int(median * 1e3f + 0.5f)) + " us";
      if (&c == &candidates.front() || median < best) best = median, best_config = c;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (!s) {
      planned_ = false;
      return s;
    }
    config_ = best_config;
    summary_ = describe(config_) + " chosen by timing (" + timings + ")";
    return Status::success();
  }

  /// Launches on `stream` for arguments of the planned shape and coefficients; X and K' may differ
  /// from plan()'s. Kernel faults surface at the next synchronisation.
  Status run(const Arguments& a, cudaStream_t stream = nullptr) const {
    Status s = check(a);
    if (!s) return s;
    if (!(s = detail::check_planned(a, shape_, planned_, "HopperBDProjection"))) return s;
    if (a.coeff != shape_.coeff)
      return Status::failure("HopperBDProjection: run() with coefficients other than plan()'s (plan() stores C transposed); "
                             "call plan() again for new coefficients");
    if (a.rows == 0) return Status::success();
    if (!(s = detail::no_pending_error("HopperBDProjection"))) return s;
    Maps& maps = maps_[map_index(config_.cluster)];
    if ((a.x != maps.x_for || a.out != maps.out_for) && !(s = encode_activations(a, maps))) return s;
    const hopper::Problem p = problem(a, config_.cluster);
    cudaLaunchConfig_t launch{};
    cudaLaunchAttribute attribute[1];
    launch.blockDim = dim3(hopper::kThreads);
    launch.dynamicSmemBytes = hopper::shared_bytes(config_.stages, store_of(config_));
    launch.stream = stream;
    launch.gridDim = dim3(unsigned(grid(config_)));
    if (config_.cluster > 1) {
      attribute[0].id = cudaLaunchAttributeClusterDimension;
      attribute[0].val.clusterDim.x = unsigned(config_.cluster), attribute[0].val.clusterDim.y = 1, attribute[0].val.clusterDim.z = 1;
      launch.attrs = attribute;
      launch.numAttrs = 1;
    }
    const cudaError_t e = cudaLaunchKernelEx(&launch, kernel(config_), maps.x, maps.c, maps.out, a.out, p);
    if (e != cudaSuccess) (void)cudaGetLastError();
    return bd::cuda::check(e, "HopperBDProjection: launching bd_projection_sm90");
  }

  /// The configuration plan() chose (or was given), and how; {0, 0, 0} before plan().
  HopperConfig config() const { return planned_ ? config_ : HopperConfig{0, 0, 0}; }
  const std::string& plan_summary() const { return summary_; }
  const DeviceInfo& device() const { return device_; }

private:
  struct Free {
    void operator()(T* p) const { (void)cudaFree(p); }
  };
  struct Maps {
    CUtensorMap x{}, c{}, out{};
    const T* x_for = nullptr;  ///< the X and K' that x and out were encoded for
    const T* out_for = nullptr;
  };
  using Kernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, T*, hopper::Problem);

  static hopper::Problem problem(const Arguments& a, int cluster) {
    return {a.rows, a.input_dim, a.head_dim, a.heads * a.head_dim, a.window_offset, cluster};
  }

  template <int Stages, hopper::Store Out>
  Kernel kernel_for() const {
    switch (shape_.head_dim) {
      case 64: return &hopper::bd_projection_sm90<T, 64, Stages, Out>;
      case 128: return &hopper::bd_projection_sm90<T, 128, Stages, Out>;
      default: return &hopper::bd_projection_sm90<T, 256, Stages, Out>;
    }
  }
  static hopper::Store store_of(const HopperConfig& c) { return hopper::Store(c.store); }
  Kernel kernel(const HopperConfig& c) const {
    if (store_of(c) == hopper::Store::direct)
      return c.stages == 3 ? kernel_for<3, hopper::Store::direct>() : kernel_for<4, hopper::Store::direct>();
    return c.stages == 3 ? kernel_for<3, hopper::Store::staged>() : kernel_for<4, hopper::Store::staged>();
  }

  Status configure_kernel(const HopperConfig& c) const {
    return bd::cuda::check(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel(c)), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                hopper::shared_bytes(c.stages, store_of(c))),
                           "HopperBDProjection: cudaFuncSetAttribute (dynamic shared memory)");
  }

  /// The persistent grid: a CTA per multiprocessor, in whole clusters (as many clusters as fit at
  /// once, asked of the occupancy calculator once per configuration), never more than the work.
  long long grid(const HopperConfig& c) const {
    int& clusters = max_clusters_[map_index(c.cluster)][c.stages - 3][c.store - 1];
    if (clusters == 0) {
      clusters = sms_ / c.cluster;
      if (c.cluster > 1) {
        cudaLaunchConfig_t launch{};
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeClusterDimension;
        attribute[0].val.clusterDim.x = unsigned(c.cluster), attribute[0].val.clusterDim.y = 1, attribute[0].val.clusterDim.z = 1;
        launch.attrs = attribute;
        launch.numAttrs = 1;
        launch.blockDim = dim3(hopper::kThreads);
        launch.dynamicSmemBytes = hopper::shared_bytes(c.stages, store_of(c));
        launch.gridDim = dim3(unsigned(clusters * c.cluster));
        int fit = 0;
        if (cudaOccupancyMaxActiveClusters(&fit, kernel(c), &launch) == cudaSuccess && fit > 0) clusters = std::min(clusters, fit);
        (void)cudaGetLastError();
      }
    }
    return std::min<long long>(clusters, hopper::work_units(problem(shape_, c.cluster))) * c.cluster;
  }

  static int map_index(int cluster) { return cluster == 4 ? 2 : cluster - 1; }

  static CUtensorMapDataType data_type() {
    return std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  }

  /// A 2-D row-major tensor (rows × cols, `cols` contiguous) in boxes of box_rows × 64 columns,
  /// 128-byte swizzle; out-of-range box elements read as zeros and are not written.
  Status encode(CUtensorMap& map, const void* base, long long rows, long long cols, int box_rows, const char* what) const {
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(cols) * sizeof(T)};
    const cuuint32_t box[2] = {cuuint32_t(hopper::kBlockK), cuuint32_t(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = encode_(&map, data_type(), 2, const_cast<void*>(base), dims, strides, box, element_strides,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS) return Status::success();
    return Status::failure(std::string("HopperBDProjection: cuTensorMapEncodeTiled (") + what + ") failed with CUresult " +
                           detail::describe(int(r)));
  }
  Status encode_coefficients(int cluster, Maps& maps) const {
    const int N = shape_.heads * shape_.head_dim, K = shape_.input_dim - shape_.head_dim;
    maps.x_for = maps.out_for = nullptr;
    return encode(maps.c, coeff_t_.get(), N, K, hopper::c_box_rows(cluster), "Cᵀ");
  }
  Status encode_activations(const Arguments& a, Maps& maps) const {
    Status s = encode(maps.x, a.x, a.rows, a.input_dim, hopper::kBlockM, "X");
    if (s) s = encode(maps.out, a.out, a.rows, (long long)a.heads * a.head_dim, hopper::kWgmmaM, "K'");
    maps.x_for = s ? a.x : nullptr;
    maps.out_for = s ? a.out : nullptr;
    return s;
  }

  DeviceInfo device_;
  int sms_ = 0;
  bool has_code_ = false;
  PFN_cuTensorMapEncodeTiled_v12000 encode_ = nullptr;
  std::unique_ptr<T, Free> coeff_t_;
  Arguments shape_{};
  bool planned_ = false;
  HopperConfig config_{1, 3, int(hopper::Store::staged)};
  mutable Maps maps_[3];                ///< per cluster size 1, 2, 4; X and K' re-encoded when run() is given others
  mutable int max_clusters_[3][2][2] = {};  ///< per cluster size, stage count and store, 0 until asked
  std::string summary_ = "not planned";
};

}  // namespace bd::cuda
