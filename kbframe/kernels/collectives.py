"""All-reduce over IPCQ (DESIGN.md decision 12): every PE of a group holds a partial of the
same tensor; afterwards every PE holds their sum (and :func:`merge_plan`: the steps of a
reduction to rank 0 alone, which split-K decode merges its partials along and a split-K
GEMM sums its partial products along). Built on ``tl.send`` / ``tl.recv_async``
and the MATH ``add``; the order of the sum is fixed per algorithm, so data mode is
deterministic and every PE ends with the same bits.

Algorithms (``bench.allreduce``), over P PEs of n elements:

* ``ring``: reduce-scatter then all-gather around the ring of ranks, 2(P−1) steps of one
  chunk (n/P elements) each: in reduce-scatter step s, rank r sends chunk (r − s) mod P
  to rank r+1, receives chunk (r − s − 1) mod P from rank r−1 and adds it into its own;
  the all-gather passes the reduced chunks on, each received straight into place;
* ``tree``: reduce to rank 0 then broadcast, ⌈log₂P⌉ rounds each way: in reduce round k
  (stride 2^k), rank r with r mod 2^(k+1) = 2^k sends its whole tensor to r − 2^k, which
  adds it; the broadcast runs the rounds backwards;
* ``direct``: each rank sends its whole tensor to every other (to r+1, r+2, ... in turn)
  and adds the P partials itself in rank order.

:func:`plan` gives each rank's steps as data; :func:`all_reduce` emits them and
:func:`model_ps` is their α-β cost: each message costs the link's latency α plus
bytes / the link's bandwidth β, each add the MATH unit's time γ over its elements,
composed along the plan's dependencies with each PE issuing its steps in order (its
sends one at a time on its IPCQ send unit, its adds one at a time on its MATH unit), as
PE_SCHEDULER admits them (strict FIFO: a step waits for the steps whose data it reads or
overwrites). On equal links this is the textbook form: ring 2(P−1)(α + n/P·β) + (P−1)γ(n/P),
tree ⌈log₂P⌉(2(α + nβ) + γ(n)), direct α + (P−1)nβ + (P−1)γ(n). With the PEs' partials
ready together and nothing else on the links and units, the simulated all-reduce takes
exactly this long.
"""
from __future__ import annotations

from ..timebase import bytes_to_ps

ALGORITHMS = ("ring", "tree", "direct")
#: the reductions to rank 0 of :func:`merge_plan`
TOPOLOGIES = ("tree", "chain", "gather")


def merge_plan(P: int, topology: str) -> list[list[tuple[str, int]]]:
    """A reduction to rank 0 (split-K decode's partial merge, a split-K GEMM's partial sums):
    each rank's steps, in order: ``("recv", src_rank)`` (receive a partial and merge
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


def chunks(n: int, P: int) -> list[tuple[int, int]]:
    """Element range ``[c0, c1)`` of each of the P ring chunks of ``n`` elements."""
    return [(c * n // P, (c + 1) * n // P) for c in range(P)]


def plan(P: int, algorithm: str) -> list[list[tuple]]:
    """Each rank's steps, in issue order, over named buffers: ``("send", dst, buf)``,
    ``("recv", src, buf)`` (the message lands in ``buf``) and ``("add", a, b, out)``.
    Buffers: ``("x", c)`` chunk c of the rank's tensor (``c = None``: all of it),
    ``("tmp", i)`` a receive buffer (the ring's ``("tmp", c)`` is chunk c's; ``("tmp",
    "sum")`` direct's running sum).

    Raises:
        ValueError: an unknown algorithm (the workload checks the key first).
    """
    steps: list[list[tuple]] = [[] for _ in range(P)]
    if P == 1:
        return steps
    if algorithm == "ring":
        for s in range(P - 1):
            for r in range(P):
                steps[r] += [("send", (r + 1) % P, ("x", (r - s) % P)),
                             ("recv", (r - 1) % P, ("tmp", (r - s - 1) % P)),
                             ("add", ("x", (r - s - 1) % P), ("tmp", (r - s - 1) % P), ("x", (r - s - 1) % P))]
        for s in range(P - 1):
            for r in range(P):
                steps[r] += [("send", (r + 1) % P, ("x", (r + 1 - s) % P)),
                             ("recv", (r - 1) % P, ("x", (r - s) % P))]
    elif algorithm == "tree":  # merge_plan's tree to rank 0, then its steps reversed: the broadcast
        reduce = merge_plan(P, "tree")
        for r, rank_steps in enumerate(reduce):
            for op, q in rank_steps:
                steps[r] += ([("recv", q, ("tmp", 0)), ("add", ("x", None), ("tmp", 0), ("x", None))]
                             if op == "recv" else [("send", q, ("x", None))])
        for r, rank_steps in enumerate(reduce):
            for op, q in reversed(rank_steps):
                steps[r].append(("send", q, ("x", None)) if op == "recv" else ("recv", q, ("x", None)))
    elif algorithm == "direct":
        for r in range(P):
            steps[r] += [("send", (r + j) % P, ("x", None)) for j in range(1, P)]
            others = [q for q in range(P) if q != r]
            steps[r] += [("recv", q, ("tmp", i)) for i, q in enumerate(others)]
            term = {q: ("tmp", i) for i, q in enumerate(others)}
            term[r] = ("x", None)
            acc = term[0]
            for q in range(1, P):
                out = ("x", None) if q == P - 1 else ("tmp", "sum")
                steps[r].append(("add", acc, term[q], out))
                acc = out
    else:
        raise ValueError(f"unknown all-reduce algorithm '{algorithm}' (known: {', '.join(ALGORITHMS)})")
    return steps


def model_ps(P: int, algorithm: str, n: int, itemsize: int, link, add_ps) -> int:
    """The α-β cost of :func:`plan` (module doc), ps: from the moment every rank's partial
    is ready to the moment every rank holds the sum.

    Args:
        n: elements of the tensor; itemsize: bytes per element (the timing dtype).
        link: ``link(src_rank, dst_rank) -> (latency_ps, gbps)``.
        add_ps: ``add_ps(n_elements) -> ps``, one MATH add.
    Raises:
        ValueError: an unknown algorithm.
    """
    steps = plan(P, algorithm)
    bounds = chunks(n, P)

    def size(buf) -> int:
        c = buf[1]
        return n if c is None or c == "sum" or (buf[0] == "tmp" and algorithm != "ring") \
            else bounds[c][1] - bounds[c][0]

    # per rank: the completion of each buffer's last write and last read, when its IPCQ
    # send and MATH units are next free, and the admission of its previous step
    written = [dict() for _ in range(P)]
    read = [dict() for _ in range(P)]
    send_free, math_free, admitted = [0] * P, [0] * P, [0] * P
    inbox: dict = {}  # (src, dst) -> arrival times, FIFO
    pos = [0] * P
    end = 0
    left = sum(len(s) for s in steps)
    while left:
        moved = False
        for r in range(P):
            while pos[r] < len(steps[r]):
                st = steps[r][pos[r]]
                kind = st[0]
                if kind == "recv" and not inbox.get((st[1], r)):
                    break  # its message is not sent yet: the other ranks go first
                ins = (st[2],) if kind == "send" else st[1:3] if kind == "add" else ()
                out = st[3] if kind == "add" else st[2] if kind == "recv" else None
                t = admitted[r]
                for b in ins:  # read after write
                    t = max(t, written[r].get(b, 0))
                if out is not None:  # write after write, write after read
                    t = max(t, written[r].get(out, 0), read[r].get(out, 0))
                admitted[r] = t
                if kind == "send":
                    lat, gbps = link(r, st[1])
                    start = max(t, send_free[r])
                    done = send_free[r] = start + bytes_to_ps(size(st[2]) * itemsize, gbps)
                    inbox.setdefault((r, st[1]), []).append(done + lat)
                    read[r][st[2]] = max(read[r].get(st[2], 0), done)
                elif kind == "recv":
                    done = written[r][out] = max(t, inbox[(st[1], r)].pop(0))
                else:
                    start = max(t, math_free[r])
                    done = math_free[r] = written[r][out] = start + add_ps(size(out))
                    for b in ins:
                        read[r][b] = max(read[r].get(b, 0), done)
                end = max(end, done)
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError(f"all-reduce plan '{algorithm}' for {P} ranks deadlocks")
    return end


def all_reduce(tl, x, *, pes: list, rank: int, algorithm: str, name: str = "all-reduce", **info) -> None:
    """Sum the ranks' ``x`` in place: afterwards ``x`` (a whole TCM tensor, the same shape on
    every rank) holds Σ over ranks on every rank (module doc). Its receive buffers live in
    a scratch scope of their own.

    Args:
        pes: the PE of each rank; rank: this PE's rank.
        name: the phase its commands are reported as (``tl.phase``); the phase's info holds
            ``collective``, ``algorithm``, ``pes``, ``bytes`` (one rank's tensor),
            ``model_ps`` (:func:`model_ps`) and ``after`` (the command that made this
            rank's partial: the all-reduce is timed from the last such command's end).
        info: more of the phase's info (e.g. ``layer``).
    """
    P = len(pes)
    n = x.n_elements
    info = dict(info, collective="all_reduce", algorithm=algorithm, pes=list(pes), bytes=x.nbytes,
                after=x.pending.cmd_id if x.pending is not None else None,
                model_ps=model_ps(P, algorithm, n, x.nbytes // n,
                                  lambda a, b: tl.link_figures(pes[a], pes[b]), tl.math_ps) if P > 1 else 0)
    with tl.phase(name, **info):
        if P == 1:
            return
        # chunks are row windows of a flat view of x: rows of one chunk when P divides n
        width = n // P if n % P == 0 else 1
        flat = tl.reshape(x, (n // width, width))
        bounds = chunks(n, P)
        with tl.scratch_scope():
            if algorithm == "ring":
                tmp = {c: tl.empty(((c1 - c0) // width, width), f"ar_recv{c}") for c, (c0, c1) in enumerate(bounds)}
            else:
                others = P - 1 if algorithm == "direct" else 1
                tmp = {i: tl.empty(x.shape, f"ar_recv{i}") for i in range(others)}
                if algorithm == "direct":
                    tmp["sum"] = tl.empty(x.shape, "ar_sum")

            def view(buf):
                if buf[0] == "tmp":
                    return tmp[buf[1]]
                if buf[1] is None:
                    return x
                c0, c1 = bounds[buf[1]]
                return flat[c0 // width:c1 // width]

            for st in plan(P, algorithm)[rank]:
                if st[0] == "send":
                    tl.send(view(st[2]), pes[st[1]])
                elif st[0] == "recv":
                    dst = view(st[2])
                    tl.recv_async(dst.shape, pes[st[1]], out=dst)
                else:
                    tl.add(view(st[1]), view(st[2]), out=view(st[3]))
