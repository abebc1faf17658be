"""Objectives and constraints of a design-space search, read from the config's
``search`` section and evaluated on a run's ``metrics.json``.

A search names its objectives as ``metrics.json`` paths, each minimised or maximised, and
its constraints as ``METRIC OP NUMBER`` lines::

    search:
      objectives: [sim.latency_ns, tcm.peak_bytes]
      directions: [minimize, minimize]
      constraints: ["tcm.peak_bytes <= 1048576"]

A run that violates a constraint, or fails, is *infeasible*: the sweeper gets the worst
value of each objective (+inf when minimised, -inf when maximised), so the search goes on
and its sampler learns to avoid the region; the report marks the trial infeasible and
leaves it out of the best trial and the Pareto front.

The run (``kbframe.cli.main``) and the sweep report (``kbframe.report.sweep``) both use
this module; it reads metrics only.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from ..errors import ConfigError
from .sweep_jobs import dig

#: metrics.json names every run has (README.md "What each run writes"); a search may name these or any
#: other number a run's metrics.json holds (shape.*, units.*, critical_path.*), which is
#: checked when the run ends
METRICS = (
    "sim.latency_ns", "sim.events", "sim.stages", "sim.wall_s",
    "dispatch.commands", "dispatch.cycles", "dispatch.n_units", "dispatch.commands_per_tile",
    "dispatch.cycles_per_tile",
    "roofline.bound_ns", "roofline.fraction", "roofline.hbm_ns", "roofline.compute_ns", "roofline.dispatch_ns",
    "roofline.hbm_bytes", "roofline.flops",
    "tcm.peak_bytes", "tcm.high_water_bytes", "tcm.capacity_bytes",
    "critical_path.ns_per_unit", "critical_path.period_ns", "critical_path.units_per_period",
    "calibration.FIXED", "calibration.R",
    "energy.total_pj", "energy.dynamic_pj", "energy.static_pj", "energy.per_unit_pj", "energy.avg_power_w",
    "energy.edp",
)
#: sections whose names depend on the workload, the hardware and the mode (numerics: data
#: mode only): a name under one is checked when each run ends
OPEN_SECTIONS = ("shape", "units", "critical_path", "numerics")

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|<|>)\s*([-+]?(?:\d+(?:_\d+)*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_DIRECTIONS = ("minimize", "maximize")


def _as_list(v, where: str) -> list:
    """``v`` as a list: None → [], a string → [it], a list as it is; anything else is an
    error naming ``where``."""
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)) or (hasattr(v, "__iter__") and not hasattr(v, "keys")):
        return list(v)
    raise ConfigError(f"{where}: a list (or one text), not {v!r}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_name(name, where: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: {name!r} is not a metric name (a metrics.json path such as sim.latency_ns)")
    section, dot, rest = name.partition(".")
    if name not in METRICS and not (section in OPEN_SECTIONS and dot and rest):
        raise ConfigError(f"{where}: '{name}' is not a metric of metrics.json (e.g. sim.latency_ns, "
                          f"tcm.peak_bytes, critical_path.period_ns, dispatch.cycles_per_tile; README.md 'What each run writes')")
    return name


@dataclass(frozen=True)
class Constraint:
    """``metric op limit``, e.g. ``tcm.peak_bytes <= 1048576``."""

    metric: str
    op: str
    limit: float

    @classmethod
    def parse(cls, text, where: str) -> "Constraint":
        """Raises ConfigError naming ``where`` (``search.constraints[0]``) when ``text`` is
        not ``METRIC OP NUMBER`` or names no metric."""
        m = _CONSTRAINT.match(text) if isinstance(text, str) else None
        if m is None:
            raise ConfigError(f"{where}: cannot parse {text!r}; write METRIC OP NUMBER with OP one of "
                              f"<=, <, >=, >, == (e.g. 'tcm.peak_bytes <= 1048576')")
        limit = float(m[3].replace("_", ""))
        if not math.isfinite(limit):
            raise ConfigError(f"{where}: the limit in {text!r} is not a finite number")
        return cls(_check_name(m[1], where), m[2], limit)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.limit:.10g}"

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.limit)


@dataclass(frozen=True)
class Outcome:
    """A run's objective values, its constrained metrics' values (one per constraint) and
    whether it met every constraint."""

    values: tuple
    feasible: bool
    violations: tuple  # "tcm.peak_bytes 307584 violates tcm.peak_bytes <= 262144"
    constrained: tuple = ()


@dataclass(frozen=True)
class Search:
    """The ``search`` config section, checked."""

    objectives: tuple
    directions: tuple
    constraints: tuple

    @classmethod
    def from_config(cls, node) -> "Search | None":
        """None when ``node`` is absent or names no objectives. Raises ConfigError (one line
        naming the key) for a malformed section."""
        if node is None:
            return None
        if not hasattr(node, "get"):
            raise ConfigError(f"search: a section with objectives, directions and constraints, not {node!r}")
        objectives = _as_list(node.get("objectives", None), "search.objectives")
        if not objectives:
            return None
        objectives = tuple(_check_name(o, f"search.objectives[{i}]") for i, o in enumerate(objectives))
        directions = node.get("directions", None)
        directions = ["minimize"] * len(objectives) if directions is None else _as_list(directions, "search.directions")
        if len(directions) != len(objectives) or any(d not in _DIRECTIONS for d in directions):
            raise ConfigError(f"search.directions: {len(objectives)} objective(s) need {len(objectives)} "
                              f"direction(s), each minimize or maximize; got {list(directions)}")
        constraints = _as_list(node.get("constraints", None), "search.constraints")
        return cls(objectives, tuple(directions),
                   tuple(Constraint.parse(c, f"search.constraints[{i}]") for i, c in enumerate(constraints)))

    def worst(self) -> tuple:
        """What an infeasible or failed trial reports: the worst value of each objective."""
        return tuple(math.inf if d == "minimize" else -math.inf for d in self.directions)

    def evaluate(self, metrics: dict) -> Outcome:
        """The objectives' values in ``metrics`` and the constraints' verdict. Raises
        ConfigError naming the key when an objective or constraint names no number there."""
        def value(name, where):
            v = dig(metrics, name)
            if not _is_number(v):
                raise ConfigError(f"{where}: '{name}' is not a number in this run's metrics.json "
                                  f"({'it holds ' + repr(v) if v is not None else 'no such key'})")
            return float(v)
        values = tuple(value(o, f"search.objectives[{i}]") for i, o in enumerate(self.objectives))
        constrained = tuple(value(c.metric, f"search.constraints[{i}]") for i, c in enumerate(self.constraints))
        bad = tuple(f"{c.metric} {v:.10g} violates {c}" for c, v in zip(self.constraints, constrained)
                    if not c.holds(v))
        return Outcome(values, not bad, bad, constrained)

    def sweeper_value(self, outcome: Outcome | None):
        """The job's return value for Hydra's Optuna sweeper: a float for one objective, a
        list for several; the worst values when ``outcome`` is None (failed) or infeasible."""
        vals = outcome.values if outcome is not None and outcome.feasible else self.worst()
        return float(vals[0]) if len(vals) == 1 else [float(v) for v in vals]

    def describe(self) -> str:
        goal = ", ".join(f"{'minimise' if d == 'minimize' else 'maximise'} {o}"
                         for o, d in zip(self.objectives, self.directions))
        return goal + (f" subject to {'; '.join(str(c) for c in self.constraints)}" if self.constraints else "")

    def dominates(self, a: tuple, b: tuple) -> bool:
        """``a`` is no worse than ``b`` in every objective and better in one."""
        sign = [1 if d == "minimize" else -1 for d in self.directions]
        aa = [s * x for s, x in zip(sign, a)]
        bb = [s * x for s, x in zip(sign, b)]
        return all(x <= y for x, y in zip(aa, bb)) and any(x < y for x, y in zip(aa, bb))

    def front(self, points: list) -> list:
        """Indices of the non-dominated points (the Pareto front), in the given order;
        for one objective, every point holding the best value."""
        return [i for i, p in enumerate(points)
                if not any(self.dominates(q, p) for j, q in enumerate(points) if j != i)]
