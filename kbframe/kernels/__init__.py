"""Kernels: plain Python functions ``kernel(tl, **shape)`` that emit commands through tl.

``bench.kernel`` names one: a public function defined in a ``kbframe.kernels.*`` module, or
one registered with :func:`kernel` (a kernel kept elsewhere, named with
``hardware.allow_external_targets=true``). Anything else is refused by what it is, not by
its name (kbframe.sim.targets.resolve_kernel, DESIGN.md decision 1).
"""
from __future__ import annotations

#: registered kernels by dotted name (module.qualname)
KERNELS: dict = {}


def kernel(fn):
    """Register ``fn`` as a kernel (``bench.kernel`` may name it wherever it is defined);
    returns ``fn`` unchanged but for the mark kbframe.sim.targets.KERNEL_MARK."""
    fn.__kbframe_kernel__ = True
    KERNELS[f"{fn.__module__}.{fn.__qualname__}"] = fn
    return fn
