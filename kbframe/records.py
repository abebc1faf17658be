"""The run's record table: every op_log record, with what it waited for, as ten integers
(:data:`kbframe.record_fields.FIELDS`).

One table per simulation (``OpLog.table``). The op_log writer formats ``op_log.jsonl``
from it (:meth:`RecordTable.text`: the only op_log formatter), and the sanitizer, the
critical path, the trace and fast-forward read its columns (:meth:`RecordTable.cols`);
:meth:`RecordTable.parse` reads an ``op_log.jsonl`` back into a table (``why`` and
``ref`` -1: the file does not hold them).

The op_log is written in one of two forms (:attr:`RecordTable.form`): **record by record**,
one JSON line per record, in completion order; or **periodic**, for a run whose records
repeat (a fast-forwarded run, kbframe.run.fastforward): each repeating section's first
period and a ``repeat`` line saying how it repeats (kbframe.periodic_form). Expanding it
gives exactly the record-by-record file's records (:meth:`RecordTable.parse` expands it;
:mod:`kbframe.report.oplog` streams it).

A foundation module (no simulation layer): the report layer reads the table too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .periodic_form import Periodic, Reading, shift_rows
from .record_fields import EXACT_PS, FIELDS, N, NS_FRAC, ROW, ns_text

_B = ROW.size


def _line(head: str, cmd, tile, t0, t1, td, nbytes, peer) -> str:
    """One op_log line, any times (the general path of :meth:`RecordTable.text`): a record
    naming a ``peer`` (IPCQ) has no ``t_data_ns``."""
    line = f'{head}{cmd}, "tile": {tile}, "t_start_ns": {ns_text(t0)}, "t_end_ns": {ns_text(t1)}, "bytes": {nbytes}'
    if peer >= 0:
        return f'{line}, "peer": {peer}}}\n'
    return f'{line}, "t_data_ns": {ns_text(td)}}}\n' if td >= 0 else line + "}\n"


class Labels:
    """A column of names (units, op kinds, wait kinds) held as codes: record ``i``'s name
    is ``values[codes[i]]``. A long run's columns stay numpy arrays, not one Python
    string per record; :func:`label_codes` gives codes of any column of names."""

    __slots__ = ("codes", "values")

    def __init__(self, codes: np.ndarray, values):
        self.codes, self.values = codes, tuple(values)

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i):
        return self.values[self.codes[i]]

    def __iter__(self):
        v = self.values
        return (v[c] for c in self.codes.tolist())


def label_codes(col) -> tuple[np.ndarray, tuple]:
    """``(codes, values)`` of a column of names: a :class:`Labels`' own, else the sorted
    distinct names and each record's index into them."""
    if isinstance(col, Labels):
        return col.codes, col.values
    values = tuple(sorted(set(col)))
    at = {v: i for i, v in enumerate(values)}
    return np.fromiter((at[v] for v in col), dtype=np.int64, count=len(col)), values


class TooLarge(ValueError):
    """A periodic op_log whose expanded records would not fit in free memory."""


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
        #: how its op_log is written: None record by record, else its :class:`Periodic` form
        self.form: Periodic | None = None
        self._reading: Reading | None = None  # a periodic op_log's reading, while it is parsed

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

    def column(self, field: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Field ``field`` of records ``[lo, hi)`` (an int64 copy)."""
        hi = len(self) if hi is None else hi
        j = FIELDS.index(field)
        return np.frombuffer(self.buf, dtype=np.int64, count=(hi - lo) * N, offset=lo * _B)[j::N].copy()

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
        heads, frac, top = self._head_list(), NS_FRAC, EXACT_PS
        # below EXACT_PS the ns text is ps // 1000 and NS_FRAC[ps % 1000] (ns_text, inlined:
        # formatting is the op_log's main cost); other times and IPCQ records take _line
        return "".join([
            f'{heads[name]}{cmd}, "tile": {tile}, "t_start_ns": {t0 // 1000}{frac[t0 % 1000]}, '
            f'"t_end_ns": {t1 // 1000}{frac[t1 % 1000]}, "bytes": {nbytes}' +
            ("}\n" if td < 0 else f', "t_data_ns": {td // 1000}{frac[td % 1000]}}}\n')
            if peer < 0 and 0 <= t0 < top and 0 <= t1 < top and td < top
            else _line(heads[name], cmd, tile, t0, t1, td, nbytes, peer)
            for name, cmd, tile, t0, t1, td, nbytes, peer, _, _ in ROW.iter_unpack(self._bytes(lo, hi))])

    def _bytes(self, lo: int, hi: int) -> bytes:
        """Records ``[lo, hi)`` as native int64 bytes."""
        return self.buf[lo * _B:hi * _B]

    def write(self, f, chunk: int = 1 << 16) -> int:
        """Write the op_log of every record to the text stream ``f`` in the table's
        :attr:`form` (module doc), ``chunk`` records a write; the lines written."""
        p, n = self.form, len(self)
        if p is None:
            return self._write_records(f, 0, n, chunk)
        f.write(p.header())
        return 1 + self._write_part(f, 0, n, p.sections, 0, chunk)

    def _write_part(self, f, lo: int, hi: int, sections: tuple, depth: int, chunk: int) -> int:
        """Records ``[lo, hi)`` with ``sections`` in them: the records before each, its
        first period (its own sections in it, a level deeper) and its repeat line."""
        lines, at = 0, lo
        for s in sections:
            lines += self._write_records(f, at, s.prefix, chunk)
            lines += self._write_part(f, s.prefix, s.prefix + s.period, s.inner, depth + 1, chunk)
            f.write(s.repeat_line(self.column("name", s.prefix, s.prefix + s.period), self.names, depth,
                                  self.column("td", s.prefix, s.prefix + s.period) >= 0))
            lines += 1
            at = s.end
        return lines + self._write_records(f, at, hi, chunk)

    def _write_records(self, f, lo: int, hi: int, chunk: int) -> int:
        for a in range(lo, hi, chunk):
            f.write(self.text(a, min(hi, a + chunk)))
        return max(0, hi - lo)

    def _repeat(self, form: Periodic) -> None:
        """Append the ``form.times - 1`` repetitions of the last ``form.period`` records
        (:func:`shift_rows`), about a million records at a time."""
        times, period = form.times, form.period
        block = self.array(len(self) - period)
        step = shift_rows(form, block)
        per = max(1, (1 << 20) // period)
        for j in range(1, times, per):
            js = np.arange(j, min(times, j + per), dtype=np.int64)
            self.extend((block[None] + js[:, None, None] * step[None]).reshape(-1, N))

    @classmethod
    def parse(cls, source, name: str | None = None) -> "RecordTable":
        """The table of an ``op_log.jsonl`` in any JSON layout (a path, a text stream or its
        text); ``why`` and ``ref`` are -1, times rounded to whole ps, a missing ``tile`` -1
        and ``bytes`` 0. Raises OSError (a path that cannot be read) or ValueError naming
        the first malformed line, ``NAME:LINE: malformed op_log record (error)`` (``name``:
        the path's, else ``op_log``)."""
        if isinstance(source, Path):
            name = name or str(source)
            try:
                source = source.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{name}: not an op_log (not UTF-8 text: {e.reason})") from None
        elif hasattr(source, "getvalue"):
            source = source.getvalue()
        elif hasattr(source, "read"):
            source = source.read()
        lines = source.split("\n")
        body = [line for line in lines if line.strip()]
        try:  # one JSON parse of the whole text: half the time of one a line
            return cls.of_dicts(json.loads("[" + ",".join(body) + "]") if body else [])
        except TooLarge as e:
            raise ValueError(f"{name or 'op_log'}: {e}") from None
        except (ValueError, KeyError, TypeError, OverflowError, AttributeError, RecursionError):
            pass
        t = cls()  # a malformed line: found line by line, for its number
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                t._add(json.loads(line))
            except TooLarge as e:
                raise ValueError(f"{name or 'op_log'}: {e}") from None
            except (ValueError, KeyError, TypeError, OverflowError, AttributeError) as e:
                raise ValueError(f"{name or 'op_log'}:{lineno}: malformed op_log record ({e!r})") from None
            except RecursionError:  # a value nested deeper than any record
                raise ValueError(f"{name or 'op_log'}:{lineno}: malformed op_log record (nested too deep)") from None
        try:
            t._finish()
        except ValueError as e:
            raise ValueError(f"{name or 'op_log'}: {e}") from None
        return t

    @classmethod
    def of_dicts(cls, records) -> "RecordTable":
        """The table of op_log records given as dicts (as :meth:`parse` reads them; a
        periodic op_log's header and ``repeat`` lines among them, expanded)."""
        t = cls()
        for r in records:
            t._add(r)
        t._finish()
        return t

    def _add(self, r: dict) -> None:
        """Append one op_log record read as a dict (its keys read in this order: an error
        names the first bad one), or take a periodic op_log's header or ``repeat`` line."""
        if "pe" not in r and ("op_log" in r or "repeat" in r):
            return self._directive(r)
        pe, unit, cmd = int(r["pe"]), r["unit"], int(r["cmd"])
        t0, t1 = round(r["t_start_ns"] * 1000), round(r["t_end_ns"] * 1000)
        kind, nbytes, tile = r["op_kind"], int(r.get("bytes", 0)), int(r.get("tile", -1))
        td = round(r["t_data_ns"] * 1000) if "t_data_ns" in r else -1
        self.buf += ROW.pack(self.code(pe, unit, kind), cmd, tile, t0, t1, td, nbytes, int(r.get("peer", -1)), -1, -1)

    def _directive(self, r: dict) -> None:
        """A periodic op_log's header (the first line) or one of its ``repeat`` lines (each
        right after the first period it repeats), checked against each other
        (kbframe.periodic_form), the repetitions appended at once."""
        if "op_log" in r:
            if len(self) or self._reading is not None:
                raise ValueError('the header {"op_log": "periodic", ...} must be the first line')
            self._reading = reading = Reading(r)
            need, have = 2 * reading.head["records"] * _B, _available_memory_bytes()  # the repetitions, the table
            if have is not None and need > have:
                raise TooLarge(f"a periodic op_log of {reading.head['records']:,} records needs {need / 2**30:.1f} "
                               f"GiB to expand, more than the {have / 2**30:.1f} GiB this machine has free; "
                               f"python -m kbframe.report.oplog streams it record by record")
            return
        reading = self._reading
        if reading is None or reading.surplus(r):
            raise ValueError("a repeat line without the periodic header, or a second one"
                             if reading is None or len(reading.forms) == 1 else
                             f"a repeat line after the header's {len(reading.forms)} sections' ones")
        codes = lambda m: self.column("name", len(self) - m) if 0 < m <= len(self) else None  # noqa: E731
        form, _ = reading.repeat(r, len(self), codes, self.names)
        self._repeat(form)

    def _finish(self) -> None:
        """After the last line: a periodic op_log's counts checked against its header."""
        if self._reading is not None:
            self.form = self._reading.finish(len(self))
            self._reading = None


def _available_memory_bytes() -> int | None:
    """Free physical memory now (None where the system does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
