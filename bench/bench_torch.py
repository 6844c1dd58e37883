#!/usr/bin/env python3
# bd_torch against plain PyTorch on the same CPU, threads and precision, each pair timed
# in turn (a call of one, then of the other: a drifting machine moves both) and reported as
# medians of the repetitions and the median of each pair's own ratio:
#   kproj/<L>     DeepSeek-V3's key projection from the latent (L × 512 → 128 heads × 128):
#                 torch.matmul's dense product against bd_torch.Projection (a shared window at
#                 channel 256, as bd_bench's kproj), both into outputs allocated once and both
#                 allocating theirs (allocating_*), and bd_bench's own kproj/bd/<L> (the C++
#                 call, when --bd-bench is given) for the extension's overhead
#   prefill/1024  a LLaMA-family attention layer (hidden 4096, 32 query heads on 8 key/value
#                 heads, RoPE, causal) over 1024 tokens: Hugging Face's computation in torch ops
#                 against bd_torch.BDAttention.from_llama of the same nn.Linears
#   decode/<ctx>  the same layer, one token after <ctx> cached tokens: torch with a preallocated
#                 KV cache (keys rotated as cached) and its query heads grouped over their key/value
#                 head (no repeat_kv: faster than Hugging Face's) against BDAttention.decode
# --dtype bfloat16 runs both in bf16 as a bf16 model does: weights, activations and KV caches in
# bf16 (torch's matmuls on oneDNN's bf16 kernels, softmax in float as Hugging Face upcasts it; bd's
# layers with set_compute("bf16") and new_cache("bf16")), bf16 activations in and out; kproj's
# "into" pair then writes bf16 (torch) against float32 (bd, its own type).
# Usage: OMP_NUM_THREADS=2 PYTHONPATH=build/python /usr/bin/python3 bench/bench_torch.py
#            [--repetitions 5] [--bd-bench build/bench/bd_bench] [--dtype bfloat16] [--json out.json]
import argparse
import json
import os
import re
import statistics
import subprocess
import time

import torch

import bd_torch


def pair(first, second, repetitions, inner=1, settle=0.3):
    """Each repetition times `inner` calls of first (torch), then of second (bd). After torch's
    calls the next waits `settle` seconds, untimed: OpenBLAS's threads, which torch's float32
    products run on in Debian's build, spin on both cores for a while after each call and would
    be timed as part of whatever ran next (bd_bench's interleaved benchmarks do the same)."""
    first(), second()
    a, b = [], []
    for _ in range(repetitions):
        for f, out in ((first, a), (second, b)):
            t = time.perf_counter()
            for _ in range(inner):
                f()
            out.append((time.perf_counter() - t) / inner)
            if f is first:
                time.sleep(settle)
    return {"torch_ms": 1e3 * statistics.median(a), "bd_ms": 1e3 * statistics.median(b),
            "speedup": statistics.median(a) / statistics.median(b),
            "paired_speedup": statistics.median(x / y for x, y in zip(a, b))}


def kproj(L, repetitions, dtype):
    d, dh, heads, offset = 512, 128, 128, 256
    c = torch.randn(L, d).to(dtype)
    W = (torch.randn(d, heads * dh) / d ** 0.5).to(dtype)
    C = (torch.randn(d - dh, heads * dh) / d ** 0.5).to(dtype)
    bd = bd_torch.Projection(C, torch.arange(offset, offset + dh).reshape(1, dh), d, compute=compute_of(dtype))
    c_bd = c.t().contiguous().t()  # bd's column-major order, as a bd layer's output hands it on
    # Into outputs allocated once (as bd_bench's C++ call writes), and allocating a result per call
    # (each a fresh 64 MB at L = 1024: its page faults cost as much as the product on these VMs).
    out_torch, out_bd = torch.empty(L, heads * dh, dtype=dtype), torch.empty(heads * dh, L).t()
    r = pair(lambda: torch.matmul(c, W, out=out_torch), lambda: bd(c_bd, out=out_bd), repetitions)
    allocating = pair(lambda: torch.matmul(c, W), lambda: bd(c_bd), repetitions)
    r.update({"allocating_" + k: v for k, v in allocating.items()})
    return r


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


def compute_of(dtype):
    return "bf16" if dtype == torch.bfloat16 else "f32"


def rope_tables(positions, d, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions[:, None].float() * inv[None, :]
    return torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)


class TorchAttention:
    """Hugging Face's LlamaAttention in torch ops (repeat_kv, causal softmax), with a KV cache."""

    def __init__(self, q, k, v, o, n_heads, n_kv):
        self.q, self.k, self.v, self.o, self.n, self.n_kv = q, k, v, o, n_heads, n_kv
        self.d = q.weight.shape[0] // n_heads

    def project(self, x, start):
        L = x.shape[0]
        q = self.q(x).view(L, self.n, self.d).transpose(0, 1)
        k = self.k(x).view(L, self.n_kv, self.d).transpose(0, 1)
        v = self.v(x).view(L, self.n_kv, self.d).transpose(0, 1)
        cos, sin = (t.to(x.dtype) for t in rope_tables(torch.arange(start, start + L), self.d))
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def attend(self, q, k, v, causal):
        group = self.n // self.n_kv
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        s = q @ k.transpose(1, 2) / self.d ** 0.5
        if causal:
            L = q.shape[1]
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        p = s.softmax(-1, dtype=torch.float32).to(q.dtype)
        return self.o((p @ v).transpose(0, 1).reshape(q.shape[1], -1))

    def forward(self, x):
        q, k, v = self.project(x, 0)
        return self.attend(q, k, v, True)

    def decode(self, x, cache, length):
        """One token after `length` cached ones, the cache preallocated (n_kv × capacity × d) and
        the query heads grouped over their key/value head: no copy of the cache, no repeat_kv."""
        q, k, v = self.project(x, length)
        cache[0][:, length], cache[1][:, length] = k[:, 0], v[:, 0]
        keys, values = cache[0][:, :length + 1], cache[1][:, :length + 1]
        q = q.reshape(self.n_kv, self.n // self.n_kv, self.d)
        p = (q @ keys.transpose(1, 2) / self.d ** 0.5).softmax(-1, dtype=torch.float32).to(q.dtype)
        return self.o((p @ values).reshape(1, self.n * self.d))


def llama_layer(hidden=4096, n_heads=32, n_kv=8):
    d = hidden // n_heads
    return [torch.nn.Linear(i, o, bias=False) for i, o in
            ((hidden, n_heads * d), (hidden, n_kv * d), (hidden, n_kv * d), (n_heads * d, hidden))]


def attention(prefill, contexts, repetitions, dtype):
    linears = [linear.to(dtype) for linear in llama_layer()]
    dense = TorchAttention(*linears, 32, 8)
    t = time.perf_counter()
    storage = "bf16" if dtype == torch.bfloat16 else "f32"
    bd = bd_torch.BDAttention.from_llama(*linears, n_heads=32, n_kv_heads=8, rope_theta=10000.0, storage=storage)
    bd.set_compute(compute_of(dtype))
    out = {"prepare_s": time.perf_counter() - t}
    x = torch.randn(prefill, 4096).to(dtype)
    out[f"prefill/{prefill}"] = pair(lambda: dense.forward(x), lambda: bd(x), repetitions)
    for ctx in contexts:
        history = torch.randn(ctx, 4096).to(dtype)
        _, k, v = dense.project(history, 0)
        room = torch.zeros(8, 1, 128, dtype=dtype)
        torch_cache = (torch.cat([k, room], 1), torch.cat([v, room], 1))
        bd_cache = bd.new_cache("bf16" if dtype == torch.bfloat16 else "f32")
        for start in range(0, ctx, 1024):
            bd.decode(history[start:start + 1024], bd_cache)
        token = torch.randn(1, 4096).to(dtype)

        def bd_step():
            bd.decode(token, bd_cache)
            bd_cache.truncate(ctx)

        out[f"decode/{ctx}"] = pair(lambda: dense.decode(token, torch_cache, ctx), bd_step, repetitions, inner=5)
    return out


def bd_bench_kproj(binary, L, repetitions):
    """bd_bench's kproj/bd/<L> median in ms: the same projection called from C++."""
    result = subprocess.run([binary, f"--benchmark_filter=^kproj/bd/{L}/", f"--benchmark_repetitions={repetitions}",
                             "--benchmark_report_aggregates_only=true", "--benchmark_format=json"],
                            capture_output=True, text=True, check=True)
    for b in json.loads(result.stdout)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            return b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1e6
    raise RuntimeError("bd_bench printed no median for kproj/bd/%d" % L)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--bd-bench", help="bd_bench, for the extension's overhead over the C++ call")
    parser.add_argument("--contexts", default="4096,16384")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--json")
    args = parser.parse_args()
    threads = int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads()))
    torch.set_num_threads(threads)
    cpu = next((re.sub(r".*:\s*", "", line).strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    dtype = getattr(torch, args.dtype)
    results = {"torch": torch.__version__, "threads": threads, "cpu": cpu, "dtype": args.dtype}
    with torch.no_grad():
        for L in (1024, 4096):
            r = kproj(L, args.repetitions, dtype)
            if args.bd_bench and dtype == torch.float32:
                r["cpp_bd_ms"] = bd_bench_kproj(args.bd_bench, L, args.repetitions)
                r["overhead"] = r["bd_ms"] / r["cpp_bd_ms"] - 1
            results[f"kproj/{L}"] = r
            print(f"kproj/{L}", json.dumps(r), flush=True)
        for name, r in attention(1024, [int(c) for c in args.contexts.split(",")], args.repetitions, dtype).items():
            results[name] = r
            print(name, json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
