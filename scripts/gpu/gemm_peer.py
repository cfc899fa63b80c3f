#!/usr/bin/env python3
"""PyTorch's products at decode batch sizes, as a peer for `cachet bench forward --profile`'s
`gemm` rows: the Llama-3-8B layer's four projections (QKV 6,144 x 4,096, O 4,096 x 4,096,
gate|up 28,672 x 4,096, down 4,096 x 14,336) at a few token counts, each product's weights a
fresh copy (32 layers' worth, more than L2 holds) so every product streams its weights from
DRAM, as a decode step does. Timed inside a CUDA graph of the 32 layers' 128 products:

  bf16  : torch.matmul (cuBLAS / cuBLASLt, its heuristic's choice)
  fp8   : torch._scaled_mm, e4m3 weights with one scale a row and e4m3 activations with one
          scale a token (row-wise scaling, bf16 out: the scales applied in the product's own
          epilogue), the activations quantized beforehand (not timed)

Prints per-step totals (the 128 products) and each shape's time, with the weight bytes'
stream at the copy rate measured in the same run.

    python3 scripts/gpu/gemm_peer.py --rows 1,16,32,64,128,256
"""
import argparse

import torch

SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
LAYERS = 32


def copy_rate():
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        b.copy_(a)
    e.record()
    torch.cuda.synchronize()
    return 2 * 10 * a.numel() / (s.elapsed_time(e) / 1e3)


def graph_time(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,32,64,128,256")
    ap.add_argument("--kinds", default="bf16,fp8")
    a = ap.parse_args()
    torch.manual_seed(0)
    rate = copy_rate()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, copy rate {rate / 1e12:.2f} TB/s")
    print("| kind | rows | step (128 products) | weights at the copy rate | ratio | qkv / o / gate_up / down (µs each) |")
    print("|---|---|---|---|---|---|")
    for kind in a.kinds.split(","):
        elem = 2 if kind == "bf16" else 1
        ws = {}
        for name, m, k in SHAPES:
            if kind == "bf16":
                ws[name] = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
            else:
                ws[name] = [((torch.randn(m, k, device="cuda") * 100).clamp(-448, 448).to(torch.float8_e4m3fn),
                             torch.rand(1, m, device="cuda") * 1e-3) for _ in range(LAYERS)]
        wbytes = sum(m * k * elem for _, m, k in SHAPES) * LAYERS
        for n in [int(r) for r in a.rows.split(",")]:
            xs = {}
            for name, m, k in SHAPES:
                x = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                if kind == "bf16":
                    xs[name] = x
                else:
                    xs[name] = ((x * 100).clamp(-448, 448).to(torch.float8_e4m3fn), torch.rand(n, 1, device="cuda"))

            def product(name, l):
                if kind == "bf16":
                    return torch.matmul(xs[name], ws[name][l].t())
                (xc, xscale), (wc, wscale) = xs[name], ws[name][l]
                return torch._scaled_mm(xc, wc.t(), scale_a=xscale, scale_b=wscale, out_dtype=torch.bfloat16)

            try:
                per = {}
                for name, _, _ in SHAPES:
                    per[name] = graph_time(lambda: [product(name, l) for l in range(LAYERS)]) / LAYERS
                step = graph_time(lambda: [product(nm, l) for l in range(LAYERS) for nm, _, _ in SHAPES])
            except RuntimeError as e:
                print(f"| {kind} | {n} | failed: {str(e).splitlines()[0]} | | | |")
                continue
            floor = wbytes / rate
            each = " / ".join(f"{per[nm] * 1e6:.1f}" for nm, _, _ in SHAPES)
            print(f"| {kind} | {n} | {step * 1e3:.3f} ms | {floor * 1e3:.3f} ms | {step / floor:.2f}× | {each} |", flush=True)
        del ws


if __name__ == "__main__":
    main()
