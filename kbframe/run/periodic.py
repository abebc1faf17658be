"""The periodic model of a schedule: the records of short copies of a bench,
read as streams (one unit of one PE each: its dispatches, its stages, its commands),
compared, and the records and totals of a longer copy predicted from them. How
:mod:`kbframe.run.fastforward` uses it, and why it is exact, is told there.
"""
from __future__ import annotations

import numpy as np

from ..records import RecordTable
from ..sorting import stable_order
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
    order = stable_order(sid)
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
    order = stable_order(sid)  # each stream's records, in record order, stream after stream
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
    t = {"latency_ps": sim.latency_ps, **running_totals(sim.engine, sim.oplog)}
    for f in ("commands", "stages", "accesses"):
        if sim.sanitizer is not None and f in sim.sanitizer:  # None: not checked, or its verdict not yet in
            t[("sanitizer", f)] = sim.sanitizer[f]
    return t


def running_totals(e, o) -> dict:
    """:func:`totals` but the latency and the sanitizer's counts: what a simulation has
    summed so far (engine ``e``, op_log ``o``)."""
    t = o.totals()
    for pe in e.pes.built():
        t[("cpu", pe.index, "n_commands")] = pe.cpu.n_commands
        t[("cpu", pe.index, "busy_ps")] = pe.cpu.busy_ps
        t[("tcm", pe.index)] = pe.tcm.high_water
    for key, ln in e.fabric.links.items():
        for f in ln.COUNTERS:
            t[("link", key, f)] = getattr(ln, f)
        t[("link", key, "max_outstanding")] = ln.max_outstanding
    return t


def is_peak(name) -> bool:
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


#: most blocks one stream may take per period (every item of a PE's batch a KV tile more)
MAX_INSERTIONS = 256


def _name_codes(*streams, waits: bool = True) -> list[np.ndarray]:
    """Each stream's record names as integers, one code per distinct name (shared);
    ``waits`` False: the names but what the record waited for."""
    code: dict = {}
    key = (lambda n: n) if waits else (lambda n: n[:6] + n[7:])  # noqa: E731
    return [np.array([code.setdefault(key(r[1][0]), len(code)) for r in s], dtype=np.int64) for s in streams]


def _first_difference(x: np.ndarray, y: np.ndarray) -> int:
    """The first index where ``x`` and ``y`` (at least as long) differ; ``len(x)`` if none."""
    d = np.flatnonzero(x != y[:len(x)])
    return int(d[0]) if len(d) else len(x)


def _insertions(ca: np.ndarray, cb: np.ndarray, x: int, m: int, n: int,
                cmds: tuple | None = None) -> list[int] | None:
    """Where ``n`` blocks of ``m`` records go into the names ``ca`` to make ``cb``: the first
    before ``ca[x]``; each next one as far before the place where the names part again as
    the first is before the place where they first part (when ``cb`` repeats its names with
    period ``m`` over that stretch: the same tile of each item's loop), else at that place;
    their positions in ``ca``, or None when the names after the last block differ.
    ``cmds``: ``(command ids of a, of b, commands a block adds)``: a record after ``j``
    blocks has the same name and its command id ``j`` blocks' commands later in ``b``, and a
    block goes where that first fails (for a stream whose names repeat across items)."""
    if cmds is not None:
        ka, kb, per = cmds
        span = int(max(ka.max(initial=0), kb.max(initial=0))) + per * (n + 1) + 1
        ca, cb = ca * span + ka, cb * span + kb  # one key: the name, then the command id
    # the first block's place before the names part
    back = _first_difference(ca[x:], cb[x:]) if cmds is None else 0
    at, i, j = [x], x, x + m
    while len(at) < n:
        if cmds is not None:  # later blocks' records come their commands later
            k = _first_difference(ca[i:] + len(at) * per, cb[j:])
            i, j = i + k, j + k
        else:
            k = _first_difference(ca[i:], cb[j:])  # cb[j:] holds ca[i:] and the blocks still to come
            i, j = i + k, j + k
            r = min(back, k)
            if r and np.array_equal(cb[j - r:j], cb[j - r + m:j + m]):
                i, j = i - r, j - r
        at.append(i)
        j += m
    return at if np.array_equal(ca[i:] + (n * per if cmds is not None else 0), cb[j:]) else None


def _align(a: list, b: list, m_total: int, key, hints: dict | None = None) -> tuple[list[int], int]:
    """Where stream ``key``'s records in ``b`` (``m_total`` more: one period) part from
    ``a``'s: ``(positions, m)``, ``b`` being ``a`` with a block of ``m`` records before each
    of ``a``'s records at ``positions`` (in order; one block when the period adds records at
    one place, e.g. a layer; one per item when every item of a PE grows, e.g. a KV tile of
    each sequence). The first block starts at the first record whose own fields differ (the
    records before it are the same in both); the next ones where the names part again. The
    fewest blocks that make ``b`` are taken; ``hints[pe]``, ``(blocks, commands per block)`` of
    the PE's PE_CPU stream (one record per command; set here when ``key`` is that stream,
    so a PE's PE_CPU stream is aligned first), tried first when given, and placed
    where the command ids part when names would put two blocks in one place (a stream whose
    names repeat across items, opt3's GEMMs, would otherwise take one block of several
    items' records). Raises NotPeriodic when none do, Settling when PE_CPU's would in
    several blocks but for what its dispatches waited for (still filling PE_SCHEDULER's
    queue: in the longer copy it waits for room at other commands)."""
    x = next((i for i, (ra, rb) in enumerate(zip(a, b)) if _own(ra) != _own(rb)), len(a))
    ca, cb = _name_codes(a, b)
    blocks = (hints or {}).get(key[0])
    if m_total == 0:
        if np.array_equal(ca[x:], cb[x:]):
            return [x], 0
    else:
        cmds = None
        if blocks:
            cmds = (np.array([r[1][1][0] for r in a], dtype=np.int64),
                    np.array([r[1][1][0] for r in b], dtype=np.int64), blocks[1])
        found = _blocks(ca, cb, x, m_total, blocks[0] if blocks else None, cmds)
        if found is not None:
            if key[1] == "cpu" and len(found[0]) > 1 and hints is not None:
                hints[key[0]] = (len(found[0]), found[1])
            return found
        if key[1] == "cpu":
            found = _blocks(*_name_codes(a, b, waits=False), x, m_total, None)
            if found is not None and len(found[0]) > 1:
                raise Settling(f"the records of cpu on PE{key[0]} wait for PE_SCHEDULER's queue at other commands "
                               f"in the longer copy")
    raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")


def _blocks(ca: np.ndarray, cb: np.ndarray, x: int, m_total: int, first: int | None,
            cmds: tuple | None = None) -> tuple[list[int], int] | None:
    """:func:`_align`'s ``(positions, m)`` from the names ``ca``, ``cb``: ``first`` blocks
    tried first, each in its own place (by names, else by command ids, ``cmds``), then the
    fewest that make ``cb`` by names; None if none do."""
    if first and not m_total % first:
        for by in (None, cmds) if cmds is not None else (None,):  # by command ids when names repeat across items
            at = _insertions(ca, cb, x, m_total // first, first, by)
            if at is not None and len(set(at)) == len(at):
                return at, m_total // first
    for n in range(1, min(m_total, MAX_INSERTIONS) + 1):
        at = _insertions(ca, cb, x, m_total // n, n) if not m_total % n and n != first else None
        if at is not None:
            return at, m_total // n
    return None


def precheck(a: tuple, b: tuple) -> None:
    """What the first two copies alone rule out, before the next two are simulated: a
    stream that does not grow by a period, or whose records do not part from the shorter
    copy's in blocks (NotPeriodic); a stream whose block moved by another time than the run
    against the period before it (Settling; only when every stream grows at one place: a
    block of one of several items moves by that item's time, not the run's). ``a``, ``b``:
    ``(simulation, records, streams)``, as kbframe.run.fastforward's short copies hold them."""
    delta = b[0].latency_ps - a[0].latency_ps
    sa, sb = a[2], b[2]
    if set(sa) != set(sb):
        raise NotPeriodic("the copies do not have the same streams")
    settling, several, moves, hints = None, False, {}, {}
    for key in sorted(sa, key=str):  # a PE's PE_CPU stream before its others
        ra, rb = sa[key], sb[key]
        m_total = len(rb) - len(ra)
        if m_total < 0:
            raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} do not grow by a period")
        try:
            at, m = _align(ra, rb, m_total, key, hints)
        except NotPeriodic:
            if settling is not None and not several:  # the first fault in stream order
                raise settling from None
            raise
        several |= len(at) > 1
        for j, x in enumerate(at):
            x += j * m  # the block's place in b, against the m records before it
            if 0 < m <= x and _names(rb[x - m:x]) == _names(rb[x:x + m]):
                moved = _arr([r[1] for r in rb[x:x + m]])[:, 2:4] - _arr([r[1] for r in rb[x - m:x]])[:, 2:4]
                moves.setdefault((key[0], j), []).append((key, moved))
                if settling is None and j == 0 and (moved != delta).any():
                    settling = Settling(f"the records of {key[1]} on PE{key[0]} move "
                                        f"{int(moved[moved != delta].min())} ps a period, the run {delta} ps")
    if several:
        _check_moves(moves)
    elif settling is not None:
        raise settling


def _check_moves(moves: dict, delta: int | None = None) -> None:
    """When the period adds records at several places of a stream (an item each): every
    record a block of one item adds on a PE moves by the same time, that item's, in every
    stream of the PE (``moves``: ``{(pe, block ordinal): [(stream, moved (m, 2)), ...]}``),
    and, given the run's move ``delta``, some PE's items together move by it (the PE that
    ends the run). Raises Settling naming the first stream that moves otherwise (PE_CPU
    dispatching ahead of its units while it fills PE_SCHEDULER's queue)."""
    per_pe: dict = {}
    for (pe, j), got in sorted(moves.items(), key=str):
        some = [moved for _, moved in got if moved.size]
        if not some:
            continue
        t = int(some[0].flat[0])
        for key, moved in got:
            if moved.size and (moved != t).any():
                raise Settling(f"the records of {key[1]} on PE{pe} move {int(moved[moved != t].min())} ps a period, "
                               f"item {j + 1}'s other records {t} ps")
        per_pe[pe] = per_pe.get(pe, 0) + t
    if delta is not None and per_pe and delta not in per_pe.values():
        raise Settling(f"no PE's items move by the run's {delta} ps a period (PE{min(per_pe)}'s by {per_pe[min(per_pe)]})")


class Runs:
    """The four short copies of one candidate period and what they say.

    Each stream of records (one unit of one PE: its dispatches, its stages, its commands)
    is in the order the unit made them. In the shorter copy ``a`` and the next one ``b`` a
    stream is the same up to where they part; then ``b`` has one period's records (a
    block), then both have the same records again, shifted (a segment); when the period
    adds records at several places (every item of a PE a KV tile more), a block and a
    segment for each (:func:`_align`). Every integer of a record moves by its own amount: a
    block record by what the third copy shows between its two blocks (and, after another
    block, by what the third copy shows against ``b``), a segment record by what ``b``
    shows against ``a``. The streams then interleave by completion time, ties in the order
    ``b`` has them (:meth:`records`).
    """

    def __init__(self, sims: list, recs: list, streams: list):
        self.sims, self.recs = sims, recs
        keys = set(streams[0])
        if any(set(st) != keys for st in streams[1:]):
            raise NotPeriodic("the copies do not have the same streams")
        # segments (the records a period does not add) and blocks (those it adds), every
        # stream's in order: b's records, the ordinal of the segment or block in its stream,
        # how they move, the third copy's indices of their representatives
        self.seg, seg_step, seg_at, seg_c, seg_last = [], [], [], [], []
        self.blk, self.step, blk_shift, blk_at, blk_c0, blk_c1 = [], [], [], [], [], []
        several, moves, hints = False, {}, {}
        for key in sorted(keys, key=str):  # a PE's PE_CPU stream before its others
            a, b, c, d = (st[key] for st in streams)
            m_total = len(b) - len(a)
            if m_total < 0 or len(c) != len(a) + 2 * m_total or len(d) != len(a) + 3 * m_total:
                raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} do not grow by a period")
            at, m = _align(a, b, m_total, key, hints)
            several |= len(at) > 1
            x = at[0]
            if [_own(r) for r in c[:x + m]] != [_own(r) for r in b[:x + m]]:
                raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")
            for j, lo in enumerate(at):  # block j + 1: in b at lo + j·m, in c at lo + 2j·m
                bb, cc = lo + j * m, lo + 2 * j * m
                if _names(b[bb:bb + m]) != _names(c[cc + m:cc + 2 * m]):
                    raise NotPeriodic(f"the records of {key[1]} on PE{key[0]} are not periodic")
                self.blk += b[bb:bb + m]
                c0, c1 = _arr([r[1] for r in c[cc:cc + m]]), _arr([r[1] for r in c[cc + m:cc + 2 * m]])
                self.step.append(c1 - c0)
                moves.setdefault((key[0], j), []).append((key, (c1 - c0)[:, 2:4]))
                blk_shift.append(c0 - _arr([r[1] for r in b[bb:bb + m]]))
                blk_at += [j + 1] * m
                blk_c0 += [i for i, _ in c[cc:cc + m]]
                blk_c1 += [i for i, _ in c[cc + m:cc + 2 * m]]
            for j, (lo, hi) in enumerate(zip([0, *at], [*at, len(a)])):  # segment j: after block j
                rb = b[lo + j * m:hi + j * m]
                self.seg += rb
                seg_step.append(_arr([r[1] for r in rb]) - _arr([r[1] for r in a[lo:hi]]))
                seg_at += [j] * (hi - lo)
                seg_last += [j == len(at)] * (hi - lo)
                seg_c += [i for i, _ in c[lo + 2 * j * m:hi + 2 * j * m]]
        empty = np.zeros((0, NUMS), np.int64)
        self.step = np.concatenate(self.step) if self.step else empty
        self.blk_shift = np.concatenate(blk_shift) if blk_shift else empty
        self.seg_step = np.concatenate(seg_step) if seg_step else empty
        self.seg_at, self.seg_c = np.array(seg_at, dtype=np.int64), np.array(seg_c, dtype=np.int64)
        self.seg_last = np.array(seg_last, dtype=bool)  # a stream's last segment: no block after it
        self.blk_at = np.array(blk_at, dtype=np.int64)
        self.blk_c = (np.array(blk_c0, dtype=np.int64), np.array(blk_c1, dtype=np.int64))
        delta = sims[1].latency_ps - sims[0].latency_ps
        moved = self.step[:, 2:4]
        # a steady state moves every stream by Δ (a block of one of several items: by that item's time)
        if several:
            _check_moves(moves, delta)
        elif moved.size and not (moved == delta).all():
            i = int(np.nonzero((moved != delta).any(axis=1))[0][0])
            n = self.blk[i][1][0]
            raise Settling(f"the records of {n[1]} on PE{n[0]} move {int(moved[i][moved[i] != delta][0])} ps a "
                           f"period, the run {delta} ps")
        self.totals = [totals(s) for s in sims]
        self._as_scheduled: bool | None = None  # whether every copy's ties are as scheduled (_ties_as_scheduled)

    def records(self, k: int) -> tuple[list, np.ndarray, np.ndarray]:
        """The records of the copy with ``k`` periods inserted after the shorter one
        (``k ≥ 1``; the second copy is ``k = 1``), in completion order: ``(table, codes,
        nums)``, each record's names ``table[code]`` and its integers a row of ``nums``.
        A segment record moves ``k - 1`` times its step; instance ``i`` of a block's record
        ``i`` times its step, and ``k - 1`` times the shift the blocks before it give it."""
        table, code = [], {}
        for _, r in self.seg + self.blk:
            if r[0] not in code:
                code[r[0]] = len(table)
                table.append(r[0])
        codes_of = lambda rs: np.array([code[r[0]] for _, r in rs], dtype=np.int64)  # noqa: E731
        seg = _arr([r for _, r in self.seg]) + (k - 1) * self.seg_step
        blk = _arr([r for _, r in self.blk]) + (k - 1) * self.blk_shift
        blocks = blk[None, :, :] + np.arange(k, dtype=np.int64)[:, None, None] * self.step[None, :, :]
        nums = np.concatenate([seg, blocks.reshape(-1, NUMS)])
        codes = np.concatenate([codes_of(self.seg), np.tile(codes_of(self.blk), k)])
        # ties in completion time: the order of the representatives in the second copy
        rank = np.concatenate([np.array([i for i, _ in self.seg], dtype=np.int64),
                               np.tile(np.array([i for i, _ in self.blk], dtype=np.int64), k)])
        order = np.lexsort((rank, nums[:, 3]))  # by end time, then as in the second copy
        if k >= 2:
            order = self._ties_as_in_third_copy(k, nums, order)
        order = _completions_after_their_stage(table, codes, nums, order)
        return table, codes[order], nums[order]

    def _ties_as_in_third_copy(self, k: int, nums: np.ndarray, order: np.ndarray) -> np.ndarray:
        """``order`` (records by end time, ties as in the second copy) with each group of
        records that end at one instant in the order the third copy has them, the group
        shifted by whole periods onto it: records of two neighbouring periods (a PE's
        dispatches a period ahead of another PE's stages) tie there as they do in the
        run, whereas the second copy holds one period. Per block ordinal j, a group's
        instances of block j go onto the third copy's two; the segment before block j
        keeps its place before instance 0, the one after it after instance k - 1. A group
        its two instances do not hold (three instances, or the first and the last of more:
        records of periods far apart) goes in the order its records were scheduled
        (:func:`_far_ties`), when the copies show that order for every tie they hold, else
        raises NotPeriodic."""
        n_seg, m = len(self.seg), len(self.blk)
        e = nums[order, 3]
        tie = np.zeros(len(e), dtype=bool)
        tie[1:] = e[1:] == e[:-1]
        tie[:-1] |= tie[1:]
        at = np.nonzero(tie)[0]
        if not len(at):
            return order
        pos = order[at]  # places in the prediction: segments, then k instances of the blocks
        is_blk = pos >= n_seg
        b = np.where(is_blk, (pos - n_seg) % max(m, 1), 0)
        s = np.where(is_blk, 0, np.minimum(pos, max(n_seg - 1, 0)))
        inst = np.where(is_blk, (pos - n_seg) // max(m, 1), 0)
        ordinal = np.where(is_blk, self.blk_at[b] if m else 0, self.seg_at[s] if n_seg else 0)
        grp = np.cumsum(np.r_[True, e[at][1:] != e[at][:-1]]) - 1
        # each record's instance as block ordinal j sees it: its own (block j), -1 (the
        # segment before block j of its stream), k (the segment after it)
        width = int(max(self.blk_at.max(initial=0), self.seg_at.max(initial=0))) + 2
        before = ~is_blk & ~(self.seg_last[s] if n_seg else False)
        after = ~is_blk & (ordinal > 0)
        cell = np.concatenate([grp[is_blk] * width + ordinal[is_blk],
                               grp[before] * width + ordinal[before] + 1,
                               grp[after] * width + ordinal[after]])
        seen = np.concatenate([inst[is_blk], np.full(before.sum(), -1), np.full(after.sum(), k)])
        n_cells = int(grp[-1] + 1) * width
        lo = np.full(n_cells, k + 1, dtype=np.int64)
        hi = np.full(n_cells, -2, dtype=np.int64)
        np.minimum.at(lo, cell, seen)
        np.maximum.at(hi, cell, seen)
        # a cell's instances onto the third copy's two: those with the segment after the
        # block end on its second, those with the segment before it start on its first
        base = np.where(hi == k, k - 2, np.where(lo == -1, 0, lo))
        own = grp * width + ordinal
        rel = np.where(is_blk, inst - base[own], 0)
        far = np.zeros(int(grp[-1]) + 1, dtype=bool)  # groups the third copy does not hold
        far[np.nonzero((lo == -1) & (hi == k) & (k > 2))[0] // width] = True
        far[grp[(rel < 0) | (rel > 1)]] = True
        c0, c1 = self.blk_c
        in_c = np.where(is_blk, np.where(rel == 0, c0[b] if m else 0, c1[b] if m else 0),
                        self.seg_c[s] if n_seg else 0)
        began = np.zeros(len(at), dtype=np.int64)
        if far.any():
            if self._as_scheduled is None:  # the copies' verdict, once (records is made for k = 2, 3 and the run)
                self._as_scheduled = all(_ties_as_scheduled(sim.oplog.table) for sim in self.sims)
            if not self._as_scheduled:
                raise NotPeriodic("records of more than two neighbouring periods end at one instant")
            began = _far_ties(nums[pos], far[grp])
        in_c[far[grp]] = 0
        out = order.copy()
        out[at] = order[at][np.lexsort((in_c, began, grp))]
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
        return {n: (ta[n] if is_peak(n) else ta[n] + k * (tb[n] - ta[n])) for n in ta}

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


def _far_ties(nums: np.ndarray, far: np.ndarray) -> np.ndarray:
    """The sort key of tied records (``nums``) of groups the third copy does not hold
    (``far``; others 0): records of periods far apart (PE_CPU dispatching many tiles ahead
    of its units) ending at one instant. The simulator logs them in the order their last
    waits were scheduled: a DMA transfer's data phase, else the record's start. An IPCQ
    receive (no duration) was scheduled by its sender earlier: such a group raises
    NotPeriodic."""
    if (far & (nums[:, 3] == nums[:, 2])).any():
        raise NotPeriodic("records of more than two neighbouring periods end at one instant")
    return np.where(far, _scheduled(nums[:, 2], nums[:, 4]), 0)


def _scheduled(t0: np.ndarray, td: np.ndarray) -> np.ndarray:
    """When each record's last wait was scheduled: a DMA transfer's data phase, else its start."""
    return np.where(td >= 0, td, t0)


def _ties_as_scheduled(table: RecordTable) -> bool:
    """Whether the records of ``table`` (a simulated copy) that end at one instant are in
    the order their last waits were scheduled (:func:`_scheduled`), those of PE_SCHEDULER
    (logged right after their command's last stage) and those without duration (an IPCQ
    receive, scheduled by its sender) aside: the rule :func:`_far_ties` relies on, seen to
    hold in the run's own copies before it is used."""
    if not len(table):
        return True
    c = table.cols()
    sched = np.array([u == "scheduler" for u in table.name_col(1)], dtype=bool)[c["name"]]
    ok = ~sched & (c["t1"] > c["t0"])
    end, key = c["t1"][ok], _scheduled(c["t0"], c["td"])[ok]
    same = end[1:] == end[:-1]  # consecutive records of those, in the order logged
    return bool((key[1:][same] >= key[:-1][same]).all())


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
