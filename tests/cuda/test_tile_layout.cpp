// The BD projection kernel's index arithmetic (bd/cuda/tile_layout.cuh), checked on the host with
// no GPU: every CTA of the launch grid is emulated step by step through the same functions the
// kernel calls, with shared memory, ldmatrix and mma.sync.m16n8k16 modelled from the PTX ISA's
// tables (written out below, independently of the kernel). Each shared-memory element carries the
// index of the global element it was copied from and the k-tile it was copied for, so the test
// sees every read: the kernel must read X_rest and C exactly where the tables say, never a
// window channel, never padding, never a stage the next k-tile has overwritten, and write every
// output exactly once. Values are small integers, so the emulated sums are exact and K' must equal
// the reference bit for bit.
#include <catch2/catch.hpp>

#include <bd/cuda/tile_layout.cuh>

#include <array>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace bd::cuda::kernel;

constexpr long long kUnwritten = -2, kZeroFill = -1;

/// One shared-memory element: the global index it was copied from (or zero-fill) and for which k-tile.
struct Slot {
  long long source = kUnwritten;
  int k_tile = -1;
};

// ---- The PTX ISA's fragment tables (mma.m16n8k16 with .f16/.bf16 inputs, ldmatrix .m8n8.x4) ----
// group = lane / 4, quad = lane mod 4.
// A (16 × 16): a_i, i = 0…7, at row group + 8·((i / 2) mod 2), column 2·quad + (i mod 2) + 8·(i / 4);
//              register r holds a_{2r}, a_{2r+1}.
// B (16 × 8):  b_i, i = 0…3, at row (k) 2·quad + (i mod 2) + 8·(i / 2), column (n) group; register h
//              holds b_{2h}, b_{2h+1}.
// C (16 × 8):  c_i, i = 0…3, at row group + 8·(i / 2), column 2·quad + (i mod 2).
// ldmatrix.x4: lanes 8m … 8m+7 give the row addresses of matrix m; lane t receives, in register m,
//              row t / 4, columns 2·(t mod 4), +1 of matrix m (.trans: column t / 4, rows 2·(t mod 4), +1).
int a_row(int lane, int i) { return lane / 4 + 8 * ((i / 2) % 2); }
int a_col(int lane, int i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 4); }
int b_row(int lane, int i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 2); }
int b_col(int lane) { return lane / 4; }
int c_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
int c_col(int lane, int i) { return 2 * (lane % 4) + i % 2; }

using Registers = std::array<std::array<std::array<Slot, 2>, 4>, 32>;  // [lane][register][half]

/// ldmatrix.x4 (.trans when `trans`) from `smem` with the row addresses the 32 lanes give.
Registers ldmatrix(const std::vector<Slot>& smem, const std::array<int, 32>& address, bool trans) {
  Registers out{};
  for (int lane = 0; lane < 32; ++lane)
    for (int m = 0; m < 4; ++m)
      for (int e = 0; e < 2; ++e)
        out[lane][m][e] = trans ? smem[address[8 * m + 2 * (lane % 4) + e] + lane / 4]
                                : smem[address[8 * m + lane / 4] + 2 * (lane % 4) + e];
  return out;
}

struct Shape {
  int rows, input_dim, head_dim, heads, offset;
  std::string text() const {
    return "L=" + std::to_string(rows) + " d=" + std::to_string(input_dim) + " d_h=" + std::to_string(head_dim) +
           " n=" + std::to_string(heads) + " o=" + std::to_string(offset);
  }
};

/// Emulates the whole launch for one shape and checks every read and write on the way.
void emulate(const Shape& shape) {
  INFO(shape.text());
  const int L = shape.rows, d = shape.input_dim, dh = shape.head_dim, N = shape.heads * dh, K = d - dh;
  const ProjectionParams p{nullptr, nullptr, nullptr, L, d, dh, shape.heads, shape.offset};
  std::mt19937 rng(unsigned(L * 7919 + d * 31 + dh * 7 + shape.offset));
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<double> x(std::size_t(L) * d), c(std::size_t(K) * N);
  for (auto& v : x) v = small(rng);
  for (auto& v : c) v = small(rng);
  const auto value = [&](const std::vector<double>& from, const Slot& s) { return s.source == kZeroFill ? 0.0 : from[std::size_t(s.source)]; };

  std::vector<double> out(std::size_t(L) * N, 0.0);
  std::vector<int> writes(out.size(), 0);
  bool reads_ok = true;  // one REQUIRE per failure would drown the output: the first failure is reported in full
  const auto expect = [&](bool ok, const auto& what) {  // built messages are built only under an `if` that failed
    if (!ok && reads_ok) {
      reads_ok = false;
      FAIL_CHECK(what);
    }
  };

  const Grid grid = grid_for(L, N);
  for (long long by = 0; by < grid.y; ++by)
    for (long long bx = 0; bx < grid.x; ++bx) {
      const int row0 = int(by) * kTileRows, col0 = int(bx) * kTileCols;
      std::vector<std::vector<Slot>> tile_x(kStages, std::vector<Slot>(kTileRows * kStrideA));
      std::vector<std::vector<Slot>> tile_c(kStages, std::vector<Slot>(kTileDepth * kStrideB));
      std::vector<double> acc(std::size_t(kWarps) * 32 * kWarpTilesM * kWarpTilesN * 4);
      const auto acc_at = [&](int warp, int lane, int i, int j) {
        return &acc[((std::size_t(warp * 32 + lane) * kWarpTilesM + i) * kWarpTilesN + j) * 4];
      };

      // Accumulators start from the window; every column pair of the CTA tile is held exactly once.
      std::vector<int> held(kTileRows * kTileCols, 0);
      for (int warp = 0; warp < kWarps; ++warp)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < kWarpTilesM; ++i)
            for (int j = 0; j < kWarpTilesN; ++j)
              for (int half = 0; half < 2; ++half) {
                const TileIndex at = accumulator(warp, lane, i, j, half);
                expect(at.row >= 0 && at.row < kTileRows && at.col >= 0 && at.col + 1 < kTileCols, "accumulator outside the CTA tile");
                // The PTX C table: this pair is c_{2·half}, c_{2·half+1} of m-tile i, n-tile j.
                expect(at.row == warp_row(warp) + i * kMmaM + c_row(lane, 2 * half) &&
                           at.col == warp_col(warp) + j * kMmaN + c_col(lane, 2 * half),
                       "accumulator position differs from the mma C fragment table");
                ++held[at.row * kTileCols + at.col], ++held[at.row * kTileCols + at.col + 1];
                const int r = row0 + at.row, col = col0 + at.col;
                double* pair = acc_at(warp, lane, i, j) + 2 * half;
                if (r < L && col < N) {
                  expect(col % dh != dh - 1, "a thread's column pair crosses a head boundary");
                  const long long w = window_source(p, r, col);
                  expect(w == (long long)r * d + shape.offset + col % dh, "window_source reads the wrong channel");
                  pair[0] = x[std::size_t(w)], pair[1] = x[std::size_t(w) + 1];
                }
              }
      for (int h : held)
        if (h != 1) expect(false, "a CTA-tile output is held by " + std::to_string(h) + " accumulators");

      // One k-tile's copies into shared memory, as the kernel's load(): every chunk of both tiles
      // copied exactly once, from where the rest mapping says, zero-filled exactly past L, K, N.
      const auto load = [&](int stage, int k_tile) {
        const int k0 = k_tile * kTileDepth;
        std::vector<int> x_cover(kTileRows * kTileDepth, 0), c_cover(kTileDepth * kTileCols, 0);
        for (int thread = 0; thread < kThreads; ++thread)
          for (int pass = 0; pass < kChunkPasses; ++pass) {
            const TileIndex at = x_chunk(thread, pass);
            expect(at.row >= 0 && at.row < kTileRows && at.col >= 0 && at.col + kChunk <= kTileDepth && at.col % kChunk == 0,
                   "X chunk outside the tile or not 16-byte aligned");
            const long long from = x_source(p, row0, k0, at);
            const int row = row0 + at.row, k = k0 + at.col;
            const bool inside = row < L && k < K;
            expect(inside ? from >= 0 : from == kZeroFill, "X chunk zero-filled where it should be read, or the reverse");
            for (int e = 0; e < kChunk; ++e) {
              ++x_cover[at.row * kTileDepth + at.col + e];
              Slot& s = tile_x[stage][at.row * kStrideA + at.col + e];
              s = {from >= 0 ? from + e : kZeroFill, k_tile};
              if (inside)  // the chunk's 8 elements are 8 consecutive rest channels: it never straddles the window
                expect(k + e < K && from + e == (long long)row * d + rest_channel(k + e, shape.offset, dh),
                       "X chunk straddles the window or reads past the row");
            }
          }
        for (int thread = 0; thread < kThreads; ++thread)
          for (int pass = 0; pass < kChunkPasses; ++pass) {
            const TileIndex at = c_chunk(thread, pass);
            expect(at.row >= 0 && at.row < kTileDepth && at.col >= 0 && at.col + kChunk <= kTileCols && at.col % kChunk == 0,
                   "C chunk outside the tile or not 16-byte aligned");
            const long long from = c_source(p, col0, k0, at);
            const int k = k0 + at.row, col = col0 + at.col;
            const bool inside = k < K && col < N;
            expect(inside ? from == (long long)k * N + col : from == kZeroFill, "C chunk from the wrong place");
            if (inside) expect(col + kChunk <= N, "C chunk reads past the row");
            for (int e = 0; e < kChunk; ++e) {
              ++c_cover[at.row * kTileCols + at.col + e];
              tile_c[stage][at.row * kStrideB + at.col + e] = {from >= 0 ? from + e : kZeroFill, k_tile};
            }
          }
        for (int v : x_cover)
          if (v != 1) expect(false, "an X tile element copied " + std::to_string(v) + " times");
        for (int v : c_cover)
          if (v != 1) expect(false, "a C tile element copied " + std::to_string(v) + " times");
      };

      // One k-tile's tensor-core work for every warp, as the kernel's inner loop.
      const auto compute = [&](int k_tile) {
        const int k0 = k_tile * kTileDepth;
        const std::vector<Slot>& xs = tile_x[stage_of(k_tile)];
        const std::vector<Slot>& cs = tile_c[stage_of(k_tile)];
        for (int warp = 0; warp < kWarps; ++warp)
          for (int ks = 0; ks < kTileDepth; ks += kMmaK) {
            std::array<Registers, kWarpTilesM> a;
            std::array<Registers, kWarpTilesN / 2> b;
            for (int i = 0; i < kWarpTilesM; ++i) {
              std::array<int, 32> address;
              for (int lane = 0; lane < 32; ++lane) {
                address[lane] = a_ldmatrix_offset(warp, i, ks, lane);
                const int row = address[lane] / kStrideA, col = address[lane] % kStrideA;
                expect(address[lane] % kChunk == 0 && row < kTileRows && col + 8 <= kTileDepth,
                       "an A ldmatrix row is misaligned, outside the tile or in its padding");
              }
              a[i] = ldmatrix(xs, address, false);
            }
            for (int jj = 0; jj < kWarpTilesN / 2; ++jj) {
              std::array<int, 32> address;
              for (int lane = 0; lane < 32; ++lane) {
                address[lane] = b_ldmatrix_offset(warp, jj, ks, lane);
                const int row = address[lane] / kStrideB, col = address[lane] % kStrideB;
                expect(address[lane] % kChunk == 0 && row < kTileDepth && col + 8 <= kTileCols,
                       "a B ldmatrix row is misaligned, outside the tile or in its padding");
              }
              b[jj] = ldmatrix(cs, address, true);
            }
            for (int i = 0; i < kWarpTilesM; ++i)
              for (int j = 0; j < kWarpTilesN; ++j) {
                // Assemble the 16 × 16 A and 16 × 8 B the mma sees, through the PTX tables.
                Slot A[16][16], B[16][8];
                for (int lane = 0; lane < 32; ++lane) {
                  for (int q = 0; q < 8; ++q) A[a_row(lane, q)][a_col(lane, q)] = a[i][lane][q / 2][q % 2];
                  for (int q = 0; q < 4; ++q)
                    B[b_row(lane, q)][b_col(lane)] = b[b_load(j)][lane][b_register(j, q / 2)][q % 2];
                }
                const int grow0 = row0 + warp_row(warp) + i * kMmaM, gcol0 = col0 + warp_col(warp) + j * kMmaN;
                for (int m = 0; m < 16; ++m)
                  for (int kk = 0; kk < 16; ++kk) {
                    const Slot& s = A[m][kk];
                    const int row = grow0 + m, k = k0 + ks + kk;
                    const long long want = row < L && k < K ? (long long)row * d + rest_channel(k, shape.offset, dh) : kZeroFill;
                    if (s.k_tile != k_tile)
                      expect(false, "A read a stage holding k-tile " + std::to_string(s.k_tile) + " while computing " +
                                        std::to_string(k_tile) + " (double-buffer hazard)");
                    if (s.source != want)
                      expect(false, "A element (" + std::to_string(m) + ", " + std::to_string(kk) + ") of m-tile " +
                                        std::to_string(i) + " read X[" + std::to_string(s.source) + "], expected " + std::to_string(want));
                  }
                for (int kk = 0; kk < 16; ++kk)
                  for (int n = 0; n < 8; ++n) {
                    const Slot& s = B[kk][n];
                    const int k = k0 + ks + kk, col = gcol0 + n;
                    const long long want = k < K && col < N ? (long long)k * N + col : kZeroFill;
                    if (s.k_tile != k_tile) expect(false, "B read a stale stage (double-buffer hazard)");
                    if (s.source != want)
                      expect(false, "B element (" + std::to_string(kk) + ", " + std::to_string(n) + ") of n-tile " +
                                        std::to_string(j) + " read C[" + std::to_string(s.source) + "], expected " + std::to_string(want));
                  }
                // D += A·B, scattered back to the lanes through the C table.
                for (int lane = 0; lane < 32; ++lane)
                  for (int q = 0; q < 4; ++q) {
                    double sum = 0;
                    for (int kk = 0; kk < 16; ++kk) sum += value(x, A[c_row(lane, q)][kk]) * value(c, B[kk][c_col(lane, q)]);
                    acc_at(warp, lane, i, j)[q] += sum;
                  }
              }
          }
      };

      // The kernel's pipeline: k-tile t + 1 is copied into its stage before k-tile t is computed.
      const int k_tiles = (K + kTileDepth - 1) / kTileDepth;
      if (k_tiles > 0) load(stage_of(0), 0);
      for (int t = 0; t < k_tiles; ++t) {
        if (t + 1 < k_tiles) load(stage_of(t + 1), t + 1);
        compute(t);
      }

      // Store: each in-range pair to K', once.
      for (int warp = 0; warp < kWarps; ++warp)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < kWarpTilesM; ++i)
            for (int j = 0; j < kWarpTilesN; ++j)
              for (int half = 0; half < 2; ++half) {
                const TileIndex at = accumulator(warp, lane, i, j, half);
                const int r = row0 + at.row, col = col0 + at.col;
                if (r >= L || col >= N) continue;
                for (int e = 0; e < 2; ++e) {
                  out[std::size_t(r) * N + col + e] = acc_at(warp, lane, i, j)[2 * half + e];
                  ++writes[std::size_t(r) * N + col + e];
                }
              }
    }
  CHECK(reads_ok);

  std::size_t wrong_count = 0, wrong_value = 0;
  for (int r = 0; r < L; ++r)
    for (int col = 0; col < N; ++col) {
      double ref = x[std::size_t(r) * d + shape.offset + col % dh];
      for (int k = 0; k < K; ++k) ref += x[std::size_t(r) * d + rest_channel(k, shape.offset, dh)] * c[std::size_t(k) * N + col];
      wrong_count += writes[std::size_t(r) * N + col] != 1;
      wrong_value += out[std::size_t(r) * N + col] != ref;
    }
  CHECK(wrong_count == 0);  // every output written exactly once
  CHECK(wrong_value == 0);  // and equal to X[:, window] + X[:, rest]·C exactly (integer data)
}

}  // namespace

TEST_CASE("every thread's chunks tile X and C exactly, and the launch grid covers K'", "[cuda-layout]") {
  CHECK(kChunkPasses == 2);
  const Grid g = grid_for(257, 3 * 128);
  CHECK(g.x == 3);
  CHECK(g.y == 3);
  CHECK(grid_for(0, 16).y == 0);
  CHECK(grid_for(kTileRows * int(kMaxGridY), 8).y == kMaxGridY);
  CHECK(grid_for(kTileRows * int(kMaxGridY) + 1, 8).y == kMaxGridY + 1);
  for (int k = 0; k < 64; ++k) CHECK(rest_channel(k, 16, 8) == (k < 16 ? k : k + 8));
}

TEST_CASE("the kernel reads X_rest and C where the PTX tables say, for every window of DeepSeek's d = 512, d_h = 128", "[cuda-layout]") {
  // Two heads: two column tiles; L = 130: a full and a partial row tile; K = 384: 12 k-tiles.
  for (int o = 0; o <= 512 - 128; o += 8) emulate({130, 512, 128, 2, o});
}

TEST_CASE("small odd shapes: partial k-tiles, partial row and column tiles, the window anywhere", "[cuda-layout]") {
  for (int o = 0; o <= 112 - 8; o += 8) emulate({7, 112, 8, 3, o});  // K = 104: 4 k-tiles, the last partial
  for (int o : {0, 40, 88}) emulate({131, 104, 16, 9, o});           // n·d_h = 144: a partial column tile
  for (int o = 0; o <= 64 - 16; o += 8) emulate({33, 64, 16, 9, o});  // the GPU test's shape
  emulate({33, 16, 16, 2, 0});                                      // the window is all of X: no k-tile
  emulate({1, 200, 8, 1, 96});                                      // one row, one head, 7 k-tiles
}
