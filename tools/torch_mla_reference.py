#!/usr/bin/env python3
# DeepSeek-V3's attention written plainly in PyTorch, the yardstick bd's whole layer is measured
# against on the same CPU, same threads, in fp32 or (--dtype bfloat16) as a bf16 model runs: every
# weight, activation and cache in bf16, PyTorch's bf16 matmul (oneDNN) doing the products (by hand:
# needs Debian's python3-torch, which the test suite never does). Shapes as bench/bench_layers.cpp and bench/bench_mla.cpp:
#   prefill  attention/<L>: hidden 7168, 128 heads, latent 512, d_h 128, decoupled RoPE 64, no
#            query LoRA, causal; L × L scores per head, softmax, P·V — what a plain layer does.
#   decode   mla_absorbed/<context>: the same with query LoRA 1536, one token over a latent cache
#            of `context` tokens, queries absorbed into the latent (W_uk per head), values out of
#            it (W_uv per head), every head in one batched product.
# Median of the timed runs after one warm-up; prints one line per step.
#   OMP_NUM_THREADS=2 python3 tools/torch_mla_reference.py [--prefill 1024] [--decode 16384]
#                                                          [--dtype float32|bfloat16]
import argparse
import statistics
import time

import torch

H, N, DN, DR, DV, LAT, QLORA = 7168, 128, 128, 64, 128, 512, 1536
DTYPE = torch.float32


def rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rope(x, pos):
    half = x.shape[-1] // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def weights(rows, cols):
    return ((torch.rand(rows, cols) * 2 - 1) / rows ** 0.5).to(DTYPE)


def timed(step, runs):
    step()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def prefill(L, runs):
    Wq, Wqr, Wdkv, Wkr = weights(H, N * DN), weights(H, N * DR), weights(H, LAT), weights(H, DR)
    Wk, Wv, Wo = weights(LAT, N * DN), weights(LAT, N * DV), weights(N * DV, H)
    x, pos = (torch.rand(L, H) * 2 - 1).to(DTYPE), torch.arange(L)
    mask = torch.ones(L, L, dtype=torch.bool).triu(1)
    scale = (DN + DR) ** -0.5

    def step():
        with torch.no_grad():
            q = (x @ Wq).view(L, N, DN).transpose(0, 1)
            qr = rope((x @ Wqr).view(L, N, DR).transpose(0, 1), pos)
            c, kr = rms(x @ Wdkv), rope(x @ Wkr, pos)
            k = (c @ Wk).view(L, N, DN).transpose(0, 1)
            v = (c @ Wv).view(L, N, DV).transpose(0, 1)
            s = (q @ k.transpose(1, 2) + qr @ kr.T) * scale
            p = s.masked_fill_(mask, float("-inf")).softmax(-1)
            return (p @ v).transpose(0, 1).reshape(L, N * DV) @ Wo

    t = timed(step, runs)
    print(f"torch prefill L={L} {DTYPE}: {t * 1e3:.0f} ms (median of {runs})")


def decode(T, runs):
    Wqa, Wq, Wqr = weights(H, QLORA), weights(QLORA, N * DN), weights(QLORA, N * DR)
    Wdkv, Wkr, Wo = weights(H, LAT), weights(H, DR), weights(N * DV, H)
    Wk_heads = weights(LAT, N * DN).view(LAT, N, DN).permute(1, 2, 0).contiguous()  # n × d_h × latent
    Wv_heads = weights(LAT, N * DV).view(LAT, N, DV).permute(1, 0, 2).contiguous()  # n × latent × d_h
    cache_c, cache_kr = torch.rand(T + 1, LAT).to(DTYPE), torch.rand(T + 1, DR).to(DTYPE)
    x, pos = (torch.rand(1, H) * 2 - 1).to(DTYPE), torch.tensor([T])
    scale = (DN + DR) ** -0.5

    def step():
        with torch.no_grad():
            qa = rms(x @ Wqa)
            q = (qa @ Wq).view(N, 1, DN)
            qr = rope((qa @ Wqr).view(N, DR), pos)
            cache_c[T] = rms(x @ Wdkv)[0]
            cache_kr[T] = rope(x @ Wkr, pos)[0]
            q_lat = torch.bmm(q, Wk_heads).view(N, LAT)
            s = (q_lat @ cache_c.T + qr @ cache_kr.T) * scale
            o_lat = s.softmax(-1) @ cache_c
            o = torch.bmm(o_lat.view(N, 1, LAT), Wv_heads).view(1, N * DV)
            return o @ Wo

    t = timed(step, runs)
    print(f"torch absorbed decode context={T} {DTYPE}: {t * 1e3:.1f} ms (median of {runs})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    a = ap.parse_args()
    DTYPE = getattr(torch, a.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    prefill(a.prefill, a.runs)
    decode(a.decode, 4 * a.runs)
