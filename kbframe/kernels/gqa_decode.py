"""GQA decode attention for one KV head on one PE: one query token, ``G`` query heads
sharing one KV head, ``K``/``V`` of shape ``(S_kv, d)`` streamed from HBM in tiles of
``tile`` keys (the last tile is ``S_kv mod tile`` long and exact; DESIGN.md).

Both kernels compute online softmax (DESIGN.md glossary) and write ``out = O / l``
(``(G, d)``) to HBM. They read HBM tensors ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)``
and write ``out (G, d)``. Softmax state ``m``, ``l`` is ``(G, 1)``.
"""
from __future__ import annotations


def _tiles(S_kv: int, tile: int):
    return [(j0, min(S_kv, j0 + tile)) for j0 in range(0, S_kv, tile)]


def gqa_decode_opt3(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float) -> None:
    """ADR-0060's software-pipelined variant: ~13 primitive commands per KV tile.

    Per tile ``j``: the next tile's K/V loads are issued first (double-buffered), then
    ``S = q·K_jᵀ`` (q pre-scaled once), the 8 online-softmax MATH ops, ``P·V_j`` and the
    accumulate. K_j is read as a real transpose (``K_j.T``).
    """
    q_h, k_h, v_h, out_h = tl.ref("q"), tl.ref("k"), tl.ref("v"), tl.ref("out")
    tile = min(tile, S_kv)  # buffers for a tile longer than the sequence would only waste TCM
    tiles = _tiles(S_kv, tile)
    q = tl.scale(tl.load(q_h), scale)
    m = tl.full((G, 1), float("-inf"), "m")
    l = tl.zeros((G, 1), "l")
    O = tl.zeros((G, d), "O")
    kbuf = [tl.empty((tile, d), f"Kbuf{i}") for i in range(2)]
    vbuf = [tl.empty((tile, d), f"Vbuf{i}") for i in range(2)]

    def issue(j):
        j0, j1 = tiles[j]
        n = j1 - j0
        return (tl.load(k_h[j0:j1], out=kbuf[j % 2][0:n]),
                tl.load(v_h[j0:j1], out=vbuf[j % 2][0:n]))

    nxt = issue(0)
    for j in range(len(tiles)):
        k_j, v_j = nxt
        if j + 1 < len(tiles):
            nxt = issue(j + 1)
        with tl.scratch_scope():
            s = tl.dot(q, k_j.T)
            m_loc = tl.rmax(s)
            m_new = tl.maximum(m, m_loc)
            corr = tl.exp_diff(m, m_new)
            p = tl.exp_diff(s, m_new)
            l_loc = tl.rsum(p)
            tl.fma(l, corr, l_loc, out=l)
            tl.mul_bcast(O, corr, out=O)
            pv = tl.dot(p, v_j)
            tl.add(O, pv, out=O)
            tl.copy(m_new, out=m)
    tl.store(out_h, tl.div_bcast(O, l))


def gqa_decode_opt2(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float, s_buffers: int = 2,
                    k_prefetch: int = 1, v_buffers: int = 2, v_staging: str = "composite") -> None:
    """ADR-0065's opt2: two composites per KV tile (three with ``v_staging="prefetch"``).

    ``#1 = composite(gemm, a=q, b=K_jᵀ (HBM), epilogue=[scale])`` writes ``S_j``;
    ``#2 = composite(prologue=[softmax_merge(s=S_j, m, l, O)], gemm, b=V_j, out=O,
    epilogue=[add O])``. The scheduler inserts every DMA of an HBM operand.

    The design space (issue 13; defaults are the ADR's kernel):

    * ``s_buffers`` (≥ 2): S buffers in a ring; tile j's #1 writes ``S[j % s_buffers]``.
      Keeps D6.3 (a #1 waits, as a WAR hazard, for the #2 that last read its buffer);
      more buffers only let it wait for an older #2.
    * ``k_prefetch`` (0 ≤ k < ``s_buffers``): #1 of tile j+k is issued before #2 of tile
      j, so K streams k tiles ahead of V (D6.2 with k = 1). At k ≥ ``s_buffers`` a #1
      would overwrite an S buffer that a #2 issued after it still has to read.
    * ``v_staging``: ``"composite"`` keeps D4/D6.2: V_j is #2's HBM operand, streamed by
      the DMA the scheduler inserts inside #2 (after its prologue), so V's setup and
      transfer sit on the tile's chain. ``"prefetch"`` relaxes it: V_j is loaded into TCM
      by an explicit ``tl.load`` issued k tiles ahead with K (as opt3 does, ADR-0060), and
      #2 reads V from TCM, so no DMA sits inside #2.
    * ``v_buffers`` (≥ 2, > ``k_prefetch``; prefetch only): V buffers in a ring.
    """
    q_h, k_h, v_h, out_h = tl.ref("q"), tl.ref("k"), tl.ref("v"), tl.ref("out")
    tile = min(tile, S_kv)  # buffers for a tile longer than the sequence would only waste TCM
    tiles = _tiles(S_kv, tile)
    prefetch_v = v_staging == "prefetch"
    q = tl.load(q_h)
    m = tl.full((G, 1), float("-inf"), "m")
    l = tl.zeros((G, 1), "l")
    O = tl.zeros((G, d), "O")
    sbuf = [tl.empty((G, tile), f"S{i}") for i in range(s_buffers)]
    vbuf = [tl.empty((tile, d), f"Vbuf{i}") for i in range(v_buffers)] if prefetch_v else []
    ragged = tiles[-1][1] - tiles[-1][0]
    s_last = tl.empty((G, ragged), "S_last") if ragged != tile else None

    def issue(j):
        """Tile j's #1 (and its V load when prefetched): ``(S_j, V_j)``."""
        j0, j1 = tiles[j]
        dst = s_last if (s_last is not None and j == len(tiles) - 1) else sbuf[j % s_buffers]
        s_j = tl.composite(op="gemm", a=q, b=k_h[j0:j1].T, out=dst,
                           epilogue=[{"op": "scale", "factor": float(scale)}])
        v_j = tl.load(v_h[j0:j1], out=vbuf[j % v_buffers][0:j1 - j0]) if prefetch_v else v_h[j0:j1]
        return s_j, v_j

    ahead = [issue(j) for j in range(min(k_prefetch, len(tiles)))]
    for j in range(len(tiles)):
        if j + k_prefetch < len(tiles):
            ahead.append(issue(j + k_prefetch))
        s_j, v_j = ahead.pop(0)
        with tl.scratch_scope():
            tl.composite(prologue=[{"op": "softmax_merge", "s": s_j, "m": m, "l": l, "O": O}],
                         op="gemm", b=v_j, out=O, epilogue=[{"op": "add", "other": O}])
    tl.store(out_h, tl.div_bcast(O, l))
