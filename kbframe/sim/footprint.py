"""Memory footprints of stages: which bytes each stage reads and writes.

The sanitizer's ``data_dependencies`` rule re-plans every command with
:class:`FootprintNumerics`, a :class:`~kbframe.sim.numerics.Numerics` whose effects report
the sources they read and the destinations they write instead of computing; :func:`footprint`
turns a source into byte intervals and :class:`Space` tracks the last writer and readers of
each interval of one memory space.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from math import prod

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
    if isinstance(src, str):
        return [("stage:" + src, 0, 1, src)]
    h, region = src
    if h == "acc":
        return [("acc:" + region, 0, 1, region)]
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
        return []
    if c0 == 0 and c1 == C:
        return [(h.space, h.addr + r0 * stride, h.addr + r1 * stride, h.name)]
    return [(h.space, h.addr + r * stride + c0 * isz, h.addr + r * stride + c1 * isz, h.name)
            for r in range(r0, r1)]


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
