"""The run's record table: every op_log record, with what it waited for, as ten integers.

One table per simulation (``OpLog.table``). The op_log writer formats ``op_log.jsonl``
from it (:meth:`RecordTable.text`: the only op_log formatter), and the sanitizer, the
critical path, the trace and fast-forward read its columns (:meth:`RecordTable.cols`);
:meth:`RecordTable.parse` reads an ``op_log.jsonl`` back into a table (``why`` and
``ref`` -1: the file does not hold them).

Fields of a record (:data:`FIELDS`), all integers, times in ps, -1: none:

``name``   code of the record's ``(pe, unit, op_kind)`` in :attr:`RecordTable.names`
``cmd``    PE-local command id
``tile``   tile index in the command's loop (-1: none)
``t0``     start; ``t1`` end; ``td`` start of a DMA transfer's data phase
``bytes``  bytes moved or read (a dispatch: the command's logical bytes; a command: 0)
``peer``   the other PE of an IPCQ send or receive
``why``    what it waited for: a code of :data:`kbframe.sim.waits.KINDS` (dispatches and
           commands), -1 or -2 for a stage (kbframe.sim.waits)
``ref``    what ``why`` names (a record index or a command id)

A foundation module (no simulation layer): the report layer reads the table too.
"""
from __future__ import annotations

import json
from pathlib import Path
from struct import Struct

import numpy as np

FIELDS = ("name", "cmd", "tile", "t0", "t1", "td", "bytes", "peer", "why", "ref")
N = len(FIELDS)
#: one record: ten native int64 (what numpy reads back as int64)
ROW = Struct(f"{N}q")
_B = ROW.size

#: ``_FRAC[r]``: how Python prints the fraction of ``r / 1000`` (``".5"``, ``".001"``, ``".0"``).
_FRAC = tuple(repr(r / 1000)[1:] for r in range(1000))
#: Below this many ps (1000 s), ``ps // 1000`` and ``_FRAC[ps % 1000]`` spell exactly
#: ``repr(ps / 1000)``: a float's spacing there is far finer than 1 ps, so its shortest repr
#: is the exact decimal. Formatting floats was the op_log's largest cost.
_EXACT_PS = 10 ** 15


def ns_text(ps) -> str:
    """A time in integer ps as the op_log prints it in ns: the text of ``ps / 1000``."""
    if ps.__class__ is int and 0 <= ps < _EXACT_PS:
        return f"{ps // 1000}{_FRAC[ps % 1000]}"
    return repr(ps / 1000)


def _line(head: str, cmd, tile, t0, t1, td, nbytes, peer) -> str:
    """One op_log line, any times (the general path of :meth:`RecordTable.text`): a record
    naming a ``peer`` (IPCQ) has no ``t_data_ns``."""
    line = f'{head}{cmd}, "tile": {tile}, "t_start_ns": {ns_text(t0)}, "t_end_ns": {ns_text(t1)}, "bytes": {nbytes}'
    if peer >= 0:
        return f'{line}, "peer": {peer}}}\n'
    return f'{line}, "t_data_ns": {ns_text(td)}}}\n' if td >= 0 else line + "}\n"


class RecordTable:
    """Records of ten integers each (:data:`FIELDS`) in :attr:`buf`, a ``bytearray`` of
    native int64 the simulation grows inline (``buf += ROW.pack(...)``: once per record,
    the hot path; packing ten ints costs less than extending an ``array('q')`` by them);
    :attr:`names` the ``(pe, unit, op_kind)`` of each name code. Readers get copies
    (:meth:`array`, :meth:`cols`): a numpy view of :attr:`buf` would block its growth."""

    def __init__(self):
        self.buf = bytearray()
        self.names: list = []
        self._codes: dict = {}
        self._heads: list = []  # per name code: its op_log line's fixed leading text

    def code(self, pe: int, unit: str, op_kind: str) -> int:
        """The code of a record name ``(pe, unit, op_kind)``; callers cache it."""
        key = (pe, unit, op_kind)
        c = self._codes.get(key)
        if c is None:
            c = self._codes[key] = len(self.names)
            self.names.append(key)
        return c

    def __len__(self) -> int:
        return len(self.buf) // _B

    def append(self, *record) -> None:
        """Add one record (:data:`FIELDS`, in order); the simulation grows :attr:`buf`
        itself."""
        self.buf += ROW.pack(*record)

    @classmethod
    def of_rows(cls, names: list, rows: np.ndarray) -> "RecordTable":
        """A table of records ``rows`` (an ``(n, 10)`` integer array) whose name codes index
        ``names``."""
        t = cls()
        for key in names:
            t.code(*key)
        t.extend(rows)
        return t

    def extend(self, rows: np.ndarray) -> None:
        """Add records from an ``(n, 10)`` integer array."""
        self.buf += np.ascontiguousarray(rows, dtype=np.int64).reshape(-1, N).tobytes()

    def array(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Records ``[lo, hi)`` as an ``(n, 10)`` int64 array (a copy)."""
        hi = len(self) if hi is None else hi
        return np.frombuffer(self.buf[lo * _B:hi * _B], dtype=np.int64).reshape(-1, N)  # a slice: a copy

    def cols(self, lo: int = 0, hi: int | None = None) -> dict:
        """Records ``[lo, hi)`` as ``{field: int64 array}`` (a copy: the table may grow)."""
        a = self.array(lo, hi)
        return {f: a[:, j] for j, f in enumerate(FIELDS)}

    def name_col(self, j: int) -> list:
        """Field ``j`` of :attr:`names` (0 pe, 1 unit, 2 op_kind), by code."""
        return [n[j] for n in self.names]

    def _head_list(self) -> list:
        heads = self._heads
        for pe, unit, kind in self.names[len(heads):]:
            heads.append(f'{{"pe": {pe}, "unit": "{unit}", "op_kind": "{kind}", "cmd": ')
        return heads

    def text(self, lo: int = 0, hi: int | None = None) -> str:
        """The op_log text of records ``[lo, hi)``: the op_log's only formatter."""
        hi = len(self) if hi is None else hi
        heads, frac, top = self._head_list(), _FRAC, _EXACT_PS
        # below _EXACT_PS the ns text is ps // 1000 and _FRAC[ps % 1000] (ns_text, inlined:
        # formatting is the op_log's main cost); other times and IPCQ records take _line
        return "".join([
            f'{heads[name]}{cmd}, "tile": {tile}, "t_start_ns": {t0 // 1000}{frac[t0 % 1000]}, '
            f'"t_end_ns": {t1 // 1000}{frac[t1 % 1000]}, "bytes": {nbytes}' +
            ("}\n" if td < 0 else f', "t_data_ns": {td // 1000}{frac[td % 1000]}}}\n')
            if peer < 0 and 0 <= t0 < top and 0 <= t1 < top and td < top
            else _line(heads[name], cmd, tile, t0, t1, td, nbytes, peer)
            for name, cmd, tile, t0, t1, td, nbytes, peer, _, _ in ROW.iter_unpack(self.buf[lo * _B:hi * _B])])

    @classmethod
    def parse(cls, source, name: str | None = None) -> "RecordTable":
        """The table of an ``op_log.jsonl`` in any JSON layout (a path, a text stream or its
        text); ``why`` and ``ref`` are -1, times rounded to whole ps, a missing ``tile`` -1
        and ``bytes`` 0. Raises OSError (a path that cannot be read) or ValueError naming
        the first malformed line, ``NAME:LINE: malformed op_log record (error)`` (``name``:
        the path's, else ``op_log``)."""
        if isinstance(source, Path):
            name = name or str(source)
            source = source.read_text()
        elif hasattr(source, "getvalue"):
            source = source.getvalue()
        elif hasattr(source, "read"):
            source = source.read()
        lines = source.split("\n")
        body = [line for line in lines if line.strip()]
        try:  # one JSON parse of the whole text: half the time of one a line
            return cls.of_dicts(json.loads("[" + ",".join(body) + "]") if body else [])
        except (ValueError, KeyError, TypeError, OverflowError):
            pass
        t = cls()  # a malformed line: found line by line, for its number
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                t._add(json.loads(line))
            except (ValueError, KeyError, TypeError, OverflowError) as e:
                raise ValueError(f"{name or 'op_log'}:{lineno}: malformed op_log record ({e!r})") from None
        return t

    @classmethod
    def of_dicts(cls, records) -> "RecordTable":
        """The table of op_log records given as dicts (as :meth:`parse` reads them)."""
        t = cls()
        for r in records:
            t._add(r)
        return t

    def _add(self, r: dict) -> None:
        """Append one op_log record read as a dict (its keys read in this order: an error
        names the first bad one)."""
        pe, unit, cmd = int(r["pe"]), r["unit"], int(r["cmd"])
        t0, t1 = round(r["t_start_ns"] * 1000), round(r["t_end_ns"] * 1000)
        kind, nbytes, tile = r["op_kind"], int(r.get("bytes", 0)), int(r.get("tile", -1))
        td = round(r["t_data_ns"] * 1000) if "t_data_ns" in r else -1
        self.buf += ROW.pack(self.code(pe, unit, kind), cmd, tile, t0, t1, td, nbytes, int(r.get("peer", -1)), -1, -1)
