"""trace.json (issue 5 "Timeline"): Chrome trace-event format, one process per PE, one
track per unit, a slice per op_log record with its op_kind / cmd / bytes / tile, flows from
dispatch to completion, times in µs; slice counts per unit equal the op_log's."""
import json
from collections import Counter, defaultdict

import pytest

from kbframe.trace import UNIT_TRACKS, write_trace

from conftest import read_oplog, run

X_FIELDS = {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"}
ARGS = {"op_kind", "cmd", "bytes", "tile"}
FLOW_FIELDS = {"name", "cat", "ph", "id", "ts", "pid", "tid"}


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


def test_slice_counts_per_unit_equal_the_op_log(opt2_run):
    _, trace, log = opt2_run
    slices = Counter(ev["cat"] for ev in trace["traceEvents"] if ev["ph"] == "X")
    assert slices == Counter(r["unit"] for r in log)
    assert set(slices) == set(UNIT_TRACKS)  # cpu, scheduler, dma_read, dma_write, gemm, math


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
    assert {name for name, _ in UNIT_TRACKS.values()} <= set(threads.values())
    # every slice sits on a named track of a named process, and the track belongs to its unit
    for ev in trace["traceEvents"]:
        if ev["ph"] == "X":
            assert ev["pid"] in procs and ev["tid"] in threads
            assert threads[ev["tid"]].startswith(UNIT_TRACKS[ev["cat"]][0])


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
    info = write_trace(tmp_path / "op_log.jsonl", tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "trace.json").read_bytes()
    log = read_oplog(tmp_path / "op_log.jsonl")
    assert info["slices"] == dict(Counter(r["unit"] for r in log))
    assert {r["tile"] for r in log} >= {-1, 0}
