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
from .errors import NumericsError


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
        with np.errstate(over="ignore"):
            y = np.asarray(x, dtype=self.dtype)
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

    def free(self, handle) -> None:
        self.mem.pop(handle.buf, None)

    def read(self, handle) -> np.ndarray:
        return handle.view(self.mem)

    # Effects are compiled when a command is planned: every handle's numpy view is taken
    # then (a buffer never moves: writes go into it in place), and the op's function and
    # scalars are looked up then, so a stage's effect at completion is the numpy work
    # itself. Only a DMA staging buffer (a ``str`` source) is made at run time, by its DMA.

    def _view(self, src):
        """A handle source's numpy view; a staging key is returned as it is."""
        if src.__class__ is str:
            return src
        h, region = src
        v = h.view(self.mem)
        return v if region is None else v[region]

    def copy(self, src, dst):
        mem = self.mem
        s, d = self._view(src), self._view(dst)
        if d.__class__ is str:  # into a staging buffer, at the storage dtype (what DMA moves)
            dtype = self.dtype
            if s.__class__ is str:
                def effect():
                    mem[d] = np.array(mem[s], dtype=dtype)
            else:
                def effect():
                    mem[d] = np.array(s, dtype=dtype)
        elif s.__class__ is str:
            def effect():
                d[...] = mem[s]
        else:
            def effect():
                d[...] = s
        return effect

    def _operand_fn(self, src):
        """``() -> ndarray``: a GEMM operand as the matrix unit takes it (at ``dtype`` when
        narrow, rounded with the overflow check), widened to ``acc_dtype``; a staging
        buffer is consumed."""
        acc_dtype, mem = self.acc_dtype, self.mem
        x = self._view(src)
        if self.narrow:
            what = f"GEMM operand '{src if isinstance(src, str) else src[0].name}'"
            dtype, fit = self.dtype, self._fit
            if x.__class__ is str:
                key = x

                def get():
                    y = mem.pop(key)
                    return (y if y.dtype == dtype else fit(y, what)).astype(acc_dtype)
            else:
                def get():
                    return (x if x.dtype == dtype else fit(x, what)).astype(acc_dtype)
            return get
        if x.__class__ is str:
            key = x

            def get():
                y = mem.pop(key)
                return y if y.dtype == acc_dtype else y.astype(acc_dtype)
            return get
        if x.dtype == acc_dtype:
            return lambda: x
        return lambda: x.astype(acc_dtype)

    def gemm(self, a, b, acc_key, first, acc_init=None):
        acc = self.acc
        get_a, get_b = self._operand_fn(a), self._operand_fn(b)
        if first:
            def effect():
                acc[acc_key] = get_a() @ get_b()
        else:
            def effect():
                acc[acc_key] += get_a() @ get_b()
        return effect

    def _inputs(self, srcs):
        """MATH / epilogue inputs: ``(views, None)`` when every input is a handle already at
        ``acc_dtype`` (used as they are), else ``(None, resolve)`` with ``resolve()`` giving
        them at completion time, widened to ``acc_dtype`` (a staged HBM operand, a TCM
        tile DMA'd at ``dtype``)."""
        acc_dtype, mem = self.acc_dtype, self.mem
        xs = [self._view(src) for src in srcs]
        if all(x.__class__ is not str and x.dtype == acc_dtype for x in xs):
            return xs, None

        def resolve():
            return [(mem[x] if x.__class__ is str else x).astype(acc_dtype, copy=False) for x in xs]
        return None, resolve

    def epilogue(self, kind, acc_key, others, extra):
        acc, acc_dtype = self.acc, self.acc_dtype
        op = micro_ops.MICRO_OPS[kind]
        fn, kw = op.fn, {k: extra[k] for k in op.extras}
        ins, resolve = self._inputs(others)
        if resolve is not None:
            def effect():
                acc[acc_key] = np.asarray(fn(acc[acc_key], *resolve(), **kw), dtype=acc_dtype)
        else:
            def effect():
                acc[acc_key] = np.asarray(fn(acc[acc_key], *ins, **kw), dtype=acc_dtype)
        return effect

    def writeback(self, acc_key, dst):
        acc = self.acc
        d = self._view(dst)

        def effect():
            d[...] = acc.pop(acc_key)
        return effect

    def math(self, kind, inputs, out, extra):
        o = out.view(self.mem)
        if kind == "fill":
            value = extra["value"]

            def effect():
                o[...] = value
            return effect
        op = micro_ops.MICRO_OPS[kind]
        fn, kw = op.fn, {k: extra[k] for k in op.extras}
        ins, resolve = self._inputs(inputs)
        if resolve is not None:
            def effect():
                o[...] = fn(*resolve(), **kw)
        elif op.writes_out:
            def effect():
                fn(*ins, out=o, **kw)
        else:
            def effect():
                o[...] = fn(*ins, **kw)
        return effect
