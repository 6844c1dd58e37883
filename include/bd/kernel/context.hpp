// bd/kernel/context.hpp — one context per CPU: what the kernels can do there (capability) and
// how they should do it (tuning), built once from what the CPU says about itself (BLIS's
// context, Van Zee & van de Geijn 2015):
//
//   CpuDescription   vendor, family and model, cache sizes, bf16 units (cpu.hpp reads them)
//   Tuning           every blocking, prefetch and preference choice of bd's kernels: a row of
//                    the table below for a CPU family bd was measured on, the cache model for
//                    any other CPU, and BD_TUNING=key=value,… on top of either
//   Context          the description, the instruction set in use, the tuning, and what that
//                    instruction set's kernels can do on this CPU
//
// Tuning never changes a result's bits but in one place: flash attention's key block sets
// where its online softmax rescales (key_block below). Choices that decide a summation order —
// which products take the few-row paths, how many chunks split a long key range — are the
// algorithm's, fixed by the shapes, and not here.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>

#include "bd/base/code_size.hpp"
#include "bd/base/error.hpp"
#include "bd/base/index.hpp"
#include "bd/base/names.hpp"
#include "bd/kernel/cpu.hpp"

namespace bd::kernel {

using bd::Index;

/// How a bf16 product is computed: vdpbf16ps on bf16 pairs (AVX512-BF16), or fp32 FMAs on the
/// operands rounded to bf16, in the order vdpbf16ps takes them — the same bits either way.
enum class Bf16Method { Fma, Dot };

inline constexpr bd::detail::Named<Bf16Method> bf16_method_names[] = {{Bf16Method::Fma, "fma"}, {Bf16Method::Dot, "dot"}};

inline const char* to_string(Bf16Method m) { return bd::detail::name_in(bf16_method_names, m); }

/// Every tuning choice of bd's kernels. Each field's comment says what it moves; docs/benchmarks.md
/// holds the measurements behind each row of the table.
struct Tuning {
  const char* row = "model";  ///< the table's row it came from ("model": the cache model)
  // The packed GEMM's blocks (loop.hpp). Blocking{}'s zeros take these.
  Index mc = 144;       ///< rows of a packed A block at most (fewer where half of L2 holds fewer)
  Index kc_min = 384;   ///< a depth pass's channels: from L1 (two thirds of it for the B micro-panel),
  Index kc_max = 512;   ///<   within [kc_min, kc_max]
  Index nc = 768;       ///< output columns per task
  // Prefetch distances.
  Index tile_prefetch = 512;     ///< bytes ahead of a tile's packed A loads (0: none)
  Index stream_prefetch = 2048;  ///< bytes ahead of few-row attention's reads of K and V (0: none)
  Index pack_prefetch = 32;      ///< channels ahead of flash attention's key and value packing (0: none)
  // Walks.
  Index row_walk = 8192;     ///< bytes: one decoded row deeper than this reads four weight columns per load
  Index skinny_group = 64;   ///< columns per call of decoding's products
  Index skinny_run = 512;    ///< columns per call of decoding's products on a row-major weight
  // Flash attention (flash_attention.hpp).
  Index key_block = 256 << 10;  ///< bytes of a key block's keys and values at most (and a quarter of L2);
                                ///< it sets where the online softmax rescales: attention's last bits move with it
  bool keys_in_place = true;    ///< score tiles read K where it lies, where the kernel can
  bool values_in_place = true;  ///< P·V reads values that are the keys' channels (MLA's latent) in place
  // bf16 compute.
  Bf16Method bf16 = Bf16Method::Dot;  ///< where the CPU has vdpbf16ps; Fma elsewhere whatever this says
};

namespace detail {

/// A tuning field as BD_TUNING and the tune command name it.
struct TuningField {
  const char* name;
  Index Tuning::*number;
  bool Tuning::*flag;
  Index low, high;  ///< a number's range
};

inline constexpr TuningField tuning_fields[] = {
    {"mc", &Tuning::mc, nullptr, 1, 4096},
    {"kc_min", &Tuning::kc_min, nullptr, 16, 4096},
    {"kc_max", &Tuning::kc_max, nullptr, 16, 4096},
    {"nc", &Tuning::nc, nullptr, 12, 1 << 16},
    {"tile_prefetch", &Tuning::tile_prefetch, nullptr, 0, 4096},
    {"stream_prefetch", &Tuning::stream_prefetch, nullptr, 0, 1 << 16},
    {"pack_prefetch", &Tuning::pack_prefetch, nullptr, 0, 256},
    {"row_walk", &Tuning::row_walk, nullptr, 0, 1 << 20},
    {"skinny_group", &Tuning::skinny_group, nullptr, 1, 512},
    {"skinny_run", &Tuning::skinny_run, nullptr, 1, 512},
    {"key_block", &Tuning::key_block, nullptr, 4096, 64 << 20},
    {"keys_in_place", nullptr, &Tuning::keys_in_place, 0, 1},
    {"values_in_place", nullptr, &Tuning::values_in_place, 0, 1},
};

}  // namespace detail

/// The tuning as BD_TUNING spells it: "mc=144,kc_min=384,…,bf16=dot".
BD_COLD inline std::string to_string(const Tuning& t) {
  std::string out;
  for (const auto& f : detail::tuning_fields) {
    if (!out.empty()) out += ',';
    out += f.name;
    out += '=';
    out += f.number ? std::to_string(t.*f.number) : std::string(t.*f.flag ? "1" : "0");
  }
  return out + ",bf16=" + to_string(t.bf16);
}

/// `spec` ("key=value,…", the keys of to_string(Tuning)) applied over `base`. RangeError naming
/// `source` and the key when a key is unknown, a value malformed or out of its range, or kc_min
/// exceeds kc_max.
BD_COLD inline Tuning parse_tuning(std::string_view spec, Tuning base, const char* source = "BD_TUNING") {
  const auto refuse = [&](std::string_view item, const std::string& why) {
    return RangeError(bd::detail::message(source, ": '", item, "' ", why));
  };
  std::string known;
  for (const auto& f : detail::tuning_fields) known += std::string(f.name) + ", ";
  known += "bf16";
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    const std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw refuse(item, "is not key=value (keys: " + known + ")");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "bf16") {
      const auto* m = bd::detail::find_in(bf16_method_names, value);
      if (!m) throw refuse(item, "names no bf16 method: expected " + bd::detail::names_in(bf16_method_names));
      base.bf16 = m->first;
      continue;
    }
    const detail::TuningField* field = nullptr;
    for (const auto& f : detail::tuning_fields)
      if (key == f.name) field = &f;
    if (!field) throw refuse(item, "names no tuning key (keys: " + known + ")");
    Index v = 0;
    for (char c : value) {
      if (c < '0' || c > '9' || v > (Index(1) << 40)) throw refuse(item, "is not a whole number");
      v = v * 10 + (c - '0');
    }
    if (v < field->low || v > field->high)
      throw refuse(item, bd::detail::message("is out of range: ", key, " takes ", field->low, " to ", field->high));
    if (field->number) base.*field->number = v;
    else base.*field->flag = v != 0;
  }
  if (base.kc_min > base.kc_max)
    throw RangeError(bd::detail::message(source, ": kc_min = ", base.kc_min, " exceeds kc_max = ", base.kc_max));
  return base;
}

namespace detail {

/// A row of the tuning table: the CPUs it covers (vendor, family, a range of models) and what
/// differs from the cache model on them, per instruction set. docs/benchmarks.md, "Tuning
/// table", gives each row's measurements and the command that remeasures them (bd_tune).
struct TuningRow {
  const char* name;
  Vendor vendor;
  int family, model_first, model_last;
  Tuning (*tune)(Tuning model, Isa isa);
};

/// Score tiles and P·V in place ran level or slower with the AVX2 tile (16 rows × 6 keys: each
/// key's line feeds half as many FMAs as AVX-512's), so AVX2 packs its keys and values.
inline Tuning pack_with_avx2(Tuning t, Isa isa) {
  if (isa != Isa::AVX512) t.keys_in_place = t.values_in_place = false;
  return t;
}

inline Tuning zen3_row(Tuning t, Isa isa) { return t.row = "zen3", pack_with_avx2(t, isa); }
inline Tuning zen4_row(Tuning t, Isa isa) { return t.row = "zen4", pack_with_avx2(t, isa); }
inline Tuning zen5_row(Tuning t, Isa isa) { return t.row = "zen5", pack_with_avx2(t, isa); }
/// Intel's vdpbf16ps issues at half the FMA rate: bf16 products by FMAs on rounded operands.
inline Tuning sapphire_rapids_row(Tuning t, Isa isa) {
  t.row = "sapphire-rapids";
  t.bf16 = Bf16Method::Fma;
  return pack_with_avx2(t, isa);
}

inline constexpr TuningRow tuning_rows[] = {
    {"zen3", Vendor::AMD, 0x19, 0x00, 0x0F, zen3_row},  // Milan
    {"zen3", Vendor::AMD, 0x19, 0x20, 0x5F, zen3_row},  // Vermeer, Rembrandt, Cezanne
    {"zen4", Vendor::AMD, 0x19, 0x10, 0x1F, zen4_row},  // Genoa
    {"zen4", Vendor::AMD, 0x19, 0x60, 0x7F, zen4_row},  // Raphael, Phoenix
    {"zen4", Vendor::AMD, 0x19, 0xA0, 0xAF, zen4_row},  // Bergamo, Siena
    {"zen5", Vendor::AMD, 0x1A, 0x00, 0xFF, zen5_row},  // Turin, Granite Ridge, Strix
    {"sapphire-rapids", Vendor::Intel, 6, 0x8F, 0x8F, sapphire_rapids_row},
    {"sapphire-rapids", Vendor::Intel, 6, 0xCF, 0xCF, sapphire_rapids_row},  // Emerald Rapids: the same cores
};

}  // namespace detail

/// The cache model (BLIS's, for the caches bd sizes by): a depth pass from L1 and a row block
/// from L2 at use (Context::depth_block, row_block), flash attention's key block from L2; every
/// other value the one measured alike on every CPU of the table. AVX2 packs keys and values.
BD_COLD inline Tuning model_tuning(const CpuDescription& cpu, Isa isa) {
  Tuning t;
  t.key_block = std::min<Index>(256 << 10, Index(cpu.l2 / 4));
  return detail::pack_with_avx2(t, isa);
}

/// The tuning of `cpu` on `isa`: its table row, or the cache model where no row covers it.
BD_COLD inline Tuning tuning_for(const CpuDescription& cpu, Isa isa) {
  const Tuning model = model_tuning(cpu, isa);
  for (const auto& row : detail::tuning_rows)
    if (row.vendor == cpu.vendor && row.family == cpu.family && cpu.model >= row.model_first && cpu.model <= row.model_last)
      return row.tune(model, isa);
  return model;
}

/// One CPU and instruction set: what its kernels can do and how they are tuned.
struct Context {
  CpuDescription cpu;
  Isa isa = Isa::Portable;
  Tuning tuning;

  /// Tiles that read B in place, its rows or its columns a stride apart (flash attention's keys
  /// and values): the SIMD kernels' (the portable tile computes whole tiles, reading B past an edge).
  bool strided_tiles() const { return isa != Isa::Portable; }
  /// vdpbf16ps: the AVX-512 kernel on a CPU with AVX512-BF16.
  bool bf16_dot() const { return isa == Isa::AVX512 && cpu.avx512_bf16; }

  bool keys_in_place() const { return strided_tiles() && tuning.keys_in_place; }
  bool values_in_place() const { return keys_in_place() && tuning.values_in_place; }
  Bf16Method bf16_method() const { return bf16_dot() && tuning.bf16 == Bf16Method::Dot ? Bf16Method::Dot : Bf16Method::Fma; }

  /// A depth pass for a product whose deepest segment has `depth` channels (0: unknown), on a
  /// kernel of nr columns of `bytes`-byte values: the deepest B micro-panel (depth × nr) that
  /// fills at most two thirds of L1 — the rest for the A micro-panel streaming through and the
  /// output tile — within [kc_min, kc_max]; a product no deeper than a panel filling three
  /// quarters of L1 (and kc_max) in one pass, saving the second pass's store and reload.
  Index depth_block(Index nr, std::size_t bytes, Index depth = 0) const {
    const Index panel = nr * Index(bytes), l1 = Index(cpu.l1d);
    const Index streamed = std::clamp<Index>(l1 * 2 / 3 / panel / 8 * 8, tuning.kc_min, tuning.kc_max);
    const Index whole = std::min<Index>(l1 * 3 / 4 / panel, tuning.kc_max);
    return depth > streamed && depth <= whole ? depth : streamed;
  }
  /// Rows of a packed A block for passes of kc channels: the most whole micro-tiles (mr rows)
  /// whose block fills at most half of L2 (where BLIS's configurations put theirs, 29–67 %: the
  /// rest for B's panels streaming past and the next block), at most tuning.mc.
  Index row_block(Index mr, Index kc, std::size_t bytes) const {
    const Index fit = Index(cpu.l2 / 2) / (std::max<Index>(1, kc) * Index(bytes)) / mr * mr;
    return std::clamp<Index>(fit, mr, std::max<Index>(mr, tuning.mc));
  }
  /// Flash attention's keys per block: a block's keys and values (depth + d_v values a key)
  /// within key_block bytes and a quarter of L2, whole panels of every kernel (12, 6 and 4 keys),
  /// at most max_key_block.
  static constexpr Index max_key_block = 384;
  Index key_block(Index depth, Index d_v, std::size_t bytes) const {
    const long budget = std::min<long>(long(tuning.key_block), cpu.l2 / 4);
    const Index fit = Index(budget / long(bytes)) / std::max<Index>(1, depth + d_v);
    return std::clamp<Index>(fit / 12 * 12, 12, max_key_block);
  }
  /// Flash attention's query rows per task: their packed queries and output accumulators
  /// (depth + d_v values a row) within half of L2, whole mr-row panels, 64 to 256 rows. A task
  /// packs each key block once for all its rows, so the packing's share falls as 1 / rows.
  Index query_block(Index mr, Index depth, Index d_v, std::size_t bytes) const {
    const Index fit = Index(cpu.l2 / 2 / long(bytes)) / std::max<Index>(1, depth + d_v);
    const auto up = [mr](Index n) { return (n + mr - 1) / mr * mr; };
    return std::clamp<Index>(fit / mr * mr, up(64), up(256));
  }

  /// "AMD family 26 model 2 (L1d 48 KiB, L2 1024 KiB), avx512, tuning zen5".
  std::string describe() const {
    return cpu.describe() + ", " + to_string(isa) + ", tuning " + tuning.row;
  }
};

/// The context of `cpu` on `isa`, with `override_spec` (BD_TUNING's syntax; may be empty)
/// applied over its tuning. Pure: the tests give it other CPUs' descriptions.
BD_COLD inline Context make_context(const CpuDescription& cpu, Isa isa, std::string_view override_spec = {},
                            const char* source = "BD_TUNING") {
  Context c;
  c.cpu = cpu, c.isa = isa;
  c.tuning = parse_tuning(override_spec, tuning_for(cpu, isa), source);
  return c;
}

namespace detail {
/// The process's contexts, one per instruction set, BD_TUNING applied, each built on first use.
struct Contexts {
  std::mutex mutex;
  std::array<std::atomic<const Context*>, 3> built{};
  std::array<Context, 3> storage;
  static Contexts& instance() {
    static Contexts c;
    return c;
  }
  const Context& get(Isa isa) {
    const auto i = static_cast<std::size_t>(isa);
    if (const Context* c = built[i].load(std::memory_order_acquire)) return *c;
    return build(i);
  }
  BD_COLD const Context& build(std::size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!built[i].load(std::memory_order_relaxed)) {
      const char* spec = std::getenv("BD_TUNING");
      storage[i] = make_context(this_cpu(), static_cast<Isa>(i), spec ? spec : "");
      built[i].store(&storage[i], std::memory_order_release);
    }
    return storage[i];
  }
};
}  // namespace detail

/// The context every kernel call uses now: this CPU, active_isa(), its tuning (BD_TUNING applied).
inline const Context& active_context() { return detail::Contexts::instance().get(active_isa()); }

/// Makes every later kernel call on `isa` use `tuning` (the tune command, tests). Not meant to be
/// called while another thread runs a kernel.
inline void use_tuning(Isa isa, const Tuning& tuning) {
  auto& all = detail::Contexts::instance();
  all.get(isa);
  std::lock_guard<std::mutex> lock(all.mutex);
  all.storage[static_cast<std::size_t>(isa)].tuning = tuning;
}

}  // namespace bd::kernel
