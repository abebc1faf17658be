"""TCM: a PE's on-chip tightly-coupled memory and its allocator (ADR-0063).

Allocation is a bump allocator with scope marks: allocations made outside any
``scratch_scope`` live in the kernel arena until the kernel ends; those made inside a
scope are freed together when it exits. Every allocation is recorded (address, size,
alloc and free times) so the sanitizer can check that live allocations never overlap.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import TcmOverflowError
from ..params import param
from .unit import PeUnit


@dataclass
class TcmParams:
    """The TCM's parameters."""

    capacity_bytes: int = param(doc="size (hardware.tcm_bytes)", unit="bytes", lo=1)
    read_gbps: float = param(doc="read port bandwidth (the GEMM's operand feed uses it)", unit="GB/s", lo=0,
                             lo_open=True)
    write_gbps: float = param(doc="write port bandwidth", unit="GB/s", lo=0, lo_open=True)
    alignment_bytes: int = param(64, doc="allocation alignment", unit="bytes", lo=1)


class Tcm(PeUnit):
    """TCM of one PE; its parameters: :class:`TcmParams` (kbframe.hw.unit.PeUnit)."""

    Params = TcmParams

    roles = ("tcm",)
    label = "TCM"
    energy_keys = ("read_pj_per_byte", "write_pj_per_byte")

    def energy_actions(self, work) -> list:
        """The bytes the PE's stages read from and wrote to it (each unit's
        :meth:`~kbframe.hw.unit.PeUnit.tcm_traffic`: DMA landing, GEMM operands, MATH
        operands and results, IPCQ messages)."""
        return [("read_bytes", "read_pj_per_byte", work.tcm_read_bytes),
                ("write_bytes", "write_pj_per_byte", work.tcm_write_bytes)]

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.pe_index = 0
        self.top = 0
        self.high_water = 0
        self._marks: list[int] = []
        self.allocations: list[list] = []  # [name, addr, nbytes, t_alloc_ps, t_free_ps|None]
        self._live: list[int] = []  # indices into allocations, stack order
        self.now = lambda: 0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.top

    def alloc(self, nbytes: int, name: str) -> int:
        """Allocate ``nbytes`` and return the address.

        Raises:
            TcmOverflowError: it does not fit; names the request, free bytes, capacity.
        """
        a = self.alignment_bytes
        size = -(-nbytes // a) * a
        if self.top + size > self.capacity_bytes:
            raise TcmOverflowError(
                f"TCM overflow on PE{self.pe_index}: request '{name}' needs {size} B, "
                f"{self.free_bytes} B free of {self.capacity_bytes} B capacity "
                f"(hardware.tcm_bytes)")
        addr = self.top
        self.top += size
        self.high_water = max(self.high_water, self.top)
        self._live.append(len(self.allocations))
        self.allocations.append([name, addr, size, self.now(), None])
        return addr

    def push_scope(self) -> None:
        """Enter a ``scratch_scope``: later allocations are freed by :meth:`pop_scope`."""
        self._marks.append(self.top)

    def pop_scope(self) -> None:
        """Leave the innermost ``scratch_scope``, freeing everything allocated inside it."""
        mark = self._marks.pop()
        t = self.now()
        while self._live and self.allocations[self._live[-1]][1] >= mark:
            self.allocations[self._live.pop()][4] = t
        self.top = mark
