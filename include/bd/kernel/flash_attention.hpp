// bd/kernel/flash_attention.hpp — softmax(Q·Kᵀ·scale)·V for every head, fused and tiled on the
// micro-kernels (Dao et al. 2022, FlashAttention, laid out for the CPU):
//
//   for each task (a key/value head group, a block of its query rows)      in parallel
//     pack the rows' queries, scaled, [q | q_rope]                          MR-row panels
//     for each block of keys the rows can see (causal blocks skipped)
//       pack [k | k_rope] as NR-key panels (or read them in place: context.hpp), L2
//       v as NR-channel panels (or read the latent in place: absorbed MLA)
//       per MR-row panel:  S = Q·Kᵀ  (tile, written key-major: the packed A of P·V)
//                          mask the causal diagonal, online softmax step (softmax_panel)
//                          O ← α·O + P·V  (scale_panel, tile with O as its start)
//     O / l into the output
//
// No L×L matrix exists: a task holds its rows' scores for one key block. Query heads that read
// the same key and value heads are one group and their rows are stacked (head-major), so GQA,
// MQA and absorbed MLA decoding (all heads against one latent) run one product per key block
// for all of them: the keys are packed once and every tile is full.
//
// A group of at most 256 rows against many keys (absorbed MLA decoding: 128 heads, one latent)
// splits its keys into chunks instead, each a task over all of the group's rows, merged at the
// end (key_chunks): each key is packed once and a task is left for every thread.
//
// Few rows per key/value head (decoding) take flash_attention_few_rows instead, which reads K and
// V where they lie, once, in order: decoding is bound by reading the cache.
//
// Row r of group g is query head g·group + r / Lq at position first_query_position + r % Lq;
// keys sit at positions first_key_position … + Lk − 1. The decoupled RoPE part (MLA) is one
// more stretch of depth: q_rope per head, one k_rope for all heads. The keys may come in several
// calls that carry the softmax's running state (row_max, row_sum): keys computed block by block
// (MLA's K/V recomputed from the latent) are attended to as they are made.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "bd/base/workspace.hpp"
#include "bd/kernel/arguments.hpp"
#include "bd/kernel/context.hpp"
#include "bd/kernel/cpu.hpp"
#include "bd/kernel/dispatch.hpp"
#include "bd/kernel/few_row_kernel.hpp"
#include "bd/kernel/pack.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace bd::kernel {

/// One attention call, column-major operands read in place. Head h of Q reads key head
/// h·n_k/n_q and value head h·n_v/n_q; n_q must be a multiple of n_k and of n_v.
template <typename T>
struct AttentionArguments {
  Index q_len = 0, k_len = 0;        ///< Lq query rows, Lk keys
  Index n_q = 1, n_k = 1, n_v = 1;   ///< heads of Q, K and V
  Index d_qk = 0, d_rope = 0, d_v = 0;
  const T* q = nullptr;  Index ldq = 0;    ///< Lq × n_q·d_qk
  const T* qr = nullptr; Index ldqr = 0;   ///< Lq × n_q·d_rope (d_rope > 0)
  const T* k = nullptr;  Index ldk = 0;    ///< Lk × n_k·d_qk
  const T* kr = nullptr; Index ldkr = 0;   ///< Lk × d_rope, shared by all heads
  const T* v = nullptr;  Index ldv = 0;    ///< Lk × n_v·d_v
  T* out = nullptr;      Index ldo = 0;    ///< Lq × n_q·d_v
  T scale = T(1);
  bool causal = false;
  Index first_query_position = 0;    ///< causal: row i sees keys at positions ≤ first + i
  Index first_key_position = 0;      ///< the keys' positions: first_key … first_key + Lk − 1
  /// Streaming over the keys in several calls (keys computed block by block, never all held):
  /// with row_max and row_sum set (n_q·Lq each, head-major: h·Lq + t), the call continues the
  /// online softmax from them and from out, which holds the unnormalised Σ e^(s − max)·v, and
  /// leaves all three for the next call; flash_attention_finish() divides at the end. Start from
  /// row_max = −∞, row_sum = 0, out = 0.
  T* row_max = nullptr;
  T* row_sum = nullptr;
  /// V is K's first d_v channels (absorbed MLA: the latent is both; v = k, ldv = ldk, one head
  /// each or d_v = d_qk), so that the kernel may read the values from the keys' runs. The caller
  /// says so; nothing is inferred from the pointers.
  bool values_are_keys = false;
  /// bf16: the tiled path's two products take their operands rounded once to bfloat16 (the
  /// scaled queries, the keys, the softmax's weights P, the values) and sum in float; the running
  /// softmax stays float. The few-row path (decoding's few rows per key head, bound by reading
  /// the cache) computes in float whatever this says. float arithmetic only.
  Compute compute = Compute::F32;
  /// Keys and values stored in bfloat16 (a bf16 cache) instead of k, kr and v (then null), with
  /// their leading dimensions ldk, ldkr and ldv; keys in bf16 take their RoPE keys in bf16 too.
  /// With values_are_keys (a bf16 latent), v_bf16 = k_bf16 and ldv = ldk. float arithmetic only.
  /// Widened exactly where float operands are read (f32 compute; the few-row path as it loads
  /// them), paired as they lie for vdpbf16ps: the same bits as float operands that hold the same
  /// values (docs/design.md, "Compute type").
  const Eigen::bfloat16* k_bf16 = nullptr;
  const Eigen::bfloat16* kr_bf16 = nullptr;
  const Eigen::bfloat16* v_bf16 = nullptr;
};

namespace detail {

/// A thread's attention scratch, kept in its Workspace: every worker's packed blocks, scores,
/// accumulators and row statistics in one array, the rows' positions in another. Decoding calls
/// the attention once per token; with the scratch kept, a token allocates nothing here.
template <typename T>
struct FlashScratch {
  ScratchBuffer<T> values;
  ScratchBuffer<Index> positions;
  ScratchBuffer<T> partials;  ///< key chunks' unnormalised outputs and row statistics (key_chunks)
  ScratchBuffer<AttentionArguments<T>> parts;  ///< each key chunk's call
  ScratchBuffer<T> queries;                    ///< with split keys, every task's packed queries
  ScratchBuffer<Index> task_positions;         ///< and its rows' positions, heads and tokens
};

/// Keys per chunk when a call's keys are split (key_chunks), and at most how many chunks (past
/// 64 Ki keys the chunks grow instead).
constexpr Index flash_chunk_keys() { return 1024; }
constexpr Index flash_max_chunks() { return 64; }

/// Into how many chunks a call's keys are split, each attended to as its own task and the
/// results merged (FlashDecoding, Dao et al. 2023). Absorbed MLA decoding is 128 query rows
/// against one long latent: as row blocks of 64 (the row block then) it made two tasks, each packing every key and
/// value for its 64 rows, so each key was packed twice and served 64 rows each time. Split, a
/// task takes all of its group's rows and each key is packed once. Chosen from the shape only,
/// never from the thread count: a row's sums run in the same order whatever the threads, so one
/// thread and many give the same bits. Split when a group has at most 256 rows against at least
/// two chunks of keys, and never in a streaming call (its running state is one per row).
template <typename T>
Index key_chunks(const AttentionArguments<T>& a, Index rows) {
  if (a.row_max || rows > 256 || a.k_len < 2 * flash_chunk_keys()) return 1;
  return std::min(flash_max_chunks(), (a.k_len + flash_chunk_keys() - 1) / flash_chunk_keys());
}

/// Asks for the run of bk values at `run` to be brought into L1 (Locality 3: a pack's runs
/// ahead, see pack_key_panels), or into L2 only (2: flash_attention_on's next key block).
template <int Locality = 3, typename T>
void prefetch_run(const T* run, Index bk) {
  for (Index k = 0; k < bk; k += Index(64 / sizeof(T))) BD_PREFETCH(run + k, 0, Locality);
  BD_PREFETCH(run + bk - 1, 0, Locality);
}

/// Where channel c of [k | k_rope] of key head kh starts at key k0: keys lie channel by channel,
/// each channel's keys one contiguous run.
template <typename T>
const T* key_run(const AttentionArguments<T>& a, Index kh, Index k0, Index c) {
  return c < a.d_qk ? a.k + (kh * a.d_qk + c) * a.ldk + k0 : a.kr + (c - a.d_qk) * a.ldkr + k0;
}

/// The same run of keys stored in bfloat16 (AttentionArguments::k_bf16).
template <typename T>
const Eigen::bfloat16* key_run_bf16(const AttentionArguments<T>& a, Index kh, Index k0, Index c) {
  return c < a.d_qk ? a.k_bf16 + (kh * a.d_qk + c) * a.ldk + k0 : a.kr_bf16 + (c - a.d_qk) * a.ldkr + k0;
}

/// Calls f with channel c's run of keys, in the type they are stored in.
template <typename T, typename F>
decltype(auto) with_key_run(const AttentionArguments<T>& a, Index kh, Index k0, Index c, F&& f) {
  if constexpr (std::is_same_v<T, float>)
    if (a.k_bf16) return f(key_run_bf16(a, kh, k0, c));
  return f(key_run(a, kh, k0, c));
}

/// Whether the keys are stored in bfloat16 (float arithmetic only).
template <typename T>
bool key_runs_bf16(const AttentionArguments<T>& a) {
  if constexpr (std::is_same_v<T, float>) return a.k_bf16 != nullptr;
  return false;
}

/// Whether the values are stored in bfloat16 (float arithmetic only).
template <typename T>
bool value_runs_bf16(const AttentionArguments<T>& a) {
  if constexpr (std::is_same_v<T, float>) return a.v_bf16 != nullptr;
  return false;
}

/// prefetch_run on channel c's run of bk keys, however they are stored.
template <int Locality = 3, typename T>
void prefetch_key_run(const AttentionArguments<T>& a, Index kh, Index k0, Index c, Index bk) {
  with_key_run(a, kh, k0, c, [bk](const auto* run) { prefetch_run<Locality>(run, bk); });
}

/// A key block's keys as NR-key panels of `steps` ≥ D k-steps, k-major:
/// kp[j0·steps + c·NR + j] = [k | k_rope](k0 + j0 + j, c), zero past bk. Channel by channel, so each of K's columns is read in one run of bk keys (D
/// concurrent strided streams, one per channel, defeat the prefetcher when K comes from memory).
/// A block is one short run per channel, far apart, which the hardware prefetcher
/// does not follow: each run is asked for `ahead` channels before it is copied
/// (Tuning::pack_prefetch).
template <Index NR, typename T>
void pack_key_panels(const AttentionArguments<T>& a, Index kh, Index k0, Index bk, T* kp, Index steps, Index ahead) {
  const Index D = a.d_qk + a.d_rope;
  for (Index c = 0; c < D; ++c) {
    if (ahead && c + ahead < D) prefetch_key_run(a, kh, k0, c + ahead, bk);
    with_key_run(a, kh, k0, c, [&](const auto* from) {
      for (Index j0 = 0; j0 < round_up(bk, NR); j0 += NR) {
        const Index nj = std::min(NR, bk - j0);
        T* to = kp + j0 * steps + c * NR;
        if (nj == NR) {  // a fixed-length copy the compiler unrolls: std::copy of NR values was a memmove call each
          for (Index j = 0; j < NR; ++j) to[j] = widen_one<T>(from[j0 + j]);
          continue;
        }
        for (Index j = 0; j < nj; ++j) to[j] = widen_one<T>(from[j0 + j]);
        std::fill(to + nj, to + NR, T(0));
      }
    });
  }
}

/// Runs of kn values (column(j) for j < nc) as one NR-channel panel, k-major: panel[k·NR + j],
/// zero columns past nc. The values are copied as they are (bf16 pairs too), or widened from
/// bfloat16.
template <Index NR, typename T, typename Column>
void runs_into_panel(Column column, Index nc, Index kn, T* panel) {
  using S = std::remove_const_t<std::remove_pointer_t<decltype(column(0))>>;
  Index j = transpose_runs<NR, T, S>(column, nc, kn, panel);
  for (; j < NR; ++j) {
    if (j >= nc) {
      for (Index k = 0; k < kn; ++k) panel[k * NR + j] = T(0);
      continue;
    }
    const S* col = column(j);
    for (Index k = 0; k < kn; ++k) panel[k * NR + j] = widen_one<T>(col[k]);
  }
}

/// A key block's values as NR-channel panels of `steps` ≥ bk k-steps, k-major:
/// vp[c0·steps + k·NR + j] = v(k0 + k, c0 + j), zero past d_v; each channel's run asked for
/// `ahead` channels before it is copied.
template <Index NR, typename T>
void pack_value_panels(const AttentionArguments<T>& a, Index vh, Index k0, Index bk, T* vp, Index steps, Index ahead) {
  const Index dv = a.d_v;
  for (Index c0 = 0; c0 < round_up(dv, NR); c0 += NR) {
    const Index nc = std::min(NR, dv - c0);
    const auto panel = [&](auto column) {
      if (ahead)
        for (Index j = ahead; j < ahead + nc && c0 + j < dv; ++j) prefetch_run(column(j), bk);
      runs_into_panel<NR>(column, nc, bk, vp + c0 * steps);
    };
    if (value_runs_bf16(a))
      panel([&](Index j) { return a.v_bf16 + (vh * dv + c0 + j) * a.ldv + k0; });
    else
      panel([&](Index j) { return a.v + (vh * dv + c0 + j) * a.ldv + k0; });
  }
}

/// The same packings for bf16 compute by FMAs (Packing::Rounded): each panel packed as above,
/// then rounded in place (pack.hpp's round_panel; `steps` leaves room for it).
template <Index NR, typename T>
void pack_rounded_key_panels(const AttentionArguments<T>& a, Index kh, Index k0, Index bk, T* kp, Index steps, Index ahead) {
  pack_key_panels<NR>(a, kh, k0, bk, kp, steps, ahead);
  for (Index j0 = 0; j0 < bk; j0 += NR) round_panel(kp + j0 * steps, NR, a.d_qk + a.d_rope);
}
template <Index NR, typename T>
void pack_rounded_value_panels(const AttentionArguments<T>& a, Index vh, Index k0, Index bk, T* vp, Index steps, Index ahead) {
  pack_value_panels<NR>(a, vh, k0, bk, vp, steps, ahead);
  for (Index c0 = 0; c0 < a.d_v; c0 += NR) round_panel(vp + c0 * steps, NR, bk);
}

/// body(c, second) for each pair of a key block's channels (c, c + 1), c even (second: c + 1 is
/// a channel), after asking for the runs `ahead` channels on: the key packings by pairs below.
template <typename T, typename Body>
void for_each_key_pair(const AttentionArguments<T>& a, Index kh, Index k0, Index bk, Index ahead, Body&& body) {
  const Index D = a.d_qk + a.d_rope;
  for (Index c = 0; c < D; c += 2) {
    if (ahead)
      for (Index e = c + ahead; e < std::min(D, c + ahead + 2); ++e) prefetch_key_run(a, kh, k0, e, bk);
    body(c, c + 1 < D);
  }
}

/// The same key panels where the kernel rounds in vector registers (has_rounding): each pair of
/// channels read once and written rounded, swapped into place (Kernel::round_channels), instead
/// of packed and then rounded in a second pass. Keys stored in bfloat16 take the widening pack.
template <typename Kernel, typename T>
void pack_rounded_key_pairs(const AttentionArguments<T>& a, Index kh, Index k0, Index bk, T* kp, Index steps, Index ahead) {
  constexpr Index NR = Kernel::nr;
  if (key_runs_bf16(a)) return pack_rounded_key_panels<NR>(a, kh, k0, bk, kp, steps, ahead);
  for_each_key_pair(a, kh, k0, bk, ahead, [&](Index c, bool second) {
    Kernel::round_channels(key_run(a, kh, k0, c), second ? key_run(a, kh, k0, c + 1) : nullptr, bk, NR, kp + c * NR,
                           NR * steps);
  });
}

/// For vdpbf16ps (Packing::Pairs): a key block's keys as NR-key panels of bf16 pairs of channels,
/// kp[j0·steps + t·NR + j] = channels 2t and 2t + 1 of key k0 + j0 + j, the kernel rounding and
/// interleaving two runs at a time.
template <typename Kernel, typename T>
void pack_key_pairs(const AttentionArguments<T>& a, Index kh, Index k0, Index bk, T* kp, Index steps, Index ahead) {
  constexpr Index NR = Kernel::nr;
  const bool stored_bf16 = key_runs_bf16(a);
  for_each_key_pair(a, kh, k0, bk, ahead, [&](Index c, bool second) {
    T* const to = kp + c / 2 * NR;
    if (stored_bf16)
      Kernel::pair_channels(key_run_bf16(a, kh, k0, c), second ? key_run_bf16(a, kh, k0, c + 1) : nullptr, bk, NR, to,
                            NR * steps);
    else
      Kernel::pair_channels(key_run(a, kh, k0, c), second ? key_run(a, kh, k0, c + 1) : nullptr, bk, NR, to, NR * steps);
  });
}

/// For vdpbf16ps: a key block's values as NR-channel panels of bf16 pairs of keys,
/// vp[c0·steps + u·NR + j] = keys 2u and 2u + 1 of channel c0 + j: each channel's run made pairs
/// (consecutive keys are a pair already; stored in bfloat16, a run is its pairs and is copied, the
/// odd key past a block's end zeroed), then the NR channels' runs of pairs transposed.
template <typename Kernel, typename T>
void pack_value_pairs(const AttentionArguments<T>& a, Index vh, Index k0, Index bk, T* vp, Index steps, Index ahead) {
  constexpr Index NR = Kernel::nr;
  const Index dv = a.d_v, pairs = (bk + 1) / 2;
  assert(bk <= Context::max_key_block);
  T words[max_tile_columns * (Context::max_key_block / 2)];  // each channel's pairs
  const bool stored_bf16 = value_runs_bf16(a);
  const auto pair_run = [&](Index c, T* to) {  // value channel c's run as its pairs
    if (!stored_bf16) return Kernel::pair_keys(a.v + c * a.ldv + k0, bk, to);
    std::memcpy(to, a.v_bf16 + c * a.ldv + k0, sizeof(Eigen::bfloat16) * bk);
    if (bk % 2) std::memset(reinterpret_cast<char*>(to) + sizeof(Eigen::bfloat16) * bk, 0, sizeof(Eigen::bfloat16));
  };
  for (Index c0 = 0; c0 < round_up(dv, NR); c0 += NR) {
    const Index nc = std::min(NR, dv - c0);
    if (ahead)
      for (Index j = ahead; j < ahead + nc && c0 + j < dv; ++j)
        stored_bf16 ? prefetch_run(a.v_bf16 + (vh * dv + c0 + j) * a.ldv + k0, bk)
                    : prefetch_run(a.v + (vh * dv + c0 + j) * a.ldv + k0, bk);
    for (Index j = 0; j < nc; ++j) pair_run(vh * dv + c0 + j, words + j * pairs);
    runs_into_panel<NR>([&](Index j) -> const T* { return words + j * pairs; }, nc, pairs, vp + c0 * steps);
  }
}

/// What the tiled path (flash_attention_on) needs of a micro-kernel: its tile shape, its tiles
/// (B packed, or read in place: its rows or its columns a stride apart), the softmax step and
/// rescaling of an MR-row panel, and the packing of keys and values, compiled for its NR. The
/// loop is the same for every instruction set, so it is compiled once per scalar type and calls
/// these through pointers (one indirect call per NR keys or channels of an MR-row panel, each over
/// the whole depth) — as the packed GEMM's PackedKernel (loop.hpp) and the few-row paths'
/// FewRowKernel (few_row_kernel.hpp). Which operands are read in place is the context's choice.
template <typename T>
struct FlashTileKernel {
  Index mr = 0, nr = 0;
  Packing packing = Packing::Plain;  ///< bf16 compute: how the packed operands hold their values
  void (*tile)(Index columns, Index kc, const T* A, const T* B, Index ldb, const T* const* src, const T* values, T* const* dst,
               Index prefetch) = nullptr;
  void (*tile_transposed)(Index columns, Index kc, const T* A, const T* B, Index ldb, const T* const* src, const T* values,
                          T* const* dst, Index prefetch) = nullptr;
  void (*softmax_panel)(T* s, Index n, T* m, T* l, T* alpha) = nullptr;
  void (*scale_panel)(T* o, Index columns, const T* alpha) = nullptr;
  void (*pack_keys)(const AttentionArguments<T>& a, Index kh, Index k0, Index bk, T* kp, Index steps, Index ahead) = nullptr;
  void (*pack_values)(const AttentionArguments<T>& a, Index vh, Index k0, Index bk, T* vp, Index steps, Index ahead) = nullptr;
  /// bf16 compute: a panel of queries or of the softmax's weights, lanes wide and kn k-steps,
  /// rounded in place into the packing's layout (pack.hpp's round_panel).
  void (*round_panel)(T* panel, Index lanes, Index kn) = nullptr;
};

/// Kernel's FlashTileKernel, built on first use (once per instruction set and scalar type).
template <typename Kernel, typename T>
const FlashTileKernel<T>& flash_tile_kernel() {
  static_assert(Kernel::mr <= max_tile_rows && Kernel::nr <= max_tile_columns, "pack.hpp: raise max_tile_rows/columns");
  static const FlashTileKernel<T> table = [] {
    FlashTileKernel<T> k;
    k.mr = Kernel::mr, k.nr = Kernel::nr;
    k.tile = &Kernel::tile;
    k.tile_transposed = &Kernel::tile_transposed;
    k.softmax_panel = &Kernel::softmax_panel;
    k.scale_panel = &Kernel::scale_panel;
    k.pack_keys = &pack_key_panels<Kernel::nr, T>;
    k.pack_values = &pack_value_panels<Kernel::nr, T>;
    return k;
  }();
  return table;
}

/// The same for bf16 compute (float): every operand packed (nothing read in place: each is
/// rounded as it is packed), in pairs for vdpbf16ps where the kernel has it (the caller asks for
/// pairs only there) or rounded floats for the f32 tile. Its own function, so that a program that
/// never asks for bf16 compiles none of it.
template <typename Kernel, typename T>
const FlashTileKernel<T>& bf16_flash_tile_kernel(Packing packing) {
  static_assert(std::is_same_v<T, float>, "bf16 compute: float arithmetic");
  static const FlashTileKernel<T> rounded = [] {
    FlashTileKernel<T> k = flash_tile_kernel<Kernel, T>();
    k.packing = Packing::Rounded;
    k.tile_transposed = nullptr;
    k.pack_keys = &pack_rounded_key_panels<Kernel::nr, T>;
    k.pack_values = &pack_rounded_value_panels<Kernel::nr, T>;
    k.round_panel = &detail::round_panel;
    if constexpr (has_rounding<Kernel>::value) {  // queries and P: MR lanes, whole vectors
      k.pack_keys = &pack_rounded_key_pairs<Kernel, T>;
      k.round_panel = &Kernel::round_rows;
    }
    return k;
  }();
  if constexpr (has_pair_tile<Kernel>::value) {
    static const FlashTileKernel<T> pairs = [] {
      FlashTileKernel<T> k = rounded;
      k.packing = Packing::Pairs;
      k.tile = &Kernel::tile_pairs;
      k.pack_keys = &pack_key_pairs<Kernel, T>;
      k.pack_values = &pack_value_pairs<Kernel, T>;
      k.round_panel = &Kernel::pair_panel;
      return k;
    }();
    if (packing == Packing::Pairs) return pairs;
  }
  return rounded;
}

/// The most MR-row panels a task has: Bq ≤ 256 rows rounded up to MR (Context::query_block), MR ≥ 2.
constexpr Index max_flash_panels = 129;

/// What flash_attention_on decides before it reads a key: the blocks, the tasks (a group of query
/// heads sharing a key and a value head, a block of its rows) and the chunks its keys are split
/// into, which operands are read in place, and the layout of each worker's buffers.
struct FlashPlan {
  Index MR = 0, NR = 0;
  Index groups = 0, group = 0;            ///< key/value head groups, query heads per group
  Index rows = 0, q_len = 0;              ///< rows per group (group·Lq), Lq
  Index D = 0, dv = 0, dv_padded = 0;     ///< score depth d_qk + d_rope, value width (padded to NR)
  Packing packing = Packing::Plain;       ///< bf16 compute: the operands' layout (FlashTileKernel)
  Index Dq = 0, Dp = 0;                   ///< k-steps of a query or key panel: reserved, and multiplied
  Index chunks = 1;                       ///< key chunks (key_chunks), each unit's keys
  Index Bk = 0, Bq = 0, panels = 0;       ///< keys per block, rows per task, MR-row panels per task
  Index row_blocks = 0, tasks = 0, units = 0;
  Index prefetch = 0, pack_ahead = 0;     ///< Tuning::tile_prefetch, Tuning::pack_prefetch
  // Keys read in place (the context's choice, Tuning::keys_in_place): a score tile's B panel is NR
  // keys of each of D channels, which lie contiguous in K's columns, so the tile reads them there,
  // ldk apart, instead of from a packed copy, and the next block's runs are brought into L2 during
  // this block's last panel. Packing a block reads D runs far apart from memory, one after another,
  // with nothing to overlap. In place, the same FMAs in the same order (the RoPE channels continue
  // from the stored accumulators): the same bits.
  bool keys_in_place = false;
  // Values that are the keys' first channels — absorbed MLA, whose caller says so
  // (AttentionArguments::values_are_keys) — read in place too (Tuning::values_in_place): the
  // block's score tiles have just brought its lines into L2, and P·V reads them there
  // (tile_transposed: a tile's NR channels are NR runs of the block's keys) instead of copying them
  // into NR-channel panels first. Other values keep their panels: from memory, their packing's
  // prefetch ahead of each run is what keeps P·V fed.
  bool values_in_place = false;
  // Per worker: packed queries, keys (unless read in place) and values of one block, one panel's
  // scores (used up before the next panel's), output accumulators, and the rows' running max, sum
  // and rescaling factor; with split keys a unit's accumulators and max and sum are its slot.
  Index q_size = 0, k_size = 0, v_size = 0, s_size = 0, o_size = 0, per_worker = 0, slot_size = 0;

  // Task t is group t / row_blocks, and a group's row blocks go last first. A group's tasks thus
  // run one after another and read its keys and values (every task packs those its rows see) from
  // cache; with the groups interleaved (t % groups), every task would read them from memory. Last
  // first because under the causal mask a block's work grows with its rows' positions: the last
  // task handed out is the smallest block of the last group, not a large one that one thread runs alone.
  Index task_group(Index task) const { return task / row_blocks; }
  /// k-steps reserved per value panel of a block of bk keys (bf16: room for round_panel).
  Index value_steps(Index bk) const { return packing == Packing::Plain ? bk : round_up(bk, 2); }
  Index task_first_row(Index task) const { return (row_blocks - 1 - task % row_blocks) * Bq; }
  Index task_rows(Index task) const { return std::min(Bq, rows - task_first_row(task)); }
  /// Whether the panel at row p0 of a task's nrows rows is MR consecutive tokens of one head
  /// (every full panel of a prefill, but where a head's tokens end): its queries and outputs are
  /// then one contiguous run per channel.
  bool consecutive_tokens(const Index* token, Index p0, Index nrows) const {
    return p0 + MR <= nrows && token[p0] + MR <= q_len;
  }
};

/// Marks a padding row: never masked.
constexpr Index flash_no_mask = std::numeric_limits<Index>::max() / 2;

template <typename T>
FlashPlan plan_flash(const AttentionArguments<T>& whole, const FlashTileKernel<T>& kernel, const Context& context) {
  FlashPlan p;
  p.MR = kernel.mr, p.NR = kernel.nr;
  p.groups = std::lcm(whole.n_k, whole.n_v), p.group = whole.n_q / p.groups;
  p.rows = p.group * whole.q_len, p.q_len = whole.q_len;
  p.D = whole.d_qk + whole.d_rope, p.dv = whole.d_v, p.dv_padded = round_up(p.dv, p.NR);
  p.packing = kernel.packing;
  p.Dq = p.packing == Packing::Plain ? p.D : round_up(p.D, 2), p.Dp = packed_depth(p.packing, p.D);
  p.chunks = key_chunks(whole, p.rows);
  // Split keys: a task takes all of its group's rows, so each key is packed once (key_chunks).
  p.Bk = context.key_block(p.D, p.dv, p.packing == Packing::Plain ? sizeof(T) : 2);  // bf16: the packed keys' bytes
  p.Bq = p.chunks > 1 ? round_up(p.rows, p.MR) : context.query_block(p.MR, p.D, p.dv_padded, sizeof(T));
  p.prefetch = context.tuning.tile_prefetch, p.pack_ahead = context.tuning.pack_prefetch;
  p.row_blocks = (p.rows + p.Bq - 1) / p.Bq, p.tasks = p.groups * p.row_blocks, p.units = p.tasks * p.chunks;
  p.panels = p.Bq / p.MR;
  assert(p.panels <= max_flash_panels);
  // bf16 compute: rounded as packed; keys stored in bf16: widened or paired as packed
  p.keys_in_place = context.keys_in_place() && p.packing == Packing::Plain && !key_runs_bf16(whole);
  // The caller's word, held to what reading V from K's runs needs (one latent for every head).
  const bool values_are_keys = whole.values_are_keys && whole.v == whole.k && whole.v_bf16 == whole.k_bf16 &&
                               whole.ldv == whole.ldk && whole.d_v <= whole.d_qk && whole.n_k == whole.n_v &&
                               (whole.n_k == 1 || whole.d_v == whole.d_qk);
  assert(values_are_keys == whole.values_are_keys && "AttentionArguments::values_are_keys: V is not K's first channels");
  p.values_in_place = context.values_in_place() && values_are_keys && p.packing == Packing::Plain && !value_runs_bf16(whole);
  p.q_size = p.Bq * p.Dq, p.k_size = p.keys_in_place ? 0 : round_up(p.Bk, p.NR) * p.Dq;
  p.v_size = p.values_in_place ? 0 : p.value_steps(p.Bk) * p.dv_padded;
  p.s_size = p.MR * round_up(p.packing == Packing::Plain ? p.Bk : p.Bk + 1, p.NR);  // bf16: round_panel's room
  p.o_size = p.Bq * p.dv_padded;
  p.per_worker = p.q_size + p.k_size + p.v_size + p.s_size + p.o_size + 3 * p.Bq;
  p.slot_size = p.o_size + 2 * p.Bq;
  return p;
}

/// A task's rows (query head and token of each; rows past the end are never masked) and its
/// queries, scaled: qp[p·MR·Dq + k·MR + i] for row p·MR + i of the block, zero rows past the end
/// (bf16 compute: then rounded, panel by panel, by `round`).
/// Channel by channel, each read down a column of Q: row by row, every read was a column apart,
/// and packing and unpacking rows that way took half of the attention's time.
template <typename T>
void prepare_rows(const FlashPlan& plan, const AttentionArguments<T>& whole, Index task, Index* pos, T* qp,
                  void (*round)(T*, Index, Index)) {
  const Index MR = plan.MR, D = plan.D, Dq = plan.Dq, Bq = plan.Bq;
  const Index g = plan.task_group(task), r0 = plan.task_first_row(task), nrows = plan.task_rows(task);
  Index* const head = pos + Bq;
  Index* const token = head + Bq;
  for (Index i = 0; i < Bq; ++i) {
    if (i >= nrows) {
      pos[i] = flash_no_mask;
      continue;
    }
    const Index r = r0 + i;
    head[i] = g * plan.group + r / whole.q_len, token[i] = r % whole.q_len;
    pos[i] = whole.causal ? whole.first_query_position + token[i] : flash_no_mask;
  }
  for (Index k = 0; k < D; ++k) {
    T* to = qp + k * MR;
    const bool rope = k >= whole.d_qk;
    const T* from = rope ? whole.qr + (k - whole.d_qk) * whole.ldqr : whole.q + k * whole.ldq;
    const Index head_stride = rope ? whole.d_rope * whole.ldqr : whole.d_qk * whole.ldq;
    // Row i = p0 + t of the block sits at qp[p0·Dq + k·MR + t] (panel by panel: MR is a run-time
    // value here, and a division per element cost 5–10 % of a causal prefill). A panel of
    // consecutive tokens reads one contiguous run of the column: a vector loop instead of a
    // gather per element.
    for (Index p0 = 0; p0 < Bq; p0 += MR) {
      if (plan.consecutive_tokens(token, p0, nrows)) {
        const T* run = from + head[p0] * head_stride + token[p0];
        for (Index t = 0; t < MR; ++t) to[p0 * Dq + t] = run[t] * whole.scale;
        continue;
      }
      for (Index t = 0, i = p0; t < MR; ++t, ++i)
        to[p0 * Dq + t] = i < nrows ? from[head[i] * head_stride + token[i]] * whole.scale : T(0);
    }
  }
  if (round)
    for (Index p0 = 0; p0 < Bq; p0 += MR) round(qp + p0 * Dq, MR, D);
}

/// One unit of work (a task against one chunk of keys): its views into its worker's buffers and
/// the rows it attends for.
template <typename T>
struct FlashUnit {
  Index nrows = 0, kh = 0, vh = 0;
  const Index* row_info = nullptr;  ///< the rows' positions, then heads, then tokens (Bq each)
  const Index* head = nullptr;
  const Index* token = nullptr;
  const T* queries = nullptr;       ///< packed, scaled (prepare_rows)
  T* kp = nullptr;                  ///< a key block's panels (unless read in place)
  T* vp = nullptr;                  ///< a value block's panels (unless read in place)
  T* sp = nullptr;                  ///< one panel's scores
  T* op = nullptr;                  ///< output accumulators, MR-row panels (a split unit's slot)
  T* m = nullptr;                   ///< each row's running max, sum and rescaling factor
  T* l = nullptr;
  T* alpha = nullptr;
  /// Whether panel p's accumulators hold anything yet. A panel's first block starts its tiles
  /// from zero and skips the rescaling (α = e^−∞ = 0 there), which is what filling them with
  /// zeros first computed, to the bit, without the fill and the rescaling pass.
  bool started[max_flash_panels];
};

/// Where the next key block's runs are asked for into L2 during the last panel's P·V tiles
/// (keys read in place, or packed for bf16 compute), a few channels before each tile.
struct NextBlockPrefetch {
  Index k0 = 0, bk = 0, per_tile = 0, channel = 0;
};

/// One MR-row panel against one block of keys (bk of them from k0): S = Q·Kᵀ key-major, the causal
/// diagonal masked, the online softmax step, then O ← α·O + P·V.
template <typename T>
void attend_panel(const FlashPlan& plan, const FlashTileKernel<T>& kernel, const AttentionArguments<T>& a,
                  FlashUnit<T>& u, Index p, Index k0, Index bk, NextBlockPrefetch* next) {
  const Index MR = plan.MR, NR = plan.NR, dv = plan.dv;
  const Index* row_pos = u.row_info + p * MR;
  Index lowest = flash_no_mask, highest = 0;  // over the panel's rows (padding rows are never masked)
  for (Index i = 0; i < std::min(MR, u.nrows - p * MR); ++i)
    lowest = std::min(lowest, row_pos[i]), highest = std::max(highest, row_pos[i]);
  const Index key0 = a.first_key_position + k0;  // position of the block's first key
  if (highest < key0) return;  // causal: the whole block is after every row of the panel
  // Keys after the panel's last row are masked for all its rows: their scores are not computed
  // and P·V stops before them. Their weights would be e^−∞ = 0 exactly, so the sums are the
  // same to the bit; on the causal diagonal this halves the block's work.
  const Index kn = std::min(bk, highest + 1 - key0);
  const Index kh = u.kh;
  T* const s = u.sp;
  const T* const q = u.queries + p * MR * plan.Dq;
  for (Index j0 = 0; j0 < kn; j0 += NR) {  // S = Q·Kᵀ, key-major (column j is key j): P·V's packed A
    T* dst[max_tile_columns];
    for (Index j = 0; j < NR; ++j) dst[j] = s + (j0 + j) * MR;
    const Index nj = std::min(NR, bk - j0);
    if (!plan.keys_in_place) {
      kernel.tile(nj, plan.Dp, q, u.kp + j0 * plan.Dq, NR, nullptr, nullptr, dst, plan.prefetch);
    } else {  // k, then k_rope continuing from the stored sums
      const T* const* stored = dst;
      kernel.tile(nj, a.d_qk, q, key_run(a, kh, k0 + j0, 0), a.ldk, nullptr, nullptr, dst, plan.prefetch);
      if (a.d_rope)
        kernel.tile(nj, a.d_rope, q + a.d_qk * MR, key_run(a, kh, k0 + j0, a.d_qk), a.ldkr, stored, nullptr, dst, plan.prefetch);
    }
  }
  if (lowest < key0 + kn - 1)  // the causal diagonal crosses this block: mask keys after each row
    for (Index i = 0; i < MR; ++i)
      for (Index k = std::max<Index>(0, row_pos[i] + 1 - key0); k < kn; ++k) s[k * MR + i] = -std::numeric_limits<T>::infinity();
  kernel.softmax_panel(s, kn, u.m + p * MR, u.l + p * MR, u.alpha + p * MR);
  if (plan.packing != Packing::Plain) kernel.round_panel(s, MR, kn);  // bf16: P, rounded
  const Index pv_depth = packed_depth(plan.packing, kn), v_steps = plan.value_steps(bk);
  T* const o = u.op + p * MR * plan.dv_padded;
  if (u.started[p]) kernel.scale_panel(o, dv, u.alpha + p * MR);
  for (Index c0 = 0; c0 < dv; c0 += NR) {
    T* cols[max_tile_columns];
    for (Index j = 0; j < NR; ++j) cols[j] = o + (c0 + j) * MR;
    if (next)
      for (Index e = 0; e < next->per_tile && next->channel < plan.D; ++e, ++next->channel)
        prefetch_key_run<2>(a, kh, next->k0, next->channel, next->bk);
    T* const* start = u.started[p] ? cols : nullptr;
    if (plan.values_in_place)  // channels c0… of the latent, which key_run gives (values_are_keys)
      kernel.tile_transposed(std::min(NR, dv - c0), kn, s, key_run(a, kh, k0, c0), a.ldk, start, nullptr, cols, plan.prefetch);
    else
      kernel.tile(std::min(NR, dv - c0), pv_depth, s, u.vp + c0 * v_steps, NR, start, nullptr, cols, plan.prefetch);
  }
  u.started[p] = true;
}

/// Streaming: the unit's rows continue from the state the previous calls left (max, sum and the
/// unnormalised output). A row that has seen no key yet (max −∞) starts from out = 0 (see
/// row_max): nothing to read. A single call with statistics (training's forward keeps ℓ) reads nothing.
template <typename T>
void resume_rows(const FlashPlan& plan, const AttentionArguments<T>& a, FlashUnit<T>& u) {
  const Index MR = plan.MR;
  std::fill(u.op, u.op + plan.o_size, T(0));
  for (Index i = 0; i < u.nrows; ++i)
    u.m[i] = a.row_max[u.head[i] * a.q_len + u.token[i]], u.l[i] = a.row_sum[u.head[i] * a.q_len + u.token[i]];
  for (Index c = 0; c < plan.dv; ++c)
    for (Index p0 = 0; p0 < u.nrows; p0 += MR)
      for (Index t = 0, i = p0; t < MR && i < u.nrows; ++t, ++i)
        if (u.m[i] != -std::numeric_limits<T>::infinity())
          u.op[p0 * plan.dv_padded + c * MR + t] = a.out[(u.head[i] * plan.dv + c) * a.ldo + u.token[i]];
}

/// O / l into the output rows, channel by channel (streaming: O, max and sum as they are, for the
/// next call). A panel that saw no key holds zeros, as if filled at the start.
template <typename T>
void write_rows(const FlashPlan& plan, const AttentionArguments<T>& a, FlashUnit<T>& u, bool streaming) {
  const Index MR = plan.MR, dv = plan.dv, dv_padded = plan.dv_padded, nrows = u.nrows;
  const Index* const head = u.head;
  const Index* const token = u.token;
  for (Index p = 0; p < plan.panels; ++p)
    if (!u.started[p]) std::fill(u.op + p * MR * dv_padded, u.op + (p + 1) * MR * dv_padded, T(0));
  T* const alpha = u.alpha;  // free now: each row's factor
  for (Index i = 0; i < nrows; ++i) {
    alpha[i] = streaming ? T(1) : T(1) / u.l[i];
    if (streaming) a.row_max[head[i] * a.q_len + token[i]] = u.m[i], a.row_sum[head[i] * a.q_len + token[i]] = u.l[i];
  }
  // Row i = p0 + t, channel c at op[p0·dv_padded + c·MR + t].
  const auto unpack = [&](Index p0, Index t, Index c) {
    const Index i = p0 + t;
    a.out[(head[i] * dv + c) * a.ldo + token[i]] = u.op[p0 * dv_padded + c * MR + t] * alpha[i];
  };
  if (a.q_len == 1) {  // one token per head (decoding): a row's channels lie next to each other
    for (Index p0 = 0; p0 < nrows; p0 += MR)
      for (Index t = 0; t < MR && p0 + t < nrows; ++t)
        for (Index c = 0; c < dv; ++c) unpack(p0, t, c);
    return;
  }
  for (Index c = 0; c < dv; ++c)  // a panel of MR consecutive tokens of one head: one run per channel
    for (Index p0 = 0; p0 < nrows; p0 += MR) {
      if (plan.consecutive_tokens(token, p0, nrows)) {
        T* const run = a.out + (head[p0] * dv + c) * a.ldo + token[p0];
        const T* const from = u.op + p0 * dv_padded + c * MR;
        for (Index t = 0; t < MR; ++t) run[t] = from[t] * alpha[p0 + t];
        continue;
      }
      for (Index t = 0; t < MR && p0 + t < nrows; ++t) unpack(p0, t, c);
    }
}

/// A unit's rows against every block of its keys they can see; false when every key follows
/// every row (causal, streaming), so that there is nothing to add and nothing to write.
template <typename T>
bool attend_unit(const FlashPlan& plan, const FlashTileKernel<T>& kernel, const AttentionArguments<T>& a, FlashUnit<T>& u) {
  const Index MR = plan.MR, Bk = plan.Bk;
  std::fill(u.m, u.m + plan.Bq, -std::numeric_limits<T>::infinity());  // a skipped unit's slot adds nothing
  std::fill(u.l, u.l + plan.Bq, T(0));
  Index last_position = 0;
  for (Index i = 0; i < u.nrows; ++i) last_position = std::max(last_position, a.first_query_position + u.token[i]);
  const Index k_end = a.causal ? std::min(a.k_len, last_position + 1 - a.first_key_position) : a.k_len;
  if (k_end <= 0) return false;  // every key is after every row: nothing to add (streaming)
  const bool streaming = a.row_max != nullptr;
  std::fill(u.started, u.started + plan.panels, streaming);
  if (streaming) resume_rows(plan, a, u);
  for (Index k0 = 0; k0 < k_end; k0 += Bk) {
    const Index bk = std::min(Bk, k_end - k0);
    if (!plan.keys_in_place) kernel.pack_keys(a, u.kh, k0, bk, u.kp, plan.Dq, plan.pack_ahead);
    if (!plan.values_in_place) kernel.pack_values(a, u.vh, k0, bk, u.vp, plan.value_steps(bk), plan.pack_ahead);
    NextBlockPrefetch next;
    next.k0 = k0 + Bk, next.bk = plan.keys_in_place || plan.packing != Packing::Plain ? std::min(Bk, k_end - next.k0) : 0;
    const Index pv_tiles = plan.dv_padded / plan.NR, last_panel = (u.nrows - 1) / MR;
    next.per_tile = next.bk > 0 ? (plan.D + pv_tiles - 1) / pv_tiles : 0;
    for (Index p = 0; p < plan.panels && p * MR < u.nrows; ++p)
      attend_panel(plan, kernel, a, u, p, k0, bk, p == last_panel ? &next : nullptr);
  }
  return true;
}

/// The merge of the chunks' results (FlashDecoding's last step): each row's max M = max_c m_c,
/// sum Σ_c l_c·e^(m_c − M) and output Σ_c O_c·e^(m_c − M) / sum — the online softmax's step,
/// taken once per chunk. A chunk whose keys all follow the row (causal), or a panel that saw none
/// of its keys, left m_c = −∞ and adds nothing (its accumulators are never read). Panel by panel,
/// reading the units' packed accumulators as they lie (row p0 + t, channel d at
/// O[p0·dv_padded + d·MR + t]): the MR rows of a channel are one contiguous run of each chunk's.
template <typename T>
void merge_chunks(const FlashPlan& plan, const AttentionArguments<T>& whole, const Index* task_positions, const T* partial,
                  int threads) {
  const Index MR = plan.MR, Bq = plan.Bq, chunks = plan.chunks, slot_size = plan.slot_size;
  const Index merged_panels = plan.tasks * plan.panels;
  (void)threads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
#endif
  for (Index u = 0; u < merged_panels; ++u) {
    const Index task = u / plan.panels, p0 = u % plan.panels * MR, nrows = plan.task_rows(task);
    if (p0 >= nrows) continue;
    const Index count = std::min(MR, nrows - p0);
    const Index* const head = task_positions + task * 3 * Bq + Bq + p0;
    const Index* const token = head + Bq;
    const T* const first = partial + task * chunks * slot_size;
    const auto stat = [&](Index c, Index which) { return first + c * slot_size + plan.o_size + which * Bq + p0; };  // m: 0, l: 1
    T weight[flash_max_chunks()][max_tile_rows];  // e^(m_c − M), 0 for a chunk the row saw no key of
    T top[max_tile_rows], sum[max_tile_rows], acc[max_tile_rows];
    for (Index t = 0; t < count; ++t) {
      top[t] = -std::numeric_limits<T>::infinity();
      for (Index c = 0; c < chunks; ++c) top[t] = std::max(top[t], stat(c, 0)[t]);
      sum[t] = T(0);
      for (Index c = 0; c < chunks; ++c) {
        const T m = stat(c, 0)[t];
        weight[c][t] = m == -std::numeric_limits<T>::infinity() ? T(0) : std::exp(m - top[t]);
        sum[t] += weight[c][t] * stat(c, 1)[t];
      }
    }
    for (Index d = 0; d < plan.dv; ++d) {
      std::fill(acc, acc + count, T(0));
      for (Index c = 0; c < chunks; ++c) {
        const T* const o = first + c * slot_size + p0 * plan.dv_padded + d * MR;
        // acc + 0 is acc exactly (acc is never −0), so the select adds what skipping would.
        for (Index t = 0; t < count; ++t) acc[t] += weight[c][t] != T(0) ? weight[c][t] * o[t] : T(0);
      }
      for (Index t = 0; t < count; ++t) whole.out[(head[t] * plan.dv + d) * whole.ldo + token[t]] = acc[t] / sum[t];
    }
  }
}

/// The tiled path: plan, then every unit (a task against a chunk of keys) in parallel, each
/// writing its rows (or, with split keys, its slot), then the chunks merged.
template <typename T>
void flash_attention_on(const AttentionArguments<T>& whole, int threads, const FlashTileKernel<T>& kernel, const Context& context,
                        FlashScratch<T>& scratch) {
  const FlashPlan plan = plan_flash(whole, kernel, context);
  const Index Bq = plan.Bq, chunks = plan.chunks;
  const Index workers = std::max(1, threads);
  T* const buffers = scratch.values.reserve(static_cast<std::size_t>(plan.per_worker * workers));
  Index* const positions = scratch.positions.reserve(static_cast<std::size_t>(3 * Bq * workers));  // pos, head, token
  // Each chunk of keys is a call of its own over the chunk's keys (parts[c]); unit (task, chunk)
  // leaves its unnormalised output accumulators, packed as the unit computed them, and its rows'
  // max and sum in its slot of `partial`, merged once all units are done: no unit unpacks its
  // output. A task's rows and queries are prepared once for all of its chunks.
  AttentionArguments<T>* const parts = chunks > 1 ? scratch.parts.reserve(static_cast<std::size_t>(chunks)) : nullptr;
  T* const partial = chunks > 1 ? scratch.partials.reserve(static_cast<std::size_t>(plan.units * plan.slot_size)) : nullptr;
  T* const shared_queries = chunks > 1 ? scratch.queries.reserve(static_cast<std::size_t>(plan.tasks * plan.q_size)) : nullptr;
  Index* const shared_positions =
      chunks > 1 ? scratch.task_positions.reserve(static_cast<std::size_t>(plan.tasks * 3 * Bq)) : nullptr;
  if (chunks > 1) {
    const Index chunk_keys = (whole.k_len + chunks - 1) / chunks;
    for (Index c = 0; c < chunks; ++c) {
      AttentionArguments<T> part = whole;
      const Index k0 = c * chunk_keys;
      part.k_len = std::min(chunk_keys, whole.k_len - k0);
      part.first_key_position += k0;
      for (const T** run : {&part.k, &part.kr, &part.v})
        if (*run) *run += k0;
      for (const Eigen::bfloat16** run : {&part.k_bf16, &part.kr_bf16, &part.v_bf16})
        if (*run) *run += k0;
      parts[c] = part;
    }
    for (Index task = 0; task < plan.tasks; ++task)
      prepare_rows(plan, whole, task, shared_positions + task * 3 * Bq, shared_queries + task * plan.q_size, kernel.round_panel);
  }
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && plan.units > 1)
#endif
  for (Index unit = 0; unit < plan.units; ++unit) {
#ifdef _OPENMP
    const Index me = omp_get_thread_num();
#else
    const Index me = 0;
#endif
    const Index task = unit / chunks, g = plan.task_group(task);
    const AttentionArguments<T>& a = chunks > 1 ? parts[unit % chunks] : whole;
    T* const qp = buffers + me * plan.per_worker;
    FlashUnit<T> u;
    u.kp = qp + plan.q_size, u.vp = u.kp + plan.k_size, u.sp = u.vp + plan.v_size;
    T* const slot = chunks > 1 ? partial + unit * plan.slot_size : nullptr;
    u.op = chunks > 1 ? slot : u.sp + plan.s_size;
    u.m = u.op + plan.o_size, u.l = u.m + Bq;
    u.alpha = chunks > 1 ? u.sp + plan.s_size + plan.o_size + 2 * Bq : u.l + Bq;
    u.nrows = plan.task_rows(task);
    u.kh = g * a.n_k / plan.groups, u.vh = g * a.n_v / plan.groups;
    Index* const pos = positions + me * 3 * Bq;
    if (chunks == 1) prepare_rows(plan, whole, task, pos, qp, kernel.round_panel);
    u.row_info = chunks > 1 ? shared_positions + task * 3 * Bq : pos;
    u.queries = chunks > 1 ? shared_queries + task * plan.q_size : qp;
    u.head = u.row_info + Bq, u.token = u.head + Bq;
    if (attend_unit(plan, kernel, a, u) && chunks == 1)  // split keys: the unit's slot holds its result
      write_rows(plan, a, u, a.row_max != nullptr);
  }
  if (chunks > 1) merge_chunks(plan, whole, shared_positions, partial, threads);
}

/// One worker's state in the few-row path: a key/value head group's rows (queries scaled and
/// channel-major, qp[c·rows + r]), their scores against a block of keys (rows of ld), output
/// accumulators, running max, sum and rescaling, positions, and dot_rows's results.
template <typename T>
struct FewRows {
  Index rows = 0, ld = 0, kh = 0, vh = 0;
  T *qp = nullptr, *sp = nullptr, *op = nullptr, *m = nullptr, *l = nullptr, *alpha = nullptr, *dots = nullptr;
  Index* pos = nullptr;
};

/// Where few_rows_block reads a block's keys, RoPE keys and values, in place: float, or stored in
/// bfloat16 (the *16 pointers, then the float ones null), which the kernel widens as it loads.
template <typename T>
struct FewRowOperands {
  const T *k = nullptr, *kr = nullptr, *v = nullptr;
  const Eigen::bfloat16 *k16 = nullptr, *kr16 = nullptr, *v16 = nullptr;
  Index ldk = 0, ldkr = 0, ldv = 0;
  FewRowOperands(const AttentionArguments<T>& a, Index k0, const FewRows<T>& w) : ldk(a.ldk), ldkr(a.ldkr), ldv(a.ldv) {
    if (key_runs_bf16(a)) {
      k16 = key_run_bf16(a, w.kh, k0, 0);
      if (a.d_rope) kr16 = a.kr_bf16 + k0;
    } else {
      k = key_run(a, w.kh, k0, 0);
      if (a.d_rope) kr = a.kr + k0;
    }
    if (value_runs_bf16(a)) v16 = a.v_bf16 + w.vh * a.d_v * a.ldv + k0;
    else v = a.v + w.vh * a.d_v * a.ldv + k0;
  }
};

/// Loads group g's rows: queries scaled, positions, and the running state (from the streaming
/// call's, or empty). Returns how many keys the rows see (0: none, causally).
template <typename T>
Index few_rows_start(const AttentionArguments<T>& a, Index g, Index group, FewRows<T>& w) {
  Index last_position = 0;
  for (Index r = 0; r < w.rows; ++r) {
    const Index h = g * group + r / a.q_len, t = r % a.q_len;
    w.pos[r] = a.first_query_position + t;
    last_position = std::max(last_position, w.pos[r]);
    const T* q = a.q + h * a.d_qk * a.ldq + t;
    for (Index c = 0; c < a.d_qk; ++c) w.qp[c * w.rows + r] = q[c * a.ldq] * a.scale;
    if (a.d_rope == 0) continue;  // a.qr may be null: no offset from it
    const T* qr = a.qr + h * a.d_rope * a.ldqr + t;
    for (Index c = 0; c < a.d_rope; ++c) w.qp[(a.d_qk + c) * w.rows + r] = qr[c * a.ldqr] * a.scale;
  }
  const Index k_end = a.causal ? std::min(a.k_len, last_position + 1 - a.first_key_position) : a.k_len;
  if (k_end <= 0) return 0;
  const bool streaming = a.row_max != nullptr;
  for (Index r = 0; r < w.rows; ++r) {
    const Index h = g * group + r / a.q_len, t = r % a.q_len;
    w.m[r] = streaming ? a.row_max[h * a.q_len + t] : -std::numeric_limits<T>::infinity();
    w.l[r] = streaming ? a.row_sum[h * a.q_len + t] : T(0);
    for (Index c = 0; c < a.d_v; ++c) w.op[r * a.d_v + c] = streaming ? a.out[(h * a.d_v + c) * a.ldo + t] : T(0);
  }
  return k_end;
}

/// The rows against keys [k0, k0 + bk): S = Q·Kᵀ ([k | k_rope] in channel order, four rows per
/// sweep), softmax_row's online step on each row, then P·V added to the accumulators.
template <typename T>
void few_rows_block(const AttentionArguments<T>& a, const FewRowKernel<T>& kernel, Index k0, Index bk, Index ahead,
                    FewRows<T>& w) {
  const Index rows = w.rows, ld = w.ld, dv = a.d_v;
  const FewRowOperands<T> in(a, k0, w);
  // `ahead` counts float values; a bf16 run is asked for as many bytes ahead
  const auto scores = [&](Index count, Index depth, const T* k, const Eigen::bfloat16* k16, Index ldk, const T* q, T* s,
                          bool start) {
    if (k16) kernel.column_scores_bf16(count, bk, depth, k16, ldk, q, rows, s, ld, start, 2 * ahead);
    else kernel.column_scores(count, bk, depth, k, ldk, q, rows, s, ld, start, ahead);
  };
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const Index count = std::min<Index>(4, rows - r0);
    scores(count, a.d_qk, in.k, in.k16, in.ldk, w.qp + r0, w.sp + r0 * ld, true);
    if (a.d_rope > 0) scores(count, a.d_rope, in.kr, in.kr16, in.ldkr, w.qp + a.d_qk * rows + r0, w.sp + r0 * ld, false);
  }
  const Index key0 = a.first_key_position + k0;
  for (Index r = 0; r < rows; ++r) {
    T* s = w.sp + r * ld;
    // Keys after the row's position (causal) and the padding past bk do not count.
    const Index visible = a.causal ? std::clamp<Index>(w.pos[r] + 1 - key0, 0, bk) : bk;
    const Index n = round_up(bk, kernel.lanes);
    std::fill(s + visible, s + n, -std::numeric_limits<T>::infinity());
    kernel.softmax_row(s, n, w.m + r, w.l + r, w.alpha + r);
    for (Index c = 0; c < dv; ++c) w.op[r * dv + c] *= w.alpha[r];
  }
  for (Index r0 = 0; r0 < rows; r0 += 4) {
    const Index count = std::min<Index>(4, rows - r0);
    if (in.v16) kernel.dot_rows_bf16(count, w.sp + r0 * ld, ld, bk, in.v16, in.ldv, dv, w.dots, 2 * ahead);
    else kernel.dot_rows(count, w.sp + r0 * ld, ld, bk, in.v, in.ldv, dv, w.dots, ahead);
    for (Index i = 0; i < count; ++i)
      for (Index c = 0; c < dv; ++c) w.op[(r0 + i) * dv + c] += w.dots[c * 4 + i];
  }
}

/// Few query rows per key/value head (decoding, GQA decoding: group·Lq ≤ 8): the tile path would
/// compute MR rows for each of them and pack every key first. Here K and V are read where they
/// lie, each once per group of up to four rows: the rows' scores against a block of keys by
/// column_scores (a few contiguous runs of K at a time, the scores in L1), softmax_row's online
/// step on each row's contiguous scores, and P·V as one dot product per value channel (dot_rows).
/// Decoding is bound by reading the cache, and this reads it once, in order.
template <typename T>
void flash_attention_few_rows(const AttentionArguments<T>& a, int threads, const FewRowKernel<T>& kernel, const Context& context,
                              FlashScratch<T>& scratch) {
  const Index groups = std::lcm(a.n_k, a.n_v), group = a.n_q / groups, rows = group * a.q_len;
  const Index D = a.d_qk + a.d_rope, dv = a.d_v;
  const Index ahead = context.tuning.stream_prefetch / Index(sizeof(T));
  // Keys per block: 4096 when one sweep serves all rows (each of K's and V's columns then read in
  // runs of 16 KiB); with more than four rows K is swept once per four, so the block's keys stay
  // within 256 KiB (L2). Not tuning: the block sets where the online softmax rescales, which bd
  // keeps the same on every CPU for a shape.
  // Keys and values stored in bfloat16 are read in the same blocks (their bits then the float
  // values' own).
  const Index Bk =
      rows <= 4 ? 4096 : std::clamp<Index>(Index(256 * 1024 / sizeof(T)) / std::max<Index>(1, D) / 16 * 16, 16, 1024);
  // Per worker (FewRows): queries, scores (rows of Bk, padded to whole vectors with −∞), output
  // accumulators, each row's max, sum, rescaling and position, dot results.
  const Index ld = Bk, q_size = D * rows, s_size = rows * ld, o_size = rows * dv;
  const Index per_worker = q_size + s_size + o_size + 3 * rows + 4 * dv;
  const Index workers = std::max(1, threads);
  T* const buffers = scratch.values.reserve(static_cast<std::size_t>(per_worker * workers));
  Index* const positions = scratch.positions.reserve(static_cast<std::size_t>(rows * workers));
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && groups > 1)
#endif
  for (Index g = 0; g < groups; ++g) {
#ifdef _OPENMP
    const Index me = omp_get_thread_num();
#else
    const Index me = 0;
#endif
    FewRows<T> w;
    w.rows = rows, w.ld = ld, w.kh = g * a.n_k / groups, w.vh = g * a.n_v / groups;
    w.qp = buffers + me * per_worker, w.sp = w.qp + q_size, w.op = w.sp + s_size;
    w.m = w.op + o_size, w.l = w.m + rows, w.alpha = w.l + rows, w.dots = w.alpha + rows;
    w.pos = positions + me * rows;
    const Index k_end = few_rows_start(a, g, group, w);
    for (Index k0 = 0; k0 < k_end; k0 += Bk) few_rows_block(a, kernel, k0, std::min(Bk, k_end - k0), ahead, w);
    if (k_end <= 0) continue;
    const bool streaming = a.row_max != nullptr;
    for (Index r = 0; r < rows; ++r) {
      const Index h = g * group + r / a.q_len, t = r % a.q_len;
      const T inv = streaming ? T(1) : T(1) / w.l[r];
      if (streaming) a.row_max[h * a.q_len + t] = w.m[r], a.row_sum[h * a.q_len + t] = w.l[r];
      for (Index c = 0; c < dv; ++c) a.out[(h * dv + c) * a.ldo + t] = w.op[r * dv + c] * inv;
    }
  }
}

/// The rows per key/value head up to which the few-row path runs (flash_attention_few_rows).
constexpr Index few_rows_limit() { return 8; }


}  // namespace detail

/// After the last streaming call: out ← out / row_sum, row by row.
template <typename T>
void flash_attention_finish(const AttentionArguments<T>& a) {
  for (Index h = 0; h < a.n_q; ++h)
    for (Index c = 0; c < a.d_v; ++c) {
      T* column = a.out + (h * a.d_v + c) * a.ldo;
      for (Index t = 0; t < a.q_len; ++t) column[t] /= a.row_sum[h * a.q_len + t];
    }
}

/// Runs the attention on up to `threads` OpenMP threads (0: omp_get_max_threads(); 1 inside a
/// parallel region) with the kernels of active_isa(). Lk ≥ 1 (a row with no key has no softmax;
/// streaming, a row must have seen a key by the finishing call);
/// the caller checks shapes (nn/attend.hpp does, with messages). The scratch is the
/// calling thread's in `ws`, kept there for the next call: a call of a shape already seen on this
/// thread allocates nothing.
template <typename T>
void flash_attention(const AttentionArguments<T>& a, int threads = 0, Workspace& ws = default_workspace()) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "flash_attention: float or double");
  if (a.k_len <= 0 || a.n_k <= 0 || a.n_v <= 0 || a.n_q % a.n_k != 0 || a.n_q % a.n_v != 0)
    throw ShapeError(bd::detail::message("flash_attention: ", a.k_len, " keys, ", a.n_q, " query heads on ", a.n_k, " key and ",
                                         a.n_v, " value heads; expected at least one key and query heads a multiple of each"));
  if ((a.k_bf16 || a.v_bf16) && !std::is_same_v<T, float>)
    throw ShapeError("flash_attention: keys and values stored in bf16 are read by float arithmetic");
  if (a.k_bf16 && (a.k || (a.d_rope && !a.kr_bf16)))
    throw ShapeError("flash_attention: keys stored in bf16 (k_bf16) take their RoPE keys in bf16 too (kr_bf16); k null");
  if (a.v_bf16 && a.v)
    throw ShapeError("flash_attention: values stored in bf16 (v_bf16) leave v null");
  if (!a.v && !a.v_bf16)
    throw ShapeError("flash_attention: no values: v, or v_bf16 for values stored in bf16 (a bf16 latent's: v_bf16 = k_bf16)");
  if (a.q_len == 0) return;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  threads = 1;
#endif
  detail::FlashScratch<T>& scratch = ws.local<detail::FlashScratch<T>>();
  const Index rows = a.n_q / std::lcm(a.n_k, a.n_v) * a.q_len;  // per key/value head
  const Context& context = active_context();
  if (a.compute == Compute::BF16) {
    if constexpr (!std::is_same_v<T, float>) {
      throw RangeError("flash_attention: bf16 compute multiplies operands rounded once to bf16 in f32 arithmetic; this "
                       "call's arithmetic is f64 (compute in f32)");
    } else if (rows > detail::few_rows_limit()) {
      const detail::Packing packing = context.bf16_method() == Bf16Method::Dot ? detail::Packing::Pairs : detail::Packing::Rounded;
      return detail::flash_attention_on(a, threads, on_active_kernel<T>([packing](auto k) -> decltype(auto) {
                                          return detail::bf16_flash_tile_kernel<decltype(k), T>(packing);
                                        }),
                                        context, scratch);
    }
  }
  if (rows <= detail::few_rows_limit())
    return detail::flash_attention_few_rows(
        a, threads, on_active_kernel<T>([](auto k) -> decltype(auto) { return detail::few_row_kernel<decltype(k), T>(); }),
        context, scratch);
  detail::flash_attention_on(
      a, threads, on_active_kernel<T>([](auto k) -> decltype(auto) { return detail::flash_tile_kernel<decltype(k), T>(); }),
      context, scratch);
}

/// The instantiations bd::compiled holds (src/compiled_kernel.cpp), extern under BD_COMPILED_LIB.
#define BD_FLASH_ATTENTION_INSTANTIATIONS(prefix)                              \
  prefix void flash_attention<float>(const AttentionArguments<float>&, int, Workspace&);   \
  prefix void flash_attention<double>(const AttentionArguments<double>&, int, Workspace&);
#ifdef BD_COMPILED_LIB
BD_FLASH_ATTENTION_INSTANTIATIONS(extern template)
#endif

}  // namespace bd::kernel
