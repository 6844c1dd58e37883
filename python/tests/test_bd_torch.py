# bd_torch against plain PyTorch: each layer equal to the same computation written in torch ops
# (float64 the reference), within a multiple of the dense float32 layer's own error over that
# reference; a LLaMA attention as Hugging Face computes it; stories260K converted, its logits
# and greedy text; the refusals, and the tensors that must not be copied.
import json
import os
import struct

import pytest
import torch

import bd_torch

torch.manual_seed(0)
MODELS = os.environ.get("BD_MODELS", os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models"))


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


# ---------------------------------------------------------------------------------------------
# Linear layers

def rebuilt(layer):
    """Ŵ = B·[I, C] with its columns in place, in double, from the tensors the layer exposes."""
    B, C, S = layer.basis().double(), layer.coeff().double(), layer.basis_columns()
    rest = torch.tensor(sorted(set(range(layer.out_features)) - set(S.tolist())), dtype=torch.long)
    W = torch.empty(layer.in_features, layer.out_features, dtype=torch.float64)
    W[:, S], W[:, rest] = B, B @ C
    return W


@pytest.mark.parametrize("storage", ["f32", "f16", "bf16"])
def test_linear_from_low_rank_computes_x_times_its_stored_decomposition(storage):
    d_in, d_out, r, L = 96, 80, 12, 33
    U, V, b = torch.randn(d_in, r, dtype=torch.float64), torch.randn(d_out, r, dtype=torch.float64), torch.randn(d_out)
    x = torch.randn(L, d_in)
    layer = bd_torch.BDLinear.from_low_rank(U, V, b, storage=storage)
    assert (layer.in_features, layer.out_features, layer.rank) == (d_in, d_out, r)
    W = U @ V.t()
    # What is stored: Ŵ from B and C, whose distance from W the report gives (in double).
    W_hat = rebuilt(layer)
    # (bd sums the report in its own order: agreement to 0.1 %, or 1e-9 where both are rounding-small)
    assert abs(((W_hat - W).pow(2).sum() / W.pow(2).sum()).item() - layer.nmse()) <= 1e-3 * layer.nmse() + 1e-9
    # What is computed: x·Ŵ + b (b stored in the layer's type too) within float32 arithmetic's
    # error, measured on the dense float32 product x·W + b against its own double value.
    stored_b = b.to({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[storage]).double()
    reference = x.double() @ W_hat + stored_b
    dense_err = max_err(x @ W.float() + b, x.double() @ W + b.double())
    y = layer(x)
    assert y.shape == (L, d_out) and y.dtype == torch.float32
    assert max_err(y, reference) <= 4 * dense_err


def test_linear_from_nn_linear_truncates_to_its_rank_and_keeps_batch_dimensions():
    # A weight of rank 6 (a merged LoRA): truncating to 6 loses nothing.
    lin = torch.nn.Linear(40, 24)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, 6) @ torch.randn(6, 40))
    layer = bd_torch.BDLinear.from_linear(lin, 6)
    x = torch.randn(3, 5, 40)
    with torch.no_grad():
        reference = torch.nn.functional.linear(x.double(), lin.weight.double(), lin.bias.double())
        dense = lin(x)
        y = layer(x)
    assert y.shape == (3, 5, 24)
    assert max_err(y, reference) <= 4 * max_err(dense, reference)
    assert "truncation" in layer.report()


def test_linear_bf16_compute_stays_within_twice_its_low_rank_twins_bf16_error():
    # The C++ suite's claim (tests/test_bf16_layers.cpp): the twin x·U·Vᵀ in bf16 rounds x and
    # x·U once each, as BD rounds x and x·B.
    d_in, d_out, r, L = 128, 96, 16, 64
    U, V = torch.randn(d_in, r, dtype=torch.float64) / 8, torch.randn(d_out, r, dtype=torch.float64) / 4
    x = torch.randn(L, d_in)
    layer = bd_torch.BDLinear.from_low_rank(U, V, storage="bf16", basis="pivoted").set_compute("bf16")
    reference = x.double() @ U @ V.t()
    bf = lambda t: t.bfloat16().float()
    twin = bf(bf(x) @ bf(U)) @ bf(V).t()
    assert max_err(twin, reference) > 1e-3
    assert max_err(layer(x), reference) <= 2 * max_err(twin, reference)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("compute", ["f32", "bf16"])
def test_half_activations_come_back_in_their_type_rounded_once(dtype, compute):
    # A bf16 or f16 input is widened exactly and its result rounded once into its type: the same
    # bits as the float32 input of the same values, rounded by torch.
    layer = bd_torch.BDLinear.from_low_rank(torch.randn(48, 6), torch.randn(40, 6), torch.randn(40),
                                            storage="bf16").set_compute(compute)
    x = torch.randn(2, 7, 48).to(dtype)
    with torch.no_grad():
        y = layer(x)
        assert y.dtype == dtype and y.shape == (2, 7, 40)
        assert torch.equal(y, layer(x.float()).to(dtype))
        assert torch.equal(layer(x[0, :1]), layer(x[0, :1].float()).to(dtype))  # one token, read in place
        projection = bd_torch.Projection(torch.randn(40, 24), torch.arange(4, 12).reshape(1, 8), 48, compute=compute)
        assert torch.equal(projection(x[0]), projection(x[0].float()).to(dtype))
        attn = bd_torch.BDAttention.from_llama(*gqa_layer(bias=False), n_heads=8, n_kv_heads=4, rope_theta=10000.0)
        attn.set_compute(compute)
        h = torch.randn(5, 64).to(dtype)
        assert torch.equal(attn(h), attn(h.float()).to(dtype))
        cache, float_cache = attn.new_cache(), attn.new_cache()
        for i in range(5):
            assert torch.equal(attn.decode(h[i:i + 1], cache), attn.decode(h[i:i + 1].float(), float_cache).to(dtype))


def test_a_bf16_models_linear_replaced_by_bd_gives_its_outputs_bit_for_bit_where_sums_are_exact():
    # W = U·[I, M] with small integers: B = U and C = M hold it exactly in bf16 (M's entries are ±1:
    # C, fitted in double, is M within 1e-16, which rounding to bf16 removes from any entry but a
    # zero), and every product and sum of integer activations is an integer a float holds
    # (|x·U| <= 64, |y| <= 256, where bf16 still holds every integer): any order gives the same
    # bits, as oneDNN's own tests check.
    d_in, d_out, r, L = 16, 24, 4, 9
    U = torch.randint(-2, 3, (d_in, r)).double()
    M = torch.randint(0, 2, (r, d_out - r)).double() * 2 - 1
    V = torch.cat([torch.eye(r, dtype=torch.float64), M], 1).t()       # out × r: W = U·Vᵀ = [U, U·M]
    dense = torch.nn.Linear(d_in, d_out, bias=False).bfloat16()
    with torch.no_grad():
        dense.weight.copy_((U @ V.t()).t())
    layer = bd_torch.BDLinear.from_low_rank(U, V, storage="bf16", basis="first").set_compute("bf16")
    x = torch.randint(-2, 3, (L, d_in)).bfloat16()
    with torch.no_grad():
        expected = dense(x)
        y = layer(x)
    assert y.dtype == torch.bfloat16 and expected.abs().max() > 16
    assert torch.equal(y, expected)


# ---------------------------------------------------------------------------------------------
# The fused projection

def test_projection_adds_the_basis_window_into_the_product_of_the_rest():
    L, d_in, d, heads, offset = 50, 64, 16, 4, 24
    z = torch.randn(L, d_in)
    C = torch.randn(d_in - d, heads * d)
    window = torch.arange(offset, offset + d).reshape(1, d)
    rest = torch.cat([torch.arange(0, offset), torch.arange(offset + d, d_in)])
    out = bd_torch.Projection(C, window, d_in)(z)
    reference = torch.cat([z.double()[:, offset:offset + d] + z.double()[:, rest] @ C.double()[:, h * d:(h + 1) * d]
                           for h in range(heads)], 1)
    dense = torch.cat([z[:, offset:offset + d] + z[:, rest] @ C[:, h * d:(h + 1) * d] for h in range(heads)], 1)
    assert max_err(out, reference) <= 4 * max_err(dense, reference)


def test_projection_into_a_callers_output_gives_the_same_bits():
    z, C = torch.randn(30, 40), torch.randn(32, 24)
    projection = bd_torch.Projection(C, torch.arange(4, 12).reshape(1, 8), 40)
    out = torch.empty(24, 30).t()
    assert projection(z, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out, projection(z))
    refused("column-major", lambda: projection(z, out=torch.empty(30, 24)))
    refused("expected 30x24", lambda: projection(z, out=torch.empty(24, 29).t()))


def test_projection_per_head_pivoted_bases():
    L, d_in, d, heads = 20, 32, 8, 3
    z = torch.randn(L, d_in)
    basis = torch.stack([torch.randperm(d_in)[:d].sort().values for _ in range(heads)])
    C = torch.randn(d_in - d, heads * d)
    out = bd_torch.Projection(C, basis, d_in)(z)
    parts = []
    for h in range(heads):
        S = basis[h]
        R = torch.tensor(sorted(set(range(d_in)) - set(S.tolist())))
        parts.append(z.double()[:, S] + z.double()[:, R] @ C.double()[:, h * d:(h + 1) * d])
    assert max_err(out, torch.cat(parts, 1)) <= 1e-4


# ---------------------------------------------------------------------------------------------
# Attention: a LLaMA block's attention as Hugging Face computes it

def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def llama_attention(x, q_proj, k_proj, v_proj, o_proj, n_heads, n_kv, theta, dtype):
    """Hugging Face's LlamaAttention (no cache, causal), in `dtype`."""
    L, hidden = x.shape
    d = q_proj.weight.shape[0] // n_heads
    lin = lambda m, t: torch.nn.functional.linear(t, m.weight.to(dtype), None if m.bias is None else m.bias.to(dtype))
    x = x.to(dtype)
    q = lin(q_proj, x).view(L, n_heads, d).transpose(0, 1)
    k = lin(k_proj, x).view(L, n_kv, d).transpose(0, 1)
    v = lin(v_proj, x).view(L, n_kv, d).transpose(0, 1)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(L, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dtype), torch.cat([ang.sin()] * 2, -1).to(dtype)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k, v = k.repeat_interleave(n_heads // n_kv, 0), v.repeat_interleave(n_heads // n_kv, 0)
    s = q @ k.transpose(1, 2) / d ** 0.5
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(0, 1).reshape(L, n_heads * d)
    return lin(o_proj, o)


def gqa_layer(hidden=64, n_heads=8, n_kv=4, bias=True):
    d = hidden // n_heads
    return (torch.nn.Linear(hidden, n_heads * d, bias=bias), torch.nn.Linear(hidden, n_kv * d, bias=bias),
            torch.nn.Linear(hidden, n_kv * d, bias=bias), torch.nn.Linear(n_heads * d, hidden, bias=bias))


def test_llama_gqa_attention_with_biases_equals_hugging_faces():
    projections, theta = gqa_layer(), 10000.0
    x = torch.randn(37, 64)
    attn = bd_torch.BDAttention.from_llama(*projections, n_heads=8, n_kv_heads=4, rope_theta=theta)
    with torch.no_grad():
        reference = llama_attention(x, *projections, 8, 4, theta, torch.float64)
        dense = llama_attention(x, *projections, 8, 4, theta, torch.float32)
        y = attn(x)
    assert max_err(y, reference) <= 4 * max_err(dense, reference)
    assert "VO: basis" in attn.report() and "QK: dense" in attn.report()


def test_attention_decoding_token_by_token_equals_the_whole_sequence():
    projections = gqa_layer(bias=False)
    attn = bd_torch.BDAttention.from_llama(*projections, n_heads=8, n_kv_heads=4, rope_theta=10000.0)
    x = torch.randn(12, 64)
    with torch.no_grad():
        whole = attn(x)
        cache = attn.new_cache()
        steps = torch.cat([attn.decode(x[i:i + 1], cache) for i in range(12)])
    assert cache.length() == 12
    assert max_err(steps, whole) <= 1e-5
    # A bf16 cache: keys and values rounded once (2⁻⁹ relative), the output within a few of that.
    with torch.no_grad():
        cache = attn.new_cache("bf16")
        steps = torch.cat([attn.decode(x[i:i + 1], cache) for i in range(12)])
    assert 1e-5 < max_err(steps, whole) <= 2 ** -6 * whole.abs().max().item()
    with pytest.raises(RuntimeError, match="f16 storage is not implemented"):
        attn.new_cache("f16")


def test_mla_absorbed_decoding_equals_its_prefill():
    hidden, heads, d, latent, rope = 48, 4, 8, 24, 4
    w = lambda *s: torch.randn(*s) / s[0] ** 0.5
    weights = {"Wq": w(hidden, heads * d), "Wq_rope": w(hidden, heads * rope), "W_dkv": w(hidden, latent),
               "Wk_rope": w(hidden, rope), "kv_norm": torch.rand(latent) + 0.5, "Wk": w(latent, heads * d),
               "Wv": w(latent, heads * d), "Wo": w(heads * d, hidden)}
    attn = bd_torch.BDAttention.from_weights(weights, n_heads=heads, head_dim=d, rope_dim=rope)
    x = torch.randn(9, hidden)
    with torch.no_grad():
        whole = attn(x)
        cache = attn.new_cache()
        first = attn.prefill(x[:5], cache)
        rest = torch.cat([attn.decode_absorbed(x[i:i + 1], cache) for i in range(5, 9)])
    assert max_err(torch.cat([first, rest]), whole) <= 1e-5
    # A bf16 latent cache: the latent rounded once (2⁻⁹ relative), the output within a few of that.
    with torch.no_grad():
        cache = attn.new_cache("bf16")
        first = attn.prefill(x[:5], cache)
        rest = torch.cat([attn.decode_absorbed(x[i:i + 1], cache) for i in range(5, 9)])
    error = max_err(torch.cat([first, rest]), whole)
    assert 1e-5 < error <= 2 ** -6
    with pytest.raises(RuntimeError, match="f16 storage is not implemented"):
        attn.new_cache("f16")


# ---------------------------------------------------------------------------------------------
# stories260K: a real trained LLaMA, converted

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    types = {"F32": torch.float32, "I32": torch.int32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=types[info["dtype"]]).reshape(info["shape"])
    return out


class Stories:
    """stories260K in plain torch (Hugging Face's LLaMA), with its attention optionally bd_torch's."""

    def __init__(self, dtype, bd=False):
        folder = os.path.join(MODELS, "stories260K")
        self.config = json.load(open(os.path.join(folder, "config.json")))
        self.w = {k: v.to(dtype) for k, v in read_safetensors(os.path.join(folder, "model.safetensors")).items()}
        self.dtype, self.bd = dtype, []
        c = self.config
        if bd:
            for i in range(c["num_hidden_layers"]):
                linears = [self.linear(f"model.layers.{i}.self_attn.{p}_proj") for p in "qkvo"]
                self.bd.append(bd_torch.BDAttention.from_llama(*linears, n_heads=c["num_attention_heads"],
                                                               n_kv_heads=c["num_key_value_heads"],
                                                               rope_theta=c["rope_theta"]))

    def linear(self, name):
        weight = self.w[name + ".weight"]
        lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        lin.weight = torch.nn.Parameter(weight.float(), requires_grad=False)
        return lin

    def norm(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config["rms_norm_eps"]) * g

    def logits(self, tokens):
        c, w = self.config, self.w
        x = w["model.embed_tokens.weight"][tokens]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self.norm(x, w[p + "input_layernorm.weight"])
            if self.bd:
                a = self.bd[i](h.float()).to(self.dtype)
            else:
                linears = [self.linear(p + f"self_attn.{q}_proj") for q in "qkvo"]
                a = llama_attention(h, *linears, c["num_attention_heads"], c["num_key_value_heads"], c["rope_theta"],
                                    self.dtype)
            x = x + a
            h = self.norm(x, w[p + "post_attention_layernorm.weight"])
            gate = h @ w[p + "mlp.gate_proj.weight"].t()
            x = x + (torch.nn.functional.silu(gate) * (h @ w[p + "mlp.up_proj.weight"].t())) @ w[p + "mlp.down_proj.weight"].t()
        return self.norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].t()

    def greedy(self, prompt, n):
        tokens = list(prompt)
        for _ in range(n):
            tokens.append(int(self.logits(torch.tensor(tokens))[-1].argmax()))
        return tokens


@pytest.fixture(scope="module")
def reference():
    return read_safetensors(os.path.join(MODELS, "stories260K", "reference.safetensors"))


def test_stories260k_in_torch_matches_its_reference_logits(reference):
    # The plain-torch model above is the model: float64 against the shipped float64 reference.
    with torch.no_grad():
        logits = Stories(torch.float64).logits(reference["tokens"].long())
    assert max_err(logits, reference["logits"]) <= 1e-5


def test_stories260k_with_bd_attention_keeps_its_logits_and_its_greedy_text(reference):
    tokens = reference["tokens"].long()
    with torch.no_grad():
        dense, converted = Stories(torch.float32), Stories(torch.float32, bd=True)
        dense_err = max_err(dense.logits(tokens), reference["logits"])
        bd_err = max_err(converted.logits(tokens), reference["logits"])
        assert bd_err <= 4 * dense_err
        prompt = tokens[:8].tolist()
        assert converted.greedy(prompt, 40) == dense.greedy(prompt, 40)


def test_stories260k_converted_to_a_bd_checkpoint_and_loaded_back_writes_the_same_text(reference, tmp_path):
    folder = os.path.join(MODELS, "stories260K")
    report = bd_torch.convert(folder, tmp_path / "bd", arch="llama", mode="vo")
    assert len(report["layers"]) == 5 and report["files_out"] >= 1
    layers = bd_torch.load_attention(tmp_path / "bd")
    assert len(layers) == 5 and not layers[0].latent
    tokens = reference["tokens"].long()
    with torch.no_grad():
        dense, loaded = Stories(torch.float32), Stories(torch.float32)
        loaded.bd = layers
        assert max_err(loaded.logits(tokens), reference["logits"]) <= 4 * max_err(dense.logits(tokens), reference["logits"])
        assert loaded.greedy(tokens[:8].tolist(), 40) == dense.greedy(tokens[:8].tolist(), 40)
    refused("layer 5 requested", lambda: bd_torch.BDAttention.load(tmp_path / "bd", 5))
    refused("architecture", lambda: bd_torch.convert(folder, tmp_path / "x", arch="mamba"))
    refused(str(tmp_path / "missing"), lambda: bd_torch.load_attention(tmp_path / "missing"))


# ---------------------------------------------------------------------------------------------
# Refusals, with bd's messages

def small_linear():
    return bd_torch.BDLinear.from_low_rank(torch.randn(16, 4), torch.randn(12, 4))


def refused(pattern, call):
    with pytest.raises(RuntimeError, match=pattern):
        call()


def test_bad_inputs_are_refused_by_name():
    layer = small_linear()
    refused("float32, bfloat16 or float16", lambda: layer(torch.randn(3, 16, dtype=torch.float64)))
    refused("is Int", lambda: layer(torch.ones(3, 16, dtype=torch.int32)))
    refused("expected 16", lambda: layer(torch.randn(3, 15)))
    refused("on meta", lambda: layer(torch.empty(3, 16, device="meta")))
    refused("neither dimension is contiguous", lambda: layer(torch.randn(6, 32)[::2, ::2]))
    refused("inference only", lambda: layer(torch.randn(3, 16, requires_grad=True)))
    refused("storage type", lambda: bd_torch.BDLinear.from_low_rank(torch.randn(16, 4), torch.randn(12, 4), storage="f8"))
    refused("rank", lambda: bd_torch.BDLinear.from_linear(torch.nn.Linear(8, 8), 9))
    refused("compute type", lambda: layer.set_compute("int8"))
    refused("not finite|NaN|non-finite", lambda: bd_torch.BDLinear.from_low_rank(torch.full((16, 4), float("nan")),
                                                                                torch.randn(12, 4)))
    projections = gqa_layer()
    square = {name: torch.randn(8, 8) for name in ("Wq", "Wk", "Wv", "Wo")}
    refused("sliding_window", lambda: torch.classes.bd.Attention.prepare(
        square, {"n_q": 2.0, "head_dim": 4.0, "sliding_window": 16.0}, {}))
    refused("Wgate", lambda: torch.classes.bd.Attention.prepare({"Wgate": torch.randn(8, 8)}, {}, {}))
    refused("rope_scaling", lambda: bd_torch.BDAttention.from_llama(*projections, n_heads=8, n_kv_heads=4,
                                                                   rope_scaling={"type": "llama3"}))
    refused("RoPE", lambda: bd_torch.BDAttention.from_llama(*projections, n_heads=8, n_kv_heads=4, mode="qkvo"))


# ---------------------------------------------------------------------------------------------
# What must not be copied

def test_results_and_weights_are_not_copied():
    layer = small_linear()
    # The basis and coefficients are views of the layer's storage: the same memory every time.
    assert layer.basis().data_ptr() == layer.basis().data_ptr()
    assert layer.coeff().data_ptr() == layer.coeff().data_ptr()
    before = bd_torch.transposed_inputs()
    y = layer(torch.randn(1, 16))                  # one token: both layouts, read in place
    column_major = torch.randn(16, 5).t()          # strides (1, 5): bd's order
    layer(column_major)
    assert bd_torch.transposed_inputs() == before
    assert y.stride() == (1, 1) or y.stride()[0] == 1
    layer(torch.randn(5, 16))                      # row-major block: transposed once, counted
    assert bd_torch.transposed_inputs() == before + 1
    # A bd result feeds the next bd layer as it is.
    second = bd_torch.BDLinear.from_low_rank(torch.randn(12, 3), torch.randn(7, 3))
    h = layer(column_major)
    second(h)
    assert bd_torch.transposed_inputs() == before + 1
