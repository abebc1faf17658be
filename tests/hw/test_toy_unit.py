"""A new unit type is a class and a config entry (DESIGN.md decision 8): a toy vector unit
that serves role ``math`` replaces PE_MATH through config alone, and the roofline table,
the trace and the sanitizer see it by the role and label it declares."""
import json

import pytest

from kbframe.errors import SanitizerError
from kbframe.hw.pe_math import MathUnit, math_actions
from kbframe.hw.unit import Stage, Unit
from kbframe.report.roofline import table_lines
from kbframe.timebase import ns_to_ps

from conftest import read_oplog, run


class ToyVectorUnit(Unit):
    """A slow vector unit: 3 ns per stage plus 1 ns per 32 elements."""

    roles = ("math",)
    label = "toy vector"
    energy_keys = MathUnit.energy_keys  # its energy rule: PE_MATH's, by micro-op class
    energy_actions = math_actions
    tcm_traffic = MathUnit.tcm_traffic

    def __init__(self, description: str = "", roles=None, label=None):
        super().__init__(description, roles, label)

    def duration_ps(self, stage: Stage) -> int:
        return ns_to_ps(3 + -(-stage.n_elements // 32))


class OverlappingToy(ToyVectorUnit):
    """Breaks the FIFO rule on purpose: every stage starts when it arrives."""

    def reserve(self, now: int, stage: Stage) -> None:
        stage.t_start, stage.t_end = now, now + self.duration_ps(stage)
        self.busy_ps += stage.t_end - now


TOY = ("~hardware.units.math", "hardware.allow_external_targets=true", "bench.S_kv=128", "bench.data=false")


def test_a_toy_unit_serves_math_through_config_alone(tmp_path):
    m = run(tmp_path, *TOY, "+hardware.units.vec={_target_: test_toy_unit.ToyVectorUnit, description: toy}")
    log = read_oplog(tmp_path / "op_log.jsonl")
    units = {r["unit"] for r in log}
    assert "vec" in units and "math" not in units
    # the opt2 prologue's first MATH op (rmax of a (8, 64) tile): 3 + 512/32 = 19 ns
    rmax = next(r for r in log if r["unit"] == "vec" and r["op_kind"] == "rmax")
    assert rmax["t_end_ns"] - rmax["t_start_ns"] == 19.0
    assert m["units"]["vec"]["label"] == "toy vector"
    assert any(line.strip().startswith("toy vector") for line in table_lines(m))
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {ev["args"]["name"] for ev in trace["traceEvents"] if ev["name"] == "thread_name"}
    assert "toy vector" in names and "MATH" not in names
    assert m["sanitizer"]["rules_checked"] == 6


def test_the_sanitizer_checks_a_toy_unit_by_its_capacity(tmp_path):
    with pytest.raises(SanitizerError, match=r"^sanitizer: rule unit_capacity violated: PE0 vec: 2 stages in flight at once"):
        run(tmp_path, *TOY, "+hardware.units.vec={_target_: test_toy_unit.OverlappingToy, description: toy}")
