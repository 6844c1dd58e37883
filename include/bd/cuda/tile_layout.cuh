// bd/cuda/tile_layout.cuh — the index arithmetic of the BD projection kernel, as __host__ __device__
// functions: which thread copies which 16-byte chunk of X_rest and C into shared memory, which
// shared-memory row each lane hands to ldmatrix, which accumulator holds which output, and which
// pipeline stage a k-tile uses. projection_kernel.cuh calls exactly these; tests/cuda emulates a
// CTA on the host through them against the PTX ISA's fragment tables (no GPU needed), so an
// index error is caught where there is no device to run the kernel.
//
// Tiling: a CTA of 8 warps computes 128 × 128 outputs; warp w computes rows 64·(w / 4) … + 63
// and columns 32·(w mod 4) … + 31 as 4 × 4 m16n8 tiles. k advances in tiles of 32 staged through
// two shared-memory buffers; rows of both buffers are padded by 8 elements, which makes the
// ldmatrix row addresses of a phase fall in distinct bank groups.
#pragma once

#if defined(__CUDACC__)
#define BD_CUDA_HOST_DEVICE __host__ __device__
#else
#define BD_CUDA_HOST_DEVICE
#endif

namespace bd::cuda::kernel {

constexpr int kTileRows = 128, kTileCols = 128, kTileDepth = 32, kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = 8;                    // elements per 16-byte cp.async chunk (half, bfloat16)
constexpr int kPad = 8;
constexpr int kStrideA = kTileDepth + kPad;  // X tile: kTileRows × kTileDepth (+pad), row-major
constexpr int kStrideB = kTileCols + kPad;   // C tile: kTileDepth × kTileCols (+pad), row-major
constexpr int kWarpRows = 64, kWarpCols = 32;
constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
constexpr int kWarpTilesM = kWarpRows / kMmaM, kWarpTilesN = kWarpCols / kMmaN;  // 4 × 4
constexpr int kStages = 2;

/// Each thread copies this many chunks of each tile per k-tile.
constexpr int kChunkPasses = kTileRows * kTileDepth / kChunk / kThreads;
static_assert(kChunkPasses * kThreads * kChunk == kTileRows * kTileDepth, "X tile: whole chunks per thread");
static_assert(kChunkPasses * kThreads * kChunk == kTileDepth * kTileCols, "C tile: as many chunks as X");
static_assert((kTileRows / kWarpRows) * (kTileCols / kWarpCols) == kWarps, "warps tile the CTA tile");

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

/// A position in a tile: (row, column) of its first element.
struct TileIndex {
  int row, col;
};

/// rest(k): the input channel of the k-th rest coefficient row (the window's d_h channels skipped).
BD_CUDA_HOST_DEVICE constexpr int rest_channel(int k, int offset, int head_dim) { return k < offset ? k : k + head_dim; }

/// The shared-memory buffer that holds k-tile t.
BD_CUDA_HOST_DEVICE constexpr int stage_of(int k_tile) { return k_tile % kStages; }

/// The chunk of the X tile (kTileRows × kTileDepth) that `thread` copies on `pass`.
BD_CUDA_HOST_DEVICE constexpr TileIndex x_chunk(int thread, int pass) {
  return {(thread + pass * kThreads) / (kTileDepth / kChunk), ((thread + pass * kThreads) % (kTileDepth / kChunk)) * kChunk};
}
/// The chunk of the C tile (kTileDepth × kTileCols) that `thread` copies on `pass`.
BD_CUDA_HOST_DEVICE constexpr TileIndex c_chunk(int thread, int pass) {
  return {(thread + pass * kThreads) / (kTileCols / kChunk), ((thread + pass * kThreads) % (kTileCols / kChunk)) * kChunk};
}

/// Element index into X of the chunk at tile position `at` of the k-tile starting at k0 in the CTA
/// whose first row is row0, or −1 where the chunk lies past L or past K = d − d_h (zero-filled).
/// d, d_h and o are multiples of kChunk, so a chunk never straddles the window.
BD_CUDA_HOST_DEVICE constexpr long long x_source(const ProjectionParams& p, int row0, int k0, TileIndex at) {
  const int k = k0 + at.col, row = row0 + at.row;
  if (row >= p.rows || k >= p.input_dim - p.head_dim) return -1;
  return (long long)row * p.input_dim + rest_channel(k, p.offset, p.head_dim);
}
/// Element index into C ((d − d_h) × n·d_h) of the chunk at `at` of the k-tile at k0, CTA columns from
/// col0, or −1 past K or past n·d_h.
BD_CUDA_HOST_DEVICE constexpr long long c_source(const ProjectionParams& p, int col0, int k0, TileIndex at) {
  const int k = k0 + at.row, col = col0 + at.col;
  if (k >= p.input_dim - p.head_dim || col >= p.heads * p.head_dim) return -1;
  return (long long)k * p.heads * p.head_dim + col;
}

BD_CUDA_HOST_DEVICE constexpr int warp_row(int warp) { return (warp / (kTileCols / kWarpCols)) * kWarpRows; }
BD_CUDA_HOST_DEVICE constexpr int warp_col(int warp) { return (warp % (kTileCols / kWarpCols)) * kWarpCols; }

/// Shared-memory offset (elements, into the X tile) of the row that `lane` addresses for
/// ldmatrix.x4 of the A operand of m-tile i at k-step ks: lanes 0–15 give rows 0–15 at column ks,
/// lanes 16–31 the same rows at ks + 8, so registers 0…3 are a0a1, a2a3, a4a5, a6a7.
BD_CUDA_HOST_DEVICE constexpr int a_ldmatrix_offset(int warp, int i, int ks, int lane) {
  return (warp_row(warp) + i * kMmaM + lane % 16) * kStrideA + ks + (lane / 16) * 8;
}
/// Shared-memory offset (into the C tile) of the row `lane` addresses for ldmatrix.x4.trans of the
/// B operands of n-tiles 2·jj and 2·jj + 1 at k-step ks: registers 0, 1 are b0b1, b2b3 of n-tile
/// 2·jj and registers 2, 3 those of n-tile 2·jj + 1 (see b_register).
BD_CUDA_HOST_DEVICE constexpr int b_ldmatrix_offset(int warp, int jj, int ks, int lane) {
  return (ks + lane % 16) * kStrideB + warp_col(warp) + jj * 2 * kMmaN + (lane / 16) * 8;
}
/// Which of the two ldmatrix.trans results holds n-tile j's B operand (b_ldmatrix_offset's jj) …
BD_CUDA_HOST_DEVICE constexpr int b_load(int j) { return j / 2; }
/// … and which register of it holds half h (0: b0b1, 1: b2b3).
BD_CUDA_HOST_DEVICE constexpr int b_register(int j, int h) { return (j % 2) * 2 + h; }

/// CTA-tile position of the accumulator pair acc[i][j][2·half], acc[i][j][2·half + 1] of `lane`
/// in `warp`: the m16n8 C fragment puts c0c1 at (lane / 4, 2·(lane mod 4)) and c2c3 eight rows down.
BD_CUDA_HOST_DEVICE constexpr TileIndex accumulator(int warp, int lane, int i, int j, int half) {
  return {warp_row(warp) + i * kMmaM + lane / 4 + half * 8, warp_col(warp) + j * kMmaN + (lane % 4) * 2};
}

/// Element index into X whose value an output (row, col) starts from: X[row, o + col mod d_h].
BD_CUDA_HOST_DEVICE constexpr long long window_source(const ProjectionParams& p, int row, int col) {
  return (long long)row * p.input_dim + p.offset + col % p.head_dim;
}

/// The launch grid: x over output column tiles, y over row tiles.
struct Grid {
  long long x, y;
};
BD_CUDA_HOST_DEVICE constexpr Grid grid_for(int rows, int out_cols) {
  return {(out_cols + (long long)kTileCols - 1) / kTileCols, (rows + (long long)kTileRows - 1) / kTileRows};
}
/// gridDim.y's hardware limit (x allows 2^31 − 1 and never binds: n·d_h < 2^31).
constexpr long long kMaxGridY = 65535;

}  // namespace bd::cuda::kernel
