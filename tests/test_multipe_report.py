"""What a run on many PEs reports (README "Reports"): per-PE figures and their aggregates
in metrics.json, bounds that hold on many PEs (≤ the latency), the slowest PE and the spread
on the console, and trace.json's IPCQ track per link with a flow from each send to the
receive that took it."""
import json

import pytest

from conftest import read_oplog, run
from kbframe.run.metrics import summary

SMALL = ("hardware=cube", "bench.H_q=4", "bench.H_kv=1", "bench.d=16", "bench.tile=16", "bench.S_kv=200",
         "bench.splits=8", "bench.data=false")


@pytest.fixture(scope="module", params=["chain", "tree"])
def splitk(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"splitk_{request.param}")
    m = run(d, *SMALL, f"bench.merge={request.param}", bench="decode_splitk")
    return d, m, read_oplog(d / "op_log.jsonl")


def test_per_pe_figures_add_up_to_the_runs(splitk):
    d, m, recs = splitk
    pes = m["pes"]
    assert [p["pe"] for p in pes] == list(range(8))
    for p in pes:  # each PE's end is its last record's
        assert p["latency_ns"] == max(r["t_end_ns"] for r in recs if r["pe"] == p["pe"])
        assert p["dispatch"]["commands"] == sum(1 for r in recs if r["pe"] == p["pe"] and r["unit"] == "cpu")
        assert p["units"]["dma_read"]["bytes"] == sum(r["bytes"] for r in recs
                                                      if r["pe"] == p["pe"] and r["unit"] == "dma_read")
    assert m["sim"]["latency_ns"] == max(p["latency_ns"] for p in pes)  # the last PE's end
    assert m["dispatch"]["commands"] == sum(p["dispatch"]["commands"] for p in pes) == sum(
        1 for r in recs if r["unit"] == "cpu")
    assert m["dispatch"]["cycles"] == pytest.approx(sum(p["dispatch"]["cycles"] for p in pes))
    slow = max(pes, key=lambda p: p["latency_ns"])
    fast = min(pes, key=lambda p: p["latency_ns"])
    assert m["pe_spread"] == {"n_pes": 8, "slowest_pe": slow["pe"], "slowest_ns": slow["latency_ns"],
                              "fastest_pe": fast["pe"], "fastest_ns": fast["latency_ns"],
                              "spread": (slow["latency_ns"] - fast["latency_ns"]) / slow["latency_ns"]}
    # partitioned HBM: each PE its own 204.8 GB/s; the HBM bound is the busiest PE's
    assert m["hbm"]["gbps_used"] == pytest.approx(8 * 204.8) and m["hbm"]["mode"] == "partitioned"
    assert m["roofline"]["hbm_ns"] == max(p["hbm_ns"] for p in pes)
    for name in ("hbm_ns", "compute_ns", "dispatch_ns"):  # bounds on many PEs stay bounds
        assert m["roofline"][name] <= m["sim"]["latency_ns"]
    assert m["roofline"]["fraction"] <= 1.0


def test_ipcq_links_count_every_send(splitk):
    d, m, recs = splitk
    sends = [r for r in recs if r["unit"] == "ipcq_send"]
    by_link = {}
    for r in sends:
        by_link.setdefault((r["pe"], r["peer"]), []).append(r)
    links = m["ipcq"]["links"]
    assert [(ln["src"], ln["dst"]) for ln in links] == sorted(by_link)
    for ln in links:
        rs = by_link[(ln["src"], ln["dst"])]
        assert (ln["sends"], ln["bytes"]) == (len(rs), sum(r["bytes"] for r in rs))
        assert ln["max_queued"] <= ln["credits"]
    assert m["ipcq"]["sends"] == len(sends) and m["ipcq"]["bytes"] == sum(r["bytes"] for r in sends)


def test_console_names_the_slowest_pe_and_the_busiest_link(splitk):
    d, m, _ = splitk
    text = summary(m, d)
    sp, ln = m["pe_spread"], max(m["ipcq"]["links"], key=lambda x: x["busy_ns"])
    assert (f"  PEs         8 used; slowest PE{sp['slowest_pe']} {sp['slowest_ns']:.1f} ns, fastest "
            f"PE{sp['fastest_pe']} {sp['fastest_ns']:.1f} ns (spread {sp['spread']:.1%}); HBM ") in text
    assert f"; busiest PE{ln['src']}→PE{ln['dst']} {ln['busy_ns']:.1f} ns" in text
    assert "    PE0 unit       busy ns" in text
    even = {**m, "pe_spread": {**sp, "fastest_pe": 3, "fastest_ns": sp["slowest_ns"], "spread": 0.0}}
    assert f"  PEs         8 used; all end at {sp['slowest_ns']:.1f} ns; HBM " in summary(even, d)  # not one PE twice


def test_trace_has_a_track_per_link_and_a_flow_per_send(splitk):
    d, m, recs = splitk
    ev = json.loads((d / "trace.json").read_text())["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    sends = [r for r in recs if r["unit"] == "ipcq_send"]
    recvs = [r for r in recs if r["unit"] == "ipcq_recv"]
    assert {(r["pe"], f"IPCQ send → PE{r['peer']}") for r in sends} == {
        (pid, n) for (pid, _), n in names.items() if n.startswith("IPCQ send")}
    assert {(r["pe"], f"IPCQ recv ← PE{r['peer']}") for r in recvs} == {
        (pid, n) for (pid, _), n in names.items() if n.startswith("IPCQ recv")}
    flows = {}
    for e in ev:
        if e.get("cat") == "ipcq":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert len(flows) == len(sends) == len(recvs)
    for f in flows.values():  # from a send track to the receive track of the same link
        s, t = f["s"], f["f"]
        assert names[(s["pid"], s["tid"])] == f"IPCQ send → PE{t['pid']}"
        assert names[(t["pid"], t["tid"])] == f"IPCQ recv ← PE{s['pid']}"
        assert s["ts"] <= t["ts"]


def test_one_pe_reports_itself(tmp_path):
    m = run(tmp_path, "bench.S_kv=128", "bench.data=false")
    assert [p["pe"] for p in m["pes"]] == [0] and m["pe_spread"]["n_pes"] == 1 and m["pe_spread"]["spread"] == 0.0
    assert m["pes"][0]["units"] == m["units"] and m["ipcq"] == {"links": [], "bytes": 0, "sends": 0}
    assert m["pes"][0]["latency_ns"] == m["sim"]["latency_ns"]
    assert "  PEs " not in summary(m, tmp_path) and "  IPCQ " not in summary(m, tmp_path)
