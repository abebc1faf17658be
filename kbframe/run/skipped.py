"""Fast-forward in one simulation: the run is simulated once with a :class:`~kbframe.sim.steady.Steady`
on its engine, whose loops along the periodic axis leave out a steady stretch of ``R``
iterations (kbframe.sim.steady), and the full run is made from it here by putting the
stretch back. Tried before the short copies of :mod:`kbframe.run.fastforward`, which remain
what a run that this cannot make falls back on.

Why it holds: the engine is deterministic and shift-invariant, and a loop whose every
iteration lowers alike, entered in a state that repeats every ``p`` iterations, runs the
same whether ``R`` (a multiple of ``p``) more iterations come first or not, only later. So
the simulated run is the full run with ``R / p`` periods taken out where the loop jumped.
What is checked before they are put back, per loop that jumped:

* the records around the jump repeat, one period after the other (from the first of
  the iterations the totals are taken at to a period after the jump, every field of
  every record, what it waited for included), each moved by the rules below;
* every total (records, bytes, busy time, FLOPs, dispatches, link traffic) grows by the
  same amount over each of the two periods before the jump, and the records between
  those snapshots are one period's;
* every PE with records after the jump jumped with the loop, by the same ``R``;
* no command issued before the loop, started before the jump, ends after the records
  checked (in flight across the jump: its times would not move in the full run).

A period later, a record has moved thus: its times by the period's time; its command id
(and a command-id ``ref``) by the commands its PE issues in a period, when the command is
the loop's or later (at or after the loop's first command on that PE); a record-index
``ref`` by the period's records, when the record it names is the loop's or later. The full
run's records are those before the jump, ``R / p`` periods made by moving the period
before it, then the rest moved by all of them (numpy, a column at a time); its totals
grow by ``R / p`` times a period's, its ``tl.phase`` annotations the same way.

Loops along an axis nested in the periodic axis's steps (a decoder layer's KV tiles,
``Workload.nested_axes``) are put back first, all their jumps in one pass; the jumps of the
loops they are nested in are then checked in, and put back into, the records so made,
their command ids and record counts where the nested jumps moved them, a period's growth
including what the nested jumps inside it put back.
"""
from __future__ import annotations

import bisect
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..hw.tiling import left_out, plan_key, plan_units_key, whole
from ..record_fields import FIELDS, N, ROW
from ..records import RecordTable
from ..repeated import RepeatedTable
from ..sim import access_templates, sanitizer
from ..sim.steady import Instance, Steady
from ..sim.waits import WAIT_CODE
from ..sorting import groups
from .periodic import is_peak, running_totals

_CMD, _TILE, _T0, _T1, _TD, _WHY, _REF = (FIELDS.index(f) for f in ("cmd", "tile", "t0", "t1", "td", "why", "ref"))
#: wait kinds whose ``ref`` is a command id (the others name a record, kbframe.sim.waits)
_CMD_REFS = np.array([WAIT_CODE[k] for k in ("room", "wait", "dispatch", "hazard", "fifo", "admit")])
#: ... the waits of a command's record (its admission: its start)
_ADMITTED = np.array([WAIT_CODE[k] for k in ("dispatch", "hazard", "fifo")])
#: ... and those whose ``ref`` is a record index (a stage's raw kinds -1 and -2 too)
_RECORD_REFS = np.array([WAIT_CODE[k] for k in ("cpu", "dep", "unit", "link")] + [-1, -2])
#: the fields a period does not move, and its times (``td`` -1: none, not moved)
_SAME = [FIELDS.index(f) for f in ("name", "tile", "bytes", "peer", "why")]
_TIMES = [_T0, _T1, _TD]


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


class _Mover:
    """Moves records of a table by whole periods of one jump (module doc's rules)."""

    def __init__(self, rows: np.ndarray, pe_of: np.ndarray, first: dict, per_period: dict, dt: int, P: int):
        """``rows``: the table's records; ``pe_of``: each name code's PE; ``first``: the
        loop's first command id per PE that jumped; ``per_period``: the commands such a PE
        issues in a period; ``dt``, ``P``: a period's ps and records."""
        n_pes = int(pe_of.max()) + 1 if len(pe_of) else 1
        self.pe_of = pe_of
        self.first = np.full(n_pes, np.iinfo(np.int64).max, dtype=np.int64)
        self.dcmd = np.zeros(n_pes, dtype=np.int64)
        for pe, c in first.items():
            self.first[pe], self.dcmd[pe] = c, per_period[pe]
        self.first_of = dict(first)
        self.dt, self.P = dt, P
        self.of(rows)

    def of(self, rows: np.ndarray) -> None:
        """Take ``rows`` as the table the records to move are in (their record refs name its records)."""
        self.rows = rows

    def looped(self, at: np.ndarray) -> np.ndarray:
        """Whether each record ``at`` (of the table :meth:`of` took) is the loop's or later."""
        return self.rows[at, _CMD] >= self.first[self.pe_of[self.rows[at, 0]]]  # two fields, not whole rows

    def step(self, rows: np.ndarray) -> np.ndarray:
        """How much each field of ``rows`` (of the table :meth:`of` took) moves a period."""
        d = np.zeros_like(rows)
        d[:, _T0] = d[:, _T1] = self.dt
        d[:, _TD] = np.where(rows[:, _TD] >= 0, self.dt, 0)
        pe = self.pe_of[rows[:, 0]]
        first, dcmd = self.first[pe], self.dcmd[pe]
        d[:, _CMD] = np.where(rows[:, _CMD] >= first, dcmd, 0)
        why, ref = rows[:, _WHY], rows[:, _REF]
        by_cmd = np.isin(why, _CMD_REFS) & (ref >= first)
        by_rec = np.isin(why, _RECORD_REFS) & (ref >= 0)
        by_rec[by_rec] = self.looped(ref[by_rec])
        d[:, _REF] = np.where(by_cmd, dcmd, 0) + np.where(by_rec, self.P, 0)
        return d

    def move(self, rows: np.ndarray, k: int) -> np.ndarray:
        """``rows`` (of the table :meth:`of` took) moved by ``k`` periods (a copy)."""
        return rows + k * self.step(rows)

    def periods(self, rows: np.ndarray, X: int, plus: np.ndarray | None = None,
                out: np.ndarray | None = None) -> np.ndarray:
        """``rows`` (one period) moved by 1, 2, .. ``X`` periods, one after the other, each
        also by ``plus`` (as ``rows``) if given; into ``out`` (``X * len(rows)`` rows) if
        given. A period at a time: no ``X``-fold temporaries."""
        out = np.empty((X * len(rows), N), dtype=np.int64) if out is None else out
        step = self.step(rows)
        base = rows if plus is None else rows + plus
        for k in range(X):
            part = out[k * len(rows):(k + 1) * len(rows)]
            np.multiply(step, k + 1, out=part)
            part += base
        return out


def _gemm_tiles(rows: np.ndarray, pe_of: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` is a tile's record of its PE's weight GEMM (``first[pe]``:
    the GEMM's command; -1 or another id where a PE has none)."""
    return (rows[:, _CMD] == first[pe_of[rows[:, 0]]]) & (rows[:, _TILE] >= 0)


class _TileMover(_Mover):
    """Moves records by whole periods of a weight GEMM's tile loop (kbframe.sim.steady
    ``WEIGHT_TILES``): no command is issued in a period, so command ids stay; a record
    of the GEMM's command (``first``, per PE) moves its tile by the period's tiles, and a
    record ``ref`` moves by the period's records when it names one of that command's
    tiles' records (they repeat; its prologue does not, and the commands after it were
    issued before the jump)."""

    def __init__(self, rows, pe_of, first: dict, dt: int, P: int, tiles: int):
        super().__init__(rows, pe_of, first, dict.fromkeys(first, 0), dt, P)
        self.tiles = tiles

    def looped(self, at: np.ndarray) -> np.ndarray:
        return _gemm_tiles(self.rows[at], self.pe_of, self.first)

    def step(self, rows: np.ndarray) -> np.ndarray:
        d = super().step(rows)
        d[:, _TILE] = np.where(_gemm_tiles(rows, self.pe_of, self.first), self.tiles, 0)
        return d


def _check(rows: np.ndarray, pe_of: np.ndarray, k: str, inst, p: int, per_pe: "_PerPe") -> tuple:
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
        i = per_pe.older(q, hi, inst.first[q], int(rows[x, _T0]))
        if i is not None:
            raise NotSteady(f"loop {k}: record {i}, of PE{q}'s command {int(rows[i, _CMD])} from before the loop, "
                            f"started before the jump and ends after the periods checked")
    if inst.tiles:
        _alone(rows, pe_of, k, inst, lo - P, x, hi)
    dt = int(rows[lo, _T0] - rows[lo - P, _T0])
    mover = (_TileMover(rows, pe_of, first, dt, P, p * inst.tiles) if inst.tiles else
             _Mover(rows, pe_of, first, per_period, dt, P))
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
    own = _gemm_tiles(r, pe_of, first)
    last = np.full(n_pes, -1, dtype=np.int64)  # per PE: when its last transfer of the GEMM starts
    tiles = r[own]
    t_pe = pe_of[tiles[:, 0]]
    for q in inst.first:
        mine = tiles[t_pe == q]
        if len(mine):
            last[q] = mine[mine[:, _TILE] == mine[:, _TILE].max(), _T0].min()
    t_jump = rows[x, _T0]

    def beside(sub):  # not the GEMM's, nor a command admitted before the jump, and started before the last transfer
        pe = pe_of[sub[:, 0]]
        kept = (sub[:, _CMD] == first[pe]) | (np.isin(sub[:, _WHY], _ADMITTED) & (sub[:, _T0] < t_jump))
        return ~kept & (sub[:, _T0] < last[pe])
    hit = x + np.nonzero(beside(r))[0]
    if not len(hit):  # later records (none the GEMM's): one that started before its last transfer
        later = y + np.nonzero(rows[y:, _T0] < last.max())[0]
        hit = later[beside(rows[later])]
    if len(hit):
        i = int(hit[0])
        raise NotSteady(f"loop {k}: record {i}, of PE{int(pe_of[rows[i, 0]])}'s command {int(rows[i, _CMD])}, "
                        f"ran beside the tiles after the jump")
    odd = np.nonzero(~_gemm_tiles(rows[start:hi], pe_of, first))[0]  # the periods compared: the GEMM's tiles alone
    if len(odd):
        i = start + int(odd[0])
        raise NotSteady(f"loop {k}: record {i}, of PE{int(pe_of[rows[i, 0]])}'s command {int(rows[i, _CMD])}, "
                        f"ran beside the tiles of the periods checked")
    # a tile from before the jump whose records come after the periods checked: the GEMM's
    # units lag its transfers by more than those periods (a GEMM-bound GEMV), unchecked
    behind = np.nonzero(own[hi - x:] & (r[hi - x:, _TILE] < inst.J * inst.tiles))[0]
    if len(behind):
        i = hi + int(behind[0])
        raise NotSteady(f"loop {k}: record {i}, of tile {int(rows[i, _TILE])} before the jump, comes after the "
                        f"periods checked")


def _gemm_done(rows: np.ndarray, pe_of: np.ndarray, first: np.ndarray, inst, x: int, hi: int) -> int:
    """The record after the weight GEMM's last record on every PE that jumped (its
    command's record, at its completion), looked for from ``x`` in windows that double."""
    w = max(hi - x, 1024)
    while True:
        r = rows[x:x + w]
        done = np.isin(r[:, _WHY], _ADMITTED) & (r[:, _CMD] == first[pe_of[r[:, 0]]])
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
            hit = np.nonzero((r[:, _CMD] == ids[pe_of[r[:, 0]]]) & (r[:, _TILE] >= inst.J * inst.tiles))[0]
        else:
            hit = np.nonzero(r[:, _CMD] >= ids[pe_of[r[:, 0]]])[0]
        if len(hit):
            return a + int(hit[0])
    return None


class _PerPe:
    """Each PE's records in a table, for the checks of its jumps: its last record, and from
    any record on the lowest command id of its records."""

    def __init__(self, rows: np.ndarray, pe_of: np.ndarray):
        pe = pe_of[rows[:, 0]]
        self.rows = rows
        order, pes, starts = groups(pe)  # each PE's records in record order, one sort for all
        self.at = dict(zip(pes.tolist(), np.split(order, starts[1:])))
        self.last = {q: int(at[-1]) for q, at in self.at.items()}
        self.low = {q: np.minimum.accumulate(rows[at, _CMD][::-1])[::-1] for q, at in self.at.items()}

    def older(self, q: int, hi: int, first: int, t: int) -> int | None:
        """The first of ``q``'s records from ``hi`` on of a command older than ``first``
        that started before ``t`` (None: none)."""
        at = self.at.get(q)
        j = int(np.searchsorted(at, hi)) if at is not None else 0
        if at is None or j == len(at) or self.low[q][j] >= first:
            return None
        r = self.rows[at[j:]]
        hit = np.nonzero((r[:, _CMD] < first) & (r[:, _T0] < t))[0]
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
    mover: "_Mover"
    X: int
    p: int
    delta: dict
    inst: Instance
    per_period: dict
    simulated: Instance
    inner: tuple = ()


class Made:
    """The full run made from a run that skipped: its record table, totals (by name, as
    kbframe.run.periodic.totals names them), latency (ps), ``tl.phase`` annotations, the
    summary's note, the records of the shortest period of the outermost loops that jumped,
    and its jumps (:class:`PutBack`); with a :class:`~kbframe.repeated.RepeatedTable`,
    ``simulated``: the simulated run's phases, and per PE the first command of the period
    put back and its commands (kbframe.run.phases.Repeated)."""

    def __init__(self, table, tot, latency_ps, phases, note, period, jumps, simulated=None):
        self.table, self.tot, self.latency_ps, self.phases = table, tot, latency_ps, phases
        self.note, self.period, self.jumps, self.simulated = note, period, jumps, simulated


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


def _put_back(rows, pe_of, k: str, sim_inst: Instance, periods: tuple, placed: list, per_pe: _PerPe) -> PutBack:
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


def _shifts(rows: np.ndarray, pe_of: np.ndarray, found: list, before: np.ndarray, table: np.ndarray) -> np.ndarray:
    """How far the jumps ``found`` (in record order) move each record of ``rows`` (records
    of ``table``, the simulated one, or copies of them) when ``before[i]`` of them come
    before it: the sum of each such jump's moves (module doc's rules; a command, a
    command ``ref`` or the record a ``ref`` names is the loop's or later from one loop's
    first command on, and the loops' first commands on a PE come in record order), from
    prefix sums per PE rather than one jump at a time."""
    d = np.zeros_like(rows)
    dt = np.concatenate(([0], np.cumsum([f.X * f.dt for f in found])))
    d[:, _T0] = d[:, _T1] = dt[before]
    d[:, _TD] = np.where(rows[:, _TD] >= 0, dt[before], 0)
    pe = pe_of[rows[:, 0]]
    why, ref = rows[:, _WHY], rows[:, _REF]
    by_cmd = np.isin(why, _CMD_REFS)
    by_rec = np.nonzero(np.isin(why, _RECORD_REFS) & (ref >= 0))[0]
    t_pe = pe_of[table[ref[by_rec], 0]]
    t_cmd = table[ref[by_rec], _CMD]
    for q in np.unique(np.concatenate([pe, t_pe])).tolist():
        mine = [j for j, f in enumerate(found) if q in f.mover.first_of and not f.inst.tiles]
        if not mine:
            continue
        idx = np.array(mine, dtype=np.int64)
        first = np.array([found[j].mover.first_of[q] for j in mine], dtype=np.int64)
        w_cmd = np.concatenate(([0], np.cumsum([found[j].X * found[j].per_period[q] for j in mine])))
        w_rec = np.concatenate(([0], np.cumsum([found[j].X * found[j].P for j in mine])))

        def upto(at, c):  # the jumps of this PE before the record whose loops' first command is c or earlier
            return np.minimum(np.searchsorted(idx, before[at], side="left"), np.searchsorted(first, c, side="right"))
        at = np.nonzero(pe == q)[0]
        d[at, _CMD] = w_cmd[upto(at, rows[at, _CMD])]
        c = at[by_cmd[at]]
        d[c, _REF] = w_cmd[upto(c, ref[c])]
        t = np.nonzero(t_pe == q)[0]
        d[by_rec[t], _REF] += w_rec[upto(by_rec[t], t_cmd[t])]
    if any(f.inst.tiles for f in found):
        _tile_shifts(d, rows, pe_of, found, before, table, pe, by_rec, t_pe, t_cmd)
    return d


def _tile_shifts(d, rows, pe_of, found, before, table, pe, by_rec, t_pe, t_cmd) -> None:
    """:func:`_shifts`' part for the jumps of weight GEMMs' tile loops (:class:`_TileMover`'s
    rules over all of them): a record of such a GEMM's command after its jump moves its
    tile by the tiles put back; a command's record after a jump keeps its start (its
    admission) when that came before the jump; a record ``ref`` moves by the records a jump put back
    when the jump comes before the record that names it and after the one named, or that
    one is of the jump's GEMM's tiles (a period of them repeats)."""
    at = np.array([j for j, f in enumerate(found) if f.inst.tiles], dtype=np.int64)
    tiles = [found[j] for j in at]
    xs = np.array([f.x for f in tiles], dtype=np.int64)
    w_rec = np.concatenate(([0], np.cumsum([f.X * f.P for f in tiles])))
    keys, jump = [], []  # (pe, the GEMM's command) of each jump, and the jump (its place among the tile jumps)
    for j, f in enumerate(tiles):
        for q, c in f.mover.first_of.items():
            keys.append((q << 40) | c)  # command ids are below 2^40
            jump.append(j)
    order = np.argsort(keys)
    keys, jump = np.array(keys, dtype=np.int64)[order], np.array(jump, dtype=np.int64)[order]

    def jump_of(q, c):  # the tile jump of each (pe, command), -1: none
        k = (q << 40) | c
        i = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        return np.where(keys[i] == k, jump[i], -1)
    gone = np.searchsorted(at, before, side="left")  # tile jumps before each record
    # a command admitted before a jump (the GEMM's own, one behind it) keeps its start
    adm = np.nonzero(np.isin(rows[:, _WHY], _ADMITTED) & (gone > 0))[0]
    for j, f in enumerate(tiles):
        held = adm[(gone[adm] > j) & (rows[adm, _T0] < table[f.x, _T0])]
        d[held, _T0] -= f.X * f.dt
    j = jump_of(pe, rows[:, _CMD])
    moves = (j >= 0) & (j < gone) & (rows[:, _TILE] >= 0)
    d[moves, _TILE] += np.array([f.X * f.mover.tiles for f in tiles], dtype=np.int64)[j[moves]]
    if len(by_rec):
        s = rows[by_rec, _REF]
        past = np.minimum(np.searchsorted(xs, s, side="right"), gone[by_rec])  # jumps between: those before s
        add = w_rec[past]
        js = jump_of(t_pe, t_cmd)
        js[table[s, _TILE] < 0] = -1  # a GEMM's prologue does not repeat
        own = (js >= 0) & (js == past) & (js < gone[by_rec])  # the next jump after it is its GEMM's tiles'
        add[own] += np.array([f.X * f.P for f in tiles], dtype=np.int64)[js[own]]
        d[by_rec, _REF] += add


def _in_order(found: list) -> bool:
    """Whether the jumps ``found`` (in record order) can be put back in one pass
    (:func:`_shifts`): distinct places, and on each PE the loops' first commands in that
    order."""
    xs = [f.x for f in found]
    if any(a >= b for a, b in zip(xs, xs[1:])):
        return False
    seen: dict = {}
    for f in found:
        for q, c in f.mover.first_of.items():
            if c < seen.get(q, -1):
                return False
            seen[q] = c
    return True


def _put_back_all(rows: np.ndarray, pe_of: np.ndarray, found: list, out: np.ndarray | None = None) -> np.ndarray:
    """``rows`` with the periods of every jump ``found`` (in record order, :func:`_in_order`)
    put back, in one pass: each jump's periods made by moving the period before it (and by
    the jumps before it), the records between moved by every jump before them; into
    ``out`` if given."""
    xs = np.array([f.x for f in found], dtype=np.int64)
    n = len(rows) + sum(f.X * f.P for f in found)
    out = np.empty((n, N), dtype=np.int64) if out is None else out
    before = np.searchsorted(xs, np.arange(len(rows)), side="right")
    at = 0
    for j, f in enumerate([None, *found]):
        if f is not None:  # its periods: the period before it moved 1..X periods, and by the jumps before it
            tmpl = rows[f.x - f.P:f.x]
            f.mover.of(rows)
            f.mover.periods(tmpl, f.X, _shifts(tmpl, pe_of, found, np.full(f.P, j - 1), rows),
                            out[at:at + f.X * f.P])
            at += f.X * f.P
        lo = 0 if f is None else f.x
        hi = found[j].x if j < len(found) else len(rows)
        seg = rows[lo:hi]
        out[at:at + len(seg)] = seg + _shifts(seg, pe_of, found, before[lo:hi], rows)
        at += len(seg)
    return out


def make(sim, steady: Steady, tot: dict, repeated: bool = False) -> Made:
    """Put back what ``sim`` (simulated with ``steady``) left out (module doc): the jumps
    of nested loops first, then those of the loops they are nested in; ``tot``: its totals
    (kbframe.run.periodic.totals). ``repeated``: the outermost loop's one jump is not put
    back record by record but held as a :class:`~kbframe.repeated.RepeatedTable` (a model
    step's layers: the analyses work from the period). Raises NotSteady."""
    if steady.broken:
        raise NotSteady(steady.broken)
    jumps = steady.jumps
    if not jumps:
        raise NotSteady("no loop reached a steady state it could leave out")
    table = sim.oplog.table
    rows = table.array()
    pe_of = np.array(table.name_col(0), dtype=np.int64)
    tot = dict(tot)
    latency = sim.latency_ps
    phases = {pe: list(ph) for pe, ph in (sim.phases or {}).items()}
    made = RecordTable.of_rows(table.names, rows[:0])
    simulated = None  # with a RepeatedTable: its phases, and per PE the period's first command and commands
    placed: list = []  # every jump put back so far
    levels = sorted({inst.level for _, inst in jumps}, reverse=True)
    for level in levels:
        per_pe = _PerPe(rows, pe_of)
        found = [_put_back(rows, pe_of, f"{k} of {inst.key}", inst,
                           (inst.p,) if inst.tiles else steady.axes[inst.key][1].periods, placed, per_pe)
                 for k, inst in jumps if inst.level == level]
        found.sort(key=lambda f: f.x)
        n = len(rows) + sum(f.X * f.P for f in found)
        final = level == levels[-1]
        if final and repeated and len(found) == 1 and not found[0].inst.tiles:  # held: the records, the period
            f = found[0]
            f.mover.of(rows)
            made = RepeatedTable(rows, table.names, f.x, f.P, f.X, f.mover.step(rows[f.x - f.P:f.x]),
                                 f.mover.step(rows[f.x:]))
            J = f.inst.J - f.p
            simulated = ({pe: list(ph) for pe, ph in phases.items()},
                         {pe: ids[J] for pe, ids in f.inst.ids.items()}, dict(f.per_period))
        else:
            out = None
            if final:  # straight into the table's buffer: the full run's records held once
                made.buf = bytearray(n * ROW.size)
                out = np.frombuffer(made.buf, dtype=np.int64).reshape(n, N)
            if _in_order(found):
                rows = _put_back_all(rows, pe_of, found, out)
            else:  # one at a time, the last first: the records before it stay where they are
                if any(f.inst.tiles for f in found):
                    raise NotSteady("the jumps of weight GEMMs' tiles and of loops interleave")
                for f in reversed(found):
                    f.mover.of(rows)
                    rows = np.concatenate([rows[:f.x], f.mover.periods(rows[f.x - f.P:f.x], f.X),
                                           f.mover.move(rows[f.x:], f.X)])
                if out is not None:
                    out[:] = rows
                    rows = out
        for f in reversed(found):
            latency += f.X * f.dt
            for name, v in f.delta.items():
                tot[name] += f.X * v
            for pe in f.inst.jumped:
                if pe in phases:
                    phases[pe] = _phases(phases[pe], f.inst, pe, f.p, f.X)
        placed += found
    tot["latency_ps"] = latency
    keys = list(dict.fromkeys(inst.key for _, inst in jumps))
    periods = {key: "/".join(str(p) for p in sorted({f.p for f in placed if f.inst.key == key})) for key in keys}
    what = " and ".join(f"{sum(f.X for f in placed if f.inst.key == key)} period(s) of {periods[key]} step(s) "
                        f"along {key}" for key in keys)
    note = (f"fast-forwarded in one simulation: {what} left out of {len(placed)} loop(s) "
            f"({len(made) - len(table)} of {len(made)} records by shifting)")
    for f in placed:
        f.mover.of(None)  # no view of the table's buffer kept: it must stay free to grow
    del rows
    outer = [f for f in placed if f.inst.level == levels[-1]]
    return Made(made, tot, latency, phases, note, min(f.P for f in outer), placed, simulated)


def _phases(ph: list, inst, pe: int, p: int, X: int) -> list:
    """A PE's ``tl.phase`` annotations with the ``X`` periods of ``p`` iterations put back:
    those of the period before the jump repeated (ids moved, a layer label by ``p`` a
    period), the later ones moved by all of them."""
    J = inst.J
    lo, hi = inst.ids[pe][J - p], inst.ids[pe][J]
    per = hi - lo

    def moved(entry, j: int, since: int, layers: int = 0):
        nm, f, l_, info = entry
        info = dict(info)
        if layers and info.get("layer") is not None:
            info["layer"] += layers
        if info.get("after") is not None and info["after"] >= since:  # a collective's partial: a command id
            info["after"] += j * per
        return nm, f + j * per, l_ + j * per, info

    inside = [e for e in ph if lo <= e[1] and e[2] < hi]
    out = [e for e in ph if e[1] < hi]
    out = [e if e[2] < hi else (e[0], e[1], e[2] + X * per, e[3]) for e in out]
    for j in range(1, X + 1):
        out += [moved(e, j, lo, j * p) for e in inside]
    return out + [moved(e, X, hi) for e in ph if e[1] >= hi]


def snapshot(engine, first: dict | None = None) -> tuple:
    """What kbframe.sim.steady keeps at an iteration's start (``Steady.snapshot``): the
    records so far, the totals, per PE the commands dispatched but not completed, and those
    completed. The totals are None while a PE of ``first`` (``{pe: a loop's first command
    id}``) has not completed that command: no period of the loop can be steady yet, and
    taking them costs a record's worth of work per name."""
    pes = engine.pes.built()
    done = {pe.index: (engine.oplog.unit_totals(pe.index, "scheduler") or (0,))[0] for pe in pes}
    flight = tuple(pe.cpu.n_commands - done[pe.index] for pe in pes)
    ready = first is None or all(done.get(pe, 0) >= c for pe, c in first.items())
    return len(engine.oplog.table), running_totals(engine, engine.oplog) if ready else None, flight, done


def repeats(engine, inst: Instance, i: int, periods: tuple) -> bool:
    """Whether, for one of ``periods`` (those :func:`_put_back` would try for a jump at
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
        dt = int(after[0, _T0] - before[0, _T0])
        if np.array_equal(after[:, _SAME], before[:, _SAME]) and np.array_equal(
                after[:, _TIMES], before[:, _TIMES] + np.where(before[:, _TIMES] >= 0, dt, 0)):
            return True
    return False


def probe(engine, inst: Instance, k: int, periods: tuple):
    """An early verdict on a loop's jump (``Steady.probe``; ``inst`` the ``k``-th loop of
    its axis, of the innermost level that jumps, every PE having jumped): once the records
    of the period after the jump are in, :func:`_put_back` on the records so far. Every
    reason it can refuse for is final by then (what comes later does not change the
    records it read, nor a PE that jumped), so a refusal (the NotSteady, returned) is
    :func:`make`'s too; False when it holds (make checks it again, with what follows);
    else the records to wait for."""
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
        _put_back(rows, pe_of, f"{k} of {inst.key}", inst, periods, [], _PerPe(rows, pe_of))
    except NotSteady as e:
        return e
    return False


def sanitized(engine, made: Made) -> dict:
    """The sanitizer's counts (commands, stages, accesses) of the periods ``made`` put back:
    per jump, those of the commands of the period before it as simulated, and of what the
    jumps of nested loops in that period put back, times the periods (``engine``: the
    simulation's, its stage records kept)."""
    plans = dict((pe.index, plan) for pe, plan in sanitizer.plans(engine))  # each sorted by command id
    ids = {pe: [cmd.id for cmd, _ in plan] for pe, plan in plans.items()}
    templates = access_templates.Templates()  # each command shape re-planned once, for every PE
    memo: dict = {}

    def period(jump) -> np.ndarray:
        if id(jump) not in memo and jump.inst.tiles:
            memo[id(jump)] = _tile_period(engine, jump, plans, ids, templates, memo)
        if id(jump) not in memo:
            inst, got = jump.simulated, np.zeros(3, dtype=np.int64)
            for pe in jump.per_period:
                lo, hi = inst.ids[pe][inst.J - jump.p], inst.ids[pe][inst.J]
                at = ids.get(pe, [])
                sub = plans.get(pe, [])[bisect.bisect_left(at, lo):bisect.bisect_left(at, hi)]
                got += (len(sub), sum(len(st) for _, st in sub),
                        sanitizer.count_data_dependencies(engine.pes[pe], sub, templates))
            memo[id(jump)] = got + sum((j.X * period(j) for j in jump.inner), np.zeros(3, dtype=np.int64))
        return memo[id(jump)]
    total = sum((j.X * period(j) for j in made.jumps), np.zeros(3, dtype=np.int64))
    return dict(zip(("commands", "stages", "accesses"), (int(v) for v in total)))


def _tile_period(engine, jump, plans: dict, ids: dict, templates, memo: dict) -> np.ndarray:
    """The sanitizer's counts of a period of a weight GEMM's tiles put back: no command;
    its stages, as simulated; its accesses, those of the GEMM planned whole less those of
    it as planned, per period (each shape's once, in ``memo``)."""
    got = np.zeros(3, dtype=np.int64)
    inst = jump.inst
    lo, hi = (inst.J - jump.p) * inst.tiles, inst.J * inst.tiles
    for q, c in inst.first.items():
        cmd, stages = plans[q][bisect.bisect_left(ids[q], c)]
        got[1] += sum(1 for st in stages if lo <= st.tile < hi)
        key = ("tiles", plan_units_key(engine.pes[q].by_role), plan_key(cmd))
        if key not in memo:
            pe, full = engine.pes[q], whole(cmd)
            n_full = sanitizer.count_data_dependencies(pe, [(full, pe.scheduler.plan(full))], templates)
            n_part = sanitizer.count_data_dependencies(pe, [(cmd, stages)], templates)
            memo[key] = divmod(n_full - n_part, left_out(cmd)[1] // jump.p)
        n, rest = memo[key]
        assert rest == 0, "a weight GEMM's left-out output tiles are alike: their accesses divide by its periods"
        got[2] += n
    return got
