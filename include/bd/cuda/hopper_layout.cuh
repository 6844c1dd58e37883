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
// values): window stages hold only the X tile, rest stages the X tile and the Cᵀ tile. C is
// stored K-major (Cᵀ, n·d_h × (d − d_h)) at plan time, so both wgmma operands are K-major.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define BD_HOPPER_HD __host__ __device__
#else
#define BD_HOPPER_HD
#endif

namespace bd::cuda::hopper {

constexpr int kBlockM = 128;                // rows per CTA tile, cooperative: two consumer warpgroups of 64
constexpr int kPingPongBlockM = 64;         // rows per tile, ping-pong: each consumer its own tile, alternately
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
constexpr int kBStageBytes = kBlockN * kRowBytes;                 // 32 KiB: the Cᵀ tile of a stage
constexpr int kSlabCols = 64;                                     // output columns per TMA store box
constexpr int kSlabs = kBlockN / kSlabCols;                       // 4 per consumer
constexpr int kSlabBytes = kWgmmaM * kSlabCols * 2;               // 8 KiB: 64 rows × 128 bytes
constexpr int kMaxStages = 4;

/// Two schedules of the consumers, named by the rows of a tile (`block_m`):
///   - cooperative (128): both consumers work on one 128 × 256 tile, 64 rows each, and start the
///     next tile together: the tensor cores idle while both round and store;
///   - ping-pong (64): each consumer takes every other 64 × 256 tile of the CTA's sequence, so one
///     consumer's epilogue and window loads run under the other's wgmma. Its stage carries half
///     the X rows for the same Cᵀ tile.
/// A stage holds the X tile (block_m rows of 64 channels), then the Cᵀ tile.
BD_HOPPER_HD constexpr int a_stage_bytes(int block_m) { return block_m * kRowBytes; }
BD_HOPPER_HD constexpr int stage_bytes(int block_m) { return a_stage_bytes(block_m) + kBStageBytes; }
constexpr int kAStageBytes = a_stage_bytes(kBlockM);  // 16 KiB (cooperative)
constexpr int kStageBytes = stage_bytes(kBlockM);     // 48 KiB (cooperative)
static_assert(stage_bytes(kPingPongBlockM) % kSwizzleAtom == 0 && a_stage_bytes(kPingPongBlockM) % kSwizzleAtom == 0 &&
                  kStageBytes % kSwizzleAtom == 0 && kAStageBytes % kSwizzleAtom == 0 && kSlabBytes % kSwizzleAtom == 0,
              "every TMA box and wgmma operand starts on a swizzle atom");

/// The CTA's shared memory, within an sm_90 SM's 227 KiB. Cooperative: 3 stages of the ring and
/// room to stage all 4 output slabs of each consumer (one round of TMA stores per tile), or 4
/// stages — a deeper prefetch, for when loads are slow to arrive — and room for 2 slabs (two
/// rounds, the second waiting until the first round's stores have read their slabs). Ping-pong:
/// 4 stages of 40 KiB and all 4 slabs of each consumer.
BD_HOPPER_HD constexpr int epilogue_slots(int stages, int block_m = kBlockM) {
  return block_m == kPingPongBlockM || stages == 3 ? kSlabs : kSlabs / 2;
}
BD_HOPPER_HD constexpr int epilogue_bytes(int stages, int block_m = kBlockM) { return kConsumers * epilogue_slots(stages, block_m) * kSlabBytes; }
/// Dynamic shared memory a CTA asks for: the ring, the output staging, the full[] and empty[]
/// mbarriers, the two turn[] mbarriers of ping-pong, and up to a swizzle atom lost to aligning the
/// start (the runtime promises 16 bytes).
BD_HOPPER_HD constexpr int shared_bytes(int stages, int block_m = kBlockM) {
  return stages * stage_bytes(block_m) + epilogue_bytes(stages, block_m) + (2 * stages + kConsumers) * 8 + kSwizzleAtom;
}
static_assert(shared_bytes(3) <= 227 * 1024 && shared_bytes(4) <= 227 * 1024 && shared_bytes(4, kPingPongBlockM) <= 227 * 1024,
              "the CTA's shared memory must fit an sm_90 SM");
static_assert(kSlabs % epilogue_slots(3) == 0 && kSlabs % epilogue_slots(4) == 0, "whole rounds of stores");

/// Arguments of one launch, as the kernel sees them (the tensor maps travel beside it).
struct Problem {
  int rows;          // L
  int input_dim;     // d
  int head_dim;      // d_h
  int out_cols;      // N = n·d_h
  int offset;        // o: the window is X[:, o : o + d_h]
  int cluster;       // CTAs per cluster along M: 1, 2 or 4 (each loads 1/cluster of the Cᵀ tile and multicasts it)
  int block_m = kBlockM;  // rows per tile: kBlockM (cooperative) or kPingPongBlockM (ping-pong)
};

BD_HOPPER_HD constexpr bool is_pingpong(const Problem& p) { return p.block_m == kPingPongBlockM; }
/// Consumer warpgroups that read each stage (and so release it): both, or in ping-pong the one
/// whose tile it belongs to.
BD_HOPPER_HD constexpr int stage_readers(const Problem& p) { return is_pingpong(p) ? 1 : kConsumers; }
/// Arrivals that free a stage: every reading consumer warp of every CTA of the cluster (a peer's
/// producer multicasts into this CTA's copy of the stage too).
BD_HOPPER_HD constexpr int empty_arrivals(const Problem& p) { return stage_readers(p) * 4 * p.cluster; }
/// The tiles of a CTA's sequence (0, 1, 2, …: unit first_unit + i·unit_stride) that consumer
/// `consumer` computes: all of them (cooperative) or every other one (ping-pong), from its first.
BD_HOPPER_HD constexpr int consumer_first_tile(const Problem& p, int consumer) { return is_pingpong(p) ? consumer : 0; }
BD_HOPPER_HD constexpr int consumer_tile_stride(const Problem& p) { return is_pingpong(p) ? kConsumers : 1; }
/// The 64-row half of its tile that a consumer computes: its own index (cooperative) or 0.
BD_HOPPER_HD constexpr int consumer_half(const Problem& p, int consumer) { return is_pingpong(p) ? 0 : consumer; }
/// Ping-pong's turns. mbarrier.try_wait.parity tells only whether the phase of a given parity has
/// completed, so a waiter must never run two phases ahead of a barrier; a ping-pong consumer whose
/// next tile begins `steps` ≥ stages steps after its previous one would. So the consumers take
/// turns: the consumer of tile i ≥ 1 of the CTA's sequence waits, before its first stage, until
/// the consumer of tile i − 1 has waited for all of that tile's stages (every step before its own
/// has then landed), which it signals on turn[i mod 2] (one arrival). turn[c]'s k-th phase
/// completes with the signal of tile 2k + 1 − c; tile i is its consumer's ⌊(i − 1)/2⌋-th wait.
BD_HOPPER_HD constexpr int turn_barrier(long long tile) { return int(tile % kConsumers); }
BD_HOPPER_HD constexpr unsigned turn_parity(long long tile) { return unsigned(((tile - 1) / 2) & 1); }

BD_HOPPER_HD constexpr int ceil_div(long long a, int b) { return int((a + b - 1) / b); }
BD_HOPPER_HD constexpr int m_blocks(const Problem& p) { return ceil_div(p.rows, p.block_m); }
BD_HOPPER_HD constexpr int n_blocks(const Problem& p) { return ceil_div(p.out_cols, kBlockN); }
/// Window stages per tile: d_h / 64.
BD_HOPPER_HD constexpr int window_blocks(const Problem& p) { return p.head_dim / kBlockK; }
/// Rest stages per tile: (d − d_h) / 64.
BD_HOPPER_HD constexpr int rest_blocks(const Problem& p) { return (p.input_dim - p.head_dim) / kBlockK; }
BD_HOPPER_HD constexpr int stages_per_tile(const Problem& p) { return window_blocks(p) + rest_blocks(p); }

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
/// X column of step j of a tile (0 ≤ j < stages_per_tile): the window's blocks, then the rest's.
BD_HOPPER_HD constexpr int x_column(const Problem& p, int j) {
  return j < window_blocks(p) ? p.offset + j * kBlockK : rest_column(j - window_blocks(p), p.offset, p.head_dim);
}
/// Whether step j of a tile is a window step (X only, no Cᵀ, no MMA).
BD_HOPPER_HD constexpr bool is_window_step(const Problem& p, int j) { return j < window_blocks(p); }
/// Cᵀ column (the rest channel index k) where rest step j starts.
BD_HOPPER_HD constexpr int c_column(const Problem& p, int j) { return (j - window_blocks(p)) * kBlockK; }
/// Cᵀ rows a CTA loads per rest stage: with a cluster of 2 each loads half the tile and multicasts it.
BD_HOPPER_HD constexpr int c_box_rows(int cluster) { return kBlockN / cluster; }
/// Bytes a CTA's full barrier expects for step j: the X tile, and on rest steps the whole Cᵀ tile
/// (its own half and, with a cluster, the half its peer multicasts).
BD_HOPPER_HD constexpr unsigned expected_bytes(const Problem& p, int j) {
  return unsigned(is_window_step(p, j) ? a_stage_bytes(p.block_m) : stage_bytes(p.block_m));
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
/// Descriptor of the A operand of the 64-row half `half` of the X tile (consumer_half) for k-step
/// ks of a stage whose X tile starts at `a_stage`: the k-step moves the start 32 bytes along the
/// swizzled row, the hardware applies the swizzle to the address it forms.
BD_HOPPER_HD constexpr std::uint64_t a_descriptor(std::uint32_t a_stage, int half, int ks) {
  return smem_descriptor(a_stage + std::uint32_t(half * kWgmmaM * kRowBytes + ks * kWgmmaK * 2));
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

/// The window stage (0 ≤ w < d_h / 64) that holds the window value of accumulator column `col`,
/// and that value's column within the stage's 64: column col of the tile belongs to head-local
/// column col mod d_h.
BD_HOPPER_HD constexpr int window_step(int col, int head_dim) { return (col % head_dim) / kBlockK; }
BD_HOPPER_HD constexpr int window_col(int col, int head_dim) { return (col % head_dim) % kBlockK; }
/// The same for accumulator register i of any lane: a fragment's 8-column chunk (8·(i/4) … + 7)
/// never straddles a 64-column block, so the lane's 2·(lane mod 4) does not change the block.
BD_HOPPER_HD constexpr int window_step_of_register(int i, int head_dim) { return window_step(8 * (i / 4), head_dim); }
/// Accumulator register of head h (0 ≤ h < kBlockN / d_h) that starts from the same window value
/// as register i of head 0 (i < d_h / 2): same row, column + h·d_h.
BD_HOPPER_HD constexpr int head_register(int i, int h, int head_dim) { return i + h * (head_dim / 2); }
/// Byte offset, within a window stage's X tile, of the pair of window values that the thread
/// (warp, lane) of the consumer computing half `half` loads into accumulator pair (i, i + 1).
BD_HOPPER_HD constexpr std::uint32_t window_pair_offset(int half, int warp, int lane, int i, int head_dim) {
  return swizzled_element(half * kWgmmaM + accumulator_row(warp, lane, i), window_col(accumulator_col(lane, i), head_dim));
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
/// Global coordinates {column, row} of slab `slab` of the 64-row half `half` of tile t.
struct Coords {
  int col, row;
};
BD_HOPPER_HD constexpr Coords store_coords(const Problem& p, Tile t, int half, int slab) {
  return {t.n_block * kBlockN + slab * kSlabCols, t.m_block * p.block_m + half * kWgmmaM};
}
/// TMA coordinates {column, row} of the X box of step j of tile t, and of the Cᵀ box the CTA of
/// rank `rank` loads (with a cluster, into its peer too) on a rest step.
BD_HOPPER_HD constexpr Coords x_coords(const Problem& p, Tile t, int j) { return {x_column(p, j), t.m_block * p.block_m}; }
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
