"""trace.json (README "Timeline"): Chrome trace-event format, one process per PE, one
track per unit, a slice per op_log record with its op_kind / cmd / bytes / tile, flows from
dispatch to completion, times in µs; slice counts per unit equal the op_log's."""
import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from kbframe.run.metrics import summary
from kbframe.errors import NumericsError
from kbframe.report.trace import tracks_from_units, write_trace
from kbframe.report.trace import main as trace_main

from conftest import REPO, compose_cfg, read_oplog, run

X_FIELDS = {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
ARGS = {"op_kind", "cmd", "bytes", "tile"}
FLOW_FIELDS = {"name", "cat", "ph", "id", "ts", "pid", "tid"}


def _plain(trace: bytes) -> bytes:
    """A run's trace less its critical-path flags: what a rebuild from the op_log alone
    writes (kbframe.report.trace.write_trace)."""
    return trace.replace(b',"critical":true', b"")


@pytest.fixture(scope="module")
def opt2_run(tmp_path_factory):
    """Default-shape +bench=decode_opt2 (data mode), as the issue asks."""
    d = tmp_path_factory.mktemp("opt2")
    run(d, bench="decode_opt2")
    return d, json.loads((d / "trace.json").read_text()), read_oplog(d / "op_log.jsonl")


def test_trace_loads_and_every_event_has_its_fields(opt2_run):
    _, trace, _ = opt2_run
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    assert events
    for ev in events:
        ph = ev["ph"]
        assert ph in ("X", "M", "s", "t", "f"), ev
        if ph == "X":
            assert X_FIELDS <= ev.keys() and ARGS <= ev["args"].keys(), ev
            assert ev["dur"] >= 0 and ev["ts"] >= 0
            assert ev["name"] == ev["args"]["op_kind"]
        elif ph == "M":
            assert {"name", "pid", "tid", "args"} <= ev.keys(), ev
        else:
            assert FLOW_FIELDS <= ev.keys(), ev


#: the default hardware's tracks: op_log unit → track name (the labels its units declare)
TRACKS = {"cpu": "PE_CPU dispatch", "scheduler": "PE_SCHEDULER", "dma_read": "DMA read",
          "dma_write": "DMA write", "gemm": "GEMM", "math": "MATH"}


def test_tracks_come_from_the_units_labels(opt2_run):
    d, _, _ = opt2_run
    assert tracks_from_units(json.loads((d / "metrics.json").read_text())["units"]) == TRACKS


def test_slice_counts_per_unit_equal_the_op_log(opt2_run):
    _, trace, log = opt2_run
    slices = Counter(ev["cat"] for ev in trace["traceEvents"] if ev["ph"] == "X")
    assert slices == Counter(r["unit"] for r in log)
    assert set(slices) == set(TRACKS)  # cpu, scheduler, dma_read, dma_write, gemm, math


def test_slices_are_the_op_log_records_in_microseconds(opt2_run):
    _, trace, log = opt2_run
    got = sorted((ev["cat"], ev["args"]["cmd"], ev["args"]["tile"], ev["args"]["bytes"], ev["ts"],
                  ev["dur"]) for ev in trace["traceEvents"] if ev["ph"] == "X")
    want = sorted((r["unit"], r["cmd"], r["tile"], r["bytes"], r["t_start_ns"] / 1000,
                   (r["t_end_ns"] - r["t_start_ns"]) / 1000) for r in log)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:4] == w[:4]
        assert g[4] == pytest.approx(w[4], abs=1e-9) and g[5] == pytest.approx(w[5], abs=1e-9)


def test_one_process_per_pe_and_named_tracks_per_unit(opt2_run):
    _, trace, _ = opt2_run
    meta = [ev for ev in trace["traceEvents"] if ev["ph"] == "M"]
    procs = {ev["pid"]: ev["args"]["name"] for ev in meta if ev["name"] == "process_name"}
    assert procs == {0: "PE0"}
    threads = {ev["tid"]: ev["args"]["name"] for ev in meta if ev["name"] == "thread_name"}
    assert set(TRACKS.values()) <= set(threads.values())
    # every slice sits on a named track of a named process, and the track belongs to its unit
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            assert ev["pid"] in procs and ev["tid"] in threads
            assert threads[ev["tid"]].startswith(TRACKS[ev["cat"]])


def test_slices_on_one_track_never_partly_overlap(opt2_run):
    """Complete events on a thread must nest; overlapping spans go to overflow lanes."""
    _, trace, _ = opt2_run
    by_tid = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            by_tid[(ev["pid"], ev["tid"])].append((round(ev["ts"] * 1e6), round((ev["ts"] + ev["dur"]) * 1e6)))
    for spans in by_tid.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b0 >= a1, (a0, a1, b0, b1)


def test_flows_follow_each_command_from_dispatch_to_completion(opt2_run):
    _, trace, log = opt2_run
    flows = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev["ph"] in "stf":
            flows[ev["id"]].append(ev)
    n_cmds = len({r["cmd"] for r in log if r["unit"] == "cpu"})
    assert len(flows) == n_cmds
    slices = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    by_cmd = defaultdict(list)
    for ev in slices:
        by_cmd[ev["args"]["cmd"]].append(ev)
    composite = next(r["cmd"] for r in log if r["unit"] == "cpu" and r["op_kind"] == "composite"
                     and any(x["cmd"] == r["cmd"] and x["unit"] == "gemm" for x in log))
    steps = flows[composite]
    assert [e["ph"] for e in steps] == ["s"] + ["t"] * (len(steps) - 2) + ["f"]
    assert [e["ts"] for e in steps] == sorted(e["ts"] for e in steps)
    # each step binds to a slice of this command on the step's track
    cats = []
    for e in steps:
        hit = [s for s in by_cmd[composite] if s["tid"] == e["tid"] and s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]
        assert hit, e
        cats.append(hit[0]["cat"])
    assert cats[0] == "cpu" and cats[1] == "scheduler"
    assert {"gemm", "math", "dma_read"} <= set(cats[2:])
    assert len(steps) == len(by_cmd[composite])  # dispatch, scheduler span, every stage


def test_write_trace_names_a_malformed_line(tmp_path):
    (tmp_path / "op_log.jsonl").write_text('{"pe": 0, "unit": "cpu"}\n')
    with pytest.raises(ValueError, match=r"op_log.jsonl:1: malformed"):
        write_trace(tmp_path / "op_log.jsonl", tmp_path / "trace.json")
    assert not (tmp_path / "trace.json").exists() and not list(tmp_path.glob("*.tmp"))


def test_trace_of_a_ragged_opt3_run_is_consistent(tmp_path):
    run(tmp_path, "bench.S_kv=130", "bench.data=false", bench="decode_opt3")
    info = write_trace(tmp_path / "op_log.jsonl", tmp_path / "again.json", TRACKS)
    # a rebuild from the op_log alone is the run's trace less the critical-path flags
    ran = (tmp_path / "trace.json").read_bytes()
    assert b',"critical":true' in ran
    assert (tmp_path / "again.json").read_bytes() == _plain(ran)
    log = read_oplog(tmp_path / "op_log.jsonl")
    assert info["slices"] == dict(Counter(r["unit"] for r in log))
    assert {r["tile"] for r in log} >= {-1, 0}


# ---------------------------------------------------------------- any JSON layout, the same trace

GOLDEN = REPO / "tests" / "goldens" / "trace"


def test_trace_is_byte_identical_to_the_golden(tmp_path):
    """``tests/goldens/trace/trace.json`` was written from ``op_log.jsonl`` beside it by the
    writer from before the fast path (json.loads on every line). The op_log is a small opt2
    run in kbframe's own layout, then PE1 lines in other JSON layouts: another key order,
    no spaces, missing ``tile``/``bytes``, escapes and non-ASCII names, an exponent, an
    integer time, a blank and an indented line, sub-µs and 10¹² ns times, an unknown unit.
    The trace must not move by a byte."""
    info = write_trace(GOLDEN / "op_log.jsonl", tmp_path / "trace.json", TRACKS)
    assert (tmp_path / "trace.json").read_bytes() == (GOLDEN / "trace.json").read_bytes()
    assert info["flows"] == 15 and info["lanes"]["scheduler@PE0"] == 3 and info["lanes"]["ipcq@PE1"] == 2
    assert info["slices"] == {"cpu": 14, "math": 35, "scheduler": 15, "dma_read": 8, "gemm": 7, "dma_write": 1,
                              "ipcq": 2}


def test_kbframe_layout_and_any_json_layout_give_the_same_trace(opt2_run, tmp_path):
    """The same records re-written in another JSON layout (kbframe.records.RecordTable.parse
    reads any) give a byte-identical trace."""
    d, trace, log = opt2_run
    other = tmp_path / "op_log.jsonl"
    other.write_text("".join(json.dumps(dict(reversed(r.items())), separators=(",", ":")) + "\n" for r in log))
    write_trace(other, tmp_path / "trace.json", TRACKS)
    assert (tmp_path / "trace.json").read_bytes() == _plain((d / "trace.json").read_bytes())


@pytest.mark.parametrize("line, error", [
    ('{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 01, "tile": -1, "t_start_ns": 0.0, "t_end_ns": 1.0, '
     '"bytes": 8}', "JSONDecodeError"),
    ('{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 1, "tile": -1, "t_start_ns": "0.0", "t_end_ns": 1.0, '
     '"bytes": 8}', "TypeError"),
    ('{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 1, "tile": -1, "t_start_ns": NaN, "t_end_ns": 1.0, '
     '"bytes": 8}', "ValueError"),
    ('{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 1, "tile": -1, "t_start_ns": Infinity, "t_end_ns": 1.0, '
     '"bytes": 8}', "OverflowError"),
    ('{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 1, "tile": -1, "t_start_ns": 0.0, "t_end_ns": 1.0, '
     '"bytes": 8, "t_data_ns": null}', "TypeError"),
])
def test_a_malformed_line_in_kbframes_layout_is_named(tmp_path, line, error):
    good = '{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 1, "tile": -1, "t_start_ns": 0.0, "t_end_ns": 1.0, ' \
           '"bytes": 8}\n'
    (tmp_path / "op_log.jsonl").write_text(good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"op_log.jsonl:3: malformed op_log record \({error}"):
        write_trace(tmp_path / "op_log.jsonl", tmp_path / "trace.json")
    assert not (tmp_path / "trace.json").exists() and not list(tmp_path.glob("*.tmp"))


def test_a_line_nested_deeper_than_any_record_is_named_not_a_traceback(tmp_path):
    """A line of 200,000 nested lists (deeper than Python's parser recurses) is a malformed
    record like any other: named by its line, never a RecursionError."""
    good = '{"pe": 0, "unit": "math", "op_kind": "add", "cmd": 1, "tile": -1, "t_start_ns": 0.0, "t_end_ns": 1.0, ' \
           '"bytes": 8}\n'
    (tmp_path / "op_log.jsonl").write_text(good + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(ValueError, match=r"op_log.jsonl:2: malformed op_log record \(nested too deep\)$"):
        write_trace(tmp_path / "op_log.jsonl", tmp_path / "trace.json")


# ---------------------------------------------------------------- run.trace

SMALL = ("bench.S_kv=130", "bench.G=2", "bench.d=32")


def test_run_trace_is_on_by_default_and_listed(tmp_path):
    assert compose_cfg().run.trace is True
    m = run(tmp_path, *SMALL)
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert m["files"] == ["metrics.json", "op_log.jsonl", "tensors.npz", "trace.json"]
    assert json.loads((tmp_path / "metrics.json").read_text())["files"] == m["files"]
    assert f"files       {tmp_path}/{{metrics.json, op_log.jsonl, tensors.npz, trace.json}}" in summary(m, tmp_path)


def test_run_trace_false_writes_none_and_removes_an_earlier_one(tmp_path):
    """A sweep can skip the timeline; the trace an earlier run left in the directory is
    removed (it would not belong to this run), nothing claims one, and
    ``python -m kbframe.report.trace RUN_DIR`` builds the same trace later."""
    run(tmp_path, *SMALL)
    earlier = (tmp_path / "trace.json").read_bytes()
    (tmp_path / "trace.json.partial").write_text("a failed run's staged trace")
    m = run(tmp_path, *SMALL, "run.trace=false")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "op_log.jsonl", "tensors.npz"]
    assert m["files"] == ["metrics.json", "op_log.jsonl", "tensors.npz"]
    assert json.loads((tmp_path / "metrics.json").read_text())["files"] == m["files"]
    assert "trace.json" not in summary(m, tmp_path)
    m = run(tmp_path, *SMALL, "run.trace=false", "bench.data=false")
    assert m["files"] == ["metrics.json", "op_log.jsonl"]
    assert f"files       {tmp_path}/{{metrics.json, op_log.jsonl}}" in summary(m, tmp_path)
    assert trace_main([str(tmp_path)]) == 0
    assert (tmp_path / "trace.json").read_bytes() == _plain(earlier)  # same op_log, same trace (no flags)


def test_a_failed_run_with_run_trace_false_leaves_the_earlier_trace(tmp_path):
    """Files are replaced (or removed) only when a run passes: this one fails in the
    simulation (an fp16 GEMM operand overflows), after the run directory was written."""
    rng = np.random.default_rng(0)
    q = np.zeros((2, 8))
    q[0, 0] = 60000.0
    np.savez(tmp_path / "q60k.npz", q=q, k=rng.standard_normal((32, 8)) * 1e-3, v=rng.standard_normal((32, 8)),
             scale=np.float64(2.0))
    out = tmp_path / "run"
    out.mkdir()
    (out / "trace.json").write_bytes(b'{"traceEvents": []}\n')
    with pytest.raises(NumericsError, match="GEMM operand 'scale'"):
        run(out, f"bench.inputs.path={tmp_path / 'q60k.npz'}", "bench.data_dtype=float16", "run.trace=false",
            bench="decode_opt3")
    assert (out / "op_log.jsonl.partial").exists()  # the simulation ran
    assert (out / "trace.json").read_bytes() == b'{"traceEvents": []}\n'


def test_rebuilding_a_trace_writes_through_no_link(tmp_path):
    """``python -m kbframe.report.trace RUN_DIR`` stages the trace under a fresh name it creates
    itself and renames it over trace.json: a link planted at trace.json or at the names a
    staged file could take is replaced, and what it points to is never written."""
    run_dir = tmp_path / "run"
    run(run_dir, "bench.S_kv=64", "bench.data=false", "run.trace=false")
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (run_dir / "trace.json").symlink_to(victim)
    (run_dir / "trace.json.tmp").symlink_to(victim)
    assert trace_main([str(run_dir)]) == 0
    assert victim.read_text() == "mine"
    assert not (run_dir / "trace.json").is_symlink()
    assert json.loads((run_dir / "trace.json").read_text())["traceEvents"]


@pytest.mark.parametrize("text, why", [
    ("[1, 2]", "not a JSON object"),
    ('{"units": 5}', "'int' object is not iterable"),
    ("garbage", "Expecting value: line 1 column 1 (char 0)"),
])
def test_a_broken_metrics_json_beside_the_op_log_is_named(tmp_path, capsys, text, why):
    run_dir = tmp_path / "run"
    run(run_dir, "bench.S_kv=64", "bench.data=false", "run.trace=false")
    (run_dir / "metrics.json").write_text(text)
    assert trace_main([str(run_dir)]) == 1
    assert capsys.readouterr().err == f"kbframe: error: {run_dir / 'metrics.json'}: not a run's metrics.json ({why})\n"
    assert not (run_dir / "trace.json").exists()
