"""GEMM ``C = epilogue(A·B)`` through the legacy composite API (ADR-0044 harness,
ADR-0065 D6.4): ``tl.composite(op="gemm", a, b, out, epilogue=[...])``, one composite per
block of ``block_m`` output rows.

Staging variants (ADR-0044): ``ref_ref`` streams A and B from HBM (the scheduler inserts
every DMA, per GEMM tile); ``load_ref`` loads each A block into TCM first (double-buffered,
the next block's load issued before this block's composite); ``load_load`` also loads all
of B into TCM once. Epilogue entries are ``{"op": kind, <scalars>}``; ``bias`` reads the
HBM tensor ``bias (1, N)`` and ``add`` reads ``other (M, N)``, both loaded into TCM.

On many PEs (the workload's ``bench.pes``, :mod:`kbframe.workloads.gemm`) each PE gets its
share as ``tiles``: the composites it issues, each naming its HBM row windows, and with
``reduce`` (split K) the steps that sum the PEs' partial blocks over IPCQ.
"""
from __future__ import annotations

STAGINGS = ("ref_ref", "load_ref", "load_load")
#: epilogue kinds that read a tensor, and the HBM tensor each reads
EPILOGUE_TENSORS = {"bias": "bias", "add": "other"}


def gemm(tl, *, M: int, K: int, N: int, block_m: int, staging: str, epilogue: list, tiles=None,
         reduce=None) -> None:
    """``C (M, N) = epilogue(A (M, K) · B (K, N))`` in blocks of ``block_m`` rows of C; with
    ``tiles``, this PE's share of a GEMM spread over PEs (:func:`gemm_tiles`)."""
    if tiles is not None:
        return gemm_tiles(tl, tiles=tiles, reduce=reduce, N=N, epilogue=epilogue)
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


def _epilogue_items(tl, epilogue: list, panel, m0: int, m1: int) -> list:
    """The epilogue of one output tile: ``bias`` / ``other`` read from column panel
    ``panel`` (``bias.p<j>``, rows ``m0 .. m1`` of ``other.p<j>``), loaded into TCM."""
    ep = []
    for e in epilogue:
        item = dict(e)
        if item["op"] == "bias":
            item["bias"] = tl.load(tl.ref(f"bias.p{panel}"))
        elif item["op"] == "add":
            item["other"] = tl.load(tl.ref(f"other.p{panel}")[m0:m1])
        ep.append(item)
    return ep


def gemm_tiles(tl, *, tiles: list, reduce, N: int, epilogue: list) -> None:
    """One PE's share of a GEMM spread over PEs (DESIGN.md decision 9; the split is the
    workload's, :mod:`kbframe.workloads.gemm`), one composite per entry of ``tiles``.

    Args:
        tiles: ``(a, m0, m1, b, k_rows, c, panel)`` each: rows ``m0 .. m1`` of HBM
            tensor ``a`` times HBM tensor ``b`` (rows ``k_rows = (k0, k1)`` of it, or all
            of it for None) into rows ``m0 .. m1`` of HBM tensor ``c``; ``panel`` is the
            column panel an epilogue tensor is read from. With ``reduce`` the product is a
            partial block in TCM and ``c`` is None except on rank 0.
        reduce: None, or ``{"steps": this rank's merge_plan steps, "pes": the PE of each
            rank}`` (:func:`kbframe.kernels.collectives.merge_plan`): each received
            partial is added into this rank's (MATH ``add``), each send passes it on;
            rank 0 stores the sum.
    """
    if reduce is None:
        for a, m0, m1, b, _, c, panel in tiles:
            ep = _epilogue_items(tl, epilogue, panel, m0, m1) if epilogue else []
            tl.composite(op="gemm", a=tl.ref(a)[m0:m1], b=tl.ref(b), out=tl.ref(c)[m0:m1], epilogue=ep)
        return
    bm = max(m1 - m0 for _, m0, m1, *_ in tiles)
    part = [tl.empty((bm, N), f"partial{i}") for i in range(2)]
    incoming = tl.empty((bm, N), "partial_in")
    steps, pes = reduce["steps"], reduce["pes"]
    for i, (a, m0, m1, b, (k0, k1), c, _) in enumerate(tiles):
        rows = m1 - m0
        acc = part[i % 2][0:rows]
        tl.composite(op="gemm", a=tl.ref(a)[m0:m1], b=tl.ref(b)[k0:k1], out=acc)
        for action, peer in steps:
            if action == "recv":
                got = tl.recv_async((rows, N), pes[peer], out=incoming[0:rows])
                tl.add(acc, got, out=acc)
            else:
                tl.send(acc, pes[peer])
        if c is not None:
            tl.store(tl.ref(c)[m0:m1], acc)
