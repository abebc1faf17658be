"""Attention building blocks shared by the decode kernels (``gqa_decode``, ``decode_heads``,
``decode_splitk``): the online-softmax inner loops over a key range, the final normalise and
store, and the merge of partial states.

One query token, ``G`` query heads sharing one KV head (``q (G, d)`` in HBM, loaded first,
or already in TCM), ``K``/``V`` rows ``(S_kv, d)`` streamed from HBM in tiles of ``tile`` keys (the last tile is ``S_kv mod tile`` long and
exact; DESIGN.md). :func:`partial_opt3` / :func:`partial_opt2` return the unnormalised
partial ``(m, l, O)`` of their keys (TCM handles ``(G, 1)``, ``(G, 1)``, ``(G, d)``);
:func:`finish` stores ``O / l``; :func:`merge` combines two partials with the ``lse_merge``
recipe (``recipes/lse_merge.yaml``). An empty key range gives the merge's identity,
``m = −inf, l = 0, O = 0``.
"""
from __future__ import annotations


def _tiles(S_kv: int, tile: int):
    return [(j0, min(S_kv, j0 + tile)) for j0 in range(0, S_kv, tile)]


def hbm(tl, h, default: str):
    """An HBM tensor argument: a handle as given, a tensor name, or None for ``default``."""
    if h is None:
        return tl.ref(default)
    return tl.ref(h) if isinstance(h, str) else h


def empty_partial(tl, G: int, d: int):
    """The merge identity ``(m = −inf, l = 0, O = 0)``: ``(G, 1)``, ``(G, 1)``, ``(G, d)``."""
    return tl.full((G, 1), float("-inf"), "m"), tl.zeros((G, 1), "l"), tl.zeros((G, d), "O")


def partial_opt3(tl, q_h, k_h, v_h, *, G: int, d: int, S_kv: int, tile: int, scale: float):
    """ADR-0060's software-pipelined loop over the ``S_kv`` keys of ``k_h``/``v_h``: ~13
    primitive commands per KV tile; returns the partial ``(m, l, O)`` (TCM handles).

    Per tile ``j``: the next tile's K/V loads are issued first (double-buffered), then
    ``S = q·K_jᵀ`` (q pre-scaled once), the 8 online-softmax MATH ops, ``P·V_j`` and the
    accumulate. K_j is read as a real transpose (``K_j.T``). ``S_kv = 0`` (``k_h``, ``v_h``
    None) gives the identity (:func:`empty_partial`) and loads nothing.
    """
    if S_kv == 0:
        return empty_partial(tl, G, d)
    tile = min(tile, S_kv)  # buffers for a tile longer than the sequence would only waste TCM
    tiles = _tiles(S_kv, tile)
    q = tl.scale(q_h if q_h.space == "tcm" else tl.load(q_h), scale)
    m, l, O = empty_partial(tl, G, d)
    kbuf = [tl.empty((tile, d), f"Kbuf{i}") for i in range(2)]
    vbuf = [tl.empty((tile, d), f"Vbuf{i}") for i in range(2)]

    def issue(j):
        j0, j1 = tiles[j]
        n = j1 - j0
        return (tl.load(k_h[j0:j1], out=kbuf[j % 2][0:n]),
                tl.load(v_h[j0:j1], out=vbuf[j % 2][0:n]))

    nxt = issue(0)
    for j in tl.steps("S_kv", len(tiles), rings=(2,)):
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
    return m, l, O


def partial_opt2(tl, q_h, k_h, v_h, *, G: int, d: int, S_kv: int, tile: int, scale: float, s_buffers: int = 2,
                 k_prefetch: int = 1, v_buffers: int = 2, v_staging: str = "composite"):
    """ADR-0065's opt2 loop over the ``S_kv`` keys of ``k_h``/``v_h``: two composites per KV
    tile (three with ``v_staging="prefetch"``); returns the partial ``(m, l, O)`` (TCM handles).

    ``#1 = composite(gemm, a=q, b=K_jᵀ (HBM), epilogue=[scale])`` writes ``S_j``;
    ``#2 = composite(prologue=[softmax_merge(s=S_j, m, l, O)], gemm, b=V_j, out=O,
    epilogue=[add O])``. The scheduler inserts every DMA of an HBM operand. ``S_kv = 0``
    gives the identity (:func:`empty_partial`) and loads nothing.

    The design space (defaults are the ADR's kernel):

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
    if S_kv == 0:
        return empty_partial(tl, G, d)
    tile = min(tile, S_kv)  # buffers for a tile longer than the sequence would only waste TCM
    tiles = _tiles(S_kv, tile)
    prefetch_v = v_staging == "prefetch"
    q = q_h if q_h.space == "tcm" else tl.load(q_h)
    m, l, O = empty_partial(tl, G, d)
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
    for j in tl.steps("S_kv", len(tiles), rings=(s_buffers, v_buffers if prefetch_v else 1)):
        if j + k_prefetch < len(tiles):
            ahead.append(issue(j + k_prefetch))
        s_j, v_j = ahead.pop(0)
        with tl.scratch_scope():
            tl.composite(prologue=[{"op": "softmax_merge", "s": s_j, "m": m, "l": l, "O": O}],
                         op="gemm", b=v_j, out=O, epilogue=[{"op": "add", "other": O}])
    return m, l, O


#: the inner loops by the name a bench key gives them (``bench.inner``)
PARTIALS = {"opt2": partial_opt2, "opt3": partial_opt3}


def finish(tl, out_h, m, l, O, *, G: int, d: int, empty: bool) -> None:
    """Store ``O / l`` to ``out_h``, or zeros for an empty sequence (``l = 0``: 0/0 is NaN,
    and attention over no keys is defined here as 0)."""
    tl.store(out_h, tl.zeros((G, d), "out0") if empty else tl.div_bcast(O, l))


#: the lse_merge clamp: float32's most negative finite value. Every real running max is
#: above it, so clamping changes no weight, and e^(−inf − floor) = 0 instead of NaN.
LSE_FLOOR = -3.4028234663852886e38


def lse_floor(tl):
    """The ``(1, 1)`` TCM tensor holding :data:`LSE_FLOOR` (one MATH fill)."""
    return tl.full((1, 1), LSE_FLOOR, "lse_floor")


def merge(tl, state, incoming, floor) -> None:
    """Merge the partial ``incoming = (m_in, l_in, O_in)`` into ``state = (m, l, O)`` in place:
    one composite whose prologue is the ``lse_merge`` recipe (no GEMM). Merging the identity
    (``m = −inf, l = 0, O = 0``) on either side or both changes nothing and makes no NaN."""
    m, l, O = state
    m_in, l_in, O_in = incoming
    tl.composite(op=None, prologue=[{"op": "lse_merge", "m": m, "l": l, "O": O,
                                     "m_in": m_in, "l_in": l_in, "O_in": O_in, "floor": floor}])
