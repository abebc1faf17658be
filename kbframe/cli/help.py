"""``python -m kbframe --help``: kbframe's own help (Hydra's generic one is ``--hydra-help``),
and ``docs/parameters.md`` (``python -m kbframe.cli.help --markdown > docs/parameters.md``).

Built from what is installed, so it never goes stale: the benches in ``conf/bench/`` (each
with its workload and first comment line), the config groups and named sweeps, and every
parameter (run, calibration, hardware, each unit class, every bench and each workload's own
keys) with its type, unit, range, default and description, from its one declaration
(kbframe.params: the schemas of kbframe.run.schema, the units' ``Params``, the workloads'
``Config``).
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import sys
from enum import Enum
from pathlib import Path

from omegaconf import MISSING

from .. import params
from ..hw.unit import PeUnit
from ..run.schema import CalibrationConfig, HardwareConfig, RunConfig, workload_classes
from ..workloads.base import BenchConfig

CONF = Path(__file__).resolve().parents[1] / "conf"


def _first_comment(path: Path) -> str:
    """The first sentence of a config's opening comment (it may run over several lines; an
    indented line, a command example, ends it)."""
    words = []
    for line in path.read_text().splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("#") or line.startswith("#   "):
            if words:
                break
            continue
        words.append(line.lstrip("# ").strip())
    text = " ".join(words)
    end = re.search(r"\.(\s|$)", text)
    return text[:end.start() + 1] if end else text


def _target(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("_target_:"):
            return line.split(":", 1)[1].split("#")[0].strip().rsplit(".", 1)[-1]
    return "?"


def benches_with(key: str) -> list[str]:
    """The benches (``conf/bench/``) whose workload's config declares ``key`` (``model``:
    those a ``+model=`` preset can set)."""
    takes = {cls.__name__ for cls in workload_classes().values()
             if key in {f.name for f in dataclasses.fields(cls.Config)}}
    return [p.stem for p in sorted((CONF / "bench").glob("*.yaml")) if _target(p) in takes]


def unit_classes() -> dict:
    """Every unit class of :mod:`kbframe.hw` that declares parameters, ``{dotted name: class}``."""
    from .. import hw
    found = {}
    for info in pkgutil.iter_modules(hw.__path__):
        mod = importlib.import_module(f"{hw.__name__}.{info.name}")
        for obj in vars(mod).values():
            if isinstance(obj, type) and issubclass(obj, PeUnit) and obj.__module__ == mod.__name__ \
                    and obj.__dict__.get("Params") is not None:
                found[f"{mod.__name__}.{obj.__name__}"] = obj
    return dict(sorted(found.items()))


def _default(value) -> str:
    if value is MISSING:
        return "required"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _rows(cls, prefix: str) -> list:
    """``[(key, type, unit, allowed, default, description)]`` of a dataclass's declared
    parameters (a nested config's dotted)."""
    rows = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            rows += _rows(f.default_factory, f"{prefix}{f.name}.")
    for name, kind, spec, default in params.declared(cls):
        if spec.choices:
            kind_text, allowed = "choice", " | ".join(spec.names())
        else:
            kind_text = getattr(kind, "__name__", "any") if kind in (int, float, bool, str) else "any"
            allowed = spec.range_text()
            if spec.time_base:
                allowed += " and < 1e12 (the time base)"
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        if field.default is not dataclasses.MISSING:
            default = _default(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = _default(field.default_factory())
        else:
            default = "required"
        rows.append((f"{prefix}{name}", kind_text, spec.unit, allowed, default, spec.doc))
    return rows


def sections() -> list:
    """``[(title, note, rows)]``: every parameter, from its declaration, in reading order."""
    out = [("Run options", "conf/config.yaml; kbframe.run.schema.RunConfig", _rows(RunConfig, "run.")),
           ("Calibration", "calibration=NAME, conf/calibration/; kbframe.run.schema.CalibrationConfig",
            _rows(CalibrationConfig, "calibration.")),
           ("Hardware", "hardware=NAME, conf/hardware/; kbframe.run.schema.HardwareConfig",
            _rows(HardwareConfig, "hardware."))]
    for dotted, cls in unit_classes().items():
        out.append((f"Unit {cls.__name__}", f"hardware.units.<unit> with _target_: {dotted}; "
                    f"{cls.Params.__module__}.{cls.Params.__name__}", _rows(cls.Params, "hardware.units.<unit>.")))
    common = _rows(BenchConfig, "bench.")
    out.append(("Every bench", "+bench=NAME, conf/bench/; kbframe.workloads.base.BenchConfig", common))
    for name, cls in sorted(workload_classes().items()):  # each workload's own keys (and changed defaults)
        out.append((f"Workload {cls.__name__}", f"kbframe/workloads/{name}.py; unit of progress: {cls.unit}",
                    [r for r in _rows(cls.Config, "bench.") if r not in common]))
    return out


def _range_default(row) -> str:
    _, kind, unit, allowed, default, _ = row
    bits = [kind + (f", {unit}" if unit else "")]
    if allowed:
        bits.append(allowed)
    bits.append(f"default {default}")
    return "; ".join(bits)


def parameter_lines() -> list:
    """The parameters for ``--help``: per section, each key with its type, unit, range,
    default and description."""
    lines = []
    for title, note, rows in sections():
        if not rows:
            continue
        lines.append(f"{title} ({note}):")
        for row in rows:
            lines.append(f"  {row[0]}  [{_range_default(row)}]")
            lines.append(f"      {row[5]}")
    return lines


def markdown() -> str:
    """``docs/parameters.md``: every parameter, generated from its declaration."""
    lines = ["# Parameters", "",
             "Every run, calibration, hardware, unit and bench parameter: its type, unit, allowed values, "
             "default and description.",
             "Generated from the declarations (kbframe.params: kbframe/run/schema.py, each unit class's `Params`, "
             "each workload's `Config`)",
             "by `python -m kbframe.cli.help --markdown > docs/parameters.md`; a test checks this file is that "
             "text. A value outside",
             "its declaration is refused before anything runs, naming the key ([errors.md](errors.md)).", ""]
    for title, note, rows in sections():
        if not rows:
            continue
        lines += [f"## {title}", "", f"{note}.", "", "| key | type | unit | allowed | default | description |",
                  "|---|---|---|---|---|---|"]
        for key, kind, unit, allowed, default, doc in rows:
            cells = [f"`{key}`", kind, unit, allowed, f"`{default}`", doc]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


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
    lines.append("")
    for group in ("hardware", "calibration", "energy", "model", "sweep", "search"):
        names = ", ".join(sorted(p.stem for p in (CONF / group).glob("*.yaml")))
        lines.append(f"{group.capitalize()} ({'+' if group in ('model', 'sweep', 'search') else ''}{group}=NAME): {names}")
    lines += ["", "Parameters [type, unit; allowed values; default] (docs/parameters.md has them as tables):", ""]
    lines += parameter_lines()
    lines += [
        "",
        "Examples:",
        "  python -m kbframe +bench=decode_opt2 bench.tile=128 bench.data=false",
        "  python -m kbframe +bench=gemm_load_ref bench.M=1024 'bench.epilogue=[{op: bias}, {op: gelu}]'",
        "  python -m kbframe -m +bench=decode_opt2 bench.tile=32,64,128,256",
        "  python -m kbframe -m +search=decode_tile hydra.sweeper.n_trials=24   # Optuna (extra [optuna])",
        "",
        "More: README.md (a tour, the files a run writes, the guides in docs/), docs/parameters.md",
        "(every parameter), docs/workloads.md (every workload, adding a workload or recipe),",
        "docs/sweeps.md, docs/errors.md (every error and its message), docs/DESIGN.md. Hydra's own",
        "help: --hydra-help.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write((markdown() if "--markdown" in sys.argv[1:] else text()) + "\n")
