"""GQA decode over many PEs: whole (sequence, KV head) items per PE (``decode_heads``) and
split-K flash-decoding with partials merged over IPCQ (``decode_splitk``).

Both reuse the single-head inner loops of :mod:`kbframe.kernels.gqa_decode`
(:func:`~kbframe.kernels.gqa_decode.partial_opt2` / ``partial_opt3``, chosen by
``bench.inner``) on row windows of the workload's stacked HBM tensors. A partial state is
``(m, l, O)``: ``(G, 1)``, ``(G, 1)``, ``(G, d)`` TCM handles, unnormalised; partials are
combined by the ``lse_merge`` recipe (``recipes/lse_merge.yaml``).
"""
from __future__ import annotations

from .gqa_decode import PARTIALS, finish

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


def decode_heads(tl, *, items, G: int, d: int, tile: int, scale: float, inner: str) -> None:
    """Decode whole (sequence, KV head) items one after another on this PE.

    Args:
        items: ``[(q, k, v, out, S), ...]``: HBM row windows ``q (G, d)``, ``k``, ``v``
            ``(S, d)`` (None when ``S = 0``), ``out (G, d)``, and the item's key count.
        inner: ``"opt2"`` or ``"opt3"``, the inner loop (:data:`~kbframe.kernels.gqa_decode.PARTIALS`).

    Each item runs in its own scratch scope, so the next item reuses the same TCM (its loads
    wait for the previous item's reads through the scheduler's hazards) and TCM does not grow
    with the number of items. An item with ``S = 0`` stores zeros.
    """
    partial = PARTIALS[inner]
    for q_h, k_h, v_h, out_h, S in items:
        with tl.scratch_scope():
            m, l, O = partial(tl, q_h, k_h, v_h, G=G, d=d, S_kv=S, tile=tile, scale=scale)
            finish(tl, out_h, m, l, O, G=G, d=d, empty=S == 0)
