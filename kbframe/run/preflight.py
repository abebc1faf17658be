"""Pre-flight checks: refuse an impossible run before the simulation starts, with the
numbers (DESIGN.md decision 6), so it fails in well under a second instead of
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

import copy
import math
import os
import zipfile

import numpy as np

from ..sim.engine import Engine
from ..errors import ConfigError, HbmCapacityError, InputsError, RecordBudgetError, KbframeError, NumericsError, TcmOverflowError, TimeBaseError, raise_interrupt_behind
from ..ir.handles import itemsize
from ..sim.numerics import Numerics
from ..sim.oplog import OpLog
from ..sim.steady import Axis
from ..hw.tiling import plan_key
from ..ir.protocol import Dispatch, requests
from ..tl.context import TL
from ..timebase import LIMIT_TEXT, MAX_PS, cycles_to_ps


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
        raise ConfigError(f"bench needs about {_gib(need)} of host memory for its inputs and numbers "
                          f"({wl.shape_text()}, bench.data={str(data).lower()}); this machine has "
                          f"{_gib(have)}; reduce the bench's shape keys")


#: host memory the sanitizer (run.check) keeps per op_log record, bytes: measured 1.8 to
#: 1.9 KB (peak RSS with and without run.check, opt2 and opt3 at a 131072-token context, timing only:
#: +66 MB for 36882 records, +148 MB for 79893), rounded up
SANITIZER_BYTES_PER_RECORD = 2048


def check_sanitizer_memory(cfg, fig: dict) -> None:
    """Raise ConfigError if ``run.check`` would keep more than this machine's memory: the
    sanitizer keeps every stage and op_log record until the run ends (the dry run's
    ``records`` counts them exactly)."""
    if not fig or not fig["records"]:  # run.check=false (no records counted) or no exact dry run
        return
    need = fig["records"] * SANITIZER_BYTES_PER_RECORD
    have = physical_memory_bytes()
    if have is not None and need > have:
        raise ConfigError(f"run.check=true keeps about {_gib(need)} of host memory for the sanitizer "
                          f"({fig['records']} op_log records × {SANITIZER_BYTES_PER_RECORD} B); this machine has "
                          f"{_gib(have)}; use run.check=false or a shorter run")


#: host memory a fast-forwarded run keeps per op_log record of the full run, bytes: its
#: records are made in memory and analysed a column at a time (kbframe.run.fastforward), so
#: it grows with the run. Measured 0.40 KB (peak RSS of a timing-only decode_opt2 run at 10^6
#: and 4·10^6 cached tokens: +337 MB for 843,750 records; Llama-3-70B's step on cube_mesh at
#: 8192 tokens, 40 and 80 layers, run.check=false: +1.69 GB for 5.0 million), rounded up
FF_BYTES_PER_RECORD = 450


def record_budget(cfg) -> int:
    """``run.max_records``: the op_log records a run may hold (0: no limit)."""
    return int(cfg.run.get("max_records", 0)) if "run" in cfg else 0


def check_forwarded_records(cfg, wl, records: int, held: int | None = None) -> None:
    """Raise ConfigError if a fast-forwarded run would hold more op_log records than
    ``run.max_records``, or more than this machine's memory holds: it is not simulated
    record by record, but its records are made (:data:`FF_BYTES_PER_RECORD` each), all of
    them or, a model step's, ``held``: its simulated layers' (kbframe.repeated). Checked
    once the simulation that left a stretch out, or the short copies, gave the full run's
    count, before the records left out are made."""
    held = records if held is None else held
    need = held * FF_BYTES_PER_RECORD
    head = (f"{cfg.bench.name} at {wl.shape_text()} would make {records:,} op_log records even fast-forwarded"
            + (f" and hold {held:,} of them" if held < records else "")
            + f" (about {_gib(need)} of host memory, {FF_BYTES_PER_RECORD} B each)")
    budget = record_budget(cfg)
    if budget and held > budget:
        raise RecordBudgetError(f"{head}, over run.max_records={budget:,}; raise run.max_records or shrink the run")
    have = physical_memory_bytes()
    if have is not None and need > have:
        raise ConfigError(f"{head}; this machine has {_gib(have)}; shrink the run")


#: a run along a periodic axis of this many steps or more is checked against its record
#: budget by an estimate (:func:`check_records_estimate`); a shorter one by its exact dry run
ESTIMATE_FROM_STEPS = 8


def estimated(cfg, wl) -> bool:
    """Whether :func:`check_records_estimate` checks this run (a timing-only run along a
    periodic axis of :data:`ESTIMATE_FROM_STEPS` steps or more); else its exact pre-flight
    (:func:`check_resources`) must come before it is simulated in any way."""
    axis = wl.periodic_axis()
    return axis is not None and int(cfg.bench[axis[0]]) // axis[1] >= ESTIMATE_FROM_STEPS


def held_steps(cfg, wl, q: int) -> tuple[int, int]:
    """``(least, most)``: how many of a run's ``q`` steps along its periodic axis it holds
    the records of. A fast-forwarded model step holds its simulated layers, the period of
    layers being put back as often as it repeats without being made (kbframe.repeated):
    at least its warm-up (``Workload.ff_min_steps``, and two of its shortest candidate
    periods to see it steady), one such period checked after the jump and the end
    (``ff_after``); at most, as a rule of thumb, three periods of the longest candidate
    (``ff_periods``) after the warm-up and a jump's rounding to every candidate
    (kbframe.sim.steady.Axis). A step too short to leave any out, and any other run
    (``run.fast_forward=verify`` too: it simulates the full run as well): ``(q, q)``."""
    ff = str(cfg.run.get("fast_forward", "off")) if "run" in cfg else "off"
    if ff != "on" or not wl.nested_axes() or not wl.ff_min_steps or not wl.ff_periods:
        return q, q
    axis = Axis(wl.periodic_axis()[0], tuple(wl.ff_periods), wl.ff_min_steps, wl.ff_after)
    if axis.too_short(q):
        return q, q
    most = axis.min_steps + 3 * max(axis.periods) + axis.after + axis.multiple  # a rule of thumb (docstring)
    return min(q, axis.fewest_simulated), min(q, most)


def check_simulated_records(cfg, wl, records: int, why: str) -> None:
    """Raise RecordBudgetError if a run that was to fast-forward but was simulated in full
    (``why``: why nothing was left out) holds more op_log records than ``run.max_records``:
    the check of a model step whose fewest layers were within the budget
    (:func:`check_records_estimate`) when none of its loops jumped."""
    budget = record_budget(cfg)
    if budget and records > budget:
        raise RecordBudgetError(f"{cfg.bench.name} at {wl.shape_text()} was simulated record by record ({why}): "
                                f"{records:,} op_log records, over run.max_records={budget:,}; raise "
                                f"run.max_records or shrink the run")


def check_records_estimate(cfg, wl, kernel, recipes: dict, units: dict | None = None) -> int | None:
    """Refuse, in seconds, a timing-only run along a periodic axis whose op_log records are
    far beyond ``run.max_records`` or this machine's memory, before it is fast-forwarded or
    dry-run, which both grow with the run (a model step: minutes). The records of one and
    then two steps of the axis (dry runs) give the run's count, which is affine in the
    steps: ``R(1) + (q − 1)·(R(2) − R(1))``; what counts is that of the steps whose records
    the run holds (:func:`held_steps`: a model step's simulated layers, which it knows only
    once its layers are seen steady). Skipped when ``most·R(1)``, which bounds it, is within
    the budget. The budget refuses a run whose least count is over it; one that holds more
    than its least is stopped by the exact checks that follow (:func:`check_resources`; a
    model step's simulation as soon as it holds more before its layers jump,
    kbframe.sim.steady, and :func:`check_forwarded_records` once they did). Host memory is
    held to the most.

    Returns:
        The records the run would hold at most: ``most·R(1)``, or the estimate when that
        bound is over the budget (None: not estimated, or no budget).
    Raises:
        ConfigError: the estimate exceeds ``run.max_records``, or the host memory the run
        would keep for it (the sanitizer's or fast-forward's bytes per record).
    """
    axis = wl.periodic_axis()
    budget = record_budget(cfg)
    if axis is None or not budget:
        return None
    key, step = axis
    q = int(cfg.bench[key]) // step
    if not estimated(cfg, wl):
        return None
    count = {}

    one: list = []

    def records(n: int) -> int:
        w = wl.with_axis(n)
        one.append(w)
        count[n] = dry_run(cfg.hardware, w, kernel, recipes, w.cfg.dtype, None, count_stages=True,
                           units=copy.deepcopy(units) if units is not None else None).get("records", 0)
        return count[n]
    least, held = held_steps(cfg, wl, q)  # a step of layers holds the records of these alone (kbframe.repeated)
    check = bool(cfg.run.check) if "run" in cfg else True
    per = max(FF_BYTES_PER_RECORD, SANITIZER_BYTES_PER_RECORD if check else 0)
    have = physical_memory_bytes()
    # verify simulates the full run too, every record's stages kept (off: check_resources checks it)
    whole = "run" in cfg and str(cfg.run.get("fast_forward", "off")) == "verify"
    if not records(1):
        return None
    if held * count[1] <= budget and not (whole and have is not None and held * count[1] * per > have):
        return held * count[1]
    more = records(2) - count[1]

    def of(n: int) -> int:  # the records of n steps (affine in them)
        return count[1] + (n - 1) * more

    def holding(n: int, how: str) -> str:
        return f" and hold those of {how}{n} steps, about {of(n):,}" if n < q else ""
    head = (f"{cfg.bench.name} at {wl.shape_text()} would make about {of(q):,} op_log records ({count[1]:,} with 1 "
            f"of its {q:,} steps of {key}, {more:,} more with each further one)")
    # a model step's one step of the axis estimates the whole step (metrics.json step.model)
    instead = (f", or simulate one (bench.{key}={step}: metrics.json step.model estimates the whole step from it)"
               if one[0].model_layers() is not None else "")
    if of(least) > budget:
        raise RecordBudgetError(f"{head}{holding(least, 'at least ' if least < held else '')}, over "
                                f"run.max_records={budget:,}; raise run.max_records or shrink the run{instead}")
    est = of(held)
    head += holding(held, "up to " if least < held else "")
    if have is not None and est * per > have:
        raise ConfigError(f"{head}, about {_gib(est * per)} of host memory ({per} B each"
                          f"{' with run.check=true' if check else ''}); this machine has {_gib(have)}; shrink the run"
                          f"{' or use run.check=false' if check else ''}")
    return est


def npz_headers(path) -> dict:
    """``{array name: (shape, dtype)}`` of the ``.npy`` members of an ``.npz``, read from
    their headers only (nothing is decompressed but the header); ``{}`` if it cannot be read
    that way (numpy's own load then says why)."""
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with zf.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                        np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(f)
                out[info.filename[:-4]] = (tuple(int(x) for x in shape), np.dtype(dtype))
    except Exception:  # noqa: BLE001 (not an npz numpy can read: its own error names it)
        return {}
    return out


def check_npz_memory(path, names, key: str = "bench.inputs.path") -> None:
    """Raise InputsError if loading arrays ``names`` of the ``.npz`` at ``path`` (each as
    stored, then as float64) would not fit in host memory. A small file can expand a
    thousandfold (deflate), and numpy allocates what a header declares before reading, so
    this is checked from the headers before anything is loaded."""
    heads = npz_headers(path)
    need, biggest = 0, None
    for name in names:
        if name not in heads or heads[name][1].hasobject:
            continue
        shape, dtype = heads[name]
        count = math.prod(shape)
        need += count * (dtype.itemsize + 8)
        if biggest is None or count * dtype.itemsize > biggest[0]:
            biggest = (count * dtype.itemsize, name, shape, dtype)
    have = physical_memory_bytes()
    if biggest is not None and have is not None and need > have:
        _, name, shape, dtype = biggest
        raise InputsError(f"{key}: '{path}' needs about {_gib(need)} of host memory to load (array '{name}' is "
                          f"{shape} {dtype}, {_gib(biggest[0])} once expanded, then float64); this machine has "
                          f"{_gib(have)}")


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


def dry_run(hardware, wl, kernel, recipes: dict, dtype: str, inputs: dict | None,
            count_stages: bool = False, units: dict | None = None) -> dict:
    """Run the workload's programs through the tl layer only, on unbounded TCMs; nothing is
    simulated. Each dispatch is timed (PE_CPU's cost); with ``count_stages`` each command
    shape is also planned once, to count the stages (and so the op_log records) the run
    will have. ``units``: one PE's unbound units (default: built from ``hardware``); this
    dry run's PEs are built from them.

    Returns:
        ``{"tcm_bytes": highest high water of any PE, "pe": that PE, "hbm_bytes": HBM
        footprint, "commands": n, "dispatch_ps": the busiest PE_CPU's dispatch time in all,
        "stages", "records": op_log records (0 unless count_stages)}``, or ``{}`` if a
        kernel needs simulated values to go on (then only the real run's TcmOverflowError
        guards the TCM).
    Raises:
        KbframeError: whatever the tl layer raises at emit (ValidationError ...).
    """
    engine = Engine(hardware, Numerics(), OpLog(None), units)
    for name, shape in wl.tensors().items():
        engine.add_hbm_tensor(name, shape, dtype, None)
    capacity = engine.pes[0].tcm.capacity_bytes

    def make_tl(i):  # only the PEs the workload uses are built (kbframe.sim.engine.PEs)
        pe = engine.pes[i]
        pe.tcm.capacity_bytes = 1 << 62
        return TL(pe, engine.hbm, recipes, dtype)
    programs = wl.programs(kernel, make_tl, inputs)
    n = stages = dispatch_ps = 0
    n_stages_of: dict = {}  # command shape -> its stage count
    try:
        for i, program in programs.items():
            pe = engine.pes[i]
            cpu, cost, pe_ps = pe.cpu, {}, 0  # logical bytes -> dispatch ps (a kernel repeats a few sizes)
            for req in requests(program):
                if type(req) is not Dispatch:
                    continue
                cmd = req.cmd
                n += 1
                ps = cost.get(cmd.logical_bytes)
                if ps is None:
                    ps = cost[cmd.logical_bytes] = cycles_to_ps(cpu.cost_cycles(cmd), cpu.clock_ghz)
                pe_ps += ps
                if count_stages:  # planned once per command shape, never run
                    key = (i, plan_key(cmd))
                    k = n_stages_of.get(key)
                    if k is None:
                        k = n_stages_of[key] = pe.scheduler.n_stages(cmd)
                    stages += k
            dispatch_ps = max(dispatch_ps, pe_ps)
    except KbframeError:
        raise
    except Exception as e:  # a kernel that reads simulated values: no exact dry run
        raise_interrupt_behind(e)
        return {}
    pe = max(programs, key=lambda i: engine.pes[i].tcm.high_water)
    tcm = engine.pes[pe].tcm
    return {"tcm_bytes": tcm.high_water, "pe": pe, "tcm_capacity_bytes": capacity,
            "tcm_allocations": tcm.allocations, "hbm_bytes": engine._hbm_top, "commands": n,
            "dispatch_ps": dispatch_ps, "stages": stages, "records": 2 * n + stages if count_stages else 0}


def check_hbm(cfg, wl) -> None:
    """The bench's HBM tensors against ``hardware.hbm_bytes`` (no dry run needed).

    Raises:
        HbmCapacityError: the HBM tensors exceed ``hardware.hbm_bytes``.
    """
    b, hw = cfg.bench, cfg.hardware
    tensors = wl.tensors()
    hbm_cap = hw.get("hbm_bytes")
    isz = itemsize(b.dtype)
    # Python integers: numpy's prod wraps at 2^63 (a 2^62-row tensor would need 0 B)
    hbm_need = sum(-(-math.prod(int(x) for x in s) * isz // 4096) * 4096 for s in tensors.values())
    if hbm_cap is not None and hbm_need > hbm_cap:
        raise HbmCapacityError(f"HBM too small: {', '.join(tensors)} need {hbm_need} B ({_gib(hbm_need)}) at "
                               f"{wl.shape_text()} ({b.dtype}), hardware.hbm_bytes is {hbm_cap} B ({_gib(hbm_cap)})",
                               hbm_need, hbm_cap)


def model_refusal(cfg, wl) -> ConfigError | None:
    """Why the whole model's step would not fit (the workload's own checks with all its
    layers, :meth:`Workload.whole_model`: a cube's HBM; then :func:`check_hbm`), as a run
    of it would be refused before it simulates, or None: a run of fewer layers estimates
    the whole step (``metrics.json`` ``step.model``) only for a model that fits."""
    try:
        whole = wl.whole_model()
        if whole is not None:
            check_hbm(cfg, whole)
    except ConfigError as e:
        return e
    return None


def check_resources(cfg, wl, kernel, recipes: dict, inputs: dict | None, units: dict | None = None) -> dict:
    """HBM and TCM needs of the bench's workload against ``cfg.hardware``, before any
    simulation (:func:`check_hbm`, then a :func:`dry_run`). A fast-forwarded run
    (kbframe.run.fastforward) needs no dry run: the simulation it is made from (or its
    short copies) ran against the real TCM, and one that fails sends the run here.

    Returns:
        The :func:`dry_run` figures.
    Raises:
        ConfigError: the HBM tensors exceed ``hardware.hbm_bytes``.
        TcmOverflowError: the kernel's TCM high water exceeds the PE's TCM (names both).
        KbframeError: an emit-time error of the kernel.
    """
    check_hbm(cfg, wl)
    b, hw = cfg.bench, cfg.hardware
    shape = wl.shape_text()
    check = bool(cfg.run.check) if "run" in cfg else True
    fig = dry_run(hw, wl, kernel, recipes, b.dtype, inputs, count_stages=True, units=units)
    if check:
        check_sanitizer_memory(cfg, fig)
    budget = record_budget(cfg)
    if fig and budget and fig["records"] > budget:
        raise ConfigError(f"{b.name} at {shape} would be simulated record by record: {fig['records']:,} op_log "
                          f"records ({fig['commands']:,} commands), over run.max_records={budget:,}; raise "
                          f"run.max_records or shrink the run")
    if fig and fig["dispatch_ps"] >= MAX_PS:  # PE_CPU dispatches one command at a time
        c = cfg.calibration
        raise TimeBaseError(f"PE_CPU alone needs {fig['dispatch_ps']:.4g} ps to dispatch the kernel's "
                            f"{fig['commands']} commands (calibration.FIXED={c.FIXED}, calibration.R={c.R}, "
                            f"hardware.clock_ghz={hw.clock_ghz}); {LIMIT_TEXT}")
    if fig and fig["tcm_bytes"] > fig["tcm_capacity_bytes"]:
        cap = fig["tcm_capacity_bytes"]
        name, addr, size = next((n, a, s) for n, a, s, *_ in fig["tcm_allocations"] if a + s > cap)
        raise TcmOverflowError(
            f"TCM overflow on PE{fig['pe']}: request '{name}' needs {size} B, {cap - addr} B free of {cap} B "
            f"capacity (hardware.tcm_bytes); {b.name} needs {fig['tcm_bytes']} B of TCM in all at {shape} "
            f"({b.dtype}), found by a dry run before the simulation")
    return fig
