// bd/kernel/loop.hpp — the loop nest around a micro-kernel (BLIS's, Van Zee & van de Geijn
// 2015, transposed for column-major output):
//
//   for each column block of ≤ nc columns (a thread's share)
//     for each depth pass of ≤ kc (K split evenly: no remainder)    B pass packed: kc × nc, L2/L3
//       for each row block of mc rows                               A packed: mc × kc, L2
//         for each NR-column micro-panel of B                       kc × NR, stays in L1
//           for each MR-row micro-panel of A                        streams from L2
//             micro-kernel: MR × NR accumulators in registers
//
// Only one depth pass of B is packed at a time, so a deep product (BDLinear's h = x·B over
// d_in = 4096) streams its packed B from L2/L3 once per row block instead of from memory.
//
// The first depth pass starts the accumulators from init(c) (BD's basis channel, a bias or 0),
// later passes from the output itself: the output is written once per pass, never filled.
// The loop nest is the same for every instruction set; what differs is held in a PackedKernel:
// the micro-kernel's tile shape (mr, nr), its tile() and the packing for that shape, taken from
// PortableKernel / Avx2Kernel / Avx512Kernel<T> when the product runs, so a program compiles
// this nest once per scalar type, not once per (instruction set, scalar type). The blocks and
// the tile's prefetch distance come from the CPU's context (context.hpp). Each OpenMP thread
// owns an equal share of the columns (and of the rows when columns are few); every buffer is
// allocated before the parallel region, so nothing inside it can throw.
#pragma once

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "bd/base/workspace.hpp"
#include "bd/kernel/arguments.hpp"
#include "bd/kernel/context.hpp"
#include "bd/kernel/pack.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::kernel::detail {

/// Part of one segment inside a column block.
struct Piece {
  Index segment, c0, w;
};

/// A task's columns: whole segments or parts of one, about nc columns in all, so that a row
/// block of X stays in L2 while every piece of the block uses it.
struct Block {
  std::vector<Piece> pieces;
  Index packed_size = 0;  // packed B for one depth pass of all pieces
};

/// The pieces of columns [from, to) of the concatenated segments, grouped into blocks of at most
/// nc columns: a segment that fits is not split, a wider one is cut into equal blocks.
inline std::vector<Block> make_blocks(const SegmentList& segments, Index from, Index to, Index nc, Index nr,
                                      Index kc, Packing packing) {
  std::vector<Block> blocks;
  Index block_width = nc, start = 0;  // start: the first column of the current segment
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const Segment& seg = segments[s];
    const Index lo = std::max(from, start), hi = std::min(to, start + seg.width);
    start += seg.width;
    if (lo >= hi) continue;
    const Index width = hi - lo, parts = (width + nc - 1) / nc;
    const Index part = round_up((width + parts - 1) / parts, nr);
    for (Index c = lo; c < hi; c += part) {
      const Index w = std::min(part, hi - c);
      if (block_width + w > nc) blocks.emplace_back(), block_width = 0;
      const Index c0 = seg.first_column + (c - (start - seg.width));
      blocks.back().pieces.push_back({static_cast<Index>(s), c0, w});
      blocks.back().packed_size += packed_depth(packing, pass_depth(seg.depth, kc, packing != Packing::Plain)) * round_up(w, nr);
      block_width += w;
    }
  }
  return blocks;
}

/// Depth pass `p` of a piece: channels [k0, k0 + kn) of its segment; false when the piece has
/// fewer passes. A segment of depth 0 has one empty pass (its outputs are their start values).
inline bool piece_pass(const Segment& seg, Index kc, Index p, Index& k0, Index& kn) {
  const Index passes = seg.depth == 0 ? 1 : (seg.depth + kc - 1) / kc;
  if (p >= passes) return false;
  k0 = p * kc, kn = std::min(kc, seg.depth - k0);
  return true;
}

/// A micro-kernel as the packed GEMM uses it: its tile shape, whether tile() computes fewer than
/// nr columns when asked (else a partial tile goes through a zero-padded copy), tile() itself
/// and the packing of A and B into its panels (pack.hpp, compiled for its shape and layout:
/// packing). Calls through these pointers cost one indirect call per micro-tile (mr·nr·kc
/// multiply-adds, thousands) or per packed panel.
template <typename T, typename S>
struct PackedKernel {
  Index mr = 0, nr = 0;
  bool any_width = false;
  Packing packing = Packing::Plain;
  void (*tile)(Index columns, Index kc, const T* A, const T* B, Index ldb, const T* const* src, const T* values, T* const* dst,
               Index prefetch) = nullptr;
  void (*pack_a)(const GemmArguments<T, S>& a, const Segment& seg, Index r0, Index m, Index k0, Index kn, T* packed) = nullptr;
  void (*pack_b)(const GemmArguments<T, S>& a, Index c0, Index w, Index k0, Index kn, T* packed) = nullptr;
};

/// Kernel's PackedKernel for a product with B stored in S, built on first use (once per
/// instruction set, scalar and storage type).
template <typename Kernel, typename T, typename S>
const PackedKernel<T, S>& packed_kernel() {
  static_assert(Kernel::mr <= max_tile_rows && Kernel::nr <= max_tile_columns, "loop.hpp: raise max_tile_rows/columns");
  static const PackedKernel<T, S> table = [] {
    PackedKernel<T, S> k;
    k.mr = Kernel::mr, k.nr = Kernel::nr, k.any_width = Kernel::any_width;
    k.tile = &Kernel::tile;
    k.pack_a = &pack_a<Kernel::mr, T, S>;
    k.pack_b = &pack_b<Kernel::nr, T, S>;
    return k;
  }();
  return table;
}

/// The same for bf16 compute (T float, B stored in float or bfloat16), packing its operands as
/// `packing` says: rounded floats for the f32 tile, or pairs for vdpbf16ps where the kernel has it
/// (the caller asks for pairs only there), A from a copy of X whose columns are pairs already
/// where `paired` (RoundedInput). Its own function, so that a program that never asks for bf16
/// compiles none of it.
template <typename Kernel, typename T, typename S>
const PackedKernel<T, S>& bf16_packed_kernel(Packing packing, bool paired) {
  static const PackedKernel<T, S> rounded = [] {
    PackedKernel<T, S> k = packed_kernel<Kernel, T, S>();
    k.packing = Packing::Rounded;
    k.pack_a = &pack_bf16_a<Kernel::mr, Packing::Rounded, T, S>;
    k.pack_b = &pack_bf16_b<Kernel::nr, Packing::Rounded, T, S>;
    return k;
  }();
  if constexpr (has_pair_tile<Kernel>::value) {
    static const PackedKernel<T, S> pairs = [] {
      PackedKernel<T, S> k = packed_kernel<Kernel, T, S>();
      k.packing = Packing::Pairs;
      k.tile = &Kernel::tile_pairs;
      k.pack_a = &pack_bf16_a<Kernel::mr, Packing::Pairs, T, S>;
      k.pack_b = &pack_bf16_b<Kernel::nr, Packing::Pairs, T, S>;
      return k;
    }();
    static const PackedKernel<T, S> from_pairs = [] {
      PackedKernel<T, S> k = pairs;
      k.pack_a = &pack_bf16_a<Kernel::mr, Packing::Pairs, T, S, true>;
      return k;
    }();
    if (packing == Packing::Pairs) return paired ? from_pairs : pairs;
  }
  return rounded;
}

/// bf16 compute: the channels of X that the segments read, rounded to bfloat16 once per product,
/// column-major, with each segment's list remapped to the copy's columns: what pack_bf16_a reads
/// instead of X. X itself keeps serving the start values (BD's basis channels are added unrounded).
/// For the Pairs packing, where every segment pairs its channels alike (channels 2t and 2t + 1 of
/// its list; one list, or lists that agree pair by pair), a column holds a pair as vdpbf16ps reads
/// it, channel 2t in each word's low half: packing then copies one column a step, not two merged
/// (a thread packs its rows once per column block). Otherwise a column holds one channel as a float
/// whose low half is zero.
template <typename T>
struct RoundedInput {
  ScratchBuffer<T> values;
  ScratchBuffer<Index> where;     ///< X's channel → its column in values (−1: not read); paired: its pair's
  ScratchBuffer<Index> partner;   ///< paired: the channel whose pair a channel starts (−1: none, a last half)
  ScratchBuffer<Index> channels;  ///< every segment's list, remapped, one after another
  ScratchBuffer<Segment> segments;
};

/// Fills where (−1 on entry), partner and channels with each segment's pairs (channels 2t, 2t + 1
/// of its list) as columns of the copy, one per distinct pair; false, leaving them unusable, where
/// one channel starts two different pairs. Returns the columns in `used`.
inline bool list_pairs(const SegmentList& segments, Index* where, Index* partner, Index* channels, Index& used) {
  used = 0;
  Index at = 0;
  for (const Segment& seg : segments) {
    for (Index k = 0; k < seg.depth; k += 2) {
      const Index first = seg.channels[k], second = k + 1 < seg.depth ? seg.channels[k + 1] : -1;
      if (where[first] < 0) where[first] = used++, partner[first] = second;
      else if (partner[first] != second) return false;
      channels[at++] = where[first];
      if (second >= 0) channels[at++] = where[first];
    }
  }
  return true;
}

/// The packing's view of X for bf16 compute: x at the rounded copy, the segments remapped. Returns
/// whether its columns are pairs (RoundedInput); `pairs`: the product packs Packing::Pairs.
template <typename T, typename S>
bool round_input(const GemmArguments<T, S>& a, int threads, bool pairs, RoundedInput<T>& scratch,
                 GemmArguments<T, S>& packing) {
  Index highest = -1, depth = 0;
  for (const Segment& seg : a.segments) {
    depth += seg.depth;
    for (Index k = 0; k < seg.depth; ++k) highest = std::max(highest, seg.channels[k]);
  }
  Index* const where = scratch.where.reserve(static_cast<std::size_t>(highest + 1));
  std::fill(where, where + highest + 1, Index(-1));
  Index* const channels = scratch.channels.reserve(static_cast<std::size_t>(std::max<Index>(1, depth)));
  Index* const partner = pairs ? scratch.partner.reserve(static_cast<std::size_t>(highest + 1)) : nullptr;
  Index used = 0;
  const bool paired = pairs && list_pairs(a.segments, where, partner, channels, used);
  if (!paired) {
    std::fill(where, where + highest + 1, Index(-1));
    used = 0;
    Index at = 0;
    for (const Segment& seg : a.segments)
      for (Index k = 0; k < seg.depth; ++k) {
        Index& column = where[seg.channels[k]];
        if (column < 0) column = used++;
        channels[at++] = column;
      }
  }
  Segment* const segments = scratch.segments.reserve(a.segments.size());
  for (std::size_t s = 0, at = 0; s < a.segments.size(); at += static_cast<std::size_t>(a.segments[s].depth), ++s)
    segments[s] = a.segments[s], segments[s].channels = channels + at;
  const Index L = a.rows;
  T* const values = scratch.values.reserve(static_cast<std::size_t>(std::max<Index>(1, L * used)));
  const auto channel = [&](Index c) { return reinterpret_cast<const PackedWord*>(a.x + c * a.ldx); };
  (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && L * used >= (Index(1) << 16))
#endif
  for (Index c = 0; c <= highest; ++c) {
    if (where[c] < 0) continue;
    PackedWord* to = reinterpret_cast<PackedWord*>(values + where[c] * L);
    const PackedWord* lo = channel(c);
    if (!paired) {
      for (Index i = 0; i < L; ++i) to[i] = bf16_upper(lo[i]);
    } else if (partner[c] < 0) {
      for (Index i = 0; i < L; ++i) to[i] = bf16_upper(lo[i]) >> 16;
    } else {
      const PackedWord* hi = channel(partner[c]);
      for (Index i = 0; i < L; ++i) to[i] = bf16_upper(hi[i]) | bf16_upper(lo[i]) >> 16;
    }
  }
  packing.rows = L, packing.x = values, packing.ldx = L, packing.x_row_major = false;
  packing.segments.view(segments, a.segments.size());
  return paired;
}

/// Packs pass `p` of B for every piece of a block, one after the other (see pack_b).
template <typename T, typename S>
void pack_block_pass(const GemmArguments<T, S>& a, const Block& block, const Blocking& blk, Index p, const PackedKernel<T, S>& kernel,
                     T* packed) {
  for (const Piece& piece : block.pieces) {
    const Segment& seg = a.segments[static_cast<std::size_t>(piece.segment)];
    Index k0, kn;
    if (!piece_pass(seg, pass_depth(seg.depth, blk.kc, kernel.packing != Packing::Plain), p, k0, kn)) continue;
    kernel.pack_b(a, piece.c0, piece.w, k0, kn, packed);
    packed += packed_depth(kernel.packing, kn) * round_up(piece.w, kernel.nr);
  }
}

/// Rows [r0, r1) of pass `p` of one block; packed_b holds that pass of the block's B, pieces one
/// after the other. The first pass starts the accumulators from init(c), later ones from the
/// output.
template <typename T, typename S>
void run_block_pass(const GemmArguments<T, S>& a, const GemmArguments<T, S>& packing, const Block& block, Index p, Index r0,
                    Index r1, const Blocking& blk, const PackedKernel<T, S>& kernel, Index prefetch, const T* packed_b,
                    T* packed_a) {
  const Index MR = kernel.mr, NR = kernel.nr;
  // Equal row blocks of whole micro-tiles, at most blk.mc rows each (256 rows and mc = 144: two
  // blocks of 128, not 144 + 112 with a half-empty tile).
  const Index row_blocks = std::max<Index>(1, (r1 - r0 + blk.mc - 1) / std::max<Index>(1, blk.mc));
  const Index mc = round_up((r1 - r0 + row_blocks - 1) / row_blocks, MR);
  const auto out_column = [&](Index c) { return a.out + (a.out_columns ? a.out_columns[c] : c) * a.ldo; };
  const bool first = p == 0;
  T edge[max_tile_rows * max_tile_columns];  // a partial micro-tile computes here and copies its valid part out
  for (Index r = r0; r < r1; r += mc) {
    const Index m = std::min(mc, r1 - r);
    Index packed_segment = -1;  // whose channels packed_a holds for these rows and this pass
    const T* panel_b = packed_b;
    for (const Piece& piece : block.pieces) {
      const Segment& seg = a.segments[static_cast<std::size_t>(piece.segment)];
      Index k0, kn;
      if (!piece_pass(seg, pass_depth(seg.depth, blk.kc, kernel.packing != Packing::Plain), p, k0, kn)) continue;
      const Index steps = packed_depth(kernel.packing, kn);  // the packed panels' k-steps
      if (packed_segment != piece.segment) {
        kernel.pack_a(packing, packing.segments[static_cast<std::size_t>(piece.segment)], r, m, k0, kn, packed_a);
        packed_segment = piece.segment;
      }
      for (Index j0 = 0; j0 < piece.w; j0 += NR, panel_b += NR * steps) {
        const Index nj = std::min(NR, piece.w - j0);
        const Index c = piece.c0 + j0;  // first B column of the micro-panel
        for (Index i0 = 0; i0 < m; i0 += MR) {
          const Index mi = std::min(MR, m - i0), row = r + i0;
          if (a.lower_only && row + mi <= c) continue;  // strictly above the diagonal: not wanted
          const T* src[max_tile_columns];
          T* dst[max_tile_columns];
          T values[max_tile_columns];
          bool from_values = false;
          for (Index j = 0; j < nj; ++j) {
            dst[j] = out_column(c + j) + row;
            if (!first || a.accumulate) {
              src[j] = dst[j];
            } else if (a.init_channels) {
              src[j] = a.x + a.init_channels[c + j] * a.ldx + row;
            } else {
              from_values = true;
              values[j] = a.init_values ? a.init_values[c + j] : T(0);
            }
          }
          if (mi == MR && (nj == NR || kernel.any_width)) {
            kernel.tile(nj, steps, packed_a + i0 * steps, panel_b, NR, from_values ? nullptr : src, values, dst, prefetch);
            continue;
          }
          T* local[max_tile_columns];  // zero-padded copy of the tile's start, all NR columns computed
          for (Index j = 0; j < NR; ++j) {
            local[j] = edge + j * MR;
            for (Index i = 0; i < MR; ++i) local[j][i] = i < mi && j < nj ? (from_values ? values[j] : src[j][i]) : T(0);
          }
          kernel.tile(NR, steps, packed_a + i0 * steps, panel_b, NR, local, static_cast<const T*>(nullptr), local, prefetch);
          for (Index j = 0; j < nj; ++j) std::copy(local[j], local[j] + mi, dst[j]);
        }
      }
    }
  }
}

/// The packing space of a thread's GEMMs, kept in its Workspace between calls and never filled
/// (packing writes every value it reads, padding included), so the many products of
/// preparation neither zero nor fault in fresh pages each time. Grows to the largest GEMM the
/// thread has run. Taken before any parallel region, so nothing inside one can throw.
template <typename T>
struct PackingSpace : ScratchBuffer<T> {
  Index stride = 0;  // one worker's share, in values of T
  /// `workers` shares of at least `need` values, worker w's at w·stride. The stride only grows
  /// (in whole 4 KiB pages), so a worker's share keeps its addresses from one product to the
  /// next whatever their shapes. Laid out by each product's own sizes, a product of another
  /// depth (BD's K' projection, depth d − d_h, between dense ones of depth d) would move the
  /// second worker's share onto lines the first core's cache holds, and the next products'
  /// packing would write across cores.
  T* shares(Index need, Index workers) {
    stride = std::max(stride, round_up(need, Index(4096 / sizeof(T))));
    return this->reserve(static_cast<std::size_t>(stride * workers));
  }
};

/// The packed GEMM on one kernel. Work is split as a grid: the columns (all segments side by
/// side) into `column_groups` equal ranges, cut anywhere, and the rows into threads /
/// column_groups equal ranges only when the columns are too narrow to give every thread four
/// micro-panels. A thread packs each B block of its range once, so B is packed once in all.
/// `packing_args`: what pack_a reads — a itself, or for bf16 compute X's rounded copy (round_input).
template <typename T, typename S>
void gemm_packed(const GemmArguments<T, S>& a, const GemmArguments<T, S>& packing_args, Index total, const Blocking& asked,
                 int threads, const PackedKernel<T, S>& kernel, const Context& context, Workspace& ws) {
  const Index MR = kernel.mr, NR = kernel.nr;
  Blocking blk = asked;
  if (blk.kc <= 0) {
    Index deepest = 0;
    for (const auto& seg : a.segments) deepest = std::max(deepest, seg.depth);
    blk.kc = context.depth_block(NR, sizeof(T), deepest);
  }
  Index max_kc = 1, passes = 1;
  for (const auto& seg : a.segments) {
    const Index kc = pass_depth(seg.depth, blk.kc, kernel.packing != Packing::Plain);
    max_kc = std::max(max_kc, kc);
    passes = std::max(passes, (seg.depth + kc - 1) / kc);
  }
  if (blk.mc <= 0) blk.mc = context.row_block(MR, max_kc, sizeof(T));
  if (blk.nc <= 0) blk.nc = context.tuning.nc;
  const Index prefetch = context.tuning.tile_prefetch;
  const Index row_units = (a.rows + MR - 1) / MR;
  Index column_groups = std::max(1, threads);
  while (column_groups > 1 && (total / column_groups < 4 * NR || threads % column_groups)) --column_groups;
  const Index row_groups = std::max<Index>(1, std::min<Index>(threads / column_groups, row_units));
  const Index group_width = round_up((total + column_groups - 1) / column_groups, NR);
  const Index group_rows = (row_units + row_groups - 1) / row_groups * MR;
  const Index nc = round_up(std::max<Index>(1, blk.nc), NR);
  std::vector<std::vector<Block>> column_blocks;
  Index b_size = 1;
  for (Index g = 0; g < column_groups; ++g) {
    column_blocks.push_back(
        make_blocks(a.segments, g * group_width, std::min(total, (g + 1) * group_width), nc, NR, blk.kc, kernel.packing));
    for (const auto& block : column_blocks.back()) b_size = std::max(b_size, block.packed_size);
  }
  const Index workers = column_groups * row_groups;
  // ≥ the balanced mc of run_block_pass
  const Index a_size = round_up(std::max<Index>(1, blk.mc), MR) * packed_depth(kernel.packing, max_kc);
  PackingSpace<T>& space = ws.local<PackingSpace<T>>();
  T* const buffers = space.shares(b_size + a_size, workers);
  const Index share = space.stride;
#ifdef _OPENMP
#pragma omp parallel num_threads(static_cast<int>(workers))
#endif
  {
#ifdef _OPENMP
    const Index me = omp_get_thread_num(), team = omp_get_num_threads();
#else
    const Index me = 0, team = 1;
#endif
    for (Index w = me; w < workers; w += team) {  // a smaller team than asked for takes several shares
      T* packed_b = buffers + w * share;
      T* packed_a = packed_b + b_size;
      const Index r0 = (w / column_groups) * group_rows, r1 = std::min(a.rows, r0 + group_rows);
      if (r0 >= r1) continue;
      for (const Block& block : column_blocks[static_cast<std::size_t>(w % column_groups)]) {
        for (Index p = 0; p < passes; ++p) {
          pack_block_pass(a, block, blk, p, kernel, packed_b);
          run_block_pass(a, packing_args, block, p, r0, r1, blk, kernel, prefetch, packed_b, packed_a);
        }
      }
    }
  }
}

}  // namespace bd::kernel::detail
