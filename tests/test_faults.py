"""Hostile inputs and faults that a row of docs/errors.md cannot express: host
memory budgets, PEs a run never uses, and (below) the run directory's faults."""
from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import compose_cfg
from kbframe.errors import ConfigError, InputsError
from kbframe.run import preflight
from kbframe.run.bench import read_inputs_file, run_bench, validate
from kbframe.sim.engine import Engine
from kbframe.sim.numerics import Numerics
from kbframe.sim.oplog import OpLog


# ---------------------------------------------------------------- class 7: host memory

def test_sanitizer_memory_is_checked_before_the_run(tmp_path, monkeypatch):
    """run.check keeps every stage and record: the dry run counts the records exactly (the
    run's sim.events), and a machine too small for them is refused before simulating."""
    m = run_bench(compose_cfg("bench.S_kv=1024", "bench.data=false", "run.progress=false"), tmp_path / "ok")
    cfg = compose_cfg("bench.S_kv=1024", "bench.data=false", "run.progress=false")
    from kbframe.sim.targets import resolve_kernel
    from kbframe.tl.recipe import load_recipes
    wl = validate(cfg)
    fig = preflight.dry_run(cfg.hardware, wl, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes),
                            "float16", None, count_stages=True)
    assert fig["records"] == m["sim"]["events"] == 2 * fig["commands"] + fig["stages"]
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: fig["records"] * 2048 - 1)
    with pytest.raises(ConfigError) as e:
        run_bench(cfg, tmp_path / "small")
    assert str(e.value) == (f"run.check=true keeps about {fig['records'] * 2048 / 2**30:.3g} GiB of host memory for "
                            f"the sanitizer ({fig['records']} op_log records × 2048 B); this machine has "
                            f"{(fig['records'] * 2048 - 1) / 2**30:.3g} GiB; use run.check=false or a shorter run")
    assert not (tmp_path / "small").exists()
    run_bench(compose_cfg("bench.S_kv=1024", "bench.data=false", "run.progress=false", "run.check=false"),
              tmp_path / "unchecked")  # without the sanitizer nothing is kept


def test_npz_expansion_checked_from_headers(tmp_path, monkeypatch):
    """A compressed .npz expands a thousandfold: 64 MiB of int8 zeros are a ~64 KiB file.
    Its headers are read (nothing decompressed) and refused beyond host memory."""
    k = np.zeros((1 << 19, 128), np.int8)
    np.savez_compressed(tmp_path / "z.npz", q=np.zeros((8, 128), np.int8), k=k, v=k)
    assert (tmp_path / "z.npz").stat().st_size < 1 << 20
    heads = preflight.npz_headers(tmp_path / "z.npz")
    assert heads["k"] == ((1 << 19, 128), np.dtype(np.int8))
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: 1 << 30)
    wl = validate(compose_cfg())
    with pytest.raises(InputsError) as e:
        read_inputs_file(str(tmp_path / "z.npz"), wl)
    assert str(e.value) == (f"bench.inputs.path: '{tmp_path / 'z.npz'}' needs about 1.13 GiB of host memory to "
                            f"load (array 'k' is (524288, 128) int8, 0.0625 GiB once expanded, then float64); this "
                            f"machine has 1 GiB")
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: 2 << 30)
    assert read_inputs_file(str(tmp_path / "z.npz"), wl)["k"].shape == (1 << 19, 128)


def test_unused_pes_are_not_built():
    """hardware.n_pes=100000 took 64 s and 0.94 GB building PEs a one-PE run never uses;
    PEs are now built when first used."""
    cfg = compose_cfg("hardware.n_pes=100000", "hardware.pes_per_cube=8", "hardware.cubes_x=12500")
    eng = Engine(cfg.hardware, Numerics(), OpLog(None))
    pe = eng.pes[7]
    assert len(eng.pes) == 100000 and eng.pes.built() == [pe] and pe.index == 7
    assert eng.pes[7] is pe and eng.pes[-1].index == 99999 and len(eng.pes.built()) == 2
    with pytest.raises(IndexError):
        eng.pes[100000]


# ---------------------------------------------------------------- the run directory (kbframe.run.rundir)

import json
import os
import re
import shutil
import signal
import subprocess
import sys

from conftest import REPO, fill_disk, run, tmpfs
from kbframe.errors import OutputError
from kbframe.files import TEMP_MARK, read_status
from kbframe.run.rundir import RunDir, is_locked, lock

CLI = [sys.executable, "-m", "kbframe", "run.progress=false"]


def _wait_running(proc, out_dir, timeout=60.0):
    """Wait until ``proc`` holds ``out_dir``: its status.json says running with its pid
    (written under the lock; polling the lock itself could take it first)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = read_status(out_dir)
        if st and st.get("pid") == proc.pid and st.get("status") == "running":
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the first run never started")


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_two_runs_into_one_directory(tmp_path):
    """Class 11: the second run is refused with one line while the first holds the
    directory; the first's files are whole and its own (op_log lines = events)."""
    out = tmp_path / "run"
    a = subprocess.Popen([*CLI, "+bench=decode_opt2", "bench.S_kv=131072", "bench.data=false", "calibration.R=0.25",
                          "run.fast_forward=off",  # every tile simulated: it holds the directory for seconds
                          f"hydra.run.dir={out}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_running(a, out)
    b = subprocess.run([*CLI, "+bench=decode_opt2", "bench.S_kv=16384", "calibration.R=0.0625",
                        f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert b.returncode == 1 and b.stdout == ""
    assert b.stderr == (f"kbframe: error: the run directory '{out}' is in use by another kbframe run (it holds the "
                        f"directory's lock); wait for it to end or choose another hydra.run.dir\n")
    _, err = a.communicate(timeout=300)
    assert a.returncode == 0, err
    m = json.loads((out / "metrics.json").read_text())
    assert m["calibration"]["R"] == 0.25 and m["shape"]["S_kv"] == 131072
    assert len(_records(out / "op_log.jsonl")) == m["sim"]["events"]
    assert read_status(out)["status"] == "ok" and read_status(out)["pid"] == a.pid
    assert "calibration.R=0.25" in (out / ".hydra" / "overrides.yaml").read_text()  # B touched nothing
    assert not [p for p in os.listdir(out) if TEMP_MARK in p]


def test_lock_is_reentrant_and_exclusive(tmp_path):
    with lock(tmp_path):
        with lock(tmp_path):  # the CLI, the status writer and the run shell nest it
            assert is_locked(tmp_path)
        code = ("import sys; from kbframe.run.rundir import lock, RunDirBusy\n"
                f"try:\n    lock({str(tmp_path)!r}).__enter__()\nexcept RunDirBusy:\n    sys.exit(3)\n")
        assert subprocess.run([sys.executable, "-c", code]).returncode == 3
    assert not is_locked(tmp_path)
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def tmpfs_200k(tmp_path):
    """A 200 KB tmpfs (root only): a disk that fills during a run."""
    with tmpfs(tmp_path / "full", "size=200k") as d:
        yield d


def test_disk_full_is_one_line_and_leaves_nothing(tmpfs_200k):
    """Class 8: the op_log fills the disk mid-run: one line, exit 1, status.json failed
    (never stuck at running), and none of the run's temporaries left filling the disk."""
    out = tmpfs_200k / "run"
    p = subprocess.run([*CLI, "+bench=decode_opt2", f"hydra.run.dir={out}"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr == f"kbframe: error: cannot write the run directory '{out}': No space left on device\n"
    st = read_status(out)
    assert st["status"] == "failed" and st["error_type"] == "OutputError"
    assert sorted(os.listdir(out)) == [".hydra", "status.json"]


@pytest.fixture
def tmpfs_300k(tmp_path):
    """A 300 KB tmpfs (root only)."""
    with tmpfs(tmp_path / "full", "size=300k") as d:
        yield d


def _describes_one_run(out):
    """status.json and .hydra/overrides.yaml are those of the same run."""
    from omegaconf import OmegaConf
    assert read_status(out)["overrides"] == list(OmegaConf.load(out / ".hydra" / "overrides.yaml"))


FULL_DISK_CASES = {  # what fills the disk: tensors.npz, the op_log, the trace, on one PE or eight
    "one PE, data, S_kv=256": ["+bench=decode_opt2", "bench.S_kv=256"],
    "one PE, data, S_kv=65536": ["+bench=decode_opt2", "bench.S_kv=65536"],
    "one PE, timing only, S_kv=65536": ["+bench=decode_opt2", "bench.S_kv=65536", "bench.data=false"],
    "one PE, timing only, unchecked, S_kv=16384": ["+bench=decode_opt3", "bench.S_kv=16384", "bench.data=false",
                                                   "run.check=false"],
    "8 PEs, timing only, S_kv=512": ["+bench=decode_heads", "+model=llama3_70b", "hardware=cube", "bench.S_kv=512",
                                     "bench.data=false"],
    "8 PEs, timing only, S_kv=8192": ["+bench=decode_heads", "+model=llama3_70b", "hardware=cube",
                                      "bench.S_kv=8192", "bench.data=false"],
    "4 PEs, data, S_kv=4096": ["+bench=decode_splitk", "bench.S_kv=4096"],
}


@pytest.mark.parametrize("case", FULL_DISK_CASES)
def test_a_full_disk_never_leaves_running(tmpfs_300k, case):
    """A disk that fills during the run, whatever fills it and on one PE or many: one line,
    exit 1, status.json failed (never running: the disk's room is freed first, and the
    status has room of its own), none of the run's files left, and the directory describes
    that one run."""
    out = tmpfs_300k / "run"
    p = subprocess.run([*CLI, *FULL_DISK_CASES[case], f"hydra.run.dir={out}"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("kbframe: error: cannot ") and p.stderr.endswith(": No space left on device\n")
    assert p.stderr.count("\n") == 1, p.stderr
    st = read_status(out)
    assert st["status"] == "failed" and st["error_type"] == "OutputError"
    assert sorted(os.listdir(out)) == [".hydra", "status.json"]
    _describes_one_run(out)


@pytest.mark.parametrize("inodes", [8, 9])
def test_out_of_inodes_names_the_result_file_not_its_temporary(tmp_path, inodes):
    """A file system out of inodes refuses a temporary's creation: the line names the result
    file the user knows (``trace.json``), never the hidden temporary it was staged as."""
    with tmpfs(tmp_path / "ino", f"size=10m,nr_inodes={inodes}") as d:
        p = subprocess.run([*CLI, "+bench=decode_opt2", "bench.S_kv=64", f"hydra.run.dir={d / 'run'}"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    m = re.fullmatch(r"kbframe: error: cannot write '(.*)' in the run directory: No space left on device\n", p.stderr)
    assert m and os.path.dirname(m[1]) == str(d / "run"), p.stderr
    assert os.path.basename(m[1]) in ("trace.json", "tensors.npz", "op_log.jsonl", "metrics.json"), p.stderr


def test_the_trace_tool_on_a_full_disk_names_the_trace_and_leaves_none(tmpfs_300k, tmp_path, capsys):
    """``python -m kbframe.report.trace`` writing onto a full disk: one line naming the
    trace it could not write (a write's own error names no file), exit 1, no temporary."""
    from kbframe.report import trace
    run(tmp_path / "run", "bench.S_kv=4096", "bench.data=false", "run.trace=false")
    (tmpfs_300k / "filler").write_bytes(b"x" * 250_000)
    capsys.readouterr()
    assert trace.main([str(tmp_path / "run" / "op_log.jsonl"), str(tmpfs_300k / "trace.json")]) == 1
    assert capsys.readouterr().err == (f"kbframe: error: [Errno 28] No space left on device: "
                                       f"'{tmpfs_300k / 'trace.json'}'\n")
    assert os.listdir(tmpfs_300k) == ["filler"]


def test_a_run_on_a_disk_already_full_records_itself_not_the_earlier_run(tmpfs_300k):
    """The disk is full before the run starts (something else filled it): Hydra rewrites
    .hydra/ in place; the status is written into the room status.json already takes, so it
    says this run failed (not the earlier run's ok), and the earlier run's files are kept."""
    out = tmpfs_300k / "run"
    first = subprocess.run([*CLI, "+bench=decode_opt2", "bench.S_kv=64", "bench.data=false", "run.trace=false",
                            f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    kept = {n: (out / n).read_bytes() for n in ("metrics.json", "op_log.jsonl")}
    fill_disk(tmpfs_300k)
    p = subprocess.run([*CLI, "+bench=decode_opt2", "bench.S_kv=128", "bench.data=false", "run.trace=false",
                        f"hydra.run.dir={out}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.endswith(": No space left on device\n"), p.stderr
    st = read_status(out)
    assert st["status"] == "failed" and "bench.S_kv=128" in st["overrides"]
    _describes_one_run(out)
    assert {n: (out / n).read_bytes() for n in kept} == kept
    fresh = tmpfs_300k / "fresh"  # a new directory: Hydra cannot write .hydra/ at all
    p = subprocess.run([*CLI, "+bench=decode_opt2", "bench.S_kv=128", "bench.data=false", f"hydra.run.dir={fresh}"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (1, "kbframe: error: cannot write the run's .hydra/ (Hydra's copy of its "
                                           "config): No space left on device\n")
    assert not [q for q in fresh.rglob("*") if q.is_file()]  # no empty config.yaml left behind
    sweep = tmpfs_300k / "sweep"  # a sweep: Hydra cannot write its multirun.yaml
    p = subprocess.run([sys.executable, "-m", "kbframe", "-m", "+bench=decode_opt2", "bench.S_kv=64,128",
                        "bench.data=false", f"hydra.sweep.dir={sweep}"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert (p.returncode, p.stderr) == (1, f"kbframe: error: cannot write '{sweep}/multirun.yaml' (Hydra's record of "
                                           f"the sweep, before any job runs): No space left on device; free space or "
                                           f"choose another hydra.sweep.dir\n")
    assert not [q for q in sweep.rglob("*") if q.is_file()]


def test_commit_is_all_or_nothing(tmp_path):
    """Class 12: metrics.json cannot be replaced (chattr +i): the run says so in one line
    and op_log.jsonl, trace.json, tensors.npz stay the earlier run's (no mix of two runs)."""
    if not _is_root() or shutil.which("chattr") is None:
        pytest.skip("chattr +i needs root")
    run(tmp_path, "bench.S_kv=256", "calibration.R=0.25")
    before = {n: (tmp_path / n).read_bytes() for n in ("metrics.json", "op_log.jsonl", "trace.json", "tensors.npz")}
    if subprocess.run(["chattr", "+i", str(tmp_path / "metrics.json")]).returncode != 0:
        pytest.skip("this file system has no immutable flag")
    try:
        with pytest.raises(OutputError) as e:
            run(tmp_path, "bench.S_kv=256", "calibration.R=0.0625")
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "metrics.json")])
    assert str(e.value) == (f"cannot replace '{tmp_path / 'metrics.json'}' (the run's files were left as they "
                            f"were): Operation not permitted")
    assert {n: (tmp_path / n).read_bytes() for n in before} == before
    assert sorted(os.listdir(tmp_path)) == sorted(before)


def _old_and_staged(tmp_path):
    """A run directory holding an earlier run's metrics.json and op_log.jsonl ("old NAME")
    and, staged, the new run's ("new NAME"): ``(the RunDir, {name: staged temporary})``."""
    rd = RunDir(tmp_path).open()
    for n in ("metrics.json", "op_log.jsonl"):
        (tmp_path / n).write_text(f"old {n}")
    staged = {n: rd.temp(n) for n in ("metrics.json", "op_log.jsonl")}
    for n, p in staged.items():
        p.write_text(f"new {n}")
    return rd, staged


def test_commit_rolls_back_when_a_new_file_cannot_move_in(tmp_path, monkeypatch):
    """The second phase fails (the new metrics.json cannot move in): the new files go back
    and the earlier ones return; nothing of either run is lost or mixed."""
    rd, staged = _old_and_staged(tmp_path)
    real = os.rename

    def rename(src, dst):
        if str(dst) == str(tmp_path / "metrics.json") and "kbframe-tmp" in str(src) and "-old" not in str(src):
            raise PermissionError(1, "Operation not permitted", str(dst))
        return real(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OutputError, match="cannot replace"):
        rd.commit({**staged, "trace.json": None})
    monkeypatch.setattr(os, "rename", real)
    assert (tmp_path / "metrics.json").read_text() == "old metrics.json"
    assert (tmp_path / "op_log.jsonl").read_text() == "old op_log.jsonl"
    rd.__exit__(OutputError, None, None)
    assert sorted(os.listdir(tmp_path)) == ["metrics.json", "op_log.jsonl"]


@pytest.mark.parametrize("at", ["aside", "in", "removed"])
def test_sigterm_during_the_commit_comes_once_every_file_moved(tmp_path, monkeypatch, at):
    """SIGTERM while the commit moves the earlier files aside, the new ones in, or removes
    the earlier ones: it is held until the commit is done, so the run's files are the new
    run's, all of them, and no earlier file is left behind (no ``-old`` temporary)."""
    import signal
    from kbframe.errors import Terminated
    rd, staged = _old_and_staged(tmp_path)
    real_rename, real_unlink, sent = os.rename, os.unlink, []

    def kill_once():
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    def rename(src, dst):
        if (at == "aside") == ("-old" in str(dst)) and at != "removed":
            kill_once()
        return real_rename(src, dst)

    def unlink(path, *a, **k):
        if at == "removed" and "-old" in str(path):
            kill_once()
        return real_unlink(path, *a, **k)

    def stop(signum, frame):
        raise Terminated("terminated (SIGTERM)")
    before = signal.signal(signal.SIGTERM, stop)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "unlink", unlink)
    try:
        with pytest.raises(Terminated):
            rd.commit({**staged, "trace.json": None})
    finally:
        signal.signal(signal.SIGTERM, before)
        monkeypatch.undo()
    assert sent
    assert {n: (tmp_path / n).read_text() for n in ("metrics.json", "op_log.jsonl")} == {
        "metrics.json": "new metrics.json", "op_log.jsonl": "new op_log.jsonl"}
    rd.__exit__(Terminated, None, None)
    assert sorted(os.listdir(tmp_path)) == ["metrics.json", "op_log.jsonl"]


@pytest.mark.parametrize("entry", ["q", "out"])
def test_ctrl_c_while_tensors_are_written_leaves_no_temporary(tmp_path, monkeypatch, entry):
    """Class 13: Ctrl-C while tensors.npz is written, in its first entry (the input q) or
    its last (the output): the half-written temporary is removed and the earlier run's
    files are untouched."""
    run(tmp_path, "bench.S_kv=256")
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    real = np.lib.format.write_array
    written = []

    def write_then_ctrl_c(f, array, **kw):
        written.append(f.name if hasattr(f, "name") else f._zinfo.filename)
        if written[-1] == entry + ".npy":
            f.write(b"half an array")
            raise KeyboardInterrupt
        real(f, array, **kw)
    monkeypatch.setattr(np.lib.format, "write_array", write_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "bench.S_kv=256", "calibration.R=0.25")
    assert written[-1] == entry + ".npy"
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before


def test_stale_temporaries_are_removed_by_the_next_run(tmp_path):
    """Class 13: temporaries a killed run left (this version's names and the fixed names
    older versions used) are removed by the next run; debug copies of a failed run are
    removed once a run passes; other files are left alone."""
    stale = [f".tensors.npz{TEMP_MARK}4242-deadbeef", f".trace.json{TEMP_MARK}4242-deadbeef.tmp",
             "tensors.tmp.npz", ".metrics.json.4242.tmp", ".kbframe-write-test-4242", "trace.json.partial.tmp"]
    for n in stale + ["op_log.jsonl.partial", "notes.txt"]:
        (tmp_path / n).write_bytes(b"x" * 1000)
    run(tmp_path, "bench.S_kv=64")
    assert sorted(os.listdir(tmp_path)) == ["metrics.json", "notes.txt", "op_log.jsonl", "tensors.npz", "trace.json"]


@pytest.mark.serial
@pytest.mark.parametrize("sig, rc, status", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "interrupted")])
def test_signal_mid_run_records_the_end_and_cleans_up(tmp_path, sig, rc, status):
    """Ctrl-C or SIGTERM at any moment of a long run: status.json records it (never stuck at
    running), one line, and no temporary is left in the run directory."""
    out = tmp_path / "run"
    p = subprocess.Popen([*CLI, "+bench=decode_opt2", "bench.S_kv=131072", f"hydra.run.dir={out}"], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_running(p, out)
    time.sleep(1.0)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == rc and "Traceback" not in err, err
    word = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert err == f"kbframe: {word}; status in {out / 'status.json'}\n"
    assert read_status(out)["status"] == status
    assert sorted(os.listdir(out)) == [".hydra", "status.json"]


# ---------------------------------------------------------------- Ctrl-C outside the run window

#: runs ``python -m kbframe ARGV`` after planting a Ctrl-C (SIGINT to itself) at one moment:
#: WHEN is ``import:MODULE`` (as Python imports it), or ``call:MODULE:ATTR:N`` (the N-th call
#: of that function; with ``+error`` the function then fails as a library half-way through
#: something does, the interrupt as its context)
_PLANT = r"""
import importlib, os, runpy, signal, sys
when, argv = sys.argv[1], sys.argv[2:]
kind, *where = when.split(":")

def ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10000):  # the handler runs here, at the latest
        pass

if kind == "import":
    class Hook:
        def find_spec(self, name, path=None, target=None):
            if name == where[0]:
                sys.meta_path.remove(self)
                ctrl_c()
    sys.meta_path.insert(0, Hook())
else:
    mod, attr, n = where[0], where[1], int(where[2].split("+")[0])
    owner = importlib.import_module(mod)
    *path, name = attr.split(".")
    for p in path:
        owner = getattr(owner, p)
    real, calls = getattr(owner, name), []

    def planted(*a, **k):
        calls.append(1)
        if len(calls) == n:
            try:
                ctrl_c()
            finally:
                if when.endswith("+error"):
                    raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
        return real(*a, **k)
    setattr(owner, name, planted)
sys.argv = ["kbframe", *argv]
runpy.run_module("kbframe", run_name="__main__", alter_sys=True)
"""


def _planted(when, *argv, cwd=REPO):
    return subprocess.run([sys.executable, "-c", _PLANT, when, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("when", [
    "import:hydra.core.utils",  # Python's imports
    "import:numpy.linalg",
    "call:hydra._internal.config_loader_impl:ConfigLoaderImpl.load_configuration:1",  # Hydra composing
    "call:hydra._internal.config_loader_impl:ConfigLoaderImpl.load_configuration:1+error",  # a library
    # error raised as it unwinds
    "call:hydra.core.utils:_save_config:2",  # Hydra writing the run's .hydra/
])
def test_ctrl_c_before_the_run_is_one_line_and_exit_130(tmp_path, when):
    """Ctrl-C at a moment before the run records itself: one line, exit 130, no traceback;
    a run directory Hydra began (its .hydra/ written in part) records the run as
    interrupted, not the earlier run's ok."""
    out = tmp_path / "run"
    first = _planted("import:no.such.module", "+bench=decode_opt2", "bench.S_kv=64", "bench.data=false",
                     f"hydra.run.dir={out}")
    assert first.returncode == 0 and read_status(out)["status"] == "ok", first.stderr
    p = _planted(when, "+bench=decode_opt2", "bench.S_kv=128", "bench.data=false", f"hydra.run.dir={out}")
    assert (p.returncode, p.stderr) == (130, "kbframe: interrupted\n"), p.stderr
    st = read_status(out)
    if when.startswith("call:hydra.core.utils"):  # Hydra rewrote .hydra/: the directory is this run's
        assert st["status"] == "interrupted"
    else:
        assert st["status"] == "ok" and "bench.S_kv=64" in st["overrides"]
    assert not [n for n in os.listdir(out) if TEMP_MARK in n]


@pytest.mark.parametrize("when, n_done", [
    ("call:hydra.core.utils:run_job:2", 1),  # Hydra starting the sweep's next job
    ("call:hydra.core.utils:_save_config:4", 1),  # Hydra writing the next job's .hydra/
    ("call:hydra._internal.config_loader_impl:ConfigLoaderImpl.load_sweep_config:3+error", None),  # composing
    # the next job, a library error raised as it unwinds
])
def test_ctrl_c_between_a_sweeps_jobs_is_one_line_naming_the_sweep(tmp_path, when, n_done):
    """Ctrl-C while a basic sweep goes from one job to the next: exit 130, one line naming
    the sweep directory and how to summarise it; no job is left running and a job Hydra
    began records itself interrupted."""
    d = tmp_path / "sweep"
    p = _planted(when, "-m", "+bench=decode_opt2", "bench.S_kv=64,128,256", "bench.data=false",
                 f"hydra.sweep.dir={d}")
    assert p.returncode == 130, p.stderr
    assert p.stderr == f"kbframe: interrupted; summarise what finished with: python -m kbframe.report {d}\n"
    jobs = sorted(j for j in os.listdir(d) if (d / j).is_dir())
    statuses = [read_status(d / j)["status"] for j in jobs]
    assert "running" not in statuses and all(s in ("ok", "interrupted") for s in statuses), statuses
    if n_done is not None:
        assert statuses[:n_done] == ["ok"] * n_done and statuses[n_done:] in ([], ["interrupted"])


def test_ctrl_c_as_a_search_starts_is_one_line(tmp_path):
    """Ctrl-C while the Optuna sweeper makes its study: one line, exit 130."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    d = tmp_path / "search"
    p = _planted("call:optuna:create_study:1", "-m", "+bench=decode_opt2", "+search=decode_tile", "bench.data=false",
                 "bench.S_kv=256", f"hydra.sweep.dir={d}")
    assert p.returncode == 130 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("kbframe: interrupted")


# ---------------------------------------------------------------- an interrupt Python would lose

def test_an_interrupt_lost_in_a_weakref_callback_is_raised_again():
    """A signal handler runs wherever the main thread is, also in a weakref callback, whose
    exception Python prints as "ignored" and drops: kbframe.cli.stop raises it again in the
    main thread's own code (the run then ends interrupted, not ok)."""
    code = (
        "import time, weakref\n"
        "from kbframe.cli import stop\n"
        "stop.keep_interrupts()\n"
        "class A: pass\n"
        "a = A()\n"
        "def callback(ref): raise KeyboardInterrupt  # as a handler raising inside it\n"
        "r = weakref.ref(a, callback)\n"
        "try:\n"
        "    del a\n"
        "    t = time.monotonic()\n"
        "    while time.monotonic() - t < 10: time.sleep(0.01)\n"
        "    print('lost')\n"
        "except KeyboardInterrupt:\n"
        "    print('raised again')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (0, "raised again\n", "")


def test_an_interrupt_in_the_middle_of_a_tcm_allocation_is_not_swallowed_by_the_dry_run():
    """Ctrl-C inside a TCM allocation of a kernel's scratch scope (the scope's exit then
    finds a half-made allocation): the dry run, which takes a kernel's own errors as "no
    exact dry run", raises the interrupt."""
    from kbframe.sim.targets import resolve_kernel
    from kbframe.tl.recipe import load_recipes
    cfg = compose_cfg("bench.S_kv=1024", "bench.data=false")
    wl, real = validate(cfg), resolve_kernel(cfg.bench.kernel)
    calls = []

    def interrupted_kernel(tl, **kw):
        tcm, now = tl.pe.tcm, tl.pe.tcm.now

        def ctrl_c_at_the_tenth():
            calls.append(1)
            if len(calls) == 10:
                raise KeyboardInterrupt
            return now()
        tcm.now = ctrl_c_at_the_tenth
        return real(tl, **kw)
    with pytest.raises(KeyboardInterrupt):
        preflight.dry_run(cfg.hardware, wl, interrupted_kernel, load_recipes(cfg.recipes), "float16", None)
    assert len(calls) == 10


def test_an_error_raised_while_unwinding_from_ctrl_c_in_a_run_ends_it_interrupted(tmp_path):
    """Ctrl-C in the simulation, and a library error raised as it unwinds (the interrupt as
    its context): the run records interrupted and exits 130 with one line, not failed with
    the error's traceback."""
    out = tmp_path / "run"
    p = _planted("call:kbframe.run.bench:_simulate:1+error", "+bench=decode_opt2", "bench.S_kv=128",
                 "bench.data=false", f"hydra.run.dir={out}")
    assert (p.returncode, p.stderr) == (130, f"kbframe: interrupted; status in {out / 'status.json'}\n")
    assert read_status(out)["status"] == "interrupted"
