"""GQA decode of whole (sequence, KV head) items on each PE (the ``decode_heads`` workload,
:mod:`kbframe.workloads.decode_heads`), with the inner loops of
:mod:`kbframe.kernels.attention`."""
from __future__ import annotations

from .attention import PARTIALS, finish


def decode_heads(tl, *, items, G: int, d: int, tile: int, scale: float, inner: str) -> None:
    """Decode whole (sequence, KV head) items one after another on this PE.

    Args:
        items: ``[(q, k, v, out, S), ...]``: HBM row windows ``q (G, d)``, ``k``, ``v``
            ``(S, d)`` (None when ``S = 0``), ``out (G, d)``, and the item's key count.
        inner: ``"opt2"`` or ``"opt3"``, the inner loop (:data:`~kbframe.kernels.attention.PARTIALS`).

    Each item runs in its own scratch scope, so the next item reuses the same TCM (its loads
    wait for the previous item's reads through the scheduler's hazards) and TCM does not grow
    with the number of items. An item with ``S = 0`` stores zeros.
    """
    partial = PARTIALS[inner]
    for q_h, k_h, v_h, out_h, S in items:
        with tl.scratch_scope():
            m, l, O = partial(tl, q_h, k_h, v_h, G=G, d=d, S_kv=S, tile=tile, scale=scale)
            finish(tl, out_h, m, l, O, G=G, d=d, empty=S == 0)
