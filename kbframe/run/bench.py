"""Running a bench: inputs, the float64 reference, the simulation, metrics and files.

Files written to the run directory (each atomically: a temporary file, then rename):
``metrics.json``, ``op_log.jsonl`` (streamed), ``trace.json`` (unless ``run.trace=false``),
``tensors.npz`` (data mode); ``metrics.json`` ``files`` lists them.
"""
from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path

from dataclasses import fields

import numpy as np
from hydra.utils import get_method, to_absolute_path
from omegaconf import OmegaConf
from threadpoolctl import threadpool_limits

from ..sim.engine import Engine
from ..files import write_json
from ..errors import ConfigError, InputsError, NumericsError, OutputError
from ..sim.numerics import Numerics, NumpyNumerics
from ..sim.oplog import OpLog
from ..tl.recipe import load_recipes
from . import preflight
from ..sim import sanitizer
from .schema import BenchConfig, CalibrationConfig, HardwareConfig, InputsConfig, RunConfig
from ..timebase import ps_to_ns
from . import progress
from ..report import critical_path, roofline
from ..report.trace import write_trace
from ..tl.context import TL


def _check_keys(node, schema_cls, where: str) -> None:
    """Unknown keys (also ones added with ``+``, which Hydra lets into typed nodes)."""
    known = {f.name for f in fields(schema_cls)}
    for key in node.keys():
        if key not in known:
            raise ConfigError(f"unknown key '{where}.{key}' (known: {', '.join(sorted(known))})")


def validate(cfg) -> None:
    """Check what the schema cannot: unknown keys, ranges and choices. Raises ConfigError
    naming the key."""
    for key in cfg.keys():
        if key not in ("hardware", "calibration", "bench", "run", "recipes", "sweep"):
            raise ConfigError(f"unknown top-level key '{key}'")
    for where, cls in (("hardware", HardwareConfig), ("calibration", CalibrationConfig),
                       ("bench", BenchConfig), ("run", RunConfig)):
        _check_keys(cfg[where], cls, where)
    _check_keys(cfg.bench.inputs, InputsConfig, "bench.inputs")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required value(s): {', '.join(missing)}")
    b = cfg.bench
    for key in ("G", "d", "S_kv", "tile"):
        if b[key] < 1:
            raise ConfigError(f"bench.{key} must be ≥ 1, got {b[key]}")
    for key in ("dtype", "data_dtype"):
        if b[key] not in ("float16", "float32", "float64", "bfloat16"):
            raise ConfigError(f"bench.{key} must be float16, float32 or float64, got '{b[key]}'")
    if b.data_dtype == "bfloat16":
        raise ConfigError("bench.data_dtype=bfloat16 is not supported by numpy; use float16 or float32")
    if b.scale is not None and not (math.isfinite(b.scale) and b.scale > 0):
        raise ConfigError(f"bench.scale must be a finite number > 0, got {b.scale}")
    if cfg.hardware.n_pes < 1:
        raise ConfigError(f"hardware.n_pes must be ≥ 1, got {cfg.hardware.n_pes}")
    if not 0 <= b.pe < cfg.hardware.n_pes:
        raise ConfigError(f"bench.pe={b.pe} but hardware.n_pes={cfg.hardware.n_pes}")
    if not str(b.kernel).startswith("kbframe."):
        raise ConfigError(f"bench.kernel '{b.kernel}' is outside the kbframe. namespace")
    if b.seed < 0:
        raise ConfigError(f"bench.seed must be ≥ 0, got {b.seed}")
    if not (math.isfinite(b.inputs.peak) and b.inputs.peak >= 0):
        raise ConfigError(f"bench.inputs.peak must be a finite number ≥ 0, got {b.inputs.peak}")
    for key in ("clock_ghz", "hbm_gbps", "hbm_bytes", "tcm_bytes"):
        if not (math.isfinite(cfg.hardware[key]) and cfg.hardware[key] > 0):
            raise ConfigError(f"hardware.{key} must be a finite number > 0, got {cfg.hardware[key]}")
    for key in ("FIXED", "R"):
        if cfg.calibration[key] < 0 or not math.isfinite(cfg.calibration[key]):
            raise ConfigError(f"calibration.{key} must be a finite number ≥ 0, got {cfg.calibration[key]}")
    if cfg.calibration.cap_bytes < 1:
        raise ConfigError(f"calibration.cap_bytes must be ≥ 1, got {cfg.calibration.cap_bytes}")


def load_inputs(path: str) -> dict:
    """Read ``q (G, d)``, ``k (S_kv, d)``, ``v (S_kv, d)`` and optional 0-d ``scale`` from an
    .npz (``allow_pickle=False``; other arrays are ignored).

    Raises:
        InputsError: missing/unreadable file, missing array, or inconsistent shapes.
    """
    p = Path(path)
    if p.is_dir():
        raise InputsError(f"bench.inputs.path: '{path}' is a directory, not an .npz file")
    if not p.is_file():
        raise InputsError(f"bench.inputs.path: no such file '{path}'")
    if not zipfile.is_zipfile(p):
        raise InputsError(f"bench.inputs.path: '{path}' is not an .npz file (not a zip archive; "
                          f"a truncated or plain .npy/text/pickle file?)")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: np.asarray(z[k]) for k in ("q", "k", "v", "scale") if k in z.files}
    except Exception as e:  # zipfile/ValueError/OSError: a truncated or non-npz file
        raise InputsError(f"bench.inputs.path: cannot read '{path}' as .npz ({type(e).__name__}: {e})") from None
    for k in ("q", "k", "v"):
        if k not in arrays:
            raise InputsError(f"bench.inputs.path: '{path}' has no array '{k}' (needs q, k, v)")
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    if q.ndim != 2 or k.ndim != 2 or v.ndim != 2 or k.shape != v.shape or q.shape[1] != k.shape[1] \
            or 0 in q.shape or 0 in k.shape:
        raise InputsError(f"bench.inputs.path: inconsistent shapes in '{path}': q {q.shape}, k {k.shape}, "
                          f"v {v.shape} (need q (G, d), k and v (S_kv, d), all non-empty)")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)) \
                or not np.all(np.isfinite(a)):
            raise InputsError(f"bench.inputs.path: '{path}' array '{name}' must be finite numbers")
    out = {"q": q.astype(np.float64), "k": k.astype(np.float64), "v": v.astype(np.float64)}
    if "scale" in arrays:
        s = arrays["scale"]
        real = np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)
        if s.shape != () or not real or not np.isfinite(s) or float(s) <= 0:
            raise InputsError(f"bench.inputs.path: '{path}' scale must be a 0-d finite number > 0, got {s!r}")
        out["scale"] = float(s)
    return out


def make_inputs(b) -> dict:
    """Generated inputs from ``bench.seed``: q (G, d), k, v (S_kv, d), drawn in float64 and
    kept as float32 (the kernel's inputs are those float32 values; the float64 reference
    uses the same values). q is scaled so the scores ``q·kᵀ·scale`` have standard
    deviation ``bench.inputs.peak``. k and v are drawn in chunks (the same stream) so a
    long context never holds a float64 copy (128 MiB each at S_kv = 131072)."""
    rng = np.random.default_rng(b.seed)
    scale = b.scale if b.scale is not None else 1.0 / math.sqrt(b.d)
    q = (rng.standard_normal((b.G, b.d)) * (b.inputs.peak / (scale * math.sqrt(b.d)))).astype(np.float32)

    chunk = np.empty((min(b.S_kv, _CHUNK_ROWS), b.d))  # each chunk is drawn into this: the same values

    def normal_f32(rows):
        out = np.empty((rows, b.d), np.float32)
        for r0 in range(0, rows, _CHUNK_ROWS):
            r1 = min(rows, r0 + _CHUNK_ROWS)
            out[r0:r1] = rng.standard_normal(out=chunk[:r1 - r0])
        return out
    k = normal_f32(b.S_kv)
    v = normal_f32(b.S_kv)
    return {"q": q, "k": k, "v": v, "scale": scale}


_CHUNK_ROWS = 8192


def reference(q, k, v, scale) -> np.ndarray:
    """float64 ``softmax(q·kᵀ·scale)·v``, ``(G, d)``, computed over chunks of keys so that
    float32 k and v are widened a chunk at a time (no full float64 copy of either)."""
    q64 = q.astype(np.float64, copy=False)
    S = k.shape[0]
    s = np.empty((q.shape[0], S))
    for r0 in range(0, S, _CHUNK_ROWS):
        s[:, r0:r0 + _CHUNK_ROWS] = q64 @ k[r0:r0 + _CHUNK_ROWS].astype(np.float64, copy=False).T
    s *= scale
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    out = np.zeros((q.shape[0], v.shape[1]))
    for r0 in range(0, S, _CHUNK_ROWS):
        out += p[:, r0:r0 + _CHUNK_ROWS] @ v[r0:r0 + _CHUNK_ROWS].astype(np.float64, copy=False)
    return out


def write_json_atomic(path: Path, obj) -> None:
    """Write JSON to ``path`` atomically (kbframe.files); OSError becomes OutputError."""
    try:
        write_json(path, obj)
    except OSError as e:
        raise OutputError(f"cannot write '{path}': {e.strerror or e}") from None


def run_bench(cfg, out_dir: Path) -> dict:
    """Run ``cfg.bench`` on ``cfg.hardware`` and write the run's files into ``out_dir``.

    Returns:
        The metrics dict (also written to ``metrics.json``).
    Raises:
        KbframeError subclasses for every bad input (ConfigError, InputsError,
        RecipeError, ValidationError, TcmOverflowError, DeadlockError).
    """
    validate(cfg)
    b = cfg.bench
    recipes = load_recipes(cfg.get("recipes"))
    if b.inputs.path:
        inp = load_inputs(to_absolute_path(b.inputs.path))  # relative to where kbframe was started
        if b.scale is not None:  # an explicit bench.scale wins over the file's
            inp["scale"] = float(b.scale)
        inp.setdefault("scale", 1.0 / math.sqrt(inp["q"].shape[1]))
    elif b.data:
        preflight.check_host_memory(b.G, b.d, b.S_kv, b.data, b.data_dtype)
        inp = make_inputs(b)
    else:  # timing only: shapes are all the simulation needs, no numbers are made
        inp = {"q": None, "k": None, "v": None, "scale": b.scale if b.scale is not None else 1.0 / math.sqrt(b.d)}
    q, k, v, scale = inp["q"], inp["k"], inp["v"], float(inp["scale"])
    G, d, S_kv = (q.shape[0], q.shape[1], k.shape[0]) if q is not None else (b.G, b.d, b.S_kv)
    tile = int(b.tile)
    try:
        kernel = get_method(b.kernel)
    except Exception:
        raise ConfigError(f"bench.kernel: cannot import '{b.kernel}'") from None

    if b.data:
        preflight.check_inputs_fit(b.data_dtype, {"q": q, "k": k, "v": v}, scale)
    preflight.check_resources(cfg, kernel, recipes, G, d, S_kv, tile, scale)
    try:  # nothing in out_dir is touched before this point
        out_dir.mkdir(parents=True, exist_ok=True)
        preflight.check_outputs(out_dir)
        oplog_path = out_dir / "op_log.jsonl.partial"  # renamed once the run passed (left for debugging if not)
        oplog = OpLog(oplog_path)
    except OSError as e:
        raise OutputError(f"cannot write the run directory '{out_dir}': {e.strerror or e}") from None
    numerics = NumpyNumerics(b.data_dtype) if b.data else Numerics()
    check = bool(cfg.run.check) if "run" in cfg else True
    try:
        engine = Engine(cfg.hardware, numerics, oplog)
        if check:
            sanitizer.enable(engine)
        for name, arr, shape in (("q", q, (G, d)), ("k", k, (S_kv, d)), ("v", v, (S_kv, d)),
                                 ("out", None, (G, d))):
            engine.add_hbm_tensor(name, shape, b.dtype, arr if b.data else None)
        pe = engine.pes[b.pe]
        tl = TL(pe, engine.hbm, recipes, b.dtype)
        show = bool(cfg.run.progress) if "run" in cfg else False
        # one BLAS thread: the simulator's matmuls are tile-sized, where threading only adds
        # hand-off cost (and noise on sim.wall_s)
        with progress.attach(pe.cpu, show, engine.hbm["k"], S_kv, tile), threadpool_limits(1):
            latency_ps = engine.run({b.pe: lambda: kernel(tl, G=G, d=d, S_kv=S_kv, tile=tile, scale=scale)})
    finally:
        oplog.close()
    san = sanitizer.check(engine, oplog_path) if check else {"rules_checked": 0}
    n_tiles = -(-S_kv // tile)
    cp = critical_path.analyse(oplog.waits, n_tiles, "KV tile")
    trace = bool(cfg.run.trace) if "run" in cfg else True
    trace_tmp = out_dir / "trace.json.partial"
    if trace:
        write_trace(oplog_path, trace_tmp, critical=cp.records)

    metrics = _metrics(cfg, engine, pe, oplog, latency_ps, n_tiles, G, d, S_kv, tile, cp.metrics)
    metrics["sanitizer"] = san
    metrics["scale"] = scale
    tensors = None  # data mode only: timing-only runs compute no numbers
    if b.data:
        # one BLAS thread: faster here even when idle, and two threads slow tenfold when
        # both cores are busy (a parallel sweep); the bits no longer depend on the core count
        with threadpool_limits(1):
            ref = reference(q, k, v, scale)
        tensors = {"q": q, "k": k, "v": v, "ref": ref, "scale": np.float64(scale)}
        out = numerics.read(engine.hbm["out"]).astype(np.float64)
        if not np.all(np.isfinite(out)):
            raise NumericsError(f"the kernel's output 'out' has {int(np.sum(~np.isfinite(out)))} non-finite "
                                f"value(s) (never reported as an error number)")
        tensors["out"] = out
        err = np.abs(out - ref)
        metrics["numerics"] = {"enabled": True, "dtype": b.data_dtype,
                               "max_abs_err": float(err.max()),
                               "max_rel_err": float(err.max() / max(np.abs(ref).max(), 1e-300))}
    else:
        metrics["numerics"] = {"enabled": False, "dtype": None, "max_abs_err": None, "max_rel_err": None}
    made = {"trace.json": trace, "tensors.npz": tensors is not None}
    metrics["files"] = [name for name in preflight.OUTPUT_FILES if made.get(name, True)]
    tmp = out_dir / "tensors.tmp.npz"
    try:
        if tensors is not None:
            np.savez(tmp, **tensors)
        # the run passed: replace a previous run's files together, metrics.json last
        os.replace(oplog_path, out_dir / "op_log.jsonl")
        if trace:
            os.replace(trace_tmp, out_dir / "trace.json")
        else:  # a previous run's timeline (or a failed run's staged one) is not this run's
            (out_dir / "trace.json").unlink(missing_ok=True)
            trace_tmp.unlink(missing_ok=True)
        if tensors is not None:
            os.replace(tmp, out_dir / "tensors.npz")
        else:  # a previous data-mode run's numbers would not belong to this run
            (out_dir / "tensors.npz").unlink(missing_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write '{e.filename}' in the run directory: {e.strerror or e}") from None
    write_json_atomic(out_dir / "metrics.json", metrics)
    return metrics


def _metrics(cfg, engine, pe, oplog, latency_ps, n_tiles, G, d, S_kv, tile, cp: dict) -> dict:
    cpu = pe.cpu
    lat_ns = ps_to_ns(latency_ps)
    gemm = pe.stage_units["gemm"]
    # each DMA channel moves its bytes at its own bandwidth (reads and writes overlap), so the
    # HBM bound is the busiest channel's bytes / bandwidth: a lower bound the simulation obeys
    hbm_ns = max([oplog.bytes[(pe.index, name)] / u.bandwidth_gbps
                  for name, u in pe.stage_units.items() if hasattr(u, "bandwidth_gbps")] or [0.0])
    compute_ns = oplog.flops / (gemm.peak_tflops * 1000.0)
    dispatch_ns = cpu.cycles / cpu.clock_ghz
    bounds = {"hbm": hbm_ns, "compute": compute_ns, "dispatch": dispatch_ns}
    largest = max(bounds, key=bounds.get)
    units = {}
    for (pe_i, name), busy in sorted(oplog.busy_ps.items()):
        if pe_i != pe.index:
            continue
        units[name] = {"busy_ns": ps_to_ns(busy), "utilisation": busy / latency_ps if latency_ps else 0.0,
                       "count": oplog.count[(pe_i, name)], "bytes": oplog.bytes[(pe_i, name)]}
    n_stages = sum(c for (p, u), c in oplog.count.items() if u not in ("cpu", "scheduler"))
    return {
        "bench": cfg.bench.name,
        "kernel": cfg.bench.kernel,
        "shape": {"G": G, "d": d, "S_kv": S_kv, "tile": tile, "n_tiles": n_tiles},
        "calibration": {"FIXED": cfg.calibration.FIXED, "R": cfg.calibration.R,
                        "cap_bytes": cfg.calibration.cap_bytes},
        "sim": {"latency_ns": lat_ns, "events": oplog.n_records, "stages": n_stages,
                "wall_s": engine.wall_s},
        "dispatch": {"commands": cpu.n_commands, "cycles": cpu.cycles,
                     "commands_per_tile": cpu.n_commands / n_tiles,
                     "cycles_per_tile": cpu.cycles / n_tiles},
        # the bounds stay bounds; what binds is the critical path's kind (issue 13)
        "roofline": {"bound_ns": bounds[largest], "largest_bound": largest, "binding": cp["binding"],
                     "fraction": bounds[largest] / lat_ns if lat_ns else 0.0,
                     "hbm_ns": hbm_ns, "compute_ns": compute_ns, "dispatch_ns": dispatch_ns,
                     "hbm_bytes": oplog.hbm_bytes, "flops": oplog.flops},
        "units": units,
        "tcm": {"high_water_bytes": pe.tcm.high_water, "capacity_bytes": pe.tcm.capacity_bytes},
        "critical_path": cp,
    }


def summary(metrics: dict, out_dir: Path) -> str:
    """A short human summary of a run for the console."""
    s, d, r, n = metrics["shape"], metrics["dispatch"], metrics["roofline"], metrics["numerics"]
    lines = [
        f"kbframe {metrics['bench']}: G={s['G']} d={s['d']} S_kv={s['S_kv']} tile={s['tile']} ({s['n_tiles']} tiles)",
        f"  latency     {metrics['sim']['latency_ns']:.1f} ns simulated  ({metrics['sim']['events']} events, "
        f"{metrics['sim']['wall_s']:.2f} s wall)",
        f"  dispatch    {d['commands']} commands, {d['cycles']:.1f} cycles; per tile {d['commands_per_tile']:.2f} "
        f"commands, {d['cycles_per_tile']:.1f} cycles",
        f"  roofline    largest bound {r['largest_bound']} {r['bound_ns']:.1f} ns; achieved {r['fraction']:.1%} "
        f"of it; binding: {r['binding']}",
        f"  critical    {critical_path.summary_line(metrics['critical_path'])}",
    ]
    lines += roofline.table_lines(metrics, indent="    ")
    if n["enabled"]:
        lines.append(f"  numerics    max_abs_err {n['max_abs_err']:.3g}, max_rel_err {n['max_rel_err']:.3g} "
                     f"vs float64 reference ({n['dtype']})")
    else:
        lines.append("  numerics    off (bench.data=false)")
    lines.append(f"  files       {out_dir}/{{{', '.join(metrics['files'])}}}")
    return "\n".join(lines)
