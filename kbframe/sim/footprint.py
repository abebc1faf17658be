"""Memory footprints of stages: which bytes each stage reads and writes.

The sanitizer's ``data_dependencies`` rule re-plans every command with
:class:`FootprintNumerics`, a :class:`~kbframe.sim.numerics.Numerics` whose effects report
the sources they read and the destinations they write instead of computing; :func:`footprint`
turns a source into byte intervals and :class:`Space` tracks the last writer and readers of
each interval of one memory space; :func:`hazard_free` shows, for all accesses at once,
that none of them is a hazard.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from math import prod

import numpy as np

from ..ir.handles import itemsize
from .numerics import Numerics


class _Access:
    """The footprint of one numeric effect: what it reads and writes."""

    __slots__ = ("sink", "reads", "writes")

    def __init__(self, sink, reads, writes):
        self.sink, self.reads, self.writes = sink, reads, writes

    def __call__(self):
        self.sink.append(self)


class FootprintNumerics(Numerics):
    """A :class:`~kbframe.sim.numerics.Numerics` whose effects, instead of computing, report
    the sources they read and the destinations they write (for re-planning a command)."""

    def __init__(self):
        self.sink: list = []

    def _acc(self, reads, writes):
        return _Access(self.sink, [s for s in reads if s is not None], [w for w in writes if w is not None])

    def copy(self, src, dst):
        return self._acc([src], [dst])

    def gemm(self, a, b, acc_key, first):
        return self._acc([a, b] + ([] if first else [("acc", acc_key)]), [("acc", acc_key)])

    def send(self, src, link):
        return self._acc([src], [])

    def recv(self, link, dst):
        return self._acc([], [dst])

    def accumulate(self, part_key, acc_key, first):
        return self._acc([("acc", part_key)] + ([] if first else [("acc", acc_key)]), [("acc", acc_key)])

    def epilogue(self, kind, acc_key, others, extra):
        return self._acc([("acc", acc_key), *others], [("acc", acc_key)])

    def writeback(self, acc_key, dst):
        return self._acc([("acc", acc_key)], [dst])

    def math(self, kind, inputs, out, extra):
        return self._acc([] if kind == "fill" else list(inputs), [(out, None)])

    def accesses(self, stage):
        """``(reads, writes)`` source lists of a re-planned stage."""
        self.sink.clear()
        if stage.effect is not None:
            stage.effect()
        reads, writes = [], []
        for a in self.sink:
            reads += a.reads
            writes += a.writes
        return reads, writes


def _span(sl, n):
    if sl is None:
        return 0, n
    r0, r1, _ = sl.indices(n)
    return r0, r1


def footprint(src) -> list:
    """``[(space, lo, hi, label)]`` of a numerics source: ``(handle, region)``, a DMA
    staging key (``str``) or ``("acc", key)``. Handles give byte intervals in their space
    (one per row when a region covers only some columns); keys are their own space."""
    return _footprint(src, False)


def bounds(src) -> tuple:
    """``(space, lo, hi, n)`` of a numerics source: the bytes ``[lo, hi)`` that hold every
    interval of its :func:`footprint` and their number ``n`` (``n == 0``: none), without
    making them (a read no write overlaps can be no hazard: kbframe.sim.sanitizer)."""
    return _footprint(src, True)


def _footprint(src, bounding: bool):
    if isinstance(src, str):
        return ("stage:" + src, 0, 1, 1) if bounding else [("stage:" + src, 0, 1, src)]
    h, region = src
    if h == "acc":
        return ("acc:" + region, 0, 1, 1) if bounding else [("acc:" + region, 0, 1, region)]
    isz = itemsize(h.dtype)
    R = h.buf_shape[0] if h.buf_shape else 1
    C = prod(h.buf_shape[1:]) if len(h.buf_shape) > 1 else 1
    w0, w1 = h.rows if h.rows is not None else (0, R)
    rs, cs = region if region is not None else (None, None)
    if h.trans:  # logical (C, w1-w0): region rows are buffer columns
        c0, c1 = _span(rs, C)
        r0, r1 = _span(cs, w1 - w0)
    else:
        r0, r1 = _span(rs, w1 - w0)
        c0, c1 = _span(cs, C)
    r0, r1 = w0 + r0, w0 + r1
    stride = C * isz
    if r1 <= r0 or c1 <= c0:
        return (h.space, 0, 0, 0) if bounding else []
    if c0 == 0 and c1 == C:
        lo, hi = h.addr + r0 * stride, h.addr + r1 * stride
        return (h.space, lo, hi, 1) if bounding else [(h.space, lo, hi, h.name)]
    if bounding:
        return h.space, h.addr + r0 * stride + c0 * isz, h.addr + (r1 - 1) * stride + c1 * isz, r1 - r0
    return [(h.space, h.addr + r * stride + c0 * isz, h.addr + r * stride + c1 * isz, h.name)
            for r in range(r0, r1)]


def strided(src) -> tuple:
    """``(space, lo, width, n, stride)`` of a numerics source: its :func:`footprint` as the
    ``n`` intervals ``[lo + i·stride, lo + i·stride + width)``, ``i < n`` (``n == 0``: none;
    kbframe.sim.access_templates shifts them per command)."""
    if isinstance(src, str):
        return "stage:" + src, 0, 1, 1, 0
    h, region = src
    if isinstance(h, str):  # ("acc", key)
        return "acc:" + region, 0, 1, 1, 0
    space, lo, hi, n = _footprint(src, True)
    if n <= 1:
        return space, lo, hi - lo, n, 0
    stride = (prod(h.buf_shape[1:]) if len(h.buf_shape) > 1 else 1) * itemsize(h.dtype)
    return space, lo, hi - lo - (n - 1) * stride, n, stride


class Space:
    """Disjoint segments ``[lo, hi, last_writer, readers_since]`` of one memory space."""

    __slots__ = ("lo", "seg")

    def __init__(self):
        self.lo: list = []
        self.seg: list = []

    def _split(self, x):
        i = bisect_right(self.lo, x) - 1
        if i >= 0:
            s = self.seg[i]
            if s[0] < x < s[1]:
                self.lo.insert(i + 1, x)
                self.seg.insert(i + 1, [x, s[1], s[2], list(s[3])])
                s[1] = x

    def cover(self, lo, hi) -> list:
        """Segments exactly covering ``[lo, hi)`` (created empty where nothing was)."""
        self._split(lo)
        self._split(hi)
        i = bisect_left(self.lo, lo)
        out, pos = [], lo
        while pos < hi:
            if i < len(self.seg) and self.seg[i][0] == pos:
                s = self.seg[i]
            else:
                end = min(self.lo[i], hi) if i < len(self.lo) else hi
                s = [pos, end, None, []]
                self.lo.insert(i, pos)
                self.seg.insert(i, s)
            out.append(s)
            pos = s[1]
            i += 1
        return out


class WriteUnion:
    """The union of write intervals ``(space, lo, hi, label)`` per space, to ask whether a
    byte range overlaps any of them (a read none overlaps can be part of no hazard: rule 6,
    kbframe.sim.sanitizer)."""

    def __init__(self, intervals):
        per: dict = defaultdict(list)
        for space, lo, hi, _ in intervals:
            if hi > lo:
                per[space].append((lo, hi))
        self.spaces = {}
        for space, ivs in per.items():
            ivs.sort()
            los, his = [ivs[0][0]], [ivs[0][1]]
            for lo, hi in ivs[1:]:
                if lo <= his[-1]:
                    his[-1] = max(his[-1], hi)
                else:
                    los.append(lo)
                    his.append(hi)
            self.spaces[space] = (los, his)

    def overlaps(self, space, lo: int, hi: int) -> bool:
        got = self.spaces.get(space)
        if got is None or hi <= lo:
            return False
        los, his = got
        j = bisect_right(los, hi - 1) - 1  # the last union interval starting below hi
        return j >= 0 and his[j] > lo


#: addresses in a space below this: a space's number and an address share one int64 key
_ADDR_LIMIT = 1 << 40


def hazard_free(touched) -> bool:
    """True when no access of ``touched`` can be a RAW, WAR or WAW hazard (the sanitizer's
    rule 6, ``data_dependencies``); False when that cannot be shown this way (then the
    accesses are walked one by one, kbframe.sim.sanitizer, which names a hazard if
    there is one).

    ``touched``: per stage in program order ``(stage, t0, reads, writes)``, ``t0`` when it
    began touching memory, reads and writes as :func:`footprint` intervals.

    The accesses are cut at every interval boundary of their space into elementary
    segments; in each, every access must begin (``t0``) no earlier than the end of every
    write by an earlier stage, and a write no earlier than the end of every read by an
    earlier stage. That holds for all earlier accesses, not only the latest writer and
    the readers since, as :class:`Space` checks, which is what makes it sufficient; and
    when the latest ones keep their order, all earlier ones do too (each write waited
    for those before it), so a run the rule accepts passes here. Numpy over all accesses
    at once: no Python step per segment."""
    ids: dict = {}
    rows = [(ids.setdefault(space, len(ids)), lo, hi, w, k)
            for k, (_, _, r_iv, w_iv) in enumerate(touched)
            for w, ivs in ((0, r_iv), (1, w_iv)) for space, lo, hi, _ in ivs]
    if not rows:
        return True
    sid, lo, hi, write, k = (np.array(col) for col in zip(*rows))
    t0 = np.array([t for _, t, _, _ in touched])
    t_end = np.array([st.t_end for st, _, _, _ in touched])
    return hazard_free_columns(sid, lo, hi, write, k, t0, t_end)


def hazard_free_columns(sid, lo, hi, write, k, t0, t_end) -> bool:
    """:func:`hazard_free` on columns: per access (in program order) its space id, bytes
    ``[lo, hi)``, whether it writes and its stage ``k``; per stage ``t0`` and ``t_end``."""
    if not len(sid):
        return True
    # what a run never makes (times not integer ps, a stage that did not end, an interval
    # backwards or beyond the keys): the walk says what it makes of it
    if any(a.dtype.kind != "i" for a in (lo, hi, t0, t_end)) or sid.max() + 1 >= 1 << 22 \
            or lo.min() < 0 or hi.max() >= _ADDR_LIMIT or (hi < lo).any() or t_end.min() < 0:
        return False
    key_lo, key_hi = sid * _ADDR_LIMIT + lo, sid * _ADDR_LIMIT + hi
    cuts = np.unique(np.concatenate([key_lo, key_hi]))
    first, past = np.searchsorted(cuts, key_lo), np.searchsorted(cuts, key_hi)
    # one entry per (access, elementary segment it covers), in access order
    count = past - first
    acc = np.repeat(np.arange(len(sid)), count)
    seg = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
    order = np.argsort(seg, kind="stable")  # by segment, then access order
    seg, acc = seg[order], acc[order]
    stage, w = k[acc], write[acc].astype(bool)
    new_seg = np.ones(len(seg), dtype=bool)
    new_seg[1:] = seg[1:] != seg[:-1]
    new_run = new_seg.copy()  # a run: one stage's accesses to one segment
    new_run[1:] |= stage[1:] != stage[:-1]
    seg_start = np.flatnonzero(new_seg)[np.cumsum(new_seg) - 1]
    before = np.flatnonzero(new_run)[np.cumsum(new_run) - 1] - 1  # the last entry of an earlier stage
    earlier = before >= seg_start
    # the latest end of a write (of a read) so far in its segment, as end + 1 (0: none),
    # each segment's values raised above the ones before it so one running maximum serves all
    span = int(t_end.max()) + 2
    n_seg = int(new_seg.sum())
    if n_seg * span >= 1 << 62:
        return False
    base = (np.cumsum(new_seg) - 1) * span
    ends = t_end[stage] + 1
    last_write = np.maximum.accumulate(np.where(w, ends, 0) + base) - base
    last_read = np.maximum.accumulate(np.where(w, 0, ends) + base) - base
    prev = np.where(earlier, before, 0)
    after_write = np.where(earlier, last_write[prev], 0)
    after_read = np.where(earlier & w, last_read[prev], 0)
    start = t0[stage]
    return not (np.any((after_write > 0) & (start < after_write - 1))
                or np.any((after_read > 0) & (start < after_read - 1)))
