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
// Tiling (an Ampere-style GEMM): a CTA of 8 warps computes 128 × 128 outputs, each warp 64 × 32
// as 4 × 4 m16n8 tiles; 32-wide k-tiles of X_rest and C are staged through double-buffered
// shared memory with cp.async (16-byte chunks, zero-filled past the edges) and fed to the tensor
// cores with ldmatrix (.trans for C). Rows are padded by 8 elements, which makes both ldmatrix
// patterns free of bank conflicts. Requirements the host wrapper checks (projection.cuh): 16-byte
// aligned pointers, d, d_h and o multiples of 8 (a 16-byte chunk never straddles the window).
// Device code needs sm_80 or newer; other architectures trap rather than compute garbage.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace bd::cuda::kernel {

constexpr int kTileRows = 128, kTileCols = 128, kTileDepth = 32, kThreads = 256;
constexpr int kPad = 8;
constexpr int kStrideA = kTileDepth + kPad;  // X tile: kTileRows × kTileDepth (+pad), row-major
constexpr int kStrideB = kTileCols + kPad;   // C tile: kTileDepth × kTileCols (+pad), row-major

struct ProjectionParams {
  const void* x;
  const void* coeff;
  void* out;
  int rows;        // L
  int input_dim;   // d
  int head_dim;    // d_h
  int heads;       // n
  int offset;      // o
};

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
  __shared__ alignas(16) T tile_x[2][kTileRows * kStrideA];
  __shared__ alignas(16) T tile_c[2][kTileDepth * kStrideB];
  const T* X = static_cast<const T*>(p.x);
  const T* C = static_cast<const T*>(p.coeff);
  T* out = static_cast<T*>(p.out);
  const int N = p.heads * p.head_dim, K = p.input_dim - p.head_dim, d = p.input_dim;
  const int row0 = blockIdx.y * kTileRows, col0 = blockIdx.x * kTileCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = (warp / 4) * 64, warp_col = (warp % 4) * 32;
  const int group = lane >> 2, quad = lane & 3;  // the mma fragment coordinates

  // Accumulators start from the window: element (r, c) begins as X[r, o + c mod d_h]. A thread
  // holds columns c, c+1 (same head: d_h is even) of rows r and r+8 of each m16n8 tile.
  // for_pairs visits every (row, column pair) this thread holds, with its two accumulators.
  float acc[4][4][4];
  const auto for_pairs = [&](auto&& visit) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          visit(row0 + warp_row + i * 16 + group + half * 8, col0 + warp_col + j * 8 + quad * 2, &acc[i][j][half * 2]);
  };
  for_pairs([&](int r, int c, float* pair) {
    float2 v = make_float2(0.f, 0.f);
    if (r < p.rows && c < N)
      v = P::to_float2(*reinterpret_cast<const typename P::type*>(X + size_t(r) * d + p.offset + c % p.head_dim));
    pair[0] = v.x, pair[1] = v.y;
  });

  // One k-tile: 128 × 32 of X_rest (2 chunks of 8 per thread) and 32 × 128 of C (2 per thread).
  const auto load = [&](int stage, int k0) {
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int q = threadIdx.x + it * kThreads;
      const int r = q / (kTileDepth / 8), kc = (q % (kTileDepth / 8)) * 8;
      const int k = k0 + kc, channel = k < p.offset ? k : k + p.head_dim;
      const bool valid = row0 + r < p.rows && k < K;
      cp_async_16(&tile_x[stage][r * kStrideA + kc], valid ? X + size_t(row0 + r) * d + channel : X, valid);
    }
#pragma unroll
    for (int it = 0; it < 2; ++it) {
      const int q = threadIdx.x + it * kThreads;
      const int r = q / (kTileCols / 8), cc = (q % (kTileCols / 8)) * 8;
      const bool valid = k0 + r < K && col0 + cc < N;
      cp_async_16(&tile_c[stage][r * kStrideB + cc], valid ? C + size_t(k0 + r) * N + col0 + cc : C, valid);
    }
  };

  const int k_tiles = (K + kTileDepth - 1) / kTileDepth;
  if (k_tiles > 0) load(0, 0);
  cp_async_commit();
  for (int t = 0; t < k_tiles; ++t) {
    if (t + 1 < k_tiles) {
      load((t + 1) & 1, (t + 1) * kTileDepth);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* xs = tile_x[t & 1];
    const T* cs = tile_c[t & 1];
#pragma unroll
    for (int ks = 0; ks < kTileDepth; ks += 16) {
      unsigned a[4][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        ldmatrix_x4(a[i], xs + (warp_row + i * 16 + (lane % 16)) * kStrideA + ks + (lane / 16) * 8);
#pragma unroll
      for (int jj = 0; jj < 2; ++jj)  // b[jj]: n-tiles 2jj (regs 0, 1) and 2jj+1 (regs 2, 3)
        ldmatrix_x4_trans(b[jj], cs + (ks + (lane % 16)) * kStrideB + warp_col + jj * 16 + (lane / 16) * 8);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_16816<T>(acc[i][j], a[i], b[j / 2][(j % 2) * 2], b[j / 2][(j % 2) * 2 + 1]);
    }
    __syncthreads();  // the stage is overwritten by the load two iterations on
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
        *reinterpret_cast<const typename P::type*>(X + r * p.input_dim + p.offset + c % p.head_dim);
  }
}

}  // namespace bd::cuda::kernel
