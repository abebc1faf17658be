"""Sweep aggregation by hand (``python -m kbframe.report DIR``) on an interrupted sweep with
ok, failed, missing and never-finished jobs; status.json outcomes of kbframe.run.jobstatus;
metrics.json is never half-written (README "Failure isolation")."""
import csv
import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kbframe import files

from kbframe.report import sweep as report

from kbframe.report import sweep_jobs
from kbframe.files import write_json as write_json_atomic
from kbframe.run.bench import run_bench
from kbframe.errors import ConfigError
from kbframe.files import read_status
from kbframe.run.jobstatus import EXIT_INTERRUPTED, JobStatus

from conftest import compose_cfg

TASK = ["+bench=decode_opt2,decode_opt3", "calibration.R=0.25,0.0625", "bench.tile=64,0",
        "bench.S_kv=128", "bench.data=false", "run.progress=false", "run.check=false"]
BASIC = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _plan():
    """Hydra's basic-sweeper order: the first key varies slowest (values as Hydra writes
    them into each job's overrides.yaml: ``bench.data=False``)."""
    return [[f"+bench={b}", f"calibration.R={r}", f"bench.tile={t}", "bench.S_kv=128", "bench.data=False",
             "run.progress=False", "run.check=False"]
            for b in ("decode_opt2", "decode_opt3") for r in ("0.25", "0.0625") for t in ("64", "0")]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A sweep directory as an interrupted run leaves it: jobs 0, 4 ok; 1, 3, 5, 7 failed
    (bench.tile=0); job 2 started and never finished (status running); job 6 never ran."""
    d = tmp_path_factory.mktemp("sweep")
    OmegaConf.save(OmegaConf.create({"hydra": {"sweeper": {"_target_": BASIC, "max_batch_size": None,
                                                           "params": None},
                                               "overrides": {"task": TASK}}}), d / "multirun.yaml")
    assert sweep_jobs.sweep_plan(d) == _plan()
    for num, ov in enumerate(_plan()):
        if num == 6:
            continue
        jd = d / str(num)
        (jd / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(ov), jd / ".hydra" / "overrides.yaml")
        cfg = compose_cfg(*ov, bench=None)
        OmegaConf.save(cfg, jd / ".hydra" / "config.yaml")
        if num == 2:
            JobStatus(jd, True, {"num": num, "overrides": ov}).__enter__()  # killed: never finishes
            continue
        with JobStatus(jd, True, {"num": num, "overrides": ov}):
            run_bench(cfg, jd)
    return d


def _rows(d):
    with open(d / "sweep.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_report_by_hand_marks_failed_missing_and_unfinished_jobs(sweep, tmp_path, capsys):
    d = tmp_path / "copy"
    shutil.copytree(sweep, d)
    with files.dir_lock(d / "2"):  # job 2 still running: its process holds its directory
        assert report.main([str(d)]) == 1
    out = capsys.readouterr()
    rows = _rows(d)
    assert [r["job"] for r in rows] == [str(i) for i in range(8)]
    assert [r["status"] for r in rows] == ["ok", "failed", "running", "failed",
                                           "ok", "failed", "missing", "failed"]
    for r in rows:
        assert r["overrides"].split() == _plan()[int(r["job"])]
        assert r["bench"] in ("decode_opt2", "decode_opt3") and float(r["calibration.R"]) in (0.25, 0.0625)
        if r["status"] == "failed":
            assert "bench.tile must be ≥ 1, got 0" in r["error"]
            assert r["shape.tile"] == "0" and r["sim.latency_ns"] == ""
        if r["status"] == "ok":
            assert float(r["dispatch.cycles_per_tile"]) > 0 and r["error"] == ""
    assert rows[6]["dir"] == "" and "never ran" in rows[6]["error"]
    # printed and saved summary: pairs where both finished, markers where not, the list
    text = (d / "summary.md").read_text()
    assert text in out.out
    assert "6 not ok" not in text and "not ok: 6 of 8 jobs" in text
    pair = {(c[0], c[1]): c for c in ([x.strip() for x in l.strip("|").split("|")]
                                       for l in text.split("### decode_opt3 vs decode_opt2 (ratio = decode_opt3 / decode_opt2)")[1]
                                       .split("###")[0].splitlines()
                                       if l.startswith("|"))}
    # one row per setting of the other swept keys, in numeric order
    assert list(pair) == [("calibration.R", "bench.tile"), ("--------------:", "-----------:"), ("0.0625", "0"), ("0.0625", "64"), ("0.25", "0"), ("0.25", "64")]
    assert pair["0.25", "64"][2:] == ["783.0", "307.5", "2.55×", "1653.0", "1040.5", "1.59×"]  # both ok: ratios
    assert pair["0.0625", "64"][2:5] == ["missing", "running", "-"]
    assert pair["0.25", "0"][2:5] == ["failed", "failed", "-"]
    for num in (1, 2, 3, 5, 6, 7):
        assert f"- job {num} [" in text
    assert "6 of 8 jobs not ok" in out.err
    assert (d / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_a_running_job_whose_process_died_is_failed(sweep, tmp_path):
    """status.json says running, but no process holds the job's directory (a live run
    holds its lock until it ends): it was killed without a word (SIGKILL, the OOM killer)."""
    d = tmp_path / "dead"
    shutil.copytree(sweep, d)
    report.main([str(d)])
    row = _rows(d)[2]
    assert (row["status"], row["error"]) == (
        "failed", "started, never finished: its process ended without a word (killed by a signal?)")


def test_report_of_a_complete_pair(sweep):
    jobs = sweep_jobs.collect(sweep)
    comps = report.comparisons(jobs)
    assert [(c["bench"], c["base"], c["setting"]) for c in comps] == [
        ("decode_opt3", "decode_opt2", {"calibration.R": R, "bench.tile": t}) for R in (0.0625, 0.25) for t in (0, 64)]
    ok = [c for c in comps if c["dispatch_ratio"] is not None]
    assert len(ok) == 1 and ok[0]["setting"]["calibration.R"] == 0.25
    j3, j2 = ok[0]["job"], ok[0]["base_job"]
    assert ok[0]["dispatch_ratio"] == pytest.approx(j3.get("dispatch.cycles_per_tile") / j2.get("dispatch.cycles_per_tile"))
    assert ok[0]["dispatch_ratio"] > 2
    assert ok[0]["latency_ratio"] == pytest.approx(j3.get("sim.latency_ns") / j2.get("sim.latency_ns"))


def test_report_without_plan_uses_the_job_dirs(sweep, tmp_path):
    d = tmp_path / "noplan"
    shutil.copytree(sweep, d)
    (d / "multirun.yaml").unlink()
    jobs = report.write_report(d, echo=False).jobs
    assert [j.num for j in jobs] == [0, 1, 2, 3, 4, 5, 7]  # job 6 cannot be known


def test_report_refuses_a_directory_that_is_no_sweep(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


def test_report_refuses_a_folder_of_single_runs_or_of_sweeps_and_writes_nothing_there(sweep, tmp_path, capsys):
    """A folder of single runs (``outputs/runs``: job folders Hydra made in RUN mode) or one
    that holds a sweep (``outputs``) is no sweep directory: exit 2, one line, and no report
    is written into it; a sweep's own directory still is one."""
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name / ".hydra").mkdir(parents=True)
        (runs / name / ".hydra" / "overrides.yaml").write_text("- +bench=decode_opt2\n")
        (runs / name / ".hydra" / "hydra.yaml").write_text("hydra:\n  mode: RUN\n")
    outputs = tmp_path / "outputs"
    shutil.copytree(sweep, outputs / "sweeps" / "s1")
    for d in (runs, outputs):
        assert report.main([str(d)]) == 2
        assert capsys.readouterr().err == (
            f"kbframe: error: '{d}' is not a sweep directory (no multirun.yaml, and no job folders a sweep made in it: "
            f".hydra/hydra.yaml with mode MULTIRUN); give one sweep's directory\n")
        assert not any((d / name).exists() for name in ("sweep.csv", "summary.md", "sweep.png"))
    assert sweep_jobs.is_sweep_dir(outputs / "sweeps" / "s1")
    for name in ("a", "b"):  # a search's trials (Hydra's Optuna sweeper writes no multirun.yaml)
        (runs / name / ".hydra" / "hydra.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    assert sweep_jobs.is_sweep_dir(runs)


def test_report_without_a_directory_takes_the_sweep_that_started_last(sweep, tmp_path, monkeypatch):
    """``python -m kbframe.report`` alone reports the sweep under outputs/sweeps/ that started
    last (its multirun.yaml), not the one whose report was rewritten last."""
    import os
    monkeypatch.chdir(tmp_path)
    old, new = tmp_path / "outputs" / "sweeps" / "old", tmp_path / "outputs" / "sweeps" / "new"
    for d, t in ((old, 1_000_000), (new, 2_000_000)):
        shutil.copytree(sweep, d)
        os.utime(d / "multirun.yaml", (t, t))
    os.utime(old, (3_000_000, 3_000_000))  # a report written into the older sweep later
    assert report._newest_sweep() == Path("outputs/sweeps/new")


def test_report_that_cannot_be_written_exits_2(sweep, tmp_path, capsys):
    """Exit 2 (no report can be made) with one line, never a traceback
    or 1 (which means a job is not ok); nothing is half-written."""
    d = tmp_path / "blocked"
    shutil.copytree(sweep, d)
    for name in ("sweep.csv", "summary.md", "sweep.png"):
        (d / name).unlink(missing_ok=True)
    (d / "sweep.csv").mkdir()
    capsys.readouterr()
    assert report.main([str(d)]) == 2
    assert capsys.readouterr().err == (f"kbframe: error: cannot write '{d / 'sweep.csv'}': something that is "
                                       f"not a file is in its place\n")
    assert not (d / "summary.md").exists() and not (d / "sweep.png").exists()


def test_a_report_on_a_full_disk_names_the_file_it_could_not_write(sweep, tmp_path, capsys):
    """Exit 2 with one line naming the report file the full disk refused (a write's own
    error names no file); nothing is left half-written."""
    import os
    from conftest import fill_disk, tmpfs
    with tmpfs(tmp_path / "disk", "size=300k") as disk:
        d = disk / "sweep"
        shutil.copytree(sweep, d, ignore=shutil.ignore_patterns("*.png", "sweep.csv", "summary.md", "op_log.jsonl",
                                                                "trace.json", "tensors.npz"))
        fill_disk(disk)
        capsys.readouterr()
        assert report.main([str(d)]) == 2
        err = capsys.readouterr().err
        left = sorted(n for n in os.listdir(d) if n in report.REPORT_FILES or n.startswith("."))
    assert err == f"kbframe: error: cannot write '{d / 'sweep.csv'}': No space left on device\n"
    assert left == []


def test_read_only_sweep_exits_2(sweep, tmp_path, capsys):
    import os
    import subprocess
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("an immutable directory needs root (root writes through chmod)")
    d = tmp_path / "ro"
    shutil.copytree(sweep, d)
    (d / "sweep.csv").unlink(missing_ok=True)
    if subprocess.run(["chattr", "+i", str(d)]).returncode != 0:
        pytest.skip("no immutable flag on this file system")
    try:
        capsys.readouterr()
        assert report.main([str(d)]) == 2
        err = capsys.readouterr().err
    finally:
        subprocess.run(["chattr", "-i", str(d)])
    assert err.startswith("kbframe: error: cannot write '") and err.endswith("': Operation not permitted\n")
    assert len(err.splitlines()) == 1


def test_a_string_where_a_metric_should_be_fails_that_job(sweep, tmp_path, capsys):
    d = tmp_path / "bad_metric"
    shutil.copytree(sweep, d)
    m = json.loads((d / "0" / "metrics.json").read_text())
    m["sim"]["latency_ns"] = "fast"
    (d / "0" / "metrics.json").write_text(json.dumps(m))
    (d / "4" / "metrics.json").write_text("[1, 2]")
    capsys.readouterr()
    assert report.main([str(d)]) == 1  # jobs not ok, and the report was written
    rows = {r["job"]: r for r in _rows(d)}
    assert (rows["0"]["status"], rows["0"]["error"], rows["0"]["sim.latency_ns"]) == (
        "failed", "metrics.json sim.latency_ns is 'fast', not a number", "")
    assert (rows["4"]["status"], rows["4"]["error"]) == ("failed", "metrics.json is not a JSON object")
    assert "Traceback" not in capsys.readouterr().err


def test_special_and_truncated_files_fail_their_job_and_are_never_read(sweep, tmp_path, capsys):
    """Only regular files of bounded size are read: a FIFO as metrics.json (which would hang
    a reader), a link to /dev/zero (which would fill memory), a FIFO as a job's
    overrides.yaml and status.json fail or leave out that job's facts."""
    import os
    d = tmp_path / "special"
    shutil.copytree(sweep, d)
    (d / "0" / "metrics.json").unlink()
    os.mkfifo(d / "0" / "metrics.json")
    (d / "4" / "metrics.json").unlink()
    (d / "4" / "metrics.json").symlink_to("/dev/zero")
    (d / "1" / "status.json").unlink()
    os.mkfifo(d / "1" / "status.json")
    (d / "3" / ".hydra" / "overrides.yaml").unlink()
    os.mkfifo(d / "3" / ".hydra" / "overrides.yaml")
    capsys.readouterr()
    assert report.main([str(d)]) == 1
    rows = {r["job"]: r for r in _rows(d)}
    assert (rows["0"]["status"], rows["0"]["error"]) == ("failed", "metrics.json cannot be read: not a regular file")
    assert (rows["4"]["status"], rows["4"]["error"]) == ("failed", "metrics.json cannot be read: not a regular file")
    assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(OSError, match="larger than 10 bytes"):
        files.read_small(d / "0" / ".hydra" / "config.yaml", 10)


def test_a_truncated_metrics_json_is_named_unreadable(sweep, tmp_path):
    d = tmp_path / "truncated"
    shutil.copytree(sweep, d)
    m = d / "0" / "metrics.json"
    m.write_text(m.read_text()[:40])
    assert report.main([str(d)]) == 1
    row = {r["job"]: r for r in _rows(d)}["0"]
    assert row["status"] == "failed" and row["error"].startswith("metrics.json cannot be read: "), row["error"]


# ---------------------------------------------------------------- status.json

def test_status_ok(tmp_path):
    with JobStatus(tmp_path, False, {"num": None, "overrides": ["a=1"]}) as job:
        assert read_status(tmp_path)["status"] == "running"
    st = read_status(tmp_path)
    assert job.ok and st["status"] == "ok" and st["overrides"] == ["a=1"] and st["wall_s"] >= 0


def test_single_run_error_exits_1_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        with JobStatus(tmp_path, False):
            raise ConfigError("bench.tile must be ≥ 1, got 0")
    assert e.value.code == 1
    assert capsys.readouterr().err == "kbframe: error: bench.tile must be ≥ 1, got 0\n"
    st = read_status(tmp_path)
    assert (st["status"], st["error"], st["error_type"]) == ("failed", "bench.tile must be ≥ 1, got 0", "ConfigError")


def test_multirun_job_errors_are_recorded_and_swallowed(tmp_path, capsys):
    with JobStatus(tmp_path / "a", True, {"num": 3, "overrides": ["bench.tile=0"]}):
        raise ConfigError("bench.tile must be ≥ 1, got 0")
    assert "kbframe: error (job 3 [bench.tile=0]): bench.tile" in capsys.readouterr().err
    with JobStatus(tmp_path / "b", True, {"num": 4, "overrides": []}):
        raise RuntimeError("a bug")
    st = read_status(tmp_path / "b")
    assert st["status"] == "failed" and st["error_type"] == "RuntimeError"
    assert "Traceback" in st["traceback"] and "a bug" in st["traceback"]


def test_single_run_bug_keeps_its_traceback(tmp_path):
    with pytest.raises(RuntimeError):
        with JobStatus(tmp_path, False):
            raise RuntimeError("a bug")
    assert read_status(tmp_path)["status"] == "failed"


def test_ctrl_c_is_recorded_as_interrupted(tmp_path):
    for multirun in (False, True):
        with pytest.raises(SystemExit) as e:
            with JobStatus(tmp_path, multirun):
                raise KeyboardInterrupt
        assert e.value.code == EXIT_INTERRUPTED
        assert read_status(tmp_path)["status"] == "interrupted"


def test_metrics_json_is_never_half_written(tmp_path, monkeypatch):
    """Ctrl-C while metrics.json is being written leaves the previous file (or none)."""
    write_json_atomic(tmp_path / "metrics.json", {"old": 1})
    real_dump = json.dump

    def dump_then_ctrl_c(obj, f, **kw):
        f.write('{"half": ')
        raise KeyboardInterrupt
    monkeypatch.setattr(files.json, "dump", dump_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(tmp_path / "metrics.json", {"new": 2})
    monkeypatch.setattr(files.json, "dump", real_dump)
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"old": 1}


def _job(num, overrides, status="ok", **values):
    return sweep_jobs.Job(num=num, overrides=list(overrides), status=status, values=values)


def _tile_sweep():
    """decode_opt2/opt3 × bench.tile in the order a user typed it (text order would be
    1024, 128, 2048, 256); latency grows with the tile for opt2, falls for opt3."""
    jobs = []
    for b, sign in (("decode_opt2", 1), ("decode_opt3", -1)):
        for t in (256, 128, 2048, 1024):
            jobs.append(_job(len(jobs), [f"+bench={b}", f"bench.tile={t}", "bench.S_kv=4096"], bench=b,
                             **{"shape.tile": t, "sim.latency_ns": 10000.0 + sign * t,
                                "dispatch.cycles_per_tile": 100.0 + t / 64, "dispatch.unit": "KV tile"}))
    return jobs


def test_swept_keys_parse_numbers_and_drop_constant_keys():
    jobs = _tile_sweep()
    assert sweep_jobs.swept_keys(jobs) == {"bench": ["decode_opt2", "decode_opt3"], "bench.tile": [256, 128, 2048, 1024]}
    assert sorted([1024, "b", 128, "a", 2048, 0.5], key=sweep_jobs.sort_key) == [0.5, 128, 1024, 2048, "a", "b"]
    order = ["m128", "m1024", "m4096"]  # text: as the sweep lists it
    assert sorted(["m4096", 256, "m128", "m1024"], key=lambda v: sweep_jobs.sort_key(v, order)) == [256, *order]


def test_a_tile_sweep_is_compared_and_plotted_against_the_tile_in_numeric_order(tmp_path, monkeypatch):
    jobs = _tile_sweep()
    comps = report.comparisons(jobs)
    assert [(c["bench"], c["base"], c["setting"]["bench.tile"]) for c in comps] == [
        ("decode_opt3", "decode_opt2", t) for t in (128, 256, 1024, 2048)]
    assert [round(c["latency_ratio"], 4) for c in comps] == [
        round((10000 - t) / (10000 + t), 4) for t in (128, 256, 1024, 2048)]
    text = report.summary_text(jobs, tmp_path)
    rows = [l for l in text.split("### decode_opt3 vs decode_opt2")[1].splitlines() if l.startswith("|")]
    assert [r.strip("|").split("|")[0].strip() for r in rows] == ["bench.tile", "-----------:", "128", "256", "1024", "2048"]
    assert "cycles/KV tile" in text
    # the plot: x = bench.tile (the only numeric swept key), one line per bench, points by tile
    assert report.x_key(jobs) == "bench.tile"
    seen = {}
    monkeypatch.setattr(report, "plot_sweep", lambda series, x_label, xs, unit, title, path, second:
                        seen.update(series=series, x_label=x_label, xs=xs, unit=unit, second=second))
    report.write_plot(jobs, tmp_path / "sweep.png")
    assert seen["x_label"] == "bench.tile" and seen["xs"] == [128, 256, 1024, 2048] and seen["unit"] == "KV tile"
    assert seen["second"] == ("simulated latency", "latency (ns)")  # a kernel's sweep: no model step
    assert list(seen["series"]) == ["decode_opt2", "decode_opt3"]
    assert [p[0] for p in seen["series"]["decode_opt2"]] == [256, 128, 2048, 1024]


def test_the_x_axis_follows_the_swept_key_with_most_values_or_the_one_asked_for():
    jobs = [_job(i, [f"+bench={b}", f"hardware.hbm_mode={m}", f"bench.splits={p}", f"bench.S_kv={s}"], bench=b)
            for i, (b, m, p, s) in enumerate((b, m, p, s) for b in ("decode_splitk",) for m in ("partitioned", "shared")
                                              for p in (1, 2, 4) for s in (64, 128, 256, 512))]
    assert report.x_key(jobs) == "bench.S_kv"  # numeric, 4 values (splits has 3; hbm_mode is text)
    assert report.x_key(jobs, "bench.splits") == "bench.splits"
    with pytest.raises(ValueError, match=r"^x=bench.tile is not a swept key; the sweep varies: "
                                         r"hardware.hbm_mode, bench.splits, bench.S_kv$"):
        report.x_key(jobs, "bench.tile")
    # a text key when no numeric one is swept (the GEMM harness: bench × gemm_shape)
    gemm = [_job(i, [f"+bench={b}", f"+gemm_shape={s}"], bench=b) for i, (b, s) in
            enumerate((b, s) for b in ("gemm_ref_ref", "gemm_load_ref") for s in ("m128_k128_n128", "m1_k4096_n4096", "m4096_k4096_n1"))]
    assert report.x_key(gemm) == "gemm_shape"
    assert report.x_key(gemm[:1]) is None


def test_report_by_hand_with_a_key_the_sweep_does_not_vary_is_exit_2(sweep, tmp_path, capsys):
    d = tmp_path / "x"
    shutil.copytree(sweep, d)
    for name in report.REPORT_FILES:
        (d / name).unlink(missing_ok=True)
    assert report.main([str(d), "--x", "bench.S_kv"]) == 2
    assert capsys.readouterr().err == (f"kbframe: error: '{d}': --x=bench.S_kv is not a swept key; the sweep varies: "
                                       f"bench, calibration.R, bench.tile\n")
    assert not (d / "sweep.csv").exists()
    assert report.main([str(d), "--x", "calibration.R"]) == 1  # jobs not ok: exit 1, report written
    assert (d / "sweep.png").is_file()


def test_report_arguments_are_all_checked_before_any_report_is_written(sweep, tmp_path, capsys):
    d = tmp_path / "args"
    shutil.copytree(sweep, d)
    for name in report.REPORT_FILES:
        (d / name).unlink(missing_ok=True)
    assert report.main([str(d), str(tmp_path / "nope")]) == 2
    assert not (d / "sweep.csv").exists()  # the first directory was not rewritten either
    assert report.main([str(d), "--y", "foo"]) == 2
    assert report.main([str(d), "--x=calibration.R"]) == 1 and (d / "sweep.png").is_file()
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [f"kbframe: error: no such sweep directory '{tmp_path / 'nope'}'",
                       "kbframe: error: unknown option '--y' (python -m kbframe.report [DIR ...] [--x KEY])"]
    assert report.main([str(d), "--help"]) == 0


def test_a_model_sweeps_plot_draws_the_models_tokens_per_second(tmp_path, monkeypatch):
    """Jobs of one decoder layer each with step.model (the model's whole step estimated): the
    second panel is that tokens/s, one point a swept value, in the swept order."""
    def job(num, s_kv, tps):
        return sweep_jobs.Job(num, ["+bench=decoder_layer", f"bench.S_kv={s_kv}"], status="ok",
                   metrics={"step": {"tokens_per_s": 80 * tps, "model": {"tokens_per_s": tps}}},
                   values={"dispatch.cycles_per_tile": 100.0 + num})
    seen = {}
    monkeypatch.setattr(report, "plot_sweep", lambda series, x_label, xs, unit, title, path, second:
                        seen.update(series=series, xs=xs, second=second))
    report.write_plot([job(0, 8192, 11.5), job(1, 4096, 12.0)], tmp_path / "sweep.png")
    assert seen["second"] == ("tokens/s, the model's whole step (estimated)", "tokens/s")
    assert seen["xs"] == [4096, 8192] and list(seen["series"].values()) == [[(8192, 100.0, 11.5), (4096, 101.0, 12.0)]]


def test_a_model_sweep_leaves_out_the_models_that_would_not_fit(tmp_path, monkeypatch):
    """Every job's model refused (step.model.tokens_per_s null): the panel stays the model's
    tokens/s, not the simulated layer's, its points left out, and the title says why."""
    def job(num, s_kv):
        return sweep_jobs.Job(num, ["+bench=decoder_layer", f"bench.S_kv={s_kv}"], status="ok",
                              metrics={"step": {"tokens_per_s": 900.0, "model": {
                                  "tokens_per_s": None, "refused": "HBM too small: ..."}}},
                              values={"dispatch.cycles_per_tile": 100.0 + num})
    seen = {}
    monkeypatch.setattr(report, "plot_sweep", lambda series, x_label, xs, unit, title, path, second:
                        seen.update(series=series, title=title, second=second))
    report.write_plot([job(0, 8192), job(1, 4096)], tmp_path / "sweep.png")
    assert seen["second"] == ("tokens/s, the model's whole step (estimated)", "tokens/s")
    assert list(seen["series"].values()) == [[(8192, 100.0, None), (4096, 101.0, None)]]
    assert seen["title"] == "kbframe sweep: 2 ok; 2 whole model(s) would not fit (step.model.refused)"
