#!/usr/bin/env python3
"""The few-row kernels' fragment mapping (gemv.cu, `skinny_gemm`), checked on the CPU.

Each lane (g, t) of a warp holds a run of consecutive values of a 64-byte half-chunk — 16 e4m3
codes or 8 bf16 — of weight rows g and g + 8 and of token g, and MMA q of the half takes its
values 4q, 4q+1 | 4q+2, 4q+3 as the A fragment's (a0, a1 | a2, a3) and the B fragment's
(b0 | b1). This replays that assignment through mma.m16n8k16's fragment layouts (PTX ISA,
"Matrix Fragments for mma.m16n8k16": a0 = (g, 2t..2t+1), a1 = (g+8, ..), a2 = (g, 2t+8..), a3 =
(g+8, 2t+8..); b0 = (2t..2t+1, g), b1 = (2t+8.., g); c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, ..))
and compares the sums with x · wᵀ: the permutation must cover every k exactly once.

    pip install numpy; python3 scripts/skinny_fragments_check.py
"""
import numpy as np
rng=np.random.default_rng(0)
def sim(F8, m=32, n=24, k=512):
    VB = 1 if F8 else 2
    KC = 128 // VB
    MMAS = 4 if F8 else 2
    W = rng.standard_normal((m,k)); X = rng.standard_normal((n,k))
    out = np.zeros((n,m))
    for warp in range(m//16):
        acc = np.zeros((8,32,4))  # j, lane, c
        for k0 in range(0,k,KC):
            for h in range(2):
                # per lane: 16 bytes of half h = values
                vals_per_lane = 16 // VB
                for q in range(MMAS):
                    for j in range((n+7)//8):
                        A = np.zeros((16,16)); B = np.zeros((16,8))
                        for lane in range(32):
                            g, t = lane>>2, lane&3
                            base = k0 + h*(KC//2) + t*vals_per_lane   # first value index of lane's run
                            rowa, rowb = warp*16+g, warp*16+g+8
                            v = lambda r, i: W[r, base+i]
                            # a0: (g, 2t..2t+1) <- values 4q,4q+1 ; a2: (g, 2t+8..) <- 4q+2,4q+3
                            A[g, 2*t:2*t+2] = [v(rowa,4*q), v(rowa,4*q+1)]
                            A[g+8, 2*t:2*t+2] = [v(rowb,4*q), v(rowb,4*q+1)]
                            A[g, 2*t+8:2*t+10] = [v(rowa,4*q+2), v(rowa,4*q+3)]
                            A[g+8, 2*t+8:2*t+10] = [v(rowb,4*q+2), v(rowb,4*q+3)]
                            tok = 8*j+g
                            xv = (lambda i: X[tok, base+i]) if tok < n else (lambda i: 0.0)
                            B[2*t:2*t+2, g] = [xv(4*q), xv(4*q+1)]
                            B[2*t+8:2*t+10, g] = [xv(4*q+2), xv(4*q+3)]
                        C = A @ B  # 16x8
                        for lane in range(32):
                            g, t = lane>>2, lane&3
                            acc[j,lane,0] += C[g,2*t]; acc[j,lane,1] += C[g,2*t+1]
                            acc[j,lane,2] += C[g+8,2*t]; acc[j,lane,3] += C[g+8,2*t+1]
        for j in range((n+7)//8):
            for lane in range(32):
                g,t = lane>>2, lane&3
                for e in range(4):
                    r = warp*16 + g + (8 if e>=2 else 0); tok = 8*j+2*t+(e&1)
                    if tok < n: out[tok, r] = acc[j,lane,e]
    ref = X @ W.T
    return np.abs(out-ref).max()



if __name__ == "__main__":
    cases = [(True, 32, 24, 512), (False, 32, 24, 512), (False, 16, 5, 128), (True, 16, 64, 256)]
    for f8, m, n, k in cases:
        err = sim(f8, m=m, n=n, k=k)
        print(f"{'e4m3' if f8 else 'bf16'} {n}x{k} · ({m}x{k})ᵀ: max |error| {err:.1e}")
        assert err < 1e-9, "the fragments do not cover k exactly once"
