"""The simulation sanitizer (``run.check``): the shipped scheduler passes every
rule; each rule, broken on purpose by a deliberately wrong scheduler, CPU, unit or
allocator patched in for one test, raises a SanitizerError naming the rule, the commands
and the times."""
from __future__ import annotations

import json

import os
import re

import numpy as np
import pytest
from kbframe.ir.protocol import Dispatch, requests

from conftest import Sim, run
from kbframe.sim import sanitizer
from kbframe.errors import KbframeError, SanitizerError
from kbframe.sim.footprint import footprint
from kbframe.hw import pe_scheduler, tiling
from kbframe.hw.pe_cpu import PeCpu
from kbframe.hw.pe_dma import DmaChannel
from kbframe.hw.pe_scheduler import PeScheduler, _overlap
from kbframe.hw.tcm import Tcm
from kbframe.hw.unit import Unit
from kbframe.timebase import cycles_to_ps

SMALL = ("bench.S_kv=200", "bench.G=4", "bench.d=32", "run.progress=false")


def _expect(rule, fn):
    with pytest.raises(SanitizerError) as ei:
        fn()
    e = ei.value
    assert isinstance(e, KbframeError)
    assert e.rule == rule, str(e)
    msg = str(e)
    assert f"rule {rule} violated" in msg
    assert "command" in msg and re.search(r"\d ns", msg), msg
    return msg


# ---- the shipped scheduler passes --------------------------------------------------
@pytest.mark.parametrize("bench", ["decode_opt2", "decode_opt3"])
@pytest.mark.parametrize("shape", [
    ("bench.S_kv=200",),                                       # ragged last tile
    ("bench.d=256", "bench.S_kv=300", "bench.tile=256", "bench.G=3"),  # 2 output tiles, 2 K tiles
    ("bench.S_kv=1",),
])
def test_shipped_scheduler_passes(tmp_path, bench, shape):
    m = run(tmp_path, *shape, "run.progress=false", bench=bench)
    s = m["sanitizer"]
    assert s["rules_checked"] == len(sanitizer.RULES) == 6
    assert s["rules"] == list(sanitizer.RULES)
    assert s["commands"] == m["dispatch"]["commands"] and s["stages"] == m["sim"]["stages"]
    assert s["accesses"] > s["stages"]


def test_shipped_scheduler_passes_timing_only_long(tmp_path):
    m = run(tmp_path, "bench.S_kv=4096", "bench.data=false", "run.progress=false", bench="decode_opt2")
    assert m["sanitizer"]["rules_checked"] == 6


def test_check_false_costs_nothing(tmp_path, monkeypatch):
    """run.check=false: no stage record is kept and the sanitizer is never called."""
    def boom(*a, **k):
        raise AssertionError("sanitizer ran with run.check=false")
    monkeypatch.setattr(sanitizer, "check", boom)
    made = []
    orig = PeScheduler.bind

    def bind(self, pe):
        made.append(self)
        orig(self, pe)
    monkeypatch.setattr(PeScheduler, "bind", bind)
    m = run(tmp_path, *SMALL, "run.check=false")
    assert m["sanitizer"] == {"rules_checked": 0}
    assert made and all(s.record is None for s in made)


# ---- rule 1: commands_once ---------------------------------------------------------------
def test_commands_once_double_completion(tmp_path, monkeypatch):
    """A scheduler that reports one command's completion twice."""
    orig = PeScheduler._complete

    def twice(self, cmd):
        rec = self.inflight[cmd.id]
        if cmd.id == 3:
            self.pe.oplog.command(self.pe.index, cmd, rec.t_admit, self.env.now)
        orig(self, cmd)
    monkeypatch.setattr(PeScheduler, "_complete", twice)
    msg = _expect("commands_once", lambda: run(tmp_path, *SMALL))
    assert "command 3 completed 2 times" in msg


def test_commands_once_stage_outside_span(tmp_path, monkeypatch):
    """A scheduler that completes a command when its first stage ends, not its last."""
    orig = PeScheduler._stage_done

    def early(self, stage):
        rec = self.inflight.get(stage.cmd.id)
        if rec is not None and rec.remaining > 1:
            rec.remaining = 1
        if rec is None:  # the command was already completed: log the stage only
            self._release(stage)
            return
        orig(self, stage)
    monkeypatch.setattr(PeScheduler, "_stage_done", early)
    msg = _expect("commands_once", lambda: run(tmp_path, *SMALL, "bench.data=false"))
    assert "outside the command's span" in msg


# ---- rule 2: cpu_dispatch_serial ---------------------------------------------------------
def _parallel_run(self, program):
    """A broken PE_CPU: starts each dispatch 1 ps after the previous one began."""
    env, sched, oplog, idx = self.env, self.pe.scheduler, self.pe.oplog, self.pe.index
    pending = []

    def one(cmd, t0):
        dt = cycles_to_ps(self.cost_cycles(cmd), self.clock_ghz)
        yield env.timeout(dt)
        self.n_commands += 1
        self.cycles += self.cost_cycles(cmd)
        oplog.dispatch(idx, cmd, t0, env.now)
        sched.submit(cmd)

    for req in requests(program):
        if type(req) is Dispatch:
            pending.append(env.process(one(req.cmd, env.now)))
            yield env.timeout(1)
    yield env.all_of(pending)
    self.finished = True


def test_cpu_dispatch_serial(tmp_path, monkeypatch):
    monkeypatch.setattr(PeCpu, "_run", _parallel_run)
    msg = _expect("cpu_dispatch_serial", lambda: run(tmp_path, *SMALL, "bench.data=false", bench="decode_opt3"))
    assert "while command" in msg and "was still dispatching" in msg


# ---- rule 3: unit_capacity ---------------------------------------------------------------
def test_unit_capacity_single_server_overlap(tmp_path, monkeypatch):
    """A GEMM/MATH unit that starts every stage at once, ignoring the one in progress."""
    def eager(self, now, stage):
        stage.t_start, stage.t_end = now, now + self.duration_ps(stage)
    monkeypatch.setattr(Unit, "reserve", eager)
    msg = _expect("unit_capacity", lambda: run(tmp_path, *SMALL, "bench.data=false"))
    assert "stages in flight at once" in msg and "limit 1" in msg


def test_unit_capacity_dma_data_phases(tmp_path, monkeypatch):
    """A DMA channel whose transfers move data at the same time on one channel."""
    def no_data_channel(self, now, stage):
        stage.t_start, stage.t_data = now, now + self.setup_ps
        stage.t_end = stage.t_data + self.transfer_ps(stage.nbytes)
    monkeypatch.setattr(DmaChannel, "reserve", no_data_channel)
    msg = _expect("unit_capacity", lambda: run(tmp_path, *SMALL, "bench.data=false"))
    assert "DMA data phases at once" in msg


def test_unit_capacity_dma_outstanding(tmp_path, monkeypatch):
    """A DMA channel that ignores max_outstanding (data phases still serialized)."""
    def no_slots(self, now, stage):
        ready = now + self.setup_ps
        data_start = max(ready, self.free_ps)
        end = data_start + self.transfer_ps(stage.nbytes)
        self.free_ps = end
        stage.t_start, stage.t_data, stage.t_end = now, data_start, end
    monkeypatch.setattr(DmaChannel, "reserve", no_slots)
    msg = _expect("unit_capacity", lambda: run(
        tmp_path, *SMALL, "bench.data=false", "hardware.units.dma_read.max_outstanding=1",
        bench="decode_opt3"))
    assert "stages in flight at once" in msg and "dma_read" in msg


# ---- rule 4: tcm_no_overlap --------------------------------------------------------------
def test_tcm_no_overlap(tmp_path, monkeypatch):
    """An allocator whose scratch_scope exit frees the whole TCM, arena included."""
    orig = Tcm.pop_scope

    def pop_all(self):
        orig(self)
        self.top = 0
    monkeypatch.setattr(Tcm, "pop_scope", pop_all)
    msg = _expect("tcm_no_overlap", lambda: run(tmp_path, *SMALL, bench="decode_opt3"))
    assert "overlaps live allocation" in msg and "made at" in msg


def test_tcm_no_overlap_direct():
    allocs = [["m", 0, 64, 0, None], ["s", 64, 128, 1000, 2000], ["t", 64, 64, 2000, None],
              ["bad", 32, 64, 2500, None]]
    msg = _expect_direct("tcm_no_overlap", lambda: sanitizer.check_tcm_no_overlap(0, allocs, 1 << 20))
    assert "'bad' [32, 96)" in msg and "'m' [0, 64)" in msg


def _expect_direct(rule, fn):
    with pytest.raises(SanitizerError) as ei:
        fn()
    assert ei.value.rule == rule
    return str(ei.value)


def test_tcm_freed_and_reused_same_instant_is_fine():
    sanitizer.check_tcm_no_overlap(0, [["a", 0, 64, 0, 100], ["b", 0, 64, 100, None]], 128)


# ---- rule 5: rw_no_interleave ------------------------------------------------------------
def _no_hazards(self, reads, writes):
    return None


def test_rw_no_interleave(tmp_path, monkeypatch):
    """A scheduler with no hazard tracking: opt2's #2 composites (rw m, l, O) overlap."""
    monkeypatch.setattr(PeScheduler, "_blocker", _no_hazards)
    msg = _expect("rw_no_interleave", lambda: run(tmp_path, *SMALL, "bench.data=false"))
    assert "interleaved with composite command" in msg and "'O'" in msg


# ---- rule 6: data_dependencies -----------------------------------------------------------
def test_data_dependencies_raw_across_commands(tmp_path, monkeypatch):
    """No hazard tracking: opt3's Q·Kᵀ starts before the DMA loading K_j has ended."""
    monkeypatch.setattr(PeScheduler, "_blocker", _no_hazards)
    msg = _expect("data_dependencies", lambda: run(tmp_path, *SMALL, bench="decode_opt3"))
    assert msg.split("violated: ")[1].startswith("RAW")
    # the op_log is kept for debugging; no trace is made and the staged tensors.npz is not kept
    assert sorted(os.listdir(tmp_path)) == ["op_log.jsonl.partial"]


def test_a_violation_comes_before_an_error_of_the_report(tmp_path, monkeypatch):
    """The sanitizer checks the run before the report (critical path, metrics, trace) is
    made: when the report would fail too (a full disk under trace.json), the sanitizer's
    violation is what the run reports, and only the op_log is kept."""
    from kbframe.errors import OutputError
    from kbframe.run import bench

    def full_disk(*a, **k):
        raise OutputError("cannot write 'trace.json': No space left on device")

    monkeypatch.setattr(PeScheduler, "_blocker", _no_hazards)
    monkeypatch.setattr(bench, "write_trace", full_disk)
    msg = _expect("data_dependencies", lambda: run(tmp_path, *SMALL, bench="decode_opt3"))
    assert msg.split("violated: ")[1].startswith("RAW")
    assert sorted(os.listdir(tmp_path)) == ["op_log.jsonl.partial"]
    monkeypatch.undo()
    monkeypatch.setattr(bench, "write_trace", full_disk)  # no violation: the report's error
    with pytest.raises(OutputError, match="No space left on device"):
        run(tmp_path, *SMALL, bench="decode_opt3")


def test_data_dependencies_raw_within_command(tmp_path, monkeypatch):
    """A planner that lets each GEMM stage start without waiting for its operand DMA."""
    def drop_dma_edges(cmd, units, nx):
        stages = tiling.plan_stages(cmd, units, nx)
        for st in stages:
            if st.op_kind == "dma_read":
                for s in [s for s in st.succs if s.op_kind == "gemm"]:
                    st.succs.remove(s)
                    s.deps -= 1
        return stages
    monkeypatch.setattr(pe_scheduler, "plan_stages", drop_dma_edges)
    msg = _expect("data_dependencies", lambda: run(tmp_path, *SMALL, "bench.data=false"))
    assert "RAW: stage gemm of command" in msg and "dma_read" in msg and "DMA staging buffer" in msg


def _raw_only(self, reads, writes):
    for rec in self.inflight.values():
        if _overlap(reads, rec.writes):
            return rec.cmd.completion
    return None


def _sim_check(tmp_path, kernel):
    rng = np.random.default_rng(0)
    sim = Sim(tmp_path, {"a": rng.standard_normal((8, 64)), "b": rng.standard_normal((8, 64))})
    sanitizer.enable(sim.engine)
    log = sim.run(kernel)
    return sanitizer.check(sim.engine, log)


def test_data_dependencies_war(tmp_path, monkeypatch):
    """A scheduler that tracks only RAW: x is overwritten by MATH while the DMA storing
    x to HBM is still reading it."""
    monkeypatch.setattr(PeScheduler, "_blocker", _raw_only)

    def kern(tl):
        z = tl.zeros((8, 64))
        x = tl.zeros((8, 64))
        tl.store(tl.ref("b"), x)
        tl.scale(z, 2.0, out=x)
    msg = _expect("data_dependencies", lambda: _sim_check(tmp_path, kern))
    assert "WAR: stage scale on math of command 4 started at" in msg and "dma_write of command 3" in msg


def test_data_dependencies_waw(tmp_path, monkeypatch):
    """A scheduler that tracks only RAW: MATH writes x before an earlier DMA into x lands."""
    monkeypatch.setattr(PeScheduler, "_blocker", _raw_only)

    def kern(tl):
        z = tl.zeros((8, 64))
        x = tl.load(tl.ref("a"))
        tl.scale(z, 2.0, out=x)
    msg = _expect("data_dependencies", lambda: _sim_check(tmp_path, kern))
    assert "WAW: stage scale on math of command 3" in msg and "dma_read of command 2" in msg


@pytest.mark.parametrize("failing_cmd, first", [(4, "WAW"), (2, "bug")])
def test_a_replanning_that_fails_comes_after_an_earlier_hazard(tmp_path, monkeypatch, failing_cmd, first):
    """Rule 6 re-plans every command before it checks their accesses at once; what stops
    the re-planning (here a bug planted in command 4, or in command 2) still comes in
    program order: after the WAW of command 3, before it when it is earlier."""
    monkeypatch.setattr(PeScheduler, "_blocker", _raw_only)
    plan = sanitizer.plan_stages

    def planted(cmd, units, nx):
        if cmd.id == failing_cmd:
            raise RuntimeError(f"a bug re-planning command {cmd.id}")
        return plan(cmd, units, nx)

    def kern(tl):
        z = tl.zeros((8, 64))
        x = tl.load(tl.ref("a"))
        tl.scale(z, 2.0, out=x)
        tl.copy(x)
    rng = np.random.default_rng(0)
    sim = Sim(tmp_path, {"a": rng.standard_normal((8, 64)), "b": rng.standard_normal((8, 64))})
    sanitizer.enable(sim.engine)
    log = sim.run(kern)
    monkeypatch.setattr(sanitizer, "plan_stages", planted)
    if first == "WAW":
        msg = _expect("data_dependencies", lambda: sanitizer.check(sim.engine, log))
        assert "WAW: stage scale on math of command 3" in msg
    else:
        with pytest.raises(RuntimeError, match="^a bug re-planning command 2$"):
            sanitizer.check(sim.engine, log)


def test_serialized_dma_writes_are_not_a_hazard(tmp_path, monkeypatch):
    """Two loads into x on one DMA channel: their data phases are serialized in program
    order, so even a scheduler that ignores WAW produces a valid schedule."""
    monkeypatch.setattr(PeScheduler, "_blocker", _raw_only)

    def kern(tl):
        x = tl.load(tl.ref("a"))
        tl.load(tl.ref("b"), out=x)
    assert _sim_check(tmp_path, kern)["rules_checked"] == 6


def test_same_kernels_pass_with_the_shipped_scheduler(tmp_path):
    def kern(tl):
        x = tl.load(tl.ref("a"))
        tl.copy(x)
        tl.load(tl.ref("b"), out=x)
        tl.load(tl.ref("a"), out=x)
    r = _sim_check(tmp_path, kern)
    assert r["rules_checked"] == 6 and r["commands"] == 4


# ---- footprints ---------------------------------------------------------------------------
def test_footprint_transposed_tile_and_column_region(tmp_path):
    """A Kᵀ tile region maps to buffer rows (keys) × columns (d range); a partial-column
    region is one byte interval per row."""
    rng = np.random.default_rng(0)
    sim = Sim(tmp_path, {"k": rng.standard_normal((100, 256))})
    k = sim.engine.hbm["k"]
    kt = k[64:100].T  # logical (256, 36)
    iv = footprint((kt, (slice(0, 128), slice(0, 36))))
    assert len(iv) == 36
    row = 256 * 2
    assert iv[0][1:3] == (k.addr + 64 * row, k.addr + 64 * row + 128 * 2)
    assert iv[-1][1:3] == (k.addr + 99 * row, k.addr + 99 * row + 128 * 2)
    whole = footprint((k[64:100], None))
    assert whole == [("hbm", k.addr + 64 * row, k.addr + 100 * row, "k[64:100]")]
    sim.oplog.close()


def test_bounds_hold_the_footprint_and_count_it(tmp_path):
    """kbframe.sim.footprint.bounds: the byte range holding every interval of a source's
    footprint and their number, for whole rows, a partial-column region (one interval a
    row), a transposed tile, an empty region and a staging key."""
    from kbframe.sim.footprint import bounds
    rng = np.random.default_rng(0)
    sim = Sim(tmp_path, {"k": rng.standard_normal((100, 256))})
    k = sim.engine.hbm["k"]
    row = 256 * 2
    for src in ((k[64:100], None), (k[64:100].T, (slice(0, 128), slice(0, 36))),
                (k[10:20], (slice(2, 7), slice(100, 104)))):
        iv = footprint(src)
        assert bounds(src) == (iv[0][0], iv[0][1], iv[-1][2], len(iv))
    assert bounds((k[10:20], (slice(2, 7), slice(100, 104)))) == (
        "hbm", k.addr + 12 * row + 200, k.addr + 16 * row + 208, 5)
    assert bounds((k[10:20], (slice(3, 3), None))) == ("hbm", 0, 0, 0) and footprint((k[10:20], (slice(3, 3), None))) == []
    assert bounds("s0") == ("stage:s0", 0, 1, 1)
    sim.oplog.close()


def test_reads_no_write_overlaps_are_left_out_of_rule_6():
    """The union of a PE's writes answers whether a read can be part of a hazard: it
    overlaps a write's bytes (touching ends do not), in the same space only."""
    from kbframe.sim.footprint import WriteUnion
    w = WriteUnion([("hbm", 0, 8, "a"), ("hbm", 8, 16, "b"), ("hbm", 32, 40, "c"), ("tcm", 100, 101, "d")])
    assert w.spaces["hbm"] == ([0, 32], [16, 40])
    assert [w.overlaps("hbm", lo, hi) for lo, hi in ((16, 32), (15, 16), (40, 50), (20, 33), (0, 0), (-5, 0))] == \
        [False, True, False, True, False, False]
    assert not w.overlaps("tcm", 0, 100) and w.overlaps("tcm", 100, 200) and not w.overlaps("stage:x", 0, 1)


def _touched(draw_stages):
    """``touched`` for kbframe.sim.footprint.hazard_free from ``(t_start, t_data, t_end,
    reads, writes)`` per stage, reads and writes as ``(space, lo, hi)``."""
    from types import SimpleNamespace as NS
    out = []
    for i, (t_start, t_data, t_end, reads, writes) in enumerate(draw_stages):
        st = NS(t_start=t_start, t_data=t_data, t_end=t_end, tile=-1, op_kind="math",
                unit=NS(name="math"), cmd=NS(id=i))
        out.append((st, t_data if t_data >= 0 else t_start, [(*r, "x") for r in reads], [(*w, "x") for w in writes]))
    return out


def _walked_finds_a_hazard(touched) -> bool:
    try:
        sanitizer._first_hazard(touched)
    except SanitizerError:
        return True
    return False


def test_all_accesses_at_once_agree_with_the_walk_by_hand():
    """kbframe.sim.footprint.hazard_free on hand-made accesses: what the access-by-access
    walk accepts it accepts; each kind of hazard, also through a partial overlap, it
    does not (and the walk names it)."""
    from kbframe.sim.footprint import hazard_free
    ok = [(0, -1, 10, [], [("tcm", 0, 64)]),            # writes [0, 64)
          (10, -1, 20, [("tcm", 0, 64)], [("tcm", 0, 64)]),  # reads and writes it in place, after
          (5, -1, 30, [("tcm", 64, 128)], []),          # other bytes: may overlap in time
          (20, 25, 40, [("tcm", 16, 32)], [])]          # a DMA: its data phase after the write
    assert hazard_free(_touched(ok)) and not _walked_finds_a_hazard(_touched(ok))
    for bad, kind in (
            ([(0, -1, 10, [], [("tcm", 0, 64)]), (9, -1, 20, [("tcm", 32, 96)], [])], "RAW"),
            ([(0, -1, 10, [("tcm", 0, 8)], []), (9, -1, 20, [], [("tcm", 4, 6)])], "WAR"),
            ([(0, -1, 10, [], [("hbm", 0, 8)]), (9, -1, 20, [], [("hbm", 0, 4)])], "WAW"),
            # the latest writer ended in time, an earlier one did not: the walk reports the
            # WAW of the second write (the read's RAW then does not arise there)
            ([(0, -1, 30, [], [("tcm", 0, 8)]), (5, -1, 8, [], [("tcm", 0, 8)]),
              (10, -1, 12, [("tcm", 0, 8)], [])], "WAW")):
        assert not hazard_free(_touched(bad))
        with pytest.raises(SanitizerError, match=f"^sanitizer: rule data_dependencies violated: {kind}: "):
            sanitizer._first_hazard(_touched(bad))
    # what a run never makes is left to the walk: times not integer ps, a stage that did
    # not end, an interval backwards
    for odd in ([(0, -1, 10.5, [], [("tcm", 0, 8)]), (10.2, -1, 20, [("tcm", 0, 8)], [])],
                [(-10, -1, -5, [], [("tcm", 0, 8)]), (-10, -1, 0, [("tcm", 0, 8)], [])],
                [(0, -1, 10, [], [("tcm", 8, 0)])]):
        assert not hazard_free(_touched(odd))


def test_all_accesses_at_once_agree_with_the_walk_on_random_schedules():
    """hazard_free is True exactly when the walk finds no hazard, for random stages (times
    with t_start ≤ t_data ≤ t_end, reads and writes of overlapping intervals in two
    spaces, in place and partial)."""
    from hypothesis import given, settings, strategies as hs
    from kbframe.sim.footprint import hazard_free
    iv = hs.tuples(hs.sampled_from(["tcm", "stage:a"]), hs.integers(0, 12), hs.integers(1, 6)).map(
        lambda t: (t[0], t[1], t[1] + t[2]))
    stage = hs.tuples(hs.integers(0, 40), hs.integers(0, 8), hs.booleans(), hs.integers(0, 8),
                      hs.lists(iv, max_size=3), hs.lists(iv, max_size=3)).map(
        lambda t: (t[0], t[0] + t[1] if t[2] else -1, t[0] + t[1] + t[3], t[4], t[5]))

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(hs.lists(stage, max_size=7))
    def agree(stages):
        touched = _touched(stages)
        assert hazard_free(touched) == (not _walked_finds_a_hazard(touched))
    agree()


def test_sanitizer_needs_enable(tmp_path):
    rng = np.random.default_rng(0)
    sim = Sim(tmp_path, {"a": rng.standard_normal((8, 64))})
    log = sim.run(lambda tl: tl.load(tl.ref("a")))
    with pytest.raises(SanitizerError, match="enable"):
        sanitizer.check(sim.engine, log)


def test_cli_reports_sanitizer_error_as_one_line(tmp_path):
    """The sanitizer's error reaches a CLI user as one kbframe error line (in-process here:
    run_bench raises a KbframeError, which the CLI prints as ``kbframe: error: ...``)."""
    e = SanitizerError("sanitizer: rule x violated: y", "x")
    assert isinstance(e, KbframeError) and "\n" not in str(e)


# ---- rules 1-3 on the record table: a tampered op_log, the first violation named
def _tampered(edit):
    """A decode_opt2 run's engine and its op_log records (dicts, read back from its table's
    text), edited by ``edit(records)``."""
    from conftest import compose_cfg
    from kbframe.run.bench import validate
    from kbframe.run.simulate import simulate
    from kbframe.sim.targets import resolve_kernel
    from kbframe.tl.recipe import load_recipes
    cfg = compose_cfg("bench.data=false", "run.progress=false", "bench.S_kv=512", bench="decode_opt2")
    wl = validate(cfg)
    kernel = resolve_kernel(cfg.bench.kernel, "bench.kernel", True, kwargs=tuple(wl.kernel_kwargs(None)))
    sim = simulate(cfg, wl, kernel, load_recipes(cfg.get("recipes")), None, None, True, False)
    records = [json.loads(line) for line in sim.oplog.table.text().splitlines()]
    edit(records)
    return sim.engine, records


def _data_phases_overlap(records):
    """The second DMA read's data phase starts with the first's."""
    a, b = [r for r in records if "t_data_ns" in r][:2]
    b["t_data_ns"] = a["t_data_ns"]


def _dispatches_overlap(records):
    """Dispatch 2 starts before dispatch 1 ended."""
    a, b = [r for r in records if r["unit"] == "cpu"][:2]
    b["t_start_ns"] = a["t_end_ns"] - 1.0


def _a_dispatch_deleted(records):
    records.remove([r for r in records if r["unit"] == "cpu"][3])


@pytest.mark.parametrize("edit, message", [
    (_data_phases_overlap, r"^sanitizer: rule unit_capacity violated: PE0 dma_read: 2 DMA data phases at "
                           r"once at 118.5 ns, limit 1 \(command 1 tile -1 118.5 ns–128.5 ns; "
                           r"command 5 tile 0 118.5 ns–365.625 ns\)$"),
    (_dispatches_overlap, r"^sanitizer: rule cpu_dispatch_serial violated: PE0 PE_CPU dispatched command 2 "
                          r"from 40.5 ns while command 1 was still dispatching \(0 ns–41.5 ns\)$"),
    (_a_dispatch_deleted, r"^sanitizer: rule commands_once violated: PE0 command 4 completed but was never "
                          r"dispatched$"),
])
def test_a_tampered_op_log_names_its_first_violation(edit, message):
    """Records edited by hand (read back into a table, kbframe.records.RecordTable.of_dicts):
    rules 1-3, checked on the table's columns, name the first violation."""
    engine, records = _tampered(edit)
    with pytest.raises(SanitizerError, match=message):
        sanitizer.check(engine, records)


# ---- rule 6 from command-shape templates (kbframe.sim.access_templates) --------------------
def _both_ways(monkeypatch):
    """Make every sanitizer check compare, PE by PE, rule 6 from templates with rule 6
    re-planning every command (same count, same HBM writes for rule 10); returns the
    list of PEs compared."""
    from kbframe.sim.access_templates import Templates
    compared = []
    walk = sanitizer._walk_data_dependencies

    def both(pe, plan, hbm_writes=None, templates=None):
        shown = (templates or Templates()).columns(pe, plan, sanitizer.plan_stages)
        walked = []
        n = walk(pe, plan, walked)
        assert shown is not None, f"PE{pe.index}: the templates did not show what the walk did"
        assert shown[0] == n
        assert [(lo, hi, p, id(st)) for lo, hi, p, st in shown[1]] == [(lo, hi, p, id(st)) for lo, hi, p, st in walked]
        compared.append(pe.index)
        if hbm_writes is not None:
            hbm_writes += walked
        return n
    monkeypatch.setattr(sanitizer, "check_data_dependencies", both)
    return compared


@pytest.mark.parametrize("bench, overrides", [
    ("decode_opt2", ("bench.S_kv=200", "bench.G=4", "bench.d=32")),                      # data, ragged tile
    ("decode_opt3", ("bench.S_kv=1000", "bench.data=false", "run.fast_forward=off")),      # many repeats
    ("gemm_ref_ref", ("bench.M=70", "bench.K=200", "bench.N=150", "bench.block_m=32")),    # partial-column tiles
    ("gemm_load_ref", ("bench.M=70", "bench.K=200", "bench.N=150", "bench.block_m=32", "bench.data=false")),
    ("decoder_layer", ("hardware=cube", "bench.tp=8", "bench.H=256", "bench.H_q=8", "bench.H_kv=8", "bench.d=32",
                       "bench.F=512", "bench.S_kv=200", "bench.layers=2", "bench.data=true")),  # 8 PEs, IPCQ
    ("decoder_layer", ("hardware=cube", "bench.tp=2", "bench.H=64", "bench.H_q=4", "bench.H_kv=2", "bench.d=16",
                       "bench.F=96", "bench.S_kv=100", "bench.fusion=none", "bench.inner=opt3", "bench.data=false")),
])
def test_templates_give_the_accesses_of_replanning_every_command(tmp_path, monkeypatch, bench, overrides):
    """Rule 6 from one re-planning per command shape, shifted per command, counts the same
    accesses and the same HBM writes as re-planning every command, on every PE."""
    compared = _both_ways(monkeypatch)
    m = run(tmp_path, *overrides, "run.progress=false", "run.trace=false", bench=bench)
    assert compared and m["sanitizer"]["rules_checked"] >= 6


def test_templates_miss_no_hazard_the_walk_finds(tmp_path, monkeypatch):
    """A stage of a command moved earlier (its shape's template made from an earlier
    command): rule 6 from templates does not pass what the walk finds a hazard in, and
    passes what it does not; the error is the walk's."""
    from kbframe.sim.access_templates import Templates
    held = {}
    monkeypatch.setattr(sanitizer, "check", lambda engine, records: held.setdefault("engine", engine) and {})
    monkeypatch.setattr(sanitizer, "release", lambda engine: None)  # its stage records kept for the test
    run(tmp_path, "bench.S_kv=600", "bench.data=false", "run.fast_forward=off", "run.progress=false",
        "run.trace=false", bench="decode_opt2")
    pe, plan = next(sanitizer.plans(held["engine"]))
    assert Templates().columns(pe, plan, sanitizer.plan_stages)[0] == sanitizer._walk_data_dependencies(pe, plan)
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(12):
        cmd, stages = plan[int(rng.integers(len(plan) // 2, len(plan)))]
        st = stages[int(rng.integers(len(stages)))]
        saved = st.t_start, st.t_data
        st.t_start -= int(rng.integers(1, 200_000))
        st.t_data = st.t_start if st.t_data >= 0 else -1
        try:
            sanitizer._walk_data_dependencies(pe, plan)
            walked = False
        except SanitizerError:
            walked = True
        shown = Templates().columns(pe, plan, sanitizer.plan_stages)
        assert (shown is None) == walked, (cmd.id, st.op_kind)
        if walked:
            found += 1
            with pytest.raises(SanitizerError, match="data_dependencies"):
                sanitizer.check_data_dependencies(pe, plan)
        st.t_start, st.t_data = saved
    assert found


def test_a_run_drops_its_stage_records_once_checked(tmp_path, monkeypatch):
    """The stage records are released after the verdict (sanitizer.release): asking for
    them again is the same error as never keeping them."""
    held = {}
    check = sanitizer.check
    monkeypatch.setattr(sanitizer, "check", lambda engine, records: held.setdefault("engine", engine) and
                        check(engine, records))
    m = run(tmp_path, "bench.S_kv=600", "bench.data=false", "run.fast_forward=off", "run.progress=false",
            "run.trace=false", bench="decode_opt2")
    assert m["sanitizer"]["rules_checked"] == 6
    with pytest.raises(SanitizerError, match="PE_SCHEDULER kept no stage record"):
        next(sanitizer.plans(held["engine"]))
