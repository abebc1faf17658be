"""Running a bench: inputs, the float64 reference, the simulation, metrics and files.

Files written to the run directory: ``metrics.json``, ``op_log.jsonl`` (streamed),
``trace.json`` (unless ``run.trace=false``), ``tensors.npz`` (data mode); ``metrics.json``
``files`` lists them. Each is staged under a unique temporary name and they replace an
earlier run's files together, all or none (kbframe.run.rundir).
"""
from __future__ import annotations

import copy
import math
import zipfile
from contextlib import ExitStack
from pathlib import Path

from dataclasses import fields

import numpy as np
from hydra.utils import to_absolute_path
from omegaconf import OmegaConf, open_dict
from threadpoolctl import threadpool_limits

from ..sim import sanitizer
from ..sim.engine import build_units
from ..sim.targets import resolve_class, resolve_kernel
from ..files import atomic_write, write_json
from ..errors import ConfigError, InputsError, KbframeError, NumericsError, OutputError
from ..tl.recipe import load_recipes
from . import preflight
from .rundir import OUTPUT_FILES, RunDir
from .schema import CalibrationConfig, HardwareConfig, RunConfig
from ..report import critical_path
from ..report.trace import tracks_from_metrics, write_trace
from ..workloads.base import Workload
from . import fastforward, phases
from .metrics import run_metrics, unit_labels
from .beside import Drawing, Forked, Outcome, TensorsFile
from .simulate import simulate


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
        if key not in ("hardware", "calibration", "bench", "run", "recipes", "sweep", "search"):
            raise ConfigError(f"unknown top-level key '{key}'")
    for where, cls in (("hardware", HardwareConfig), ("calibration", CalibrationConfig), ("run", RunConfig)):
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
    for key in ("dtype", "data_dtype"):
        if b[key] not in ("float16", "float32", "float64", "bfloat16"):
            raise ConfigError(f"bench.{key} must be float16, float32 or float64, got '{b[key]}'")
    if b.data_dtype == "bfloat16":
        raise ConfigError("bench.data_dtype=bfloat16 is not supported by numpy; use float16 or float32")
    if cfg.hardware.n_pes < 1:
        raise ConfigError(f"hardware.n_pes must be ≥ 1, got {cfg.hardware.n_pes}")
    hw = cfg.hardware
    if hw.hbm_mode not in ("partitioned", "shared"):
        raise ConfigError(f"hardware.hbm_mode must be partitioned or shared, got '{hw.hbm_mode}'")
    for key in ("pes_per_cube", "cubes_x", "cubes_y"):
        if hw[key] < 1:
            raise ConfigError(f"hardware.{key} must be ≥ 1, got {hw[key]}")
    if not (math.isfinite(hw.cube_hbm_gbps) and hw.cube_hbm_gbps > 0):
        raise ConfigError(f"hardware.cube_hbm_gbps must be a finite number > 0, got {hw.cube_hbm_gbps}")
    if not 0 <= b.pe < cfg.hardware.n_pes:
        raise ConfigError(f"bench.pe={b.pe} but hardware.n_pes={cfg.hardware.n_pes}")
    if b.inputs.get("path") is not None and not str(b.inputs.path).strip():
        raise ConfigError("bench.inputs.path is empty; give an .npz file, or null for generated inputs")
    if b.seed < 0:
        raise ConfigError(f"bench.seed must be ≥ 0, got {b.seed}")
    for key in ("clock_ghz", "hbm_gbps", "hbm_bytes", "tcm_bytes"):
        if not (math.isfinite(cfg.hardware[key]) and cfg.hardware[key] > 0):
            raise ConfigError(f"hardware.{key} must be a finite number > 0, got {cfg.hardware[key]}")
    for key in ("FIXED", "R"):
        if cfg.calibration[key] < 0 or not math.isfinite(cfg.calibration[key]):
            raise ConfigError(f"calibration.{key} must be a finite number ≥ 0, got {cfg.calibration[key]}")
    if cfg.calibration.cap_bytes < 1:
        raise ConfigError(f"calibration.cap_bytes must be ≥ 1, got {cfg.calibration.cap_bytes}")
    wl = wl_cls(b, n_pes=int(cfg.hardware.n_pes))
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
    if p.is_dir():
        raise InputsError(f"bench.inputs.path: '{path}' is a directory, not an .npz file")
    if not p.exists():
        raise InputsError(f"bench.inputs.path: no such file '{path}'")
    if not p.is_file():  # checked before opening: reading a FIFO blocks, /dev/zero never ends
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
    ``out_dir``.

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
    with RunDir(out_dir) as rd, ExitStack() as stack:  # the stack closes before rd cleans up
        return _run_bench(cfg, out_dir, explicit, rd, stack)


def _run_bench(cfg, out_dir: Path, explicit, rd: RunDir, stack: ExitStack) -> dict:
    """:func:`run_bench`'s body; ``rd`` is opened once the pre-flight checks passed; what
    runs beside it (kbframe.run.beside: a thread, a forked process) is stopped by ``stack``
    before ``rd`` cleans up after a failure."""
    wl = validate(cfg)
    b = cfg.bench
    recipes = load_recipes(cfg.get("recipes"))
    unused = []
    if b.inputs.path:
        path = to_absolute_path(b.inputs.path)  # relative to where kbframe was started
        arrays = read_inputs_file(path, wl)
        apply_file_shape(cfg, arrays.pop("__shape__"), set(explicit), path)
        _save_resolved_config(cfg, out_dir)
        inp = wl.accept_file(arrays, path)
        unused = [f"bench.{k}" for k in wl.generated_only_keys]
    else:  # generated below (data mode), or timing only: shapes are all the simulation needs
        inp = None
        if b.data:
            preflight.check_host_memory(wl, b.data, b.data_dtype)
    kernel = resolve_kernel(b.kernel, "bench.kernel", bool(cfg.hardware.allow_external_targets),
                            kwargs=tuple(wl.kernel_kwargs(inp)))
    early, drawing, arriving = None, None, {}
    if b.data and inp is None:  # drawn in a thread beside the dry run, once nothing before can fail
        drawing = Drawing(wl.generate, np.random.default_rng(b.seed))
        stack.callback(drawing.stop)  # a failed run's drawing does not go on beside the next job
        early = _EarlyDryRun(cfg, wl, kernel, recipes)
        inp, arriving = drawing.inputs()  # decode's v still arriving: read as the simulation goes
    if b.data:
        # an arriving tensor's rows are fitted to data_dtype as they are stored (NumpyNumerics)
        preflight.check_inputs_fit(b.data_dtype, {n: inp[n] for n in wl.input_names() if n not in arriving})
        wl.check_inputs(b.data_dtype, inp)
    check = bool(cfg.run.check) if "run" in cfg else True
    show = bool(cfg.run.progress) if "run" in cfg else False
    ff = str(cfg.run.get("fast_forward", "off")) if "run" in cfg else "off"
    if ff not in ("off", "on", "verify"):
        raise ConfigError(f"run.fast_forward must be off, on or verify, got '{ff}'")
    sim, ff_note = None, "off" if ff == "off" else "data mode: every tile simulated"
    # one PE's units, instantiated once and copied for each engine
    units = early.units if early is not None and early.units is not None else build_units(cfg.hardware)
    if ff != "off" and not b.data:  # timing only: a periodic schedule is written, not simulated
        preflight.check_hbm(cfg, wl)
        out = fastforward.run(cfg, wl, kernel, recipes, check, units)  # writes nothing
        sim, ff_note = out.sim, out.note
    applied = sim is not None
    if not applied and not (early is not None and early.stands_for(inp)):
        preflight.check_resources(cfg, wl, kernel, recipes, inp, copy.deepcopy(units))
    rd.open()  # nothing in out_dir is touched before this point (kbframe.run.rundir)
    if b.data:
        # One BLAS thread from here on: faster here even when idle, two threads slow tenfold
        # when both cores are busy (a parallel sweep), and the bits do not depend on the
        # core count. tensors.npz (the inputs, then the float64 reference) is written by a
        # thread beside the simulation (kbframe.run.beside), once the inputs are all drawn.
        stack.enter_context(threadpool_limits(1))

        def inputs_drawn() -> dict | None:
            drawn = drawing.drawn() if drawing is not None else inp
            return None if drawn is None else {n: drawn[n] for n in wl.input_names()}
        tensors = stack.enter_context(TensorsFile(
            rd.temp("tensors.npz"), inputs_drawn,
            lambda: {**{wl.reference_name(o): r for o, r in wl.reference(inp).items()}, **wl.saved_scalars(inp)}))
    oplog_path = rd.temp("op_log.jsonl", debug=True)  # kept as op_log.jsonl.partial if the run fails
    if not applied:
        sim = simulate(cfg, wl, kernel, recipes, inp, oplog_path, check, show, units, check_later=check,
                       arriving=arriving)
        if drawing is not None:
            drawing.result()  # its error, if the kernel left rows of an arriving tensor unread
    engine, pe, oplog, latency_ps, numerics = sim.engine, sim.pe, sim.oplog, sim.latency_ps, sim.numerics
    trace = bool(cfg.run.trace) if "run" in cfg else True
    trace_tmp = rd.temp("trace.json", debug=True)

    resources = critical_path.resources_from_roles({name: u.roles for name, u in pe.stage_units.items()})

    phase_slices: list = []

    def analysis() -> tuple[dict, set]:
        """The critical path and the metrics: ``(metrics, records on the path)``; the
        phases' slices for the trace in ``phase_slices``."""
        rows = critical_path.as_records(oplog.waits)
        cp = critical_path.analyse(rows, wl.n_units(), wl.unit, resources)
        metrics = run_metrics(cfg, wl, engine, pe, oplog, latency_ps, cp.metrics)
        found, slices = phases.analyse(sim.phases or {}, rows, cp.segments, latency_ps,
                                       {name: u.roles for name, u in pe.stage_units.items()}, *_peaks(engine, pe, sim))
        metrics.update(found)
        if found and wl.tokens():
            metrics["step"] = phases.step(metrics, wl.tokens())
        phase_slices[:] = slices
        return metrics, cp.records

    def report() -> dict:
        """The critical path, the metrics and trace.json (written); the metrics."""
        metrics, on_path = analysis()
        if trace:
            write_trace(oplog_path, trace_tmp, tracks_from_metrics(metrics), critical=on_path, phases=phase_slices)
        return metrics

    def report_and_record_rules() -> tuple:
        """:func:`report`'s :class:`~kbframe.run.beside.Outcome` (its error is raised after
        the sanitizer's verdict) and the sanitizer's op_log rules."""
        return Outcome(report), sanitizer.record_rules(engine, oplog_path)

    def trace_of_records() -> None:
        """A fast-forwarded run's trace.json, from its records (no re-parse) and the walk
        of its critical path alone (the flags), before the metrics are known."""
        _, slices = phases.analyse(sim.phases or {}, critical_path.as_records(oplog.waits), [], latency_ps,
                                   {name: u.roles for name, u in pe.stage_units.items()})
        write_trace(oplog_path, trace_tmp, tracks_from_metrics(unit_labels(engine, pe, oplog)),
                    critical=critical_path.on_path(oplog.waits), records=out.records, phases=slices)

    def beside(work, job):
        """``work()`` here while ``job()`` runs in a forked process (kbframe.run.beside: both
        are pure Python, on the two cores): ``(work's value, job's)``. If work fails, the
        job is dropped: no trace of a failed run, as without the fork."""
        forked = Forked(job)
        stack.callback(forked.cancel)
        try:
            value = work()
        except BaseException:
            forked.cancel()
            trace_tmp.unlink(missing_ok=True)
            raise
        return value, forked.result()

    def write_oplog() -> str:  # a fast-forwarded run's op_log, and its check (verify); the note
        out.write_oplog(oplog_path)
        if ff == "verify":
            fastforward.verify(cfg, wl, kernel, recipes, oplog_path, check, rd.temp, sim)
            return ff_note + "; verified against the full simulation"
        return ff_note

    if applied and trace:  # the op_log and the analysis here, the trace beside them (as long)
        (ff_note, (metrics, _)), _ = beside(lambda: (write_oplog(), analysis()), trace_of_records)
        san = sim.sanitizer
    elif applied:  # the op_log written from columns beside the analysis
        ff_note, metrics = beside(write_oplog, lambda: analysis()[0])
        metrics["sim"]["wall_s"] = engine.wall_s  # with the op_log's writing, as with a trace
        san = sim.sanitizer
    elif sim.sanitizer is None:  # the sanitizer's rule 6 and 10 here, the report and its other rules beside
        data, (reported, recorded) = beside(lambda: sanitizer.data_rules(engine), report_and_record_rules)
        try:  # a violation comes before an error of the report, as when the check came first
            san = sanitizer.verdict(engine, recorded, data)
        except BaseException:  # no trace of a failed run
            trace_tmp.unlink(missing_ok=True)
            raise
        metrics = reported.result()
    else:
        metrics, san = report(), sim.sanitizer
    metrics["sanitizer"] = san
    # how the run was made, not a result (check_identical and verify leave it out, as wall_s)
    metrics["fast_forward"] = {"mode": ff, "applied": applied, "note": ff_note}
    metrics.update(wl.extra_metrics(inp))
    if unused:
        metrics["inputs"] = {"path": str(b.inputs.path), "unused_keys": unused}
    outputs = {}
    if b.data:
        refs = tensors.results()
        refs = {o: refs[wl.reference_name(o)] for o in wl.outputs}
        worst_abs, worst_rel = 0.0, 0.0
        results = wl.read_outputs(lambda name: numerics.read(engine.hbm[name]))
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
        metrics["numerics"] = {"enabled": True, "dtype": b.data_dtype,
                               "max_abs_err": worst_abs, "max_rel_err": worst_rel}
    else:
        metrics["numerics"] = {"enabled": False, "dtype": None, "max_abs_err": None, "max_rel_err": None}
    made = {"trace.json": trace, "tensors.npz": b.data}
    metrics["files"] = [name for name in OUTPUT_FILES if made.get(name, True)]
    staged = {"op_log.jsonl": oplog_path, "trace.json": trace_tmp if trace else None, "tensors.npz": None,
              "metrics.json": rd.temp("metrics.json")}
    if b.data:
        staged["tensors.npz"] = tensors.finish(outputs)
    write_json(staged["metrics.json"], metrics)
    # the run passed: its files replace a previous run's together (a file it did not make,
    # trace.json with run.trace=false, tensors.npz when timing only, is removed), or none do
    rd.commit(staged)
    return metrics


def _peaks(engine, pe, sim) -> tuple[float, float]:
    """One PE's HBM bandwidth (its share of the cube's, when the run's PEs share it) and
    its GEMM peak, GB/s and TFLOP/s: what kbframe.run.phases' analytic estimate takes."""
    gbps = max([u.bandwidth_gbps for u in pe.units_serving("dma_read")] or [0.0])
    if engine.shared_hbm:
        used = len(sim.phases or {}) or 1
        gbps = min(gbps, engine.cube_hbm_gbps / min(used, engine.ppc))
    gemm = pe.by_role.get("gemm")
    return gbps, (gemm.peak_tflops if gemm is not None else 0.0)


class _EarlyDryRun:
    """The pre-flight dry run (kbframe.run.preflight.check_resources) made while a
    data-mode run's inputs are drawn: it needs no input values, only the kernel's
    arguments. Its error is held and raised by :meth:`stands_for`, where the dry run
    would have been made, so the errors before it (the inputs' checks) still come first;
    if the drawn inputs give the kernel other arguments, the dry run is made again."""

    def __init__(self, cfg, wl, kernel, recipes):
        self.wl, self.kwargs, self.units, self.error = wl, wl.kernel_kwargs(None), None, None
        try:
            self.units = build_units(cfg.hardware)  # an error here comes again in its place
            preflight.check_resources(cfg, wl, kernel, recipes, None, copy.deepcopy(self.units))
        except KbframeError as e:
            self.error = e

    def stands_for(self, inputs) -> bool:
        """True when this dry run is the one ``inputs`` would make (raises its error)."""
        if self.wl.kernel_kwargs(inputs) != self.kwargs:
            return False
        if self.error is not None:
            raise self.error
        return True


def _save_resolved_config(cfg, out_dir: Path) -> None:
    """Rewrite Hydra's ``.hydra/config.yaml`` (if the run has one) after the config took the
    shapes of an inputs file, so the saved config is the one that ran."""
    saved = out_dir / ".hydra" / "config.yaml"
    if saved.is_file():
        try:
            atomic_write(saved, lambda tmp: tmp.write_text(OmegaConf.to_yaml(cfg)))
        except OSError as e:
            raise OutputError(f"cannot write '{saved}': {e.strerror or e}") from None
