"""RMSNorm fused ahead of a linear layer: ``y = (x / rms(x)) · γ · W`` (the fused pattern
of ADR-0065's Consequences), one composite per block of ``block_t`` tokens:
``composite(prologue=[rmsnorm(x, gamma, eps)], op="gemm", b=W (HBM), out=y (HBM))``. The
RMSNorm is the YAML recipe ``recipes/rmsnorm.yaml``; its output is auto-bound to the GEMM's
``a`` and W is streamed from HBM by the scheduler.
"""
from __future__ import annotations


def rmsnorm_linear(tl, *, T: int, H: int, N: int, block_t: int, eps: float) -> None:
    """``y (T, N) = rmsnorm(x (T, H)) · gamma (1, H) @ W (H, N)``."""
    x_h, g_h, w_h, y_h = tl.ref("x"), tl.ref("gamma"), tl.ref("W"), tl.ref("y")
    bt = min(block_t, T)
    gamma = tl.load(g_h)
    eps_t = tl.full((1, 1), float(eps), "eps")
    xbuf = [tl.empty((bt, H), f"xbuf{i}") for i in range(2)]
    blocks = [(t0, min(T, t0 + bt)) for t0 in range(0, T, bt)]

    def issue(i):
        t0, t1 = blocks[i]
        return tl.load(x_h[t0:t1], out=xbuf[i % 2][0:t1 - t0])

    nxt = issue(0)
    for i, (t0, t1) in enumerate(blocks):
        x = nxt
        if i + 1 < len(blocks):
            nxt = issue(i + 1)
        with tl.scratch_scope():
            tl.composite(prologue=[{"op": "rmsnorm", "x": x, "gamma": gamma, "eps": eps_t}],
                         op="gemm", b=w_h, out=y_h[t0:t1])
