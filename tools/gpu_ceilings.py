# The GPU's measured ceilings beside bd_cuda_bench (by hand, on a machine with PyTorch and a GPU):
# a large fp16/bf16 matrix product, the dense key projection at DeepSeek-V3's shape through
# torch (a cross-check of cuBLAS dense), and a device-to-device copy. Medians of 20, CUDA events.
import torch
def t(f, n=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2]
for dt in (torch.float16, torch.bfloat16):
    a = torch.randn(8192, 8192, device='cuda', dtype=dt); b = torch.randn(8192, 8192, device='cuda', dtype=dt)
    ms = t(lambda: a @ b)
    print(f"peak {dt}: 8192^3 product {2*8192**3/ms/1e9:.0f} TFLOP/s")
    x = torch.randn(16384, 512, device='cuda', dtype=dt); w = torch.randn(512, 16384, device='cuda', dtype=dt)
    ms = t(lambda: x @ w)
    print(f"torch {dt}: DeepSeek K projection L=16384 {ms*1e3:.0f} us, {2*16384*512*16384/ms/1e9:.0f} TFLOP/s")
src = torch.empty(2**30, dtype=torch.uint8, device='cuda'); dst = torch.empty_like(src)
ms = t(lambda: dst.copy_(src))
print(f"copy: {2*2**30/ms/1e9:.2f} TB/s (read + write)")
