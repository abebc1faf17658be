"""Goldens and determinism.

* Each case in ``tests/regen_goldens.py`` must reproduce its committed golden: the sha256
  of ``op_log.jsonl`` and the key metrics. A change shows as a table of the metrics that
  moved (and pytest's dict diff). Regenerate with ``.venv/bin/python tests/regen_goldens.py``.
* The same run in two processes with different ``PYTHONHASHSEED`` writes byte-identical
  ``op_log.jsonl`` and ``metrics.json`` apart from wall-clock fields (``sim.wall_s``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from regen_goldens import CASES, ERR_FACTOR, ERR_KEYS, compute, path_of

WALL_CLOCK = (("sim", "wall_s"),)


def _table(golden: dict, actual: dict) -> str:
    rows = [(k, golden.get(k, "—"), actual.get(k, "—")) for k in sorted(set(golden) | set(actual))
            if golden.get(k, "—") != actual.get(k, "—")]
    w = max([len(r[0]) for r in rows] + [6])
    lines = [f"{'metric':{w}s}  {'golden':>22s}  {'now':>22s}"]
    lines += [f"{k:{w}s}  {str(g):>22s}  {str(a):>22s}" for k, g, a in rows]
    return "\n".join(lines)


@pytest.mark.parametrize("case", list(CASES))
def test_golden(case):
    p = path_of(case)
    assert p.exists(), f"no golden {p}; create it with: .venv/bin/python tests/regen_goldens.py {case}"
    golden = json.loads(p.read_text())
    now = compute(case)
    g, a = dict(golden["metrics"]), dict(now["metrics"])
    for k in ERR_KEYS:  # BLAS summation order may differ between machines: accept a factor
        if g.get(k) is not None and a.get(k) is not None and g[k] > 0 and a[k] > 0:
            if 1 / ERR_FACTOR <= a[k] / g[k] <= ERR_FACTOR:
                a[k] = g[k]
        elif g.get(k) == 0 and a.get(k) is not None and a[k] < 1e-12:
            a[k] = g[k]
    msg = (f"golden '{case}' changed ({golden['bench']} {' '.join(golden['overrides'])}); "
           f"if intended, regenerate: .venv/bin/python tests/regen_goldens.py {case}\n" + _table(g, a))
    assert a == g, msg
    assert now["op_log_sha256"] == golden["op_log_sha256"], (
        f"op_log.jsonl of '{case}' changed although the key metrics did not; "
        f"regenerate if intended: .venv/bin/python tests/regen_goldens.py {case}")


def test_golden_diff_is_readable():
    """A changed calibration default would show as a table of the metrics that moved."""
    golden = json.loads(path_of("opt2_ragged").read_text())["metrics"]
    moved = dict(golden, **{"dispatch.cycles": golden["dispatch.cycles"] + 1.0})
    t = _table(golden, moved)
    assert "dispatch.cycles" in t and str(golden["dispatch.cycles"]) in t and len(t.splitlines()) == 2


def test_golden_catches_a_calibration_change():
    """Changing a calibration value (as a changed default would) moves the golden metrics."""
    from regen_goldens import key_metrics
    from conftest import compose_cfg
    from kbframe.run.bench import run_bench
    import tempfile
    from pathlib import Path
    bench, ov = CASES["opt2_ragged"]
    golden = json.loads(path_of("opt2_ragged").read_text())["metrics"]
    with tempfile.TemporaryDirectory() as tmp:
        m = key_metrics(run_bench(compose_cfg(*ov, "calibration.FIXED=41", "run.progress=false",
                                              bench=bench), Path(tmp)))
    assert m["dispatch.cycles"] != golden["dispatch.cycles"]
    assert m["sim.latency_ns"] != golden["sim.latency_ns"]


def _strip_wall(metrics: dict) -> dict:
    for path in WALL_CLOCK:
        d = metrics
        for p in path[:-1]:
            d = d[p]
        d.pop(path[-1])
    return metrics


def test_determinism_across_processes(tmp_path):
    """Two processes, different PYTHONHASHSEED: byte-identical op_log.jsonl, identical
    metrics.json apart from sim.wall_s, identical tensors."""
    runs = []
    procs = []
    for seed in ("0", "4242"):
        d = tmp_path / f"run_{seed}"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "kbframe", "+bench=decode_opt2", "bench.S_kv=300", "bench.d=64",
             "run.progress=false", f"hydra.run.dir={d}"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        runs.append(d)
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    a, b = runs
    assert (a / "op_log.jsonl").read_bytes() == (b / "op_log.jsonl").read_bytes()
    ma = json.loads((a / "metrics.json").read_text())
    mb = json.loads((b / "metrics.json").read_text())
    assert ma["sim"]["wall_s"] >= 0 and mb["sim"]["wall_s"] >= 0
    assert json.dumps(_strip_wall(ma)) == json.dumps(_strip_wall(mb))
    with np.load(a / "tensors.npz") as za, np.load(b / "tensors.npz") as zb:
        assert za.files == zb.files
        for k in za.files:
            assert np.array_equal(za[k], zb[k]), k
