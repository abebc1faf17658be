"""Design-space search: objectives and constraints from config, Hydra's Optuna
sweeper, infeasible and failed trials, the report's best trial / Pareto front, the same
trials for the same seed, and one-line errors for a malformed search."""
import csv
import math

import pytest

from kbframe.cli import checks
from kbframe.errors import ConfigError
from kbframe.report.search import Search

from conftest import cli

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="the [optuna] extra is not installed")

METRICS = {"sim": {"latency_ns": 1000.0}, "tcm": {"peak_bytes": 300000}, "shape": {"tile": 64, "mapping": "x"}}


def _search(**kw):
    return Search.from_config({"objectives": ["sim.latency_ns"], **kw})


def test_objectives_and_constraints_are_evaluated_on_metrics():
    s = _search(constraints=["tcm.peak_bytes <= 262144", "shape.tile >= 32"])
    o = s.evaluate(METRICS)
    assert (o.values, o.feasible, o.violations) == (
        (1000.0,), False, ("tcm.peak_bytes 300000 violates tcm.peak_bytes <= 262144",))
    assert s.sweeper_value(o) == math.inf  # infeasible: the worst value, the search goes on
    assert s.sweeper_value(None) == math.inf  # failed
    ok = _search(constraints=["tcm.peak_bytes < 1_048_576"]).evaluate(METRICS)
    assert ok.feasible and _search().sweeper_value(ok) == 1000.0
    two = Search.from_config({"objectives": ["sim.latency_ns", "tcm.peak_bytes"], "directions": ["minimize", "maximize"]})
    assert two.sweeper_value(two.evaluate(METRICS)) == [1000.0, 300000.0]
    assert two.worst() == (math.inf, -math.inf)
    assert Search.from_config({"objectives": []}) is None and Search.from_config(None) is None


def test_the_front_keeps_the_non_dominated_points():
    s = Search.from_config({"objectives": ["sim.latency_ns", "tcm.peak_bytes"], "directions": ["minimize", "minimize"]})
    pts = [(10, 5), (8, 7), (12, 4), (11, 6), (8, 7), (9, 9)]
    assert s.front(pts) == [0, 1, 2, 4]  # (11, 6) and (9, 9) are dominated; ties stay
    assert _search().front([(3,), (1,), (2,), (1,)]) == [1, 3]


@pytest.mark.parametrize("node, message", [
    ({"objectives": ["sim.latncy_ns"]},
     "search.objectives[0]: 'sim.latncy_ns' is not a metric of metrics.json (e.g. sim.latency_ns, tcm.peak_bytes, "
     "critical_path.period_ns, dispatch.cycles_per_tile; README.md 'What each run writes')"),
    ({"objectives": ["sim.latency_ns"], "constraints": ["tcm.peek_bytes <= 5"]},
     "search.constraints[0]: 'tcm.peek_bytes' is not a metric of metrics.json (e.g. sim.latency_ns, tcm.peak_bytes, "
     "critical_path.period_ns, dispatch.cycles_per_tile; README.md 'What each run writes')"),
    ({"objectives": ["sim.latency_ns"], "constraints": ["tcm.peak_bytes =< 1M"]},
     "search.constraints[0]: cannot parse 'tcm.peak_bytes =< 1M'; write METRIC OP NUMBER with OP one of "
     "<=, <, >=, >, == (e.g. 'tcm.peak_bytes <= 1048576')"),
    ({"objectives": ["sim.latency_ns", "tcm.peak_bytes"], "directions": ["minimize"]},
     "search.directions: 2 objective(s) need 2 direction(s), each minimize or maximize; got ['minimize']"),
    ({"objectives": ["sim.latency_ns"], "directions": ["lowest"]},
     "search.directions: 1 objective(s) need 1 direction(s), each minimize or maximize; got ['lowest']"),
])
def test_a_malformed_search_is_one_line_naming_the_key(node, message):
    with pytest.raises(ConfigError) as e:
        Search.from_config(node)
    assert str(e.value) == message


def test_an_objective_missing_from_the_runs_metrics_names_it():
    with pytest.raises(ConfigError) as e:
        Search.from_config({"objectives": ["shape.S_kv"]}).evaluate(METRICS)
    assert str(e.value) == "search.objectives[0]: 'shape.S_kv' is not a number in this run's metrics.json (no such key)"
    with pytest.raises(ConfigError) as e:
        Search.from_config({"objectives": ["shape.mapping"]}).evaluate(METRICS)
    assert str(e.value) == "search.objectives[0]: 'shape.mapping' is not a number in this run's metrics.json (it holds 'x')"


def test_search_without_the_sweeper_installed_is_one_line(monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "hydra_plugins.hydra_optuna_sweeper" else real(name, *a))
    assert checks.precheck(["-m", "+search=decode_tile"]) == (
        "+search=decode_tile needs Hydra's Optuna sweeper, which is not installed: "
        "pip install -e '.[optuna]' (make installs it)")


def test_bad_search_on_the_command_line_writes_nothing(tmp_path):
    d = tmp_path / "sweep" / "search"
    p = cli("-m", "+search=decode_tile", 'search.constraints=["tcm.peak_bytes =< 5"]', f"hydra.sweep.dir={d}")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == ("kbframe: error: search.constraints[0]: cannot parse 'tcm.peak_bytes =< 5'; write METRIC OP "
                        "NUMBER with OP one of <=, <, >=, >, == (e.g. 'tcm.peak_bytes <= 1048576')\n")
    assert not d.exists()  # no trial, no file, no empty directory
    p = cli("-m", "+search=decode_tile", "hydra.sweeper.storage=sqlite:///x.db", f"hydra.sweep.dir={d}")
    assert p.returncode == 1 and p.stderr.startswith("kbframe: error: hydra.sweeper.storage: kbframe does not take this override")


SMALL = ("++bench.S_kv=1024", "hydra.sweeper.n_trials=6")


def _rows(d):
    with open(d / "sweep.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    d = tmp_path_factory.mktemp("search")
    runs = [cli("-m", "+search=decode_tile", *SMALL, f"hydra.sweep.dir={d / name}", timeout=300) for name in ("a", "b")]
    return runs, d


def test_a_search_names_its_best_feasible_trial(searched):
    (p, _), d = searched
    assert p.returncode == 0, p.stderr[-2000:]
    rows = _rows(d / "a")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    for r in rows:  # verdicts follow the TCM budget of conf/search/decode_tile.yaml
        assert r["search.verdict"] == ("feasible" if int(r["tcm.peak_bytes"]) <= 262144 else "infeasible")
    feasible = [r for r in rows if r["search.verdict"] == "feasible"]
    best = min(feasible, key=lambda r: float(r["sim.latency_ns"]))
    summary = (d / "a" / "summary.md").read_text()
    assert "### search: minimise sim.latency_ns subject to tcm.peak_bytes <= 262144" in summary
    assert f"best trial: job {best['job']} [" in summary
    assert f"]: sim.latency_ns {float(best['sim.latency_ns']):.10g}, tcm.peak_bytes {best['tcm.peak_bytes']}" in summary
    assert (d / "a" / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # opt2's design keys are sampled for opt2 only (search.when)
    for r in rows:
        assert ("bench.s_buffers" in r["overrides"]) == ("decode_opt2" in r["overrides"])


def test_the_same_seed_gives_the_same_trials(searched):
    (a, b), d = searched
    assert b.returncode == 0, b.stderr[-2000:]
    ra, rb = _rows(d / "a"), _rows(d / "b")
    assert [r["overrides"] for r in ra] == [r["overrides"] for r in rb]
    assert [r["sim.latency_ns"] for r in ra] == [r["sim.latency_ns"] for r in rb]


def test_failed_trials_do_not_stop_the_search(tmp_path):
    d = tmp_path / "s"
    p = cli("-m", "+search=decode_tile", "++bench.S_kv=0", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={d}", timeout=300)
    assert p.returncode == 1
    rows = _rows(d)
    assert [r["status"] for r in rows] == ["failed"] * 3
    assert all(r["search.verdict"] == "failed" for r in rows)
    summary = (d / "summary.md").read_text()
    assert "3 trials: 3 failed" in summary and "no feasible trial" in summary


def test_a_two_objective_search_reports_its_pareto_front(tmp_path):
    d = tmp_path / "mo"
    p = cli("-m", "+search=decode_tile", "++bench.S_kv=512", "hydra.sweeper.n_trials=6",
            "search.objectives=[sim.latency_ns,tcm.peak_bytes]", "search.directions=[minimize,minimize]",
            "search.constraints=[]", f"hydra.sweep.dir={d}", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = _rows(d)
    pts = {r["job"]: (float(r["sim.latency_ns"]), float(r["tcm.peak_bytes"])) for r in rows}
    front = [j for j, (l, b) in pts.items()
             if not any(l2 <= l and b2 <= b and (l2, b2) != (l, b) for l2, b2 in pts.values())]
    summary = (d / "summary.md").read_text()
    assert f"Pareto front: {len(front)} of 6 feasible trials" in summary
    listed = [line.split()[2] for line in summary.splitlines() if line.startswith("- job ")]
    assert listed == front
    assert (d / "pareto.png").is_file()


def test_every_metric_a_search_may_name_is_a_number_in_a_runs_metrics(tmp_path):
    """report/search.py METRICS is the list checked before any trial: each one is a number
    in a real metrics.json (decode_opt2, data mode: numerics too)."""
    from conftest import run
    from kbframe.report.search import METRICS
    m = run(tmp_path, "bench.S_kv=512")
    missing = [name for name in METRICS if not isinstance(Search.from_config({"objectives": [name]}).evaluate(m).values[0], float)]
    assert missing == []


def test_a_search_with_no_feasible_trial_exits_1_and_one_that_stopped_early_lists_its_missing_trials(tmp_path):
    d = tmp_path / "inf"
    p = cli("-m", "+search=decode_tile", "++bench.S_kv=512", "hydra.sweeper.n_trials=3",
            'search.constraints=["tcm.peak_bytes<=1000"]', f"hydra.sweep.dir={d}", timeout=300)
    assert p.returncode == 1 and p.stderr.strip().endswith("kbframe: no feasible trial in 3: every trial violates a constraint")
    assert ("no feasible trial: every finished trial violates a constraint; loosen the constraints or widen the search"
            in (d / "summary.md").read_text())
    import shutil
    from kbframe.report import sweep as report
    shutil.rmtree(d / "1")  # as if the search had stopped before trial 1
    rep = report.write_report(d, echo=False)
    assert [(j.num, j.status) for j in rep.jobs] == [(0, "ok"), (1, "missing"), (2, "ok")]
    assert rep.jobs[1].error == "never ran (the sweep ended before this trial)"


def _search_cfg(when: dict):
    """decode_tile's composed config (its hydra node too) with ``when`` added to search.when."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="kbframe.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["+search=decode_tile"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.search.when.update(when)
    return cfg


@pytest.mark.parametrize("when, message", [
    ({"+bench=decode_opt3": {"++bench.s_buffers": "choice(2, 3)"}},
     "search.when: ++bench.s_buffers is sampled from choice(2, 3, 4) in branch +bench=decode_opt2 and from "
     "choice(2, 3) in branch +bench=decode_opt3; Optuna keeps one value space per parameter for the whole search: "
     "give it the same values in both branches"),
    ({"++bench.tile=64": {"++bench.v_staging": "prefetch"}},  # a fixed value is a choice of one
     "search.when: ++bench.v_staging is sampled from choice(composite, prefetch) in branch +bench=decode_opt2 and "
     "from prefetch in branch ++bench.tile=64; Optuna keeps one value space per parameter for the whole search: "
     "give it the same values in both branches"),
    ({"+bench=decode_opt3": {"++bench.s_buffers": "interval(2, 4)"}},  # another kind of distribution
     "search.when: ++bench.s_buffers is sampled from choice(2, 3, 4) in branch +bench=decode_opt2 and from "
     "interval(2, 4) in branch +bench=decode_opt3; Optuna keeps one value space per parameter for the whole search: "
     "give it the same values in both branches"),
])
def test_a_parameter_in_two_when_branches_needs_one_value_space(when, message):
    """Optuna would stop the search with a traceback ('CategoricalDistribution does not
    support dynamic value space') at the trial that samples the second branch."""
    from kbframe.cli.search_space import check_sweep
    with pytest.raises(ConfigError) as e:
        check_sweep(_search_cfg(when))
    assert str(e.value) == message


def test_a_parameter_in_two_when_branches_with_the_same_values_is_taken():
    from kbframe.cli.search_space import check_sweep
    check_sweep(_search_cfg({"+bench=decode_opt3": {"++bench.s_buffers": "choice(2, 3, 4)", "++bench.x": "interval(1, 2)"},
                             "++bench.tile=64": {"++bench.x": "interval(1, 8)"}}))  # a range may differ
