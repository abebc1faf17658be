"""Critical path, steady-state period and binding kind.

Synthetic schedules whose critical path is known by construction (one crossing PEs, as
IPCQ traffic will), then the runs the issue names: opt2 at defaults is a 287 ns chain of
77 + 80 + 80 + 34 + 16, opt3 is dispatch-bound, opt3 with free dispatch is HBM-bound.
"""
from __future__ import annotations

import json

import pytest

from kbframe.report.critical_path import Segment, analyse, summary_line, walk

from conftest import run

NS = 1000  # ps


def _rows(events: list) -> list:
    """Rows in op_log order from ``(name, pe, unit, op_kind, cmd, t0, t1, t_data, why, ref,
    end_ref)`` events, times in ns; a ref or end_ref that is a name becomes that event's
    record index. Events are sorted by end time (the op_log's order), stably."""
    order = sorted(range(len(events)), key=lambda i: events[i][6])
    index = {events[i][0]: n for n, i in enumerate(order)}
    out = []
    for i in order:
        _, pe, unit, kind, cmd, t0, t1, td, why, ref, end = events[i]
        ref = index[ref] if isinstance(ref, str) else ref
        end = index[end] if isinstance(end, str) else end
        out.append((pe, unit, kind, cmd, t0 * NS, t1 * NS, td * NS if td >= 0 else -1, why, ref, end))
    return out, index


def _one_shot():
    """PE0 loads a tile (setup 77, data 40) and multiplies it (33); PE1 adds the result
    (16) once PE0's GEMM ends: a cross-PE dependency. PE1's own load is off the path."""
    return _rows([
        ("d0", 0, "cpu", "composite", 1, 0, 40, -1, "start", -1, -1),
        ("d1", 1, "cpu", "composite", 1, 0, 40, -1, "start", -1, -1),
        ("dma", 0, "dma_read", "dma_read", 1, 40, 157, 117, "admit", 1, -1),
        ("g", 0, "gemm", "gemm", 1, 157, 190, -1, "dep", "dma", -1),
        ("c0", 0, "scheduler", "composite", 1, 40, 190, -1, "dispatch", 1, "g"),
        ("dma1", 1, "dma_read", "dma_read", 1, 40, 120, 117, "admit", 1, -1),
        ("add", 1, "math", "add", 1, 190, 206, -1, "dep", "g", -1),
        ("c1", 1, "scheduler", "composite", 1, 40, 206, -1, "dispatch", 1, "add"),
    ])


def test_walk_follows_a_cross_pe_dependency_back_to_the_start():
    rows, ix = _one_shot()
    assert walk(rows) == [
        Segment(ix["d0"], "run", 0, 40 * NS),            # PE0 dispatch
        Segment(ix["dma"], "setup", 40 * NS, 117 * NS),  # admitted at dispatch end
        Segment(ix["dma"], "data", 117 * NS, 157 * NS),
        Segment(ix["g"], "run", 157 * NS, 190 * NS),
        Segment(ix["add"], "run", 190 * NS, 206 * NS),   # on PE1, after PE0's GEMM
    ]
    cp = analyse(rows, 1, "KV tile").metrics
    assert cp["steady"] is False and cp["period_ns"] == 206.0 and cp["path"]["ns"] == 206.0
    assert [(t["name"], t["pe"], t["ns"]) for t in cp["terms"]] == [
        ("dma_read setup", 0, 77.0), ("cpu dispatch composite", 0, 40.0), ("dma_read data", 0, 40.0),
        ("gemm", 0, 33.0), ("math add", 1, 16.0)]
    assert sum(t["ns"] for t in cp["terms"]) == cp["period_ns"]
    assert set(cp["units"]) == {"PE0.cpu", "PE1.cpu", "PE0.dma_read", "PE1.dma_read", "PE0.gemm", "PE1.math"}


def _ring(n_units: int):
    """Per unit j: PE0 loads (setup 10, data 20) after PE1's add of unit j-1 ended (a
    cross-PE dependency, as an IPCQ receive would be), multiplies (5), and PE1 adds (7)
    after PE0's GEMM. A 42 ns loop-carried chain; no unit is busy even half of it."""
    ev = []
    for j in range(n_units):  # every command is dispatched up front
        ev.append((f"d0.{j}", 0, "cpu", "composite", j, j, j + 1, -1, "start" if j == 0 else "cpu",
                   -1 if j == 0 else f"d0.{j - 1}", -1))
        ev.append((f"d1.{j}", 1, "cpu", "composite", j, j, j + 1, -1, "start" if j == 0 else "cpu",
                   -1 if j == 0 else f"d1.{j - 1}", -1))
    a = 1
    for j in range(n_units):
        dep = ("admit", j) if j == 0 else ("dep", f"add.{j - 1}")
        ev.append((f"dma.{j}", 0, "dma_read", "dma_read", j, a, a + 30, a + 10, *dep, -1))
        ev.append((f"g.{j}", 0, "gemm", "gemm", j, a + 30, a + 35, -1, "dep", f"dma.{j}", -1))
        ev.append((f"c0.{j}", 0, "scheduler", "composite", j, j + 1, a + 35, -1, "dispatch", j, f"g.{j}"))
        ev.append((f"add.{j}", 1, "math", "add", j, a + 35, a + 42, -1, "dep", f"g.{j}", -1))
        ev.append((f"c1.{j}", 1, "scheduler", "composite", j, j + 1, a + 42, -1, "dispatch", j, f"add.{j}"))
        a += 42
    return _rows(ev)


def test_steady_period_of_a_cross_pe_chain_is_known_by_construction():
    rows, ix = _ring(8)
    cp = analyse(rows, 8, "output tile")
    m = cp.metrics
    assert (m["steady"], m["binding"], m["unit_of_progress"]) == (True, "chain", "output tile")
    assert (m["period_ns"], m["units_per_period"], m["ns_per_unit"]) == (42.0, 1, 42.0)
    # the period starts where the path enters a command from outside: PE0's load setup
    assert [(t["name"], t["pe"], t["ns"]) for t in m["terms"]] == [
        ("dma_read setup", 0, 10.0), ("dma_read data", 0, 20.0), ("gemm", 0, 5.0), ("math add", 1, 7.0)]
    assert sum(t["ns"] for t in m["terms"]) == m["period_ns"]
    # the whole path: dispatch of unit 0 (1 ns), then 8 × 42 ns, nothing unexplained
    assert m["path"] == {"segments": 1 + 8 * 4, "ns": 1.0 + 8 * 42}
    assert all(s.phase != "wait" for s in cp.segments)
    assert (m["repetitions"], m["window_ns"]) == (8, [1.0, 1.0 + 8 * 42])
    # per period: PE0's DMA moves data 20 of 42 ns; its idle time is its setup (10) and
    # the wait for PE1's add (12 = gemm 5 + add 7), but after the last unit's transfer
    # (12 ns in 8 periods) it has nothing left to do
    u = m["units"]["PE0.dma_read"]
    assert (u["busy_ns"], u["idle_ns"]) == (20.0, 22.0)
    assert u["waited_for"] == {"dep math add": 7 * 12 / 8, "setup": 10.0, "finished": 12 / 8}
    assert m["units"]["PE1.math"]["waited_for"] == {"dep gemm": 35.0}
    assert m["busiest"] == {"unit": "PE0.dma_read", "busy_fraction": round(20 / 42, 6)}
    # the trace flag marks the path's records: every stage and PE0's first dispatch
    assert cp.records == {ix["d0.0"]} | {ix[f"{k}.{j}"] for j in range(8) for k in ("dma", "g", "add")}
    assert summary_line(m) == ("chain: 42 ns per output tile = dma_read setup 10 + dma_read data 20 + gemm 5 + "
                               "math add 7; busiest PE0.dma_read 47.6%")


def test_a_repetition_shorter_than_a_unit_is_taken_whole():
    """Two back-to-back 80 ns transfers per tile: the path repeats every transfer, the
    tile every two; 95 %+ busy makes it HBM-bound."""
    ev, n = [], 12
    for j in range(2 * n):
        t = 77 + 80 * j
        ev.append((f"dma.{j}", 0, "dma_read", "dma_read", j, 0 if j < 4 else t - 80 - 77, t + 80, t,
                   "admit", j, -1 if j == 0 else f"dma.{j - 1}"))
    rows, _ = _rows(ev)
    m = analyse(rows, n, "KV tile").metrics
    assert (m["binding"], m["period_ns"], m["units_per_period"]) == ("hbm", 160.0, 1)
    assert [t["name"] for t in m["terms"]] == ["dma_read data", "dma_read data"]


@pytest.fixture(scope="module")
def opt2(tmp_path_factory):
    d = tmp_path_factory.mktemp("opt2")
    return run(d, "bench.data=false"), d


def test_opt2_is_a_287_ns_chain_at_defaults(opt2):
    """The issue's reading of the op_log: every steady KV tile of opt2 takes DMA setup 77 +
    K data 80 + V data 80 + P·V GEMM 34 + add 16 = 287 ns, and HBM is idle 44 % of it."""
    m, d = opt2
    cp = json.loads((d / "metrics.json").read_text())["critical_path"]
    assert (cp["binding"], cp["steady"], cp["period_ns"], cp["units_per_period"]) == ("chain", True, 287.0, 1)
    assert [(t["name"], t["ns"]) for t in cp["terms"]] == [
        ("dma_read setup", 77.0), ("dma_read data", 80.0), ("dma_read data", 80.0), ("gemm", 34.0),
        ("math add", 16.0)]
    assert cp["units"]["dma_read"]["busy_ns"] == 160.0 and cp["units"]["dma_read"]["idle_ns"] == 127.0
    assert cp["units"]["dma_read"]["waited_for"] == {"setup": 77.0, "admission (hazard)": 50.0}
    assert m["roofline"]["binding"] == "chain" and m["roofline"]["largest_bound"] == "hbm"


def test_critical_slices_are_flagged_in_the_run_trace(opt2):
    _, d = opt2
    events = json.loads((d / "trace.json").read_text())["traceEvents"]
    flagged = [e for e in events if e.get("ph") == "X" and e["args"].get("critical")]
    lines = (d / "op_log.jsonl").read_text().splitlines()
    assert flagged and len(flagged) < len(lines)
    assert {e["cat"] for e in flagged} == {"cpu", "dma_read", "gemm", "math", "dma_write"}
    # the path covers the whole run: its last slice ends at the latency
    m = json.loads((d / "metrics.json").read_text())
    assert max(round((e["ts"] + e["dur"]) * 1e6) for e in flagged) == round(m["sim"]["latency_ns"] * 1000)


@pytest.mark.parametrize("overrides, binding, period", [
    ((), "dispatch", 545.5),                                          # 13 commands' dispatch per tile
    (("calibration.FIXED=0", "calibration.R=0"), "hbm", 160.0),       # K and V tile, back to back
])
def test_opt3_binding_kind(tmp_path, overrides, binding, period):
    cp = run(tmp_path, "bench.data=false", "run.trace=false", *overrides, bench="decode_opt3")["critical_path"]
    assert (cp["binding"], cp["period_ns"], cp["units_per_period"]) == (binding, period, 1)
    assert sum(round(t["ns"] * 1000) for t in cp["terms"]) == round(period * 1000)


def _reference_units(c, ta: int, tb: int, reps: int, multi_pe: bool, sched: dict) -> dict:
    """The record-by-record loop ``_units`` replaced (kept as the reference): one pass in
    op_log order, each unit's state its latest end, busy time and waits by label."""
    from kbframe.report.critical_path import _ns, _why_label
    state: dict = {}
    for i, pe, unit, t0, b1, td in zip(range(c.n), c.pe, c.unit, c.t0, c.t1, c.td):
        if unit == "scheduler":
            continue
        st = state.setdefault((pe, unit), [0, 0, {}])
        prev = st[0]
        if prev >= tb:
            continue
        b0 = td if td >= 0 else t0
        if b0 > prev and b0 > ta:
            label = _why_label(c, i, sched)
            cut = min(max(t0, prev), b0) if td >= 0 else b0
            for lab, a, b in ((label, prev, cut), ("setup", cut, b0)):
                a, b = max(a, ta), min(b, tb)
                if b > a:
                    st[2][lab] = st[2].get(lab, 0) + (b - a)
        if b1 > ta and b0 < tb:
            st[1] += min(b1, tb) - max(b0, ta)
        st[0] = max(st[0], b1)
    out = {}
    for (pe, unit), (prev, busy, waits) in sorted(state.items()):
        if prev < tb:
            waits["finished"] = waits.get("finished", 0) + tb - max(prev, ta)
        out[f"PE{pe}.{unit}" if multi_pe else unit] = {
            "busy_ns": _ns(busy / reps), "idle_ns": _ns((tb - ta - busy) / reps),
            "busy_fraction": round(busy / (tb - ta), 6),
            "waited_for": {k: _ns(v / reps) for k, v in sorted(waits.items(), key=lambda kv: -kv[1])}}
    return out


@pytest.mark.parametrize("bench, overrides", [
    ("decode_opt2", ("bench.S_kv=8192",)),
    ("decode_opt3", ("bench.S_kv=4100", "bench.tile=32")),
    ("decode_heads", ("+model=llama3_70b", "hardware=cube", "hardware.hbm_mode=shared", "bench.S_kv=2048")),
    ("decoder_layer", ("hardware=cube", "bench.tp=8", "bench.S_kv=512", "bench.layers=2")),
])
def test_unit_figures_equal_the_record_by_record_loop(bench, overrides):
    """Each unit's busy, idle and waited-for figures, a column at a time, are the loop's,
    over the whole run and over a window that cuts records in two."""
    from kbframe.report.critical_path import _units
    from kbframe.report.record_columns import Records
    from test_waits import _wait_rows
    c = Records(*_wait_rows(bench, *overrides).columns())
    plain = Records(*(list(col) if not hasattr(col, "tolist") else col.tolist() for col in c))
    sched = c.last_of("scheduler")
    last = {(pe, cmd): i for i, (pe, unit, cmd) in enumerate(zip(plain.pe, plain.unit, plain.cmd)) if unit == "scheduler"}
    assert sched.to_dict() == plain.last_of("scheduler").to_dict() == last
    end = int(max(c.t1))
    for ta, tb, reps in ((0, end, 1), (end // 3 + 7, 2 * end // 3, 3)):
        got = _units(c, ta, tb, reps, True, sched)
        assert got == _reference_units(plain, ta, tb, reps, True, sched)
        assert any(len(u["waited_for"]) > 1 for u in got.values())


@pytest.mark.parametrize("ids, q", [((3, 4, 5, 6), 1), ((3, 1 << 38, 5, 1 << 62), 1), ((3, 4, 5, 6), -1)],
                         ids=["dense", "spread", "negative-pe"])
def test_the_last_record_of_each_command_is_found_for_one_key_and_for_many(ids, q):
    """A unit's last record per (PE, command): a later record of a command replaces an
    earlier one, a key it lacks gives the default (one key) or -1 (many), whether the
    command ids are packed (a run's) or spread far apart, or a PE negative (an edited
    op_log's)."""
    from kbframe.report.record_columns import Records
    a, b, c, d = ids
    rows = [(0, "scheduler", "gemm", a, 0, 1, -1, "dispatch", -1, -1),
            (0, "gemm", "gemm", a, 0, 1, -1, "dep", -1, -1),
            (q, "scheduler", "gemm", b, 0, 2, -1, "dispatch", -1, -1),
            (0, "scheduler", "gemm", a, 0, 3, -1, "dispatch", -1, -1),
            (q, "scheduler", "gemm", d, 0, 4, -1, "dispatch", -1, -1)]
    last = Records(*zip(*rows)).last_of("scheduler")
    assert last.to_dict() == {(0, a): 3, (q, b): 2, (q, d): 4}
    assert (last.get((0, a)), last.get((q, d)), last.get((0, c)), last.get((2, a), -1), last.get((0, -5))) == \
        (3, 4, None, -1, None)
    assert last.many([0, q, q, 0, 7, -2], [a, b, c, d, a, a]).tolist() == [3, 2, -1, -1, -1, -1]
    assert not Records(*zip(*rows)).last_of("cpu") and last
