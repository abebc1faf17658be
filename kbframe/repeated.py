"""A run's record table held as what was simulated and a stretch it repeats: the full run's
records made on demand, never all at once.

A model step fast-forwarded along its layers (kbframe.run.skipped) is the simulated run
``B`` (its nested loops' jumps put back) with ``X`` periods of ``P`` records put back at
record ``x``: the period before ``x`` moved by 1, 2, .. ``X`` periods, then the records from
``x`` on moved by ``X`` periods. A :class:`RepeatedTable` holds ``B`` and, per record of that
period and of the records after it, how it moves a period (``step``); record ``v`` of the
full run is::

    v < x                     B[v]
    x <= v < x + X*P          B[x - P + j] + k * step_period[j]     (j, k-1 = divmod(v - x, P))
    v >= x + X*P              B[v - X*P] + X * step_tail[v - X*P - x]

The analyses that know this (the critical path, the phases, the op_log's periodic form,
the trace) work from ``B`` and the period; anything else reads the full run's records
through the :class:`~kbframe.records.RecordTable` interface (:meth:`RecordTable.array`,
:meth:`~RecordTable.cols`, :meth:`~RecordTable.text`), made a slice at a time. A foundation
module: the report layer reads it too.
"""
from __future__ import annotations

import numpy as np

from .record_fields import FIELDS, N
from .records import RecordTable

_T0 = FIELDS.index("t0")


class RepeatedTable(RecordTable):
    """The full run's records as ``base`` (``(n, 10)`` int64, the records simulated) and
    ``X`` periods of ``P`` records put back at record ``x`` (module doc).

    Args:
        base: the simulated records (with the jumps of nested loops put back), owned.
        names: ``(pe, unit, op_kind)`` of each name code.
        x: the first record after the jump, ``P <= x <= len(base)``.
        step_period: ``(P, 10)``: how each record of ``base[x - P:x]`` moves a period.
        step_tail: ``(len(base) - x, 10)``: how each record of ``base[x:]`` moves a period.
    Raises:
        ValueError: the period, its place or the steps do not fit ``base``.
    """

    def __init__(self, base: np.ndarray, names: list, x: int, P: int, X: int, step_period: np.ndarray,
                 step_tail: np.ndarray):
        # a RecordTable's fields but its buffer (:attr:`buf` makes the full run's on demand)
        self.names, self._codes, self._heads, self.form, self._reading = [], {}, [], None, None
        for key in names:
            self.code(*key)
        if not (0 < P <= x <= len(base)) or X < 0 or step_period.shape != (P, N) \
                or step_tail.shape != (len(base) - x, N):
            raise ValueError(f"RepeatedTable: a period of {P} records at {x} of {len(base)}, {X} times, "
                             f"steps {step_period.shape} and {step_tail.shape}")
        self.base, self.x, self.P, self.X = base, x, P, X
        self.step_period, self.step_tail = step_period, step_tail
        self.dt = int(step_period[0, _T0])  # ps a period
        self._full: bytearray | None = None

    # ---- where a record of the full run comes from ------------------------------------
    def __len__(self) -> int:
        return len(self.base) + self.X * self.P

    @property
    def end(self) -> int:
        """The first record after the periods put back (the records from ``x`` on, moved)."""
        return self.x + self.X * self.P

    def base_index(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(i, k)`` of full-run records ``v``: each is ``base[i]`` moved ``k`` periods."""
        v = np.asarray(v, dtype=np.int64)
        mid = (v >= self.x) & (v < self.end)
        tail = v >= self.end
        i = np.where(mid, self.x - self.P + (v - self.x) % self.P, np.where(tail, v - self.X * self.P, v))
        k = np.where(mid, (v - self.x) // self.P + 1, np.where(tail, self.X, 0))
        return i, k

    def rows_at(self, v: np.ndarray) -> np.ndarray:
        """Full-run records ``v`` (any indices), ``(len(v), 10)`` int64."""
        i, k = self.base_index(v)
        out = self.base[i].copy()
        mid = (k > 0) & (i < self.x)
        out[mid] += k[mid, None] * self.step_period[i[mid] - (self.x - self.P)]
        tail = i >= self.x
        out[tail] += self.X * self.step_tail[i[tail] - self.x]
        return out

    def array(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Full-run records ``[lo, hi)`` as an ``(n, 10)`` int64 array, made from ``base``."""
        return self._made(lo, hi, slice(None))

    def column(self, field: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Field ``field`` of full-run records ``[lo, hi)``."""
        return self._made(lo, hi, FIELDS.index(field))

    def _made(self, lo: int, hi: int | None, j) -> np.ndarray:
        """Records ``[lo, hi)``: all fields (``j`` a slice) or field ``j``."""
        n = len(self)
        hi = n if hi is None else min(hi, n)
        lo = max(0, min(lo, hi))
        base, step_period, step_tail = self.base[:, j], self.step_period[:, j], self.step_tail[:, j]
        out = np.empty((hi - lo, N) if isinstance(j, slice) else hi - lo, dtype=np.int64)
        x, P, end = self.x, self.P, self.end
        a, b = lo, min(hi, x)  # before the jump
        if b > a:
            out[:b - a] = base[a:b]
        a, b = max(lo, x), min(hi, end)  # the periods put back, a period at a time
        at = a
        while at < b:
            k, i = divmod(at - x, P)
            m = min(P - i, b - at)
            part = out[at - lo:at - lo + m]
            np.multiply(step_period[i:i + m], k + 1, out=part)
            part += base[x - P + i:x - P + i + m]
            at += m
        a = max(lo, end)  # the records after them
        if hi > a:
            i = a - self.X * P
            part = out[a - lo:]
            np.multiply(step_tail[i - x:i - x + hi - a], self.X, out=part)
            part += base[i:i + hi - a]
        return out

    def _bytes(self, lo: int, hi: int) -> bytes:
        return self.array(lo, hi).tobytes()

    def simulated(self) -> "RepeatedTable":
        """The records simulated, ``base``, as a table of their own (the period put back no time)."""
        return self.with_periods(0)

    def with_periods(self, X: int) -> "RepeatedTable":
        """The same run with the period put back ``X`` times (a shorter run, for ``X``
        below :attr:`X`)."""
        return RepeatedTable(self.base, self.names, self.x, self.P, X, self.step_period, self.step_tail)

    def pieces(self) -> tuple:
        """The full run as ``(lo, hi, times)`` slices of ``base`` in record order: fields a
        period does not move (names, bytes, tiles) read the same in each."""
        return (0, self.x, 1), (self.x - self.P, self.x, self.X), (self.x, len(self.base), 1)

    # ---- the full run, made whole only where something still needs it ------------------
    @property
    def buf(self) -> bytearray:
        """The full run's records as bytes (made once, when first asked for: what reads the
        whole run at once, as the check against the full simulation does)."""
        if self._full is None:
            self._full = bytearray(len(self) * N * 8)
            out = np.frombuffer(self._full, dtype=np.int64).reshape(-1, N)
            step = 1 << 20
            for a in range(0, len(self), step):
                out[a:a + step] = self.array(a, a + step)
        return self._full

    def append(self, *record) -> None:
        raise TypeError("a RepeatedTable is made, not grown")

    def extend(self, rows: np.ndarray) -> None:
        raise TypeError("a RepeatedTable is made, not grown")
