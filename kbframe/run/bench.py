"""Running a bench: inputs, the float64 reference, the simulation, metrics and files.

Files written to the run directory: ``metrics.json``, ``op_log.jsonl`` (streamed),
``trace.json`` (unless ``run.trace=false``), ``tensors.npz`` (data mode); ``metrics.json``
``files`` lists them. Each is staged under a unique temporary name and they replace an
earlier run's files together, all or none (kbframe.run.rundir).
"""
from __future__ import annotations

import copy
import zipfile
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import OmegaConf, open_dict
from threadpoolctl import threadpool_limits

from .. import params
from ..errors import ConfigError, InputsError, NumericsError, OutputError, raise_interrupt_behind
from ..files import atomic_write, write_json
from ..report import critical_path
from ..report.record_columns import as_records
from ..report.power import power_from_metrics
from ..report.trace import tracks_from_metrics, write_trace
from ..repeated import RepeatedTable
from ..sim import sanitizer
from ..sim.waits import WaitLog
from ..sim.engine import build_units, check_topology
from ..sim.targets import resolve_class, resolve_kernel
from ..tl.recipe import load_recipes
from ..workloads.base import Workload
from . import energy, fastforward, memory, phases, preflight
from .metrics import run_metrics
from .rundir import OUTPUT_FILES, RunDir
from .schema import CalibrationConfig, EnergyConfig, HardwareConfig, RunConfig
from .simulate import Simulation, simulate


def _check_keys(node, schema_cls, where: str) -> None:
    """Unknown keys (also ones added with ``+``, which Hydra lets into typed nodes)."""
    known = {f.name for f in fields(schema_cls)}
    for key in node.keys():
        if key not in known:
            raise ConfigError(f"unknown key '{where}.{key}' (known: {', '.join(sorted(known))})")


def workload_class(target, allow_external: bool = False) -> type:
    """The workload class a bench names (``bench._target_``): a concrete :class:`Workload`
    subclass defined in a kbframe module (any module with
    ``hardware.allow_external_targets``), checked on the object, not on the text of its
    name (kbframe.sim.targets.resolve_class).

    Raises:
        ConfigError: names ``bench._target_`` and what it is instead.
    """
    return resolve_class(target, Workload, "bench._target_", allow_external)


def validate(cfg) -> Workload:
    """Check what the schema cannot: unknown keys, ranges and choices; return the bench's
    workload. Raises ConfigError naming the key."""
    for key in cfg.keys():
        if key not in ("hardware", "calibration", "energy", "bench", "run", "recipes", "sweep", "search"):
            raise ConfigError(f"unknown top-level key '{key}'")
    for where, cls in (("hardware", HardwareConfig), ("calibration", CalibrationConfig), ("run", RunConfig),
                       ("energy", EnergyConfig)):
        _check_keys(cfg[where], cls, where)
    b = cfg.bench
    if "_target_" not in b:
        raise ConfigError(f"bench '{b.get('name', '?')}' names no workload (bench._target_)")
    wl_cls = workload_class(b._target_, bool(cfg.hardware.get("allow_external_targets", False)))
    _check_keys(b, wl_cls.Config, "bench")
    inputs_cls = next(f.default_factory for f in fields(wl_cls.Config) if f.name == "inputs")
    _check_keys(b.inputs, inputs_cls, "bench.inputs")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required value(s): {', '.join(missing)}")
    for where, cls in (("hardware", HardwareConfig), ("calibration", CalibrationConfig), ("run", RunConfig),
                       ("bench", wl_cls.Config)):  # each key against its declaration (kbframe.params)
        if where in cfg:
            params.check(cfg[where], cls, f"{where}.", error=ConfigError)
    if b.data_dtype == "bfloat16":
        raise ConfigError("bench.data_dtype=bfloat16 is not supported by numpy; use float16 or float32")
    check_topology(cfg.hardware)  # every PE the topology declares is in the run, and no more
    if not 0 <= b.pe < cfg.hardware.n_pes:
        raise ConfigError(f"bench.pe={b.pe} but hardware.n_pes={cfg.hardware.n_pes}")
    if b.inputs.get("path") is not None and not str(b.inputs.path).strip():
        raise ConfigError("bench.inputs.path is empty; give an .npz file, or null for generated inputs")
    wl = wl_cls(b, n_pes=int(cfg.hardware.n_pes), hardware=cfg.hardware)
    wl.validate()
    return wl


def read_inputs_file(path: str, wl: Workload) -> dict:
    """The arrays of an inputs .npz (``allow_pickle=False``): every input tensor of the
    workload, and the optional 0-d scalars it knows. An array it does not know is refused
    by name (it would otherwise be silently ignored).

    Raises:
        InputsError: missing/unreadable file, a missing or unknown array, non-finite numbers.
    """
    p = Path(path)
    try:
        is_dir, exists, is_file = p.is_dir(), p.exists(), p.is_file()
    except OSError as e:  # a name the file system refuses (one too long)
        raise InputsError(f"bench.inputs.path: cannot read '{path}': {e.strerror or e}") from None
    if is_dir:
        raise InputsError(f"bench.inputs.path: '{path}' is a directory, not an .npz file")
    if not exists:
        raise InputsError(f"bench.inputs.path: no such file '{path}'")
    if not is_file:  # checked before opening: reading a FIFO blocks, /dev/zero never ends
        raise InputsError(f"bench.inputs.path: '{path}' is not a regular file (a FIFO, device or socket?)")
    if not zipfile.is_zipfile(p):
        raise InputsError(f"bench.inputs.path: '{path}' is not an .npz file (not a zip archive; "
                          f"a truncated or plain .npy/text/pickle file?)")
    need = wl.input_names()
    known = (*need, *wl.file_scalars)
    preflight.check_npz_memory(p, known)
    try:
        with np.load(p, allow_pickle=False) as z:
            names = list(z.files)
            unknown = [n for n in names if n not in known]
            if unknown:
                raise InputsError(f"bench.inputs.path: '{path}' has array(s) {unknown} that workload "
                                  f"{type(wl).__name__} does not read (it reads {', '.join(known)}); "
                                  f"remove them")
            arrays = {k: np.asarray(z[k]) for k in names}
    except InputsError:
        raise
    except Exception as e:  # zipfile/ValueError/OSError: a truncated or non-npz file
        raise_interrupt_behind(e)
        raise InputsError(f"bench.inputs.path: cannot read '{path}' as .npz ({type(e).__name__}: {e})") from None
    for k in need:
        if k not in arrays:
            raise InputsError(f"bench.inputs.path: '{path}' has no array '{k}' (needs {', '.join(need)})")
    wl_shape = wl.shape_from_file(arrays, path)
    for name in need:
        a = arrays[name]
        if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)) \
                or not np.all(np.isfinite(a)):
            raise InputsError(f"bench.inputs.path: '{path}' array '{name}' must be finite numbers")
    arrays["__shape__"] = wl_shape
    return arrays


def apply_file_shape(cfg, wl_shape: dict, explicit: set, path: str) -> None:
    """Set the shape keys an inputs file implies into ``cfg.bench`` (so ``.hydra/config.yaml``
    and ``metrics.json`` record the shapes used).

    Raises:
        InputsError: a key the user set explicitly (``explicit``) differs from the file's.
    """
    b = cfg.bench
    clash = [f"bench.{k}={b[k]} but the file has {k}={v}" for k, v in wl_shape.items()
             if f"bench.{k}" in explicit and b[k] != v]
    if clash:
        raise InputsError(f"bench.inputs.path: '{path}' contradicts explicit shape key(s): {'; '.join(clash)} "
                          f"(drop the key(s) to use the file's shapes)")
    with open_dict(b):
        for k, v in wl_shape.items():
            b[k] = v


def run_bench(cfg, out_dir: Path, explicit: set | frozenset = frozenset()) -> dict:
    """Run ``cfg.bench`` (its workload) on ``cfg.hardware`` and write the run's files into
    ``out_dir``: one straight line of named steps, :func:`_prepare`, :func:`_draw_inputs`,
    :func:`_plan` (all before the directory is touched), then :func:`_simulate`,
    :func:`_check`, :func:`_report`, :func:`_compare` and :func:`_write`.

    Args:
        explicit: bench keys the user set on the command line (``"bench.tile"``); an inputs
            file that contradicts one of them is an error, else its shapes are used.
    Returns:
        The metrics dict (also written to ``metrics.json``).
    Raises:
        KbframeError subclasses for every bad input (ConfigError, InputsError,
        RecipeError, ValidationError, TcmOverflowError, DeadlockError); OutputError for a
        run directory that cannot be written (kbframe.run.rundir: locked, staged, committed
        all or nothing, cleaned up on any failure).
    """
    out_dir = Path(out_dir)
    # numpy's overflow and invalid-value warnings are off for the whole run: every value
    # that matters is checked (inputs against their dtype and the accumulator before the
    # simulation, the outputs for NaN and inf after it) and refused with one line
    with RunDir(out_dir) as rd, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        run = _prepare(cfg, out_dir, explicit)
        _draw_inputs(run)
        _plan(run)
        rd.open()  # nothing in out_dir is touched before this point (kbframe.run.rundir)
        # data mode: one BLAS thread from here on (the simulation's tile-sized matmuls and
        # the reference), so the bits do not depend on the core count or a busy machine
        with threadpool_limits(1) if run.data else nullcontext():
            _simulate(run, rd)
            _check(run)
            metrics = _report(run, rd)
            outputs = _compare(run, metrics)
            _write(run, rd, metrics, outputs)
        return metrics


@dataclass
class _Run:
    """What the steps of :func:`run_bench` hand on to each other."""

    cfg: Any
    wl: Workload
    recipes: dict
    kernel: Any
    inputs: dict | None  # the kernel's inputs (data mode or an inputs file), else None
    unused: list  # bench keys an inputs file made meaningless
    data: bool
    check: bool  # run.check: the sanitizer
    show: bool  # run.progress
    trace: bool  # run.trace
    ff: str  # run.fast_forward: off, on or verify
    units: dict | None = None  # one PE's unbound units, built once
    forwarded: Any = None  # kbframe.run.fastforward.Outcome of a fast-forwarded run
    ff_note: str = "off"
    oplog_form: dict | None = None  # metrics.json "op_log": an op_log written in periodic form
    sim: Simulation | None = None
    full: Simulation | None = None  # run.fast_forward=verify: the full simulation, until its metrics are compared
    oplog_path: Path | None = None
    trace_path: Path | None = None
    sanitizer: dict | None = None
    references: dict | None = None  # data mode: output name -> its float64 reference
    path: str | None = None  # bench.inputs.path, absolute, when a file gave the inputs


def _prepare(cfg, out_dir: Path, explicit) -> _Run:
    """The checked config, one PE's units (built once: their parameters checked), its recipes
    and kernel, the run options, and an inputs file's
    arrays (its shapes set into the config, ``.hydra/config.yaml`` rewritten)."""
    wl = validate(cfg)
    units = build_units(cfg.hardware)  # one PE's units, each checking its parameters (kbframe.hw.unit.PeUnit)
    b = cfg.bench
    recipes = load_recipes(cfg.get("recipes"))
    run_cfg = cfg.run if "run" in cfg else {}
    ff = str(run_cfg.get("fast_forward", "off"))  # checked by validate (kbframe.params)
    inp, unused, path = None, [], None
    if b.inputs.path:
        path = to_absolute_path(b.inputs.path)  # relative to where kbframe was started
        arrays = read_inputs_file(path, wl)
        apply_file_shape(cfg, arrays.pop("__shape__"), set(explicit), path)
        params.check(b, type(wl).Config, "bench.", error=ConfigError)  # the file's shapes, as declared
        wl.validate()  # and the workload's own checks
        _save_resolved_config(cfg, out_dir)
        inp = wl.accept_file(arrays, path)
        unused = [f"bench.{k}" for k in wl.generated_only_keys]
    elif b.data:  # generated by _draw_inputs; timing only needs shapes alone
        preflight.check_host_memory(wl, b.data, b.data_dtype)
    kernel = resolve_kernel(b.kernel, "bench.kernel", bool(cfg.hardware.allow_external_targets),
                            kwargs=tuple(wl.kernel_kwargs(inp)))
    return _Run(cfg, wl, recipes, kernel, inp, unused, bool(b.data), check=bool(run_cfg.get("check", True)),
                show=bool(run_cfg.get("progress", False)), trace=bool(run_cfg.get("trace", True)), ff=ff,
                units=units, path=path)


def _draw_inputs(run: _Run) -> None:
    """Data mode: the inputs drawn from ``bench.seed`` (unless a file gave them), checked to
    fit ``bench.data_dtype`` and the workload's own ranges."""
    if not run.data:
        return
    b, wl = run.cfg.bench, run.wl
    if run.inputs is None:
        run.inputs = wl.generate(np.random.default_rng(b.seed))
    try:
        preflight.check_inputs_fit(b.data_dtype, {n: run.inputs[n] for n in wl.input_names()})
        wl.check_inputs(b.data_dtype, run.inputs)
    except NumericsError as e:
        if run.path is None:
            raise
        raise NumericsError(f"bench.inputs.path: '{run.path}': {e}") from None


def _plan(run: _Run) -> None:
    """The energy tables checked against the units; a timing-only run fast-forwarded if it can be (its records
    made, nothing written), else the pre-flight dry run (resources, TCM, HBM)."""
    cfg, wl = run.cfg, run.wl
    energy.check(cfg.energy, run.units)
    if run.ff != "off":
        run.ff_note = "data mode: every tile simulated"
    if not run.data:  # timing only: a run far over its record budget is refused before any copy or dry run
        preflight.check_hbm(cfg, wl)
        held = preflight.check_records_estimate(cfg, wl, run.kernel, run.recipes, run.units)
        if held:  # a large run's heap kept, and faulted in on the other core while it simulates
            memory.ahead(held * memory.PEAK_BYTES_PER_HELD_RECORD)
    checked = False
    if run.ff != "off" and not run.data:  # timing only: a periodic schedule is written, not simulated
        if not preflight.estimated(cfg, wl):  # short: its one simulation may be the full run, checked first
            preflight.check_resources(cfg, wl, run.kernel, run.recipes, run.inputs, copy.deepcopy(run.units))
            checked = True
        out = fastforward.run(cfg, wl, run.kernel, run.recipes, run.check, run.units, run.show)  # writes nothing
        run.ff_note = out.note
        if out.sim is not None:
            run.forwarded, run.sim = out, out.sim
            return
    if not checked:
        preflight.check_resources(cfg, wl, run.kernel, run.recipes, run.inputs, copy.deepcopy(run.units))


def _simulate(run: _Run, rd: RunDir) -> None:
    """``op_log.jsonl`` (staged; kept as ``op_log.jsonl.partial`` if the run fails): the
    simulation streams it, or a fast-forwarded run's records are written (and, with
    ``run.fast_forward=verify``, checked against the full simulation)."""
    run.oplog_path = rd.temp("op_log.jsonl", debug=True)
    run.trace_path = rd.temp("trace.json", debug=True)
    if run.forwarded is None:
        run.sim = simulate(run.cfg, run.wl, run.kernel, run.recipes, run.inputs, run.oplog_path, run.check,
                           run.show, run.units, check_later=True)
        return
    lines = run.forwarded.write_oplog(run.oplog_path, str(run.cfg.run.get("oplog", "auto")))
    form = run.sim.oplog.table.form
    if form is not None:  # written in periodic form (kbframe.records)
        run.oplog_form = {"form": "periodic", "records": form.records, "lines": lines, "prefix": form.prefix,
                          "period": form.period, "times": form.times}
        if form.rest:  # the other repeating sections, as the header names them, and the one that leaves out most
            run.oplog_form["sections"] = form.more
            big = max(form.sections, key=lambda s: (s.times - 1) * s.period)
            run.oplog_form["largest"] = {"prefix": big.prefix, "period": big.period, "times": big.times}
        if form.nested:  # sections repeating within sections' first periods
            run.oplog_form["nested"] = form.nested
    run.sanitizer = run.sim.sanitizer
    if run.ff == "verify" and not run.forwarded.whole:
        run.full = fastforward.verify(run.cfg, run.wl, run.kernel, run.recipes, run.check, run.sim)
        run.ff_note += "; verified against the full simulation"


def _check(run: _Run) -> None:
    """The sanitizer's verdict on a simulated run (``run.check``; a fast-forwarded run's
    simulated records were checked, and its counts extrapolated; a run fast-forward
    simulated whole is checked here)."""
    if run.forwarded is not None and not run.forwarded.whole:
        return
    run.sanitizer = sanitizer.check(run.sim.engine, run.sim.oplog.table) if run.check else {"rules_checked": 0}
    if run.check:
        sanitizer.release(run.sim.engine)


def _report(run: _Run, rd: RunDir) -> dict:
    """The critical path, the metrics and ``trace.json`` (staged): the metrics. With
    ``run.fast_forward=verify`` the metrics are checked against the full simulation's too
    (kbframe.run.fastforward.verify_metrics)."""
    sim, wl = run.sim, run.wl
    oplog = sim.oplog
    metrics, cp, slices = _analyses(run, sim)
    if run.full is not None:  # the full simulation's, made the same way
        fastforward.verify_metrics(metrics, _analyses(run, run.full)[0])
        run.full = None
    if run.trace:  # from the run's record table, as its op_log was
        power = power_from_metrics(metrics) if run.cfg.run.get("power_track", False) else None
        write_trace(oplog.table, run.trace_path, tracks_from_metrics(metrics), critical=cp.records,
                    phases=slices, power=power, source=run.oplog_path.name)
    metrics["sanitizer"] = run.sanitizer
    # how the run was made, not a result (check_identical and verify leave it out, as wall_s)
    metrics["fast_forward"] = {"mode": run.ff, "applied": run.forwarded is not None and not run.forwarded.whole,
                              "note": run.ff_note}
    if run.oplog_form is not None:
        metrics["op_log"] = run.oplog_form
    metrics.update(wl.extra_metrics(run.inputs))
    if run.unused:
        metrics["inputs"] = {"path": str(run.cfg.bench.inputs.path), "unused_keys": run.unused}
    return metrics


def _analyses(run: _Run, sim: Simulation) -> tuple:
    """``(metrics, critical path, phase slices)`` of a simulation of ``run``: the critical
    path, the totals, the phases and a model's step (a fast-forwarded step's from the
    records it simulated and its period, kbframe.repeated)."""
    wl = run.wl
    engine, pe, oplog = sim.engine, sim.pe, sim.oplog
    roles = {name: u.roles for name, u in pe.stage_units.items()}
    cp, rows, repeated, table = None, None, None, oplog.table
    resources = critical_path.resources_from_roles(roles)
    if isinstance(table, RepeatedTable):  # a period of layers put back: made from the records simulated
        simulated = as_records(WaitLog(table.simulated()))
        cp = critical_path.analyse(simulated, wl.n_units(), wl.unit, resources,
                                   critical_path.Repeat(table.x, table.P, table.X, table.dt))
        repeated = phases.Repeated(table, *run.forwarded.simulated, rows=simulated)
    if cp is None:
        rows = as_records(oplog.waits)
        cp = critical_path.analyse(rows, wl.n_units(), wl.unit, resources)
    metrics = run_metrics(run.cfg, wl, engine, pe, oplog, sim.latency_ps, cp.metrics)
    found, slices = phases.analyse(sim.phases or {}, rows, cp.segments, sim.latency_ps, roles, *_peaks(sim),
                                   repeated=repeated)
    metrics.update(found)
    if found and wl.tokens():
        metrics["step"] = phases.step(metrics, wl.tokens(), wl.model_layers(), preflight.model_refusal(run.cfg, wl))
    return metrics, cp, slices


def _compare(run: _Run, metrics: dict) -> dict:
    """Data mode: the kernel's outputs (float64) against the float64 reference, their worst
    errors in ``metrics["numerics"]``; the outputs."""
    if not run.data:
        metrics["numerics"] = {"enabled": False, "dtype": None, "max_abs_err": None, "max_rel_err": None}
        return {}
    wl, numerics, hbm = run.wl, run.sim.numerics, run.sim.engine.hbm
    refs = wl.reference(run.inputs)
    outputs, worst_abs, worst_rel = {}, 0.0, 0.0
    results = wl.read_outputs(lambda name: numerics.read(hbm[name]))
    for o in wl.outputs:
        got = np.asarray(results[o], dtype=np.float64)
        if not np.all(np.isfinite(got)):
            raise NumericsError(f"the kernel's output '{o}' has {int(np.sum(~np.isfinite(got)))} non-finite "
                                f"value(s) (never reported as an error number)")
        outputs[o] = got
        err = np.abs(got - refs[o])
        if err.size:
            worst_abs = max(worst_abs, float(err.max()))
            worst_rel = max(worst_rel, float(err.max() / max(np.abs(refs[o]).max(), 1e-300)))
    metrics["numerics"] = {"enabled": True, "dtype": run.cfg.bench.data_dtype,
                           "max_abs_err": worst_abs, "max_rel_err": worst_rel}
    run.references = refs
    return outputs


def _write(run: _Run, rd: RunDir, metrics: dict, outputs: dict) -> None:
    """``tensors.npz`` (data mode: the inputs, the references, the workload's scalars, the
    outputs) and ``metrics.json`` staged, then every file committed together (a file the
    run did not make, trace.json with ``run.trace=false``, tensors.npz when timing only,
    is removed), or none."""
    made = {"trace.json": run.trace, "tensors.npz": run.data}
    metrics["files"] = [name for name in OUTPUT_FILES if made.get(name, True)]
    staged = {"op_log.jsonl": run.oplog_path, "trace.json": run.trace_path if run.trace else None,
              "tensors.npz": None, "metrics.json": rd.temp("metrics.json")}
    if run.data:
        wl, inp = run.wl, run.inputs
        arrays = {n: inp[n] for n in wl.input_names()}
        arrays.update({wl.reference_name(o): r for o, r in run.references.items()})
        arrays.update(wl.saved_scalars(inp))
        arrays.update(outputs)
        staged["tensors.npz"] = rd.temp("tensors.npz")
        with open(staged["tensors.npz"], "wb") as f:
            np.savez(f, **arrays)
    write_json(staged["metrics.json"], metrics)
    rd.commit(staged)


def _peaks(sim) -> tuple[float, float]:
    """One PE's HBM bandwidth (its share of the cube's, when the run's PEs share it) and
    its GEMM peak, GB/s and TFLOP/s: what kbframe.run.phases' analytic estimate takes."""
    engine, pe = sim.engine, sim.pe
    gbps = max([u.bandwidth_gbps for u in pe.units_serving("dma_read")] or [0.0])
    if engine.shared_hbm:
        used = len(sim.phases or {}) or 1
        gbps = min(gbps, engine.cube_hbm_gbps / min(used, engine.ppc))
    gemm = pe.by_role.get("gemm")
    return gbps, (gemm.peak_tflops if gemm is not None else 0.0)


def _save_resolved_config(cfg, out_dir: Path) -> None:
    """Rewrite Hydra's ``.hydra/config.yaml`` (if the run has one) after the config took the
    shapes of an inputs file, so the saved config is the one that ran."""
    saved = out_dir / ".hydra" / "config.yaml"
    if saved.is_file():
        try:
            atomic_write(saved, lambda tmp: tmp.write_text(OmegaConf.to_yaml(cfg)))
        except OSError as e:
            raise OutputError(f"cannot write '{saved}': {e.strerror or e}") from None
