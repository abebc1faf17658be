"""GQA decode attention for one KV head on one PE: one query token, ``G`` query heads
sharing one KV head, ``K``/``V`` of shape ``(S_kv, d)`` streamed from HBM in tiles of
``tile`` keys (the last tile is ``S_kv mod tile`` long and exact; DESIGN.md).

Both kernels compute online softmax (DESIGN.md glossary; the inner loops are
:func:`kbframe.kernels.attention.partial_opt3` / ``partial_opt2``) and write ``out = O / l``
(``(G, d)``) to HBM. They read HBM tensors ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)``
and write ``out (G, d)``: by default the HBM tensors of those names, else the handles (or
tensor names) given as ``q``, ``k``, ``v``, ``out``. Softmax state ``m``, ``l`` is ``(G, 1)``.
"""
from __future__ import annotations

from .attention import finish, hbm, partial_opt2, partial_opt3


def gqa_decode_opt3(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float,
                    q=None, k=None, v=None, out=None) -> None:
    """opt3 decode of one KV head (:func:`partial_opt3`, then ``out = O / l``)."""
    q_h, out_h = hbm(tl, q, "q"), hbm(tl, out, "out")
    k_h, v_h = (hbm(tl, k, "k"), hbm(tl, v, "v")) if S_kv else (None, None)
    m, l, O = partial_opt3(tl, q_h, k_h, v_h, G=G, d=d, S_kv=S_kv, tile=tile, scale=scale)
    finish(tl, out_h, m, l, O, G=G, d=d, empty=S_kv == 0)


def gqa_decode_opt2(tl, *, G: int, d: int, S_kv: int, tile: int, scale: float, s_buffers: int = 2,
                    k_prefetch: int = 1, v_buffers: int = 2, v_staging: str = "composite",
                    q=None, k=None, v=None, out=None) -> None:
    """opt2 decode of one KV head (:func:`partial_opt2`, whose docstring gives the design
    keys ``s_buffers``, ``k_prefetch``, ``v_buffers``, ``v_staging``; then ``out = O / l``)."""
    q_h, out_h = hbm(tl, q, "q"), hbm(tl, out, "out")
    k_h, v_h = (hbm(tl, k, "k"), hbm(tl, v, "v")) if S_kv else (None, None)
    m, l, O = partial_opt2(tl, q_h, k_h, v_h, G=G, d=d, S_kv=S_kv, tile=tile, scale=scale, s_buffers=s_buffers,
                           k_prefetch=k_prefetch, v_buffers=v_buffers, v_staging=v_staging)
    finish(tl, out_h, m, l, O, G=G, d=d, empty=S_kv == 0)
