"""Whether a loop's jump can be put back (kbframe.run.skipped): the verdicts on one jump,
after the run (:func:`check_jump`), early, once the period after the jump is in
(:func:`probe`), and before the loop jumps (:func:`repeats`).

Why a jump can be put back: the engine is deterministic and shift-invariant, and a loop
whose every iteration lowers alike, entered in a state that repeats every ``p``
iterations, runs the same whether ``R`` (a multiple of ``p``) more iterations come first or
not, only later. So the simulated run is the full run with ``R / p`` periods taken out
where the loop jumped. What is checked before they are put back, per loop that jumped:

* the records around the jump repeat, one period after the other (from the first of
  the iterations the totals are taken at to a period after the jump, every field of
  every record, what it waited for included), each moved as kbframe.run.moves says;
* every total (records, bytes, busy time, FLOPs, dispatches, link traffic) grows by the
  same amount over each of the two periods before the jump, and the records between
  those snapshots are one period's;
* every PE with records after the jump jumped with the loop, by the same ``R``;
* no command issued before the loop, started before the jump, ends after the records
  checked (in flight across the jump: its times would not move in the full run);
* a weight GEMM's tiles ran alone from its jump to its last transfer (:func:`_alone`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..record_fields import FIELDS
from ..sim.steady import Instance
from ..sorting import groups
from .moves import ADMITTED, CMD, SAME, T0, TILE, TIMES, WHY, Mover, TileMover, gemm_tiles
from .periodic import is_peak


class NotSteady(Exception):
    """The simulated run does not show the stretch it left out was steady (module doc).
    ``upto``: when the verdict read nothing of the run but its first ``upto`` records and
    the loop's own decision, that many (a simulation that makes the same first records is
    refused alike); else None."""

    def __init__(self, message: str, upto: int | None = None):
        super().__init__(message, upto)  # both in args: SimPy re-raises a process's exception as type(e)(*e.args)
        self.upto = upto

    def __str__(self) -> str:
        return self.args[0]


def _check(rows: np.ndarray, pe_of: np.ndarray, k: str, inst, p: int, per_pe: "PerPe") -> tuple:
    """Check the records ``rows`` around one jump (module doc) for period ``p`` and return
    ``(x, P, dt, mover)``: the first record after the jump, the records and ps of a period,
    and how records move (``k``: the loop as messages name it, ``0 of <axis key>``;
    ``per_pe``: the PEs' records in ``rows``). Raises NotSteady."""
    J = inst.J
    snaps = inst.snaps
    if any(J - j not in snaps or any(J - j not in ids for ids in inst.ids.values()) for j in (0, p, 2 * p)):
        raise NotSteady(f"loop {k}: jumped {J} iterations in, before two periods of {p}", upto=0)
    n0, n1, n2 = snaps[J - 2 * p][0], snaps[J - p][0], snaps[J][0]
    P = n2 - n1
    if P <= 0 or n1 - n0 != P:
        raise NotSteady(f"loop {k}: {n1 - n0} then {P} records over the last two periods of {p} before its jump",
                        upto=0)
    per_period = {pe: ids[J] - ids[J - p] for pe, ids in inst.ids.items()}
    first = {pe: inst.first[pe] for pe in inst.jumped}
    if inst.tiles and any(per_period.values()):
        q = min(pe for pe, n in per_period.items() if n)
        raise NotSteady(f"loop {k}: PE{q} dispatched {per_period[q]} command(s) in a period of {p} of its tiles")
    x = _first_after(rows, pe_of, inst, n2)
    if x is None:
        raise NotSteady(f"loop {k}: no record after its jump")
    lo, hi = min(n1, x - P), x + P
    if lo - P < 0 or hi > len(rows):
        raise NotSteady(f"loop {k}: fewer than two periods of {p} before its jump or one after")
    others = sorted(q for q, at in per_pe.last.items() if at >= x and q not in inst.jumped)
    if others:
        raise NotSteady(f"loop {k}: PE{others[0]} works after the jump but did not jump")
    for q in sorted(inst.jumped):  # a command from before the loop, in flight across the jump, not checked
        i = per_pe.older(q, hi, inst.first[q], int(rows[x, T0]))
        if i is not None:
            raise NotSteady(f"loop {k}: record {i}, of PE{q}'s command {int(rows[i, CMD])} from before the loop, "
                            f"started before the jump and ends after the periods checked")
    if inst.tiles:
        _alone(rows, pe_of, k, inst, lo - P, x, hi)
    dt = int(rows[lo, T0] - rows[lo - P, T0])
    mover = (TileMover(rows, pe_of, first, dt, P, p * inst.tiles) if inst.tiles else
             Mover(rows, pe_of, first, per_period, dt, P))
    moved = mover.move(rows[lo - P:hi - P], 1)
    bad = np.nonzero((moved != rows[lo:hi]).any(axis=1))[0]
    if len(bad):
        i = lo + int(bad[0])
        f = FIELDS[int(np.nonzero(moved[bad[0]] != rows[i])[0][0])]
        raise NotSteady(f"loop {k}: record {i} is not record {i - P} a period of {p} later ({f})",
                        upto=None if inst.tiles else hi)  # a weight GEMM's were read further (_alone)
    return x, P, dt, mover


def _alone(rows: np.ndarray, pe_of: np.ndarray, k: str, inst, start: int, x: int, hi: int) -> None:
    """Raise NotSteady unless a weight GEMM's tiles run alone from its jump (record ``x``)
    to its last transfer on each PE: a record from ``x`` on that starts before that PE's
    last transfer of the GEMM does is one of the GEMM's, or a command's record whose start,
    its admission, came before the jump (the GEMM's own, those queued behind it; its start
    is kept). Anything else (a dispatch, an admission, another command's stage) runs beside
    the tiles, at times the jump does not move as it moves them (a PE_CPU slower than the
    tiles, a command waiting on one that is not the GEMM). The records of the periods
    compared (``start`` to ``hi``) are the GEMM's tiles', and none after them is of a tile
    before the jump (a GEMM-bound GEMV: its GEMM stages lag its transfers)."""
    n_pes = int(pe_of.max()) + 1
    first = np.full(n_pes, -1, dtype=np.int64)
    for q, c in inst.first.items():
        first[q] = c
    y = _gemm_done(rows, pe_of, first, inst, x, hi)  # after the GEMM's last record on every PE
    r = rows[x:y]
    own = gemm_tiles(r, pe_of, first)
    last = np.full(n_pes, -1, dtype=np.int64)  # per PE: when its last transfer of the GEMM starts
    tiles = r[own]
    t_pe = pe_of[tiles[:, 0]]
    for q in inst.first:
        mine = tiles[t_pe == q]
        if len(mine):
            last[q] = mine[mine[:, TILE] == mine[:, TILE].max(), T0].min()
    t_jump = rows[x, T0]

    def beside(sub):  # not the GEMM's, nor a command admitted before the jump, and started before the last transfer
        pe = pe_of[sub[:, 0]]
        kept = (sub[:, CMD] == first[pe]) | (np.isin(sub[:, WHY], ADMITTED) & (sub[:, T0] < t_jump))
        return ~kept & (sub[:, T0] < last[pe])
    hit = x + np.nonzero(beside(r))[0]
    if not len(hit):  # later records (none the GEMM's): one that started before its last transfer
        later = y + np.nonzero(rows[y:, T0] < last.max())[0]
        hit = later[beside(rows[later])]
    if len(hit):
        i = int(hit[0])
        raise NotSteady(f"loop {k}: record {i}, of PE{int(pe_of[rows[i, 0]])}'s command {int(rows[i, CMD])}, "
                        f"ran beside the tiles after the jump")
    odd = np.nonzero(~gemm_tiles(rows[start:hi], pe_of, first))[0]  # the periods compared: the GEMM's tiles alone
    if len(odd):
        i = start + int(odd[0])
        raise NotSteady(f"loop {k}: record {i}, of PE{int(pe_of[rows[i, 0]])}'s command {int(rows[i, CMD])}, "
                        f"ran beside the tiles of the periods checked")
    # a tile from before the jump whose records come after the periods checked: the GEMM's
    # units lag its transfers by more than those periods (a GEMM-bound GEMV), unchecked
    behind = np.nonzero(own[hi - x:] & (r[hi - x:, TILE] < inst.J * inst.tiles))[0]
    if len(behind):
        i = hi + int(behind[0])
        raise NotSteady(f"loop {k}: record {i}, of tile {int(rows[i, TILE])} before the jump, comes after the "
                        f"periods checked")


def _gemm_done(rows: np.ndarray, pe_of: np.ndarray, first: np.ndarray, inst, x: int, hi: int) -> int:
    """The record after the weight GEMM's last record on every PE that jumped (its
    command's record, at its completion), looked for from ``x`` in windows that double."""
    w = max(hi - x, 1024)
    while True:
        r = rows[x:x + w]
        done = np.isin(r[:, WHY], ADMITTED) & (r[:, CMD] == first[pe_of[r[:, 0]]])
        at = np.nonzero(done)[0]
        if len(set(pe_of[r[at, 0]].tolist())) == len(inst.first) or x + w >= len(rows):
            return x + int(at.max()) + 1 if len(at) else len(rows)
        w *= 2


def _first_after(rows: np.ndarray, pe_of: np.ndarray, inst, start: int, chunk: int = 4096) -> int | None:
    """The first record from ``start`` on (the records when the first PE reached the jump)
    of a command a PE issued after its jump (a weight GEMM's tile loop: of a tile after
    it); None: none."""
    ids = np.full(int(pe_of.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    for q in inst.jumped:
        ids[q] = inst.first[q] if inst.tiles else inst.ids[q][inst.J]
    for a in range(start, len(rows), chunk):
        r = rows[a:a + chunk]
        if inst.tiles:
            hit = np.nonzero((r[:, CMD] == ids[pe_of[r[:, 0]]]) & (r[:, TILE] >= inst.J * inst.tiles))[0]
        else:
            hit = np.nonzero(r[:, CMD] >= ids[pe_of[r[:, 0]]])[0]
        if len(hit):
            return a + int(hit[0])
    return None


class PerPe:
    """Each PE's records in a table, for the checks of its jumps: its last record, and from
    any record on the lowest command id of its records."""

    def __init__(self, rows: np.ndarray, pe_of: np.ndarray):
        pe = pe_of[rows[:, 0]]
        self.rows = rows
        order, pes, starts = groups(pe)  # each PE's records in record order, one sort for all
        self.at = dict(zip(pes.tolist(), np.split(order, starts[1:])))
        self.last = {q: int(at[-1]) for q, at in self.at.items()}
        self.low = {q: np.minimum.accumulate(rows[at, CMD][::-1])[::-1] for q, at in self.at.items()}

    def older(self, q: int, hi: int, first: int, t: int) -> int | None:
        """The first of ``q``'s records from ``hi`` on of a command older than ``first``
        that started before ``t`` (None: none)."""
        at = self.at.get(q)
        j = int(np.searchsorted(at, hi)) if at is not None else 0
        if at is None or j == len(at) or self.low[q][j] >= first:
            return None
        r = self.rows[at[j:]]
        hit = np.nonzero((r[:, CMD] < first) & (r[:, T0] < t))[0]
        return int(at[j + hit[0]]) if len(hit) else None



def _delta(a: dict, b: dict) -> dict:
    return {n: b[n] - a.get(n, 0) for n in b if not is_peak(n)}


class PutBack(NamedTuple):
    """One loop's jump, checked: its first record after the jump ``x``, a period's records
    ``P`` and ps ``dt``, how its records move, the periods put back ``X`` of ``p``
    iterations, how the totals grow a period, the loop (its ids and record counts in the
    table the jump is put back into) and its commands a period per PE, the loop as it was
    simulated (``simulated``) and the jumps of nested loops a period of it holds
    (``inner``)."""
    x: int
    P: int
    dt: int
    mover: "Mover"
    X: int
    p: int
    delta: dict
    inst: Instance
    per_period: dict
    simulated: Instance
    inner: tuple = ()


def _after(inst: Instance, placed: list) -> tuple[Instance, dict]:
    """``inst`` (a loop as simulated) with its ids and record counts where the jumps
    ``placed`` (of nested loops, put back into the simulated table) moved them, and per
    iteration it kept, the jumps put back before it."""
    counts = {i: snap[0] for i, snap in inst.snaps.items()}
    before = {i: [b for b in placed if b.x < n] for i, n in counts.items()}
    counts = {i: n + sum(b.X * b.P for b in before[i]) for i, n in counts.items()}

    def cmd(pe: int, c: int) -> int:
        return c + sum(b.X * b.per_period[pe] for b in placed if pe in b.per_period and c >= b.inst.ids[pe][b.inst.J])
    moved = replace(inst, snaps={i: (counts[i], *snap[1:]) for i, snap in inst.snaps.items()},
                    ids={pe: {i: cmd(pe, c) for i, c in d.items()} for pe, d in inst.ids.items()},
                    first={pe: cmd(pe, c) for pe, c in inst.first.items()})
    return moved, before


def check_jump(rows, pe_of, k: str, sim_inst: Instance, periods: tuple, placed: list, per_pe: PerPe) -> PutBack:
    """Check one loop's jump in ``rows`` (the simulated records, with the jumps of nested
    loops ``placed`` put back): the period it looked steady with first, then the others
    that divide its jump (``k``: the loop, as :func:`_check` names it). Raises NotSteady."""
    inst, before = _after(sim_inst, placed)
    why, upto = None, 0  # the first refusal, and the records every refusal read (NotSteady.upto)

    def refused(e: NotSteady, read: int | None) -> NotSteady:
        nonlocal upto
        upto = None if upto is None or read is None or inst.tiles else max(upto, read)
        return why or e
    for p in sorted(periods, key=lambda q: q != inst.p):
        if inst.R % p:
            continue
        try:
            x, P, dt, mover = _check(rows, pe_of, k, inst, p, per_pe)
        except NotSteady as e:
            why = refused(e, e.upto)
            continue
        a, b, c = (sim_inst.snaps[inst.J - j][1] for j in (2 * p, p, 0))
        if None in (a, b, c):  # taken before the loop's first commands completed (snapshot)
            why = refused(NotSteady(f"loop {k}: its first commands had not run {2 * p} iterations before its jump"),
                          x + P)
            continue
        d = _delta(b, c)
        if d != _delta(a, b) or any(c[n] != b[n] for n in c if is_peak(n)):
            why = refused(NotSteady(f"loop {k}: the totals grow unevenly over two periods of {p}"), x + P)
            continue
        inner = tuple(j for j in before[inst.J] if all(j is not e for e in before[inst.J - p]))
        for j in inner:  # a period holds these nested jumps: it grows by what they put back too
            for n, v in j.delta.items():
                d[n] = d.get(n, 0) + j.X * v
        per_period = {pe: ids[inst.J] - ids[inst.J - p] for pe, ids in inst.ids.items()}
        return PutBack(x, P, dt, mover, inst.R // p, p, d, inst, per_period, sim_inst, inner)
    why = why or NotSteady(f"loop {k}: no candidate period divides its jump of {inst.R}")
    raise NotSteady(str(why), upto)


def repeats(engine, inst: Instance, i: int, periods: tuple) -> bool:
    """Whether, for one of ``periods`` (those :func:`check_jump` would try for a jump at
    iteration ``i`` of the loop ``inst``), the simulated records of the two periods before
    ``i`` repeat, as far as one PE's command ids do not come into it: names, tiles, bytes,
    peers and waits alike, times a period later (``Steady.repeats``). Of a loop of the
    innermost level that jumps they are among the records :func:`_check` compares a period
    apart after such a jump, so a jump every period would refuse is not made; of a loop
    whose nested loops jump they hold those jumps as simulated, alike in both periods when
    the nested loops jumped alike."""
    for p in periods:
        if any(i - j * p not in inst.snaps for j in (1, 2)):
            continue  # _check refuses it too: fewer than two periods before the jump
        n0, n1, n2 = (inst.snaps[i - j * p][0] for j in (2, 1, 0))
        P = n2 - n1
        if P <= 0 or n1 - n0 != P:
            continue
        a = engine.oplog.table.array(n0, n2)
        before, after = a[:P], a[P:]
        dt = int(after[0, T0] - before[0, T0])
        if np.array_equal(after[:, SAME], before[:, SAME]) and np.array_equal(
                after[:, TIMES], before[:, TIMES] + np.where(before[:, TIMES] >= 0, dt, 0)):
            return True
    return False


def probe(engine, inst: Instance, k: int, periods: tuple):
    """An early verdict on a loop's jump (``Steady.probe``; ``inst`` the ``k``-th loop of
    its axis, of the innermost level that jumps, every PE having jumped): once the records
    of the period after the jump are in, :func:`check_jump` on the records so far. Every
    reason it can refuse for is final by then (what comes later does not change the
    records it read, nor a PE that jumped), so a refusal (the NotSteady, returned) is
    :func:`kbframe.run.skipped.make`'s too; False when it holds (make checks it again,
    with what follows); else the records to wait for."""
    table = engine.oplog.table
    J = inst.J
    snaps = inst.snaps
    if J not in snaps:
        return False
    n2 = snaps[J][0]
    P = max((n2 - snaps[J - p][0] for p in periods if J - p in snaps), default=0)  # the longest period's records
    if len(table) < n2 + P:
        return n2 + P
    rows = table.array()
    pe_of = np.array(table.name_col(0), dtype=np.int64)
    x = _first_after(rows, pe_of, inst, n2)
    if x is None or x + P > len(rows):  # the period after the jump is not in yet
        return (x if x is not None else len(rows)) + P + 1
    try:
        check_jump(rows, pe_of, f"{k} of {inst.key}", inst, periods, [], PerPe(rows, pe_of))
    except NotSteady as e:
        return e
    return False
