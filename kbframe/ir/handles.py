"""Tensor handles and completions: what the tl layer, commands and the scheduler share.

A :class:`TensorHandle` names a tensor in HBM or TCM: its shape, timing dtype, byte
address, the storage buffer that holds its numbers in data mode, an optional row window
(a tile of an HBM tensor) and a transpose flag (a K tile read as a real transpose,
DESIGN.md decision 4). ``pending`` is the :class:`Completion` of the command that
produces it (ADR-0062 lazy pattern): a consumer of a pending handle waits for it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from math import prod

import numpy as np

from .cached import cached_attr

_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1}


def itemsize(dtype: str) -> int:
    """Bytes per element of a timing dtype name (``float16`` → 2)."""
    return _ITEMSIZE[dtype]


class Completion:
    """Completion of one command: fired once by PE_SCHEDULER when its last stage ends.

    ``t_done_ps`` is the simulated time it fired. Waiters are plain callbacks, so waiting
    costs no SimPy event unless PE_CPU really blocks.
    """

    __slots__ = ("cmd_id", "label", "done", "t_done_ps", "_waiters")

    def __init__(self, cmd_id: int, label: str):
        self.cmd_id = cmd_id
        self.label = label
        self.done = False
        self.t_done_ps: int | None = None
        self._waiters: list = []

    def on_done(self, callback) -> None:
        """Call ``callback(self)`` when the command completes (at once if it has)."""
        if self.done:
            callback(self)
        else:
            self._waiters.append(callback)

    def fire(self, t_ps: int) -> None:
        """Mark complete at ``t_ps`` and run the waiters (PE_SCHEDULER only)."""
        if self.done:
            raise RuntimeError(f"command {self.cmd_id} ({self.label}) completed twice")
        self.done = True
        self.t_done_ps = t_ps
        waiters, self._waiters = self._waiters, []
        for cb in waiters:
            cb(self)

    def __repr__(self) -> str:
        return f"Completion(cmd {self.cmd_id} {self.label}, done={self.done})"


_handle_ids = itertools.count(1)


@dataclass(eq=False)
class TensorHandle:
    """A tensor in HBM or TCM. Identity semantics: two handles are equal only if they are
    the same object (hazards key on the storage they name, not on equality).

    Attributes:
        name: readable label (``"K[64:128]"``, ``"m"``).
        shape: logical shape after ``rows`` and ``trans``, e.g. ``(d, TILE)`` for Kᵀ.
        dtype: timing dtype (sets bytes moved); numbers use the data dtype.
        space: ``"hbm"`` (streamed by DMA) or ``"tcm"`` (used in place), DESIGN.md dec. 2.
        addr: byte address of the whole buffer in its space.
        buf: storage key of the buffer in the data-mode memory model.
        rows: ``(r0, r1)`` row window into the buffer, or None for all rows.
        trans: True if this is the transpose of the (windowed) buffer.
        buf_shape: shape of the whole buffer.
        pending: completion of the command producing this value, or None.
    """

    name: str
    shape: tuple
    dtype: str
    space: str
    addr: int
    buf: str
    buf_shape: tuple
    rows: tuple | None = None
    trans: bool = False
    pending: Completion | None = None
    id: int = field(default_factory=lambda: next(_handle_ids))

    # Sizes and the byte range are computed once: a handle's shape, dtype and window never
    # change after creation (views are new handles), and the scheduler reads them per stage.
    @cached_attr
    def nbytes(self) -> int:
        """Bytes of this view in the timing dtype."""
        return prod(self.shape) * itemsize(self.dtype)

    @cached_attr
    def n_elements(self) -> int:
        return prod(self.shape)

    @cached_attr
    def byte_range(self) -> tuple[int, int]:
        """``[lo, hi)`` byte range this view touches in its space (row windows only)."""
        if self.rows is None:
            return self.addr, self.addr + prod(self.buf_shape) * itemsize(self.dtype)
        row_bytes = prod(self.buf_shape[1:]) * itemsize(self.dtype) if len(self.buf_shape) > 1 else itemsize(self.dtype)
        return self.addr + self.rows[0] * row_bytes, self.addr + self.rows[1] * row_bytes

    # Views (T, row windows) call the constructor positionally, in field order: kernels make
    # them every KV tile, and copying the fields through a dict costs twice as much.
    @property
    def T(self) -> "TensorHandle":
        """The transposed view of a 2-D handle (a real transpose, not a reshape)."""
        if len(self.shape) != 2:
            raise ValueError(f"{self.name}: transpose needs a 2-D handle, got shape {self.shape}")
        return TensorHandle(f"{self.name}.T", self.shape[::-1], self.dtype, self.space, self.addr, self.buf,
                            self.buf_shape, self.rows, not self.trans, self.pending, next(_handle_ids))

    def __getitem__(self, key: slice) -> "TensorHandle":
        """Row window ``h[r0:r1]`` of an untransposed handle (a tile of an HBM tensor)."""
        if self.trans or not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"{self.name}: only contiguous row slices of untransposed handles")
        base0 = self.rows[0] if self.rows else 0
        n = self.shape[0]
        r0, r1, _ = key.indices(n)
        if r1 <= r0:
            raise ValueError(f"{self.name}[{key.start}:{key.stop}] is empty")
        return TensorHandle(f"{self.name.split('[')[0]}[{base0 + r0}:{base0 + r1}]", (r1 - r0, *self.shape[1:]),
                            self.dtype, self.space, self.addr, self.buf, self.buf_shape, (base0 + r0, base0 + r1),
                            self.trans, self.pending, next(_handle_ids))

    def view(self, mem: dict) -> np.ndarray:
        """This handle's numbers as a numpy view into ``mem[buf]`` (writes go through)."""
        arr = mem[self.buf]
        if self.rows is not None:
            arr = arr[self.rows[0]:self.rows[1]]
        return arr.T if self.trans else arr

    def __repr__(self) -> str:
        return f"<{self.space}:{self.name} {self.shape}>"

