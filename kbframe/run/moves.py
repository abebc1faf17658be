"""How a record of a fast-forwarded run moves a period later, when a loop left out whole
periods of its iterations (kbframe.run.skipped puts them back; kbframe.run.jump_checks
compares a period with the one before it this way).

A period later, a record has moved thus: its times by the period's time; its command id
(and a command-id ``ref``) by the commands its PE issues in a period, when the command is
the loop's or later (at or after the loop's first command on that PE); a record-index
``ref`` by the period's records, when the record it names is the loop's or later. A weight
GEMM's tile loop issues no command in a period: a record of the GEMM's command moves its
tile by the period's tiles instead (:class:`TileMover`).
"""
from __future__ import annotations

import numpy as np

from ..record_fields import FIELDS, N
from ..sim.waits import WAIT_CODE

CMD, TILE, T0, T1, TD, WHY, REF = (FIELDS.index(f) for f in ("cmd", "tile", "t0", "t1", "td", "why", "ref"))
#: wait kinds whose ``ref`` is a command id (the others name a record, kbframe.sim.waits)
CMD_REFS = np.array([WAIT_CODE[k] for k in ("room", "wait", "dispatch", "hazard", "fifo", "admit")])
#: ... the waits of a command's record (its admission: its start)
ADMITTED = np.array([WAIT_CODE[k] for k in ("dispatch", "hazard", "fifo")])
#: ... and those whose ``ref`` is a record index (a stage's raw kinds -1 and -2 too)
RECORD_REFS = np.array([WAIT_CODE[k] for k in ("cpu", "dep", "unit", "link")] + [-1, -2])
#: the fields a period does not move, and its times (``td`` -1: none, not moved)
SAME = [FIELDS.index(f) for f in ("name", "tile", "bytes", "peer", "why")]
TIMES = [T0, T1, TD]


class Mover:
    """Moves records of a table by whole periods of one jump (the module doc's rules)."""

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
        return self.rows[at, CMD] >= self.first[self.pe_of[self.rows[at, 0]]]  # two fields, not whole rows

    def step(self, rows: np.ndarray) -> np.ndarray:
        """How much each field of ``rows`` (of the table :meth:`of` took) moves a period."""
        d = np.zeros_like(rows)
        d[:, T0] = d[:, T1] = self.dt
        d[:, TD] = np.where(rows[:, TD] >= 0, self.dt, 0)
        pe = self.pe_of[rows[:, 0]]
        first, dcmd = self.first[pe], self.dcmd[pe]
        d[:, CMD] = np.where(rows[:, CMD] >= first, dcmd, 0)
        why, ref = rows[:, WHY], rows[:, REF]
        by_cmd = np.isin(why, CMD_REFS) & (ref >= first)
        by_rec = np.isin(why, RECORD_REFS) & (ref >= 0)
        by_rec[by_rec] = self.looped(ref[by_rec])
        d[:, REF] = np.where(by_cmd, dcmd, 0) + np.where(by_rec, self.P, 0)
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


def gemm_tiles(rows: np.ndarray, pe_of: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` is a tile's record of its PE's weight GEMM (``first[pe]``:
    the GEMM's command; -1 or another id where a PE has none)."""
    return (rows[:, CMD] == first[pe_of[rows[:, 0]]]) & (rows[:, TILE] >= 0)


class TileMover(Mover):
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
        return gemm_tiles(self.rows[at], self.pe_of, self.first)

    def step(self, rows: np.ndarray) -> np.ndarray:
        d = super().step(rows)
        d[:, TILE] = np.where(gemm_tiles(rows, self.pe_of, self.first), self.tiles, 0)
        return d
