"""The op_log: one JSON line per stage, per dispatch and per command, streamed to disk.

Record fields (all times in ns, from integer ps):
``pe``, ``unit`` (``cpu`` for a dispatch, ``scheduler`` for a command's admit→complete
span, else the unit port: ``dma_read``, ``dma_write``, ``gemm``, ``math``), ``op_kind``,
``cmd`` (PE-local command id), ``tile`` (tile index in the command's loop, -1 if none),
``t_start_ns``, ``t_end_ns``, ``bytes`` (moved or read; a dispatch's logical bytes).
DMA records also carry ``t_data_ns``, when the transfer's data phase began; IPCQ send and
receive records carry ``peer``, the other PE.

Records are written in completion order, which is deterministic: the file is
byte-identical across runs of the same config. What each record waited for is kept
beside it, in memory, by :class:`~kbframe.sim.waits.WaitLog` (``OpLog.waits``), in the
same order; it never enters the file.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..ir.commands import command_kind
from .waits import _FIELDS, _LINK_STAGE, WAIT_CODE, WaitLog

#: ``_FRAC[r]``: how Python prints the fraction of ``r / 1000`` (``".5"``, ``".001"``, ``".0"``).
_FRAC = tuple(repr(r / 1000)[1:] for r in range(1000))
#: Below this many ps (1000 s), ``ps // 1000`` and ``_FRAC[ps % 1000]`` spell exactly
#: ``repr(ps / 1000)``: a float's spacing there is far finer than 1 ps, so its shortest repr
#: is the exact decimal. Formatting floats was the op_log's largest cost.
_EXACT_PS = 10 ** 15


def _ns(ps) -> str:
    """A time in integer ps as the op_log prints it in ns: the text of ``ps / 1000``."""
    if ps.__class__ is int and 0 <= ps < _EXACT_PS:
        return f"{ps // 1000}{_FRAC[ps % 1000]}"
    return repr(ps / 1000)


def _row(head: str, cmd_id, tile, t0, t1, nbytes, t_data) -> str:
    """One op_log line for any times (``t_data < 0``: none)."""
    tail = f', "t_data_ns": {_ns(t_data)}}}\n' if t_data >= 0 else "}\n"
    return f'{head}{cmd_id}, "tile": {tile}, "t_start_ns": {_ns(t0)}, "t_end_ns": {_ns(t1)}, "bytes": {nbytes}{tail}'


def format_rows(rows) -> str:
    """The op_log text of ``rows``: ``(head, cmd, tile, t_start, t_end, bytes, t_data or
    -1)`` each, times in integer ps (also used by kbframe.run.fastforward)."""
    frac = _FRAC
    # a record's times are integer ps (kbframe.timebase); below _EXACT_PS the ns text is
    # ps // 1000 and _FRAC[ps % 1000] (_ns, inlined: formatting is the op_log's main
    # cost); any other time takes _row, the general path
    return "".join([
        f'{head}{cmd_id}, "tile": {tile}, "t_start_ns": {t0 // 1000}{frac[t0 % 1000]}, '
        f'"t_end_ns": {t1 // 1000}{frac[t1 % 1000]}, "bytes": {nbytes}' +
        ("}\n" if t_data < 0 else f', "t_data_ns": {t_data // 1000}{frac[t_data % 1000]}}}\n')
        if t0.__class__ is int and t1.__class__ is int and t_data.__class__ is int
        and 0 <= t0 < _EXACT_PS and 0 <= t1 < _EXACT_PS and t_data < _EXACT_PS
        else _row(head, cmd_id, tile, t0, t1, nbytes, t_data)
        for head, cmd_id, tile, t0, t1, nbytes, t_data in rows])


class RowSink:
    """An op_log kept in memory unformatted (a short simulation that is only compared, not
    written): ``rows`` holds each record as OpLog batches it, ``(head, cmd, tile, t_start,
    t_end, bytes, t_data or -1)``, times in integer ps, or as the text of a record that
    names a ``peer`` (IPCQ)."""

    def __init__(self):
        self.rows: list = []

    def write(self, text: str) -> None:
        self.rows.append(text)

    def text(self) -> str:
        """The op_log text of the rows, as :class:`OpLog` would have written it."""
        out, run = [], []
        for row in self.rows:
            if row.__class__ is str:
                out.append(format_rows(run))
                out.append(row)
                run = []
            else:
                run.append(row)
        out.append(format_rows(run))
        return "".join(out)


class _Totals:
    """Running totals of one ``(pe, unit)``; ``full`` is False for PE_SCHEDULER, whose
    records count commands but carry no bytes or busy time. ``kinds``: a stage unit's
    ``{op_kind: [stages, elements]}`` (what kbframe.run.energy charges by kind)."""

    __slots__ = ("count", "bytes", "busy_ps", "flops", "full", "heads", "codes", "kinds")

    def __init__(self, full: bool):
        self.count = self.bytes = self.busy_ps = self.flops = 0
        self.full = full
        self.kinds: dict = {}
        self.heads: dict = {}  # op_kind -> the record's fixed leading text
        self.codes: dict = {}  # op_kind -> the record name's code in the WaitLog


class OpLog:
    """Streams op_log records to ``path`` (a file path, a text stream or a
    :class:`RowSink`; None: nowhere) and keeps totals.

    Totals (per ``(pe, unit)``): ``busy_ps``, ``count``, ``bytes``; plus ``flops`` and
    ``hbm_bytes`` overall and, per PE, :meth:`pe_totals` (its last record's end, its FLOPs). Records are formatted and written in batches of ``batch``;
    the file is complete once :meth:`close` has returned.
    """

    def __init__(self, path=None, batch: int = 4096):
        # a path (opened and closed here), a text stream the caller keeps (io.StringIO:
        # a record that is not a file), or None (totals and wait records only)
        self._own = path is not None and not hasattr(path, "write")
        self._f = open(path, "w", buffering=1 << 20) if self._own else path
        self._kept = path.rows if isinstance(path, RowSink) else None  # rows not formatted
        self._batch = batch
        self._rows: list = []  # pending records: (head, cmd, tile, t_start, t_end, bytes, t_data or -1)
        self._totals: dict = {}  # (pe, unit name) -> _Totals
        self._by_unit: dict = {}  # stage unit object -> its _Totals (no key tuple per stage)
        self.hbm_bytes = 0
        self.n_records = 0
        #: what each record waited for, record by record (the critical path's input);
        #: its fields are appended here, inline (once per record: the hot path)
        self.waits = WaitLog()
        self._wdata = self.waits.data

    # the per-(pe, unit) totals, as dicts that default to 0 (bench.py reads them)
    @property
    def count(self) -> defaultdict:
        """Records per ``(pe, unit)``."""
        return defaultdict(int, {k: t.count for k, t in self._totals.items()})

    @property
    def bytes(self) -> defaultdict:
        """Bytes per ``(pe, unit)`` (stages: moved or read; ``cpu``: logical bytes)."""
        return defaultdict(int, {k: t.bytes for k, t in self._totals.items() if t.full})

    @property
    def busy_ps(self) -> defaultdict:
        """Busy ps per ``(pe, unit)`` (DMA: data phases only)."""
        return defaultdict(int, {k: t.busy_ps for k, t in self._totals.items() if t.full})

    @property
    def flops(self) -> int:
        """FLOPs of every stage recorded."""
        return sum(t.flops for t in self._totals.values())

    def unit_totals(self, pe: int, unit: str) -> tuple | None:
        """``(records, bytes, flops)`` of one ``(pe, unit)``, None if it made none."""
        t = self._totals.get((pe, unit))
        return None if t is None else (t.count, t.bytes, t.flops)

    def kinds(self, pe: int, unit: str) -> dict:
        """``{op_kind: (stages, elements)}`` of one stage unit's records (empty if none)."""
        t = self._totals.get((pe, unit))
        return {k: (n, e) for k, (n, e) in t.kinds.items()} if t is not None else {}

    def head_names(self) -> dict:
        """``{head: (pe, unit, op_kind)}``: the record each head text (a :class:`RowSink`
        row's first field) stands for."""
        return {h: (pe, unit, kind) for (pe, unit), t in self._totals.items() for kind, h in t.heads.items()}

    def pe_totals(self) -> dict:
        """Per PE that has records: ``{pe: {"end_ps": its last record's end, "flops": ...}}``
        (the ends from the wait records, after the run: nothing on the hot path)."""
        out: dict = {}
        for (pe, _), t in sorted(self._totals.items()):
            out.setdefault(pe, {"end_ps": 0, "flops": 0})["flops"] += t.flops
        rows = np.frombuffer(self.waits.data, dtype=np.int64).reshape(-1, _FIELDS)
        if len(rows):
            pe_of = np.array([pe for pe, _, _ in self.waits.names()], dtype=np.int64)[rows[:, 0]]
            ends = np.zeros(int(pe_of.max()) + 1, dtype=np.int64)
            np.maximum.at(ends, pe_of, rows[:, 3])
            for pe in out:
                out[pe]["end_ps"] = int(ends[pe])
        return out

    def _entry(self, pe: int, unit: str, full: bool = True) -> _Totals:
        t = self._totals.get((pe, unit))
        if t is None:
            t = self._totals[(pe, unit)] = _Totals(full)
        return t

    @staticmethod
    def _head(pe, unit, t: _Totals, op_kind) -> str:
        head = t.heads[op_kind] = f'{{"pe": {pe}, "unit": "{unit}", "op_kind": "{op_kind}", "cmd": '
        return head

    def _record(self, pe, unit, t: _Totals, op_kind, cmd_id, tile, t0, t1, nbytes, t_data) -> None:
        head = t.heads.get(op_kind) or self._head(pe, unit, t, op_kind)
        rows = self._rows
        rows.append((head, cmd_id, tile, t0, t1, nbytes, t_data))
        if len(rows) >= self._batch:
            self._flush()

    def _flush(self) -> None:
        if self._kept is not None:
            self._kept.extend(self._rows)
        else:
            self._f.write(format_rows(self._rows))
        self._rows.clear()

    def stage(self, pe: int, st) -> None:
        """Record a finished stage."""
        unit = st.unit
        t = self._by_unit.get(unit)
        if t is None:
            t = self._by_unit[unit] = self._entry(pe, unit.name)
        nbytes, t0, t1, t_data = st.nbytes, st.t_start, st.t_end, st.t_data
        t.count += 1
        t.bytes += nbytes
        if t_data >= 0:
            t.busy_ps += t1 - t_data
            self.hbm_bytes += nbytes
        else:
            t.busy_ps += t1 - t0
        t.flops += st.flops
        k = t.kinds.get(st.op_kind)
        if k is None:
            k = t.kinds[st.op_kind] = [0, 0]
        k[0] += 1
        k[1] += st.n_elements
        st.seq = idx = self.n_records
        self.n_records = idx + 1
        code = t.codes.get(st.op_kind)
        if code is None:
            code = t.codes[st.op_kind] = self.waits.code(pe, unit.name, st.op_kind)
        ready = st.ready_by
        if ready < -1:  # a receive readied by its message: the send's record (kbframe.hw.ipcq)
            self._wdata.extend((code, st.cmd.id, t0, t1, t_data, _LINK_STAGE, -2 - ready))
        else:
            self._wdata.extend((code, st.cmd.id, t0, t1, t_data, -1, ready))
        if st.peer >= 0 and self._f is not None:  # an IPCQ stage also names the other PE
            if self._rows:
                self._flush()
            self._f.write(_row(t.heads.get(st.op_kind) or self._head(pe, unit.name, t, st.op_kind), st.cmd.id,
                               st.tile, t0, t1, nbytes, -1)[:-2] + f', "peer": {st.peer}}}\n')
        elif self._f is not None:  # _record, inlined: this is once per stage
            head = t.heads.get(st.op_kind) or self._head(pe, unit.name, t, st.op_kind)
            rows = self._rows
            rows.append((head, st.cmd.id, st.tile, t0, t1, nbytes, t_data))
            if len(rows) >= self._batch:
                self._flush()

    def dispatch(self, pe: int, cmd, t0: int, t1: int, why: str = "cpu", ref: int = -1) -> None:
        """Record PE_CPU's dispatch of ``cmd`` over ``[t0, t1)``; it waited for ``why``
        (``ref``), as :mod:`kbframe.sim.waits` lists."""
        t = self._entry(pe, "cpu")
        nbytes = cmd.logical_bytes
        kind = command_kind(cmd)
        t.count += 1
        t.busy_ps += t1 - t0
        t.bytes += nbytes
        code = t.codes.get(kind)  # the WaitLog fields, inline (once per record)
        if code is None:
            code = t.codes[kind] = self.waits.code(pe, "cpu", kind)
        self._wdata.extend((code, cmd.id, t0, t1, -1, WAIT_CODE[why], ref))
        self.n_records += 1
        if self._f is not None:
            self._record(pe, "cpu", t, kind, cmd.id, -1, t0, t1, nbytes, -1)

    def command(self, pe: int, cmd, t_admit: int, t_done: int, why: str = "dispatch", ref: int = -1) -> None:
        """Record a command's span in PE_SCHEDULER, from admission to completion; its
        admission waited for ``why`` (``ref``), as :mod:`kbframe.sim.waits` lists."""
        t = self._entry(pe, "scheduler", full=False)
        kind = command_kind(cmd)
        t.count += 1
        code = t.codes.get(kind)
        if code is None:
            code = t.codes[kind] = self.waits.code(pe, "scheduler", kind)
        self._wdata.extend((code, cmd.id, t_admit, t_done, -1, WAIT_CODE[why], ref))
        self.n_records += 1
        if self._f is not None:
            self._record(pe, "scheduler", t, kind, cmd.id, -1, t_admit, t_done, 0, -1)

    def close(self) -> None:
        """Write the pending records and close the file; a file opened here is closed even
        when the writing fails (a full disk: its room is freed once the run removes it)."""
        if self._f is None:
            return
        try:
            if self._rows:
                self._flush()
        finally:
            f, self._f = self._f, None
            if self._own:
                f.close()
