"""The op_log: one JSON line per stage, per dispatch and per command, streamed to disk.

Record fields (all times in ns, from integer ps):
``pe``, ``unit`` (``cpu`` for a dispatch, ``scheduler`` for a command's admit→complete
span, else the unit port: ``dma_read``, ``dma_write``, ``gemm``, ``math``), ``op_kind``,
``cmd`` (PE-local command id), ``tile`` (tile index in the command's loop, -1 if none),
``t_start_ns``, ``t_end_ns``, ``bytes`` (moved or read; a dispatch's logical bytes).
DMA records also carry ``t_data_ns``, when the transfer's data phase began; IPCQ send and
receive records carry ``peer``, the other PE.

Records are written in completion order, which is deterministic: the file is
byte-identical across runs of the same config. Every record is kept in memory in the
run's :class:`~kbframe.records.RecordTable` (``OpLog.table``), with what it waited for
(its ``why`` and ``ref``, which never enter the file); the file is written from it.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..ir.commands import command_kind
from ..record_fields import FIELDS, ROW
from ..records import RecordTable
from ..repeated import RepeatedTable
from .waits import _LINK_STAGE, _RAW_STAGE, WAIT_CODE, WaitLog

_T1 = FIELDS.index("t1")

#: records before the first write to a file (then this many more each time)
BATCH = 4096


class _Totals:
    """Running totals of one ``(pe, unit)``; ``full`` is False for PE_SCHEDULER, whose
    records count commands but carry no bytes or busy time. ``kinds``: a stage unit's
    ``{op_kind: [stages, elements]}`` (what kbframe.run.energy charges by kind)."""

    __slots__ = ("count", "bytes", "busy_ps", "flops", "full", "codes", "kinds")

    def __init__(self, full: bool):
        self.count = self.bytes = self.busy_ps = self.flops = 0
        self.full = full
        self.kinds: dict = {}
        self.codes: dict = {}  # op_kind -> the record name's code in the table


class OpLog:
    """Keeps the run's records in :attr:`table` (a :class:`~kbframe.records.RecordTable`)
    and totals, and writes the op_log to ``path`` (a file path or a text stream; None:
    nowhere) from the table, ``batch`` records at a time; the file is complete once
    :meth:`close` has returned.

    Totals (per ``(pe, unit)``): ``busy_ps``, ``count``, ``bytes``; plus ``flops`` and
    ``hbm_bytes`` overall and, per PE, :meth:`pe_totals` (its last record's end, its FLOPs).
    """

    def __init__(self, path=None, batch: int = BATCH):
        # a path (opened and closed here), a text stream the caller keeps (io.StringIO:
        # a record that is not a file), or None (the table and totals only)
        self._own = path is not None and not hasattr(path, "write")
        self._f = open(path, "w", buffering=1 << 20) if self._own else path
        self._batch = batch
        self._written = 0  # records written to the file so far
        self._flush_at = batch if self._f is not None else -1  # -1: never (unsigned compare below)
        self._totals: dict = {}  # (pe, unit name) -> _Totals
        self._by_unit: dict = {}  # stage unit object -> its _Totals (no key tuple per stage)
        self.hbm_bytes = 0
        self.n_records = 0
        #: every record, with what it waited for; appended to inline (once per record: the
        #: hot path)
        self.table = RecordTable()
        self._buf = self.table.buf
        self._pack = ROW.pack
        #: what each record waited for, worked out from the table (the critical path's input)
        self.waits = WaitLog(self.table)

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

    def pe_totals(self) -> dict:
        """Per PE that has records: ``{pe: {"end_ps": its last record's end, "flops": ...}}``
        (the ends from the table, after the run: nothing on the hot path)."""
        out: dict = {}
        for (pe, _), t in sorted(self._totals.items()):
            out.setdefault(pe, {"end_ps": 0, "flops": 0})["flops"] += t.flops
        table = self.table
        pe_code = np.array(table.name_col(0), dtype=np.int64)
        ends = np.zeros(int(pe_code.max(initial=0)) + 1, dtype=np.int64)
        # a period put back moves the ends of its records and of those after them (kbframe.repeated)
        parts = (((table.base[:table.x - table.P], 0), (table.base[table.x - table.P:], table.X * table.dt))
                 if isinstance(table, RepeatedTable) else ((table.array(), 0),))
        for rows, later in parts:
            if len(rows):
                np.maximum.at(ends, pe_code[rows[:, 0]], rows[:, _T1] + later)
        for pe in out:
            out[pe]["end_ps"] = int(ends[pe])
        return out

    def _entry(self, pe: int, unit: str, full: bool = True) -> _Totals:
        t = self._totals.get((pe, unit))
        if t is None:
            t = self._totals[(pe, unit)] = _Totals(full)
        return t

    def totals(self) -> dict:
        """Every running total by name: ``n_records``, ``hbm_bytes``, ``("oplog", (pe,
        unit), count|bytes|busy_ps|flops)`` and ``("kind", (pe, unit), op_kind,
        count|elements)``; :meth:`restore_totals` sets them back."""
        out = {"n_records": self.n_records, "hbm_bytes": self.hbm_bytes}
        for key, t in self._totals.items():
            for f in ("count", "bytes", "busy_ps", "flops"):
                out[("oplog", key, f)] = getattr(t, f)
            for kind, (n, elements) in t.kinds.items():
                out[("kind", key, kind, "count")], out[("kind", key, kind, "elements")] = n, elements
        return out

    def restore_totals(self, tot: dict) -> None:
        """Set the totals of every ``(pe, unit)`` and kind this log has to those named in
        ``tot`` (as :meth:`totals` names them; other names are passed over)."""
        self.n_records, self.hbm_bytes = tot["n_records"], tot["hbm_bytes"]
        for key, t in self._totals.items():
            for f in ("count", "bytes", "busy_ps", "flops"):
                setattr(t, f, tot[("oplog", key, f)])
            for kind in t.kinds:
                t.kinds[kind] = [tot[("kind", key, kind, "count")], tot[("kind", key, kind, "elements")]]

    def replace_records(self, table: RecordTable) -> None:
        """Make the records of ``table`` (its names those of :attr:`table`, perhaps more) the
        log's records: a run whose records were made, not simulated (kbframe.run.fastforward).
        Its totals are set with :meth:`restore_totals`."""
        if table.names[:len(self.table.names)] != self.table.names:
            raise ValueError("replace_records: the table names its records otherwise")
        for key in table.names[len(self.table.names):]:
            self.table.code(*key)
        if isinstance(table, RepeatedTable):  # made a slice at a time (kbframe.repeated)
            self.table = self.waits.table = table
            self._buf = None
        else:
            self.table.buf = self._buf = table.buf  # taken, not copied: a model step's records are gigabytes
        self.n_records = len(self.table)

    def write(self, path) -> int:
        """Write the op_log of every record to ``path`` (records that were not streamed), in
        the table's form (kbframe.records); the lines written."""
        with open(path, "w", buffering=1 << 20) as f:
            return self.table.write(f, 16 * self._batch)

    def _flush(self) -> None:
        """Write the records not yet written."""
        n = self.n_records
        self._f.write(self.table.text(self._written, n))
        self._written = n
        self._flush_at = n + self._batch

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
            code = t.codes[st.op_kind] = self.table.code(pe, unit.name, st.op_kind)
        ready = st.ready_by
        buf = self._buf  # grown in place
        if ready < -1:  # a receive readied by its message: the send's record (kbframe.hw.ipcq)
            buf += self._pack(code, st.cmd.id, st.tile, t0, t1, t_data, nbytes, st.peer, _LINK_STAGE, -2 - ready)
        else:
            buf += self._pack(code, st.cmd.id, st.tile, t0, t1, t_data, nbytes, st.peer, _RAW_STAGE, ready)
        if idx == self._flush_at:
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
        code = t.codes.get(kind)
        if code is None:
            code = t.codes[kind] = self.table.code(pe, "cpu", kind)
        buf = self._buf  # grown in place
        buf += self._pack(code, cmd.id, -1, t0, t1, -1, nbytes, -1, WAIT_CODE[why], ref)
        idx = self.n_records
        self.n_records = idx + 1
        if idx == self._flush_at:
            self._flush()

    def command(self, pe: int, cmd, t_admit: int, t_done: int, why: str = "dispatch", ref: int = -1) -> None:
        """Record a command's span in PE_SCHEDULER, from admission to completion; its
        admission waited for ``why`` (``ref``), as :mod:`kbframe.sim.waits` lists."""
        t = self._entry(pe, "scheduler", full=False)
        kind = command_kind(cmd)
        t.count += 1
        code = t.codes.get(kind)
        if code is None:
            code = t.codes[kind] = self.table.code(pe, "scheduler", kind)
        buf = self._buf  # grown in place
        buf += self._pack(code, cmd.id, -1, t_admit, t_done, -1, 0, -1, WAIT_CODE[why], ref)
        idx = self.n_records
        self.n_records = idx + 1
        if idx == self._flush_at:
            self._flush()

    def close(self) -> None:
        """Write the records not yet written and close the file; a file opened here is
        closed even when the writing fails (a full disk: its room is freed once the run
        removes it)."""
        if self._f is None:
            return
        try:
            if self._written < self.n_records:
                self._flush()
        finally:
            f, self._f = self._f, None
            if self._own:
                f.close()
