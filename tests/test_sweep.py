"""Hydra multirun sweeps end to end, each a real ``python -m kbframe -m ...`` in a
subprocess, timing-only on small shapes to stay quick:

- the six-job R sweep aggregates itself: sweep.csv (6 ok rows), the opt3/opt2 summary
  (dispatch ratio > 2, rising as R falls), a valid sweep.png;
- ``+sweep=r_sweep`` on the joblib launcher (2 workers) gives the same numbers;
- a job that fails on purpose: the others run, every job has status.json, the failed row
  carries its error, every failed job is listed at the end, the exit status is non-zero;
- submitit_local stands in for a cluster;
- two sweeps started together get their own directories;
- a single run that fails is one line and exit 1; Ctrl-C in a sweep leaves
  ``interrupted``, no metrics.json, exit 130, and a report by hand.
"""
import csv
import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

from conftest import REPO, cli

SIX = ["+bench=decode_opt2,decode_opt3", "calibration.R=0.25,0.0625,0.03125"]
# the bench is swept, so the sweep's root config has no bench node: other bench keys need ++
SMALL = ["++bench.S_kv=512", "++bench.data=false"]
RS = (0.25, 0.0625, 0.03125)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def by_bench_r(rows):
    return {(r["bench"], float(r["calibration.R"])): r for r in rows}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    d = tmp_path_factory.mktemp("serial") / "sweep"
    p = cli("-m", *SIX, *SMALL, f"hydra.sweep.dir={d}")
    return p, d


@pytest.fixture(scope="module")
def joblib_named(tmp_path_factory):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    d = tmp_path_factory.mktemp("joblib") / "sweep"
    p = cli("-m", "+sweep=r_sweep", *SMALL, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={d}")
    return p, d


def test_six_job_sweep_writes_csv_summary_and_plot(serial):
    p, d = serial
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_csv(d / "sweep.csv")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    for col in ("sim.latency_ns", "dispatch.cycles_per_tile", "dispatch.commands_per_tile",
                "numerics.max_abs_err", "roofline.fraction", "overrides", "error"):
        assert col in rows[0]
    assert sorted(r["job"] for r in rows) == [str(i) for i in range(6)]
    # every job directory: status ok, metrics, op_log and trace
    for r in rows:
        jd = d / r["job"]
        assert json.loads((jd / "status.json").read_text())["status"] == "ok"
        for f in ("metrics.json", "op_log.jsonl", "trace.json"):
            assert (jd / f).is_file()
    # opt3/opt2 dispatch ratio > 2 at every R and rising as R falls
    t = by_bench_r(rows)
    ratios = [float(t["decode_opt3", R]["dispatch.cycles_per_tile"]) /
              float(t["decode_opt2", R]["dispatch.cycles_per_tile"]) for R in RS]
    assert all(x > 2 for x in ratios) and ratios == sorted(ratios), ratios
    # the summary pairs them, printed and saved, R in numeric order
    summary = (d / "summary.md").read_text()
    assert summary in p.stdout
    assert "### decode_opt3 vs decode_opt2 (ratio = decode_opt3 / decode_opt2)" in summary
    pair_rows = [l for l in summary.splitlines() if l.startswith("|") and "×" in l]
    assert len(pair_rows) == 3
    for R, ratio, line in zip(RS[::-1], ratios[::-1], pair_rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert float(cells[0]) == R and cells[3] == f"{ratio:.2f}×"
        lat = float(t["decode_opt3", R]["sim.latency_ns"]) / float(t["decode_opt2", R]["sim.latency_ns"])
        assert cells[6] == f"{lat:.2f}×"
    w, h = png_size(d / "sweep.png")
    assert w > 300 and h > 200


def test_named_config_on_joblib_gives_the_same_numbers(serial, joblib_named):
    p, d = joblib_named
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_csv(d / "sweep.csv")
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    assert all("+sweep=r_sweep" in r["overrides"] for r in rows)
    a, b = by_bench_r(read_csv(serial[1] / "sweep.csv")), by_bench_r(rows)
    assert a.keys() == b.keys() == {(bn, R) for bn in ("decode_opt2", "decode_opt3") for R in RS}
    skip = {"job", "sim.wall_s", "overrides", "dir"}
    for key in a:
        assert {k: v for k, v in a[key].items() if k not in skip} == \
            {k: v for k, v in b[key].items() if k not in skip}, key


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_failing_job_does_not_stop_the_sweep(tmp_path, launcher):
    extra = []
    if launcher == "joblib":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
        extra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    d = tmp_path / "sweep"
    p = cli("-m", "+bench=decode_opt2", "bench.tile=64,0", "bench.S_kv=100,200", "bench.data=false",
            f"hydra.sweep.dir={d}", *extra)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    rows = read_csv(d / "sweep.csv")
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "failed"]
    listing = p.stderr.split("kbframe: 2 of 4 jobs not ok:\n")[1].splitlines()  # listed at the end
    assert len(listing) == 2
    for r, line in zip(rows[2:], listing):
        assert "bench.tile must be ≥ 1, got 0" in r["error"]
        assert line.startswith(f"  job {r['job']} [") and line.endswith(r["error"])
    assert all(r["error"] == "" and float(r["sim.latency_ns"]) > 0 for r in rows[:2])
    for i in range(4):
        st = json.loads((d / str(i) / "status.json").read_text())
        assert st["status"] == ("ok" if i < 2 else "failed") and st["num"] == i
    assert "not ok: 2 of 4 jobs" in (d / "summary.md").read_text()
    png_size(d / "sweep.png")


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    d = tmp_path / "sweep"
    p = cli("-m", "+bench=decode_opt2", "calibration.R=0.25,0.0625", "bench.S_kv=128", "bench.data=false",
            "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", f"hydra.sweep.dir={d}",
            timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_csv(d / "sweep.csv")
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert (d / ".submitit").is_dir()
    assert not [x.name for x in (d / ".submitit").iterdir() if "%" in x.name]  # no literal .submitit/%j
    assert float(rows[0]["dispatch.cycles_per_tile"]) > float(rows[1]["dispatch.cycles_per_tile"])


def test_two_sweeps_started_together_get_their_own_dirs(tmp_path):
    """Default hydra.sweep.dir (outputs/sweeps/<date>_<time>_<µs>) relative to the working
    directory; the report is switched off to keep this quick."""
    args = [sys.executable, "-m", "kbframe", "-m", "+bench=decode_opt2", "bench.S_kv=64", "bench.data=false",
            "run.check=false", "hydra.callbacks.sweep_report.enabled=false"]
    procs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    dirs = sorted((tmp_path / "outputs" / "sweeps").iterdir())
    assert len(dirs) == 2
    for d in dirs:
        assert (d / "multirun.yaml").is_file() and not (d / "sweep.csv").exists()
        assert json.loads((d / "0" / "status.json").read_text())["status"] == "ok"


def test_single_run_failure_is_one_line_with_status(tmp_path):
    p = cli("+bench=decode_opt2", "bench.tile=0", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == ["kbframe: error: bench.tile must be ≥ 1, got 0"]
    st = json.loads((tmp_path / "status.json").read_text())
    assert (st["status"], st["error_type"]) == ("failed", "ConfigError")
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.serial
def test_ctrl_c_in_a_sweep_leaves_interrupted_status_and_a_report_by_hand(tmp_path):
    """SIGINT while job 1 of 3 works: the sweep stops with status 130, job 1's status.json
    says interrupted and it has no metrics.json nor temporary files; the report by hand
    marks job 0 ok, job 1 interrupted, job 2 missing."""
    from kbframe.report import sweep as report
    d = tmp_path / "sweep"
    args = [sys.executable, "-m", "kbframe", "-m", "+bench=decode_opt3", "bench.S_kv=64,262144,64", "bench.d=16",
            "bench.G=1", "bench.data=false", "run.fast_forward=off", f"hydra.sweep.dir={d}"]  # job 1 takes seconds
    p = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not (d / "1" / "status.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        assert p.poll() is None, "the job finished before it could be interrupted"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err[-2000:]
    assert "kbframe: interrupted (job 1 [" in err and "Traceback" not in err
    assert f"python -m kbframe.report {d}" in err
    st = json.loads((d / "1" / "status.json").read_text())
    assert st["status"] == "interrupted" and st["finished"]
    assert not (d / "1" / "metrics.json").exists()
    assert not [f for f in os.listdir(d / "1") if f.endswith(".tmp")]
    assert not (d / "sweep.csv").exists()  # the callback never ran
    assert report.main([str(d)]) == 1
    assert [r["status"] for r in read_csv(d / "sweep.csv")] == ["ok", "interrupted", "missing"]


# ---------------------------------------------------------------- sweep faults

LONG_THEN_SHORT = ["+bench=decode_opt2", "bench.S_kv=131072,64,128,256", "run.progress=false"]


def _joblib_sweep(d, *extra):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    return subprocess.Popen([sys.executable, "-m", "kbframe", "-m", *LONG_THEN_SHORT, "hydra/launcher=joblib",
                             "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={d}", *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _job_pid(d, num, p, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st = json.loads((d / str(num) / "status.json").read_text())
            if st.get("status") == "running":
                return st["pid"]
        except (OSError, ValueError):
            pass
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    raise AssertionError("the job never started")


@pytest.mark.serial
def test_a_killed_joblib_worker_fails_its_job_only(tmp_path):
    """Class 14: SIGKILL (as the OOM killer) on the worker running job 0: job 0 is failed
    (killed by a signal), the other jobs run, the report is written, exit 1, no traceback."""
    d = tmp_path / "sweep"
    p = _joblib_sweep(d)
    try:
        pid = _job_pid(d, 0, p)
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        _, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 1 and "Traceback" not in err, err[-3000:]
    why = ("killed by a signal: its worker process ended abruptly (exit code SIGKILL(-9)), e.g. by the OOM "
           "killer or kill -9")
    assert f"kbframe: error (job 0 [+bench=decode_opt2 bench.S_kv=131072 run.progress=False]): {why}" in err
    assert [(r["job"], r["status"]) for r in read_csv(d / "sweep.csv")] == [
        ("0", "failed"), ("1", "ok"), ("2", "ok"), ("3", "ok")]
    st = json.loads((d / "0" / "status.json").read_text())
    assert (st["status"], st["error"], st["error_type"]) == ("failed", why, "Killed")
    assert sorted(os.listdir(d / "0")) == [".hydra", "status.json"]  # its temporaries removed


def _communicate_or_dump(p, timeout_s):
    """``p``'s stderr once it ends; if it does not end in time, every process of its group
    dumps its threads' stacks (faulthandler, SIGABRT) and the test fails showing them."""
    try:
        return p.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGABRT)
        _, err = p.communicate(timeout=60)
        raise AssertionError(f"the sweep did not end within {timeout_s} s of the signal; its stacks:\n{err}")


def _status(d, num):
    try:
        return json.loads((d / str(num) / "status.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


@pytest.mark.serial
def test_ctrl_c_on_a_joblib_sweep_is_one_line_per_job(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) on a joblib sweep:
    no joblib KeyboardInterrupt traceback, exit 130, job 0 interrupted. The signal is sent
    in one state only, whatever the machine's speed: the short jobs 1 to 3 have ended (their
    worker idles) and job 0, a timing-only run far longer than the test waits, is running
    its simulation."""
    d = tmp_path / "sweep"
    p = subprocess.Popen([sys.executable, "-m", "kbframe", "-m", "+bench=decode_opt2", "bench.S_kv=4194304,64,128,256",
                          "bench.data=false", "run.fast_forward=off", "run.check=false", "run.progress=false",
                          "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={d}"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        _job_pid(d, 0, p)
        deadline = time.monotonic() + 120
        while [_status(d, n) for n in (1, 2, 3)] != ["ok"] * 3:
            assert p.poll() is None and time.monotonic() < deadline, "the short jobs did not end"
            time.sleep(0.05)
        assert _status(d, 0) == "running"
        os.killpg(p.pid, signal.SIGINT)
        err = _communicate_or_dump(p, 60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.rstrip().endswith(f"kbframe: interrupted; summarise what finished with: python -m kbframe.report {d}")
    assert json.loads((d / "0" / "status.json").read_text())["status"] == "interrupted"


def test_a_sweep_dir_holding_another_sweep_is_refused_unless_reused(tmp_path):
    """Class 15: a second sweep into the same hydra.sweep.dir is refused before it writes
    anything; reused on purpose, its report lists its own jobs only (exit 0 although the
    earlier sweep had a failed job)."""
    d = tmp_path / "sweep"
    first = cli("-m", "+bench=decode_opt2", "bench.S_kv=64", "bench.tile=64,0,32", "bench.data=false",
                f"hydra.sweep.dir={d}")
    assert first.returncode == 1  # job 1 (tile=0) failed
    plan = (d / "multirun.yaml").read_bytes()
    second = cli("-m", "+bench=decode_opt2", "bench.S_kv=128", "bench.data=false", f"hydra.sweep.dir={d}")
    assert second.returncode == 1 and second.stdout.count("kbframe") == 0
    assert second.stderr.strip() == (
        f"kbframe: error: the sweep directory '{d}' holds another sweep's jobs (its job "
        f"directories); choose a new hydra.sweep.dir, or reuse it with hydra.callbacks.sweep_report.reuse_dir=true "
        f"(the report then lists this sweep's jobs only)")
    assert (d / "multirun.yaml").read_bytes() == plan
    third = cli("-m", "+bench=decode_opt2", "bench.S_kv=128", "bench.data=false", f"hydra.sweep.dir={d}",
                "hydra.callbacks.sweep_report.reuse_dir=true")
    assert third.returncode == 0, third.stderr[-2000:]
    rows = read_csv(d / "sweep.csv")
    assert [(r["job"], r["status"], r["shape.S_kv"]) for r in rows] == [("0", "ok", "128")]


# ---------------------------------------------------------------- SIGTERM on a sweep

@pytest.mark.parametrize("launcher", ["basic", "joblib"])
@pytest.mark.parametrize("to", ["process", "group"])
def test_sigterm_on_a_sweep_ends_every_job_and_says_how_to_summarise(tmp_path, launcher, to):
    """SIGTERM to the launching process alone (``kill PID``) or to its whole process group (a
    batch system's time limit) while job 0 runs: exit 143, no traceback; every job's
    status.json says ok or interrupted (none running), no job leaves a temporary; one
    line names the sweep directory and how to summarise it; every process of the sweep
    ends (no worker left, no loky leaked-semlock warning)."""
    from kbframe.files import TEMP_MARK
    extra = []
    if launcher == "joblib":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
        extra = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    d = tmp_path / "sweep"
    # job 0 simulates a million-token context in full (seconds): it is running when the signal comes
    p = subprocess.Popen([sys.executable, "-m", "kbframe", "-m", "+bench=decode_opt2", "bench.S_kv=1048576,64,128",
                          "bench.data=false", "run.fast_forward=off", "run.progress=false", f"hydra.sweep.dir={d}",
                          *extra], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        _job_pid(d, 0, p, timeout=120)
        (os.kill if to == "process" else os.killpg)(p.pid, signal.SIGTERM)
        err = _communicate_or_dump(p, 60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 143 and "Traceback" not in err and "leaked" not in err, err[-3000:]
    line = f"kbframe: terminated (SIGTERM); summarise what finished with: python -m kbframe.report {d}"
    assert err.splitlines()[-1] == line and sum(str(d) + "\n" in ln + "\n" for ln in err.splitlines()) == 1, err
    jobs = sorted(j for j in os.listdir(d) if (d / j).is_dir())
    assert jobs[0] == "0"
    for j in jobs:
        st = json.loads((d / j / "status.json").read_text())
        assert st["status"] in ("ok", "interrupted"), (j, st)
        assert not [f for f in os.listdir(d / j) if TEMP_MARK in f or f.endswith((".tmp", ".partial"))], j
    assert json.loads((d / "0" / "status.json").read_text())["status"] == "interrupted"
    deadline = time.monotonic() + 60  # the sweep's processes end (loky's resource tracker a moment later)
    while True:
        try:
            os.killpg(p.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a process of the sweep outlived it"
        time.sleep(0.05)


@pytest.mark.parametrize("command_line, twice", [
    (["++bench.tp=8"], ("bench.tp=2,4,8", "++bench.tp=8")),
    (["+bench.tp=8,16"], ("bench.tp=2,4,8", "+bench.tp=8,16")),
    (["+bench=decoder_layer", "bench.tp=8"], None),  # replaces the sweep config's values
    (["hardware=cube"], None),
    (["hardware.hbm_gbps=100", "++hardware.hbm_gbps=200"], ("hardware.hbm_gbps=100", "++hardware.hbm_gbps=200")),
    (["~bench.tp"], None),
    (["++bench.data=false"], None),  # the value the sweep config sets: every job runs it, as labelled
    (["++bench.data=true"], ("bench.data=false", "++bench.data=true")),
])
def test_a_key_a_grid_sweep_would_set_twice_in_every_job_is_found(command_line, twice):
    """The basic sweeper keeps one override per key as written: a sweep config's
    ``bench.tp=2,4,8`` and the command line's ``++bench.tp=8`` are two, and every job would
    run 8 under its label (the sweep is refused before it starts: docs/errors.md
    ``sweep_key_twice``); ``bench.tp=8`` replaces the values."""
    from omegaconf import OmegaConf
    from kbframe.report.sweep_jobs import sweep_overrides, twice_set
    hydra_cfg = OmegaConf.create({
        "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
                    "params": {"+bench": "decoder_layer", "hardware": "cube_mesh", "bench.tp": "2,4,8",
                               "bench.data": "false"}},
        "overrides": {"task": command_line}})
    got = twice_set(sweep_overrides(hydra_cfg))
    assert (None if got is None else tuple(o.input_line for o in got)) == twice
    hydra_cfg.sweeper._target_ = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweep_overrides(hydra_cfg) is None  # a search samples its own way
