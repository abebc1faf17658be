"""The one checker of declared parameters (kbframe.params): the message shapes
docs/errors.md states, for typed config nodes and for a unit's untyped values."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pytest

from kbframe.params import Choice, ParamError, check, duration, param


class Mode(Choice):
    off = "off"
    on = "on"
    verify = "verify"


@dataclass
class P:
    n: int = param(1, lo=1, doc="a count")
    rate: float = param(1.0, lo=0, lo_open=True, doc="a rate")
    pes: int = param(1, lo=1, hi=8, doc="a bounded count")
    mode: Mode = param(Mode.on, choices=Mode, doc="a choice")
    wait_ns: float = duration(0.0, doc="a latency")
    opt: Optional[float] = param(None, lo=0, lo_open=True, doc="optional")


@pytest.mark.parametrize("values, msg", [
    ({"n": 0}, "x.n must be ≥ 1, got 0"),
    ({"rate": 0.0}, "x.rate must be a finite number > 0, got 0.0"),
    ({"rate": float("nan")}, "x.rate must be a finite number > 0, got nan"),
    ({"pes": 9}, "x.pes must be 1 to 8, got 9"),
    ({"mode": "maybe"}, "x.mode must be off, on or verify, got 'maybe'"),
    ({"mode": "False"}, "x.mode must be off, on or verify, got false (a boolean; write x.mode=off or =on)"),
    ({"wait_ns": 1e13}, "x.wait_ns must be below 1e+12 ns (the time base ends at 10^15 ps, 1000 s simulated), "
                        "got 1e+13"),
    ({"opt": -1.0}, "x.opt must be a finite number > 0, got -1.0"),
])
def test_typed_messages(values, msg):
    with pytest.raises(ParamError) as e:
        check(values, P, "x.")
    assert str(e.value) == msg


@pytest.mark.parametrize("values, msg", [
    ({"rate": "abc"}, "rate must be a finite number, got 'abc'"),
    ({"rate": 0}, "rate must be > 0, got 0"),
    ({"n": 2.5}, "n must be a whole number, got 2.5"),
    ({"mode": "lifo"}, "mode must be one of off, on, verify, got 'lifo'"),
    ({"wait_ns": -1}, "wait_ns must be ≥ 0, got -1"),
])
def test_untyped_messages(values, msg):
    with pytest.raises(ParamError) as e:
        check(values, P, "", typed=False)
    assert str(e.value) == msg


def test_values_are_converted_and_unset_optionals_pass():
    assert check({"n": 3.0, "rate": 2, "mode": Mode.verify, "opt": None}, P, "", typed=False) == \
        {"n": 3, "rate": 2.0, "mode": "verify", "opt": None}
