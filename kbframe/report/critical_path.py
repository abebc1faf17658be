"""What bounds a run: its critical path, the steady-state period and its terms (DESIGN.md
decision 10).

Input: the op_log records in file order with what each waited for, as rows
``(pe, unit, op_kind, cmd, t_start, t_end, t_data, kind, ref, end_ref)`` (times in
integer ps, ``t_data`` -1 when none; ``kind``/``ref``/``end_ref`` as
:mod:`kbframe.sim.waits` defines them), or as the ten columns of those fields. The
simulation records them in memory (``OpLog.waits.columns()``); a test can build them by
hand. This module reads nothing else, and works on the columns
(:class:`~kbframe.report.record_columns.Records`).

**The path.** From the event that ends the run (the latest end), walk back along what
each event waited for: a stage's end to its start (its *run* segment; a DMA stage's end
to its data start, its *data* segment, then either the channel's previous transfer or
its own *setup* segment), a start to the predecessor stage, the unit's previous stage or
the command's admission; an admission to the command's dispatch, the completion of the
command it had a hazard with, or the admission before it (strict FIFO); a dispatch to
the previous dispatch, the admission that made queue room, or the command a
``tl.wait`` waited for. Records on other PEs are followed like any other (a cross-PE
``dep``). The segments cover ``[0, latency)`` exactly; any stretch the records do not
explain is a *wait* segment, so they still add up.

**The period.** A repeating workload repeats its path: the segment signatures (PE, unit,
op kind, phase, duration) recur with some period of ``p`` segments. The smallest ``p``
that repeats around the middle of the path, extended both ways as far as it holds and
seen at least :data:`MIN_REPS` times, is the steady state; the period starts where the
path enters a command from outside its own chain (a start that waited for admission,
queue room or a ``tl.wait``), else at the oldest command's segment. ``period_ns`` is one repetition and its ``terms``
(in path order) add up to it exactly. ``units_per_period`` is how many units of progress
(KV tiles, output tiles: the workload says) one repetition covers: stages ending in a
repetition × units / stages in the run, rounded (≥ 1; a repetition that covers less
than a whole unit is taken as often as it needs to). Stages, not dispatches, measure
the work: PE_CPU may run far ahead of it. Without a steady state the
period is the whole path and the terms are summed by name, largest first.

**Binding kind.** Over the steady-state window, each unit's busy time (DMA: data phases;
PE_CPU: dispatches). If the busiest is busy ≥ :data:`BUSY_THRESHOLD` of the window, the
kind is its resource (:data:`RESOURCE`: ``hbm``, ``compute``, ``dispatch``); else
``chain``: a loop-carried chain of waits, not a resource, sets the period. Each unit's
idle time per period is split by what its next busy interval waited for.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..records import label_codes
from ..sorting import distinct, stable_order
from .record_columns import LastOf, Records, as_records

#: a unit busy at least this share of the period makes the period resource-bound
BUSY_THRESHOLD = 0.95
#: fewest repetitions that make a steady state
MIN_REPS = 3
#: longest period searched, in path segments
MAX_PERIOD_SEGMENTS = 2048
#: how far a repetition's records may be from a whole number of units' worth (a share)
UNIT_TOLERANCE = 0.2
#: role a unit serves → the resource it stands for in the binding kind (by default the
#: op_log names units by these roles; PE_CPU's dispatches are unit ``cpu``)
RESOURCE = {"dma_read": "hbm", "dma_write": "hbm", "gemm": "compute", "math": "compute", "cpu": "dispatch",
            "dispatch": "dispatch"}


def resources_from_roles(roles: dict) -> dict:
    """``{op_log unit name: resource}`` from ``{unit name: roles it serves}`` (the units'
    declared roles, DESIGN.md decision 8): the first role with a resource wins."""
    out = {"cpu": "dispatch"}
    for name, rs in roles.items():
        for r in rs:
            if r in RESOURCE:
                out[name] = RESOURCE[r]
                break
    return out


class Segment(NamedTuple):
    """One stretch of the critical path: record ``rec`` (-1: none) in ``phase`` (``run``,
    ``setup``, ``data`` or ``wait``) over ``[t0, t1)`` ps; ``why``: what a ``wait`` waited
    for. :func:`segment_name` labels it."""
    rec: int
    phase: str
    t0: int
    t1: int
    why: str = ""


#: a segment's phases, in the order :class:`Path` numbers them
PHASES = ("run", "setup", "data", "wait")
_PHASE = {ph: i for i, ph in enumerate(PHASES)}


class Path(Sequence):
    """A critical path as columns, one entry per :class:`Segment` in time order: ``rec``,
    ``phase`` (a code into :data:`PHASES`), ``t0``, ``t1`` (int64 arrays) and ``why`` (a
    code into ``whys``). A model step's path has millions of segments, most of them a
    period of the path put back (:meth:`Repeat.extend`): the analyses read the columns; an
    index or a slice gives :class:`Segment` s. Equal to another path, or a list of
    segments, with the same segments."""

    __slots__ = ("rec", "phase", "t0", "t1", "why", "whys")

    def __init__(self, rec, phase, t0, t1, why, whys: list):
        self.rec, self.phase, self.t0, self.t1, self.why, self.whys = rec, phase, t0, t1, why, whys

    @classmethod
    def of(cls, segs) -> "Path":
        """The path of a list of :class:`Segment` s (a Path as it is)."""
        if isinstance(segs, Path):
            return segs
        n, whys = len(segs), {}
        cols = [np.fromiter((s.rec for s in segs), dtype=np.int64, count=n),
                np.fromiter((_PHASE[s.phase] for s in segs), dtype=np.int64, count=n),
                np.fromiter((s.t0 for s in segs), dtype=np.int64, count=n),
                np.fromiter((s.t1 for s in segs), dtype=np.int64, count=n),
                np.fromiter((whys.setdefault(s.why, len(whys)) for s in segs), dtype=np.int64, count=n)]
        return cls(*cols, list(whys))

    @classmethod
    def of_codes(cls, segs: list, whys: list) -> "Path":
        """The path of ``(rec, phase code, t0, t1, why code)`` tuples in time order, ``why``
        coded into ``whys`` (recoded here in order of first use, as :meth:`of` codes them)."""
        if not segs:
            return cls.of([])
        rec, phase, t0, t1, why = np.array(segs, dtype=np.int64).T
        used, first = np.unique(why, return_index=True)
        used = used[np.argsort(first)]  # in order of first use
        recode = np.zeros(len(whys), dtype=np.int64)
        recode[used] = np.arange(len(used))
        return cls(*(np.ascontiguousarray(a) for a in (rec, phase, t0, t1)), recode[why], [whys[i] for i in used])

    @property
    def dur(self) -> np.ndarray:
        """Each segment's ps."""
        return self.t1 - self.t0

    def __len__(self) -> int:
        return len(self.rec)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Segment(int(self.rec[i]), PHASES[self.phase[i]], int(self.t0[i]), int(self.t1[i]),
                       self.whys[self.why[i]])

    def __eq__(self, other) -> bool:
        if not isinstance(other, (Path, list, tuple)):
            return NotImplemented
        o = Path.of(list(other) if isinstance(other, tuple) else other)
        names = np.array(self.whys + [""], dtype=object)[self.why] if len(self) else []
        other_names = np.array(o.whys + [""], dtype=object)[o.why] if len(o) else []
        return len(self) == len(o) and all(np.array_equal(a, b) for a, b in (
            (self.rec, o.rec), (self.phase, o.phase), (self.t0, o.t0), (self.t1, o.t1),
            (names, other_names)))

    __hash__ = None


def segment_name(rows, s: Segment) -> str:
    """A segment's term name: ``dma_read setup``, ``gemm``, ``math add``, ``cpu dispatch
    composite``, ``wait hazard`` … (``rows``: :class:`Records`)."""
    return f"wait {s.why}".strip() if s.phase == "wait" else _name(rows, s.rec, s.phase)


@dataclass
class CriticalPath:
    """The analysis of one run: ``segments`` in time order, the steady window and metrics."""
    segments: list
    metrics: dict
    records: set = field(default_factory=set)  # records with time on the path (trace flag)


def _ns(ps) -> float:
    return round(ps / 1000, 3)


def _name(c: Records, i: int, phase: str) -> str:
    if phase == "wait":
        return "wait"
    unit, kind = c.unit[i], c.kind[i]
    if unit == "cpu":
        return f"cpu dispatch {kind}"
    if phase in ("setup", "data"):
        return f"{unit} {phase}"
    return unit if kind == unit else f"{unit} {kind}"


def walk(rows, sched: "LastOf | None" = None) -> Path:
    """The critical path of ``rows`` (:func:`as_records` reads them) as a :class:`Path`,
    its segments in time order (module doc). ``sched``: ``Records.last_of("scheduler")``,
    if known."""
    c = as_records(rows)
    if not c.n:
        return Path.of([])
    PE, UNIT, CMD, T0, T1, TD, WHY, REF, END = c.pe, c.unit, c.cmd, c.t0, c.t1, c.td, c.why, c.ref, c.end
    sched = c.last_of("scheduler") if sched is None else sched
    disp = c.last_of("cpu")
    t_last = int(np.max(T1))
    idx = c.n - 1
    while T1[idx] != t_last:  # the last record to end (the latest logged of those)
        idx -= 1
    pos, t = "end", int(T1[idx])
    back: list = []  # (rec, phase code, t0, t1, why code), last first
    seg = back.append
    whys = {"": 0}  # a wait's reason -> its code
    RUN, SETUP, DATA, WAIT = (_PHASE[p] for p in ("run", "setup", "data", "wait"))

    for _ in range(4 * c.n + 4):
        pe = int(PE[idx])
        nxt = None
        if pos == "end":
            if UNIT[idx] == "scheduler":  # completion: the stage that completed it
                nxt = (int(END[idx]), "end") if END[idx] >= 0 else (idx, "start")
            elif TD[idx] >= 0:
                seg((idx, DATA, int(TD[idx]), int(T1[idx]), 0))
                t = int(TD[idx])
                nxt = (idx, "data")
            else:
                seg((idx, RUN, int(T0[idx]), int(T1[idx]), 0))
                t = int(T0[idx])
                nxt = (idx, "start")
        elif pos == "data":
            if END[idx] >= 0:  # the channel's previous transfer
                nxt = (int(END[idx]), "end")
            else:
                seg((idx, SETUP, int(T0[idx]), int(TD[idx]), 0))
                t = int(T0[idx])
                nxt = (idx, "start")
        else:  # the record's start (a command's: its admission)
            why, ref = WHY[idx], int(REF[idx])
            if why in ("dep", "unit", "cpu", "link"):
                nxt = (ref, "end") if ref >= 0 else None
            elif why in ("admit", "room", "fifo"):
                j = sched.get((pe, ref))
                nxt = (j, "start") if j is not None else None
            elif why in ("hazard", "wait"):
                j = sched.get((pe, ref))
                nxt = (j, "end") if j is not None else None
            elif why == "dispatch":
                j = disp.get((pe, int(CMD[idx])))
                nxt = (j, "end") if j is not None else None
            if nxt is None:  # the start of the kernel, or an unexplained wait
                if t > 0:
                    seg((-1, WAIT, 0, t, whys.setdefault(why, len(whys))))
                break
        j, p = nxt
        tj = int(T1[j] if p == "end" else TD[j] if p == "data" else T0[j])
        if tj > t:  # a cause after its effect: not a record this walk can follow
            seg((-1, WAIT, 0, t, whys.setdefault("unexplained", len(whys))))
            break
        if tj < t:
            seg((-1, WAIT, tj, t, whys.setdefault(WHY[idx], len(whys)) if pos == "start" else 0))
            t = tj
        idx, pos = j, p
    back.reverse()
    return Path.of_codes(back, list(whys))


class _Ends:
    """The ends of a run's stages (sorted), counted over a stretch of time."""

    def __init__(self, ends: np.ndarray):
        self.ends, self.n = ends, len(ends)

    def between(self, t_lo: int, t_hi: int) -> int:
        """How many end in ``[t_lo, t_hi)``."""
        return int(np.searchsorted(self.ends, t_hi) - np.searchsorted(self.ends, t_lo))


class _RepeatedEnds(_Ends):
    """The stage ends of a run made of the records simulated and ``X`` periods put back
    (:class:`Repeat`): before the period, the period's ``X`` more times, and after it."""

    def __init__(self, before: np.ndarray, period: np.ndarray, after: np.ndarray, X: int, dt: int):
        self.parts = [np.sort(before), np.sort(period), np.sort(after) + X * dt]
        self.X, self.dt = X, dt
        self.n = len(before) + (X + 1) * len(period) + len(after)

    def between(self, t_lo: int, t_hi: int) -> int:
        before, period, after = self.parts
        k = np.arange(self.X + 1, dtype=np.int64) * self.dt
        return int(np.searchsorted(before, t_hi) - np.searchsorted(before, t_lo)
                   + (np.searchsorted(period, t_hi - k) - np.searchsorted(period, t_lo - k)).sum()
                   + np.searchsorted(after, t_hi) - np.searchsorted(after, t_lo))


class Repeat(NamedTuple):
    """A run made of its simulated records and ``X`` periods put back (kbframe.repeated):
    the ``P`` records before record ``x`` of the records simulated, moved 1, 2, .. ``X``
    periods of ``dt`` ps, then the records from ``x`` on moved by all of them. The run's
    path is the simulated records' path with a period of it put back as often, when the
    path repeats with the records (:meth:`extend`)."""

    x: int
    P: int
    X: int
    dt: int

    def extend(self, segs) -> tuple[Path, np.ndarray] | None:
        """``(the full run's path, the simulated record each of its segments stands for)`` from
        the simulated records' path ``segs`` (segments or a :class:`Path`), or None when the
        path does not repeat with the records. It repeats from some time ``b`` on when its segments over ``[b, b +
        dt)`` are those over ``[b - dt, b)`` a period later (each record ``P`` on, each time
        ``dt`` on): walked back from the end, the path then enters every period of the
        full run alike, and the full run's path is the segments before ``b``, those over
        ``[b - dt, b)`` again ``X`` times a period later each, then the rest ``X`` periods
        later. Every record of the segments before ``b`` must come before ``x``, and those
        over ``[b - dt, b)`` and any before ``x`` after ``b`` within the two periods
        checked before it (kbframe.run.jump_checks)."""
        x, P, X, dt = self.x, self.P, self.X, self.dt
        if not len(segs) or dt <= 0:
            return None
        path = Path.of(segs)
        n, t0, t1, rec, ph, why = len(path), path.t0, path.t1, path.rec, path.phase, path.why
        tail = np.nonzero(rec >= x)[0]
        last = int(tail[0]) if len(tail) else n  # b at or before the first segment of a later record
        early = np.nonzero((rec >= 0) & (rec < x - 2 * P))[0]
        first = int(early[-1]) + 1 if len(early) else 0  # W1 and all after it: no record before those checked
        start = {int(t): i for i, t in enumerate(t0.tolist())}
        for i in range(last, 0, -1):  # the latest b that repeats
            b = int(t0[i]) if i < n else int(t1[-1])
            i1, i2 = start.get(b - dt), start.get(b + dt, n if b + dt == int(t1[-1]) else None)
            if i1 is None or i2 is None or i2 - i != i - i1 or i1 < first:
                if last - i > 4096 or i1 is not None and i1 < first:
                    return None
                continue
            w1, w2 = slice(i1, i), slice(i, i2)  # each segment of w2 that of w1 a period later
            if (np.array_equal(ph[w1], ph[w2]) and np.array_equal(why[w1], why[w2])
                    and np.array_equal(t0[w1] + dt, t0[w2]) and np.array_equal(t1[w1] + dt, t1[w2])
                    and np.array_equal(np.where(rec[w1] >= 0, rec[w1] + P, -1), np.where(rec[w2] >= 0, rec[w2], -1))):
                break
            if last - i > 4096:  # the path does not repeat near the jump
                return None
        else:
            return None
        k = np.arange(1, X + 1, dtype=np.int64)[:, None]  # the window again 1..X periods later
        r_w, r_t = rec[i1:i], rec[i:]
        full = Path(np.concatenate([rec[:i], np.where(r_w >= 0, r_w + k * P, -1).ravel(),
                                    np.where(r_t >= 0, r_t + X * P, -1)]),
                    np.concatenate([ph[:i], np.tile(ph[i1:i], X), ph[i:]]),
                    *(np.concatenate([c[:i], (c[i1:i] + k * dt).ravel(), c[i:] + X * dt]) for c in (t0, t1)),
                    np.concatenate([why[:i], np.tile(why[i1:i], X), why[i:]]), path.whys)
        return full, np.concatenate([rec[:i], np.tile(r_w, X), r_t])

    def ends(self, at: np.ndarray, t1) -> _RepeatedEnds:
        """The full run's stage ends from the simulated stage records ``at`` (``t1``: every
        simulated record's end)."""
        t1 = np.asarray(t1, dtype=np.int64)
        x, P = self.x, self.P
        return _RepeatedEnds(t1[at[at < x - P]], t1[at[(at >= x - P) & (at < x)]], t1[at[at >= x]], self.X, self.dt)

    def weights(self, n: int) -> np.ndarray:
        """How often each of ``n`` simulated records counts in the full run."""
        w = np.ones(n, dtype=np.int64)
        w[self.x - self.P:self.x] += self.X
        return w


def _keys(c: Records, segs: Path, look: np.ndarray) -> tuple:
    """Per segment: its record's name as a number (PE, unit and op kind of record
    ``look[i]`` of ``c``, and the segment's phase; -1 parts for a wait), the same without
    the PE, its duration (ps) and its ``why`` as a number."""
    n = len(segs)
    rec = np.asarray(look, dtype=np.int64)
    has = rec >= 0
    r = np.where(has, rec, 0)
    ucodes, uvals = label_codes(c.unit)
    kcodes, kvals = label_codes(c.kind)
    pe = np.where(has, np.asarray(c.pe, dtype=np.int64)[r], -1) if n else np.zeros(0, dtype=np.int64)
    u = np.where(has, np.asarray(ucodes, dtype=np.int64)[r], -1) if n else pe
    k = np.where(has, np.asarray(kcodes, dtype=np.int64)[r], -1) if n else pe
    ph, why, dur = segs.phase, segs.why, segs.dur
    name = ((u + 1) * (len(kvals) + 1) + (k + 1)) * (len(PHASES) + 1) + ph
    return (pe + 1) * (len(uvals) + 1) * (len(kvals) + 1) * (len(PHASES) + 1) + name, name, dur, why


def _signature_ids(keys: tuple) -> np.ndarray:
    """Each segment's signature (its record's PE, unit and op kind, its phase and duration;
    ``keys``: :func:`_keys`) as a number: equal signatures, equal numbers (:func:`_period`
    compares them)."""
    key, _, dur, _ = keys
    if not len(key):
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((dur, key))
    a, d = key[order], dur[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (a[1:] != a[:-1]) | (d[1:] != d[:-1])
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def _summed(c: Records, segs: Path, look: np.ndarray, keys: tuple) -> dict:
    """The path's time per term name (:func:`segment_name`), in the order the names first
    occur: ``{name: [its first segment (its record of c), ps]}`` (``keys``: :func:`_keys`)."""
    _, name, dur, why = keys
    key = name * (int(why.max(initial=0)) + 1) + why
    at = np.nonzero(dur > 0)[0]
    keys, first, inverse = np.unique(key[at], return_index=True, return_inverse=True)
    ps = np.zeros(len(keys), dtype=np.int64)
    np.add.at(ps, inverse.reshape(-1), dur[at])
    out: dict = {}
    for j in np.argsort(first, kind="stable").tolist():  # the keys in the order they first occur
        s = segs[int(at[first[j]])]
        s = s._replace(rec=int(look[int(at[first[j]])]))
        got = out.setdefault(segment_name(c, s), [s, 0])
        got[1] += int(ps[j])
    return out


def _period(sig: np.ndarray, segs: Path, ends: "_Ends", per_unit_records: float) -> tuple | None:
    """``(start, p, reps, units)``: the steady repetition around the middle of the path
    (module doc), or None. A repetition of ``p`` segments must cover a whole number of
    units of progress: ``units`` ≈ its stages (``ends``: the stages' ends) / ``per_unit_records`` (within
    :data:`UNIT_TOLERANCE`); a shorter one (two back-to-back transfers of one tile) is
    taken ``k`` times over, the fewest that cover whole units."""
    n = len(sig)
    m = n // 2
    # the signatures as numbers (_signature_ids), so that each candidate p is tried with
    # numpy: a path with no steady state tries every p, and many may hold around the middle
    ids = np.asarray(sig, dtype=np.int64)
    for p in range(1, min(n // 2, MAX_PERIOD_SEGMENTS) + 1):
        c = min(m, n - 2 * p)
        if not np.array_equal(ids[c:c + p], ids[c + p:c + 2 * p]):
            continue
        # extended both ways as far as sig[i] == sig[i + p] holds: [lo, hi - p) is that run
        differ = ids[:n - p] != ids[p:]
        before = np.flatnonzero(differ[:c])
        lo = int(before[-1]) + 1 if len(before) else 0
        after = np.flatnonzero(differ[c + p:])
        hi = (c + p + int(after[0]) if len(after) else n - p) + p
        reps = (hi - lo) // p
        t_lo, t_hi = segs[lo].t0, segs[lo + reps * p - 1].t1
        u = ends.between(t_lo, t_hi) / reps / per_unit_records
        for k in range(1, reps // MIN_REPS + 1):
            units = round(k * u)
            if units >= 1 and abs(k * u - units) <= UNIT_TOLERANCE * units:
                return lo, k * p, reps // k, units
    return None


def _phase(c: Records, rep: list) -> int:
    """Where a period starts, as an offset into one repetition ``rep``: at the first
    segment that enters a command from outside its own chain (its start waited for an
    admission, queue room or a ``tl.wait``), else at the segment of the oldest command."""
    for i, s in enumerate(rep):
        if s.rec >= 0 and s.phase in ("run", "setup") and c.why[s.rec] in ("admit", "room", "wait"):
            return i
    cmds = [c.cmd[s.rec] if s.rec >= 0 else 1 << 62 for s in rep]
    return cmds.index(min(cmds))


def _why_label(c: Records, i: int, sched) -> str:
    """What record ``i``'s start waited for, as a short label."""
    why, ref = c.why[i], c.ref[i]
    if why == "dep" and 0 <= ref < c.n:
        return f"dep {_name(c, ref, 'run')}"
    if why == "admit":
        j = sched.get((c.pe[i], ref))
        return f"admission ({c.why[j]})" if j is not None else "admission"
    return {"room": "queue room", "wait": "tl.wait", "cpu": "dispatch", "unit": "unit busy"}.get(why, why)


def _full_prev(prev: np.ndarray, at: np.ndarray, b1: np.ndarray, bounds: list, repeat: Repeat) -> np.ndarray:
    """:func:`_units`' ``prev`` (per record, stream by stream: the latest end of its
    stream's records before it) in the full run's times, for the records from ``x`` on
    (moved by the periods put back): the ends of the records before the period stay, those
    of the period's last copy and later move as they do."""
    extra = repeat.X * repeat.dt
    moved = at >= repeat.x - repeat.P
    out = prev.copy()
    for a, b in zip(bounds[:-1], bounds[1:]):
        after = np.nonzero(at[a:b] >= repeat.x)[0]
        after = after[after > 0]
        if not len(after):
            continue
        end = np.maximum(b1[a:b], 0)
        still = np.maximum.accumulate(np.where(moved[a:b], 0, end))  # ends that stay
        gone = np.maximum.accumulate(np.where(moved[a:b], end + extra, 0))  # ends that move
        out[a + after] = np.maximum(still[after - 1], gone[after - 1])
    return out


def _units(c: Records, ta: int, tb: int, reps: int, multi_pe: bool, sched: "LastOf",
           repeat: Repeat | None = None) -> dict:
    """Per unit: busy and idle ns per period over ``[ta, tb)``, and what the idle time
    waited for (labels → ns per period, largest first, ties in the order first seen).
    In op_log order each unit's busy intervals (DMA: data phases) come in start order: a
    record's idle gap runs from the latest end of its unit's records before it; the records
    after one that ends past ``tb`` do not count. A column at a time (numpy).
    ``repeat``: ``c`` are the records simulated and ``[ta, tb)`` their whole run; the
    figures are the full run's (:class:`Repeat`): a period's records count ``X`` times
    more, the run is ``X`` periods longer, and a unit whose last record is the period's or
    later ends that much later."""
    ucodes, uvals = label_codes(c.unit)
    keep = np.nonzero(ucodes != uvals.index("scheduler"))[0] if "scheduler" in uvals else np.arange(len(ucodes))
    if not len(keep):
        return {}
    stream_of = np.asarray(c.pe, dtype=np.int64)[keep] * len(uvals) + ucodes[keep]
    streams, g = _dense(stream_of)
    order = stable_order(g)  # stream by stream, op_log order within each
    at, g = keep[order], g[order]
    t0, b1, td = (np.asarray(col, dtype=np.int64)[at] for col in (c.t0, c.t1, c.td))
    b0 = np.where(td >= 0, td, t0)
    bounds = np.searchsorted(g, np.arange(len(streams) + 1)).tolist()
    prev = np.zeros(len(at), dtype=np.int64)  # the latest end of the stream's records before each
    last_end = np.zeros(len(streams), dtype=np.int64)
    for s_, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        run = np.maximum.accumulate(np.maximum(b1[a:b], 0))
        prev[a + 1:b] = run[:-1]
        last_end[s_] = run[-1]
    live = prev < tb
    busy = np.where(live & (b1 > ta) & (b0 < tb), np.minimum(b1, tb) - np.maximum(b0, ta), 0)
    w = repeat.weights(c.n)[at] if repeat is not None else None  # how often each record counts
    extra = repeat.X * repeat.dt if repeat is not None else 0  # ps the full run is longer
    if w is not None:
        busy = busy * w
        late = at >= repeat.x - repeat.P  # the period's records and later: ends move by extra
        for s_, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            e, moved = b1[a:b], late[a:b]
            last_end[s_] = max(int(e[~moved].max(initial=0)), int(e[moved].max()) + extra if moved.any() else 0)
    busy_of = np.add.reduceat(busy, bounds[:-1])
    if repeat is not None:  # the gaps in the full run's times: after the periods put back, a stream
        shift = np.where(at >= repeat.x, extra, 0)  # that last ended before them waits that much longer
        prev, t0, b0 = _full_prev(prev, at, b1, bounds, repeat), t0 + shift, b0 + shift
    # the idle gap before a record: what it waited for, then (a DMA's data phase) its setup
    gap = np.nonzero(live & (b0 > prev) & (b0 > ta))[0]
    labels, label_of = _gap_labels(c, at[gap], sched)
    if "setup" not in labels:
        labels.append("setup")
    cut = np.where(td[gap] >= 0, np.minimum(np.maximum(t0[gap], prev[gap]), b0[gap]), b0[gap])
    lab = np.concatenate([label_of, np.full(len(gap), labels.index("setup"))])
    lo, hi = np.concatenate([prev[gap], cut]), np.concatenate([cut, b0[gap]])
    seq = np.concatenate([2 * gap, 2 * gap + 1])  # the order the pieces come in
    amount = np.minimum(hi, tb + extra) - np.maximum(lo, ta)
    pos = amount > 0
    key = np.concatenate([g[gap], g[gap]])[pos] * len(labels) + lab[pos]
    keys, inverse = _dense(key)
    amount = amount[pos] if w is None else (amount * np.concatenate([w[gap], w[gap]]))[pos]
    if amount.sum() < 1 << 53:  # every partial sum an exact float
        sums = np.bincount(inverse, weights=amount, minlength=len(keys)).astype(np.int64)
    else:
        sums = np.zeros(len(keys), dtype=np.int64)
        np.add.at(sums, inverse, amount)
    first = np.full(len(keys), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, inverse, seq[pos])
    waits: dict = {}
    for k, v, f in zip(keys.tolist(), sums.tolist(), first.tolist()):
        waits.setdefault(k // len(labels), []).append((f, labels[k % len(labels)], v))
    out = {}
    tb += extra
    width = tb - ta
    names = [(s_ // len(uvals), uvals[s_ % len(uvals)]) for s_ in streams.tolist()]
    for s_ in sorted(range(len(streams)), key=lambda j: names[j]):
        pe, unit = names[s_]
        got = [(lb, v) for _, lb, v in sorted(waits.get(s_, []))]  # in the order first seen
        if last_end[s_] < tb:
            got.append(("finished", tb - max(int(last_end[s_]), ta)))
        b = int(busy_of[s_])
        out[f"PE{pe}.{unit}" if multi_pe else unit] = {
            "busy_ns": _ns(b / reps), "idle_ns": _ns((width - b) / reps),
            "busy_fraction": round(b / width, 6) if width else 0.0,
            "waited_for": {k: _ns(v / reps) for k, v in sorted(got, key=lambda kv: -kv[1])}}
    return out


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for small non-negative integers (a
    stream's or a label's code), by counting instead of sorting."""
    if not len(values):
        return values[:0], values[:0]
    present = np.bincount(values)
    uniq = np.nonzero(present)[0]
    rank = np.zeros(len(present), dtype=np.int64)
    rank[uniq] = np.arange(len(uniq))
    return uniq, rank[values]


def _gap_labels(c: Records, at: np.ndarray, sched: "LastOf") -> tuple[list, np.ndarray]:
    """``(labels, each record's index into them)`` for the records ``at``: what each one's
    start waited for (:func:`_why_label`), worked out once per distinct cause (its wait
    kind and the name of the record or the admission it names)."""
    wcodes, wvals = label_codes(c.why)
    ucodes, _ = label_codes(c.unit)
    kcodes, _ = label_codes(c.kind)
    why = wcodes[at]
    ref = np.asarray(c.ref, dtype=np.int64)[at]
    sub = np.zeros(len(at), dtype=np.int64)  # what the label depends on beside the kind
    if "dep" in wvals:
        dep = (why == wvals.index("dep")) & (ref >= 0) & (ref < len(wcodes))
        sub[dep] = 1 + ((ucodes[ref[dep]] << 24) | kcodes[ref[dep]])
    if "admit" in wvals and sched:
        adm = np.nonzero(why == wvals.index("admit"))[0]
        pe = np.asarray(c.pe, dtype=np.int64)[at[adm]]
        j = sched.many(pe, ref[adm])
        sub[adm] = np.where(j >= 0, 1 + wcodes[np.maximum(j, 0)], 0)
    _, first, inverse = np.unique((why.astype(np.int64) << 40) | sub, return_index=True, return_inverse=True)
    texts = [_why_label(c, int(at[i]), sched) for i in first.tolist()]
    labels = list(dict.fromkeys(texts))
    return labels, np.array([labels.index(t) for t in texts], dtype=np.int64)[inverse.reshape(-1)]


def analyse(rows: list, n_units: int, unit_name: str = "unit", resources: dict | None = None,
            repeat: "Repeat | None" = None) -> CriticalPath | None:
    """The critical path, steady-state period, terms and binding kind of a run.

    Args:
        rows: the run's records with their waits (module doc), in op_log order: rows,
            :class:`Records`, or an object whose ``columns()`` gives them.
        n_units: units of progress of the whole run (e.g. KV tiles), ≥ 1.
        unit_name: what one unit of progress is (``"KV tile"``, ``"output tile"``).
        resources: op_log unit name → resource kind (:func:`resources_from_roles`);
            default :data:`RESOURCE`; a unit it does not name binds under its own name.
        repeat: ``rows`` are the records simulated, and the run is them with a period put
            back :attr:`Repeat.X` times (:class:`Repeat`, kbframe.repeated): the analysis
            is the full run's, made from them; None when it cannot be made so (the path
            does not repeat with the records, or it has a steady state: then analyse the
            full run's records).
    Returns:
        A :class:`CriticalPath`; its ``metrics`` are ``metrics.json`` ``critical_path``:
        ``binding``, ``unit_of_progress``, ``steady``, ``period_ns``, ``units_per_period``,
        ``ns_per_unit``, ``repetitions``, ``window_ns``, ``terms`` (``name``, ``unit``,
        ``op_kind``, ``phase``, ``pe``, ``ns``), ``busiest``, ``units`` and ``path``.
    """
    rows = as_records(rows)
    sched = rows.last_of("scheduler")
    segs = walk(rows, sched)
    look = segs.rec  # the record of rows each segment names its unit, op kind and PE by
    if repeat is not None:
        extended = repeat.extend(segs)
        if extended is None:
            return None
        segs, look = extended
    pes = np.asarray(rows.pe, dtype=np.int64)
    multi_pe = bool(len(pes)) and bool(pes.min() != pes.max())
    total = int(segs.t1[-1] - segs.t0[0]) if len(segs) else 0
    ucodes, uvals = label_codes(rows.unit)
    work = ~np.isin(ucodes, [uvals.index(u) for u in ("cpu", "scheduler") if u in uvals])
    # the work's (stages') ends
    count = (_Ends(np.sort(np.asarray(rows.t1, dtype=np.int64)[work])) if repeat is None
             else repeat.ends(np.nonzero(work)[0], rows.t1))
    keys = _keys(rows, segs, look)
    found = (_period(_signature_ids(keys), segs, count, max(1, count.n) / max(1, n_units))
             if segs else None)
    if found is not None and repeat is not None:  # a window inside the run: from the full run's records
        return None
    if found is not None:
        lo, p, reps, per_unit = found
        start = lo + _phase(rows, segs[lo:lo + p])
        if (lo + reps * p - start) // p >= MIN_REPS:
            reps = (lo + reps * p - start) // p
        else:
            start = lo
        rep = segs[start:start + p]
        ta, tb = segs[start].t0, segs[start + reps * p - 1].t1
        period = (tb - ta) // reps
        terms = [_term(rows, s, s.t1 - s.t0) for s in rep if s.t1 > s.t0]
    else:
        reps, per_unit = 1, max(1, n_units)
        ta, tb = (segs[0].t0, segs[-1].t1) if segs else (0, 0)
        period = total
        summed = _summed(rows, segs, look, keys)
        terms = sorted((_term(rows, s, ps) for s, ps in summed.values()), key=lambda t: -t["ns"])
    if repeat is None:
        units = _units(rows, ta, tb, reps, multi_pe, sched) if tb > ta else {}
    else:  # the whole run: the simulated records' figures, a period's records counted X times more
        units = _units(rows, 0, int(np.max(np.asarray(rows.t1, dtype=np.int64))), 1, multi_pe, sched,
                       repeat) if tb > ta else {}
    busiest = max(units.items(), key=lambda kv: kv[1]["busy_fraction"], default=(None, None))
    binding = "chain"
    if busiest[0] is not None and busiest[1]["busy_fraction"] >= BUSY_THRESHOLD:
        unit = busiest[0].split(".", 1)[1] if multi_pe else busiest[0]
        binding = (resources if resources is not None else RESOURCE).get(unit, unit)
    metrics = {
        "binding": binding,
        "unit_of_progress": unit_name,
        "steady": found is not None,
        "period_ns": _ns(period),
        "units_per_period": per_unit,
        "ns_per_unit": _ns(period / per_unit),
        "repetitions": reps,
        "window_ns": [_ns(ta), _ns(tb)],
        "terms": terms,
        "busiest": ({"unit": busiest[0], "busy_fraction": busiest[1]["busy_fraction"]}
                    if busiest[0] is not None else None),
        "units": units,
        "path": {"segments": len(segs), "ns": _ns(total)},
    }
    return CriticalPath(segs, metrics, _on_path(segs))


def on_path(rows) -> set:
    """The records with time on the critical path (:attr:`CriticalPath.records`, what
    trace.json flags), from the walk alone: no period, terms or unit figures."""
    return _on_path(walk(rows))


def _on_path(segs: Path) -> set:
    return set(distinct(segs.rec[(segs.rec >= 0) & (segs.t1 > segs.t0)]).tolist())


def _term(c: Records, s: Segment, ps: int) -> dict:
    i = s.rec
    return {"name": segment_name(c, s), "unit": c.unit[i] if i >= 0 else "", "op_kind": c.kind[i] if i >= 0 else "",
            "phase": s.phase, "pe": int(c.pe[i]) if i >= 0 else -1, "ns": _ns(ps)}


def summary_line(cp: dict, max_terms: int = 6) -> str:
    """One console line: binding kind, period per unit of progress and its terms (more
    than ``max_terms`` terms are summed per unit and phase, with their count)."""
    terms = cp["terms"]
    if len(terms) > max_terms:
        grouped: dict = {}
        for t in terms:
            key = "wait" if t["phase"] == "wait" else f"{t['unit']} {t['phase'] if t['phase'] != 'run' else ''}".strip()
            g = grouped.setdefault(key, [0.0, 0])
            g[0] += t["ns"]
            g[1] += 1
        text = " + ".join(f"{k} {_g(ns)}" + (f" ({n} terms)" if n > 1 else "") for k, (ns, n) in grouped.items())
    else:
        text = " + ".join(f"{t['name']} {_g(t['ns'])}" for t in terms)
    per = cp["unit_of_progress"] if cp["units_per_period"] == 1 else f"{cp['units_per_period']} {cp['unit_of_progress']}s"
    head = (f"{cp['binding']}: {_g(cp['period_ns'])} ns per {per}" if cp["steady"]
            else f"{cp['binding']}: no steady state; {_g(cp['period_ns'])} ns whole path")
    b = cp.get("busiest")
    tail = f"; busiest {b['unit']} {b['busy_fraction']:.1%}" if b else ""
    return f"{head} = {text}{tail}"


def _g(ns: float) -> str:
    """A term's ns for the console: six significant digits (287, 545.5), whole ns from a
    millisecond on (9729407, not 9.72941e+06)."""
    text = f"{ns:g}"
    return f"{ns:.0f}" if "e+" in text else text
