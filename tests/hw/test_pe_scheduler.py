"""PE_SCHEDULER cross-command hazards: strict FIFO on rw_handles and op inputs
(DDD-0065 §8, §10 "RW hazard"; ADR-0065 Test Requirement 4)."""
import numpy as np

from conftest import Sim

G, TILE, D = 8, 64, 128


def _tensors(rng):
    return {"x": rng.standard_normal((G, TILE)), "v": rng.standard_normal((TILE, D)),
            "w": rng.standard_normal((D, D)), "v2": rng.standard_normal((TILE, D))}


def _by_cmd(log):
    out = {}
    for r in log:
        if r["unit"] not in ("cpu", "scheduler"):
            out.setdefault(r["cmd"], []).append(r)
    return out


def _span(log, cmd):
    (r,) = [r for r in log if r["unit"] == "scheduler" and r["cmd"] == cmd]
    return r["t_start_ns"], r["t_end_ns"]


def _dispatched(log, cmd):
    (r,) = [r for r in log if r["unit"] == "cpu" and r["cmd"] == cmd]
    return r["t_end_ns"]


def test_ddd0065_s10_rw_hazard_reader_waits_for_inflight_writer(tmp_path, rng):
    """B reads Y, which in-flight A writes: B's stages (even its own DMA) start after A ends."""
    t = _tensors(rng)
    hs = {}

    def kern(tl):
        x = tl.load(tl.ref("x"))                                           # cmd 1
        hs["y"] = tl.composite(op="gemm", a=x, b=tl.ref("v"))              # cmd 2: A writes Y
        hs["z"] = tl.composite(op="gemm", a=hs["y"], b=tl.ref("w"))        # cmd 3: B reads Y

    sim = Sim(tmp_path, t)
    log = sim.run(kern)
    a_end = _span(log, 2)[1]
    b_stages = _by_cmd(log)[3]
    assert _dispatched(log, 3) < a_end           # B reached the scheduler while A was in flight…
    assert min(r["t_start_ns"] for r in b_stages) >= a_end  # …and started only after A completed
    assert _span(log, 3)[0] == a_end               # admitted at A's completion
    np.testing.assert_allclose(sim.read(hs["z"]), t["x"] @ t["v"] @ t["w"], rtol=1e-4, atol=1e-3)


def test_independent_composite_overlaps_inflight_one(tmp_path, rng):
    """Control for the test above: C touches nothing A writes, so it runs while A is in flight."""
    t = _tensors(rng)

    def kern(tl):
        x = tl.load(tl.ref("x"))                                           # cmd 1
        tl.composite(op="gemm", a=x, b=tl.ref("v"))                        # cmd 2: A
        tl.composite(op="gemm", a=tl.zeros((G, D), "c"), b=tl.ref("w"))    # cmds 3 (fill), 4: C

    log = Sim(tmp_path, t).run(kern)
    a_end = _span(log, 2)[1]
    assert min(r["t_start_ns"] for r in _by_cmd(log)[4]) < a_end


def test_war_writer_waits_for_inflight_reader(tmp_path, rng):
    """A reads X (GEMM a); B writes X (tl.copy into it): B waits until A completes."""
    t = _tensors(rng)
    hs = {}

    def kern(tl):
        x = tl.load(tl.ref("x"))                                           # cmd 1
        hs["y"] = tl.composite(op="gemm", a=x, b=tl.ref("v"))              # cmd 2: reads x
        tl.copy(tl.zeros((G, TILE), "zero"), out=x)                        # cmds 3 (fill), 4: writes x

    sim = Sim(tmp_path, t)
    log = sim.run(kern)
    a_end = _span(log, 2)[1]
    assert _dispatched(log, 4) < a_end
    assert min(r["t_start_ns"] for r in _by_cmd(log)[4]) >= a_end
    np.testing.assert_allclose(sim.read(hs["y"]), t["x"] @ t["v"], rtol=1e-4, atol=1e-3)  # A saw the old x


def test_adr0065_tr4_strict_fifo_rw_serialization(tmp_path, rng):
    """Two consecutive softmax_merge composites sharing (m, l, O) complete in dispatch order
    and their stages do not interleave; a later independent command waits behind them."""
    t = _tensors(rng)
    t["s1"], t["s2"] = rng.standard_normal((G, TILE)), rng.standard_normal((G, TILE))
    hs = {}

    def kern(tl):
        s1, s2 = tl.load(tl.ref("s1")), tl.load(tl.ref("s2"))           # cmds 1, 2
        m = tl.full((G, 1), float("-inf"), "m")                            # 3
        l, O = tl.zeros((G, 1), "l"), tl.zeros((G, D), "O")                # 4, 5
        for s, v in ((s1, "v"), (s2, "v2")):                               # 6, 7
            tl.composite(prologue=[{"op": "softmax_merge", "s": s, "m": m, "l": l, "O": O}],
                         op="gemm", b=tl.ref(v), out=O, epilogue=[{"op": "add", "other": O}])
        hs["m"], hs["l"], hs["O"] = m, l, O

    sim = Sim(tmp_path, t)
    log = sim.run(kern)
    st = _by_cmd(log)
    a_end = _span(log, 6)[1]
    assert max(r["t_end_ns"] for r in st[6]) == a_end
    assert _dispatched(log, 7) < a_end
    assert min(r["t_start_ns"] for r in st[7]) >= a_end      # no interleaving
    assert _span(log, 6)[1] <= _span(log, 7)[1]              # completion in dispatch order
    done = [r["cmd"] for r in log if r["unit"] == "scheduler" and r["cmd"] in (6, 7)]
    assert done == [6, 7]
    # numbers: two online-softmax merges = softmax over the 128 concatenated scores (unnormalised)
    s = np.concatenate([t["s1"], t["s2"]], axis=1)
    v = np.concatenate([t["v"], t["v2"]], axis=0)
    m_ref = s.max(axis=1, keepdims=True)
    p = np.exp(s - m_ref)
    np.testing.assert_allclose(sim.read(hs["m"]), m_ref, rtol=1e-6)
    np.testing.assert_allclose(sim.read(hs["l"]), p.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(sim.read(hs["O"]), p @ v, rtol=1e-4, atol=1e-4)


def test_head_of_line_blocking_is_strict_fifo(tmp_path, rng):
    """Strict FIFO: an independent command dispatched after a blocked one waits too."""
    t = _tensors(rng)

    def kern(tl):
        x = tl.load(tl.ref("x"))                                           # cmd 1
        y = tl.composite(op="gemm", a=x, b=tl.ref("v"))                    # cmd 2: A writes y
        tl.composite(op="gemm", a=y, b=tl.ref("w"))                        # cmd 3: B (blocked on A)
        tl.composite(op="gemm", a=x, b=tl.ref("v2"))                       # cmd 4: C independent

    log = Sim(tmp_path, t).run(kern)
    a_end = _span(log, 2)[1]
    assert _dispatched(log, 4) < a_end
    assert min(r["t_start_ns"] for r in _by_cmd(log)[4]) >= a_end


def test_pe_cpu_resumes_as_soon_as_the_queue_has_room(tmp_path, rng):
    """A queue of 2: A waits for the load of v, B for A, so C's dispatch waits for room.
    When the load completes, A is admitted and B alone stays queued: there is room, and
    PE_CPU resumes then, not once the queue has fully drained (A's end)."""
    t = _tensors(rng)

    def kern(tl):
        v = tl.load(tl.ref("v"))                                           # cmd 1: 16 KiB
        y = tl.composite(op="gemm", a=tl.ref("x"), b=v)                    # cmd 2: A reads v
        tl.composite(op="gemm", a=y, b=tl.ref("w"))                        # cmd 3: B reads y
        tl.composite(op="gemm", a=tl.ref("x"), b=tl.ref("v2"))             # cmd 4: C

    sim = Sim(tmp_path, t, data=False, overrides=["hardware.units.scheduler.max_queued_commands=2"])
    log = sim.run(kern)
    (c,) = [r for r in log if r["unit"] == "cpu" and r["cmd"] == 4]
    load_end, a_end = _span(log, 1)[1], _span(log, 2)[1]
    assert c["t_start_ns"] == load_end == _span(log, 2)[0] < a_end
    # what the dispatch waited for, as the critical path reads it: room made by admitting A
    rows = sim.oplog.waits.rows()
    (w,) = [r for r in rows if r[1] == "cpu" and r[3] == 4]
    assert (w[7], w[8]) == ("room", 2)


def _rw_aware_kernel(hs):
    def kern(tl):
        hs["y"] = y = tl.composite(op="gemm", a=tl.ref("x"), b=tl.ref("v"))     # cmd 1: A writes y
        hs["z"] = z = tl.composite(op="gemm", a=y, b=tl.ref("w"))               # cmd 2: B reads y (RAW on A)
        hs["c"] = tl.composite(op="gemm", a=tl.ref("x"), b=tl.ref("v2"))        # cmd 3: C independent
        hs["d"] = tl.composite(op="gemm", a=z, b=tl.ref("w"))                   # cmd 4: D reads z (queued B's)
        tl.composite(op="gemm", a=tl.ref("x"), b=tl.ref("v2"), out=y)           # cmd 5: E writes y (A, B)
    return kern


def test_rw_aware_overtakes_where_legal_and_never_across_a_hazard(tmp_path, rng):
    """ADR-0065 A4 (``policy: rw_aware``): C, hazard-free, is admitted while B waits for A;
    D reads what queued B writes (RAW) and E writes what in-flight A writes and queued B
    reads (WAW, WAR): both wait for B. The numbers are program order's."""
    t, hs = _tensors(rng), {}
    sim = Sim(tmp_path, t, overrides=["hardware.units.scheduler.policy=rw_aware"])
    log = sim.run(_rw_aware_kernel(hs))
    a_end, (b_admit, b_end) = _span(log, 1)[1], _span(log, 2)
    assert _span(log, 3)[0] < a_end == b_admit          # C overtook blocked B
    assert _span(log, 4)[0] >= b_end and _span(log, 5)[0] >= b_end  # D and E did not
    admitted = [r["cmd"] for r in sorted((r for r in log if r["unit"] == "scheduler"),
                                         key=lambda r: (r["t_start_ns"], r["cmd"]))]
    assert admitted == [1, 3, 2, 4, 5]
    x, v, w, v2 = t["x"], t["v"], t["w"], t["v2"]
    np.testing.assert_allclose(sim.read(hs["z"]), x @ v @ w, rtol=1e-3, atol=1e-2)   # B read A's y, not E's
    np.testing.assert_allclose(sim.read(hs["d"]), x @ v @ w @ w, rtol=1e-3, atol=1e-1)
    np.testing.assert_allclose(sim.read(hs["y"]), x @ v2, rtol=1e-3, atol=1e-2)


def test_strict_fifo_admits_in_dispatch_order(tmp_path, rng):
    """The same kernel under the default policy: nothing overtakes B."""
    log = Sim(tmp_path, _tensors(rng), data=False).run(_rw_aware_kernel({}))
    admitted = [r["cmd"] for r in sorted((r for r in log if r["unit"] == "scheduler"),
                                         key=lambda r: (r["t_start_ns"], r["cmd"]))]
    assert admitted == [1, 2, 3, 4, 5] and _span(log, 3)[0] >= _span(log, 1)[1]


def test_sanitizer_catches_an_rw_aware_scheduler_that_overtakes_across_a_hazard(tmp_path, rng, monkeypatch):
    """A broken A4 that checks only in-flight commands lets D (reading queued B's z) run
    before B: the sanitizer's data_dependencies rule names it."""
    import pytest
    from kbframe.errors import SanitizerError
    from kbframe.hw.pe_scheduler import PeScheduler
    from kbframe.sim import sanitizer
    monkeypatch.setattr(PeScheduler, "_behind", staticmethod(lambda reads, writes, link, older: None))
    sim = Sim(tmp_path, _tensors(rng), data=False, overrides=["hardware.units.scheduler.policy=rw_aware"])
    sanitizer.enable(sim.engine)
    log = sim.run(_rw_aware_kernel({}))
    assert _span(log, 4)[0] < _span(log, 2)[1]  # D was admitted before B completed
    with pytest.raises(SanitizerError) as e:
        sanitizer.check(sim.engine, sim.log_path)
    assert "data_dependencies" in str(e.value)


def test_rw_aware_keeps_each_ipcq_links_sends_and_receives_in_order(tmp_path):
    """A receive takes its link's next message: under rw_aware, a receive (or a send) never
    passes an older queued one on the same link. Two decoder layers over 2 ranks: each
    all-reduce's receives write other buffers (no hazard between them), and were admitted
    out of order, swapping messages, until each rank waited for a message the other sends
    only after (a deadlock). The numbers equal the float64 reference."""
    from conftest import run
    m = run(tmp_path, "bench.H=256", "bench.H_q=8", "bench.H_kv=8", "bench.d=32", "bench.F=512", "bench.S_kv=128",
            "bench.layers=2", "hardware=cube", "bench.tp=2", "hardware.units.scheduler.policy=rw_aware",
            "bench.data=true", "run.trace=false", bench="decoder_layer")
    assert m["numerics"]["max_abs_err"] < 1e-5 and m["sanitizer"]["rules_checked"] > 0
