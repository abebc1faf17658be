"""GEMM ``C = epilogue(A·B)`` through the legacy composite API (ADR-0044 harness,
ADR-0065 D6.4): ``tl.composite(op="gemm", a, b, out, epilogue=[...])``, one composite per
block of ``block_m`` output rows.

Staging variants (ADR-0044): ``ref_ref`` streams A and B from HBM (the scheduler inserts
every DMA, per GEMM tile); ``load_ref`` loads each A block into TCM first (double-buffered,
the next block's load issued before this block's composite); ``load_load`` also loads all
of B into TCM once. Epilogue entries are ``{"op": kind, <scalars>}``; ``bias`` reads the
HBM tensor ``bias (1, N)`` and ``add`` reads ``other (M, N)``, both loaded into TCM.
"""
from __future__ import annotations

STAGINGS = ("ref_ref", "load_ref", "load_load")
#: epilogue kinds that read a tensor, and the HBM tensor each reads
EPILOGUE_TENSORS = {"bias": "bias", "add": "other"}


def gemm(tl, *, M: int, K: int, N: int, block_m: int, staging: str, epilogue: list) -> None:
    """``C (M, N) = epilogue(A (M, K) · B (K, N))`` in blocks of ``block_m`` rows of C."""
    A, B, C = tl.ref("A"), tl.ref("B"), tl.ref("C")
    bm = min(block_m, M)
    blocks = [(m0, min(M, m0 + bm)) for m0 in range(0, M, bm)]
    b = tl.load(B) if staging == "load_load" else B
    kinds = [e["op"] for e in epilogue]
    bias = tl.load(tl.ref("bias")) if "bias" in kinds else None
    abuf = [tl.empty((bm, K), f"Abuf{i}") for i in range(2)] if staging != "ref_ref" else None
    obuf = [tl.empty((bm, N), f"Other{i}") for i in range(2)] if "add" in kinds else None

    def issue(i):
        m0, m1 = blocks[i]
        a = tl.load(A[m0:m1], out=abuf[i % 2][0:m1 - m0]) if abuf else A[m0:m1]
        other = tl.load(tl.ref("other")[m0:m1], out=obuf[i % 2][0:m1 - m0]) if obuf else None
        return a, other

    nxt = issue(0)
    for i, (m0, m1) in enumerate(blocks):
        a, other = nxt
        if i + 1 < len(blocks):
            nxt = issue(i + 1)
        ep = []
        for e in epilogue:
            item = dict(e)
            if item["op"] == "bias":
                item["bias"] = bias
            elif item["op"] == "add":
                item["other"] = other
            ep.append(item)
        tl.composite(op="gemm", a=a, b=b, out=C[m0:m1], epilogue=ep)
