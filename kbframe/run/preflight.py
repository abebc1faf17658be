"""Pre-flight checks: refuse an impossible run before the simulation starts, with the
numbers (issue 4, DESIGN.md decision 6), so it fails in well under a second instead of
after minutes of simulation or with a MemoryError.

* :func:`check_host_memory` — the inputs (float64) and, in data mode, the numbers must fit
  in this machine's memory;
* :func:`check_inputs_fit` — in a narrow data mode (``bench.data_dtype=float16``) every
  input must be representable (|x| ≤ 65504): refused with the array's name, never turned
  into inf and then NaN;
* :func:`check_resources` — the HBM tensors must fit ``hardware.hbm_bytes`` and the
  kernel's TCM high water must fit the PE's TCM. The TCM need is exact: the kernel is run
  once through the tl layer against an unbounded TCM without simulating anything (a dry
  run: commands are built and dropped), so every allocation, scratch_scope and recipe
  scratch counts exactly as in the real run. Emit-time errors (over-cap composites, two
  GEMMs, ...) surface here too, before any file is written.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..sim.engine import Engine
from ..errors import ConfigError, KbframeError, NumericsError, OutputError, TcmOverflowError
from ..ir.handles import itemsize
from ..sim.numerics import Numerics
from ..sim.oplog import OpLog
from ..ir.protocol import Dispatch, requests
from ..tl.context import TL


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def physical_memory_bytes() -> int | None:
    """This machine's physical memory, bytes (None if the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_host_memory(wl, data: bool, data_dtype: str) -> None:
    """Raise ConfigError if the workload's arrays cannot fit in host memory."""
    need = wl.host_bytes()
    have = physical_memory_bytes()
    if have is not None and need > have:
        shape = " ".join(f"{k}={v}" for k, v in wl.shape().items() if not k.startswith("n_"))
        raise ConfigError(f"bench needs about {_gib(need)} of host memory for its inputs and numbers "
                          f"({shape}, bench.data={str(data).lower()}); this machine has "
                          f"{_gib(have)}; reduce the bench's shape keys")


def check_inputs_fit(data_dtype: str, arrays: dict) -> None:
    """Raise NumericsError naming the first input with a finite value beyond ``data_dtype``
    (refused rather than stored as inf)."""
    dt = np.dtype(data_dtype)
    top = float(np.finfo(dt).max)
    for name, a in arrays.items():
        big = max(float(a.max()), -float(a.min())) if np.size(a) else 0.0  # max |x|, no |a| copy
        if big > top:
            raise NumericsError(f"bench.data_dtype={data_dtype}: input '{name}' has |x| up to {big:.6g}, beyond "
                                f"{data_dtype}'s largest value {top:.6g} (refused rather than stored as inf); "
                                f"use {'bench.data_dtype=float32 or ' if dt.itemsize < 4 else ''}smaller inputs")


def dry_run(hardware, wl, kernel, recipes: dict, dtype: str, inputs: dict | None) -> dict:
    """Run the workload's programs through the tl layer only, on unbounded TCMs; nothing is
    simulated.

    Returns:
        ``{"tcm_bytes": highest high water of any PE, "pe": that PE, "hbm_bytes": HBM
        footprint, "commands": n}``, or ``{}`` if a kernel needs simulated values to go on
        (then only the real run's TcmOverflowError guards the TCM).
    Raises:
        KbframeError: whatever the tl layer raises at emit (ValidationError ...).
    """
    engine = Engine(hardware, Numerics(), OpLog(None))
    for name, shape in wl.tensors().items():
        engine.add_hbm_tensor(name, shape, dtype, None)
    capacity = engine.pes[0].tcm.capacity_bytes
    for pe in engine.pes:
        pe.tcm.capacity_bytes = 1 << 62
    programs = wl.programs(kernel, lambda i: TL(engine.pes[i], engine.hbm, recipes, dtype), inputs)
    n = 0
    try:
        for program in programs.values():
            for req in requests(program):
                n += type(req) is Dispatch
    except KbframeError:
        raise
    except Exception:  # a kernel that reads simulated values: no exact dry run
        return {}
    pe = max(programs, key=lambda i: engine.pes[i].tcm.high_water)
    tcm = engine.pes[pe].tcm
    return {"tcm_bytes": tcm.high_water, "pe": pe, "tcm_capacity_bytes": capacity,
            "tcm_allocations": tcm.allocations, "hbm_bytes": engine._hbm_top, "commands": n}


def check_resources(cfg, wl, kernel, recipes: dict, inputs: dict | None) -> dict:
    """HBM and TCM needs of the bench's workload against ``cfg.hardware``, before any
    simulation.

    Returns:
        The :func:`dry_run` figures.
    Raises:
        ConfigError: the HBM tensors exceed ``hardware.hbm_bytes``.
        TcmOverflowError: the kernel's TCM high water exceeds the PE's TCM (names both).
        KbframeError: an emit-time error of the kernel.
    """
    b, hw = cfg.bench, cfg.hardware
    tensors = wl.tensors()
    hbm_cap = hw.get("hbm_bytes")
    isz = itemsize(b.dtype)
    hbm_need = sum(-(-math.prod(s) * isz // 4096) * 4096 for s in tensors.values())
    shape = " ".join(f"{k}={v}" for k, v in wl.shape().items() if not k.startswith("n_"))
    if hbm_cap is not None and hbm_need > hbm_cap:
        raise ConfigError(f"HBM too small: {', '.join(tensors)} need {hbm_need} B ({_gib(hbm_need)}) at {shape} "
                          f"({b.dtype}), hardware.hbm_bytes is {hbm_cap} B ({_gib(hbm_cap)})")
    fig = dry_run(hw, wl, kernel, recipes, b.dtype, inputs)
    if fig and fig["tcm_bytes"] > fig["tcm_capacity_bytes"]:
        cap = fig["tcm_capacity_bytes"]
        name, addr, size = next((n, a, s) for n, a, s, *_ in fig["tcm_allocations"] if a + s > cap)
        raise TcmOverflowError(
            f"TCM overflow on PE{fig['pe']}: request '{name}' needs {size} B, {cap - addr} B free of {cap} B "
            f"capacity (hardware.tcm_bytes); {b.name} needs {fig['tcm_bytes']} B of TCM in all at {shape} "
            f"({b.dtype}), found by a dry run before the simulation")
    return fig


#: files a run writes into its directory (each replaced only when the run passed)
OUTPUT_FILES = ("metrics.json", "op_log.jsonl", "tensors.npz", "trace.json")


def check_outputs(out_dir) -> None:
    """Raise OutputError if a result file cannot be written in ``out_dir`` (a directory in
    its place, or a directory that refuses files), before anything is simulated."""
    for name in OUTPUT_FILES:
        p = out_dir / name
        if p.exists() and not p.is_file():
            raise OutputError(f"cannot write '{p}': something that is not a file is in its place")
    probe = out_dir / f".kbframe-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise OutputError(f"cannot write in the run directory '{out_dir}': {e.strerror or e}") from None
