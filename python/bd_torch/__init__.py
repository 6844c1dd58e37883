"""bd for PyTorch: Basis-Decomposition layers equal to their dense originals, on bd's CPU kernels.

    import bd_torch
    fast = bd_torch.BDLinear.from_low_rank(U, V, bias)              # W = U·Vᵀ, exactly
    attn = bd_torch.BDAttention.from_llama(q_proj, k_proj, v_proj, o_proj,
                                           n_heads=32, n_kv_heads=8, rope_theta=10000.0)
    y = attn(x)                                        # x: tokens × hidden, float32 or bfloat16

The layers are TorchScript classes of the compiled extension (torch.classes.bd.*), wrapped here as
torch.nn.Modules. They compute inference: an input that requires a gradient is refused rather
than silently cut from the graph. docs/pytorch.md has the whole story.
"""
import glob
import json
import os

import torch

__all__ = ["BDLinear", "BDAttention", "Projection", "convert", "load_attention", "transposed_inputs"]


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_bd_torch*.so")))
    if not found:
        raise ImportError("bd_torch: its compiled extension (_bd_torch*.so) is not beside " + here +
                          "; build bd with CMake where Torch is installed (docs/pytorch.md)")
    torch.ops.load_library(found[0])


_load()


def transposed_inputs():
    """How many row-major activations were transposed into bd's column-major order so far."""
    return torch.ops.bd.transposed_inputs()


def convert(input_dir, output, *, arch="llama", mode="vo", storage="f32", basis="auto", windows="per-group", force=False):
    """bd-convert from Python: a Hugging Face model folder into a BD checkpoint (a folder, or one
    .safetensors file), streamed and written atomically. Returns bd-convert's report as a dict."""
    return json.loads(torch.ops.bd.convert(str(input_dir), str(output), arch, mode, storage, basis, windows, bool(force)))


def load_attention(path, *, storage="f32"):
    """Every attention layer of a BD checkpoint (what convert or bd-convert wrote), as BDAttention
    modules, read through bd's hardened safetensors parser."""
    return [BDAttention.load(path, i, storage=storage) for i in range(torch.ops.bd.checkpoint_layers(str(path)))]


def _inference_only(x, what):
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(f"bd_torch: {what} requires a gradient, and bd_torch's layers compute inference only "
                           "(no backward): call them under torch.no_grad(), or detach the input")


def _rows(x, width, what):
    """x as a matrix of rows (tokens), and how to give a result its leading dimensions back."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"bd_torch: {what} must be a torch.Tensor")
    _inference_only(x, what)
    if x.dim() == 2:
        return x, lambda y: y
    if x.dim() < 2:
        raise RuntimeError(f"bd_torch: {what} has {x.dim()} dimensions; expected tokens × {width}")
    lead = x.shape[:-1]
    return x.reshape(-1, x.shape[-1]), lambda y: y.reshape(*lead, y.shape[-1])


def _detached(t):
    return None if t is None else t.detach()


class BDLinear(torch.nn.Module):
    """y = x·W + b with a rank-r W stored as r of its columns and the coefficients of the others.

    from_low_rank(U, V) is exact (W = U·Vᵀ); from_linear(linear, rank) first truncates an
    nn.Linear's weight to rank r by SVD (report() gives the truncation's share).
    """

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    @classmethod
    def from_low_rank(cls, U, V, bias=None, *, storage="f32", basis="auto"):
        """U (in × r) and V (out × r): y = x·U·Vᵀ + b."""
        return cls(torch.classes.bd.Linear.from_low_rank(U.detach(), V.detach(), _detached(bias), storage, basis))

    @classmethod
    def from_linear(cls, linear, rank, *, storage="f32", basis="auto"):
        """An nn.Linear (weight out × in) truncated to `rank`."""
        return cls(torch.classes.bd.Linear.from_dense(linear.weight.detach().t(), _detached(linear.bias), int(rank),
                                                      storage, basis))

    def forward(self, x):
        rows, back = _rows(x, self.in_features, "x")
        return back(self.layer.forward(rows))

    def set_compute(self, compute):
        """'f32' (default) or 'bf16': products of bfloat16-rounded operands, summed in float."""
        self.layer.set_compute(compute)
        return self

    @property
    def in_features(self):
        return self.layer.in_features()

    @property
    def out_features(self):
        return self.layer.out_features()

    @property
    def rank(self):
        return self.layer.rank()

    def report(self):
        return self.layer.report()

    def nmse(self):
        """‖W − Ŵ‖²/‖W‖² of the stored B and C, computed in double at preparation."""
        return self.layer.nmse()

    def basis(self):
        """B (in × r), a view of the layer's storage (column-major)."""
        return self.layer.basis()

    def coeff(self):
        """C (r × (out − r)), a view of the layer's storage (column-major)."""
        return self.layer.coeff()

    def basis_columns(self):
        """The output columns S that B gives directly."""
        return self.layer.basis_columns()

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, "
                f"storage={self.layer.storage()}, compute={self.layer.compute()}")


class BDAttention(torch.nn.Module):
    """Attention with its QK and/or VO products basis-decomposed, equal to the dense layer.

    Weights in bd's orientation, x·W ([in, out]; an nn.Linear's weight transposed), by bd's
    names: Wq, Wk, Wv, Wo, biases bq, bk, bv, bo; MLA's W_dkv, kv_norm, Wq_rope, Wk_rope; query
    LoRA's W_qa, q_norm. forward(x) attends over one sequence (tokens × hidden; a leading batch
    dimension runs sequence by sequence); decode(x, cache) appends tokens to a KV cache;
    prefill / decode_absorbed read an MLA layer's latent cache.
    """

    def __init__(self, layer):
        super().__init__()
        self.layer = layer
        self.latent = layer.latent()

    @classmethod
    def load(cls, path, layer, *, storage="f32"):
        """Attention layer `layer` (from 0) of a BD checkpoint."""
        return cls(torch.classes.bd.Attention.load(str(path), int(layer), storage))

    @classmethod
    def from_weights(cls, weights, *, n_heads, head_dim, n_kv_heads=None, v_head_dim=0, causal=True, rope_theta=0.0,
                     rope_dim=0, rope_dim_theta=10000.0, scale=0.0, norm_eps=1e-6, mode=None, basis="auto",
                     windows="per-group", storage="f32", force=False):
        """mode: 'qk', 'vo' or 'qkvo'; by default 'vo' under vanilla RoPE (QK is not exact there) and
        'qkvo' otherwise."""
        if mode is None:
            mode = "vo" if rope_theta > 0 else "qkvo"
        config = {"n_q": n_heads, "n_kv": n_kv_heads or n_heads, "head_dim": head_dim, "v_head_dim": v_head_dim,
                  "causal": 1.0 if causal else 0.0, "rope_theta": rope_theta, "rope_dim": rope_dim,
                  "rope_dim_theta": rope_dim_theta, "scale": scale, "norm_eps": norm_eps}
        options = {"mode": mode, "basis": basis, "windows": windows, "storage": storage,
                   "force": "true" if force else "false"}
        tensors = {k: v.detach() for k, v in weights.items() if v is not None}
        layer = torch.classes.bd.Attention.prepare(tensors, {k: float(v) for k, v in config.items()}, options)
        return cls(layer)

    @classmethod
    def from_llama(cls, q_proj, k_proj, v_proj, o_proj, *, n_heads, n_kv_heads=None, rope_theta=10000.0,
                   rope_scaling=None, causal=True, **options):
        """A LLaMA-family attention (Hugging Face's q/k/v/o_proj nn.Linears; biases as Qwen2 has
        them), rotate_half RoPE. rope_scaling other than None is refused: bd_torch does not read it yet."""
        if rope_scaling is not None:
            raise RuntimeError(f"bd_torch: rope_scaling {rope_scaling!r} is not implemented by bd_torch's from_llama; "
                               "convert the checkpoint with bd-convert, which reads llama3 and linear scaling")
        weights = {"Wq": q_proj.weight.t(), "Wk": k_proj.weight.t(), "Wv": v_proj.weight.t(), "Wo": o_proj.weight.t(),
                   "bq": q_proj.bias, "bk": k_proj.bias, "bv": v_proj.bias, "bo": o_proj.bias}
        head_dim = q_proj.weight.shape[0] // n_heads
        return cls.from_weights(weights, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim, causal=causal,
                                rope_theta=rope_theta, **options)

    def new_cache(self, storage="f32"):
        """An empty cache for decode (KV) or, for an MLA layer, prefill/decode_absorbed (latent),
        stored in "f32" or "bf16" (half the bytes a token reads)."""
        if self.latent:
            return torch.classes.bd.LatentCache(storage)
        return torch.classes.bd.KVCache(storage)

    def _each(self, x, step):
        _inference_only(x, "x")
        if x.dim() == 3:
            return torch.stack([step(s) for s in x.unbind(0)])
        return step(x)

    def forward(self, x):
        return self._each(x, self.layer.forward)

    def decode(self, x, cache):
        _inference_only(x, "x")
        return self.layer.decode(x, cache)

    def prefill(self, x, cache):
        _inference_only(x, "x")
        return self.layer.prefill(x, cache)

    def decode_absorbed(self, x, cache):
        _inference_only(x, "x")
        return self.layer.decode_absorbed(x, cache)

    def set_compute(self, compute):
        self.layer.set_compute(compute)
        return self

    def report(self):
        return self.layer.report()


class Projection(torch.nn.Module):
    """The fused BD projection out_h = z[:, S_h] + z[:, R_h]·C_h: BDAttention's key or value
    projection on its own. C ((d_in − d) × heads·d) is stored once in its dtype (float32, float16
    or bfloat16); basis: each head's channels S_h (heads × d int64, or 1 × d for one window)."""

    def __init__(self, C, basis, input_dim, compute="f32"):
        super().__init__()
        self.projection = torch.classes.bd.Projection.create(C.detach(), basis, int(input_dim))
        self.compute = compute

    def forward(self, z, out=None):
        """out: a float32 column-major (torch.empty(cols, rows).t()) tensor to write into, allocated
        once by a caller that calls often (a fresh large result costs its page faults every call)."""
        _inference_only(z, "z")
        if out is None:
            return self.projection.forward(z, self.compute)
        self.projection.forward_into(z, out, self.compute)
        return out
