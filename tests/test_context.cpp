// The per-CPU context (kernel/context.hpp) is a pure function of the CPU's description: each CPU
// family bd was measured on gets its table row, any other CPU the cache model, and BD_TUNING's
// syntax its values on top (a malformed one refused by name). Tuning moves time, never a bit:
// the GEMM, the few-row products and flash attention give the same outputs under every row and
// under tunings far from any row (tiny blocks, no prefetch, keys packed or read in place) —
// attention's key block, which sets where its softmax rescales, held fixed.
#include <bd/kernel/context.hpp>
#include <bd/kernel/flash_attention.hpp>
#include <bd/kernel/gemm.hpp>

#include <numeric>

#include "support.hpp"

using bd::kernel::Bf16Method;
using bd::kernel::Context;
using bd::kernel::CpuDescription;
using bd::kernel::Isa;
using bd::kernel::Tuning;
using bd::kernel::Vendor;
using Catch::Contains;
using Eigen::Index;

namespace {

CpuDescription cpu(Vendor vendor, int family, int model, long l1d_kib, long l2_kib, bool bf16 = false) {
  CpuDescription c;
  c.vendor = vendor, c.family = family, c.model = model;
  c.l1d = l1d_kib << 10, c.l2 = l2_kib << 10;
  c.avx512_bf16 = bf16;
  return c;
}

const CpuDescription zen3 = cpu(Vendor::AMD, 25, 1, 32, 512);
const CpuDescription zen4 = cpu(Vendor::AMD, 25, 0x11, 32, 1024, true);
const CpuDescription zen5 = cpu(Vendor::AMD, 26, 2, 48, 1024, true);
const CpuDescription sapphire_rapids = cpu(Vendor::Intel, 6, 0x8F, 48, 2048, true);
const CpuDescription skylake_x = cpu(Vendor::Intel, 6, 0x55, 32, 1024);

/// Restores the active instruction set's tuning when a test ends.
struct RestoreTuning {
  Isa isa = bd::kernel::active_isa();
  Tuning before = bd::kernel::active_context().tuning;
  ~RestoreTuning() { bd::kernel::use_tuning(isa, before); }
};

}  // namespace

TEST_CASE("context: each CPU family bd was measured on gets its table row", "[kernel][context]") {
  CHECK(std::string(bd::kernel::make_context(zen3, Isa::AVX2).tuning.row) == "zen3");
  CHECK(std::string(bd::kernel::make_context(cpu(Vendor::AMD, 25, 0x21, 32, 512), Isa::AVX2).tuning.row) == "zen3");
  CHECK(std::string(bd::kernel::make_context(zen4, Isa::AVX512).tuning.row) == "zen4");
  CHECK(std::string(bd::kernel::make_context(cpu(Vendor::AMD, 25, 0x61, 32, 1024), Isa::AVX512).tuning.row) == "zen4");
  CHECK(std::string(bd::kernel::make_context(zen5, Isa::AVX512).tuning.row) == "zen5");
  CHECK(std::string(bd::kernel::make_context(sapphire_rapids, Isa::AVX512).tuning.row) == "sapphire-rapids");
  // A Zen 3 (512 KiB of L2): a float A block of 512 channels takes 128 rows (half of L2), flash
  // attention's keys and values a quarter of L2, and AVX2 packs its keys and values.
  const Context z3 = bd::kernel::make_context(zen3, Isa::AVX2);
  CHECK(z3.row_block(16, 512, sizeof(float)) == 128);
  CHECK(z3.depth_block(6, sizeof(float)) == 512);
  CHECK(z3.tuning.key_block == 128 << 10);
  CHECK(z3.key_block(576, 512, sizeof(float)) == 24);
  CHECK_FALSE(z3.keys_in_place());
  CHECK_FALSE(z3.bf16_dot());
  CHECK(z3.bf16_method() == Bf16Method::Fma);
  // Zen 4 and 5 with AVX-512: keys and absorbed MLA's values in place, bf16 by vdpbf16ps; AVX2
  // forced there packs, and computes bf16 by FMAs on rounded operands.
  for (const CpuDescription& c : {zen4, zen5}) {
    const Context wide = bd::kernel::make_context(c, Isa::AVX512);
    CHECK(wide.keys_in_place());
    CHECK(wide.values_in_place());
    CHECK(wide.bf16_method() == Bf16Method::Dot);
    CHECK(wide.row_block(32, 512, sizeof(float)) == 144);
    const Context narrow = bd::kernel::make_context(c, Isa::AVX2);
    CHECK_FALSE(narrow.keys_in_place());
    CHECK(narrow.bf16_method() == Bf16Method::Fma);
  }
  // Zen 5's 48 KiB L1 holds a float B micro-panel of 512 channels (AVX-512: 12 columns) in one
  // pass for a product of depth 512; Zen 4's 32 KiB streams it in passes of at most 448.
  CHECK(bd::kernel::make_context(zen5, Isa::AVX512).depth_block(12, sizeof(float), 512) == 512);
  CHECK(bd::kernel::make_context(zen4, Isa::AVX512).depth_block(12, sizeof(float)) == 448);
  // Sapphire Rapids has vdpbf16ps, which Intel issues at half the FMA rate: its row computes
  // bf16 products by FMAs.
  const Context spr = bd::kernel::make_context(sapphire_rapids, Isa::AVX512);
  CHECK(spr.bf16_dot());
  CHECK(spr.bf16_method() == Bf16Method::Fma);
  // The portable tile computes whole tiles: it never reads keys in place, whatever the tuning.
  CHECK_FALSE(bd::kernel::make_context(zen5, Isa::Portable, "keys_in_place=1").keys_in_place());
}

TEST_CASE("context: a CPU no row covers gets the cache model", "[kernel][context]") {
  const Context c = bd::kernel::make_context(skylake_x, Isa::AVX512);
  CHECK(std::string(c.tuning.row) == "model");
  CHECK(c.tuning.key_block == 256 << 10);
  CHECK(c.depth_block(12, sizeof(float)) == 448);  // two thirds of 32 KiB over 12-column panels
  CHECK(c.row_block(32, 448, sizeof(float)) == 144);
  const Context small = bd::kernel::make_context(cpu(Vendor::Other, 0, 0, 32, 256), Isa::AVX2);
  CHECK(std::string(small.tuning.row) == "model");
  CHECK(small.tuning.key_block == 64 << 10);
  CHECK(small.row_block(16, 512, sizeof(float)) == 64);
  CHECK_FALSE(small.keys_in_place());
  // The description names what it read.
  CHECK(zen5.describe() == "AMD family 26 model 2 (L1d 48 KiB, L2 1024 KiB, avx512_bf16)");
  CHECK_THAT(bd::kernel::make_context(zen5, Isa::AVX512).describe(), Contains("avx512, tuning zen5"));
}

TEST_CASE("context: BD_TUNING's values override the row, and a malformed one is refused by name", "[kernel][context]") {
  const Context c = bd::kernel::make_context(zen5, Isa::AVX512, "mc=96,kc_min=256,kc_max=256,nc=1536,bf16=fma,keys_in_place=0");
  CHECK(c.tuning.mc == 96);
  CHECK(c.tuning.kc_min == 256);
  CHECK(c.tuning.nc == 1536);
  CHECK(c.bf16_method() == Bf16Method::Fma);
  CHECK_FALSE(c.keys_in_place());
  CHECK_FALSE(c.values_in_place());
  CHECK(c.depth_block(12, sizeof(float)) == 256);
  CHECK(std::string(c.tuning.row) == "zen5");
  // Every key round-trips through to_string.
  const Tuning back = bd::kernel::parse_tuning(bd::kernel::to_string(c.tuning), Tuning{});
  CHECK(bd::kernel::to_string(back) == bd::kernel::to_string(c.tuning));
  const auto refused = [](const char* spec, const char* why) {
    BD_CHECK_THROWS_CONTAINING(bd::kernel::make_context(zen5, Isa::AVX512, spec), bd::RangeError, Contains(why));
  };
  refused("mc=ninety", "BD_TUNING: 'mc=ninety' is not a whole number");
  refused("mc=0", "'mc=0' is out of range: mc takes 1 to 4096");
  refused("zz=1", "'zz=1' names no tuning key (keys: mc, kc_min");
  refused("mc", "'mc' is not key=value");
  refused("nc=768,=4", "'=4' is not key=value");
  refused("bf16=amx", "'bf16=amx' names no bf16 method: expected fma or dot");
  refused("kc_min=512,kc_max=256", "kc_min = 512 exceeds kc_max = 256");
  refused("mc=-3", "is not a whole number");
}

TEST_CASE("context: no tuning changes a bit of a product or of attention at a fixed key block", "[kernel][context]") {
  RestoreTuning restore;
  // A GEMM with a gathered segment, a basis start, scattered output columns and passes; a few-row
  // product; and attention over keys read in place or packed, several key blocks, a causal
  // diagonal and the values the keys' channels.
  const Index L = 75, K = 300, N = 53;
  std::vector<Index> chan(static_cast<std::size_t>(K)), init(static_cast<std::size_t>(N));
  for (Index k = 0; k < K; ++k) chan[std::size_t(k)] = (k * 7) % (K + 9);
  for (Index c = 0; c < N; ++c) init[std::size_t(c)] = K + 9 + c % 5;
  const Eigen::MatrixXf X = bd_test::gaussian(L, K + 20, 1).cast<float>();
  const Eigen::MatrixXf B = bd_test::gaussian(K, N, 2).cast<float>();
  const auto product = [&](Index rows) {
    Eigen::MatrixXf out = Eigen::MatrixXf::Zero(rows, N);
    bd::kernel::GemmArguments<float, float> a;
    a.rows = rows, a.x = X.data(), a.ldx = X.rows(), a.b = B.data(), a.ldb = B.rows();
    a.out = out.data(), a.ldo = out.rows(), a.init_channels = init.data();
    a.segments.push_back({chan.data(), K, 0, N});
    bd::kernel::gemm(a);
    return out;
  };
  const Index Lq = 70, Lk = 900, d = 64, dv = 48;
  const Eigen::MatrixXf Q = bd_test::gaussian(Lq, d, 3).cast<float>(), Kc = bd_test::gaussian(Lk, d, 4).cast<float>();
  const Eigen::MatrixXf V = bd_test::gaussian(Lk, dv, 5).cast<float>();
  const auto attention = [&](bool latent) {
    Eigen::MatrixXf out(Lq, dv);
    bd::kernel::AttentionArguments<float> a;
    a.q_len = Lq, a.k_len = Lk, a.d_qk = d, a.d_v = dv;
    a.q = Q.data(), a.ldq = Lq, a.k = Kc.data(), a.ldk = Lk;
    a.v = latent ? Kc.data() : V.data(), a.ldv = latent ? Lk : Lk;
    a.out = out.data(), a.ldo = Lq, a.scale = 0.125f, a.causal = true, a.first_query_position = Lk - Lq;
    bd::kernel::flash_attention(a);
    return out;
  };
  bd_test::for_each_isa([&] {
    const Isa isa = bd::kernel::active_isa();
    const Tuning base = bd::kernel::active_context().tuning;
    const Eigen::MatrixXf many = product(L), few = product(3), plain = attention(false), latent = attention(true);
    std::vector<Tuning> tunings;
    for (const CpuDescription& c : {zen3, zen4, zen5, sapphire_rapids, skylake_x}) {
      Tuning t = bd::kernel::tuning_for(c, isa);
      t.key_block = base.key_block;  // the one value that moves attention's bits
      tunings.push_back(t);
    }
    for (const char* spec : {"mc=16,kc_min=16,kc_max=40,nc=24,tile_prefetch=0,stream_prefetch=0,pack_prefetch=0",
                             "mc=4096,kc_min=4096,kc_max=4096,nc=65536,tile_prefetch=4096,pack_prefetch=3,row_walk=0",
                             "keys_in_place=1,values_in_place=1,skinny_group=5,skinny_run=7",
                             "keys_in_place=0,values_in_place=0,skinny_group=512,skinny_run=1"})
      tunings.push_back(bd::kernel::parse_tuning(spec, base));
    for (const Tuning& t : tunings) {
      bd::kernel::use_tuning(isa, t);
      INFO("tuning " << bd::kernel::to_string(t));
      CHECK(product(L) == many);
      CHECK(product(3) == few);
      CHECK(attention(false) == plain);
      CHECK(attention(true) == latent);
    }
    bd::kernel::use_tuning(isa, base);
  });
}

TEST_CASE("context: the process's context is this CPU's row with BD_TUNING applied", "[kernel][context]") {
  const Isa isa = bd::kernel::active_isa();
  const Context& active = bd::kernel::active_context();
  CHECK(active.isa == isa);
  CHECK(active.cpu.describe() == bd::kernel::this_cpu().describe());
  const char* spec = std::getenv("BD_TUNING");
  const Context expected = bd::kernel::make_context(bd::kernel::this_cpu(), isa, spec ? spec : "");
  INFO("BD_TUNING=" << (spec ? spec : "(unset)") << "; " << active.describe());
  CHECK(bd::kernel::to_string(active.tuning) == bd::kernel::to_string(expected.tuning));
}
