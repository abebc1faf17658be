"""``python -m kbframe`` in subprocesses (issues 2 and 3): the default runs write their files
and summary; every bad input exits non-zero with a message naming the key or file and no
traceback, as exactly one line.

All runs are started at once in a module fixture (the machine has 2 cores), then each test
checks its own result."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cli_forkserver import run_many
from conftest import REPO
from kbframe.ir.micro_ops import MICRO_OPS

PRE_GEMM = ("+recipes.pre_gemm={operands: {x: R, w: R}, primary_out: {name: Y, from_shape: x}, "
            "engine_seq: [{engine: GEMM, op: gemm, src_a: x, src_b: w, dst: Y}]}")
BAD_RECIPE = textwrap.dedent("""\
    # @package recipes.bad
    operands: {x: R, y: RW}
    engine_seq:
      - {op: copy, src: x, dst: y}
      - {op: softmax, src: x, dst: y}
    """)
KNOWN = ", ".join(sorted(MICRO_OPS))  # the registry's kinds (kbframe/ir/micro_ops.py)
BENCHES = ", ".join(sorted(p.stem for p in (REPO / "conf" / "bench").glob("*.yaml")))


def _cases(tmp):
    wrong = tmp / "wrong.npz"
    np.savez(wrong, q=np.ones((8, 128)), k=np.ones((64, 128)), v=np.ones((64, 64)))
    (tmp / "conf" / "recipes").mkdir(parents=True)
    (tmp / "conf" / "recipes" / "bad.yaml").write_text(BAD_RECIPE)
    o2 = ["+bench=decode_opt2"]
    o3 = ["+bench=decode_opt3"]
    return {
        # name: (args, the exact stderr line expected, or None for a good run)
        "ok_opt3": (o3, None),
        "ok_opt2": (o2, None),
        "R_abc": (o3 + ["calibration.R=abc"],
                  "kbframe: error: Error merging override calibration.R=abc; Value 'abc' of type 'str' could not "
                  "be converted to Float"),
        "typo": (o3 + ["+calibration.typo=1"],
                 "kbframe: error: unknown key 'calibration.typo' (known: FIXED, R, cap_bytes)"),
        "bench_nope": (["+bench=nope"], f"kbframe: error: unknown bench 'nope' (available: {BENCHES})"),
        "no_bench": ([], f"kbframe: error: no bench selected; add +bench=NAME (available: {BENCHES})"),
        "tile0": (o3 + ["bench.tile=0"], "kbframe: error: bench.tile must be ≥ 1, got 0"),
        "skv0": (o3 + ["bench.S_kv=0"], "kbframe: error: bench.S_kv must be ≥ 1, got 0"),
        "missing_file": (o3 + [f"bench.inputs.path={tmp}/nope.npz"],
                         f"kbframe: error: bench.inputs.path: no such file '{tmp}/nope.npz'"),
        "wrong_shape": (o3 + [f"bench.inputs.path={wrong}"],
                        f"kbframe: error: bench.inputs.path: inconsistent shapes in '{wrong}': q (8, 128), "
                        f"k (64, 128), v (64, 64) (need q (G, d), k and v (S_kv, d), all non-empty)"),
        "tcm_small": (o3 + ["hardware.tcm_bytes=1024"],
                      # opt3's need: q 2048, q·scale 2048, m, l 64 each, O 2048, K/V double buffers
                      # 4·16384 = 65536 → 71808 B, plus per-tile scratch s 1024, m_loc, m_new, corr,
                      # l_loc 64 each, p 1024, pv 2048 = 4352 → 76160 B
                      "kbframe: error: TCM overflow on PE0: request 'q@tcm' needs 2048 B, 1024 B free of "
                      "1024 B capacity (hardware.tcm_bytes); decode_opt3 needs 76160 B of TCM in all at G=8 "
                      "d=128 S_kv=4096 tile=64 (float16), found by a dry run before the simulation"),
        "bad_recipe": (o2 + [f"hydra.searchpath=[pkg://kbframe,file://{tmp}/conf]", "recipes=[softmax_merge,bad]"],
                       f"kbframe: error: recipe 'bad' (recipes/bad.yaml) step 2: unknown micro-op 'softmax' "
                       f"(known: {KNOWN})"),
        "over_cap": (o2 + ["bench.S_kv=256", "calibration.cap_bytes=300"],
                     "kbframe: error: composite over the size cap: 306 logical bytes > cap 300 "
                     "(calibration.cap_bytes); ops [rmax,max_elem,exp_diff,exp_diff,rsum,fma,mul_bcast,copy,"
                     "gemm,add]; split it (no silent segmentation, ADR-0064 D7)"),
        "unknown_recipe": (o2 + ["bench.S_kv=256", "recipes=[]"],
                           "kbframe: error: unknown recipe 'softmax_merge' (known: none)"),
        "missing_operand": (o2 + ["bench.S_kv=256", "+recipes.softmax_merge.operands.bias=R"],
                            "kbframe: error: recipe 'softmax_merge': missing operand(s) ['bias']"),
        "auto_bind": (o2 + ["bench.S_kv=256", "bench.kernel=kbframe.kernels.faulty.auto_bind_conflict"],
                      "kbframe: error: auto-bind conflict: prologue recipe declares primary_out "
                      "'softmax_merge.P', which binds to the GEMM's a, but a=<tcm:composite_out (8, 64)> was "
                      "also given (ADR-0065 D6.6)"),
        "hbm_operand": (o2 + ["bench.S_kv=256", "bench.kernel=kbframe.kernels.faulty.hbm_recipe_operand"],
                        "kbframe: error: MATH operand must be TCM: recipe 'softmax_merge' operand 's' is "
                        "<hbm:q (8, 128)> (ADR-0065 D6.7; tl.load it first)"),
        "two_gemms": (o2 + ["bench.S_kv=256", "bench.kernel=kbframe.kernels.faulty.two_gemms", PRE_GEMM],
                      "kbframe: error: two GEMMs in one composite (2 gemm ops in [gemm, gemm]); at most one "
                      "(ADR-0065 D6.1)"),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Each case's command line, forked from a server that imported kbframe once
    (tests/cli_forkserver.py: what ``python -m kbframe`` runs)."""
    tmp = tmp_path_factory.mktemp("cli")
    cases = _cases(tmp)
    runs = {name: tmp / "runs" / name for name in cases}
    res = run_many([{"id": name, "argv": [*args, f"hydra.run.dir={runs[name]}"], "cwd": str(REPO)}
                    for name, (args, _) in cases.items()], jobs=2)
    return {name: (res[name]["rc"], res[name]["stdout"], res[name]["stderr"], runs[name], cases[name][1])
            for name in cases}


ISSUE2_METRICS = {
    "": ("bench", "kernel", "shape", "sim", "dispatch", "numerics", "roofline"),
    "shape": ("G", "d", "S_kv", "tile"),
    "sim": ("latency_ns", "events", "wall_s"),
    "dispatch": ("commands", "cycles", "commands_per_tile", "cycles_per_tile"),
    "numerics": ("enabled", "max_abs_err", "max_rel_err"),
    "roofline": ("bound_ns", "binding", "fraction"),
}


@pytest.mark.parametrize("name, bench", [("ok_opt3", "decode_opt3"), ("ok_opt2", "decode_opt2")])
def test_cli_default_run(results, name, bench):
    rc, so, se, run_dir, _ = results[name]
    assert rc == 0, se
    assert "Traceback" not in se
    m = json.loads((run_dir / "metrics.json").read_text())
    for sect, keys in ISSUE2_METRICS.items():
        node = m[sect] if sect else m
        assert all(k in node for k in keys), (sect, keys)
    assert m["bench"] == bench
    assert m["shape"] == {"G": 8, "d": 128, "S_kv": 4096, "tile": 64, "n_tiles": 64}
    assert m["numerics"]["enabled"] is True and m["numerics"]["max_abs_err"] <= 1e-5
    lines = (run_dir / "op_log.jsonl").read_text().splitlines()
    assert len(lines) == m["sim"]["events"]
    assert json.loads(lines[0])["unit"] == "cpu"
    with np.load(run_dir / "tensors.npz") as z:
        assert {"q", "k", "v", "out", "ref"} <= set(z.files)
        assert z["out"].shape == (8, 128) and z["k"].shape == (4096, 128)
        assert np.abs(z["out"] - z["ref"]).max() <= 1e-5
    # the summary: shapes, latency, dispatch per tile, binding and fraction, error, file location
    assert f"kbframe {bench}: G=8 d=128 S_kv=4096 tile=64 (64 KV tiles)" in so
    for word in ("latency", f"{m['sim']['latency_ns']:.1f} ns", "per KV tile",
                 f"{m['dispatch']['commands_per_tile']:.2f}", f"binding: {m['roofline']['binding']}",
                 f"critical    {m['critical_path']['binding']}: {m['critical_path']['period_ns']:g} ns per KV tile",
                 "max_abs_err", str(run_dir)):
        assert word in so, word
    # the resolved config records the recipes used
    cfg = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "softmax_merge:" in cfg and "engine_seq:" in cfg


def test_cli_opt2_cheaper_and_faster_than_opt3(results):
    m3 = json.loads((results["ok_opt3"][3] / "metrics.json").read_text())
    m2 = json.loads((results["ok_opt2"][3] / "metrics.json").read_text())
    assert m2["sim"]["latency_ns"] < m3["sim"]["latency_ns"]
    assert m3["dispatch"]["cycles_per_tile"] > 2 * m2["dispatch"]["cycles_per_tile"]
    assert m2["dispatch"]["commands_per_tile"] == 2 + 6 / 64


BAD_INPUTS = ["R_abc", "bench_nope", "no_bench", "typo", "tile0", "skv0", "missing_file", "wrong_shape",
              "tcm_small", "bad_recipe", "over_cap", "unknown_recipe", "missing_operand", "auto_bind",
              "hbm_operand", "two_gemms"]


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_cli_bad_input_is_one_line(results, name):
    """Every bad input (wrong type, unknown key or bench, bad values, inputs file, TCM, recipe
    YAML, every emit-time rule) reaches the user as exactly one line naming the key, file or
    op, exit status 1, no traceback, no summary, no metrics.json."""
    rc, so, se, run_dir, want = results[name]
    assert rc == 1
    assert "Traceback" not in se
    assert se.strip().splitlines() == [want]
    assert "latency" not in so
    assert not (run_dir / "metrics.json").exists()
    # refused as Hydra composed the config: the run directory made for it is removed again;
    # refused later: the run recorded its end there
    if name in COMPOSE_ERRORS:
        assert not run_dir.exists()
    else:
        assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"


#: the bad inputs refused while Hydra composes the config, before the run begins
COMPOSE_ERRORS = ("R_abc", "bench_nope")



def test_cli_every_case_is_checked(results):
    """Guard: every run the fixture starts is asserted by one of the tests above."""
    assert set(results) == {"ok_opt3", "ok_opt2", *BAD_INPUTS}
    assert len(BAD_INPUTS) == len(set(BAD_INPUTS)) == 16


def test_cli_closed_stdout_pipe_keeps_the_run_ok(tmp_path):
    # `python -m kbframe ... | head`: the reader is gone before the summary is printed; the run
    # is still ok and no traceback is shown (the read end is closed first, so this is certain)
    import os
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "kbframe", "+bench=decode_opt2", "bench.S_kv=64",
                            "bench.data=false", f"hydra.run.dir={tmp_path}"], cwd=REPO, stdout=w,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "ok"
    assert (tmp_path / "metrics.json").exists()


def test_one_compose_only_when_nothing_can_make_a_multirun():
    """Hydra's mode-probing compose is skipped only when the command line cannot
    set hydra.mode (kbframe.cli.speed)."""
    from kbframe.cli.speed import mode_is_run
    assert mode_is_run(["+bench=decode_opt2", "bench.S_kv=512", "hardware=cube", "+model=llama3_70b"])
    for argv in (["-m", "+bench=decode_opt2"], ["--multirun"], ["+sweep=r_sweep"], ["+search=decode_tile"],
                 ["hydra.mode=MULTIRUN"], ["--config-dir", "x"], ["-cd=x"], ["--config-dir=x"],
                 ["hydra.searchpath=[file:///x]"], ["hydra/sweeper=optuna"]):
        assert not mode_is_run(["+bench=decode_opt2", *argv]), argv


_IN_HEAP = textwrap.dedent('''
    import sys
    import numpy as np
    from kbframe.run.memory import prefault, tune_malloc
    def rss():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))
    tuned = tune_malloc() if sys.argv[1] != "default" else None
    thread = prefault(512 << 20) if sys.argv[1] != "tuned" else None
    if thread is not None:
        thread.join()
    before = rss()
    a = np.ones(256 << 20, dtype=np.int8)
    with open("/proc/self/maps") as f:
        heap = [line.split()[0].split("-") for line in f if line.rstrip().endswith("[heap]")]
    print(tuned, thread is not None, any(int(lo, 16) <= a.ctypes.data < int(hi, 16) for lo, hi in heap), (rss() - before) >> 20 > 128)
''')


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_large_arrays_come_from_the_heap_faulted_in_ahead():
    """After tune_malloc a 256 MiB array lies in the process's heap (reused once freed),
    its pages faulted in when it is made; after prefault (512 MiB, on its thread) they are
    already in memory. Without tune_malloc, glibc maps the array on its own (and unmaps it
    when freed), and prefault does nothing."""
    got = {how: subprocess.run([sys.executable, "-c", _IN_HEAP, how], capture_output=True, text=True, timeout=60,
                               cwd=REPO).stdout.split() for how in ("tuned", "prefaulted", "default")}
    assert got == {"tuned": ["True", "False", "True", "True"], "prefaulted": ["True", "True", "True", "False"],
                   "default": ["None", "False", "False", "True"]}


def test_the_kbframe_script_exits_with_the_runs_status(tmp_path):
    """The console script ends through the fast exit with the run's status and its files
    complete."""
    import shutil
    from pathlib import Path
    script = shutil.which("kbframe", path=str(Path(sys.executable).parent))
    ok = subprocess.run([script, "+bench=decode_opt2", "bench.S_kv=128", f"hydra.run.dir={tmp_path / 'ok'}"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "kbframe decode_opt2" in ok.stdout
    assert json.loads((tmp_path / "ok" / "metrics.json").read_text())["sim"]["latency_ns"] > 0
    bad = subprocess.run([script, "+bench=decode_opt2", "bench.tile=0", f"hydra.run.dir={tmp_path / 'bad'}"],
                         capture_output=True, text=True, timeout=120)
    assert (bad.returncode, bad.stderr) == (1, "kbframe: error: bench.tile must be ≥ 1, got 0\n")


@pytest.mark.parametrize("sweep", [False, True])
def test_ctrl_c_outside_a_job_is_one_line_and_status_130(monkeypatch, capsys, sweep):
    """Ctrl-C while Hydra composes a config (a single run's, or the next job's of a sweep),
    outside any job's JobStatus: one line and exit 130, never a traceback; in a sweep, that
    line says how to summarise what finished (the sweep's directory as its start recorded
    it: kbframe.cli.callbacks)."""
    from kbframe.cli import callbacks, hydra_errors, main

    def composing(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(callbacks, "_SWEEP_LOCKS", {"/tmp/the_sweep": None} if sweep else {})
    monkeypatch.setattr(hydra_errors, "run", composing)
    monkeypatch.setattr(sys, "argv", ["kbframe", "+bench=decode_opt2"])
    with pytest.raises(SystemExit) as e:
        main.main()
    assert e.value.code == 130
    assert capsys.readouterr().err == "kbframe: interrupted" + (
        "; summarise what finished with: python -m kbframe.report /tmp/the_sweep" if sweep else "") + "\n"


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """``python -m kbframe --help | head -1``: the pipe closes before the help is written; the
    command ends as a tool killed by SIGPIPE does (status 141), with nothing on stderr."""
    p = subprocess.Popen([sys.executable, "-m", "kbframe", "--help"], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader goes away before reading anything
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == ""


def test_memory_is_tuned_only_where_the_command_allowed_it():
    """A library caller's (or a test's) process keeps glibc's defaults: ahead does nothing
    before allow (kbframe.cli.speed allows it for the command's own process)."""
    from kbframe.run import memory
    assert not memory._allowed and memory.ahead(1 << 30) is None and memory._libc is None


def test_a_refused_run_removes_only_the_folders_it_made(tmp_path):
    """The folders made for a single run's directory are removed while still empty; a path
    through '..' names folders only as the file system resolves it, so none of its folders
    is taken for one the command made (the user's own would go)."""
    from kbframe.cli import checks
    (tmp_path / "proj" / "results").mkdir(parents=True)
    assert checks._writable_dir(str(tmp_path / "zz" / ".." / "proj" / "results")) is None
    checks.remove_unused_run_dir()
    assert (tmp_path / "proj" / "results").is_dir()
    assert checks._writable_dir(str(tmp_path / "new" / "run")) is None
    assert (tmp_path / "new" / "run").is_dir()
    checks.remove_unused_run_dir()
    assert not (tmp_path / "new").exists() and (tmp_path / "proj").is_dir()


def test_an_interrupt_a_library_swallowed_is_raised_again():
    """Once a signal stopped the command, a run does not start: the interrupt is raised again
    (OmegaConf turns the one the handler raised into its own error, which Hydra's probe of
    the run mode swallows before composing again)."""
    import signal

    from kbframe.cli import stop
    from kbframe.errors import Terminated
    stop.reset()
    stop.raise_if_stopped()  # not stopped: nothing
    stop._stopped = signal.SIGTERM
    try:
        with pytest.raises(Terminated):
            stop.raise_if_stopped()
    finally:
        stop.reset()
