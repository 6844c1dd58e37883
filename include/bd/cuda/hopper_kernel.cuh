// bd/cuda/hopper_kernel.cuh — the BD key/value projection on Hopper (sm_90a):
//
//     K'[l, h·d_h + j] = X[l, o + j] + Σ_k X[l, rest(k)] · C[k, h·d_h + j]
//
// A persistent, warp-specialised kernel in the manner of the compact sm_90 GEMMs:
//   - warpgroup 0 produces: one thread issues TMA loads of 64-channel X and Cᵀ tiles into a ring of
//     3 or 4 shared-memory stages (128-byte swizzle), each with a "full" mbarrier that the copy
//     engine completes and an "empty" mbarrier that the consumers release;
//   - warpgroups 1 and 2 consume, 64 rows of a 128 × 256 output tile each. **The accumulators
//     start from the window**: the first ⌈d_h / 128⌉ stages of a tile carry only the X tile's
//     window columns (two 64-column boxes per stage), which each thread loads from shared memory
//     into its fp32 accumulators (the same values for every head of the tile); the remaining
//     stages run wgmma.m64n256k16 over the rest
//     channels only. K' is rounded once, written into swizzled shared memory and stored by TMA,
//     and that store drains while the consumer starts the next tile — or (Store::direct) stored
//     from registers, 8 bytes per lane after one shuffle, with no staging and no wait.
//   - with a cluster of 2 or 4 (vertically adjacent tiles of one column block), each CTA loads
//     1/cluster of the Cᵀ tile and multicasts it to all: L2 → SM traffic for C drops to 1/cluster.
// Stages (3 or 4) trades prefetch depth against output staging (hopper_layout.cuh, shared_bytes).
// Every index comes from hopper_layout.cuh (tested on the host). Registers: the producer gives
// its back (setmaxnreg 40) so that each consumer thread can hold 128 accumulators (232).
// Device code exists only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); other targets trap.
#pragma once

#include <cuda.h>  // CUtensorMap (a plain struct: no driver library is linked for it)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda/ptx>

#include <cstdint>
#include <type_traits>

#include "bd/cuda/hopper_layout.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BD_HOPPER_DEVICE_CODE 1
#else
#define BD_HOPPER_DEVICE_CODE 0
#endif

namespace bd::cuda::hopper {

#if BD_HOPPER_DEVICE_CODE

__device__ inline std::uint32_t shared_address(const void* p) { return static_cast<std::uint32_t>(__cvta_generic_to_shared(p)); }

/// Waits until the barrier's phase of parity `parity` has completed. With BD_CUDA_WATCHDOG defined
/// (the tests define it) a wait that spins that many times traps instead of hanging the GPU.
__device__ inline void wait(std::uint64_t* barrier, unsigned parity) {
#ifdef BD_CUDA_WATCHDOG
  long long spins = 0;
#endif
  while (!::cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
#ifdef BD_CUDA_WATCHDOG
    if (++spins > (long long)(BD_CUDA_WATCHDOG)) __trap();
#endif
  }
}

/// Arrives on `barrier` as it sits in the shared memory of CTA `cta` of the cluster (the arrive's
/// default semantics, as CUTLASS's ClusterBarrier: what it orders — this warp's reads of the
/// stage — has completed, the wgmma group having been waited for).
__device__ inline void arrive_in(std::uint64_t* barrier, unsigned cta) {
  asm volatile(
      "{\n\t.reg .b32 remote;\n\t"
      "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t}"
      :
      : "r"(shared_address(barrier)), "r"(cta)
      : "memory");
}

__device__ inline unsigned cluster_rank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

/// The cluster-wide barrier, in its non-.aligned form: the producer warp's lanes arrive from
/// divergent paths.
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

/// A named barrier among `threads` threads (ids 1, 2: one per consumer warpgroup); barrier.sync
/// without .aligned, since one thread of the warpgroup arrives from its own branch.
__device__ inline void named_sync(int id, int threads) { asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory"); }

template <int Registers>
__device__ inline void shrink_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Registers));
}
template <int Registers>
__device__ inline void grow_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Registers));
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int Pending>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}
/// Keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma
/// boundaries (an empty asm that "reads and writes" each register).
__device__ inline void pin(float (&d)[kAccumulators]) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define BD_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define BD_WGMMA_M64N256K16(type)                                                                                              \
  asm volatile(                                                                                                                \
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %130, 0;\n\t"                                                                      \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." type "." type " {"                                                        \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                                 \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                                       \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                                        \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                                        \
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                                        \
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                                        \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "                            \
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "                      \
      "%128, %129, p, 1, 1, 0, 0;\n\t}"                                                                                         \
      : BD_F8(0), BD_F8(8), BD_F8(16), BD_F8(24), BD_F8(32), BD_F8(40), BD_F8(48), BD_F8(56), BD_F8(64), BD_F8(72), BD_F8(80), \
        BD_F8(88), BD_F8(96), BD_F8(104), BD_F8(112), BD_F8(120)                                                               \
      : "l"(a), "l"(b), "r"(1))

/// d += A·Bᵀ on one m64n256k16 step: A (64 × 16) and B (256 × 16) K-major in shared memory, named
/// by their descriptors; fp32 accumulation (scale-d = 1: always accumulate onto the window).
template <typename T>
__device__ inline void wgmma_m64n256k16(float (&d)[kAccumulators], std::uint64_t a, std::uint64_t b) {
  if constexpr (std::is_same_v<T, __half>) BD_WGMMA_M64N256K16("f16");
  else BD_WGMMA_M64N256K16("bf16");
}
#undef BD_WGMMA_M64N256K16
#undef BD_F8

template <typename T>
__device__ inline std::uint32_t pack_rounded(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}
/// Stores two packed pairs (4 values, 8 bytes) to global memory.
__device__ inline void store_pairs(void* to, std::uint32_t first, std::uint32_t second) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(to), "r"(first), "r"(second) : "memory");
}
template <typename T>
__device__ inline float2 unpack(std::uint32_t bits) {
  if constexpr (std::is_same_v<T, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

#endif  // BD_HOPPER_DEVICE_CODE

/// The kernel. x_map: X (L × d) in boxes of 64 × kBlockM; c_map: Cᵀ (N × (d − d_h)) in boxes of
/// 64 × kBlockN / cluster; out_map: K' (L × N) in boxes of 64 × 64; all with the 128-byte swizzle.
/// `out` is K' itself (row-major, N columns), which Store::direct writes without the map.
/// Launched with kThreads threads, shared_bytes(Stages, Out) of dynamic shared memory, a grid of
/// whole clusters of p.cluster CTAs (cluster dimension p.cluster × 1 × 1), HeadDim = p.head_dim.
template <typename T, int HeadDim, int Stages, Store Out>
__global__ void __launch_bounds__(kThreads, 1)
    bd_projection_sm90(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap c_map,
                       const __grid_constant__ CUtensorMap out_map, T* out, Problem p) {
#if BD_HOPPER_DEVICE_CODE
  static_assert(HeadDim % kBlockK == 0 && kBlockN % HeadDim == 0, "a tile holds whole heads of whole 64-column blocks");
  extern __shared__ __align__(1024) unsigned char shared_raw[];
  unsigned char* smem = shared_raw + (kSwizzleAtom - shared_address(shared_raw) % kSwizzleAtom) % kSwizzleAtom;
  unsigned char* ring = smem;
  unsigned char* epilogue = smem + Stages * kStageBytes;
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(epilogue + epilogue_bytes(Stages, Out));
  std::uint64_t* empty = full + Stages;

  const int warpgroup = threadIdx.x / kWarpgroupThreads, thread = threadIdx.x % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32;
  const int cluster = p.cluster;
  const int rank = cluster > 1 ? int(cluster_rank()) : 0;
  constexpr int kWindowSteps = (HeadDim / kBlockK + kWindowBoxesPerStage - 1) / kWindowBoxesPerStage;
  constexpr int kSlots = epilogue_slots(Stages), kRounds = kSlabs / kSlots;

  if (threadIdx.x == 0) {
    for (int s = 0; s < Stages; ++s) {
      ::cuda::ptx::mbarrier_init(&full[s], 1);  // the producer's arrive.expect_tx; the bytes complete it
      ::cuda::ptx::mbarrier_init(&empty[s], kConsumers * 4 * cluster);  // every consumer warp of the cluster
    }
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
  }
  if (cluster > 1) cluster_sync();  // the peer's barriers exist before anything lands in them
  else __syncthreads();

  const long long units = work_units(p);
  const int steps = stages_per_tile(p);
  const long long first_unit = blockIdx.x / cluster, unit_stride = gridDim.x / cluster;

  if (warpgroup == 0) {
    shrink_registers<40>();
    if (warp == 0 && lane == 0) {
      long long step = 0;
      for (long long unit = first_unit; unit < units; unit += unit_stride) {
        const Tile tile = tile_of(p, unit, rank);
        for (int j = 0; j < steps; ++j, ++step) {
          const int s = stage_of(step, Stages);
          wait(&empty[s], phase_parity(step, Stages) ^ 1u);  // the first pass finds every stage free
          ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta, ::cuda::ptx::space_shared, &full[s],
                                               expected_bytes(p, j));
          unsigned char* stage = ring + s * kStageBytes;
          if (is_window_step(p, j)) {
            for (int box = 0; box < window_boxes(p, j); ++box) {
              const Coords wc = window_coords(p, tile, j, box);
              const std::int32_t w_at[2] = {wc.col, wc.row};
              ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, stage + box * kAStageBytes, &x_map,
                                                w_at, &full[s]);
            }
          } else {
            const Coords xc = x_coords(p, tile, j);
            const std::int32_t x_at[2] = {xc.col, xc.row};
            ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, stage, &x_map, x_at, &full[s]);
            const Coords cc = c_coords(p, tile, j, rank);
            const std::int32_t c_at[2] = {cc.col, cc.row};
            unsigned char* to = stage + kAStageBytes + c_box_offset(rank, cluster);
            if (cluster == 1)
              ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, to, &c_map, c_at, &full[s]);
            else
              ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, to, &c_map, c_at, &full[s],
                                              std::uint16_t((1u << cluster) - 1));
          }
        }
      }
    }
    __syncwarp();
  } else {
    grow_registers<232>();
    const int consumer = warpgroup - 1;
    // A consumer warp releases a stage in every CTA of the cluster (the peer's producer multicasts
    // into this CTA's copy of the stage too): lane r arrives in CTA r.
    const auto release = [&](int s) {
      if (cluster == 1) {
        if (lane == 0) (void)::cuda::ptx::mbarrier_arrive(&empty[s]);
      } else if (lane < cluster) {
        arrive_in(&empty[s], unsigned(lane));
      }
    };
    float acc[kAccumulators];
    long long step = 0;
    for (long long unit = first_unit; unit < units; unit += unit_stride) {
      const Tile tile = tile_of(p, unit, rank);
      // The window: each thread's accumulators start from X[row, o + col mod d_h], read from the
      // window stages' X tiles (one load per pair of head 0, copied to every head of the tile).
#pragma unroll
      for (int w = 0; w < kWindowSteps; ++w, ++step) {
        const int s = stage_of(step, Stages);
        wait(&full[s], phase_parity(step, Stages));
        __syncwarp();  // the spin may end in different iterations per lane; the warp goes on together
        const unsigned char* x_tile = ring + s * kStageBytes;
#pragma unroll
        for (int i = 0; i < HeadDim / 2; i += 2) {
          if (window_step_of_register(i, HeadDim) != w) continue;
          const float2 v = unpack<T>(*reinterpret_cast<const std::uint32_t*>(x_tile + window_pair_offset(consumer, warp, lane, i, HeadDim)));
#pragma unroll
          for (int h = 0; h < kBlockN / HeadDim; ++h) {
            acc[head_register(i, h, HeadDim)] = v.x;
            acc[head_register(i, h, HeadDim) + 1] = v.y;
          }
        }
        release(s);
      }
      // The rest: wgmma on every rest stage, one group in flight; a stage is released once the
      // group that read it has completed.
      pin(acc);
      int previous = -1;
      for (int j = kWindowSteps; j < steps; ++j, ++step) {
        const int s = stage_of(step, Stages);
        wait(&full[s], phase_parity(step, Stages));
        __syncwarp();  // wgmma is .sync.aligned: the warp converged
        const std::uint32_t a_stage = shared_address(ring + s * kStageBytes), b_stage = a_stage + kAStageBytes;
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) wgmma_m64n256k16<T>(acc, a_descriptor(a_stage, consumer, ks), b_descriptor(b_stage, ks));
        wgmma_commit();
        wgmma_wait<1>();
        if (previous >= 0) release(previous);
        previous = s;
      }
      wgmma_wait<0>();
      pin(acc);
      if (previous >= 0) release(previous);

      if constexpr (Out == Store::direct) {
        // The epilogue from registers: round once, trade one pair with the quad's neighbour, store
        // 8 bytes (hopper_layout.cuh, direct_col). Every lane shuffles; only the store is predicated.
        const bool odd = direct_kept_parity(lane) == 1;
        const int row = tile.m_block * kBlockM + consumer * kWgmmaM;
        const int col = tile.n_block * kBlockN;
#pragma unroll
        for (int b = 0; b < kDirectBlocks; ++b)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const std::uint32_t even_pair = pack_rounded<T>(acc[direct_register(b, h, 0)], acc[direct_register(b, h, 0) + 1]);
            const std::uint32_t odd_pair = pack_rounded<T>(acc[direct_register(b, h, 1)], acc[direct_register(b, h, 1) + 1]);
            const std::uint32_t kept = odd ? odd_pair : even_pair;
            const std::uint32_t got = __shfl_xor_sync(0xFFFFFFFFu, odd ? even_pair : odd_pair, 1);
            const int r = row + accumulator_row(warp, lane, 2 * h);
            if (r < p.rows && col + 16 * b < p.out_cols) {
              T* to = out + (long long)r * p.out_cols + col + direct_col(lane, b);
              if (direct_kept_first(lane)) store_pairs(to, kept, got);
              else store_pairs(to, got, kept);
            }
          }
      } else {
        // The epilogue: round once, stage through swizzled shared memory, one TMA store per 64-column
        // slab, kSlots slabs per round. A round's slots must have been read by the stores of the
        // round (or tile) before.
#pragma unroll
        for (int round = 0; round < kRounds; ++round) {
          if (thread == 0) ::cuda::ptx::cp_async_bulk_wait_group_read(::cuda::ptx::n32_t<0>{});
          named_sync(1 + consumer, kWarpgroupThreads);
#pragma unroll
          for (int i = 0; i < kAccumulators; i += 2)
            if (slab_of_register(i) / kSlots == round)
              *reinterpret_cast<std::uint32_t*>(epilogue + epilogue_pair_offset(consumer, warp, lane, i, kSlots)) =
                  pack_rounded<T>(acc[i], acc[i + 1]);
          ::cuda::ptx::fence_proxy_async(::cuda::ptx::space_shared);  // the copy engine reads what these stores wrote
          named_sync(1 + consumer, kWarpgroupThreads);
          if (thread == 0) {
#pragma unroll
            for (int slab = round * kSlots; slab < (round + 1) * kSlots; ++slab) {
              const Coords at = store_coords(tile, consumer, slab);
              const std::int32_t out_at[2] = {at.col, at.row};
              ::cuda::ptx::cp_async_bulk_tensor(::cuda::ptx::space_global, ::cuda::ptx::space_shared, &out_map, out_at,
                                                epilogue + slot_offset(consumer, slab, kSlots));
            }
            ::cuda::ptx::cp_async_bulk_commit_group();
          }
        }
      }
    }
    if (Out == Store::staged && thread == 0) ::cuda::ptx::cp_async_bulk_wait_group(::cuda::ptx::n32_t<0>{});
  }
  // No CTA leaves while its peer may still arrive on its barriers.
  if (cluster > 1) cluster_sync();
#else
  (void)x_map, (void)c_map, (void)out_map, (void)out, (void)p;
  __trap();  // built without sm_90a code: the host side never launches this (see hopper_available)
#endif
}

/// Writes 1 where this binary holds the sm_90a kernel for the running device, 0 elsewhere: what
/// the host asks before it offers the Hopper path.
template <int = 0>
__global__ void hopper_probe(int* has_sm90a) {
  *has_sm90a = BD_HOPPER_DEVICE_CODE;
}

/// Cᵀ = C transposed (C: rows × cols row-major → Cᵀ: cols × rows): the coefficients stored K-major
/// once, at plan time, so that both wgmma operands are K-major.
template <typename T>
__global__ void transpose(const T* __restrict__ in, T* __restrict__ out, int rows, int cols) {
  __shared__ T tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y)
    if (r0 + r < rows && c0 + threadIdx.x < cols) tile[r][threadIdx.x] = in[(long long)(r0 + r) * cols + c0 + threadIdx.x];
  __syncthreads();
  for (int c = threadIdx.y; c < 32; c += blockDim.y)
    if (c0 + c < cols && r0 + threadIdx.x < rows) out[(long long)(c0 + c) * rows + r0 + threadIdx.x] = tile[threadIdx.x][c];
}

}  // namespace bd::cuda::hopper
