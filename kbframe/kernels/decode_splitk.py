"""Split-K GQA decode (flash-decoding; the ``decode_splitk`` workload,
:mod:`kbframe.workloads.decode_splitk`): one (sequence, KV head) split over P PEs by key
ranges; each PE runs an inner loop of :mod:`kbframe.kernels.attention` over its range and
the partial states ``(m, l, O)`` are merged over IPCQ (``tl.send`` / ``tl.recv_async``) with
the ``lse_merge`` recipe along a merge topology (:func:`merge_plan`); rank 0 stores ``O / l``.
"""
from __future__ import annotations

from .attention import PARTIALS, finish, lse_floor, merge

TOPOLOGIES = ("tree", "chain", "gather")


def merge_plan(P: int, topology: str) -> list[list[tuple[str, int]]]:
    """Each rank's merge steps, in order: ``("recv", src_rank)`` (receive a partial and merge
    it into this rank's) or ``("send", dst_rank)`` (send this rank's partial; its last step).

    * ``gather``: ranks 1..P−1 send to rank 0, which merges them in rank order (P−1 merges
      on one PE, 1 round of transfers);
    * ``chain``: rank P−1 sends to P−2, which merges and sends on, down to rank 0 (P−1
      rounds, each a transfer and a merge);
    * ``tree``: in round k (stride s = 2^k), rank r with r mod 2s = s sends to r − s, which
      merges (⌈log₂ P⌉ rounds).

    Raises:
        ValueError: an unknown topology (the workload checks the key first).
    """
    plan: list[list[tuple[str, int]]] = [[] for _ in range(P)]
    if topology == "gather":
        for r in range(1, P):
            plan[0].append(("recv", r))
            plan[r].append(("send", 0))
    elif topology == "chain":
        for r in range(P - 1, 0, -1):
            plan[r].append(("send", r - 1))
            plan[r - 1].append(("recv", r))
    elif topology == "tree":
        s = 1
        while s < P:
            for r in range(0, P, 2 * s):
                if r + s < P:
                    plan[r].append(("recv", r + s))
                    plan[r + s].append(("send", r))
            s *= 2
    else:
        raise ValueError(f"unknown merge topology '{topology}' (known: {', '.join(TOPOLOGIES)})")
    return plan


def decode_splitk(tl, *, q, k, v, out, S: int, steps, pes, G: int, d: int, tile: int, scale: float,
                  inner: str, empty: bool) -> None:
    """One split (rank) of one (sequence, KV head): the inner loop over its ``S`` keys, then
    its merge steps.

    Args:
        q: the item's HBM row window ``(G, d)``; k, v: this split's key rows ``(S, d)`` (None
            when the split is empty, ``S = 0``: its partial is the merge identity).
        out: the item's output window ``(G, d)`` on rank 0, None on the other ranks.
        steps: this rank's :func:`merge_plan` steps; pes: the PE of each rank.
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
