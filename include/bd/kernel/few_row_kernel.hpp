// bd/kernel/few_row_kernel.hpp — a micro-kernel's routines for products and attention of a few
// rows (decoding), as one context per scalar type: the skinny GEMM (skinny.hpp) and the few-row
// attention (flash_attention.hpp) read K, V and the weights where they lie through these.
#pragma once

#include <type_traits>

#include <Eigen/Core>

#include "bd/kernel/arguments.hpp"

namespace bd::kernel::detail {

/// What the few-row paths need of a micro-kernel: its vector width and four routines. Their
/// loops are the same for every instruction set, so each is compiled once per scalar type and
/// calls these through pointers (one indirect call per group of columns, four rows and block of
/// keys, or row) instead of once per (ISA, scalar). The same pattern as the packed GEMM's
/// PackedKernel (loop.hpp) and the tiled attention's FlashTileKernel (flash_attention.hpp).
template <typename T>
struct FewRowKernel {
  Index lanes = 1;  // softmax_row takes whole vectors of this many scores
  /// `ahead`: values K's runs are asked for before they are read (Tuning::stream_prefetch)
  void (*column_scores)(Index count, Index n, Index depth, const T* k, Index ldk, const T* q, Index ldq, T* s, Index lds,
                        bool start, Index ahead) = nullptr;
  void (*softmax_row)(T* s, Index n, T* m, T* l, T* alpha) = nullptr;
  void (*dot_rows)(Index count, const T* rows, Index ldr, Index depth, const T* b, Index ldb, Index columns, T* result,
                   Index ahead) = nullptr;
  /// dot_rows for rows stored one after the other (the skinny GEMM: decoding's projections); one
  /// row deeper than `row_walk` bytes is read four columns per load (Tuning::row_walk).
  void (*dot_columns)(Index count, const T* rows, Index depth, const T* b, Index ldb, Index columns, T* result,
                      Index row_walk) = nullptr;
  /// dot_columns with B stored in bfloat16, read where it lies, one deep row's columns asked for
  /// `ahead` values before their loads (float only; null otherwise).
  void (*dot_columns_bf16)(Index count, const T* rows, Index depth, const Eigen::bfloat16* b, Index ldb, Index columns,
                           T* result, Index row_walk, Index ahead) = nullptr;
  /// column_scores and dot_rows with K and V stored in bfloat16 (a bf16 cache), read where they
  /// lie (float only; null otherwise).
  void (*column_scores_bf16)(Index count, Index n, Index depth, const Eigen::bfloat16* k, Index ldk, const T* q, Index ldq,
                             T* s, Index lds, bool start, Index ahead) = nullptr;
  void (*dot_rows_bf16)(Index count, const T* rows, Index ldr, Index depth, const Eigen::bfloat16* b, Index ldb, Index columns,
                        T* result, Index ahead) = nullptr;
};

/// Kernel's FewRowKernel, built on first use (once per instruction set and scalar type).
template <typename Kernel, typename T>
const FewRowKernel<T>& few_row_kernel() {
  static const FewRowKernel<T> table = [] {
    FewRowKernel<T> k;
    k.lanes = Kernel::lanes();
    k.column_scores = &Kernel::column_scores;
    k.softmax_row = &Kernel::softmax_row;
    k.dot_rows = &Kernel::dot_rows;
    k.dot_columns = &Kernel::dot_columns;
    if constexpr (std::is_same_v<T, float>) {
      k.dot_columns_bf16 = &Kernel::dot_columns_bf16;
      k.column_scores_bf16 = &Kernel::column_scores_bf16;
      k.dot_rows_bf16 = &Kernel::dot_rows_bf16;
    }
    return k;
  }();
  return table;
}

}  // namespace bd::kernel::detail
