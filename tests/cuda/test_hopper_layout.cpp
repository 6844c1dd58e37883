// The Hopper kernel's index arithmetic (bd/cuda/hopper_layout.cuh), checked on the host with no GPU:
// the whole persistent launch is emulated — every CTA, its producer and both consumer warpgroups
// as agents run in a random interleaving, the mbarriers with their phases, arrival counts and
// transaction bytes, TMA loads that land late, multicast into both CTAs of a cluster — through the
// same functions the kernel calls. The hardware is modelled here from the PTX ISA and the CUDA
// driver's tensor-map documentation, independently of the kernel's code:
//   - TMA, 128-byte swizzle: box element (r, c) of 16-bit values lands at r·128 + 16·((c/8) XOR (r mod 8)) + 2·(c mod 8)
//     from a 1024-byte aligned destination; elements past the tensor read as zero; stores are clipped;
//   - wgmma's descriptor: start address, stride byte offset, swizzle mode decoded from their bits;
//     K-major operand element (m, k) at start + (m/8)·SBO + (m mod 8)·128 + 2k, then the swizzle
//     applied to the address (bits 4–6 XOR bits 7–9);
//   - the m64nNk16 accumulator fragment: register i of lane l in warp w is row 16w + l/4 + 8·((i/2) mod 2),
//     column 8·(i/4) + 2·(l mod 4) + (i mod 2);
//   - mbarrier.try_wait.parity(P) succeeds once the barrier's current phase parity differs from P.
// Values are small integers, so K' must equal X[:, window] + X[:, rest]·C exactly, every output
// written once. Injected errors in each map (the descriptor's stride, the k-step, the window's
// box, the epilogue's swizzle, the rest map, the multicast offset, a barrier's count or parity,
// the direct stores' order or shuffle partner) each fail it. Both epilogues (staged through shared
// memory for TMA stores, and direct from registers) are emulated.
#include <catch2/catch.hpp>

#include <bd/cuda/hopper_layout.cuh>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace bd::cuda::hopper;

enum class Fault {
  none,
  descriptor_stride,  // SBO of 512 bytes instead of a swizzle atom
  k_step,             // the k-step moves the descriptor 16 bytes instead of 32
  window_box,         // every window value read from the first box of its window stage
  epilogue_swizzle,   // outputs staged without the swizzle
  rest_map,           // rest blocks taken as if the window were at 0
  multicast_offset,   // both CTAs' Cᵀ halves land at the start of the stage
  empty_count,        // a stage released after one consumer instead of all
  producer_parity,    // the producer waits on the empty barrier's current phase
  direct_order,       // direct stores: every lane puts its kept pair first
  direct_partner,     // direct stores: pairs traded with lane ^ 2 instead of lane ^ 1
};

/// The test's own model of the 128-byte swizzle of a TMA box (from the tensor-map documentation).
std::uint32_t box_element(int r, int c) { return std::uint32_t(r * 128 + 16 * ((c / 8) ^ (r % 8)) + 2 * (c % 8)); }

struct Barrier {
  int expected = 0, pending = 0, completed = 0;
  long long tx = 0;
  void init(int count) { expected = pending = count; }
  void complete_if_done() {
    if (pending == 0 && tx == 0) ++completed, pending = expected;
  }
  void arrive() {
    --pending;
    complete_if_done();
  }
  void expect_tx(long long bytes) { tx += bytes; }
  void complete_tx(long long bytes) {
    tx -= bytes;
    complete_if_done();
  }
  bool try_wait(unsigned parity) const { return unsigned(completed & 1) != parity; }
};

struct Cta {
  std::vector<double> smem;  // one value per 16-bit element of the aligned shared memory
  Barrier full[kMaxStages], empty[kMaxStages];
};

/// A TMA load in flight: lands after `delay` more ticks.
struct Copy {
  int delay;
  int cta;
  std::uint32_t dst;
  const std::vector<double>* src;
  long long rows, cols;
  int row0, col0, box_rows;
  int stage;  // whose full barrier it completes
};

struct Shape {
  int rows, input_dim, head_dim, heads, offset, cluster, ctas, stages = 3;
  Store store = Store::staged;
  std::string text() const {
    return "L=" + std::to_string(rows) + " d=" + std::to_string(input_dim) + " d_h=" + std::to_string(head_dim) +
           " n=" + std::to_string(heads) + " o=" + std::to_string(offset) + " cluster=" + std::to_string(cluster) +
           " CTAs=" + std::to_string(ctas) + " stages=" + std::to_string(stages) +
           (store == Store::direct ? " direct stores" : " staged stores");
  }
};

struct Result {
  bool deadlock = false;
  std::size_t wrong_value = 0, wrong_count = 0;
  bool ok() const { return !deadlock && wrong_value == 0 && wrong_count == 0; }
};

Result emulate(const Shape& shape, Fault fault, unsigned seed) {
  const int L = shape.rows, d = shape.input_dim, dh = shape.head_dim, N = shape.heads * dh, K = d - dh;
  const Problem p{L, d, dh, N, shape.offset, shape.cluster};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<double> x(std::size_t(L) * d), c(std::size_t(K) * N), ct(std::size_t(N) * K);
  for (auto& v : x) v = small(rng);
  for (auto& v : c) v = small(rng);
  for (int k = 0; k < K; ++k)
    for (int n = 0; n < N; ++n) ct[std::size_t(n) * K + k] = c[std::size_t(k) * N + n];
  std::vector<double> out(std::size_t(L) * N, 0.0);
  std::vector<int> writes(out.size(), 0);

  const int stages = shape.stages, slots = epilogue_slots(stages);
  const int smem_elements = (stages * kStageBytes + epilogue_bytes(stages, shape.store)) / 2;
  std::vector<Cta> ctas(shape.ctas);
  for (Cta& cta : ctas) {
    cta.smem.assign(smem_elements, 1e9);  // poison: an element no TMA wrote
    for (int s = 0; s < stages; ++s) {
      cta.full[s].init(1);
      cta.empty[s].init(fault == Fault::empty_count ? 4 : kConsumers * 4 * shape.cluster);
    }
  }
  std::vector<Copy> in_flight;
  const auto land = [&](const Copy& cp) {
    REQUIRE(cp.dst % kSwizzleAtom == 0);
    Cta& cta = ctas[cp.cta];
    for (int r = 0; r < cp.box_rows; ++r)
      for (int col = 0; col < kBlockK; ++col) {
        const long long gr = cp.row0 + r, gc = cp.col0 + col;
        const double v = gr < cp.rows && gc < cp.cols ? (*cp.src)[std::size_t(gr * cp.cols + gc)] : 0.0;
        cta.smem[(cp.dst + box_element(r, col)) / 2] = v;
      }
    cta.full[cp.stage].complete_tx(std::uint32_t(cp.box_rows) * kRowBytes);
  };

  // ---- The agents: one producer thread and two consumer warpgroups per CTA ----
  const long long units = work_units(p);
  const int steps = stages_per_tile(p);
  struct Producer {
    long long unit;
    int j = 0;
    long long step = 0;
  };
  struct Consumer {
    long long unit;
    int j = 0, previous = -1;
    long long step = 0;
    std::vector<double> acc;  // [warp][lane][register]
  };
  std::vector<Producer> producers;
  std::vector<Consumer> consumers;
  for (int b = 0; b < shape.ctas; ++b) {
    producers.push_back({b / shape.cluster});
    for (int cons = 0; cons < kConsumers; ++cons)
      consumers.push_back({b / shape.cluster, 0, -1, 0, std::vector<double>(4 * 32 * kAccumulators, 0.0)});
  }
  const long long stride = shape.ctas / shape.cluster;
  std::uniform_int_distribution<int> delay(0, 3);

  const auto produce = [&](int b) -> bool {
    Producer& pr = producers[b];
    if (pr.unit >= units) return false;
    const int rank = b % shape.cluster, s = stage_of(pr.step, stages);
    Cta& cta = ctas[b];
    const unsigned parity = fault == Fault::producer_parity ? phase_parity(pr.step, stages) : phase_parity(pr.step, stages) ^ 1u;
    if (!cta.empty[s].try_wait(parity)) return false;
    const Tile tile = tile_of(p, pr.unit, rank);
    cta.full[s].expect_tx(expected_bytes(p, pr.j));
    cta.full[s].arrive();
    Coords xc = x_coords(p, tile, pr.j);
    if (fault == Fault::rest_map && !is_window_step(p, pr.j)) xc.col = (pr.j - window_steps(p)) * kBlockK + dh;
    if (is_window_step(p, pr.j)) {
      for (int box = 0; box < window_boxes(p, pr.j); ++box) {
        const Coords wc = window_coords(p, tile, pr.j, box);
        in_flight.push_back({delay(rng), b, std::uint32_t(s * kStageBytes + box * kAStageBytes), &x, L, d, wc.row, wc.col, kBlockM, s});
      }
    } else {
      in_flight.push_back({delay(rng), b, std::uint32_t(s * kStageBytes), &x, L, d, xc.row, xc.col, kBlockM, s});
      const Coords cc = c_coords(p, tile, pr.j, rank);
      const std::uint32_t to = std::uint32_t(s * kStageBytes + kAStageBytes) +
                               (fault == Fault::multicast_offset ? 0u : c_box_offset(rank, shape.cluster));
      for (int peer = 0; peer < shape.cluster; ++peer)  // multicast: the same offset in every CTA of the cluster
        in_flight.push_back({delay(rng), b - rank + peer, to, &ct, N, K, cc.row, cc.col, c_box_rows(shape.cluster), s});
    }
    ++pr.step;
    if (++pr.j == steps) pr.j = 0, pr.unit += stride;
    return true;
  };

  // wgmma, modelled: decode the descriptors, gather A (64 × 16) and B (256 × 16), D += A·Bᵀ into
  // the fragment registers.
  const auto operand = [&](const Cta& cta, std::uint64_t desc, int rows, std::vector<double>& m) {
    const std::uint32_t start = std::uint32_t(desc & 0x3FFF) << 4;
    const std::uint32_t sbo = std::uint32_t((desc >> 32) & 0x3FFF) << 4;
    REQUIRE(((desc >> 49) & 7) == 0);  // base offset: atoms are aligned
    REQUIRE((desc >> 62) == 1);        // 128-byte swizzle
    m.assign(std::size_t(rows) * kWgmmaK, 0.0);
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < kWgmmaK; ++k) {
        std::uint32_t addr = start + std::uint32_t(r / 8) * sbo + std::uint32_t(r % 8) * 128 + 2 * k;
        addr ^= ((addr >> 7) & 7u) << 4;
        m[std::size_t(r) * kWgmmaK + k] = cta.smem[addr / 2];
      }
  };
  const auto frag_row = [](int warp, int lane, int i) { return 16 * warp + lane / 4 + 8 * ((i / 2) % 2); };
  const auto frag_col = [](int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + (i % 2); };

  const auto release = [&](int b, int s) {
    const int rank = b % shape.cluster;
    for (int warp = 0; warp < 4; ++warp)
      for (int target = 0; target < shape.cluster; ++target) ctas[b - rank + target].empty[s].arrive();
  };

  std::vector<double> A, B;
  const auto consume = [&](int b, int cons) -> bool {
    Consumer& cs = consumers[std::size_t(b) * kConsumers + cons];
    if (cs.unit >= units) return false;
    const int rank = b % shape.cluster, s = stage_of(cs.step, stages);
    Cta& cta = ctas[b];
    if (!cta.full[s].try_wait(phase_parity(cs.step, stages))) return false;
    const Tile tile = tile_of(p, cs.unit, rank);
    const std::uint32_t stage = std::uint32_t(s * kStageBytes);
    if (is_window_step(p, cs.j)) {
      const int w = cs.j;
      for (int warp = 0; warp < 4; ++warp)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < dh / 2; i += 2) {
            if (window_step_of_register(i, dh) != w) continue;
            std::uint32_t at = stage + window_pair_offset(cons, warp, lane, i, dh);
            if (fault == Fault::window_box) at %= std::uint32_t(kAStageBytes);
            if (at % 4 != 0) FAIL("a window pair misaligned");
            for (int h = 0; h < kBlockN / dh; ++h)
              for (int e = 0; e < 2; ++e) cs.acc[(warp * 32 + lane) * kAccumulators + head_register(i, h, dh) + e] = cta.smem[at / 2 + e];
          }
      release(b, s);
    } else {
      for (int ks = 0; ks < kKSteps; ++ks) {
        std::uint64_t da = a_descriptor(stage, cons, fault == Fault::k_step ? 0 : ks);
        if (fault == Fault::k_step) da += std::uint64_t(ks);  // 16 bytes per k-step (the start address field is in 16-byte units)
        std::uint64_t db = b_descriptor(stage + kAStageBytes, ks);
        if (fault == Fault::descriptor_stride) da = (da & ~(std::uint64_t(0x3FFF) << 32)) | (std::uint64_t(512 >> 4) << 32);
        operand(cta, da, kWgmmaM, A);
        operand(cta, db, kBlockN, B);
        for (int warp = 0; warp < 4; ++warp)
          for (int lane = 0; lane < 32; ++lane)
            for (int i = 0; i < kAccumulators; ++i) {
              const int m = frag_row(warp, lane, i), n = frag_col(lane, i);
              double sum = 0;
              for (int k = 0; k < kWgmmaK; ++k) sum += A[std::size_t(m) * kWgmmaK + k] * B[std::size_t(n) * kWgmmaK + k];
              cs.acc[(warp * 32 + lane) * kAccumulators + i] += sum;
            }
      }
      if (cs.previous >= 0) release(b, cs.previous);  // after wgmma.wait_group 1
      cs.previous = s;
    }
    ++cs.step;
    if (++cs.j < steps) return true;
    // End of the tile: release the last stage, stage the outputs, store them.
    if (cs.previous >= 0) release(b, cs.previous);
    cs.previous = -1;
    if (shape.store == Store::direct) {
      // Registers straight to K': each lane packs the pairs of both chunks of a block, keeps the one
      // of its parity and sends the other through the shuffle (the warp's 32 sends, then each lane
      // reads its partner's), then stores 4 values at direct_col.
      for (int warp = 0; warp < 4; ++warp)
        for (int block = 0; block < kDirectBlocks; ++block)
          for (int half = 0; half < 2; ++half) {
            double sent[32][2];
            for (int lane = 0; lane < 32; ++lane)
              for (int e = 0; e < 2; ++e)
                sent[lane][e] = cs.acc[(warp * 32 + lane) * kAccumulators + direct_register(block, half, 1 - direct_kept_parity(lane)) + e];
            for (int lane = 0; lane < 32; ++lane) {
              const int partner = lane ^ (fault == Fault::direct_partner ? 2 : 1);
              const int kept = direct_register(block, half, direct_kept_parity(lane));
              double four[4];
              const bool kept_first = fault == Fault::direct_order || direct_kept_first(lane);
              for (int e = 0; e < 2; ++e) {
                four[(kept_first ? 0 : 2) + e] = cs.acc[(warp * 32 + lane) * kAccumulators + kept + e];
                four[(kept_first ? 2 : 0) + e] = sent[partner][e];
              }
              // The register's fragment row; the 4 columns must start on 8 bytes.
              const long long gr = tile.m_block * kBlockM + cons * kWgmmaM + frag_row(warp, lane, kept);
              const int col = direct_col(lane, block);
              if (col % 4 != 0 || col + 4 > kBlockN) FAIL("a direct store misaligned or past the tile");
              for (int e = 0; e < 4; ++e) {
                const long long gc = (long long)tile.n_block * kBlockN + col + e;
                if (gr >= L || tile.n_block * kBlockN + 16 * block >= N) continue;  // the kernel's predicate
                out[std::size_t(gr * N + gc)] = four[e];
                ++writes[std::size_t(gr * N + gc)];
              }
            }
          }
      cs.j = 0;
      cs.unit += stride;
      return true;
    }
    // The kernel's rounds: each stages `slots` slabs, then stores them (the next round may reuse
    // the slots only after the stores have read them: here, at once).
    for (int round = 0; round < kSlabs / slots; ++round) {
      std::vector<double> staging(epilogue_bytes(stages) / 2, 1e9);
      for (int warp = 0; warp < 4; ++warp)
        for (int lane = 0; lane < 32; ++lane)
          for (int i = 0; i < kAccumulators; i += 2) {
            if (slab_of_register(i) / slots != round) continue;
            std::uint32_t at = epilogue_pair_offset(cons, warp, lane, i, slots);
            if (fault == Fault::epilogue_swizzle)
              at = slot_offset(cons, slab_of(frag_col(lane, i)), slots) + frag_row(warp, lane, i) * 128 + (frag_col(lane, i) % kSlabCols) * 2;
            if (slab_of_register(i) != slab_of(frag_col(lane, i)) || at % 4 != 0 || at >= std::uint32_t(epilogue_bytes(stages)))
              FAIL("a register's pair staged in the wrong slab, misaligned or outside the staging area");
            for (int e = 0; e < 2; ++e) staging[at / 2 + e] = cs.acc[(warp * 32 + lane) * kAccumulators + i + e];
          }
      for (int slab = round * slots; slab < (round + 1) * slots; ++slab) {
        const Coords at = store_coords(tile, cons, slab);
        const std::uint32_t base = slot_offset(cons, slab, slots);
        REQUIRE(base % kSwizzleAtom == 0);
        for (int r = 0; r < kWgmmaM; ++r)
          for (int col = 0; col < kSlabCols; ++col) {
            const long long gr = at.row + r, gc = at.col + col;
            if (gr >= L || gc >= N) continue;  // clipped
            out[std::size_t(gr * N + gc)] = staging[(base + box_element(r, col)) / 2];
            ++writes[std::size_t(gr * N + gc)];
          }
      }
    }
    cs.j = 0;
    cs.unit += stride;
    return true;
  };

  // ---- Run the agents in a random interleaving until all are done ----
  Result result;
  std::vector<int> order;
  for (int a = 0; a < shape.ctas * (1 + kConsumers); ++a) order.push_back(a);
  for (;;) {
    bool progressed = false, busy = false;
    std::shuffle(order.begin(), order.end(), rng);
    for (int a : order) {
      const int b = a / (1 + kConsumers), role = a % (1 + kConsumers);
      if (role == 0) {
        busy |= producers[b].unit < units;
        progressed |= produce(b);
      } else {
        busy |= consumers[std::size_t(b) * kConsumers + role - 1].unit < units;
        progressed |= consume(b, role - 1);
      }
    }
    // Copies land late: the consumers must wait on the bytes, not on the issue.
    for (std::size_t i = 0; i < in_flight.size();) {
      if (in_flight[i].delay-- <= 0) {
        land(in_flight[i]);
        in_flight.erase(in_flight.begin() + long(i));
        progressed = true;
      } else {
        ++i;
        progressed = true;  // time passes
      }
    }
    if (!busy && in_flight.empty()) break;
    if (!progressed) {
      result.deadlock = true;
      return result;
    }
  }

  for (int r = 0; r < L; ++r)
    for (int col = 0; col < N; ++col) {
      double ref = x[std::size_t(r) * d + shape.offset + col % dh];
      for (int k = 0; k < K; ++k) {
        const int channel = k < shape.offset ? k : k + dh;
        ref += x[std::size_t(r) * d + channel] * c[std::size_t(k) * N + col];
      }
      result.wrong_count += writes[std::size_t(r) * N + col] != 1;
      result.wrong_value += out[std::size_t(r) * N + col] != ref;
    }
  return result;
}

void check_exact_one(const Shape& shape, unsigned seed) {
  INFO(shape.text());
  const Result r = emulate(shape, Fault::none, seed);
  CHECK_FALSE(r.deadlock);
  CHECK(r.wrong_count == 0);  // every output written exactly once
  CHECK(r.wrong_value == 0);  // and equal to X[:, window] + X[:, rest]·C exactly (integer data)
}

void check_exact(Shape shape, unsigned seed) {
  for (Store store : {Store::staged, Store::direct}) {
    shape.store = store;
    check_exact_one(shape, seed);
  }
}

}  // namespace

TEST_CASE("hopper: the fragment, window and epilogue maps agree with the PTX ISA's tables", "[cuda-layout]") {
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < kAccumulators; ++i) {
        CHECK(accumulator_row(warp, lane, i) == 16 * warp + lane / 4 + 8 * ((i / 2) % 2));
        CHECK(accumulator_col(lane, i) == 8 * (i / 4) + 2 * (lane % 4) + i % 2);
        for (int dh : {64, 128, 256}) {
          // The lane-free window stage of a register is the one its column needs.
          CHECK(window_step_of_register(i, dh) == window_step(accumulator_col(lane, i), dh));
          if (i < dh / 2)
            for (int h = 0; h < kBlockN / dh; ++h) {
              const int j = head_register(i, h, dh);
              CHECK(accumulator_row(warp, lane, j) == accumulator_row(warp, lane, i));
              CHECK(accumulator_col(lane, j) == accumulator_col(lane, i) + h * dh);
            }
        }
      }
  // Each warp's 32 window loads and 32 epilogue stores of one register pair touch 32 distinct banks.
  for (int i = 0; i < kAccumulators; i += 2)
    for (int warp = 0; warp < 4; ++warp) {
      std::vector<int> load_banks, store_banks;
      for (int lane = 0; lane < 32; ++lane) {
        load_banks.push_back(int(window_pair_offset(1, warp, lane, i % 64, 128) / 4 % 32));
        store_banks.push_back(int(epilogue_pair_offset(1, warp, lane, i, 2) / 4 % 32));
      }
      std::sort(load_banks.begin(), load_banks.end());
      std::sort(store_banks.begin(), store_banks.end());
      CHECK(std::unique(load_banks.begin(), load_banks.end()) == load_banks.end());
      CHECK(std::unique(store_banks.begin(), store_banks.end()) == store_banks.end());
    }
  CHECK(swizzle128(0) == 0);
  CHECK(swizzle128(128 + 16) == 128);       // row 1, chunk 1 → chunk 0
  CHECK(swizzle128(7 * 128) == 7 * 128 + 112);
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 64; ++col) CHECK(swizzled_element(r, col) == box_element(r, col));
}

TEST_CASE("hopper: the descriptor's fields and the rest map", "[cuda-layout]") {
  const std::uint64_t desc = smem_descriptor(0x12400);
  CHECK((desc & 0x3FFF) == (0x12400 >> 4));
  CHECK(((desc >> 16) & 0x3FFF) == 1);
  CHECK(((desc >> 32) & 0x3FFF) == 1024 / 16);
  CHECK(((desc >> 49) & 7) == 0);
  CHECK((desc >> 62) == 1);
  CHECK((a_descriptor(0x2000, 1, 3) & 0x3FFF) == (0x2000 + 64 * 128 + 3 * 32) >> 4);
  CHECK((b_descriptor(0x6000, 2) & 0x3FFF) == (0x6000 + 2 * 32) >> 4);
  // rest(k) skips the window's d_h channels: DeepSeek's middle window at 256, both of its boxes in
  // one window stage.
  const Problem p{100, 512, 128, 384, 256, 1};
  CHECK(window_steps(p) == 1);
  CHECK(window_boxes(p, 0) == 2);
  CHECK(window_column(p, 0, 0) == 256);
  CHECK(window_column(p, 0, 1) == 320);
  std::vector<int> columns;
  for (int j = window_steps(p); j < stages_per_tile(p); ++j) columns.push_back(x_column(p, j));
  CHECK(columns == std::vector<int>{0, 64, 128, 192, 384, 448});
  CHECK(expected_bytes(p, 0) == unsigned(2 * kAStageBytes));
  CHECK(expected_bytes(p, 1) == unsigned(kStageBytes));
  // d_h = 64: one box; d_h = 256: two stages of two boxes.
  const Problem small{100, 256, 64, 128, 0, 1}, large{100, 512, 256, 256, 0, 1};
  CHECK((window_steps(small) == 1 && window_boxes(small, 0) == 1 && expected_bytes(small, 0) == unsigned(kAStageBytes)));
  CHECK((window_steps(large) == 2 && window_boxes(large, 1) == 2 && window_column(large, 1, 1) == 192));
  CHECK(supported_shape(512, 128, 256));
  CHECK_FALSE(supported_shape(512, 128, 96));   // not a multiple of 64
  CHECK_FALSE(supported_shape(512, 96, 0));     // d_h not 64, 128 or 256
  CHECK_FALSE(supported_shape(128, 128, 0));    // no rest
  CHECK_FALSE(supported_shape(512, 128, 448));  // the window past the end
}

TEST_CASE("hopper: the emulated launch computes K' exactly for every window of DeepSeek's d = 512, d_h = 128", "[cuda-layout]") {
  // 3 row blocks (the last partial; with a cluster of 2 or 4 the last cluster's trailing tiles lie
  // past L), 2 column blocks (the second half empty): the CTAs loop over several units each.
  for (int stages : {3, 4})
    for (int cluster : {1, 2, 4})
      for (int o = 0; o <= 384; o += 64)
        check_exact({300, 512, 128, 3, o, cluster, 2 * cluster, stages}, unsigned(o + cluster + 10 * stages));
}

TEST_CASE("hopper: d_h = 64 and 256, heads that do not fill a tile, one CTA", "[cuda-layout]") {
  for (int stages : {3, 4})
    for (int cluster : {1, 2, 4}) {
      for (int o : {0, 128, 256}) check_exact({130, 320, 64, 5, o, cluster, 3 * cluster, stages}, unsigned(o + 7));
      for (int o : {0, 64, 128}) check_exact({129, 384, 256, 2, o, cluster, cluster, stages}, unsigned(o + 11));
      check_exact({1, 128, 64, 1, 64, cluster, cluster, stages}, 5u);  // one row, one head, the window last
    }
}

TEST_CASE("hopper: every injected index or synchronisation error fails the emulation", "[cuda-layout]") {
  for (int stages : {3, 4})
    for (Fault fault : {Fault::descriptor_stride, Fault::k_step, Fault::window_box, Fault::epilogue_swizzle, Fault::rest_map,
                        Fault::multicast_offset, Fault::empty_count, Fault::producer_parity, Fault::direct_order,
                        Fault::direct_partner}) {
      const Store store = fault == Fault::direct_order || fault == Fault::direct_partner ? Store::direct : Store::staged;
      INFO("fault " << int(fault) << ", " << stages << " stages");
      bool caught = false;
      // A synchronisation error shows only in some interleavings: several seeds.
      for (unsigned seed = 0; seed < 8 && !caught; ++seed)
        caught = !emulate({200, 512, 128, 3, 256, 2, 4, stages, store}, fault, seed).ok();
      CHECK(caught);
    }
  CHECK(emulate({200, 512, 128, 3, 256, 2, 4, 4}, Fault::none, 1).ok());
  CHECK(emulate({200, 512, 128, 3, 256, 2, 4, 4, Store::direct}, Fault::none, 1).ok());
}

TEST_CASE("hopper: a warp's direct stores write whole 32-byte sectors, each tile column once per row", "[cuda-layout]") {
  for (int block = 0; block < kDirectBlocks; ++block) {
    std::vector<int> columns;
    for (int lane = 0; lane < 4; ++lane)  // one row's quad
      for (int e = 0; e < 4; ++e) columns.push_back(direct_col(lane, block) + e);
    std::sort(columns.begin(), columns.end());
    for (int e = 0; e < 16; ++e) CHECK(columns[std::size_t(e)] == 16 * block + e);  // 32 contiguous bytes from a 32-byte boundary
  }
  // The kept pair's columns are the lane's own fragment columns; the received ones are the partner's.
  for (int lane = 0; lane < 32; ++lane)
    for (int block = 0; block < kDirectBlocks; ++block) {
      const int kept = direct_register(block, 0, direct_kept_parity(lane));
      const int sent_by_partner = direct_register(block, 0, 1 - direct_kept_parity(lane ^ 1));
      const int first = direct_kept_first(lane) ? accumulator_col(lane, kept) : accumulator_col(lane ^ 1, sent_by_partner);
      CHECK(first == direct_col(lane, block));
      CHECK(accumulator_col(direct_kept_first(lane) ? lane ^ 1 : lane, direct_kept_first(lane) ? sent_by_partner : kept) == first + 2);
    }
}
