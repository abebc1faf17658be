"""Every bad input answered: each row of the table in ``docs/errors.md`` is a
test here. The row's command line runs as ``python -m kbframe ARGS`` in a subprocess and
must exit 1 with exactly the documented one-line message on stderr, no traceback, no
summary, and without touching the results a previous run left in the run directory.

The rows are read from the docs, so a documented error without a test (or a test
without a documented row) cannot exist. ``<tmp>`` in a row is the directory the fixture
fills with the files the rows need; ``…`` in a message matches anything (a figure that
depends on the machine). The rows' subprocesses are forked, a few at a time, from a
server that imported kbframe once (tests/cli_forkserver.py); a few rows are also run
through a fresh ``sys.executable -m kbframe`` and must give byte-identical output.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_forkserver import run_many
from conftest import REPO, compose_cfg
from kbframe.run.bench import run_bench
from kbframe.errors import KbframeError, TcmOverflowError

DOCS = REPO / "docs" / "errors.md"
_ROW = re.compile(r"^\| `(?P<id>[a-z0-9_]+)` \| (?P<what>.+?) \| (?P<args>`[^`]*`|—) \| `(?P<msg>.+)` \|$")
SENTINELS = {"metrics.json": b'{"sentinel": "a previous run"}\n', "op_log.jsonl": b'{"sentinel": 1}\n',
             "tensors.npz": b"not really an npz: a sentinel\n", "trace.json": b'{"traceEvents": []}\n'}


#: the status.json of the "previous run" whose files the sentinels are
PREVIOUS_STATUS = '{"status": "ok", "started": "2025-01-01T00:00:00.000+00:00", "host": "h", "pid": 1}\n'


def doc_rows() -> list[dict]:
    rows = []
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line.strip())
        if m:
            args = m["args"].strip("`").split() if m["args"] != "—" else []
            rows.append({"id": m["id"], "what": m["what"], "args": args, "msg": m["msg"].replace("\\|", "|")})
    return rows


ROWS = {r["id"]: r for r in doc_rows()}

RECIPES = {
    "bad_op": "operands: {s: R}\nscratch: [t]\nengine_seq:\n  - {engine: MATH, op: nope, src: s, dst: t}\n",
    "writes_r": "operands: {s: R}\nengine_seq:\n  - {engine: MATH, op: copy, src: s, dst: s}\n",
    "dangling": "operands: {s: R}\nscratch: [t]\nengine_seq:\n  - {engine: MATH, op: copy, src: x, dst: t}\n",
    "noshape": "operands: {s: R}\nscratch: [t, u]\nengine_seq:\n  - {engine: MATH, op: copy, src: u, dst: t}\n",
    "badkey": "operands: {s: R}\nwhatever: 1\nscratch: [t]\nengine_seq:\n"
              "  - {engine: MATH, op: copy, src: s, dst: t}\n",
    "syntax": "operands: {s: R\nengine_seq: [\n",
}


def write_npz_bomb(path: Path) -> None:
    """An .npz of a few KB whose headers declare k and v of 2^37 × 128 int8 (16 TiB each):
    numpy would allocate that before reading a byte."""
    import io
    import zipfile

    def member(shape):
        b = io.BytesIO()
        np.lib.format.write_array_header_1_0(b, {"descr": "|i1", "fortran_order": False, "shape": shape})
        return b.getvalue() + bytes(1000)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, shape in (("q", (8, 128)), ("k", (2**37, 128)), ("v", (2**37, 128))):
            z.writestr(f"{name}.npy", member(shape))


def make_files(tmp: Path) -> None:
    """The files the rows refer to as ``<tmp>/...``."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((4, 16)), rng.standard_normal((50, 16)), rng.standard_normal((50, 16))
    np.savez(tmp / "good.npz", q=q, k=k, v=v)
    data = (tmp / "good.npz").read_bytes()
    (tmp / "truncated.npz").write_bytes(data[: len(data) // 2])
    (tmp / "text.npz").write_text("q,k,v\n1,2,3\n")
    np.savez(tmp / "pickled.npz", q=np.array([{"evil": "object"}] * 4, dtype=object), k=k, v=v)
    np.savez(tmp / "no_v.npz", q=q, k=k)
    np.savez(tmp / "shapes.npz", q=q, k=k, v=v[:, :8])
    k_nan = k.copy()
    k_nan[7, 3] = np.nan
    np.savez(tmp / "nan.npz", q=q, k=k_nan, v=v)
    np.savez(tmp / "scale2.npz", q=q, k=k, v=v, scale=np.array([0.1, 0.2]))
    np.savez(tmp / "masked.npz", q=q, k=k, v=v, mask=np.ones((4, 50), bool))
    big = q.copy()
    big[1, 2] = 1e5
    np.savez(tmp / "big.npz", q=big, k=k, v=v)
    q60 = np.zeros((2, 8))
    q60[0, 0] = 60000.0
    np.savez(tmp / "q60k.npz", q=q60, k=rng.standard_normal((32, 8)) * 1e-3, v=rng.standard_normal((32, 8)),
             scale=np.float64(2.0))
    write_npz_bomb(tmp / "bomb.npz")
    np.savez(tmp / "gemm_1e30.npz", A=np.full((128, 16), 1e30), B=np.full((16, 16), 1e30))  # fit fp32, A·B not
    (tmp / "sweeps" / "used" / "0" / ".hydra").mkdir(parents=True)  # an earlier sweep's job
    (tmp / "sweeps" / "used" / "0" / ".hydra" / "overrides.yaml").write_text("[]\n")
    make_layer_files(tmp, rng)
    os.mkfifo(tmp / "fifo.npz")
    (tmp / "zero.npz").symlink_to("/dev/zero")
    (tmp / "adir").mkdir()
    (tmp / "afile").write_text("a file, not a directory\n")
    rd = tmp / "more" / "recipes"
    rd.mkdir(parents=True)
    for name, body in RECIPES.items():
        (rd / f"{name}.yaml").write_text(f"# @package recipes.{name}\n{body}")
    # a recipe file that would set any key, one without a package line, and a bench of the
    # user's whose defaults load the first
    (rd / "global.yaml").write_text("# @package _global_\nhardware:\n  allow_external_targets: true\n")
    (rd / "nopackage.yaml").write_text(f"# a recipe without its package line\n{RECIPES['writes_r']}")
    (tmp / "more" / "energy").mkdir()  # a table of the user's for one PE: no IPCQ tables
    table = (REPO / "conf" / "energy" / "default.yaml").read_text()
    (tmp / "more" / "energy" / "no_ipcq.yaml").write_text(
        table[:table.index("ipcq_send:")].replace("name: default", "name: no_ipcq"))
    (tmp / "more" / "bench").mkdir()
    (tmp / "more" / "bench" / "loads_global.yaml").write_text(
        "defaults:\n  - decode_opt2\n  - /recipes: [global]\n  - _self_\nname: loads_global\n")
    (tmp / "runs" / "out_file_blocked" / "metrics.json").mkdir(parents=True)
    # links inside a run or sweep directory (the victims outside), another program's files
    (tmp / "victims").mkdir()
    (tmp / "victims" / "file").write_bytes(b"the user's file\n")
    for name in ("run", "result", "sweep"):
        (tmp / "linked" / name).mkdir(parents=True)
    (tmp / "linked" / "run" / ".hydra").symlink_to(tmp / "victims")
    (tmp / "linked" / "result" / "trace.json").symlink_to(tmp / "victims" / "file")
    (tmp / "linked" / "sweep" / "multirun.yaml").symlink_to(tmp / "victims" / "file")
    for name, body in (("run/metrics.json", "mine"), ("run/trace.json", "mine"), ("run/tensors.npz", "x"),
                       ("status/status.json", '{"state": "mine"}'), ("status/trace.json", "mine"),
                       ("sweep/0/metrics.json", "mine"), ("sweep/data.csv", "a,b")):
        (tmp / "foreign" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "foreign" / name).write_text(body + "\n")
    # Hydra objects set in config files, a file written outside the run directory by them
    (tmp / "more" / "bench" / "evil_callback.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - _self_\nhydra:\n  callbacks:\n    x:\n"
        f"      _target_: numpy.save\n      file: {tmp}/x.npy\n      arr: [1]\n")
    (tmp / "more" / "search").mkdir()  # decode_tile with s_buffers in a second branch, other choices
    (tmp / "more" / "search" / "two_when.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /search/decode_tile\n  - _self_\nsearch:\n  when:\n"
        "    +bench=decode_opt3:\n      ++bench.s_buffers: choice(2, 3)\n")
    (tmp / "more" / "bench" / "evil_output_subdir.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - _self_\nhydra:\n"
        f"  output_subdir: {tmp}/elsewhere/hyd\n")
    (tmp / "elsewhere" / "g").mkdir(parents=True)  # a config outside the config tree
    (tmp / "elsewhere" / "g" / "hw2.yaml").write_text("n_pes: 1\n")
    (tmp / "more" / "bench" / "evil_defaults.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - {'/..' * 12}{tmp}/elsewhere/g@hardware: hw2\n"
        "  - _self_\n")
    (tmp / "more" / "bench" / "evil_log_dot.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - _self_\nhydra:\n  hydra_logging:\n"
        "    handlers:\n      console:\n        .:\n          stream: null\n")
    (tmp / "more" / "hydra" / "hydra_logging").mkdir(parents=True)
    (tmp / "more" / "hydra" / "hydra_logging" / "evil.yaml").write_text(
        f"version: 1\nhandlers:\n  f:\n    class: logging.FileHandler\n    filename: {tmp}/afile\n    mode: w\n"
        "root:\n  handlers: [f]\n")


def make_layer_files(tmp: Path, rng) -> None:
    """decoder_layer inputs (L 1, B 1, H 8, 2/1 heads, d 4, F 8, S_kv 3): a good file and one
    bad array each."""
    L, B, H, hq, hkv, d, F, S = 1, 1, 8, 2, 1, 4, 8, 3
    shapes = {"x": (B, H), "attn_norm": (L, H), "wq": (L, H, hq * d), "wk": (L, H, hkv * d), "wv": (L, H, hkv * d),
              "wo": (L, hq * d, H), "ffn_norm": (L, H), "w_gate": (L, H, F), "w_up": (L, H, F), "w_down": (L, F, H),
              "k_cache": (L, B, hkv, S, d), "v_cache": (L, B, hkv, S, d)}
    good = {n: rng.standard_normal(s) for n, s in shapes.items()}
    good.update(positions=np.array([S]), rope_theta=np.float64(1e4), eps=np.float64(1e-5))
    np.savez(tmp / "layer_good.npz", **good)
    np.savez(tmp / "layer_wq.npz", **{**good, "wq": good["wq"][:, :6]})
    np.savez(tmp / "layer_layers.npz", **{**good, "w_down": np.concatenate([good["w_down"]] * 2)})
    np.savez(tmp / "layer_no_wo.npz", **{n: a for n, a in good.items() if n != "wo"})
    np.savez(tmp / "layer_extra.npz", **good, bias=np.zeros(8))
    np.savez(tmp / "layer_pos.npz", **{**good, "positions": np.array([-1])})


def _prepare(row: dict, tmp: Path):
    """The row's argv (``<tmp>`` filled in, a run dir under ``<tmp>/runs`` unless the row
    sets one) and the sentinel files put in that run dir beforehand."""
    args = [a.replace("<tmp>", str(tmp)) for a in row["args"]]
    run_dir = None
    if not any(a.startswith("hydra.run.dir=") for a in args):
        run_dir = tmp / "runs" / row["id"]
        args.append(f"hydra.run.dir={run_dir}")
    elif f"{tmp}/runs/" in " ".join(args):
        run_dir = Path(next(a for a in args if a.startswith("hydra.run.dir=")).split("=", 1)[1])
    sentinels = {}
    if run_dir is not None:  # results of "a previous run" that a failed run must leave alone
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, body in SENTINELS.items():
            p = run_dir / name
            if not p.exists():
                p.write_bytes(body)
                sentinels[name] = body
        if not (run_dir / "status.json").exists():  # they are a kbframe run's (kbframe.run.rundir.check_foreign)
            (run_dir / "status.json").write_text(PREVIOUS_STATUS)
    return [*args, "run.progress=false"], run_dir, sentinels


def real_cli(argv: list[str]) -> dict:
    """``sys.executable -m kbframe ARGV`` in a fresh interpreter."""
    p = subprocess.run([sys.executable, "-m", "kbframe", *argv], cwd=REPO, capture_output=True, text=True,
                       timeout=180)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


_RUN: dict = {}  # the rows' results, once per process: a worker may get the rows in several batches


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Every selected row run as a subprocess of the CLI: forked from a server that has
    imported kbframe once (tests/cli_forkserver.py), a few at a time; once per process
    (pytest-xdist may tear the module's fixture down between two batches of rows)."""
    if "rows" not in _RUN:
        _RUN["rows"] = _run_rows(request, tmp_path_factory)
    return _RUN["rows"]


def _run_rows(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_inputs")
    make_files(tmp)
    wanted = [item.callspec.params["row_id"] for item in request.session.items
              if item.module is sys.modules[__name__] and hasattr(item, "callspec")
              and "row_id" in item.callspec.params]
    prepared = {r: _prepare(ROWS[r], tmp) for r in wanted}
    out = run_many([{"id": r, "argv": argv, "cwd": str(REPO)} for r, (argv, _, _) in prepared.items()],
                   jobs=max(2, min(4, os.cpu_count() or 2)))
    for r, (argv, run_dir, sentinels) in prepared.items():
        out[r].update(args=argv, run_dir=run_dir, sentinels=sentinels)
    return tmp, out


def _pattern(msg: str, tmp: Path) -> re.Pattern:
    parts = [re.escape(p).replace(re.escape("<tmp>"), re.escape(str(tmp))) for p in msg.split("…")]
    return re.compile("^" + ".*".join(parts) + "$")


@pytest.mark.xdist_group("bad_inputs")  # one worker runs every row: the fixture forks them all at once
@pytest.mark.parametrize("row_id", list(ROWS))
def test_bad_input(results, row_id):
    tmp, res = results
    r, row = res[row_id], ROWS[row_id]
    err = r["stderr"].strip()
    assert r["rc"] == 1, f"exit {r['rc']} for {r['args']}\n{r['stderr']}\n{r['stdout'][-500:]}"
    assert "Traceback" not in r["stderr"], r["stderr"]
    assert len(err.splitlines()) == 1, f"not one line:\n{err}"
    assert _pattern("kbframe: error: " + row["msg"], tmp).match(err), (
        f"docs/errors.md row '{row_id}' says\n  {row['msg']}\nbut the CLI printed\n  {err}")
    assert "latency" not in r["stdout"]  # no summary of a run that failed
    for name, body in r["sentinels"].items():
        p = r["run_dir"] / name
        assert p.read_bytes() == body, f"{name} in the run dir was changed by a failed run"
    if row_id == "out_not_a_dir":
        assert not (tmp / "afile" / "run").exists() and (tmp / "afile").is_file()
    if row_id.startswith(("out_link", "out_sweep_link", "out_foreign", "out_sweep_foreign")):
        assert sorted(os.listdir(tmp / "victims")) == ["file"]  # nothing written through a link
        assert (tmp / "victims" / "file").read_bytes() == b"the user's file\n"
    if row_id.startswith(("out_foreign", "out_sweep_foreign")):  # another program's files untouched
        got = {str(p.relative_to(tmp / "foreign")): p.read_text() for p in (tmp / "foreign").rglob("*") if p.is_file()}
        assert got == {"run/metrics.json": "mine\n", "run/trace.json": "mine\n", "run/tensors.npz": "x\n",
                       "status/status.json": '{"state": "mine"}\n', "status/trace.json": "mine\n",
                       "sweep/0/metrics.json": "mine\n", "sweep/data.csv": "a,b\n"}, got


@pytest.mark.parametrize("row_id", ["type_float", "unknown_bench", "tcm_too_small", "in_pickled", "out_not_a_dir"])
def test_fork_server_is_the_real_cli(tmp_path, row_id):
    """The fork server gives what a fresh ``sys.executable -m kbframe`` gives, byte for byte."""
    make_files(tmp_path)
    argv, _, _ = _prepare(ROWS[row_id], tmp_path)
    forked = run_many([{"id": row_id, "argv": argv, "cwd": str(REPO)}])[row_id]
    real = real_cli(argv)
    assert (forked["rc"], forked["stderr"], forked["stdout"]) == (real["rc"], real["stderr"], real["stdout"])
    assert real["rc"] == 1 and real["stderr"].startswith("kbframe: error: ")


def test_docs_table_is_complete():
    ids = [r["id"] for r in doc_rows()]
    assert len(ids) == len(set(ids)) >= 50
    assert f"the {len(ids)} rows below" in DOCS.read_text(encoding="utf-8")  # the count it states is true
    text = DOCS.read_text(encoding="utf-8")
    for heading in ("fp16 data mode", "Resource checks before the simulation", "Files of a failed run"):
        assert heading in text


@pytest.mark.parametrize("overrides", [("hardware.tcm_bytes=1024",), ("bench.tile=1000000", "bench.S_kv=32768"),
                                       ("bench.S_kv=1000000000000",), ("hardware.hbm_bytes=10000",)])
def test_impossible_run_fails_fast(tmp_path, overrides, monkeypatch):
    """Resource needs are checked before the simulation: an impossible run is refused
    before any simulation starts (the engine is never run, whatever the machine's load),
    with numbers."""
    from kbframe.sim.engine import Engine
    monkeypatch.setattr(Engine, "run", lambda *a, **k: pytest.fail("the simulation started"))
    cfg = compose_cfg(*overrides, "run.progress=false", bench="decode_opt3")
    with pytest.raises(KbframeError) as e:
        run_bench(cfg, tmp_path / "run")
    assert re.search(r"\d+ (B|GiB)", str(e.value))
    assert not (tmp_path / "run").exists()


def test_tcm_preflight_is_exact(tmp_path):
    """The dry run's TCM need equals the real run's high water: a TCM of exactly that size
    runs, one alignment unit less is refused before the simulation."""
    m = run_bench(compose_cfg("bench.S_kv=200", "run.progress=false", bench="decode_opt3"), tmp_path / "a")
    need = m["tcm"]["high_water_bytes"]
    run_bench(compose_cfg("bench.S_kv=200", f"hardware.tcm_bytes={need}", "run.progress=false",
                          bench="decode_opt3"), tmp_path / "b")
    with pytest.raises(TcmOverflowError, match=f"needs {need} B of TCM in all"):
        run_bench(compose_cfg("bench.S_kv=200", f"hardware.tcm_bytes={need - 64}", "run.progress=false",
                              bench="decode_opt3"), tmp_path / "c")


def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path):
    """A path whose component is longer than the file system allows (255 bytes) is refused
    in one line naming it, as a run directory, an inputs file and a sweep directory to
    report, never an OSError traceback."""
    long = tmp_path / ("a" * 300)
    reqs = [{"id": "run_dir", "argv": ["+bench=decode_opt2", f"hydra.run.dir={long}"], "cwd": str(REPO)},
            {"id": "inputs", "argv": ["+bench=decode_opt2", f"bench.inputs.path={long}.npz",
                                      f"hydra.run.dir={tmp_path / 'run'}"], "cwd": str(REPO)}]
    out = run_many(reqs)
    assert (out["run_dir"]["rc"], out["run_dir"]["stderr"]) == (
        1, f"kbframe: error: cannot write the run directory '{long}' (hydra.run.dir): File name too long\n")
    assert (out["inputs"]["rc"], out["inputs"]["stderr"]) == (
        1, f"kbframe: error: bench.inputs.path: cannot read '{long}.npz': File name too long\n")
    p = subprocess.run([sys.executable, "-m", "kbframe.report", f"{long}"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert (p.returncode, p.stderr) == (2, f"kbframe: error: cannot read '{long}': File name too long\n")
