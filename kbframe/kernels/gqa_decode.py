"""GQA decode attention for one KV head on one PE: one query token, ``G`` query heads
sharing one KV head, ``K``/``V`` of shape ``(S_kv, d)`` streamed from HBM in tiles of
``tile`` keys (the last tile is ``S_kv mod tile`` long and exact; DESIGN.md).

Both kernels compute online softmax (DESIGN.md glossary) and write ``out = O / l``
(``(G, d)``) to HBM. They read HBM tensors ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)``
and write ``out (G, d)``: by default the HBM tensors of those names, else the handles (or
tensor names) given as ``q``, ``k``, ``v``, ``out`` (row windows of larger tensors, as the
multi-PE workloads pass). Softmax state ``m``, ``l`` is ``(G, 1)``.

The inner loop over a key range is its own function, :func:`partial_opt3` /
:func:`partial_opt2`: it returns the unnormalised partial ``(m, l, O)`` (TCM handles) of
its keys, which the whole-head kernels normalise and store and split-K decode merges
(``recipes/lse_merge.yaml``) before normalising. An empty key range gives the merge's
identity, ``m = −inf, l = 0, O = 0``.
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
    q = tl.scale(tl.load(q_h), scale)
    m, l, O = empty_partial(tl, G, d)
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
    return m, l, O


def partial_opt2(tl, q_h, k_h, v_h, *, G: int, d: int, S_kv: int, tile: int, scale: float):
    """ADR-0065's opt2 loop over the ``S_kv`` keys of ``k_h``/``v_h``: two composites per KV
    tile; returns the partial ``(m, l, O)`` (TCM handles).

    ``#1 = composite(gemm, a=q, b=K_jᵀ (HBM), epilogue=[scale])`` writes ``S_j``;
    ``#2 = composite(prologue=[softmax_merge(s=S_j, m, l, O)], gemm, b=V_j (HBM), out=O,
    epilogue=[add O])``. The next tile's #1 is issued before this tile's #2, so K streams
    ahead of V (ADR-0065 D6.2); the scheduler inserts every DMA. ``S_kv = 0`` gives the
    identity (:func:`empty_partial`) and loads nothing.
    """
    if S_kv == 0:
        return empty_partial(tl, G, d)
    tile = min(tile, S_kv)  # buffers for a tile longer than the sequence would only waste TCM
    tiles = _tiles(S_kv, tile)
    q = tl.load(q_h)
    m, l, O = empty_partial(tl, G, d)
    sbuf = [tl.empty((G, tile), f"S{i}") for i in range(2)]
    ragged = tiles[-1][1] - tiles[-1][0]
    s_last = tl.empty((G, ragged), "S_last") if ragged != tile else None

    def qk(j):
        j0, j1 = tiles[j]
        dst = s_last if (s_last is not None and j == len(tiles) - 1) else sbuf[j % 2]
        return tl.composite(op="gemm", a=q, b=k_h[j0:j1].T, out=dst,
                            epilogue=[{"op": "scale", "factor": float(scale)}])

    s_next = qk(0)
    for j in range(len(tiles)):
        s_j = s_next
        if j + 1 < len(tiles):
            s_next = qk(j + 1)
        j0, j1 = tiles[j]
        with tl.scratch_scope():
            tl.composite(prologue=[{"op": "softmax_merge", "s": s_j, "m": m, "l": l, "O": O}],
                         op="gemm", b=v_h[j0:j1], out=O, epilogue=[{"op": "add", "other": O}])
    return m, l, O


#: the inner loops by the name a bench key gives them (``bench.inner``)
PARTIALS = {"opt2": partial_opt2, "opt3": partial_opt3}


def finish(tl, out_h, m, l, O, *, G: int, d: int, empty: bool) -> None:
    """Store ``O / l`` to ``out_h``, or zeros for an empty sequence (``l = 0``: 0/0 is NaN,
    and attention over no keys is defined here as 0)."""
    tl.store(out_h, tl.zeros((G, d), "out0") if empty else tl.div_bcast(O, l))


def gqa_decode_opt3(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float,
                    q=None, k=None, v=None, out=None) -> None:
    """opt3 decode of one KV head (:func:`partial_opt3`, then ``out = O / l``)."""
    q_h, out_h = hbm(tl, q, "q"), hbm(tl, out, "out")
    k_h, v_h = (hbm(tl, k, "k"), hbm(tl, v, "v")) if S_kv else (None, None)
    m, l, O = partial_opt3(tl, q_h, k_h, v_h, G=G, d=d, S_kv=S_kv, tile=tile, scale=scale)
    finish(tl, out_h, m, l, O, G=G, d=d, empty=S_kv == 0)


def gqa_decode_opt2(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float,
                    q=None, k=None, v=None, out=None) -> None:
    """opt2 decode of one KV head (:func:`partial_opt2`, then ``out = O / l``)."""
    q_h, out_h = hbm(tl, q, "q"), hbm(tl, out, "out")
    k_h, v_h = (hbm(tl, k, "k"), hbm(tl, v, "v")) if S_kv else (None, None)
    m, l, O = partial_opt2(tl, q_h, k_h, v_h, G=G, d=d, S_kv=S_kv, tile=tile, scale=scale)
    finish(tl, out_h, m, l, O, G=G, d=d, empty=S_kv == 0)
