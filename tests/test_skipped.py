"""Fast-forward in one simulation (kbframe.sim.steady, kbframe.run.jump_checks,
kbframe.run.skipped): loops along the periodic axis leave out a steady stretch, and the
full run is made by putting it back, byte for byte what the full simulation writes (verify
mode checks it)."""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import compose_cfg, run
from kbframe.records import RecordTable
from kbframe.run import fastforward, jump_checks, moves, skipped
from kbframe.run.bench import validate
from kbframe.run.periodic import totals
from kbframe.run.simulate import simulate
from kbframe.sim import sanitizer
from kbframe.sim.engine import build_units
from kbframe.sim.steady import WEIGHT_TILES, Axis, Instance, Steady
from kbframe.sim.targets import resolve_kernel
from kbframe.sim.waits import WAIT_CODE
from kbframe.tl.recipe import load_recipes


def _skipping(*overrides, bench):
    """``(simulation, its Steady)`` of a timing-only bench whose KV loops may jump."""
    cfg = compose_cfg(*overrides, "bench.data=false", "run.progress=false", bench=bench)
    steady = Steady([Axis("S_kv", fastforward.PERIODS, fastforward.MIN_STEPS)], skipped.snapshot)
    sim = simulate(cfg, validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), None, None,
                   False, False, steady=steady)
    return sim, steady


@pytest.mark.parametrize("bench, overrides, note", [
    ("decode_heads", ("bench.H_q=4", "bench.H_kv=2", "bench.S_kv=65536"),  # two items, one after the other
     "1950 period(s) of 1 step(s) along S_kv left out of 2 loop(s) (35100 of 36900"),
    ("decode_heads", ("bench.H_q=4", "bench.H_kv=2", "bench.S_kv=8191", "bench.inner=opt3"),  # ragged last tile
     "216 period(s) of 1 step(s) along S_kv left out of 2 loop(s) (8424 of 10026"),
    ("decode_heads", ("hardware=cube", "bench.H_q=16", "bench.H_kv=16", "bench.S_kv=16384",
                      "bench.mapping=round_robin"),  # 16 items on 8 PEs, their loops in step
     "414 period(s) of 1 step(s) along S_kv left out of 2 loop(s) (59616 of 74016"),
    ("decode_splitk", ("hardware=cube", "bench.S_kv=65536"),  # 8 splits, then merges over IPCQ
     "72 period(s) of 1 step(s) along S_kv left out of 1 loop(s) (10368 of 18749"),
])
def test_a_loop_leaves_out_a_steady_stretch_exactly(tmp_path, bench, overrides, note):
    m = run(tmp_path, *overrides, "bench.data=false", "run.fast_forward=verify", "run.trace=false", bench=bench)
    assert m["fast_forward"]["note"] == (f"fast-forwarded in one simulation: {note} records by shifting); "
                                         f"verified against the full simulation")


def test_the_jump_waits_for_pe_cpu_to_settle():
    """decode_opt2's PE_CPU fills PE_SCHEDULER's queue for ~48 KV tiles, at an even pace:
    the loop jumps only once the units complete what it dispatches (at tile 52), leaving
    200 of its 256 tiles out, a multiple of the period it looked steady with (1) and of its
    ring of 2 S buffers, with 4 after."""
    sim, steady = _skipping("bench.S_kv=16384", bench="decode_opt2")
    assert [(k, inst.n, inst.J, inst.R, sorted(inst.jumped)) for k, inst in steady.jumps] == [(0, 256, 52, 200, [0])]
    assert steady.broken is None and len(sim.oplog.table) == 1026


def test_loops_of_unequal_length_leave_nothing_out():
    """Two sequences of 8192 and 6000 keys on two PEs: not one loop; nothing is left out
    of it and the run cannot stand for the full one."""
    sim, steady = _skipping("hardware=cube", "bench.H_q=2", "bench.H_kv=2", "bench.S_kv=[8192,6000]",
                            bench="decode_heads")
    assert steady.broken == "loop 0 of S_kv has 94 iterations on PE7, 128 on another"
    with pytest.raises(jump_checks.NotSteady, match="^loop 0 of S_kv has 94 iterations on PE7, 128 on another$"):
        skipped.make(sim, steady, totals(sim))


def test_a_record_that_does_not_repeat_is_caught():
    """One record's end 1 ps late, just after the jump: no candidate period holds, and the
    first candidate's first difference is named."""
    sim, steady = _skipping("bench.S_kv=16384", bench="decode_opt2")
    made = skipped.make(sim, steady, totals(sim))
    x = made.jumps[0].x
    rows = sim.oplog.table.array().copy()
    rows[x + 1, 4] += 1  # t1 (kbframe.records.FIELDS)
    bad = SimpleNamespace(oplog=SimpleNamespace(table=RecordTable.of_rows(sim.oplog.table.names, rows)),
                          latency_ps=sim.latency_ps, phases=sim.phases)
    with pytest.raises(jump_checks.NotSteady, match=rf"^loop 0 of S_kv: record {x + 1} is not record {x + 1 - 18} "
                                                    r"a period of 1 later \(t1\)$"):
        skipped.make(bad, steady, totals(sim))


def test_records_move_by_the_rules():
    """Times by the period's; a command id, and a command ``ref``, by its PE's commands a
    period when it is the loop's (at or after its first command there); a record ``ref`` by
    the period's records when the record it names is the loop's."""
    names = [(0, "cpu", "composite"), (0, "gemm", "gemm"), (1, "cpu", "composite")]
    t = RecordTable()
    for nm in names:
        t.code(*nm)
    #       name cmd tile t0  t1  td  bytes peer why                     ref
    rows = [[0, 5, -1, 0, 10, -1, 0, -1, WAIT_CODE["start"], -1],
            [1, 10, 0, 10, 20, 12, 0, -1, -1, 0],       # a stage readied by a record before the loop
            [2, 20, -1, 20, 30, -1, 0, -1, WAIT_CODE["hazard"], 19],  # PE1: a command before its loop
            [1, 11, 1, 30, 40, 35, 0, -1, -1, 1],       # readied by a record of the loop
            [0, 12, -1, 40, 50, -1, 0, -1, WAIT_CODE["room"], 10],
            [2, 21, -1, 50, 60, -1, 0, -1, WAIT_CODE["cpu"], 2]]
    table = RecordTable.of_rows(t.names, np.array(rows, dtype=np.int64))
    pe_of = np.array(table.name_col(0), dtype=np.int64)
    mover = moves.Mover(table.array(), pe_of, {0: 10, 1: 20}, {0: 2, 1: 3}, 100, 4)
    assert mover.move(table.array(1, 6), 2).tolist() == [
        [1, 14, 0, 210, 220, 212, 0, -1, -1, 0],
        [2, 26, -1, 220, 230, -1, 0, -1, WAIT_CODE["hazard"], 19],
        [1, 15, 1, 230, 240, 235, 0, -1, -1, 9],
        [0, 16, -1, 240, 250, -1, 0, -1, WAIT_CODE["room"], 14],
        [2, 27, -1, 250, 260, -1, 0, -1, WAIT_CODE["cpu"], 10]]


def test_phases_of_the_layers_left_out_are_put_back():
    """The period before the jump (layers 4 and 5, commands 40..49) is repeated twice, ids
    and layers moved; a phase spanning the jump ends later; later ones move by both periods."""
    inst = Instance(n=20, J=6, R=4)
    inst.ids = {0: {4: 40, 5: 45, 6: 50}}
    ph = [("load", 1, 3, {}), ("attention", 30, 52, {}), ("norm", 40, 44, {"layer": 4}),
          ("ffn", 45, 49, {"layer": 5}), ("norm", 50, 54, {"layer": 10}), ("all_reduce", 55, 60, {"after": 52})]
    assert skipped._phases(ph, inst, 0, 2, 2) == [
        ("load", 1, 3, {}), ("attention", 30, 72, {}), ("norm", 40, 44, {"layer": 4}), ("ffn", 45, 49, {"layer": 5}),
        ("norm", 50, 54, {"layer": 6}), ("ffn", 55, 59, {"layer": 7}),
        ("norm", 60, 64, {"layer": 8}), ("ffn", 65, 69, {"layer": 9}),
        ("norm", 70, 74, {"layer": 10}), ("all_reduce", 75, 80, {"after": 72})]


def test_a_run_that_never_looks_steady_is_its_own_full_simulation(tmp_path):
    """Shared HBM: the PEs contend for the cube's port, no KV loop looks steady, and the one
    simulation, which left nothing out, is written as the full run: the same bytes as
    run.fast_forward=off writes, and the sanitizer's verdict taken on it."""
    args = ("+model=llama3_70b", "hardware=cube", "hardware.hbm_mode=shared", "bench.S_kv=6144", "bench.data=false")
    on = run(tmp_path / "on", *args, bench="decode_heads")
    off = run(tmp_path / "off", *args, "run.fast_forward=off", bench="decode_heads")
    assert on["fast_forward"] == {"mode": "on", "applied": False, "note": "simulated in full: no loop along S_kv "
                                                                          "looked steady with a stretch to leave out"}
    assert on["sanitizer"] == off["sanitizer"] and on["sanitizer"]["rules_checked"] > 0
    for name in ("op_log.jsonl", "trace.json"):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes(), name
    for m in (on, off):
        del m["sim"]["wall_s"], m["fast_forward"], m["files"]
    assert on == off


@pytest.mark.parametrize("overrides, note", [
    (("++bench.s_buffers=5",), "fast-forwarded in one simulation: 200 period(s) of 1 step(s) along S_kv left out of 1 "
                               "loop(s) (3600 of 4626 records by shifting)"),
    (("++bench.s_buffers=7", "++bench.k_prefetch=6"),
     "fast-forwarded in one simulation: 196 period(s) of 1 step(s) along S_kv left out of 1 loop(s) (3528 of 4626 "
     "records by shifting)"),
])
def test_a_jump_is_a_multiple_of_the_loops_buffer_rings(tmp_path, overrides, note):
    """opt2 takes its S buffer by the tile's index modulo s_buffers: a jump that is not a
    multiple of the ring's size would lower the tiles after it into other buffers, and their
    write-after-read waits on other tiles, than the full run does (tiles later, where the
    check around the jump does not look). The loop names its rings (tl.steps), and its jump
    (the loop looks steady with a period of 1) is a multiple of 5 and of 7 tiles: 200 and
    196 of the 201 it could leave out."""
    m = run(tmp_path, "bench.S_kv=16384", *overrides, "bench.data=false", "run.fast_forward=verify", "run.trace=false",
            bench="decode_opt2")
    assert m["fast_forward"]["note"] == note + "; verified against the full simulation"


def test_a_loop_whose_records_do_not_repeat_yet_jumps_later_in_the_same_simulation(tmp_path):
    """opt2 with a PE_SCHEDULER queue of 5 commands and 7 tiles prefetched looks steady from
    its first tiles, but its records there do not repeat yet: compared as the jump is
    decided (kbframe.run.jump_checks.repeats), the loop does not jump until they do, in the
    same simulation (not simulated once more, as a jump refused after it would be)."""
    m = run(tmp_path, "bench.S_kv=65537", "++bench.s_buffers=8", "++bench.k_prefetch=7", "++bench.v_staging=prefetch",
            "++bench.v_buffers=10", "hardware.units.scheduler.max_queued_commands=5", "bench.data=false",
            "run.fast_forward=verify", "run.trace=false", bench="decode_opt2")
    assert m["fast_forward"]["note"] == ("fast-forwarded in one simulation: 960 period(s) of 1 step(s) along S_kv "
                                         "left out of 1 loop(s) (19200 of 20518 records by shifting); verified against "
                                         "the full simulation")


def test_a_loop_whose_records_never_repeat_is_the_full_simulation_and_the_note_says_so(tmp_path):
    """opt2 with tiles of 128 and a PE_CPU of 200 cycles a command looks steady again and
    again, but its records never repeat: no jump is made, the one simulation is the full
    run (no second try), and the note names the last loop held back."""
    m = run(tmp_path, "bench.tile=128", "bench.S_kv=22195", "calibration.FIXED=200", "bench.data=false",
            "run.trace=false", bench="decode_opt2")
    assert m["fast_forward"]["note"] == ("simulated in full: no loop along S_kv jumped (loop 0 of S_kv looked steady "
                                         "at step 116, its records not repeating)")


def test_a_loop_that_looked_steady_too_early_is_judged_again_later(tmp_path):
    """opt2 on an H100 with 5 tiles prefetched: its loop's records repeat where it jumps,
    but a wait's ref a period after the jump does not. The run is simulated once more, its
    loops judged from 4 × 16 tiles on: that jump holds."""
    m = run(tmp_path, "hardware=h100_sxm", "bench.S_kv=9088", "++bench.s_buffers=8", "++bench.k_prefetch=5",
            "bench.data=false", "run.fast_forward=verify", "run.trace=false", bench="decode_opt2")
    assert m["fast_forward"]["note"] == ("fast-forwarded in one simulation: 72 period(s) of 1 step(s) along S_kv "
                                         "left out of 1 loop(s) (1440 of 2858 records by shifting) (simulated "
                                         "once more: along S_kv alone, loop 0 of S_kv: record 224 is not record 204 a "
                                         "period of 1 later (ref)); verified against the full simulation")


def test_jumps_put_back_in_one_pass_equal_one_at_a_time(monkeypatch):
    """16 items on 8 PEs, each PE's two KV loops jumping: every record moved by the jumps
    before it from prefix sums per PE is what putting the jumps back one at a time, the
    last first, gives (byte for byte), and the totals and phases agree."""
    sim, steady = _skipping("hardware=cube", "bench.H_q=16", "bench.H_kv=16", "bench.S_kv=16384",
                            "bench.mapping=round_robin", bench="decode_heads")
    one = skipped.make(sim, steady, totals(sim))
    assert len(one.jumps) == 2 and skipped._in_order(sorted(one.jumps, key=lambda f: f.x))
    monkeypatch.setattr(skipped, "_in_order", lambda found: False)
    each = skipped.make(sim, steady, totals(sim))
    assert bytes(one.table.buf) == bytes(each.table.buf) and len(one.table) == 74016
    assert one.tot == each.tot and one.phases == each.phases and one.latency_ps == each.latency_ps


def test_a_command_from_before_the_loop_in_flight_across_the_jump_is_caught(tmp_path):
    """A layer's first DMA write (command 6, before its KV loops) takes 200 µs to set up:
    it is still in flight long after the loop jumped, and after the periods checked. Its
    times would not move in the full run as the records after the jump do: the jump is
    refused, naming it, and the run is simulated in full."""
    args = ("bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=64", "bench.S_kv=8192",
            "bench.layers=1", "bench.inner=opt3", "hardware.units.dma_write.setup_latency_ns=200000")
    sim, steady = _skipping(*args, bench="decoder_layer")
    with pytest.raises(jump_checks.NotSteady, match=r"^loop 0 of S_kv: record 788, of PE0's command 6 from before the "
                                                    r"loop, started before the jump and ends after the periods checked$"):
        skipped.make(sim, steady, totals(sim))
    m = run(tmp_path, *args, "bench.data=false", "run.fast_forward=verify", "run.trace=false", bench="decoder_layer")
    assert m["fast_forward"]["applied"] is False and "command 6 from before the loop" in m["fast_forward"]["note"]


def test_a_periods_accesses_are_counted_from_the_command_templates():
    """The accesses rule 6 counts for commands already checked (a period put back) are
    counted from their shapes' templates, nothing re-checked: as many as the check counts,
    for the whole run and for any stretch of its commands."""
    cfg = compose_cfg("hardware=cube", "bench.H_q=16", "bench.H_kv=16", "bench.S_kv=4096",
                      "bench.mapping=round_robin", "bench.data=false", "run.progress=false", bench="decode_heads")
    sim = simulate(cfg, validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), None, None,
                   True, False)
    counted = []
    for pe, plan in sanitizer.plans(sim.engine):
        for sub in (plan, plan[3:40], plan[-7:]):
            n = sanitizer.count_data_dependencies(pe, sub)
            assert n == sanitizer.check_data_dependencies(pe, sub)
            counted.append(n)
    assert len(counted) == 24 and min(counted) > 0


WIDE_FFN = ("bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=24576", "bench.S_kv=10000",
            "bench.tile=128", "bench.layers=20", "bench.data=false", "run.check=false", "run.trace=false")


def test_a_try_refused_before_any_weight_gemm_left_tiles_out_is_not_made_again_without_them(tmp_path):
    """A decoder layer's first KV loop (79 tiles of 128) looks steady before its records
    repeat. Compared as the jump is decided (kbframe.run.jump_checks.repeats), it does not jump;
    the layers and the weight GEMMs' tiles do, in the first simulation. Made without that
    comparison (each try here by hand), the jump is refused after reading the first 413
    records, before a weight GEMM first left tiles out (record 5469); simulated without the
    tile axis, the step makes those records alike and is refused alike, so that try is
    never made after the first (fastforward._refused_alike)."""
    args = WIDE_FFN
    m = run(tmp_path, *args, bench="decoder_layer")
    assert m["fast_forward"]["note"] == ("fast-forwarded in one simulation: 14 period(s) of 1 step(s) along layers "
                                         "and 84 period(s) of 16 step(s) along weight tiles left out of 13 loop(s) "
                                         "(180698 of 254312 records by shifting)")
    cfg = compose_cfg(*args, "run.progress=false", bench="decoder_layer")
    wl = validate(cfg)
    refused = []
    for inner in ((Axis("S_kv", fastforward.PERIODS, fastforward.MIN_STEPS), WEIGHT_TILES),
                  (Axis("S_kv", fastforward.PERIODS, fastforward.MIN_STEPS),)):
        steady = Steady([Axis("layers", wl.ff_periods, wl.ff_min_steps, wl.ff_after), *inner], skipped.snapshot)
        sim = simulate(cfg, wl, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), None, None, False, False,
                       steady=steady)
        with pytest.raises(jump_checks.NotSteady) as e:
            skipped.make(sim, steady, totals(sim), repeated=True)
        refused.append((str(e.value), e.value.upto, steady.first_jump.get(WEIGHT_TILES.key),
                        sim.oplog.table.array()[:e.value.upto]))
    (why, upto, tiles_from, rows), (why_kv, upto_kv, no_tiles, rows_kv) = refused
    assert (why, upto, tiles_from) == ("loop 0 of S_kv: record 303 is not record 285 a period of 1 later (name)", 413,
                                       5469)
    assert (why_kv, upto_kv, no_tiles) == (why, upto, None) and np.array_equal(rows, rows_kv)


def test_a_try_that_would_simulate_what_was_refused_is_not_made(monkeypatch):
    """On an H100's one HBM a small model's layer loop looks steady at layer 15, no KV loop
    or weight GEMM having jumped. Its records there do not repeat yet: compared as the jump
    is decided (kbframe.run.jump_checks.repeats), it jumps later, in the first simulation.
    Made without that comparison, the jump is refused, and its layer loop jumping alone,
    even from 12 layers on, is that simulation again: neither try is made, and the one
    refusal is why nothing was left out (checked here: that simulation is refused alike)."""
    args = ("hardware=h100_sxm", "bench.tp=8", "bench.H=512", "bench.H_q=8", "bench.H_kv=8", "bench.d=64",
            "bench.F=2048", "bench.S_kv=2048", "bench.layers=40", "bench.data=false", "run.progress=false")
    cfg = compose_cfg(*args, bench="decoder_layer")
    wl, kernel, recipes = validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes)
    out = fastforward._in_one(cfg, wl, kernel, recipes, False, build_units(cfg.hardware), "layers", 40, 0.0)
    assert out.note == ("fast-forwarded in one simulation: 4 period(s) of 4 step(s) along layers left out of 1 "
                        "loop(s) (126976 of 317515 records by shifting)")
    monkeypatch.setattr(jump_checks, "repeats", lambda *a: True)
    why = "loop 0 of layers: record 85460 is not record 53716 a period of 4 later (t0)"
    out = fastforward._in_one(cfg, wl, kernel, recipes, False, build_units(cfg.hardware), "layers", 40, 0.0)
    assert (out.sim, out.note) == (None, f"along layers and S_kv and weight tiles, {why}")
    steady = Steady([Axis("layers", wl.ff_periods, wl.ff_min_steps * fastforward.GROWTH, wl.ff_after)],
                    skipped.snapshot)
    sim = simulate(cfg, wl, kernel, recipes, None, None, False, False, steady=steady)
    with pytest.raises(jump_checks.NotSteady, match=f"^{re.escape(why)}$"):
        skipped.make(sim, steady, totals(sim), repeated=True)


def test_a_jump_the_records_so_far_refuse_stops_the_simulation_there():
    """The first KV loop's jump of WIDE_FFN, probed as soon as the period after it is in
    (kbframe.run.jump_checks.probe): the simulation stops at record 465 of 254,312 with the
    refusal make gives at its end (the same reason, read from the same first 413 records)."""
    cfg = compose_cfg(*WIDE_FFN, "run.progress=false", bench="decoder_layer")
    wl = validate(cfg)
    steady = Steady([Axis("layers", wl.ff_periods, wl.ff_min_steps, wl.ff_after),
                     Axis("S_kv", fastforward.PERIODS, fastforward.MIN_STEPS), WEIGHT_TILES],
                    skipped.snapshot, probe=jump_checks.probe)
    with pytest.raises(jump_checks.NotSteady) as e:
        simulate(cfg, wl, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), None, None, False, False,
                 steady=steady)
    assert (str(e.value), e.value.upto) == ("loop 0 of S_kv: record 303 is not record 285 a period of 1 later (name)",
                                            413)
    assert len(steady.engine.oplog.table) == 465
