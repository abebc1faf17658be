"""Split-K GQA decode (flash-decoding; the ``decode_splitk`` workload,
:mod:`kbframe.workloads.decode_splitk`): one (sequence, KV head) split over P PEs by key
ranges; each PE runs an inner loop of :mod:`kbframe.kernels.attention` over its range and
the partial states ``(m, l, O)`` are merged over IPCQ (``tl.send`` / ``tl.recv_async``) with
the ``lse_merge`` recipe along a merge topology
(:func:`kbframe.kernels.collectives.merge_plan`); rank 0 stores ``O / l``.
"""
from __future__ import annotations

from .attention import PARTIALS, finish, lse_floor, merge


def decode_splitk(tl, *, q, k, v, out, S: int, steps, pes, G: int, d: int, tile: int, scale: float,
                  inner: str, empty: bool) -> None:
    """One split (rank) of one (sequence, KV head): the inner loop over its ``S`` keys, then
    its merge steps.

    Args:
        q: the item's HBM row window ``(G, d)``; k, v: this split's key rows ``(S, d)`` (None
            when the split is empty, ``S = 0``: its partial is the merge identity).
        out: the item's output window ``(G, d)`` on rank 0, None on the other ranks.
        steps: this rank's :func:`~kbframe.kernels.collectives.merge_plan` steps; pes: the PE of each rank.
        empty: the whole sequence has no key (rank 0 then stores zeros, not 0/0).

    A received partial lands in fresh TCM (``tl.recv_async``, three messages in FIFO order:
    m, l, O); the merge composite that reads it waits for it through the scheduler's
    hazards, so PE_CPU never blocks on a receive.
    """
    state = PARTIALS[inner](tl, q, k, v, G=G, d=d, S_kv=S, tile=tile, scale=scale)
    floor = None
    for action, peer in steps:
        if action == "recv":
            if floor is None:
                floor = lse_floor(tl)
            src = pes[peer]
            incoming = (tl.recv_async((G, 1), src, "m_in"), tl.recv_async((G, 1), src, "l_in"),
                        tl.recv_async((G, d), src, "O_in"))
            merge(tl, state, incoming, floor)
        else:
            for h in state:
                tl.send(h, pes[peer])
    if out is not None:
        finish(tl, out, *state, G=G, d=d, empty=empty)
