// bd/kernel/arguments.hpp — what one call of bd::kernel::gemm computes, described by pointers:
//
//     out[:, col(c)] = init(c) + Σ_k X[:, chan(k)] · B(k, c)          for c in a segment
//
// init(c): X's column init_channels[c], the value init_values[c], out[:, col(c)] itself
// (accumulate), or 0.
//
// Column-major, except that preparation's products may pass X or B row-major (a transposed
// operand read in place, never copied; see matmul.hpp). A segment is a run of B's columns that share one list of X channels
// as their K dimension (a shared window: one segment; per-head pivoted bases: one per head).
#pragma once

#include <cassert>
#include <vector>

#include <Eigen/Core>

#include "bd/base/index.hpp"
#include "bd/base/names.hpp"

namespace bd::kernel {

using bd::Index;

/// Cache blocking. mc rows of X per packed A block at most (a thread's rows are cut into equal
/// blocks of whole micro-tiles, so no block ends in a mostly empty tile), kc of the K dimension
/// per pass (K is split into equal passes of at most kc; a B micro-panel kc × NR stays in L1
/// while the A block streams from L2), nc output columns per task (rounded up to NR). A zero
/// takes the CPU's context (context.hpp: kc from L1, mc from L2, nc from its tuning row).
/// None changes a result: a pass stores its accumulators and the next loads them, exactly, and
/// a row's sums do not depend on its block.
struct Blocking {
  Index mc = 0;
  Index kc = 0;
  Index nc = 0;
};

/// What a product computes in, apart from what its operands are stored in: F32 (products of
/// float operands), or BF16 — both operands rounded once to bfloat16 (nearest even; bfloat16
/// weights as they are), their products summed in float — which CPUs with bf16 units compute
/// two to sixteen times as fast (docs/design.md, "Compute type"). Start values (BD's basis
/// channels, a bias) are added in float either way.
enum class Compute { F32, BF16 };

/// The names --compute takes and reports print (base/names.hpp).
inline constexpr bd::detail::Named<Compute> compute_names[] = {{Compute::F32, "f32"}, {Compute::BF16, "bf16"}};

inline const char* to_string(Compute c) { return bd::detail::name_in(compute_names, c); }

/// "f32" or "bf16" (a command's --compute); RangeError naming both otherwise.
inline Compute parse_compute(std::string_view name) { return bd::detail::parse_in(compute_names, name, "compute type"); }

/// Columns [first_column, first_column + width) of B and of the output that share one list of
/// X channels as their K dimension (`depth` channels, read in list order against B's rows).
struct Segment {
  const Index* channels = nullptr;
  Index depth = 0;
  Index first_column = 0;
  Index width = 0;
};

/// A GEMM's segments: most products have one, per-head pivoted bases one per head. Up to four are
/// held in place and more go to the heap, or a product with many reads the caller's array in
/// place (view: a Workspace buffer), so that building its arguments allocates nothing (absorbed
/// decoding runs per-head products for every token).
class SegmentList {
 public:
  void push_back(const Segment& s) {
    assert(!viewed_ && "SegmentList: a list is pushed to or views the caller's array, not both");
    if (size_ < local_capacity) {
      local_[size_++] = s;
      return;
    }
    if (size_ == local_capacity) heap_.assign(local_, local_ + local_capacity);
    heap_.push_back(s);
    ++size_;
  }
  /// The n segments at `first`, read where they lie: the caller keeps them until the product ends.
  void view(const Segment* first, std::size_t n) {
    heap_.clear();
    viewed_ = first, size_ = n;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const Segment* data() const { return viewed_ ? viewed_ : size_ <= local_capacity ? local_ : heap_.data(); }
  const Segment& operator[](std::size_t i) const { return data()[i]; }
  const Segment& front() const { return data()[0]; }
  const Segment* begin() const { return data(); }
  const Segment* end() const { return data() + size_; }

 private:
  static constexpr std::size_t local_capacity = 4;
  Segment local_[local_capacity];
  std::vector<Segment> heap_;        // all of them, once more than local_capacity were pushed
  const Segment* viewed_ = nullptr;  // the caller's array (view)
  std::size_t size_ = 0;
};

/// One GEMM. T is the arithmetic type (float or double), S the storage type of B (T, or half /
/// bfloat16, converted while packing).
template <typename T, typename S>
struct GemmArguments {
  Index rows = 0;                        ///< L
  const T* x = nullptr;                  ///< X (L × any), leading dimension ldx ≥ L
  Index ldx = 0;
  const S* b = nullptr;                  ///< B (K × N), leading dimension ldb
  Index ldb = 0;
  T* out = nullptr;                      ///< output, leading dimension ldo ≥ L
  Index ldo = 0;
  const Index* out_columns = nullptr;    ///< output column of each B column; null: the same index
  const Index* init_channels = nullptr;  ///< X channel each output column starts from; null: none
  const T* init_values = nullptr;        ///< value each output column starts from (a bias); null: 0
  bool accumulate = false;               ///< out += …: every output starts from its own value
  SegmentList segments;
  bool x_row_major = false;              ///< X(i, k) at x[i·ldx + k] instead of x[k·ldx + i]
  bool b_row_major = false;              ///< B(k, c) at b[k·ldb + c] instead of b[c·ldb + k]
  /// Only the lower triangle is wanted (a Gram matrix, see matmul.hpp's gram_into): micro-tiles
  /// whose every output row i is above its column c (i < c, c the B column) are not computed
  /// and those outputs are left unwritten; every output with i ≥ c is written as usual.
  bool lower_only = false;
  /// BF16: X's channels and B rounded to bfloat16 as they are packed (T float; B stored in float or
  /// bfloat16), the products summed in T; the start values as they are.
  Compute compute = Compute::F32;
};

}  // namespace bd::kernel
