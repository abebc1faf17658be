"""benchmarks/model_table.py: a step extrapolated from its one- and two-layer runs is the
simulated step (on a small model, exactly), and a step that does not fit is refused with
the GiB it needs and has."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO, run

sys.path.insert(0, str(REPO / "benchmarks"))
import model_table  # noqa: E402

SMALL = ("bench.H=64", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=96", "bench.S_kv=100", "bench.tp=8",
         "bench.data=false", "run.check=false", "run.trace=false")


def test_three_layers_from_one_and_two(tmp_path):
    """8 ranks spread over 2×2 cubes, as the table's ``cube_mesh`` rows (all-reduces across
    the die-to-die links)."""
    m = {n: run(tmp_path / str(n), "hardware=cube_mesh", "bench.placement=spread", *SMALL, f"bench.layers={n}",
                bench="decoder_layer") for n in (1, 2, 3)}
    for get in (lambda x: x["step"]["latency_ns"], lambda x: x["roofline"]["hbm_ns"]):
        assert model_table.extrapolate(get(m[1]), get(m[2]), 3) == get(m[3])
    assert model_table.extrapolate(m[1]["step"]["analytic_ns"], m[2]["step"]["analytic_ns"], 3) == \
        pytest.approx(m[3]["step"]["analytic_ns"], abs=0.01)  # analytic_ns is rounded to the ps


def test_a_step_that_does_not_fit_is_refused_with_its_gib():
    assert model_table.refusal("llama3_70b", "cube", 8192, 1) == "does not fit: 130 GiB needed, 64 GiB available"
    assert model_table.refusal("llama3_8b", "cube", 8192, 1) is None
