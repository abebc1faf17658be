"""Goldens of small benches: for each case, the sha256 of its ``op_log.jsonl``
plus its key metrics, committed under ``tests/goldens/<case>.json``.

Regenerate them (after an intended change of timing, calibration or numerics) with::

    .venv/bin/python tests/regen_goldens.py            # all cases
    .venv/bin/python tests/regen_goldens.py opt2_ragged  # some cases

and commit the diff of ``tests/goldens/``; ``tests/test_goldens.py`` compares.

The op_log holds only timing (integer-ps times, bytes), so its digest is exact on any
machine. Numeric errors depend on the BLAS summation order, so a golden stores them
rounded and the test accepts a factor of ``ERR_FACTOR`` either way.
"""
from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDENS = HERE / "goldens"
ERR_FACTOR = 4.0

#: case name → (bench, overrides). Small shapes: the whole set runs in a few seconds.
CASES = {
    "opt2_default": ("decode_opt2", ()),
    "opt3_default": ("decode_opt3", ()),
    "opt2_ragged": ("decode_opt2", ("bench.G=4", "bench.d=64", "bench.S_kv=200")),
    "opt3_ragged": ("decode_opt3", ("bench.G=4", "bench.d=64", "bench.S_kv=200")),
    "opt2_d256_tile128_timing": ("decode_opt2", ("bench.G=3", "bench.d=256", "bench.S_kv=300",
                                                 "bench.tile=128", "bench.data=false")),
    "opt3_d256_tile128_timing": ("decode_opt3", ("bench.G=3", "bench.d=256", "bench.S_kv=300",
                                                 "bench.tile=128", "bench.data=false")),
    "opt2_skv1": ("decode_opt2", ("bench.S_kv=1",)),
    "opt3_R025_fp16": ("decode_opt3", ("bench.S_kv=256", "calibration.R=0.25", "bench.data_dtype=float16")),
}

_KEYS = (
    "sim.latency_ns", "sim.events", "sim.stages",
    "dispatch.commands", "dispatch.cycles", "dispatch.commands_per_tile", "dispatch.cycles_per_tile",
    "roofline.bound_ns", "roofline.largest_bound", "roofline.binding", "roofline.fraction", "roofline.hbm_ns",
    "roofline.compute_ns", "roofline.dispatch_ns", "roofline.hbm_bytes", "roofline.flops",
    "tcm.high_water_bytes", "sanitizer.rules_checked", "sanitizer.stages",
    "critical_path.binding", "critical_path.steady", "critical_path.period_ns", "critical_path.units_per_period",
    "numerics.enabled", "numerics.dtype", "numerics.max_abs_err", "numerics.max_rel_err",
)
ERR_KEYS = ("numerics.max_abs_err", "numerics.max_rel_err")


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d[part]
    return d


def _round(x):
    if isinstance(x, float):
        return float(f"{x:.10g}")
    return x


def key_metrics(metrics: dict) -> dict:
    """The flat dict of golden-pinned metrics (floats to 10 significant digits; numeric
    errors to 2) plus each unit's busy time, stage count and bytes."""
    out = {}
    for k in _KEYS:
        v = _get(metrics, k)
        out[k] = float(f"{v:.2g}") if (k in ERR_KEYS and v is not None) else _round(v)
    for unit, u in sorted(metrics["units"].items()):
        if unit == "scheduler":  # PE_SCHEDULER runs no stages: its count is dispatch.commands
            continue
        for f in ("busy_ns", "count", "bytes"):
            out[f"units.{unit}.{f}"] = _round(u[f])
    return out


def compute(case: str, work_dir: Path | None = None) -> dict:
    """Run ``case`` in-process and return its golden record."""
    sys.path.insert(0, str(HERE))
    from conftest import compose_cfg  # noqa: E402  (tests/ helper: composes like the CLI)
    from kbframe.run.bench import run_bench

    bench, overrides = CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(work_dir or tmp)
        metrics = run_bench(compose_cfg(*overrides, "run.progress=false", bench=bench), out)
        digest = hashlib.sha256((out / "op_log.jsonl").read_bytes()).hexdigest()
    return {"case": case, "bench": bench, "overrides": list(overrides),
            "op_log_sha256": digest, "metrics": key_metrics(metrics)}


def path_of(case: str) -> Path:
    return GOLDENS / f"{case}.json"


def main(argv: list[str]) -> int:
    cases = argv or list(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {', '.join(CASES)}", file=sys.stderr)
        return 2
    GOLDENS.mkdir(exist_ok=True)
    for case in cases:
        rec = compute(case)
        p = path_of(case)
        old = json.loads(p.read_text()) if p.exists() else None
        p.write_text(json.dumps(rec, indent=2) + "\n")
        changed = "new" if old is None else ("unchanged" if old == rec else "CHANGED")
        print(f"{case:28s} {changed:9s} latency {rec['metrics']['sim.latency_ns']} ns  "
              f"op_log {rec['op_log_sha256'][:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
