// bd/cuda/projection_kernel.cuh — the BD key/value projection on tensor cores:
//
//     K'[l, h·d_h + j] = X[l, o + j] + Σ_k X[l, rest(k)] · C[k, h·d_h + j]
//
// X (L × d), C ((d − d_h) × n·d_h) and K' (L × n·d_h) are row-major, in half or bfloat16;
// products accumulate in fp32 on mma.sync.m16n8k16 and are rounded once on store. The window
// X[:, o:o+d_h] is the accumulators' starting value (each thread loads its own elements of the
// window straight into its fragment registers), so K' is written exactly once; rest(k) = k for
// k < o and k + d_h after, so the k loop simply skips the window's channels.
//
// Tiling (an Ampere-style GEMM; every index in tile_layout.cuh, where the host tests check it):
// a CTA of 8 warps computes 128 × 128 outputs, each warp 64 × 32 as 4 × 4 m16n8 tiles; 32-wide
// k-tiles of X_rest and C are staged through double-buffered shared memory with cp.async (16-byte
// chunks, zero-filled past the edges) and fed to the tensor cores with ldmatrix (.trans for C).
// Requirements the host wrapper checks (projection.cuh): 16-byte aligned pointers, d, d_h and o
// multiples of 8 (a 16-byte chunk never straddles the window).
// Device code needs sm_80 or newer; other architectures trap rather than compute garbage.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "bd/cuda/tile_layout.cuh"

namespace bd::cuda::kernel {

template <typename T>
struct Pair;
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ float2 to_float2(type v) { return __half22float2(v); }
  static __device__ type from_floats(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ float2 to_float2(type v) { return __bfloat1622float2(v); }
  static __device__ type from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: fill the chunk with zeros, read nothing
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(gmem), "r"(bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}
__device__ inline void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  const unsigned from = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(from));
}
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
  const unsigned from = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(from));
}
/// d = a·b + d on one m16n8k16 tile, fp32 accumulators.
template <typename T>
__device__ inline void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
#endif

template <typename T>
__global__ void __launch_bounds__(kThreads) bd_projection(ProjectionParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using P = Pair<T>;
  __shared__ alignas(16) T tile_x[kStages][kTileRows * kStrideA];
  __shared__ alignas(16) T tile_c[kStages][kTileDepth * kStrideB];
  const T* X = static_cast<const T*>(p.x);
  const T* C = static_cast<const T*>(p.coeff);
  T* out = static_cast<T*>(p.out);
  const int N = p.heads * p.head_dim, K = p.input_dim - p.head_dim;
  const int row0 = blockIdx.y * kTileRows, col0 = blockIdx.x * kTileCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Accumulators start from the window: output (r, c) begins as X[r, o + c mod d_h]. A thread
  // holds columns c, c+1 (same head: d_h is even) of rows r and r+8 of each m16n8 tile.
  // for_pairs visits every (row, column pair) this thread holds, with its two accumulators.
  float acc[kWarpTilesM][kWarpTilesN][4];
  const auto for_pairs = [&](auto&& visit) {
#pragma unroll
    for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
      for (int j = 0; j < kWarpTilesN; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const TileIndex at = accumulator(warp, lane, i, j, half);
          visit(row0 + at.row, col0 + at.col, &acc[i][j][half * 2]);
        }
  };
  for_pairs([&](int r, int c, float* pair) {
    float2 v = make_float2(0.f, 0.f);
    if (r < p.rows && c < N) v = P::to_float2(*reinterpret_cast<const typename P::type*>(X + window_source(p, r, c)));
    pair[0] = v.x, pair[1] = v.y;
  });

  // One k-tile: kChunkPasses chunks of X_rest and of C per thread, zero-filled where out of range.
  const auto load = [&](int stage, int k0) {
#pragma unroll
    for (int pass = 0; pass < kChunkPasses; ++pass) {
      const TileIndex at = x_chunk(threadIdx.x, pass);
      const long long from = x_source(p, row0, k0, at);
      cp_async_16(&tile_x[stage][at.row * kStrideA + at.col], from >= 0 ? X + from : X, from >= 0);
    }
#pragma unroll
    for (int pass = 0; pass < kChunkPasses; ++pass) {
      const TileIndex at = c_chunk(threadIdx.x, pass);
      const long long from = c_source(p, col0, k0, at);
      cp_async_16(&tile_c[stage][at.row * kStrideB + at.col], from >= 0 ? C + from : C, from >= 0);
    }
  };

  const int k_tiles = (K + kTileDepth - 1) / kTileDepth;
  if (k_tiles > 0) load(stage_of(0), 0);
  cp_async_commit();
  for (int t = 0; t < k_tiles; ++t) {
    if (t + 1 < k_tiles) {
      load(stage_of(t + 1), (t + 1) * kTileDepth);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* xs = tile_x[stage_of(t)];
    const T* cs = tile_c[stage_of(t)];
#pragma unroll
    for (int ks = 0; ks < kTileDepth; ks += kMmaK) {
      unsigned a[kWarpTilesM][4], b[kWarpTilesN / 2][4];
#pragma unroll
      for (int i = 0; i < kWarpTilesM; ++i) ldmatrix_x4(a[i], xs + a_ldmatrix_offset(warp, i, ks, lane));
#pragma unroll
      for (int jj = 0; jj < kWarpTilesN / 2; ++jj) ldmatrix_x4_trans(b[jj], cs + b_ldmatrix_offset(warp, jj, ks, lane));
#pragma unroll
      for (int i = 0; i < kWarpTilesM; ++i)
#pragma unroll
        for (int j = 0; j < kWarpTilesN; ++j)
          mma_16816<T>(acc[i][j], a[i], b[b_load(j)][b_register(j, 0)], b[b_load(j)][b_register(j, 1)]);
    }
    __syncthreads();  // this stage is overwritten by the load issued at the top of iteration t + 1
  }

  // Round once and store each thread's pairs.
  for_pairs([&](int r, int c, const float* pair) {
    if (r < p.rows && c < N)
      *reinterpret_cast<typename P::type*>(out + size_t(r) * N + c) = P::from_floats(pair[0], pair[1]);
  });
#else
  __trap();  // built for an architecture without m16n8k16 tensor cores: fail loudly
#endif
}

/// K'[l, h·d_h + j] = X[l, o + j]: the window broadcast to every head (the cuBLAS path's first step).
template <typename T>
__global__ void broadcast_window(ProjectionParams p) {
  using P = Pair<T>;
  const T* X = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const long long N = (long long)p.heads * p.head_dim, pairs = (long long)p.rows * N / 2;
  for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < pairs; q += (long long)gridDim.x * blockDim.x) {
    const long long r = (2 * q) / N, c = (2 * q) % N;
    *reinterpret_cast<typename P::type*>(out + r * N + c) =
        *reinterpret_cast<const typename P::type*>(X + window_source(p, int(r), int(c)));
  }
}

/// rest[l, k] = X[l, rest(k)]: the channels outside the window gathered into one contiguous
/// L × (d − d_h) matrix (p.out), so that a library GEMM sees the rest as a single operand and the
/// product is one call, rounded once. d, d_h and o are multiples of 8, so each 16-byte chunk of
/// eight channels lies wholly left or right of the window.
template <typename T>
__global__ void gather_rest(ProjectionParams p) {
  const T* X = static_cast<const T*>(p.x);
  T* rest = static_cast<T*>(p.out);
  const int K = p.input_dim - p.head_dim, chunks_per_row = K / 8;
  const long long chunks = (long long)p.rows * chunks_per_row;
  for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < chunks; q += (long long)gridDim.x * blockDim.x) {
    const long long r = q / chunks_per_row;
    const int k = int(q % chunks_per_row) * 8;
    *reinterpret_cast<uint4*>(rest + r * K + k) =
        *reinterpret_cast<const uint4*>(X + r * p.input_dim + rest_channel(k, p.offset, p.head_dim));
  }
}

}  // namespace bd::cuda::kernel
