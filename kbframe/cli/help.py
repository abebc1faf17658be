"""``python -m kbframe --help``: kbframe's own help (Hydra's generic one is ``--hydra-help``).

Built from what is installed, so it never goes stale: the benches in ``conf/bench/`` (each
with its workload and first comment line), the workloads in :mod:`kbframe.workloads` with
their keys (from their typed configs), the hardware and calibration choices, the named
sweeps, and the run options.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..run.schema import CalibrationConfig, RunConfig, workload_classes
from ..workloads.base import BenchConfig

CONF = Path(__file__).resolve().parents[1] / "conf"


def _first_comment(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


def _target(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("_target_:"):
            return line.split(":", 1)[1].split("#")[0].strip().rsplit(".", 1)[-1]
    return "?"


def _keys(cls, skip=()) -> str:
    """``bench.<key>`` names of a bench config dataclass (nested ones dotted), minus ``skip``."""
    names = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.name == "name":
            continue
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            names += [f"{f.name}.{g.name}" for g in dataclasses.fields(f.default_factory)]
        else:
            names.append(f.name)
    return ", ".join(f"bench.{n}" for n in names if n not in skip)


def text() -> str:
    """The help text."""
    benches = sorted((CONF / "bench").glob("*.yaml"))
    width = max(len(p.stem) for p in benches)
    lines = [
        "kbframe: simulate a kernel on accelerator PEs (SimPy), with dispatch cost, roofline and, in",
        "data mode, its numbers checked against a float64 reference.",
        "",
        "Usage:",
        "  python -m kbframe +bench=NAME [key=value ...]        one run into outputs/runs/<time>/",
        "  python -m kbframe -m +bench=A,B key=v1,v2 ...         a sweep (one job per combination)",
        "  python -m kbframe -m +sweep=NAME                       a named sweep (conf/sweep/)",
        "",
        "Benches (+bench=NAME):",
    ]
    lines += [f"  {p.stem:<{width}}  [{_target(p)}] {_first_comment(p)}" for p in benches]
    common = {"kernel", "dtype", "data", "data_dtype", "seed", "pe", "inputs.path"}
    lines += ["", "Keys of every bench: " + _keys(BenchConfig), "", "Workloads and their own keys:"]
    for name, cls in sorted(workload_classes().items()):
        lines.append(f"  {cls.__name__} (kbframe/workloads/{name}.py; unit of progress: {cls.unit})")
        lines.append(f"    {_keys(cls.Config, common)}")
    lines.append("")
    for group in ("hardware", "calibration", "energy", "model", "sweep", "search"):
        names = ", ".join(sorted(p.stem for p in (CONF / group).glob("*.yaml")))
        lines.append(f"{group.capitalize()} ({'+' if group in ('model', 'sweep', 'search') else ''}{group}=NAME): {names}")
    lines += [
        "  hardware keys: hardware.n_pes, hardware.clock_ghz, hardware.hbm_gbps, hardware.tcm_bytes,",
        "    hardware.units.<unit>.<param> (conf/hardware/default.yaml documents each)",
        "  calibration keys: " + ", ".join(f"calibration.{f.name}" for f in dataclasses.fields(CalibrationConfig)),
        "",
        "Run options: " + ", ".join(f"run.{f.name}={str(f.default).lower()}" for f in dataclasses.fields(RunConfig)),
        "  (run.check: the sanitizer; run.progress: the progress bar; run.trace: write trace.json;",
        "  run.fast_forward: on, off or verify, a repeating timing-only schedule written from short copies)",
        "",
        "Examples:",
        "  python -m kbframe +bench=decode_opt2 bench.tile=128 bench.data=false",
        "  python -m kbframe +bench=gemm_load_ref bench.M=1024 'bench.epilogue=[{op: bias}, {op: gelu}]'",
        "  python -m kbframe -m +bench=decode_opt2 bench.tile=32,64,128,256",
        "  python -m kbframe -m +search=decode_tile hydra.sweeper.n_trials=24   # Optuna (extra [optuna])",
        "",
        "More: README.md (a tour, the files a run writes, the guides in docs/), docs/workloads.md",
        "(every workload's keys, adding a workload or recipe), docs/sweeps.md, docs/errors.md (every",
        "error and its message), docs/DESIGN.md. Hydra's own help: --hydra-help.",
    ]
    return "\n".join(lines)
