"""Numerics: the data-mode memory model and the numeric effect of each stage.

Timing and numerics are two paths behind one interface (DESIGN.md, the Triton
interpreter idea): the planner asks a :class:`Numerics` for each stage's effect. The
timing-only :class:`Numerics` returns None for every effect; :class:`NumpyNumerics`
holds HBM and TCM buffers as numpy arrays and returns closures that read and write them
when the stage completes in simulated time (DESIGN.md decision 3).

A *source* is ``(handle, region)`` (region: a tuple of slices on the handle's logical
view, or None) or a string key of a DMA staging buffer.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..ir import micro_ops
from ..errors import NumericsError


class Numerics:
    """Timing-only numerics: no memory, every effect is None."""

    enabled = False

    def allocate(self, handle, value=None) -> None:
        """Create storage for ``handle`` (zeros, or ``value``)."""

    def alias(self, handle, base) -> None:
        """``handle`` names ``base``'s storage with another shape (``tl.reshape``)."""

    def copy(self, src, dst) -> None:
        """Effect: ``dst ← src`` (a DMA transfer or write-back)."""

    def gemm(self, a, b, acc_key: str, first: bool):
        """Effect: ``acc[acc_key] (+)= a @ b``; ``first`` starts a fresh accumulator."""

    def send(self, src, link: tuple):
        """Effect: put a copy of ``src`` on PE↔PE link ``(src_pe, dst_pe)`` (FIFO)."""

    def recv(self, link: tuple, dst):
        """Effect: ``dst ←`` the oldest message on ``link``."""

    def accumulate(self, part_key: str, acc_key: str, first: bool):
        """Effect: ``acc[acc_key] (+)= acc[part_key]`` (a K tile's partial product, after its
        K_TILE epilogue); ``first`` starts a fresh accumulator."""

    def epilogue(self, kind: str, acc_key: str, others: list, extra: dict):
        """Effect: ``acc[acc_key] = op(acc, *others)`` for an epilogue micro-op."""

    def writeback(self, acc_key: str, dst):
        """Effect: ``dst ← acc[acc_key]`` and drop the accumulator."""

    def math(self, kind: str, inputs: list, out, extra: dict):
        """Effect: ``out ← op(*inputs)`` for a MATH micro-op."""

    def read(self, handle) -> np.ndarray:
        raise RuntimeError("numbers are only kept in data mode (bench.data=true)")


class NumpyNumerics(Numerics):
    """Data mode: numpy buffers keyed by ``handle.buf``.

    Precision follows where a number lives, as on mixed-precision hardware
    (``bench.data_dtype``, docs/errors.md "fp16 data mode"):

    * HBM tensors and DMA staging buffers (what DMA moves) are stored at ``dtype``;
    * TCM tensors (``tl.empty/zeros/full``, recipe scratch, GEMM and MATH outputs: the
      scores, P and the softmax state m, l, O) hold ``acc_dtype``, what the GEMM
      accumulator and the MATH unit produce; a tile DMA'd into TCM holds ``dtype`` values;
    * a GEMM rounds its operands to ``dtype`` (the matrix unit's input format) and
      accumulates at ``acc_dtype``; MATH ops compute at ``acc_dtype``.

    With ``dtype=float32`` everything is float32 and nothing is rounded. Only the numbers
    follow this; timing (bytes moved, TCM footprint) always uses ``bench.dtype``.

    Args:
        dtype: storage dtype of HBM tensors (``float32`` default; ``float16``).
        acc_dtype: GEMM accumulators, MATH arithmetic and TCM tensors; default float32,
            or ``dtype`` when that is wider.
    Raises:
        NumericsError: an HBM tensor or a GEMM operand does not fit ``dtype`` (|x| beyond
            its largest finite value; names the tensor), never a silent inf/NaN.
    """

    enabled = True

    def __init__(self, dtype: str = "float32", acc_dtype: str | None = None):
        self.dtype = np.dtype(dtype)
        self.acc_dtype = np.dtype(acc_dtype) if acc_dtype is not None else np.promote_types(self.dtype, np.float32)
        self.narrow = self.dtype.itemsize < self.acc_dtype.itemsize  # GEMM operands get rounded
        self.mem: dict[str, np.ndarray] = {}
        self.acc: dict[str, np.ndarray] = {}

    def _fit(self, x, what: str) -> np.ndarray:
        """``x`` rounded to the storage dtype; NumericsError if a finite value overflows."""
        y = np.asarray(x, dtype=self.dtype)  # an overflow is inf, refused below (run_bench's errstate)
        if np.isinf(y).any() and not np.isinf(np.asarray(x)).any():
            big = float(np.max(np.abs(np.asarray(x, dtype=np.float64))))
            raise NumericsError(f"{what} has |x| up to {big:.6g}, beyond {self.dtype.name}'s largest value "
                                f"{float(np.finfo(self.dtype).max):.6g} (bench.data_dtype={self.dtype.name}); "
                                f"use bench.data_dtype=float32 or smaller values")
        return y

    def allocate(self, handle, value=None) -> None:
        dt = self.dtype if handle.space == "hbm" else self.acc_dtype
        if value is None:
            self.mem[handle.buf] = np.zeros(handle.buf_shape, dt)
        else:
            arr = self._fit(value, f"HBM tensor '{handle.name}'") if dt == self.dtype else np.asarray(value, dt)
            self.mem[handle.buf] = arr.reshape(handle.buf_shape)

    def alias(self, handle, base) -> None:
        arr = self.mem[base.buf]
        view = arr.reshape(handle.buf_shape)
        if not np.shares_memory(view, arr):  # never a copy: writes must go through both
            raise RuntimeError(f"tl.reshape: {base.name} is not contiguous")
        self.mem[handle.buf] = view

    def read(self, handle) -> np.ndarray:
        return handle.view(self.mem)

    def _get(self, src) -> np.ndarray:
        if isinstance(src, str):
            return self.mem[src]
        h, region = src
        v = h.view(self.mem)
        return v if region is None else v[region]

    def _put(self, dst, value) -> None:
        if isinstance(dst, str):
            self.mem[dst] = np.array(value, dtype=self.dtype)
            return
        h, region = dst
        v = h.view(self.mem)
        if region is None:
            v[...] = value
        else:
            v[region] = value

    def copy(self, src, dst):
        def effect():
            self._put(dst, self._get(src))
        return effect

    def _operand(self, src) -> np.ndarray:
        """A GEMM operand at the storage dtype (the matrix unit's input format)."""
        x = self._get(src)
        if x.dtype != self.dtype:
            x = self._fit(x, f"GEMM operand '{src if isinstance(src, str) else src[0].name}'")
        return x

    def gemm(self, a, b, acc_key, first):
        acc_dtype = self.acc_dtype
        get = self._operand if self.narrow else self._get

        def effect():
            prod = get(a).astype(acc_dtype, copy=False) @ get(b).astype(acc_dtype, copy=False)
            for src in (a, b):  # a staging buffer is consumed by its GEMM stage
                if isinstance(src, str):
                    self.mem.pop(src, None)
            if first:
                self.acc[acc_key] = prod
            else:
                self.acc[acc_key] += prod
        return effect

    def epilogue(self, kind, acc_key, others, extra):
        acc_dtype = self.acc_dtype

        def effect():
            ins = [self.acc[acc_key]] + [self._get(o).astype(acc_dtype, copy=False) for o in others]
            self.acc[acc_key] = np.asarray(micro_ops.apply(kind, ins, extra), dtype=acc_dtype)
        return effect

    def send(self, src, link):
        def effect():
            q = self.mem.get(("ipcq", link))
            if q is None:
                q = self.mem[("ipcq", link)] = deque()
            q.append(self._get(src).copy())
        return effect

    def recv(self, link, dst):
        def effect():
            self._put(dst, self.mem[("ipcq", link)].popleft())
        return effect

    def accumulate(self, part_key, acc_key, first):
        def effect():
            part = self.acc.pop(part_key)
            if first:
                self.acc[acc_key] = part
            else:
                self.acc[acc_key] += part
        return effect

    def writeback(self, acc_key, dst):
        def effect():
            self._put(dst, self.acc.pop(acc_key))
        return effect

    def math(self, kind, inputs, out, extra):
        acc_dtype = self.acc_dtype
        if kind == "fill":
            def effect():
                self._put((out, None), extra["value"])
            return effect

        def effect():
            ins = [self._get(s).astype(acc_dtype, copy=False) for s in inputs]
            self._put((out, None), micro_ops.apply(kind, ins, extra))
        return effect
