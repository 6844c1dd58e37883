// python/src/bd_torch.cpp — bd for PyTorch: its layers as TorchScript classes (torch.classes.bd.*)
// (Linear, Attention with its caches, Projection: the fused BD projection), loaded by the bd_torch
// package (python/bd_torch/__init__.py).
//
// Tensors and Eigen meet without copies where their layouts agree. bd's matrices are
// column-major, a torch activation (tokens × channels) is row-major: a single token (decoding) is
// both and is read in place, as is any column-major tensor (strides (1, ≥ rows): what every
// result here is); a row-major block of tokens is transposed once into bd's order (L·d values,
// against the L·d·n multiply-adds of the projection that reads it), and counted
// (torch.ops.bd.transposed_inputs()). Results are bd's own matrices handed to torch, not copied,
// and the tensors a layer exposes (basis, coefficients) are views of its storage. A bfloat16 or
// float16 activation is widened once into bd's order (exactly) and its result rounded once back
// into its type, as torch's layers return it; how the product is computed is the layer's
// set_compute, not the input's type.
//
// Weights may come in any floating type and layout: preparation reads them once, in double.
// Checkpoints go through bd::io: convert() is bd-convert's conversion, Attention.load reads a
// layer of what it wrote.
// Every refusal is bd's exception with bd's message (Python sees a RuntimeError carrying it).
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include "bd/bd.hpp"
#include "bd/io/bd_checkpoint.hpp"
#include "bd/io/convert.hpp"
#include "bd/nn/bd_attention.hpp"
#include "bd/nn/bd_linear.hpp"
#include "bd/nn/multi_head_attention.hpp"
#include "bd/nn/projection.hpp"

namespace bd_torch {

using bd::Index;
using bd::detail::message;
using Matrix = Eigen::MatrixXf;
using View = Eigen::Map<const Matrix, 0, Eigen::OuterStride<>>;
using Compute = bd::kernel::Compute;

std::atomic<std::int64_t> transposed_inputs{0};

template <typename S>
at::ScalarType torch_type() {
  if constexpr (std::is_same_v<S, float>) return at::kFloat;
  else if constexpr (std::is_same_v<S, double>) return at::kDouble;
  else if constexpr (std::is_same_v<S, Eigen::half>) return at::kHalf;
  else return at::kBFloat16;
}

std::string type_name(at::ScalarType t) { return c10::toString(t); }

/// A dense 2-D tensor on the CPU, or bd's refusal naming what is not.
void require_matrix(const at::Tensor& t, const std::string& what) {
  if (!t.defined()) throw bd::ShapeError(message("bd_torch: ", what, " is missing"));
  if (!t.device().is_cpu())
    throw bd::RefusedError(message("bd_torch: ", what, " is on ", t.device().str(),
                                   "; this extension runs bd's CPU kernels: move it with .cpu()"));
  if (t.layout() != at::kStrided)
    throw bd::RefusedError(message("bd_torch: ", what, " is not a dense (strided) tensor; call .to_dense()"));
  if (t.dim() != 2)
    throw bd::ShapeError(message("bd_torch: ", what, " has ", t.dim(), " dimensions; expected a matrix (rows × columns)"));
}

/// Float scratch of the calling thread in bd's default Workspace, one per use (below), kept between
/// calls: a fresh buffer for a large activation or result costs its page faults on every call, as
/// much as the product at DeepSeek's key projection.
struct HalfInputScratch {  ///< a half-precision activation widened into bd's order
  std::vector<float> values;
};
struct HalfResultScratch {  ///< a half-precision activation's result before it is rounded
  std::vector<float> values;
};

/// At least `size` floats of the calling thread's Scratch.
template <typename Scratch>
float* thread_floats(Index size) {
  std::vector<float>& values = bd::default_workspace().local<Scratch>().values;
  const std::size_t need = static_cast<std::size_t>(std::max<Index>(1, size));
  if (values.size() < need) values.resize(need);
  return values.data();
}

/// An activation as bd reads it: float32 in place when column-major (or a single row), else
/// transposed once into `keep`; bfloat16 and float16 widened once (exactly: every such value is a
/// float) into the thread's HalfInputScratch in bd's order, `keep` viewing it. Refuses other
/// dtypes and strides that are unit along neither dimension.
View activation(const at::Tensor& x, const std::string& what, at::Tensor& keep) {
  require_matrix(x, what);
  const at::ScalarType type = x.scalar_type();
  if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf)
    throw bd::RefusedError(message("bd_torch: ", what, " is ", type_name(type),
                                   "; bd's activations are float32, bfloat16 or float16 (weights may be stored narrower: storage=)"));
  const Index rows = x.size(0), cols = x.size(1);
  const bool column_major = (rows <= 1 || x.stride(0) == 1) && (cols <= 1 || x.stride(1) >= rows);
  const bool row_major = x.stride(1) == 1 || cols <= 1;
  if (!column_major && !row_major)
    throw bd::RefusedError(message("bd_torch: ", what, " has strides (", x.stride(0), ", ", x.stride(1),
                                   "): neither dimension is contiguous; call .contiguous()"));
  if (type != at::kFloat) {  // into the thread's scratch, strides (1, rows): no fresh pages per call
    keep = at::from_blob(thread_floats<HalfInputScratch>(rows * cols), {rows, cols}, {1, std::max<Index>(rows, 1)}, at::kFloat);
    keep.copy_(x);
  } else {
    keep = column_major ? x : x.t().contiguous().t();
  }
  if (!column_major) ++transposed_inputs;
  const Index ld = cols <= 1 ? std::max<Index>(rows, 1) : std::max<Index>(keep.stride(1), 1);
  return View(keep.data_ptr<float>(), rows, cols, Eigen::OuterStride<>(std::max(ld, std::max<Index>(rows, 1))));
}

/// Any floating matrix, read once in double (preparation's precision).
Eigen::MatrixXd weight(const at::Tensor& w, const std::string& what) {
  require_matrix(w, what);
  if (!at::isFloatingType(w.scalar_type()))
    throw bd::RefusedError(message("bd_torch: ", what, " is ", type_name(w.scalar_type()), "; expected a floating-point tensor"));
  const at::Tensor d = w.to(at::kDouble).contiguous();  // row-major
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  return Eigen::Map<const RowMajor>(d.data_ptr<double>(), d.size(0), d.size(1));
}

Eigen::VectorXd vector(const at::Tensor& v, const std::string& what) {
  if (!v.defined() || v.numel() == 0) return {};
  if (v.dim() != 1) throw bd::ShapeError(message("bd_torch: ", what, " has ", v.dim(), " dimensions; expected a vector"));
  return weight(v.reshape({v.size(0), 1}), what);
}

/// A column-major matrix handed to torch without a copy: the tensor owns it.
template <typename M>
at::Tensor give(M&& m) {
  using Plain = std::decay_t<M>;
  using S = typename Plain::Scalar;
  auto* owned = new Plain(std::forward<M>(m));
  const Index rows = owned->rows(), cols = owned->cols();
  return at::from_blob(owned->data(), {rows, cols}, {1, std::max<Index>(rows, 1)},
                       [owned](void*) { delete owned; }, at::TensorOptions().dtype(torch_type<S>()));
}

/// rows x cols float32 values, column-major at `data`, rounded once (to nearest even) into a fresh
/// column-major tensor of `type`, as torch's own layers return a bfloat16 or float16 result.
at::Tensor rounded(const float* data, Index rows, Index cols, at::ScalarType type) {
  const at::Tensor view = at::from_blob(const_cast<float*>(data), {rows, cols}, {1, std::max<Index>(rows, 1)}, at::kFloat);
  return at::empty({cols, rows}, type).t().copy_(view);
}

/// A result in the activation's type, written by `write` into an Eigen::Ref<Matrix> of rows x
/// cols: for float32 bd's matrix handed over as it is; for bfloat16 or float16 written into the
/// thread's HalfResultScratch and rounded.
template <typename Write>
at::Tensor result_for(const at::Tensor& x, Index rows, Index cols, Write write) {
  if (x.scalar_type() == at::kFloat) {
    Matrix out(rows, cols);
    write(Eigen::Ref<Matrix>(out));
    return give(std::move(out));
  }
  Eigen::Map<Matrix> out(thread_floats<HalfResultScratch>(rows * cols), rows, cols);
  write(Eigen::Ref<Matrix>(out));
  return rounded(out.data(), rows, cols, x.scalar_type());
}

/// A result bd returned as a matrix, in the activation's type (see result_for).
at::Tensor in_type_of(const at::Tensor& x, Matrix result) {
  if (x.scalar_type() == at::kFloat) return give(std::move(result));
  return rounded(result.data(), result.rows(), result.cols(), x.scalar_type());
}

/// A view of storage that `owner` keeps alive (a layer's basis or coefficients).
template <typename S, typename Owner>
at::Tensor view_of(const Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>& m, Owner owner) {
  return at::from_blob(const_cast<S*>(m.data()), {m.rows(), m.cols()}, {1, std::max<Index>(m.rows(), 1)},
                       [owner](void*) mutable { owner.reset(); }, at::TensorOptions().dtype(torch_type<S>()));
}

at::Tensor indices_tensor(const std::vector<Index>& v) {
  at::Tensor t = at::empty({Index(v.size())}, at::kLong);
  std::copy(v.begin(), v.end(), t.data_ptr<std::int64_t>());
  return t;
}

/// One of bd's layer templates over the storage types a PyTorch model holds.
template <template <typename> class Layer>
using AnyStorage = std::variant<Layer<float>, Layer<Eigen::half>, Layer<Eigen::bfloat16>>;

/// f32, f16 or bf16 (torch's float32, float16, bfloat16); f64 is refused by name.
bd::Storage layer_storage(const std::string& name) {
  const bd::Storage s = bd::parse_storage(name);
  if (s == bd::Storage::F64)
    throw bd::RefusedError("bd_torch: storage f64 is not offered for layers (their activations are float32): "
                           "choose f32, f16 or bf16");
  return s;
}

template <template <typename> class Layer, typename F>
AnyStorage<Layer> make_layer(bd::Storage s, F&& make) {
  switch (s) {
    case bd::Storage::F16: return make(bd::type_tag<Eigen::half>{});
    case bd::Storage::BF16: return make(bd::type_tag<Eigen::bfloat16>{});
    default: return make(bd::type_tag<float>{});
  }
}

std::string describe(const bd::Report& r) {
  return message("basis ", bd::to_string(r.chosen), ", nmse ", r.nmse, " (rounding floor ", r.floor_nmse, ", truncation ",
                 r.truncation_nmse, "): ", r.reason);
}

// ---------------------------------------------------------------------------------------------
// Linear: y = x·W + b with W = B·[I, C]·Pᵀ (bd::nn::BDLinear).

struct Linear : torch::CustomClassHolder {
  AnyStorage<bd::nn::BDLinear> layer;

  explicit Linear(AnyStorage<bd::nn::BDLinear> l) : layer(std::move(l)) {}

  /// W (in × out, x·W: nn.Linear's weight transposed) truncated to `rank` by SVD, then decomposed.
  static c10::intrusive_ptr<Linear> from_dense(const at::Tensor& W, const c10::optional<at::Tensor>& bias, std::int64_t rank,
                                               const std::string& storage, const std::string& basis) {
    const Eigen::MatrixXd w = weight(W, "W");
    const Eigen::VectorXd b = vector(bias.value_or(at::Tensor()), "bias");
    bd::Options opts;
    opts.basis = bd::parse_basis(basis);
    return c10::make_intrusive<Linear>(make_layer<bd::nn::BDLinear>(layer_storage(storage), [&](auto tag) {
      using S = typename decltype(tag)::type;
      return AnyStorage<bd::nn::BDLinear>(bd::nn::BDLinear<S>::from_dense(w, rank, opts, b));
    }));
  }

  /// W = U·Vᵀ (U in × r, V out × r: a LoRA pair, or any factors), decomposed exactly.
  static c10::intrusive_ptr<Linear> from_low_rank(const at::Tensor& U, const at::Tensor& V, const c10::optional<at::Tensor>& bias,
                                                  const std::string& storage, const std::string& basis) {
    const Eigen::MatrixXd u = weight(U, "U"), v = weight(V, "V");
    const Eigen::VectorXd b = vector(bias.value_or(at::Tensor()), "bias");
    bd::Options opts;
    opts.basis = bd::parse_basis(basis);
    return c10::make_intrusive<Linear>(make_layer<bd::nn::BDLinear>(layer_storage(storage), [&](auto tag) {
      using S = typename decltype(tag)::type;
      const bd::nn::LowRankLinear<double> low_rank(u, v, b);
      return AnyStorage<bd::nn::BDLinear>(bd::nn::BDLinear<S>::from_low_rank(low_rank, opts));
    }));
  }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor keep;
    const View in = activation(x, "x", keep);
    return std::visit([&](const auto& l) {
      return result_for(x, in.rows(), l.output_dim(), [&](Eigen::Ref<Matrix> y) { l.forward_into(in, y); });
    }, layer);
  }

  void set_compute(const std::string& compute) {
    std::visit([&](auto& l) { l.set_compute(bd::kernel::parse_compute(compute)); }, layer);
  }
  std::string compute() const { return std::visit([](const auto& l) { return std::string(to_string(l.compute())); }, layer); }
  std::string storage() const {
    return std::visit([](const auto& l) { return std::string(bd::to_string(bd::storage_of<typename std::decay_t<decltype(l)>::Scalar>())); }, layer);
  }
  std::int64_t rank() const { return std::visit([](const auto& l) { return std::int64_t(l.rank()); }, layer); }
  std::int64_t in_features() const { return std::visit([](const auto& l) { return std::int64_t(l.input_dim()); }, layer); }
  std::int64_t out_features() const { return std::visit([](const auto& l) { return std::int64_t(l.output_dim()); }, layer); }
  std::int64_t parameters() const {
    return std::visit([](const auto& l) { return std::int64_t(l.parameters() + l.bias().size()); }, layer);
  }
  std::string report() const {
    return std::visit([](const auto& l) { return message(describe(l.report()), "; truncation nmse ", l.truncation_nmse()); }, layer);
  }
  double nmse() const { return std::visit([](const auto& l) { return l.report().nmse; }, layer); }
  /// B (in × r) and C (r × (out − r)), views of the layer's storage; basis_columns: S.
  at::Tensor basis(const c10::intrusive_ptr<Linear>& self) const {
    return std::visit([&](const auto& l) { return view_of(l.decomposition().basis(), self); }, layer);
  }
  at::Tensor coeff(const c10::intrusive_ptr<Linear>& self) const {
    return std::visit([&](const auto& l) { return view_of(l.decomposition().coeff(), self); }, layer);
  }
  at::Tensor basis_columns() const { return std::visit([](const auto& l) { return indices_tensor(l.decomposition().indices()); }, layer); }
};

// ---------------------------------------------------------------------------------------------
// Attention: bd::nn::BDAttention prepared from a dense layer's weights, with its caches.

/// A decoding cache: its tokens so far; truncate(n) forgets those after the first n.
template <typename Cache>
struct TokenCache : torch::CustomClassHolder {
  Cache cache;
  TokenCache() = default;
  /// A cache stored in `storage` ("f32", or "bf16": half the bytes a token reads).
  explicit TokenCache(const std::string& storage) : cache(bd::parse_storage(storage)) {}
  std::int64_t length() const { return cache.length(); }
  void truncate(std::int64_t n) { cache.truncate(n); }
};
using KVCache = TokenCache<bd::nn::KVCache<float>>;
using LatentCache = TokenCache<bd::nn::LatentCache<float>>;

/// The weights' names as AttentionWeights spells them (x·W orientation, [in, out]).
const char* const weight_names[] = {"Wq", "Wk", "Wv", "Wo", "W_dkv", "Wq_rope", "Wk_rope", "W_qa"};
const char* const vector_names[] = {"bq", "bk", "bv", "bo", "kv_norm", "q_norm"};
const char* const config_names[] = {"n_q", "n_kv", "head_dim", "v_head_dim", "causal", "rope_theta",
                                    "rope_dim", "rope_dim_theta", "scale", "norm_eps"};

template <typename Names>
bool named(const Names& names, const std::string& key) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return key == n; });
}

struct Attention : torch::CustomClassHolder {
  AnyStorage<bd::nn::BDAttention> layer;

  explicit Attention(AnyStorage<bd::nn::BDAttention> l) : layer(std::move(l)) {}

  /// From a dense layer: `weights` by AttentionWeights' names (Wq, Wk, Wv, Wo; biases bq … bo;
  /// MLA's W_dkv, kv_norm, Wq_rope, Wk_rope; query LoRA's W_qa, q_norm), `config` by
  /// AttentionConfig's (n_q, n_kv, head_dim, …), `options` mode, basis, windows, storage, force.
  /// An unknown name is refused, so a feature bd does not implement never goes unnoticed.
  static c10::intrusive_ptr<Attention> prepare(const c10::Dict<std::string, at::Tensor>& weights,
                                               const c10::Dict<std::string, double>& config,
                                               const c10::Dict<std::string, std::string>& options) {
    bd::nn::AttentionWeights<double> w;
    Eigen::MatrixXd* matrices[] = {&w.Wq, &w.Wk, &w.Wv, &w.Wo, &w.W_dkv, &w.Wq_rope, &w.Wk_rope, &w.W_qa};
    Eigen::VectorXd* vectors[] = {&w.bq, &w.bk, &w.bv, &w.bo, &w.kv_norm, &w.q_norm};
    for (const auto& item : weights) {
      const std::string& key = item.key();
      const auto m = std::find(std::begin(weight_names), std::end(weight_names), key);
      const auto v = std::find(std::begin(vector_names), std::end(vector_names), key);
      if (m != std::end(weight_names)) *matrices[m - std::begin(weight_names)] = weight(item.value(), key);
      else if (v != std::end(vector_names)) *vectors[v - std::begin(vector_names)] = vector(item.value(), key);
      else
        throw bd::RefusedError(message("bd_torch: attention weight '", key,
                                       "' is not one bd implements (Wq, Wk, Wv, Wo, bq, bk, bv, bo, W_dkv, kv_norm, "
                                       "Wq_rope, Wk_rope, W_qa, q_norm)"));
    }
    bd::nn::AttentionConfig c;
    for (const auto& item : config) {
      const std::string& key = item.key();
      const double value = item.value();
      if (!named(config_names, key))
        throw bd::RefusedError(message("bd_torch: attention setting '", key,
                                       "' is not one bd implements (n_q, n_kv, head_dim, v_head_dim, causal, rope_theta, "
                                       "rope_dim, rope_dim_theta, scale, norm_eps)"));
      const auto count = [&] {
        if (value != std::floor(value) || value < 0) throw bd::RangeError(message("bd_torch: ", key, " = ", value, ": expected a count"));
        return Index(value);
      };
      if (key == "n_q") c.n_q = count();
      else if (key == "n_kv") c.n_kv = count();
      else if (key == "head_dim") c.head_dim = count();
      else if (key == "v_head_dim") c.v_head_dim = count();
      else if (key == "rope_dim") c.rope_dim = count();
      else if (key == "causal") c.causal = value != 0;
      else if (key == "rope_theta") c.rope_theta = value;
      else if (key == "rope_dim_theta") c.rope_dim_theta = value;
      else if (key == "scale") c.scale = value;
      else c.norm_eps = value;
    }
    bd::nn::BDAttentionOptions opts;
    std::string storage = "f32";
    for (const auto& item : options) {
      const std::string& key = item.key();
      const std::string& value = item.value();
      if (key == "mode") opts.mode = bd::nn::parse_mode(value);
      else if (key == "basis") opts.decomposition.basis = bd::parse_basis(value);
      else if (key == "windows") opts.windows = bd::nn::parse_windows(value);
      else if (key == "storage") storage = value;
      else if (key == "force") opts.force = value == "true";
      else
        throw bd::RefusedError(message("bd_torch: attention option '", key, "' is not one of mode, basis, windows, storage, force"));
    }
    const bd::nn::MultiHeadAttention<double> dense(c, std::move(w));
    return c10::make_intrusive<Attention>(make_layer<bd::nn::BDAttention>(layer_storage(storage), [&](auto tag) {
      using S = typename decltype(tag)::type;
      return AnyStorage<bd::nn::BDAttention>(bd::nn::BDAttention<S>::prepare(dense, opts));
    }));
  }

  /// Attention layer `index` (0-based) of a BD checkpoint that bd-convert (or convert below)
  /// wrote, its tensors read through bd's hardened safetensors parser and checked against the
  /// checkpoint's config.json; stored in `storage` (exact when the file holds that type).
  static c10::intrusive_ptr<Attention> load(const std::string& path, std::int64_t index, const std::string& storage) {
    if (index < 0) throw bd::RangeError(message("bd_torch: layer ", index, " requested; layers count from 0"));
    return c10::make_intrusive<Attention>(make_layer<bd::nn::BDAttention>(layer_storage(storage), [&](auto tag) {
      using S = typename decltype(tag)::type;
      return AnyStorage<bd::nn::BDAttention>(bd::io::load_bd_attention_layer<S>(path, static_cast<std::size_t>(index)));
    }));
  }

  bool latent() const { return std::visit([](const auto& l) { return l.rest().W_dkv.size() != 0; }, layer); }

  at::Tensor forward(const at::Tensor& x) const {
    at::Tensor keep;
    const View in = activation(x, "x", keep);
    return in_type_of(x, std::visit([&](const auto& l) { return l.forward(in); }, layer));
  }
  at::Tensor decode(const at::Tensor& x, const c10::intrusive_ptr<KVCache>& cache) const {
    at::Tensor keep;
    const View in = activation(x, "x", keep);
    return in_type_of(x, std::visit([&](const auto& l) { return l.decode(in, cache->cache); }, layer));
  }
  at::Tensor prefill(const at::Tensor& x, const c10::intrusive_ptr<LatentCache>& cache) const {
    at::Tensor keep;
    const View in = activation(x, "x", keep);
    return in_type_of(x, std::visit([&](const auto& l) { return l.prefill(in, cache->cache); }, layer));
  }
  at::Tensor decode_absorbed(const at::Tensor& x, const c10::intrusive_ptr<LatentCache>& cache) const {
    at::Tensor keep;
    const View in = activation(x, "x", keep);
    return in_type_of(x, std::visit([&](const auto& l) { return l.decode_absorbed(in, cache->cache); }, layer));
  }
  void set_compute(const std::string& compute) {
    std::visit([&](auto& l) { l.set_compute(bd::kernel::parse_compute(compute)); }, layer);
  }
  std::string report() const {
    return std::visit(
        [](const auto& l) {
          const auto family = [](const char* name, const bd::nn::ProductReport& r) {
            if (!r.decomposed) return message(name, ": dense");
            return message(name, ": basis ", bd::to_string(r.chosen), ", ", r.window, ", max nmse ", r.max_nmse);
          };
          std::string out = message(family("QK", l.qk_report()), "; ", family("VO", l.vo_report()), "; ", l.cost().describe());
          for (const auto& w : l.warnings()) out += "; " + w;
          return out;
        },
        layer);
  }
};

// ---------------------------------------------------------------------------------------------
// Projection: the fused BD projection out_h = z[:, S_h] + z[:, R_h]·C_h (a key or value
// projection of BDAttention, on its own), its coefficients stored once.

struct Projection : torch::CustomClassHolder {
  bd::nn::HeadIndices idx;
  std::variant<bd::nn::StoredMatrix<float>, bd::nn::StoredMatrix<Eigen::half>, bd::nn::StoredMatrix<Eigen::bfloat16>> C;

  /// C ((d_in − d) × heads·d, in the type it is stored in: float32, float16 or bfloat16) and
  /// each head's basis channels (heads × d, or 1 × d for a window every head shares).
  static c10::intrusive_ptr<Projection> create(const at::Tensor& C, const at::Tensor& basis, std::int64_t input_dim) {
    require_matrix(basis, "basis");
    if (basis.scalar_type() != at::kLong)
      throw bd::RefusedError(message("bd_torch: basis is ", type_name(basis.scalar_type()), "; expected int64 channel indices"));
    const at::Tensor b = basis.contiguous();
    const std::int64_t* at = b.data_ptr<std::int64_t>();
    require_matrix(C, "C");
    // One row: a window every head shares, as many heads as C has blocks of d columns.
    const Index d = b.size(1), n = b.size(0) == 1 && d > 0 ? std::max<Index>(C.size(1) / d, 1) : b.size(0);
    std::vector<std::vector<Index>> heads(static_cast<std::size_t>(n));
    for (Index h = 0; h < n; ++h) {
      const std::int64_t* row = at + (b.size(0) == 1 ? 0 : h) * d;
      heads[static_cast<std::size_t>(h)].assign(row, row + d);
    }
    auto out = c10::make_intrusive<Projection>();
    out->idx = bd::nn::HeadIndices::from_basis(std::move(heads), input_dim);
    const auto store = [&](auto tag) {
      using S = typename decltype(tag)::type;
      const at::Tensor column_major = C.t().contiguous();  // C's columns, each contiguous
      out->C = bd::nn::StoredMatrix<S>(Eigen::Map<const bd::nn::StoredMatrix<S>>(
          reinterpret_cast<const S*>(column_major.data_ptr()), C.size(0), C.size(1)));
    };
    switch (C.scalar_type()) {
      case at::kFloat: store(bd::type_tag<float>{}); break;
      case at::kHalf: store(bd::type_tag<Eigen::half>{}); break;
      case at::kBFloat16: store(bd::type_tag<Eigen::bfloat16>{}); break;
      default:
        throw bd::RefusedError(message("bd_torch: C is ", type_name(C.scalar_type()), "; expected float32, float16 or bfloat16"));
    }
    const Index rows = std::visit([](const auto& c) { return c.rows(); }, out->C);
    const Index cols = std::visit([](const auto& c) { return c.cols(); }, out->C);
    if (rows != input_dim - out->idx.head_dim || cols != out->idx.heads() * out->idx.head_dim)
      throw bd::ShapeError(message("bd_torch: C is ", rows, "x", cols, "; expected (input_dim − d) x (heads·d) = ",
                                   input_dim - out->idx.head_dim, "x", out->idx.heads() * out->idx.head_dim,
                                   " for ", out->idx.heads(), " heads of ", out->idx.head_dim, " basis channels"));
    return out;
  }

  at::Tensor forward(const at::Tensor& z, const std::string& compute) const {
    at::Tensor keep;
    const View in = activation(z, "z", keep);
    return result_for(z, in.rows(), idx.heads() * idx.head_dim, [&](Eigen::Ref<Matrix> out) { project(in, out, compute); });
  }

  /// The same into `out` (L × heads·d, float32, column-major: strides (1, ≥ L)), which a serving
  /// loop allocates once: a fresh result of that size costs its page faults on every call.
  void forward_into(const at::Tensor& z, const at::Tensor& out, const std::string& compute) const {
    at::Tensor keep;
    const View in = activation(z, "z", keep);
    require_matrix(out, "out");
    const Index rows = out.size(0), cols = out.size(1);
    if (out.scalar_type() != at::kFloat || (rows > 1 && out.stride(0) != 1) || (cols > 1 && out.stride(1) < rows))
      throw bd::RefusedError("bd_torch: out must be a float32 column-major tensor (strides (1, >= rows)): "
                             "torch.empty(cols, rows).t()");
    if (rows != in.rows() || cols != idx.heads() * idx.head_dim)
      throw bd::ShapeError(message("bd_torch: out is ", rows, "x", cols, "; expected ", in.rows(), "x", idx.heads() * idx.head_dim));
    Eigen::Map<Matrix, 0, Eigen::OuterStride<>> o(out.data_ptr<float>(), rows, cols,
                                                  Eigen::OuterStride<>(std::max<Index>(cols > 1 ? out.stride(1) : rows, std::max<Index>(rows, 1))));
    project(in, o, compute);
  }

 private:
  void project(const View& in, Eigen::Ref<Matrix> out, const std::string& compute) const {
    const Compute arithmetic = bd::kernel::parse_compute(compute);
    std::visit([&](const auto& c) {
      using S = typename std::decay_t<decltype(c)>::Scalar;
      bd::nn::bd_project_into<float, S>(in, idx, c, out, {}, bd::default_workspace(), arithmetic);
    }, C);
  }
};

std::int64_t transposed() { return transposed_inputs.load(); }

/// bd-convert's conversion of a Hugging Face model folder into a BD checkpoint (a folder, or one
/// .safetensors file), written atomically; returns its report as JSON.
std::string convert(const std::string& input, const std::string& output, const std::string& arch, const std::string& mode,
                    const std::string& storage, const std::string& basis, const std::string& windows, bool force) {
  bd::io::ConvertOptions opts;
  opts.arch = bd::io::parse_arch(arch);
  opts.mode = bd::nn::parse_mode(mode);
  opts.storage = bd::parse_storage(storage);
  opts.decomposition.basis = bd::parse_basis(basis);
  opts.windows = bd::nn::parse_windows(windows);
  opts.force = force;
  return bd::io::convert_checkpoint(input, output, opts).to_json().dump();
}

/// How many attention layers the BD checkpoint at `path` has.
std::int64_t checkpoint_layers(const std::string& path) {
  const bd::io::ModelFolder m = bd::io::ModelFolder::open(path);
  const bd::io::ConvertOptions r = bd::io::recorded_options(m);
  return std::int64_t(bd::io::attention_layers(r.arch, m, r.mode).size());
}

}  // namespace bd_torch

TORCH_LIBRARY(bd, m) {
  using namespace bd_torch;
  m.class_<Linear>("Linear")
      .def_static("from_dense", &Linear::from_dense)
      .def_static("from_low_rank", &Linear::from_low_rank)
      .def("forward", &Linear::forward)
      .def("set_compute", &Linear::set_compute)
      .def("compute", &Linear::compute)
      .def("storage", &Linear::storage)
      .def("rank", &Linear::rank)
      .def("in_features", &Linear::in_features)
      .def("out_features", &Linear::out_features)
      .def("parameters", &Linear::parameters)
      .def("report", &Linear::report)
      .def("nmse", &Linear::nmse)
      .def("basis", [](const c10::intrusive_ptr<Linear>& self) { return self->basis(self); })
      .def("coeff", [](const c10::intrusive_ptr<Linear>& self) { return self->coeff(self); })
      .def("basis_columns", &Linear::basis_columns);
  m.class_<KVCache>("KVCache")
      .def(torch::init<std::string>())
      .def("length", &KVCache::length)
      .def("truncate", &KVCache::truncate);
  m.class_<LatentCache>("LatentCache")
      .def(torch::init<std::string>())
      .def("length", &LatentCache::length)
      .def("truncate", &LatentCache::truncate);
  m.class_<Projection>("Projection").def_static("create", &Projection::create).def("forward", &Projection::forward)
      .def("forward_into", &Projection::forward_into);
  m.class_<Attention>("Attention")
      .def_static("prepare", &Attention::prepare)
      .def_static("load", &Attention::load)
      .def("latent", &Attention::latent)
      .def("forward", &Attention::forward)
      .def("decode", &Attention::decode)
      .def("prefill", &Attention::prefill)
      .def("decode_absorbed", &Attention::decode_absorbed)
      .def("set_compute", &Attention::set_compute)
      .def("report", &Attention::report);
  m.def("transposed_inputs() -> int", &transposed);
  m.def("convert(str input, str output, str arch, str mode, str storage, str basis, str windows, bool force) -> str", &convert);
  m.def("checkpoint_layers(str path) -> int", &checkpoint_layers);
}
