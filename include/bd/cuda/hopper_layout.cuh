// bd/cuda/hopper_layout.cuh — the index arithmetic of the Hopper (sm_90a) BD projection kernel,
// as constexpr __host__ __device__ functions: the tile a CTA takes next, which X columns a stage
// of the ring holds, the 128-byte swizzle shared by TMA and wgmma, the wgmma shared-memory
// descriptor, where each accumulator of the m64nNk16 fragment sits, where a consumer thread reads
// its window values and writes its outputs. hopper_kernel.cuh calls exactly these, and
// tests/cuda/test_hopper_layout.cpp emulates the kernel through them on the host against models
// written from the PTX ISA (no GPU needed), so an index error is caught before a GPU is reached.
//
// The computation, per output tile of kBlockM rows × kBlockN columns (kBlockN / d_h heads that
// share the window):
//
//     acc = X[rows, o : o + d_h] broadcast to every head     (window stages: no MMA)
//     acc += X[rows, rest block b] · Cᵀ[cols, block b]ᵀ     (rest stages: wgmma, fp32)
//     K'[rows, cols] = round(acc)                            (once, through shared memory and TMA)
//
// Every stage of the ring holds kBlockK = 64 channels (one 128-byte swizzle row of 16-bit
// values) of each tile it carries: a rest stage the X tile and the Cᵀ tile; a window stage up to
// two X tiles of the window (d_h = 128 takes one slot of the ring per output tile, not two). C is
// stored K-major (Cᵀ, n·d_h × (d − d_h)) at plan time, so both wgmma operands are K-major.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BD_HOPPER_HD __host__ __device__
#else
#define BD_HOPPER_HD
#endif

namespace bd::cuda::hopper {

constexpr int kBlockM = 128;                // rows per CTA tile: two consumer warpgroups of 64
constexpr int kBlockN = 256;                // output columns per CTA tile (wgmma N = 256)
constexpr int kBlockK = 64;                 // channels per stage: 64 × 2 bytes = one swizzle row
constexpr int kConsumers = 2;               // consumer warpgroups
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);  // warpgroup 0 produces
constexpr int kWgmmaM = 64, kWgmmaK = 16;
constexpr int kKSteps = kBlockK / kWgmmaK;  // wgmma instructions per stage
constexpr int kAccumulators = kBlockN / 2;  // fp32 accumulators per consumer thread (m64n256)
constexpr int kRowBytes = kBlockK * 2;                            // 128: one swizzled row
constexpr int kSwizzleAtom = 8 * kRowBytes;                       // 1024: the pattern repeats every 8 rows
constexpr int kAStageBytes = kBlockM * kRowBytes;                 // 16 KiB
constexpr int kBStageBytes = kBlockN * kRowBytes;                 // 32 KiB
constexpr int kStageBytes = kAStageBytes + kBStageBytes;          // 48 KiB
constexpr int kSlabCols = 64;                                     // output columns per TMA store box
constexpr int kSlabs = kBlockN / kSlabCols;                       // 4 per consumer
constexpr int kSlabBytes = kWgmmaM * kSlabCols * 2;               // 8 KiB: 64 rows × 128 bytes
constexpr int kMaxStages = 4;
static_assert(kStageBytes % kSwizzleAtom == 0 && kAStageBytes % kSwizzleAtom == 0 && kSlabBytes % kSwizzleAtom == 0,
              "every TMA box and wgmma operand starts on a swizzle atom");

/// How a tile's outputs leave the SM. Staged: rounded into swizzled shared memory and written by
/// TMA stores (a round of stores must have read its slots before the next round overwrites
/// them: the consumers wait for it). Direct: each thread stores its rounded outputs from registers
/// (8 bytes per lane after one shuffle, so a warp's store covers whole 32-byte sectors), with no
/// shared memory and no wait — the stores drain while the next tile's MMA runs.
enum class Store : int { staged = 1, direct = 2 };

/// Two shapes of the CTA's shared memory for staged stores, both within an sm_90 SM's 227 KiB:
/// 3 stages of the ring and room to stage all 4 output slabs of each consumer (one round of TMA
/// stores per tile), or 4 stages — a deeper prefetch, for when loads are slow to arrive — and
/// room for 2 slabs (two rounds, the second waiting until the first round's stores have read
/// their slabs). Direct stores stage nothing.
BD_HOPPER_HD constexpr int epilogue_slots(int stages) { return stages == 3 ? kSlabs : kSlabs / 2; }
BD_HOPPER_HD constexpr int epilogue_bytes(int stages, Store store = Store::staged) {
  return store == Store::direct ? 0 : kConsumers * epilogue_slots(stages) * kSlabBytes;
}
/// Dynamic shared memory a CTA asks for: the ring, the output staging, the full[] and empty[]
/// mbarriers, and up to a swizzle atom lost to aligning the start (the runtime promises 16 bytes).
BD_HOPPER_HD constexpr int shared_bytes(int stages, Store store = Store::staged) {
  return stages * kStageBytes + epilogue_bytes(stages, store) + 2 * stages * 8 + kSwizzleAtom;
}
static_assert(shared_bytes(3) <= 227 * 1024 && shared_bytes(4) <= 227 * 1024, "the CTA's shared memory must fit an sm_90 SM");
static_assert(kSlabs % epilogue_slots(3) == 0 && kSlabs % epilogue_slots(4) == 0, "whole rounds of stores");

/// Arguments of one launch, as the kernel sees them (the tensor maps travel beside it).
struct Problem {
  int rows;          // L
  int input_dim;     // d
  int head_dim;      // d_h
  int out_cols;      // N = n·d_h
  int offset;        // o: the window is X[:, o : o + d_h]
  int cluster;       // CTAs per cluster along M: 1, 2 or 4 (each loads 1/cluster of the Cᵀ tile and multicasts it)
};

BD_HOPPER_HD constexpr int ceil_div(long long a, int b) { return int((a + b - 1) / b); }
BD_HOPPER_HD constexpr int m_blocks(const Problem& p) { return ceil_div(p.rows, kBlockM); }
BD_HOPPER_HD constexpr int n_blocks(const Problem& p) { return ceil_div(p.out_cols, kBlockN); }
/// The window's 64-column blocks: d_h / 64.
BD_HOPPER_HD constexpr int window_blocks(const Problem& p) { return p.head_dim / kBlockK; }
/// A window stage carries up to two of them, one X box each, at offsets 0 and kAStageBytes: the
/// ring's slots go to the rest's stages, whose MMA hides the loads behind them.
constexpr int kWindowBoxesPerStage = 2;
static_assert(kWindowBoxesPerStage * kAStageBytes <= kStageBytes, "a window stage's boxes fit a stage");
/// Window stages per tile: ⌈d_h / 128⌉.
BD_HOPPER_HD constexpr int window_steps(const Problem& p) { return (window_blocks(p) + kWindowBoxesPerStage - 1) / kWindowBoxesPerStage; }
/// X boxes on window step j.
BD_HOPPER_HD constexpr int window_boxes(const Problem& p, int j) {
  return window_blocks(p) - j * kWindowBoxesPerStage < kWindowBoxesPerStage ? window_blocks(p) - j * kWindowBoxesPerStage
                                                                             : kWindowBoxesPerStage;
}
/// Rest stages per tile: (d − d_h) / 64.
BD_HOPPER_HD constexpr int rest_blocks(const Problem& p) { return (p.input_dim - p.head_dim) / kBlockK; }
BD_HOPPER_HD constexpr int stages_per_tile(const Problem& p) { return window_steps(p) + rest_blocks(p); }

/// Units of work: a cluster takes `cluster` vertically adjacent tiles that share their column block
/// (and so their Cᵀ tile). Units run column block fastest: the ~grid/cluster units in flight cover
/// one or two row blocks, whose X rows are then read from memory once while Cᵀ (12 MiB at
/// DeepSeek's shape) stays in L2.
BD_HOPPER_HD constexpr int m_groups(const Problem& p) { return ceil_div(m_blocks(p), p.cluster); }
BD_HOPPER_HD constexpr long long work_units(const Problem& p) { return (long long)m_groups(p) * n_blocks(p); }

struct Tile {
  int m_block, n_block;
};
/// The tile that the CTA of rank `rank` in its cluster computes for work unit `unit`. When L has
/// an odd number of row blocks the last cluster's second tile lies past L: it computes on TMA's
/// zero fill and its stores are clipped, so both CTAs keep the same schedule.
BD_HOPPER_HD constexpr Tile tile_of(const Problem& p, long long unit, int rank) {
  return {int(unit / n_blocks(p)) * p.cluster + rank, int(unit % n_blocks(p))};
}

/// Stage s of a ring of `stages` holds the pipeline's step `step` (counted across tiles); its
/// barriers are in their phase `step / stages`, and a wait names that phase's parity.
BD_HOPPER_HD constexpr int stage_of(long long step, int stages) { return int(step % stages); }
BD_HOPPER_HD constexpr unsigned phase_parity(long long step, int stages) { return unsigned((step / stages) & 1); }

/// rest(k) for the first channel of a rest block: the X column where rest block b starts.
BD_HOPPER_HD constexpr int rest_column(int block, int offset, int head_dim) {
  return block * kBlockK < offset ? block * kBlockK : block * kBlockK + head_dim;
}
/// Whether step j of a tile is a window step (X only, no Cᵀ, no MMA): the first window_steps(p).
BD_HOPPER_HD constexpr bool is_window_step(const Problem& p, int j) { return j < window_steps(p); }
/// X column of box `box` of window step j: window block 2j + box.
BD_HOPPER_HD constexpr int window_column(const Problem& p, int j, int box) {
  return p.offset + (j * kWindowBoxesPerStage + box) * kBlockK;
}
/// X column of rest step j of a tile (window_steps(p) ≤ j < stages_per_tile(p)).
BD_HOPPER_HD constexpr int x_column(const Problem& p, int j) { return rest_column(j - window_steps(p), p.offset, p.head_dim); }
/// Cᵀ column (the rest channel index k) where rest step j starts.
BD_HOPPER_HD constexpr int c_column(const Problem& p, int j) { return (j - window_steps(p)) * kBlockK; }
/// Cᵀ rows a CTA loads per rest stage: with a cluster of 2 each loads half the tile and multicasts it.
BD_HOPPER_HD constexpr int c_box_rows(int cluster) { return kBlockN / cluster; }
/// Bytes a CTA's full barrier expects for step j: the window's X boxes, or on rest steps the X
/// tile and the whole Cᵀ tile (its own part and, with a cluster, the parts its peers multicast).
BD_HOPPER_HD constexpr unsigned expected_bytes(const Problem& p, int j) {
  return unsigned(is_window_step(p, j) ? window_boxes(p, j) * kAStageBytes : kStageBytes);
}

/// The 128-byte swizzle (TMA's CU_TENSOR_MAP_SWIZZLE_128B and wgmma's swizzle mode 1): within each
/// 1024-byte atom, the 16-byte chunk index (address bits 4–6) is XORed with the row within the atom
/// (bits 7–9). `offset` is relative to a 1024-byte aligned base.
BD_HOPPER_HD constexpr std::uint32_t swizzle128(std::uint32_t offset) { return offset ^ (((offset >> 7) & 7u) << 4); }
/// Byte offset of element (row, col) of a tile of 64 columns of 16-bit values stored by TMA with
/// the 128-byte swizzle.
BD_HOPPER_HD constexpr std::uint32_t swizzled_element(int row, int col) { return swizzle128(std::uint32_t(row * kRowBytes + col * 2)); }

/// wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): bits 0–13 the
/// start address >> 4, 16–29 the leading-dimension byte offset >> 4 (unused by K-major swizzled
/// layouts; 1 by convention), 32–45 the stride-dimension byte offset >> 4 (the distance between
/// 8-row groups: 1024 for 128-byte rows), 49–51 the base offset (0: atoms are 1024-aligned),
/// 62–63 the swizzle mode (1: 128-byte).
BD_HOPPER_HD constexpr std::uint64_t smem_descriptor(std::uint32_t address) {
  return std::uint64_t((address & 0x3FFFFu) >> 4) | (std::uint64_t(1) << 16) | (std::uint64_t(kSwizzleAtom >> 4) << 32) |
         (std::uint64_t(1) << 62);
}
/// Descriptor of consumer `consumer`'s A operand (its 64 rows of the X tile) for k-step ks of a stage
/// whose X tile starts at `a_stage`: the k-step moves the start 32 bytes along the swizzled row,
/// the hardware applies the swizzle to the address it forms.
BD_HOPPER_HD constexpr std::uint64_t a_descriptor(std::uint32_t a_stage, int consumer, int ks) {
  return smem_descriptor(a_stage + std::uint32_t(consumer * kWgmmaM * kRowBytes + ks * kWgmmaK * 2));
}
/// Descriptor of the B operand (all kBlockN rows of the Cᵀ tile) for k-step ks.
BD_HOPPER_HD constexpr std::uint64_t b_descriptor(std::uint32_t b_stage, int ks) {
  return smem_descriptor(b_stage + std::uint32_t(ks * kWgmmaK * 2));
}

/// The m64nNk16 fp32 accumulator fragment (PTX ISA, "Register Fragments" for wgmma D): register i
/// of thread `lane` in warp `warp` (0–3 of its warpgroup) holds row 16·warp + lane/4 + 8·((i/2) mod 2)
/// and column 8·(i/4) + 2·(lane mod 4) + (i mod 2). Pairs (i, i + 1), i even, are adjacent columns.
BD_HOPPER_HD constexpr int accumulator_row(int warp, int lane, int i) { return 16 * warp + lane / 4 + 8 * ((i / 2) % 2); }
BD_HOPPER_HD constexpr int accumulator_col(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + (i % 2); }

/// Where the window value of accumulator column `col` is: column col of the tile belongs to
/// head-local column col mod d_h, in window block (col mod d_h) / 64, which is box
/// block mod 2 of window step block / 2, at column (col mod d_h) mod 64 of that box.
BD_HOPPER_HD constexpr int window_block(int col, int head_dim) { return (col % head_dim) / kBlockK; }
BD_HOPPER_HD constexpr int window_step(int col, int head_dim) { return window_block(col, head_dim) / kWindowBoxesPerStage; }
BD_HOPPER_HD constexpr int window_box(int col, int head_dim) { return window_block(col, head_dim) % kWindowBoxesPerStage; }
BD_HOPPER_HD constexpr int window_col(int col, int head_dim) { return (col % head_dim) % kBlockK; }
/// The window step for accumulator register i of any lane: a fragment's 8-column chunk
/// (8·(i/4) … + 7) never straddles a 64-column block, so the lane's 2·(lane mod 4) does not change it.
BD_HOPPER_HD constexpr int window_step_of_register(int i, int head_dim) { return window_step(8 * (i / 4), head_dim); }
/// Accumulator register of head h (0 ≤ h < kBlockN / d_h) that starts from the same window value
/// as register i of head 0 (i < d_h / 2): same row, column + h·d_h.
BD_HOPPER_HD constexpr int head_register(int i, int h, int head_dim) { return i + h * (head_dim / 2); }
/// Byte offset, within a window stage, of the pair of window values that consumer `consumer`'s
/// thread (warp, lane) loads into accumulator pair (i, i + 1): its box, then the swizzled element.
BD_HOPPER_HD constexpr std::uint32_t window_pair_offset(int consumer, int warp, int lane, int i, int head_dim) {
  return std::uint32_t(window_box(accumulator_col(lane, i), head_dim) * kAStageBytes) +
         swizzled_element(consumer * kWgmmaM + accumulator_row(warp, lane, i), window_col(accumulator_col(lane, i), head_dim));
}

/// Output staging: consumer c's 64 rows of the tile as kSlabs slabs of 64 columns, each one TMA store
/// box (64 rows × 128 bytes, 128-byte swizzle), staged `slots` slabs at a time (slab s in slot
/// s mod slots). Byte offset in the epilogue area of the pair (i, i + 1) of thread (warp, lane).
BD_HOPPER_HD constexpr int slab_of(int col) { return col / kSlabCols; }
/// The slab of register i of any lane (a fragment's 8-column chunk lies in one slab).
BD_HOPPER_HD constexpr int slab_of_register(int i) { return slab_of(8 * (i / 4)); }
BD_HOPPER_HD constexpr std::uint32_t slot_offset(int consumer, int slab, int slots) {
  return std::uint32_t((consumer * slots + slab % slots) * kSlabBytes);
}
BD_HOPPER_HD constexpr std::uint32_t epilogue_pair_offset(int consumer, int warp, int lane, int i, int slots) {
  return slot_offset(consumer, slab_of(accumulator_col(lane, i)), slots) +
         swizzled_element(accumulator_row(warp, lane, i), accumulator_col(lane, i) % kSlabCols);
}
/// Direct stores. A thread's registers come in blocks of 8: block b holds the fragment's 8-column
/// chunks 2b and 2b + 1, each as a pair (two adjacent columns) in row half h (rows r and r + 8).
/// Lanes 2q and 2q + 1 of a quad trade one pair per (b, h) by a shuffle: the even lane then holds
/// columns 8·(2b) + 4q' … + 3 of chunk 2b (q' = lane mod 4 / 2), the odd lane the same columns of
/// chunk 2b + 1 — so the four lanes of a row cover chunks 2b and 2b + 1 whole, 32 contiguous bytes,
/// one sector, and the warp's 8-byte stores write 8 full sectors. Register of the pair of chunk
/// 2b + parity in row half h:
BD_HOPPER_HD constexpr int direct_register(int block, int half, int parity) { return 4 * (2 * block + parity) + 2 * half; }
constexpr int kDirectBlocks = kAccumulators / 8;  // 16 blocks of 16 columns
/// A lane keeps the pair of its own parity's chunk and sends the other one to lane ^ 1.
BD_HOPPER_HD constexpr int direct_kept_parity(int lane) { return lane & 1; }
/// The received pair goes after the kept one on an even lane (it holds the next two columns), before it on an odd lane.
BD_HOPPER_HD constexpr bool direct_kept_first(int lane) { return (lane & 1) == 0; }
/// Tile column (within the consumer's 256) of the first of the 4 values lane `lane` stores for block b.
BD_HOPPER_HD constexpr int direct_col(int lane, int block) { return 8 * (2 * block + (lane & 1)) + 2 * ((lane % 4) & ~1); }

/// Global coordinates {column, row} of slab `slab` of consumer `consumer` in tile t.
struct Coords {
  int col, row;
};
BD_HOPPER_HD constexpr Coords store_coords(Tile t, int consumer, int slab) {
  return {t.n_block * kBlockN + slab * kSlabCols, t.m_block * kBlockM + consumer * kWgmmaM};
}
/// TMA coordinates {column, row} of the X box of rest step j of tile t, of box `box` of window step
/// j, and of the Cᵀ box the CTA of rank `rank` loads (with a cluster, into its peers too) on a rest step.
BD_HOPPER_HD constexpr Coords x_coords(const Problem& p, Tile t, int j) { return {x_column(p, j), t.m_block * kBlockM}; }
BD_HOPPER_HD constexpr Coords window_coords(const Problem& p, Tile t, int j, int box) {
  return {window_column(p, j, box), t.m_block * kBlockM};
}
BD_HOPPER_HD constexpr Coords c_coords(const Problem& p, Tile t, int j, int rank) {
  return {c_column(p, j), t.n_block * kBlockN + rank * c_box_rows(p.cluster)};
}
/// Where, in a stage's Cᵀ tile, the box of rank `rank` lands (the same offset in every CTA of the cluster).
BD_HOPPER_HD constexpr std::uint32_t c_box_offset(int rank, int cluster) { return std::uint32_t(rank * c_box_rows(cluster) * kRowBytes); }

/// The shapes the kernel computes; other shapes keep the other paths (projection.cuh).
BD_HOPPER_HD constexpr bool supported_shape(int input_dim, int head_dim, int offset) {
  return (head_dim == 64 || head_dim == 128 || head_dim == 256) && input_dim % kBlockK == 0 && offset % kBlockK == 0 &&
         input_dim - head_dim >= kBlockK && offset >= 0 && offset <= input_dim - head_dim;
}

}  // namespace bd::cuda::hopper
