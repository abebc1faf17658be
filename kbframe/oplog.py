"""The op_log: one JSON line per stage, per dispatch and per command, streamed to disk.

Record fields (all times in ns, from integer ps):
``pe``, ``unit`` (``cpu`` for a dispatch, ``scheduler`` for a command's admit→complete
span, else the unit port: ``dma_read``, ``dma_write``, ``gemm``, ``math``), ``op_kind``,
``cmd`` (PE-local command id), ``tile`` (tile index in the command's loop, -1 if none),
``t_start_ns``, ``t_end_ns``, ``bytes`` (moved or read; a dispatch's logical bytes).
DMA records also carry ``t_data_ns``, when the transfer's data phase began.

Records are written in completion order, which is deterministic: the file is
byte-identical across runs of the same config.
"""
from __future__ import annotations

from collections import defaultdict

from .commands import command_kind


class OpLog:
    """Streams op_log records to ``path`` (or nowhere if None) and keeps totals.

    Totals (per ``(pe, unit)``): ``busy_ps``, ``count``, ``bytes``; plus ``flops`` and
    ``hbm_bytes`` overall.
    """

    def __init__(self, path=None):
        self._f = open(path, "w", buffering=1 << 20) if path is not None else None
        self.busy_ps = defaultdict(int)
        self.count = defaultdict(int)
        self.bytes = defaultdict(int)
        self.flops = 0
        self.hbm_bytes = 0
        self.n_records = 0
        self._heads: dict = {}  # (pe, unit, op_kind) -> the record's fixed leading text

    def _head(self, pe, unit, op_kind) -> str:
        key = (pe, unit, op_kind)
        head = self._heads.get(key)
        if head is None:
            head = self._heads[key] = f'{{"pe": {pe}, "unit": "{unit}", "op_kind": "{op_kind}", "cmd": '
        return head

    def _write(self, pe, unit, op_kind, cmd_id, tile, t0, t1, nbytes, extra=""):
        self.n_records += 1
        if self._f is not None:
            self._f.write(f'{self._head(pe, unit, op_kind)}{cmd_id}, "tile": {tile}, "t_start_ns": {t0 / 1000}, '
                          f'"t_end_ns": {t1 / 1000}, "bytes": {nbytes}{extra}}}\n')

    def stage(self, pe: int, st) -> None:
        """Record a finished stage."""
        unit = st.unit.name
        key = (pe, unit)
        nbytes = st.nbytes
        self.count[key] += 1
        self.bytes[key] += nbytes
        self.flops += st.flops
        self.n_records += 1
        t0, t1, t_data = st.t_start, st.t_end, st.t_data
        if t_data >= 0:
            self.busy_ps[key] += t1 - t_data
            self.hbm_bytes += nbytes
            extra = f', "t_data_ns": {t_data / 1000}}}\n'
        else:
            self.busy_ps[key] += t1 - t0
            extra = "}\n"
        if self._f is not None:
            self._f.write(f'{self._head(pe, unit, st.op_kind)}{st.cmd.id}, "tile": {st.tile}, '
                          f'"t_start_ns": {t0 / 1000}, "t_end_ns": {t1 / 1000}, "bytes": {nbytes}{extra}')

    def dispatch(self, pe: int, cmd, t0: int, t1: int) -> None:
        """Record PE_CPU's dispatch of ``cmd`` over ``[t0, t1)``."""
        key = (pe, "cpu")
        self.count[key] += 1
        self.busy_ps[key] += t1 - t0
        nbytes = cmd.logical_bytes
        self.bytes[key] += nbytes
        self._write(pe, "cpu", command_kind(cmd), cmd.id, -1, t0, t1, nbytes)

    def command(self, pe: int, cmd, t_admit: int, t_done: int) -> None:
        """Record a command's span in PE_SCHEDULER, from admission to completion."""
        key = (pe, "scheduler")
        self.count[key] += 1
        self._write(pe, "scheduler", command_kind(cmd), cmd.id, -1, t_admit, t_done, 0)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
