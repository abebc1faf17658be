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
            self._f.write(f'{self._head(pe, unit, op_kind)}{cmd_id}, "tile": {tile}, "t_start_ns": {_ns(t0)}, '
                          f'"t_end_ns": {_ns(t1)}, "bytes": {nbytes}{extra}}}\n')

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
            tail = f', "t_data_ns": {_ns(t_data)}}}\n'
        else:
            self.busy_ps[key] += t1 - t0
            tail = "}\n"
        if self._f is not None:
            head = self._heads.get((pe, unit, st.op_kind)) or self._head(pe, unit, st.op_kind)
            self._f.write(f'{head}{st.cmd.id}, "tile": {st.tile}, '
                          f'"t_start_ns": {_ns(t0)}, "t_end_ns": {_ns(t1)}, "bytes": {nbytes}{tail}')

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
