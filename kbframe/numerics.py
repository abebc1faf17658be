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

import numpy as np

from . import micro_ops


class Numerics:
    """Timing-only numerics: no memory, every effect is None."""

    enabled = False

    def allocate(self, handle, value=None) -> None:
        """Create storage for ``handle`` (zeros, or ``value``)."""

    def free(self, handle) -> None:
        """Drop the storage of ``handle``."""

    def copy(self, src, dst) -> None:
        """Effect: ``dst ← src`` (a DMA transfer or write-back)."""

    def gemm(self, a, b, acc_key: str, first: bool, acc_init=None):
        """Effect: ``acc[acc_key] (+)= a @ b``; ``first`` starts a fresh accumulator."""

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

    Args:
        dtype: storage dtype of tensors (``float32`` default; ``float16`` stores fp16).
        acc_dtype: dtype of GEMM accumulators and MATH arithmetic (``float32``).
    """

    enabled = True

    def __init__(self, dtype: str = "float32", acc_dtype: str = "float32"):
        self.dtype = np.dtype(dtype)
        self.acc_dtype = np.dtype(acc_dtype)
        self.mem: dict[str, np.ndarray] = {}
        self.acc: dict[str, np.ndarray] = {}

    def allocate(self, handle, value=None) -> None:
        if value is None:
            self.mem[handle.buf] = np.zeros(handle.buf_shape, self.dtype)
        else:
            self.mem[handle.buf] = np.asarray(value, dtype=self.dtype).reshape(handle.buf_shape)

    def free(self, handle) -> None:
        self.mem.pop(handle.buf, None)

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

    def gemm(self, a, b, acc_key, first, acc_init=None):
        acc_dtype = self.acc_dtype

        def effect():
            prod = self._get(a).astype(acc_dtype, copy=False) @ self._get(b).astype(acc_dtype, copy=False)
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
