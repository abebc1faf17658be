"""The periodic model of a schedule: the records of short copies of a bench,
read as streams (one unit of one PE each: its dispatches, its stages, its commands),
compared, and the records and totals of a longer copy predicted from them. How
:mod:`kbframe.run.fastforward` uses it, and why it is exact, is told there.
"""
from __future__ import annotations

import numpy as np

from ..records import RecordTable
from .simulate import Simulation

#: a record's integers that shift from period to period: command, tile, start, end, data
#: phase, and the wait's reference (records_of)
NUMS = 6
_REF = NUMS - 1


class NotPeriodic(Exception):
    """The short copies do not repeat as a periodic schedule would."""


class Settling(NotPeriodic):
    """A stream's records of one period move by another time than the whole run: that
    stream is still in a transient (PE_CPU filling PE_SCHEDULER's queue), so the copies are
    too short to show the steady state."""


def records_of(table) -> list[tuple]:
    """``(names, nums)`` per record of a :class:`~kbframe.records.RecordTable`: names are
    what must not change between periods (PE, unit, kind, bytes, peer, name code, wait
    code, and the stream of the record that readied a stage), nums the integers that
    shift (:data:`NUMS`): command, tile, times, and the wait's reference (for a stage:
    the index, within its stream, of the record that readied it; stream-local, so that
    other streams' records do not move it)."""
    if not len(table):
        return []
    c = table.cols()
    code = c["name"]
    pe = np.array(table.name_col(0), dtype=np.int64)[code].tolist()
    unit = np.array(table.name_col(1), dtype=object)[code].tolist()
    kind = np.array(table.name_col(2), dtype=object)[code].tolist()
    streams: dict = {}
    sid = np.array([streams.setdefault(k, len(streams)) for k in zip(pe, unit)], dtype=np.int64)
    order = np.argsort(sid, kind="stable")
    first = np.searchsorted(sid[order], sid[order])  # where each record's stream starts, in order
    local = np.empty(len(sid), dtype=np.int64)
    local[order] = np.arange(len(sid)) - first       # its place within its stream
    why, ref = c["why"], c["ref"].copy()
    readied = np.nonzero((why < 0) & (ref >= 0))[0]  # stages readied by record ref (kbframe.sim.waits)
    ref_sid = np.full(len(sid), -1, dtype=np.int64)
    ref_sid[readied] = sid[ref[readied]]
    ref[readied] = local[ref[readied]]
    stream_of = list(streams)
    ref_stream = [stream_of[s] if s >= 0 else None for s in ref_sid.tolist()]
    names = zip(pe, unit, kind, c["bytes"].tolist(), c["peer"].tolist(), code.tolist(), why.tolist(), ref_stream)
    nums = zip(*(c[f].tolist() for f in ("cmd", "tile", "t0", "t1", "td")), ref.tolist())
    return list(zip(names, nums))


def _table_rows(names: list, codes: np.ndarray, nums: np.ndarray) -> np.ndarray:
    """The record table's rows (kbframe.records.FIELDS) of records ``(names, codes, nums)``
    (:meth:`Runs.records`, references made global)."""
    column = lambda j: np.array([n[j] for n in names], dtype=np.int64)[codes]  # noqa: E731
    rows = np.empty((len(codes), 10), dtype=np.int64)
    rows[:, 0] = column(5)      # name code
    rows[:, 1:6] = nums[:, :5]  # cmd, tile, t0, t1, td
    rows[:, 6] = column(3)      # bytes
    rows[:, 7] = column(4)      # peer
    rows[:, 8] = column(6)      # why
    rows[:, 9] = nums[:, _REF]  # ref
    return rows


def global_refs(table: list, codes: np.ndarray, nums: np.ndarray) -> np.ndarray:
    """The reference column back from stream-local to record indices (what the table holds).
    Raises NotPeriodic if a reference leaves its stream (then the copies misled us)."""
    streams: dict = {}
    sid = np.array([streams.setdefault((n[0], n[1]), len(streams)) for n in table], dtype=np.int64)[codes]
    ref_sid = np.array([streams.get(n[7], -1) if n[7] is not None else -1 for n in table], dtype=np.int64)[codes]
    order = np.argsort(sid, kind="stable")  # each stream's records, in record order, stream after stream
    start = np.searchsorted(sid[order], np.arange(len(streams)))
    count = np.bincount(sid, minlength=len(streams))
    out = nums.copy()
    at = np.nonzero(ref_sid >= 0)[0]
    local = nums[at, _REF]
    if (local < 0).any() or (local >= count[ref_sid[at]]).any():
        raise NotPeriodic("a stage's reference leaves its stream")
    out[at, _REF] = order[start[ref_sid[at]] + local]
    return out


def totals(sim: Simulation) -> dict:
    """Every integer a metric is made of, by name: they grow by the same amount each period,
    but peaks (TCM high water, a link's deepest queue), which stay."""
    e, o = sim.engine, sim.oplog
    t = {"latency_ps": sim.latency_ps, **o.totals()}
    for pe in e.pes.built():
        t[("cpu", pe.index, "n_commands")] = pe.cpu.n_commands
        t[("cpu", pe.index, "busy_ps")] = pe.cpu.busy_ps
        t[("tcm", pe.index)] = pe.tcm.high_water
    for key, ln in e.fabric.links.items():
        for f in ln.COUNTERS:
            t[("link", key, f)] = getattr(ln, f)
        t[("link", key, "max_outstanding")] = ln.max_outstanding
    for f in ("commands", "stages", "accesses"):
        if sim.sanitizer is not None and f in sim.sanitizer:  # None: not checked, or its verdict not yet in
            t[("sanitizer", f)] = sim.sanitizer[f]
    return t


def _is_constant(name) -> bool:
    return isinstance(name, tuple) and (name[0] == "tcm" or name[-1] == "max_outstanding")


def _arr(rs) -> np.ndarray:
    return np.array([r[1] for r in rs], dtype=np.int64).reshape(-1, NUMS)


def streams_of(recs: list) -> dict:
    """``{(pe, unit): [(index, record), ...]}`` in record order."""
    out: dict = {}
    for i, r in enumerate(recs):
        out.setdefault((r[0][0], r[0][1]), []).append((i, r))
    return out


def _own(r) -> tuple:
    """A stream record's own fields: its names, command, tile and times, and the index
    within its stream of the record that readied it (a stage whose times repeat but that
    an added period's record readied lies after the parting): the whole record."""
    return r[1]


def _names(rs) -> list:
    return [r[1][0] for r in rs]


def _parting(a: list, b: list, m: int, key) -> int:
    """Where stream ``key``'s records in ``b`` (``m`` more: one period) part from ``a``'s:
    the first record whose own fields differ. Raises NotPeriodic unless the records after
    that, and after ``b``'s block, are the same in both."""
    x = next((i for i, (ra, rb) in enumerate(zip(a, b)) if _own(ra) != _own(rb)), len(a))
    if _names(a[x:]) != _names(b[x + m:]):
        raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")
    return x


def precheck(a: tuple, b: tuple) -> None:
    """What the first two copies alone rule out, before the next two are simulated: a
    stream that does not grow by a period, or whose records after the block are not the
    same as the shorter copy's (NotPeriodic); a stream whose block moved by another time
    than the run against the period before it (Settling). ``a``, ``b``: ``(simulation,
    records, streams)``, as kbframe.run.fastforward's short copies hold them."""
    delta = b[0].latency_ps - a[0].latency_ps
    sa, sb = a[2], b[2]
    if set(sa) != set(sb):
        raise NotPeriodic("the copies do not have the same streams")
    for key in sorted(sa, key=str):
        ra, rb = sa[key], sb[key]
        m = len(rb) - len(ra)
        if m < 0:
            raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} do not grow by a period")
        x = _parting(ra, rb, m, key)
        if 0 < m <= x and _names(rb[x - m:x]) == _names(rb[x:x + m]):
            moved = _arr([r[1] for r in rb[x:x + m]])[:, 2:4] - _arr([r[1] for r in rb[x - m:x]])[:, 2:4]
            if (moved != delta).any():
                raise Settling(f"the records of {key[1]} on PE{key[0]} move {int(moved[moved != delta].min())} ps a "
                               f"period, the run {delta} ps")


class Runs:
    """The four short copies of one candidate period and what they say.

    Each stream of records (one unit of one PE: its dispatches, its stages, its commands)
    is in the order the unit made them. In the shorter copy ``a`` and the next one ``b`` a
    stream is the same up to where they part, then ``b`` has one period's records (the
    block), then both have the same records again (the tail), shifted. Every integer of a
    record moves by its own amount: a block record by what the third copy shows between
    its two blocks, a tail record by what ``b`` shows against ``a``. The streams then
    interleave by completion time, ties in the order ``b`` has them.
    """

    def __init__(self, sims: list, recs: list, streams: list):
        self.sims, self.recs = sims, recs
        keys = set(streams[0])
        if any(set(st) != keys for st in streams[1:]):
            raise NotPeriodic("the copies do not have the same streams")
        self.pre, self.blk, self.step, self.suf, self.tail_step = [], [], [], [], []
        self.in_c: list = [[], [], [], []]  # the third copy's indices of the prefix, both blocks, the tail
        for key in sorted(keys, key=str):
            a, b, c, d = (st[key] for st in streams)
            m = len(b) - len(a)
            if m < 0 or len(c) != len(a) + 2 * m or len(d) != len(a) + 3 * m:
                raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} do not grow by a period")
            x = _parting(a, b, m, key)
            if _names(b[x:x + m]) != _names(c[x + m:x + 2 * m]) \
                    or [_own(r) for r in c[:x + m]] != [_own(r) for r in b[:x + m]]:
                raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")
            self.pre += b[:x]
            self.blk += b[x:x + m]
            for part, rs in zip(self.in_c, (c[:x], c[x:x + m], c[x + m:x + 2 * m], c[x + 2 * m:])):
                part += [i for i, _ in rs]
            self.step.append(_arr([r[1] for r in c[x + m:x + 2 * m]]) - _arr([r[1] for r in c[x:x + m]]))
            self.suf += b[x + m:]
            self.tail_step.append(_arr([r[1] for r in b[x + m:]]) - _arr([r[1] for r in a[x:]]))
        self.step = np.concatenate(self.step) if self.step else np.zeros((0, NUMS), np.int64)
        delta = sims[1].latency_ps - sims[0].latency_ps
        moved = self.step[:, 2:4]
        if moved.size and not (moved == delta).all():  # a steady state moves every stream by Δ
            i = int(np.nonzero((moved != delta).any(axis=1))[0][0])
            n = self.blk[i][1][0]
            raise Settling(f"the records of {n[1]} on PE{n[0]} move {int(moved[i][moved[i] != delta][0])} ps a "
                           f"period, the run {delta} ps")
        self.tail_step = np.concatenate(self.tail_step) if self.tail_step else np.zeros((0, NUMS), np.int64)
        self.totals = [totals(s) for s in sims]

    def records(self, k: int) -> tuple[list, np.ndarray, np.ndarray]:
        """The records of the copy with ``k`` periods inserted after the shorter one
        (``k ≥ 1``; the second copy is ``k = 1``), in completion order: ``(table, codes,
        nums)``, each record's names ``table[code]`` and its integers a row of ``nums``."""
        table, code = [], {}
        for _, r in self.pre + self.blk + self.suf:
            if r[0] not in code:
                code[r[0]] = len(table)
                table.append(r[0])
        codes_of = lambda rs: np.array([code[r[0]] for _, r in rs], dtype=np.int64)  # noqa: E731
        pre = _arr([r for _, r in self.pre])
        blk = _arr([r for _, r in self.blk])
        blocks = blk[None, :, :] + np.arange(k, dtype=np.int64)[:, None, None] * self.step[None, :, :]
        suf = _arr([r for _, r in self.suf]) + (k - 1) * self.tail_step
        nums = np.concatenate([pre, blocks.reshape(-1, NUMS), suf])
        codes = np.concatenate([codes_of(self.pre), np.tile(codes_of(self.blk), k), codes_of(self.suf)])
        # ties in completion time: the order of the representatives in the second copy
        rank = np.concatenate([np.array([i for i, _ in self.pre], dtype=np.int64),
                               np.tile(np.array([i for i, _ in self.blk], dtype=np.int64), k),
                               np.array([i for i, _ in self.suf], dtype=np.int64)])
        order = np.lexsort((rank, nums[:, 3]))  # by end time, then as in the second copy
        if k >= 2:
            order = self._ties_as_in_third_copy(k, nums[:, 3], order)
        order = _completions_after_their_stage(table, codes, nums, order)
        return table, codes[order], nums[order]

    def _ties_as_in_third_copy(self, k: int, end: np.ndarray, order: np.ndarray) -> np.ndarray:
        """``order`` (records by end time, ties as in the second copy) with each group of
        records that end at one instant in the order the third copy has them, the group
        shifted by whole periods onto it: records of two neighbouring periods (a PE's
        dispatches a period ahead of another PE's stages) tie there as they do in the
        run, whereas the second copy holds one period. A group its two periods do not hold
        (three periods, or the first and the last of more) raises NotPeriodic."""
        n_pre, m, n_suf = len(self.pre), len(self.blk), len(self.suf)
        e = end[order]
        tie = np.zeros(len(e), dtype=bool)
        tie[1:] = e[1:] == e[:-1]
        tie[:-1] |= tie[1:]
        at = np.nonzero(tie)[0]
        if not len(at):
            return order
        pos = order[at]  # places in the prediction: prefix, k blocks, tail
        part = np.where(pos < n_pre, 0, np.where(pos < n_pre + k * m, 1, 2))
        inst = np.where(part == 1, (pos - n_pre) // max(m, 1), np.where(part == 2, k, -1))
        grp = np.cumsum(np.r_[True, e[at][1:] != e[at][:-1]]) - 1
        lo = np.full(grp[-1] + 1, k + 1, dtype=np.int64)
        hi = np.full(grp[-1] + 1, -2, dtype=np.int64)
        np.minimum.at(lo, grp, inst)
        np.maximum.at(hi, grp, inst)
        # a group's periods onto the third copy's two (and its prefix, tail): the tail
        # keeps its place after period k - 1, the prefix before period 0
        base = np.where(hi == k, k - 2, np.where(lo == -1, 0, lo))[grp]
        rel = np.where(part == 1, inst - base, 0)
        if (rel < 0).any() or (rel > 1).any() or ((lo == -1) & (hi == k) & (k > 2))[grp].any():
            raise NotPeriodic("records of more than two neighbouring periods end at one instant")
        c = [np.array(x, dtype=np.int64) for x in self.in_c]
        j = np.where(part == 0, pos, np.where(part == 1, (pos - n_pre) % max(m, 1), pos - n_pre - k * m))
        in_c = np.where(part == 0, c[0][np.minimum(j, max(n_pre - 1, 0))] if n_pre else 0,
                        np.where(part == 2, c[3][np.minimum(j, max(n_suf - 1, 0))] if n_suf else 0,
                                 np.where(rel == 0, c[1][np.minimum(j, max(m - 1, 0))] if m else 0,
                                          c[2][np.minimum(j, max(m - 1, 0))] if m else 0)))
        out = order.copy()
        out[at] = order[at][np.lexsort((in_c, grp))]
        return out

    def table(self, k: int) -> RecordTable:
        """:meth:`records` as the full run's record table (kbframe.records), its names those
        of the copies' tables and its references record indices. Raises NotPeriodic if a
        stage's reference leaves its stream."""
        names, codes, nums = self.records(k)
        rows = _table_rows(names, codes, global_refs(names, codes, nums))
        return RecordTable.of_rows(self.sims[-1].oplog.table.names, rows)

    def total(self, k: int) -> dict:
        ta, tb = self.totals[0], self.totals[1]
        if ta.keys() != tb.keys():
            raise NotPeriodic("the copies do not have the same units, links or PEs")
        return {n: (ta[n] if _is_constant(n) else ta[n] + k * (tb[n] - ta[n])) for n in ta}

    def verify(self) -> None:
        """The third and fourth copies must be what the first two predict. A copy whose
        sanitizer verdict is not yet in (``sim.sanitizer`` None while the first two have
        counts) has its counts compared by :meth:`verify_counts` once it is."""
        for k in (2, 3):
            table, codes, nums = self.records(k)
            recs = self.recs[k]
            if [table[c] for c in codes.tolist()] != [r[0] for r in recs] or not np.array_equal(
                    nums, np.array([r[1] for r in recs], dtype=np.int64).reshape(-1, NUMS)):
                raise NotPeriodic(f"the copy with {k} periods is not the predicted one")
            self._verify_total(k, pending=self.sims[k].sanitizer is None)

    def verify_counts(self, k: int = 3) -> None:
        """:meth:`verify` of copy ``k``'s totals again, its sanitizer verdict now in."""
        self.totals[k] = totals(self.sims[k])
        self._verify_total(k, pending=False)

    def _verify_total(self, k: int, pending: bool) -> None:
        tot, want = self.totals[k], self.total(k)
        if pending:  # the sanitizer's counts come later
            want = {n: v for n, v in want.items() if not (isinstance(n, tuple) and n[0] == "sanitizer")}
        if tot != want:
            bad = next(n for n in (*tot, *want) if tot.get(n) != want.get(n))
            raise NotPeriodic(f"the copy with {k} periods has another total {bad}")


def _completions_after_their_stage(table: list, codes: np.ndarray, nums: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` with each command's PE_SCHEDULER record moved to right after its own stage
    that ends at the same instant, if the tie-break put it before: PE_SCHEDULER logs a
    command as its last stage ends (kbframe.sim.oplog), and the second copy's order, which
    breaks the other ties, does not say this when the command's records lie in different
    parts (block, tail) of their streams. Column by column: a completion's sort key
    becomes the position of the last stage of its ``(pe, cmd)`` ending at its end, plus
    one half, when that stage comes after it."""
    n = len(order)
    if not n:
        return order
    names = [(t[0], t[1]) for t in table]
    pe = np.array([pe for pe, _ in names], dtype=np.int64)[codes[order]]
    sched = np.array([u == "scheduler" for _, u in names], dtype=bool)[codes[order]]
    stage = ~sched & ~np.array([u == "cpu" for _, u in names], dtype=bool)[codes[order]]
    cmd, end = nums[order, 0], nums[order, 3]
    g = np.lexsort((cmd, pe, end))  # groups of one (pe, cmd, end), end time first
    new = np.ones(n, dtype=bool)
    new[1:] = (end[g][1:] != end[g][:-1]) | (pe[g][1:] != pe[g][:-1]) | (cmd[g][1:] != cmd[g][:-1])
    group = np.empty(n, dtype=np.int64)
    group[g] = np.cumsum(new) - 1
    last_stage = np.full(int(group.max()) + 1, -1, dtype=np.int64)
    at = np.nonzero(stage)[0]
    np.maximum.at(last_stage, group[at], at)
    key = np.arange(n, dtype=np.float64)
    target = last_stage[group]
    move = sched & (target > key)
    if not move.any():
        return order
    key[move] = target[move] + 0.5
    return order[np.argsort(key, kind="stable")]
