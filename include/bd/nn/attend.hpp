// bd/nn/attend.hpp — softmax(q·kᵀ·scale)·v per head, once q, k and v are projected: the call
// every attention layer makes (dense, BD, MLA, GQA), with an optional causal mask and decoupled
// RoPE scores, on the kernel's flash attention; its shapes checked here, with messages.
#pragma once

#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "bd/base/error.hpp"
#include "bd/kernel/flash_attention.hpp"
#include "bd/nn/types.hpp"

namespace bd::nn {

/// Heads and positions of one attention call.
struct AttendSpec {
  Index n_q = 1;             ///< query heads in Q
  Index n_k = 1;             ///< heads in K; query head h reads key head h·n_k/n_q
  Index n_v = 0;             ///< heads in V (0: n_k); query head h reads value head h·n_v/n_q
  Index d_qk = 0, d_v = 0;   ///< per-head widths
  Index d_rope = 0;          ///< decoupled RoPE width (Qr per head, one Kr for all)
  double scale = 1;
  bool causal = false;
  Index first_query_position = 0;  ///< causal: query i sees keys at positions ≤ first + i
  Index first_key_position = 0;    ///< keys sit at positions first_key … first_key + L_k − 1
  bool values_are_keys = false;    ///< V is K's first d_v columns (absorbed MLA's latent): read from K
  /// bf16: QKᵀ and P·V on operands rounded once to bfloat16, summed in f32, the softmax in f32
  /// (kernel::AttentionArguments::compute says where); f32 arithmetic only.
  bd::kernel::Compute compute = bd::kernel::Compute::F32;
};

/// Keys and values stored in bfloat16 as a bf16 cache holds them (attend_stored_bf16_into).
using Bf16Ref = Eigen::Ref<const Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>>;

namespace detail {
/// The kernel's arguments for one attend call, after checking every shape against the spec; K,
/// V and Kr are float operands (ConstRef<A>) or stored in bfloat16 (Bf16Ref).
template <typename A, typename KeyRef>
bd::kernel::AttentionArguments<A> attention_arguments(const ConstRef<A>& Q, const KeyRef& K, const KeyRef& V,
                                                     const AttendSpec& s, const ConstRef<A>* Qr, const KeyRef* Kr,
                                                     Eigen::Ref<MatrixA<A>> O) {
  using bd::detail::message;
  const Index n_v = s.n_v ? s.n_v : s.n_k, d_rope = Qr && Kr ? s.d_rope : 0;
  if (K.rows() == 0)
    throw ShapeError("attention over an empty context: there is no key to attend to (give at least one key/value token)");
  if (s.n_q % s.n_k || s.n_q % n_v || Q.cols() != s.n_q * s.d_qk || K.cols() != s.n_k * s.d_qk ||
      V.cols() != n_v * s.d_v || V.rows() != K.rows() || O.rows() != Q.rows() || O.cols() != s.n_q * s.d_v ||
      (d_rope && (Qr->rows() != Q.rows() || Qr->cols() != s.n_q * d_rope || Kr->rows() != K.rows() || Kr->cols() != d_rope)))
    throw ShapeError(message("attend: Q ", Q.rows(), "x", Q.cols(), ", K ", K.rows(), "x", K.cols(), ", V ", V.rows(), "x",
                             V.cols(), " do not fit ", s.n_q, "/", s.n_k, "/", n_v, " heads of ", s.d_qk, " and ", s.d_v));
  bd::kernel::AttentionArguments<A> a;
  a.q_len = Q.rows(), a.k_len = K.rows();
  a.n_q = s.n_q, a.n_k = s.n_k, a.n_v = n_v;
  a.d_qk = s.d_qk, a.d_rope = d_rope, a.d_v = s.d_v;
  a.q = Q.data(), a.ldq = Q.outerStride();
  a.ldk = K.outerStride(), a.ldv = V.outerStride();
  if (d_rope) a.qr = Qr->data(), a.ldqr = Qr->outerStride(), a.ldkr = Kr->outerStride();
  if constexpr (std::is_same_v<KeyRef, Bf16Ref>) {
    static_assert(std::is_same_v<A, float>, "keys stored in bf16 are read by f32 arithmetic");
    a.k_bf16 = K.data(), a.v_bf16 = V.data();
    if (d_rope) a.kr_bf16 = Kr->data();
  } else {
    a.k = K.data(), a.v = V.data();
    if (d_rope) a.kr = Kr->data();
  }
  a.out = O.data(), a.ldo = O.outerStride();
  a.scale = A(s.scale);
  a.causal = s.causal;
  a.first_query_position = s.first_query_position;
  a.first_key_position = s.first_key_position;
  if (s.values_are_keys && (V.data() != K.data() || V.outerStride() != K.outerStride() || s.d_v > s.d_qk ||
                            s.n_k != n_v || (s.n_k != 1 && s.d_v != s.d_qk)))
    throw ShapeError("attend: values_are_keys, but V is not the first channels of K (one head, or d_v = d_qk)");
  a.values_are_keys = s.values_are_keys;
  a.compute = s.compute;
  return a;
}
}  // namespace detail

/// O (L_q × n_q·d_v) = [softmax(Q_h·K_hᵀ·scale [+ Qr_h·Krᵀ·scale], masked)·V_h]_h, fused and
/// tiled on the dispatched kernel (kernel/flash_attention.hpp): no L_q × L_k matrix is formed,
/// causal tiles are skipped, and query heads that read the same key and value heads are one
/// product. Operands are read where they lie (a cache's rows too); O is written, not read.
template <typename A>
void attend_into(const ConstRef<A>& Q, const ConstRef<A>& K, const ConstRef<A>& V, const AttendSpec& s,
                 const ConstRef<A>* Qr, const ConstRef<A>* Kr, Eigen::Ref<MatrixA<A>> O, Workspace& ws) {
  bd::kernel::flash_attention(detail::attention_arguments<A, ConstRef<A>>(Q, K, V, s, Qr, Kr, O), 0, ws);
}

/// The same with keys, values and RoPE keys stored in bfloat16 (a bf16 KVCache's, or a bf16
/// LatentCache's latent as both, spec.values_are_keys): read as they lie, widened exactly for f32
/// arithmetic or paired for bf16's (kernel::AttentionArguments::k_bf16).
template <typename A>
void attend_stored_bf16_into(const ConstRef<A>& Q, const Bf16Ref& K, const Bf16Ref& V, const AttendSpec& s,
                             const ConstRef<A>* Qr, const Bf16Ref* Kr, Eigen::Ref<MatrixA<A>> O, Workspace& ws) {
  bd::kernel::flash_attention(detail::attention_arguments<A, Bf16Ref>(Q, K, V, s, Qr, Kr, O), 0, ws);
}

/// The same, into a new matrix.
template <typename A>
MatrixA<A> attend(const ConstRef<A>& Q, const ConstRef<A>& K, const ConstRef<A>& V, const AttendSpec& s,
                  const ConstRef<A>* Qr = nullptr, const ConstRef<A>* Kr = nullptr, Workspace& ws = default_workspace()) {
  MatrixA<A> O(Q.rows(), s.n_q * s.d_v);
  attend_into<A>(Q, K, V, s, Qr, Kr, O, ws);
  return O;
}

/// The same attention with the keys given block by block (spec.first_key_position says where a
/// block starts): the softmax's running maximum and sum per query row are carried between
/// calls, so keys computed on the fly are attended to as they are made and never all held.
/// The output is written into `out` (queries × n_q·d_v, the caller's: a layer keeps it in its
/// Workspace), which holds the unnormalised sums until finish().
template <typename A>
class StreamedAttention {
public:
  StreamedAttention(Eigen::Ref<MatrixA<A>> out, const AttendSpec& spec, Workspace& ws = default_workspace())
      : ws_(&ws),
        spec_(spec),
        O_(out),
        max_(static_cast<std::size_t>(out.rows() * spec.n_q), -std::numeric_limits<A>::infinity()),
        sum_(max_.size(), A(0)) {
    O_.setZero();
  }

  /// Attends to keys at positions first_key … first_key + K.rows() − 1.
  void add(const ConstRef<A>& Q, const ConstRef<A>& K, const ConstRef<A>& V, Index first_key,
           const ConstRef<A>* Qr = nullptr, const ConstRef<A>* Kr = nullptr) {
    AttendSpec s = spec_;
    s.first_key_position = first_key;
    auto a = detail::attention_arguments<A, ConstRef<A>>(Q, K, V, s, Qr, Kr, O_);
    a.row_max = max_.data(), a.row_sum = sum_.data();
    bd::kernel::flash_attention(a, 0, *ws_);
    last_ = a;
    seen_ = true;
  }

  /// Normalises the output, once every key has been added.
  void finish() {
    if (!seen_) throw ShapeError("attention over an empty context: no key was added");
    bd::kernel::flash_attention_finish(last_);
  }

private:
  Workspace* ws_;
  AttendSpec spec_;
  Eigen::Ref<MatrixA<A>> O_;
  std::vector<A> max_, sum_;
  bd::kernel::AttentionArguments<A> last_;
  bool seen_ = false;
};

}  // namespace bd::nn
