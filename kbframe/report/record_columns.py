"""A run's records as columns, what the critical path and the phases read: :class:`Records`
(ten columns, one per field of ``OpLog.waits.columns()``), :func:`as_records` to make them,
and :class:`LastOf`, the last record of a unit per command. Column access, not one tuple
per record: a long run has millions (kbframe.report.critical_path)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..records import label_codes


class Records(NamedTuple):
    """The records as columns (indexable sequences, one per field, record ``i`` at
    ``[i]``): what the critical path and the phases read. A simulation's are int64 arrays
    and, for the names, :class:`~kbframe.records.Labels` (``OpLog.waits.columns()``); lists
    do too."""
    pe: Sequence
    unit: Sequence
    kind: Sequence
    cmd: Sequence
    t0: Sequence
    t1: Sequence
    td: Sequence
    why: Sequence
    ref: Sequence
    end: Sequence

    @property
    def n(self) -> int:
        return len(self.pe)

    def last_of(self, unit: str) -> "LastOf":
        """The last record of ``unit`` per command (:class:`LastOf`)."""
        codes, values = label_codes(self.unit)
        if unit not in values:
            return LastOf(*(np.zeros(0, dtype=np.int64),) * 3)
        at = np.nonzero(codes == values.index(unit))[0]
        return LastOf(np.asarray(self.pe, dtype=np.int64)[at], np.asarray(self.cmd, dtype=np.int64)[at], at)


class LastOf:
    """``(pe, cmd) → index`` of a unit's last record per command, as a dict's ``get``
    (a key it lacks: ``default``) and for arrays of keys at once (:meth:`many`). A table per
    PE over its command ids (each PE numbers its commands without gaps), not a dict of
    millions of tuples; ids spread far wider than the records, or a negative PE (an edited
    op_log), are kept in a dict instead."""

    def __init__(self, pe: np.ndarray, cmd: np.ndarray, at: np.ndarray):
        self._n = len(at)
        self._lo = int(cmd.min()) if self._n else 0
        n_pe = int(pe.max()) + 1 if self._n else 0
        width = int(cmd.max()) - self._lo + 1 if self._n else 0
        self._dict = None
        if self._n and (int(pe.min()) < 0 or n_pe * width > 4 * self._n + (1 << 16)):
            self._dict = dict(zip(zip(pe.tolist(), cmd.tolist()), at.tolist()))  # a later record replaces
            return
        self._table = np.full((n_pe, width), -1, dtype=np.int64)
        np.maximum.at(self._table, (pe, cmd - self._lo), at)  # the last record of each command

    def __bool__(self) -> bool:
        return self._n > 0

    def to_dict(self) -> dict:
        """``{(pe, cmd): index}`` of every command it holds."""
        if self._dict is not None:
            return dict(self._dict)
        pe, c = np.nonzero(self._table >= 0)
        return dict(zip(zip(pe.tolist(), (c + self._lo).tolist()), self._table[pe, c].tolist()))

    def many(self, pe, cmd) -> np.ndarray:
        """The index for each ``(pe[i], cmd[i])``, -1 where there is none."""
        pe, cmd = np.asarray(pe, dtype=np.int64), np.asarray(cmd, dtype=np.int64)
        if self._dict is not None:
            return np.array([self._dict.get(k, -1) for k in zip(pe.tolist(), cmd.tolist())], dtype=np.int64)
        c, t = cmd - self._lo, self._table
        out = np.full(len(pe), -1, dtype=np.int64)
        ok = (pe >= 0) & (pe < t.shape[0]) & (c >= 0) & (c < t.shape[1])
        out[ok] = t[pe[ok], c[ok]]
        return out

    def get(self, key: tuple, default=None):
        if self._dict is not None:
            return self._dict.get(key, default)
        pe, c, t = int(key[0]), int(key[1]) - self._lo, self._table
        j = int(t[pe, c]) if 0 <= pe < t.shape[0] and 0 <= c < t.shape[1] else -1
        return default if j < 0 else j


def as_records(rows) -> Records:
    """:class:`Records` from rows (a list of 10-field records), from an object whose
    ``columns()`` gives the ten columns (kbframe.sim.waits.WaitLog), or Records as given."""
    if isinstance(rows, Records):
        return rows
    if hasattr(rows, "columns"):
        return Records(*rows.columns())
    return Records(*zip(*rows)) if rows else Records(*([],) * 10)
