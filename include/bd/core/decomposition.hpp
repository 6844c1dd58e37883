// bd/core/decomposition.hpp — the value a decomposition produces: basis, coefficients, indices.
//
// Row form (m×n, rank r):   W[indices, :] = B,   W[rest, :] = C·B       (B r×n, C (m−r)×r)
// Column form:              W[:, indices] = B,   W[:, rest] = B·C       (B m×r, C r×(n−r))
// indices() are ascending; rest() are the other rows (columns), ascending. With a contiguous
// window at offset o these are the paper's identities W = [I; C]B (o = 0) and W = [C; I]B
// (o = m−r), and their column twins. apply(x) is x·W without W:
//
//   row form     x·W = (x[:, indices] + x[:, rest]·C)·B
//   column form  (x·W)[:, indices] = x·B,  (x·W)[:, rest] = (x·B)·C
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "bd/base/code_size.hpp"
#include "bd/core/options.hpp"
#include "bd/core/phase_times.hpp"
#include "bd/core/scalar.hpp"
#include "bd/kernel/gemm.hpp"
#include "bd/kernel/matmul.hpp"

namespace bd {

/// What preparation found and chose. Error figures are computed in double against the exact
/// product (for decompose_product, U·Vᵀ held through its factors; for decompose, W itself).
struct Report {
  Basis requested = Basis::OffsetSearch;  ///< what Options::basis asked for
  Basis chosen = Basis::OffsetSearch;     ///< what was used: First, Last, OffsetSearch or Pivoted
  double nmse = 0;             ///< ‖W − Ŵ‖²_F / ‖W‖²_F of the stored (rounded) B and C
  double residual = 0;         ///< ‖W − Ŵ‖_F
  double norm = 0;             ///< ‖W‖_F
  double estimate = 0;         ///< the ranking estimate of nmse for the chosen basis
  double floor_nmse = 0;       ///< NMSE of rounding the dense product itself to the storage type
  double truncation_nmse = 0;  ///< decompose(W): energy of W beyond rank r, part of nmse
  double rcond = 0;            ///< reciprocal condition estimate of the (orthonormalised) basis block
  Index windows_tried = 0;     ///< candidate index sets ranked
  Index windows_skipped = 0;   ///< candidates skipped as singular
  bool refitted = false;       ///< coefficients were refitted against the rounded basis
  std::string reason;          ///< what was chosen and why, in words
  /// Where the call that made this decomposition spent its time, when it made only this one
  /// (decompose, decompose_product); zero for the heads of a set: SharedDecomposition::phases().
  PhaseTimes phases;
};

template <typename Scalar_>
class Decomposition {
public:
  using Scalar = Scalar_;
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
  static_assert(is_supported_scalar_v<Scalar>, "bd supports double, float, Eigen::half and Eigen::bfloat16");

  Decomposition() = default;

  /// Assembles a decomposition from its parts; checks that they agree with each other.
  BD_COLD Decomposition(Side side, Index rows, Index cols, std::vector<Index> indices, Matrix basis, Matrix coeff,
                Report report = {})
      : side_(side), rows_(rows), cols_(cols), indices_(std::move(indices)), basis_(std::move(basis)),
        coeff_(std::move(coeff)), report_(std::move(report)) {
    const Index r = rank();
    const Index along = side_ == Side::Row ? rows_ : cols_;
    const Index across = side_ == Side::Row ? cols_ : rows_;
    if (r <= 0 || r >= std::min(rows_, cols_))
      throw RangeError(detail::message("Decomposition: rank ", r, " out of range for ", rows_, "x", cols_));
    if (!std::is_sorted(indices_.begin(), indices_.end()) ||
        std::adjacent_find(indices_.begin(), indices_.end()) != indices_.end() || indices_.front() < 0 ||
        indices_.back() >= along)
      throw RangeError(detail::message("Decomposition: indices must be distinct, ascending and in [0, ", along, ")"));
    const bool row = side_ == Side::Row;
    const Index want_basis_rows = row ? r : across, want_basis_cols = row ? across : r;
    const Index want_coeff_rows = row ? along - r : r, want_coeff_cols = row ? r : along - r;
    if (basis_.rows() != want_basis_rows || basis_.cols() != want_basis_cols)
      throw ShapeError(detail::message("Decomposition: basis is ", basis_.rows(), "x", basis_.cols(), ", expected ",
                                       want_basis_rows, "x", want_basis_cols));
    if (coeff_.rows() != want_coeff_rows || coeff_.cols() != want_coeff_cols)
      throw ShapeError(detail::message("Decomposition: coeff is ", coeff_.rows(), "x", coeff_.cols(), ", expected ",
                                       want_coeff_rows, "x", want_coeff_cols));
    rest_.reserve(static_cast<std::size_t>(along - r));
    std::size_t k = 0;
    for (Index i = 0; i < along; ++i) {
      if (k < indices_.size() && indices_[k] == i) ++k;
      else rest_.push_back(i);
    }
  }

  Side side() const { return side_; }
  Index rows() const { return rows_; }  ///< m, rows of W
  Index cols() const { return cols_; }  ///< n, columns of W
  Index rank() const { return static_cast<Index>(indices_.size()); }
  /// The basis rows (row form, r×n) or columns (column form, m×r) of W, stored in Scalar.
  const Matrix& basis() const { return basis_; }
  /// The coefficients that rebuild the other rows ((m−r)×r) or columns (r×(n−r)).
  const Matrix& coeff() const { return coeff_; }
  /// Positions of the basis rows (columns) in W, ascending.
  const std::vector<Index>& indices() const { return indices_; }
  /// The basis and coefficients to update in place (training, where gradients flow through B
  /// and C): the shapes and indices stay; report() then describes the decomposition as prepared.
  Matrix& basis_for_update() { return basis_; }
  Matrix& coeff_for_update() { return coeff_; }
  /// First basis index: the window's offset when the basis is contiguous.
  Index offset() const { return indices_.empty() ? 0 : indices_.front(); }
  /// True when the basis is one contiguous window [offset, offset + rank).
  bool contiguous() const { return !indices_.empty() && indices_.back() - indices_.front() + 1 == rank(); }
  /// Positions of the rows (columns) rebuilt by coeff(), ascending.
  const std::vector<Index>& rest() const { return rest_; }
  /// Stored parameters: r(m + n − r), against m·n dense or r(m + n) as factors.
  Index parameters() const { return basis_.size() + coeff_.size(); }
  const Report& report() const { return report_; }

  /// x·W for rows x (L × rows(): a row vector or a block of rows, float or double) without
  /// forming W, on the dispatched kernel: the row form gathers x's basis and rest channels by
  /// indices() and rest() (any basis: a window, pivoted rows), the column form writes the basis
  /// columns and rebuilds the rest from them (as BDLinear does), in x's type. Returns L × cols()
  /// in x's scalar type; ShapeError when x has not rows() columns. It runs on
  /// preparation's GEMM, which packs even a single row: the layers (BDLinear, BDAttention) are
  /// the fast path for decoding, their skinny path compiled only where a program uses them.
  template <typename Derived>
  Eigen::Matrix<typename Derived::Scalar, Eigen::Dynamic, Eigen::Dynamic> apply(const Eigen::MatrixBase<Derived>& x,
                                                                                  Workspace& ws = default_workspace()) const {
    using T = typename Derived::Scalar;
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "Decomposition::apply: x in float or double");
    using Out = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic>;
    if (rank() == 0) throw RangeError("Decomposition::apply: the decomposition is empty (default-constructed)");
    if (x.cols() != rows_)
      throw ShapeError(detail::message("Decomposition::apply: x has ", x.cols(), " columns, expected rows() = ", rows_,
                                       " (x·W for W ", rows_, "x", cols_, ")"));
    const Out xm = x;  // column-major, contiguous: what the kernel gathers from
    // B and C in x's type (exact where x's type holds the stored one): preparation's GEMM for T,
    // which every program that prepares a decomposition has compiled already.
    const Out basis = basis_.template cast<T>(), coeff = coeff_.template cast<T>();
    const Index L = xm.rows(), r = rank();
    Out y(L, cols_);
    if (L == 0) return y;
    const auto product = [&](const T* in, const Out& w, Index depth, const Index* channels, Index width, const Index* starts,
                             const Index* columns, T* out) {
      bd::kernel::GemmArguments<T, T> a;
      a.rows = L, a.x = in, a.ldx = L;
      a.b = w.data(), a.ldb = w.rows();
      a.out = out, a.ldo = L, a.out_columns = columns, a.init_channels = starts;
      a.segments.push_back({channels, depth, 0, width});
      bd::kernel::detail::gemm_with<false>(a, {}, 0, ws);  // preparation's GEMM: no few-row path compiled
    };
    if (side_ == Side::Row) {  // h = x[:, S] + x[:, R]·C, then y = h·B
      Out h(L, r);
      product(xm.data(), coeff, rows_ - r, rest_.data(), r, indices_.data(), nullptr, h.data());
      product(h.data(), basis, r, bd::kernel::identity_channels(r, ws), cols_, nullptr, nullptr, y.data());
    } else {  // y[:, S] = x·B, then y[:, R] = y[:, S]·C
      product(xm.data(), basis, rows_, bd::kernel::identity_channels(rows_, ws), r, nullptr, indices_.data(), y.data());
      product(y.data(), coeff, r, indices_.data(), cols_ - r, nullptr, rest_.data(), y.data());
    }
    return y;
  }

  /// Rebuilds W from basis and coefficients, accumulating in Out's accumulation type.
  /// reconstruct() gives Scalar; reconstruct<double>() the exact value of the stored B and C.
  template <typename Out = Scalar>
  Eigen::Matrix<Out, Eigen::Dynamic, Eigen::Dynamic> reconstruct() const {
    using Acc = std::conditional_t<std::is_same_v<Out, double>, double, acc_t<Scalar>>;
    using AccMatrix = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic>;
    const AccMatrix basis = basis_.template cast<Acc>();
    const AccMatrix rebuilt = side_ == Side::Row ? AccMatrix(coeff_.template cast<Acc>() * basis)
                                                  : AccMatrix(basis * coeff_.template cast<Acc>());
    AccMatrix out(rows_, cols_);
    const std::vector<Index> others = rest();
    if (side_ == Side::Row) {
      out(indices_, Eigen::all) = basis;
      out(others, Eigen::all) = rebuilt;
    } else {
      out(Eigen::all, indices_) = basis;
      out(Eigen::all, others) = rebuilt;
    }
    return out.template cast<Out>();
  }

private:
  Side side_ = Side::Row;
  Index rows_ = 0, cols_ = 0;
  std::vector<Index> indices_, rest_;
  Matrix basis_, coeff_;
  Report report_;
};

/// One basis choice for a set of products of equal shape (every head of a layer).
/// When shared() the heads use the same window, so K'/V' read one slice of X for all heads.
template <typename Scalar_>
class SharedDecomposition {
public:
  using Scalar = Scalar_;

  SharedDecomposition() = default;
  SharedDecomposition(std::vector<Decomposition<Scalar>> heads, bool shared, Basis requested, Basis chosen,
                      std::string reason, PhaseTimes phases = {})
      : heads_(std::move(heads)), shared_(shared), requested_(requested), chosen_(chosen),
        reason_(std::move(reason)), phases_(phases) {}

  const std::vector<Decomposition<Scalar>>& heads() const { return heads_; }
  const Decomposition<Scalar>& head(std::size_t h) const { return heads_.at(h); }
  std::size_t size() const { return heads_.size(); }
  /// True when every head uses the same contiguous window.
  bool shared() const { return shared_; }
  Index offset() const { return heads_.empty() ? 0 : heads_.front().offset(); }
  Basis requested() const { return requested_; }
  Basis chosen() const { return chosen_; }
  const std::string& reason() const { return reason_; }
  /// Where preparing the whole set spent its time.
  const PhaseTimes& phases() const { return phases_; }
  double mean_nmse() const {
    double sum = 0;
    for (const auto& h : heads_) sum += h.report().nmse;
    return heads_.empty() ? 0 : sum / static_cast<double>(heads_.size());
  }
  Index parameters() const {
    Index sum = 0;
    for (const auto& h : heads_) sum += h.parameters();
    return sum;
  }

private:
  std::vector<Decomposition<Scalar>> heads_;
  bool shared_ = true;
  Basis requested_ = Basis::OffsetSearch, chosen_ = Basis::OffsetSearch;
  std::string reason_;
  PhaseTimes phases_;
};

}  // namespace bd
