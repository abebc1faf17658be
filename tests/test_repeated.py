"""A model step held as its simulated records and the period of layers put back
(kbframe/repeated.py): its records, read a slice at a time, are those put back record by
record, and the analyses made from the period are the full run's."""
from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest

from conftest import compose_cfg
from kbframe.periodic_form import find_periodic
from kbframe.records import RecordTable
from kbframe.repeated import RepeatedTable
from kbframe.report import critical_path, trace
from kbframe.run import fastforward, phases, skipped
from kbframe.run.bench import validate
from kbframe.run.periodic import totals
from kbframe.run.simulate import simulate
from kbframe.sim.engine import build_units
from kbframe.sim.steady import Axis, Steady
from kbframe.sim.targets import resolve_kernel
from kbframe.sim.waits import WaitLog
from kbframe.tl.recipe import load_recipes

# Llama-3-8B's 32 layers on a cube at 1024 cached tokens: a period of 4 layers put back 4
# times; a layer's path is thousands of segments, so the path has no steady state
STEP = ("+model=llama3_8b", "hardware=cube", "bench.tp=8", "bench.S_kv=1024")


@pytest.fixture(scope="module")
def step():
    """``(cfg, workload, the run fast-forwarded: its Outcome)``."""
    cfg = compose_cfg(*STEP, "bench.data=false", "run.progress=false", "run.check=false", bench="decoder_layer")
    wl = validate(cfg)
    out = fastforward.run(cfg, wl, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), False,
                          build_units(cfg.hardware), False)
    return cfg, wl, out


def _made(cfg, wl, repeated: bool):
    """The step's one simulation with its layer and KV loops jumping, made."""
    steady = Steady([Axis("layers", wl.ff_periods, wl.ff_min_steps), Axis("S_kv", fastforward.PERIODS,
                                                                          fastforward.MIN_STEPS)], skipped.snapshot)
    sim = simulate(cfg, wl, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), None, None, False, False,
                   steady=steady)
    return skipped.make(sim, steady, totals(sim), repeated=repeated)


@pytest.mark.xdist_group("repeated_step")
def test_the_records_made_from_the_period_are_those_put_back(step):
    cfg, wl, _ = step
    held, whole = _made(cfg, wl, True), _made(cfg, wl, False)
    t = held.table
    assert isinstance(t, RepeatedTable) and (t.P, t.X) == (124896, 4) and len(t) == len(whole.table) == 999243
    rows = whole.table.array()
    assert np.array_equal(t.array(), rows)
    for lo, hi in ((0, 7), (t.x - 3, t.x + 5), (t.x + t.P - 2, t.x + 3 * t.P + 9), (t.end - 4, len(t) + 10)):
        assert np.array_equal(t.array(lo, hi), rows[lo:min(hi, len(t))])
    at = np.random.default_rng(0).integers(0, len(t), 5000)
    assert np.array_equal(t.rows_at(at), rows[at])
    assert t.text(t.end - 3, t.end + 3) == whole.table.text(t.end - 3, t.end + 3)
    assert bytes(t.buf) == bytes(whole.table.buf)
    assert held.tot == whole.tot and held.phases == whole.phases and held.latency_ps == whole.latency_ps
    with pytest.raises(TypeError, match="made, not grown"):
        t.extend(rows[:1])


@pytest.mark.xdist_group("repeated_step")
def test_the_critical_path_made_from_the_period_is_the_full_runs(step):
    cfg, wl, out = step
    t = out.sim.oplog.table
    assert isinstance(t, RepeatedTable)
    roles = {name: u.roles for name, u in out.sim.pe.stage_units.items()}
    res = critical_path.resources_from_roles(roles)
    made = critical_path.analyse(WaitLog(t.simulated()), wl.n_units(), wl.unit, res,
                                 critical_path.Repeat(t.x, t.P, t.X, t.dt))
    full = critical_path.analyse(WaitLog(RecordTable.of_rows(t.names, t.array())), wl.n_units(), wl.unit, res)
    assert made is not None and full.metrics["steady"] is False
    assert made.metrics == full.metrics
    assert made.segments == full.segments and made.records == full.records
    assert full.metrics["path"]["segments"] == len(full.segments) > 4 * 2048


def test_a_path_that_does_not_repeat_with_the_records_is_not_made_from_them():
    """A path whose segments over no period are the ones over the period before, moved,
    is not extended: the full run's records are analysed instead."""
    S = critical_path.Segment
    segs = [S(0, "run", 0, 10), S(1, "run", 10, 20), S(2, "run", 20, 35), S(3, "run", 35, 40)]
    assert critical_path.Repeat(x=3, P=1, X=5, dt=10).extend(segs) is None
    segs = [S(0, "run", 0, 10), S(1, "run", 10, 20), S(2, "run", 20, 30), S(3, "run", 30, 40)]
    full, look = critical_path.Repeat(x=3, P=1, X=2, dt=10).extend(segs)
    assert full == [S(0, "run", 0, 10), S(1, "run", 10, 20), S(2, "run", 20, 30), S(3, "run", 30, 40),
                    S(4, "run", 40, 50), S(5, "run", 50, 60)]
    assert look.tolist() == [0, 1, 2, 2, 2, 3]  # the simulated records they stand for


@pytest.mark.xdist_group("repeated_step")
def test_the_phases_made_from_the_period_are_the_full_runs(step):
    """Each phase's spans, busy times, critical-path time and the collectives' times, made
    from the simulated run's phases and records, are those of the full run's records."""
    _, wl, out = step
    t, sim = out.sim.oplog.table, out.sim
    roles = {name: u.roles for name, u in sim.pe.stage_units.items()}
    cp = critical_path.analyse(WaitLog(t.simulated()), wl.n_units(), wl.unit,
                               critical_path.resources_from_roles(roles), critical_path.Repeat(t.x, t.P, t.X, t.dt))
    made = phases.analyse(sim.phases, None, cp.segments, sim.latency_ps, roles, 800.0, 100.0,
                          repeated=phases.Repeated(t, *out.simulated))
    full = phases.analyse(sim.phases, phases._records(t), cp.segments, sim.latency_ps, roles, 800.0, 100.0)
    assert made == full
    assert len(made[0]["phases"]["layers_ns"]) == 32 and len(made[0]["collectives"]) == 64


@pytest.mark.xdist_group("repeated_step")
def test_the_op_log_form_found_with_fewer_periods_is_the_full_runs(step):
    """The periodic form found in the run with the period put back 3 times, its section of
    layers repeating the other period too, is the form found in the full run's records:
    the op_log written in it is the same text. That section runs less than a period past
    the periods put back (the last layer ends the step otherwise), and grows all the same."""
    _, _, out = step
    t = out.sim.oplog.table
    m = fastforward.FORM_PERIODS
    short = find_periodic(t.with_periods(m), out.period_records)
    at = t.x + m * t.P
    [section] = [s for s in short.sections if s.period == t.P]
    assert section.prefix + section.period <= at <= section.end < at + section.period
    made = fastforward._form(t, out.period_records)
    found = find_periodic(t, out.period_records)
    layers = [s for s in made.sections if s.period == t.P]
    assert t.X > m and len(layers) == 1 and layers[0].times == 7  # 28 of its 32 layers
    assert made.header() == found.header() == short.inserted(at, t.P, t.X - m).header()
    texts = []
    for form in (made, found):
        t.form, f = form, io.StringIO()
        t.write(f)
        texts.append(f.getvalue())
    assert texts[0] == texts[1] and texts[0].count("\n") < len(t) // 20


@pytest.mark.xdist_group("repeated_step")
def test_a_sections_left_out_spans_from_its_first_period_are_its_records(step):
    """Where every record's times move alike, the trace's spans of a section's left-out
    repetitions come from its first period; they are those its records give."""
    _, _, out = step
    t = out.sim.oplog.table
    pe_of = np.array(t.name_col(0), dtype=np.int64)
    checked = 0
    for s in fastforward._form(t, out.period_records).drawn():
        if s.times < 3 or s.period * s.times > 2_000_000:
            continue
        uneven = replace(s, shift={**s.shift, "t0": s.shift["t0"] + (np.arange(s.period) == 0)})  # read records
        assert trace._spans(t, pe_of, s) == trace._spans(t, pe_of, uneven)
        checked += 1
    assert checked > 20
