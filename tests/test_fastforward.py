"""Fast-forward (run.fast_forward): a periodic timing-only schedule is written from
short simulations, byte for byte what the full simulation writes (verify mode checks it);
a schedule that does not repeat is simulated in full and the run says so."""

import pytest

from conftest import compose_cfg, copies_only, run
from kbframe.errors import SanitizerError
from kbframe.run import fastforward, periodic
from kbframe.run.bench import run_bench, validate
from kbframe.run.metrics import summary
from kbframe.sim.targets import resolve_kernel
from kbframe.tl.recipe import load_recipes

from regen_goldens import CASES


@pytest.fixture(autouse=True)
def any_cost(monkeypatch, request):
    """Exactness is tested on runs short enough for the suite: the short copies may cost
    any share of them (the budget has a test of its own)."""
    if "budget" not in request.node.name:
        monkeypatch.setattr(fastforward, "BUDGET", float("inf"))
        monkeypatch.setattr(fastforward, "SETTLING_BUDGET", float("inf"))


@pytest.fixture
def copies(monkeypatch):
    """The short copies only (kbframe.run.fastforward)."""
    copies_only(monkeypatch)


@pytest.fixture(params=["one", "copies"])
def mechanism(request, monkeypatch):
    """Each way of fast-forwarding: in one simulation (tried first), and the short copies."""
    if request.param == "copies":
        copies_only(monkeypatch)
    return request.param


def _ff(tmp_path, *overrides, bench="decode_opt2", mode="verify"):
    return run(tmp_path, *overrides, "bench.data=false", f"run.fast_forward={mode}", bench=bench)


@pytest.mark.parametrize("case", list(CASES))
def test_verify_on_every_golden_case(tmp_path, case, mechanism):
    """Timing only, each golden shape: fast-forward either applies and equals the full
    simulation (verify raises otherwise) or says why it simulated in full."""
    bench, overrides = CASES[case]
    m = _ff(tmp_path, *[o for o in overrides if not o.startswith("bench.data")], bench=bench)
    ff = m["fast_forward"]
    assert ff["mode"] == "verify"
    if ff["applied"]:
        assert ff["note"].startswith("fast-forwarded ") and ff["note"].endswith("; verified against the full simulation")
    else:
        assert ff["note"].startswith("simulated in full: ")


@pytest.mark.parametrize("bench, overrides", [
    ("decode_opt2", ("bench.S_kv=16384",)),                        # PE_CPU settles after ~48 tiles
    ("decode_opt3", ("bench.S_kv=8192",)),
    # ragged last tile: a command's completion ties with its stage across the block and the tail
    ("decode_opt3", ("bench.S_kv=8220", "run.check=false")),
    ("decode_opt2", ("bench.S_kv=51200", "bench.tile=128", "++bench.s_buffers=3", "++bench.v_staging=prefetch")),
    ("decode_heads", ("+model=llama3_70b", "hardware=cube", "bench.S_kv=16384", "run.check=false")),  # 8 PEs
    ("decode_splitk", ("hardware=cube", "bench.splits=8", "bench.merge=tree", "bench.S_kv=131072")),  # IPCQ merge
    # without the sanitizer the short copies' records are never formatted (with IPCQ records:
    # test_on_writes_the_files_off_writes)
    ("decode_opt3", ("bench.S_kv=8192", "run.check=false")),
])
def test_periodic_schedules_fast_forward_exactly(tmp_path, bench, overrides, mechanism):
    """verify: op_log, wait records, totals and dispatch cycles equal the full simulation's."""
    m = _ff(tmp_path, *overrides, bench=bench)
    assert m["fast_forward"]["applied"], m["fast_forward"]["note"]
    assert "verified against the full simulation" in m["fast_forward"]["note"]


@pytest.mark.parametrize("bench, overrides", [
    ("decode_opt3", ("bench.S_kv=8192",)),
    ("decode_splitk", ("hardware=cube", "bench.splits=8", "bench.merge=tree", "bench.S_kv=131072",
                       "run.check=false")),                                                 # IPCQ tracks
])
def test_on_writes_the_files_off_writes(tmp_path, monkeypatch, bench, overrides):
    """The run's own files, on against off: op_log, trace (written from the shifted
    records, not re-read, in chunks of 1000 records here: kinds made across chunks) and
    metrics.json but wall time and the fast_forward note."""
    from kbframe.report import trace
    monkeypatch.setattr(trace, "RECORD_CHUNK", 1000)
    on = _ff(tmp_path / "on", *overrides, bench=bench, mode="on")
    off = _ff(tmp_path / "off", *overrides, bench=bench, mode="off")
    assert on["fast_forward"]["applied"] and not off["fast_forward"]["applied"]
    assert (tmp_path / "on" / "op_log.jsonl").read_bytes() == (tmp_path / "off" / "op_log.jsonl").read_bytes()
    assert (tmp_path / "on" / "trace.json").read_bytes() == (tmp_path / "off" / "trace.json").read_bytes()
    for m_ in (on, off):
        m_["sim"].pop("wall_s")
        m_.pop("fast_forward")
    assert on == off


def test_a_schedule_with_contention_falls_back_and_says_so(tmp_path, mechanism):
    """Shared HBM: the PEs contend for the cube's port; their KV loops never look steady,
    and that one simulation is the full run; the short copies do not repeat."""
    m = _ff(tmp_path, "+model=llama3_70b", "hardware=cube", "hardware.hbm_mode=shared", "bench.S_kv=6144",
            bench="decode_heads")
    ff = m["fast_forward"]
    want = ("simulated in full: no loop along S_kv looked steady with a stretch to leave out" if mechanism == "one"
            else "simulated in full: not periodic (")
    assert not ff["applied"] and ff["note"].startswith(want), ff["note"]
    assert m["sanitizer"]["rules_checked"] > 0
    assert f"  fast-fwd    {ff['note']}" in summary(m, tmp_path)


@pytest.mark.usefixtures("copies")
def test_verify_catches_a_wrong_shift(tmp_path, monkeypatch):
    """A record shifted 1 ps too far when written: verify names the op_log line."""
    real = periodic._table_rows

    def wrong(names, codes, nums):
        rows = real(names, codes, nums)
        rows[len(rows) // 2, 4] += 1  # one record's end (kbframe.records.FIELDS), mid-run
        return rows
    monkeypatch.setattr(periodic, "_table_rows", wrong)
    cfg = compose_cfg("bench.S_kv=8192", "bench.data=false", "run.fast_forward=verify", "run.progress=false",
                      bench="decode_opt3")
    with pytest.raises(SanitizerError, match=r"^fast-forward: op_log line \d+ differs from the full simulation's: "):
        run_bench(cfg, tmp_path)


def test_data_mode_and_off_simulate_every_tile(tmp_path):
    m = run(tmp_path, "bench.S_kv=8192", bench="decode_opt3")
    assert m["fast_forward"] == {"mode": "on", "applied": False, "note": "data mode: every tile simulated"}
    m = _ff(tmp_path / "off", "bench.S_kv=8192", bench="decode_opt3", mode="off")
    assert m["fast_forward"] == {"mode": "off", "applied": False, "note": "off"}
    # an unknown mode is refused when the config is composed (run.fast_forward is an Enum
    # field; the CLI's message: docs/errors.md, run_fast_forward_bad)
    from hydra.errors import ConfigCompositionException
    with pytest.raises(ConfigCompositionException, match=r"run.fast_forward=maybe"):
        compose_cfg("run.fast_forward=maybe", "run.progress=false", bench="decode_opt3")


@pytest.mark.usefixtures("copies")
def test_a_run_whose_copies_would_cost_too_much_is_simulated_in_full_budget(tmp_path):
    """opt2 at 16384 keys (256 tiles): its first copies already cost more than a tenth of
    the run. At 51200 keys (800 tiles) PE_CPU is seen settling (it runs ahead of the units
    for ~50 tiles), and copies of 64 tiles and more, which show the steady state, cost more
    than 30 %. Both say so and simulate every tile; at 131072 keys (2048 tiles) the copies
    fit (14 % of the run's tiles) and the period is one tile."""
    m = _ff(tmp_path / "a", "bench.S_kv=16384", mode="on")
    assert not m["fast_forward"]["applied"]
    assert m["fast_forward"]["note"] == "simulated in full: its short copies would cost over 10% of the run"
    m = _ff(tmp_path / "b", "bench.S_kv=51200", "run.check=false", "run.trace=false", mode="on")
    assert not m["fast_forward"]["applied"]
    assert m["fast_forward"]["note"] == (
        "simulated in full: not periodic (the records of cpu on PE0 move 102500 ps a period, the run 287000 ps); "
        "more short copies would cost over 30% of the run")
    m = _ff(tmp_path / "c", "bench.S_kv=131072", "run.check=false", "run.trace=false", mode="on")
    assert m["fast_forward"]["note"] == ("fast-forwarded 1981 of 1984 periods of 1 step(s) along S_kv (35658 of 36882 "
                                         "records by shifting)")


def test_a_short_copy_that_fails_leaves_the_error_to_the_pre_flight_check(tmp_path):
    """A TCM too small: the first short copy overflows; the run is then checked as one
    that does not fast-forward, so the error is the dry run's, and nothing is written."""
    from kbframe.errors import TcmOverflowError
    cfg = compose_cfg("bench.S_kv=8192", "bench.data=false", "hardware.tcm_bytes=1024", "run.progress=false",
                      bench="decode_opt2")
    with pytest.raises(TcmOverflowError) as e:
        run_bench(cfg, tmp_path / "run")
    assert str(e.value) == ("TCM overflow on PE0: request 'q@tcm' needs 2048 B, 1024 B free of 1024 B capacity "
                            "(hardware.tcm_bytes); decode_opt2 needs 8320 B of TCM in all at G=8 d=128 S_kv=8192 "
                            "tile=64 (float16), found by a dry run before the simulation")
    assert not (tmp_path / "run").exists()
    out = fastforward.run(cfg, validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), True)
    assert out.sim is None and out.note.startswith("simulated in full: a short copy failed (TCM overflow on PE0: ")


def test_a_completion_tied_with_its_own_stage_follows_it():
    """kbframe.run.periodic._completions_after_their_stage on hand-made records: a
    PE_SCHEDULER record placed before its own stage that ends at the same instant moves to
    right after that stage (after the last, if several); one already after its stage, one
    tied only with another command's stage, and the dispatches stay where they are."""
    import numpy as np
    from kbframe.run.periodic import _completions_after_their_stage
    table = [(0, "cpu", "composite"), (0, "gemm", "gemm"), (0, "math", "add"), (0, "scheduler", "composite"),
             (1, "gemm", "gemm")]
    # (code, cmd, end ps): the order the tie-break gave
    rows = [(3, 7, 100),  # 0: cmd 7 completes at 100, before its stages 2 and 3 → after 3
            (0, 8, 100),  # 1: a dispatch at the same instant: stays
            (1, 7, 100),  # 2: cmd 7's GEMM
            (2, 7, 100),  # 3: cmd 7's MATH, its last stage at 100
            (3, 9, 100),  # 4: PE 0's cmd 9 completes, with no stage of its own at 100
            (4, 9, 100),  # 5: PE 1's GEMM of its own cmd 9: another PE's, no move
            (1, 6, 200),  # 6: cmd 6's stage, then
            (3, 6, 200)]  # 7: its completion, already after it
    codes = np.array([c for c, _, _ in rows], dtype=np.int64)
    nums = np.zeros((len(rows), 6), dtype=np.int64)
    nums[:, 0] = [cmd for _, cmd, _ in rows]
    nums[:, 3] = [end for _, _, end in rows]
    order = np.arange(len(rows), dtype=np.int64)
    assert _completions_after_their_stage(table, codes, nums, order).tolist() == [1, 2, 3, 0, 4, 5, 6, 7]
    settled = np.array([1, 2, 3, 0, 4, 5, 6, 7], dtype=np.int64)  # every completion after its stages
    assert _completions_after_their_stage(table, codes, nums, settled).tolist() == settled.tolist()


@pytest.mark.usefixtures("copies")
@pytest.mark.parametrize("items, inner, note", [
    (2, "opt2", "957 of 960 periods of 1 step(s) along S_kv (34452 of 36900"),
    (3, "opt2", "957 of 960 periods of 1 step(s) along S_kv (51678 of 55350"),
    (2, "opt3", "1005 of 1008 periods of 1 step(s) along S_kv (78390 of 79914")])  # GEMM names repeat across items
def test_several_items_on_one_pe_fast_forward_exactly(tmp_path, items, inner, note):
    """Two and three (sequence, KV head) items on one PE: a KV tile more per item adds a
    block to each item's loop in every stream. The blocks are found per item, PE_CPU's
    run-ahead is seen settling (with three items its dispatches wait for queue room at
    other commands in the longer copy; the copies grow to 64 tiles), the dispatches that tie
    with stages many tiles later are ordered as they were scheduled, and verify finds the
    run identical."""
    m = _ff(tmp_path, f"bench.H_q={2 * items}", f"bench.H_kv={items}", "bench.S_kv=65536", f"bench.inner={inner}",
            "run.check=false", bench="decode_heads")
    assert m["fast_forward"]["note"] == (f"fast-forwarded {note} records by shifting); verified against the full "
                                         f"simulation")


def test_items_that_move_unlike_the_run_are_settling():
    """kbframe.run.periodic._check_moves: a stream adding no records (no moves) is passed
    over; two streams of one item moving differently, or no PE whose items add up to the
    run's move, are a stream still settling."""
    import numpy as np
    none, t = np.zeros((0, 2), np.int64), np.full((2, 2), 300, np.int64)
    moves = {(0, 0): [((0, "dma_write"), none), ((0, "math"), t)], (0, 1): [((0, "math"), t)]}
    periodic._check_moves(moves, 600)
    with pytest.raises(periodic.Settling, match=r"^no PE's items move by the run's 500 ps a period \(PE0's by 600\)$"):
        periodic._check_moves(moves, 500)
    moves[(0, 1)].append(((0, "cpu"), t - 100))
    with pytest.raises(periodic.Settling, match=r"^the records of cpu on PE0 move 200 ps a period, item 2's other "
                                                r"records 300 ps$"):
        periodic._check_moves(moves)


def _stream(names: str, moved_from: int | None = None) -> list:
    """A hand-made stream: one record per letter, its names the letter, its times 10 ps
    apart; from record ``moved_from`` on 5 ps later (a longer copy's records after the first
    place it grows)."""
    return [(i, ((0, "math", ch), (i, -1, 10 * i + 5 * (moved_from is not None and i >= moved_from),
                                   10 * i + 10, -1, -1))) for i, ch in enumerate(names)]


def test_blocks_are_found_per_item_at_the_same_tile():
    """kbframe.run.periodic._align on hand-made streams (tiles t, an item's epilogue e): one
    item grows at one place; two items each by a tile, the second block put as far before
    the place the names part as the first is (the same tile of each item's loop: its records
    first differ before the last tile), not at the epilogue."""
    key = (0, "math")
    assert periodic._align(_stream("pttte"), _stream("ptttte", 3), 1, key) == ([3], 1)
    assert periodic._align(_stream("ptttepttte"), _stream("ptttteptttte", 3), 2, key) == ([3, 8], 1)
    assert periodic._align(_stream("pttte"), _stream("pttte", 3), 0, key) == ([3], 0)  # shifted, not grown
    with pytest.raises(periodic.NotPeriodic, match=r"^the records of math on PE0 are not periodic$"):
        periodic._align(_stream("ptttepttte"), _stream("pttttepttttx", 3), 2, key)


def test_far_ties_are_ordered_as_scheduled():
    """kbframe.run.periodic._far_ties: records of far-apart periods that end at one instant
    go in the order their last waits began (a DMA transfer's data phase, else the start);
    an IPCQ receive among them (no duration) cannot be placed."""
    import numpy as np
    nums = np.array([[1, -1, 50, 100, -1, -1],    # a MATH stage from 50
                     [2, 0, 10, 100, 70, -1],     # a DMA read whose data phase began at 70
                     [3, -1, 80, 100, -1, -1]])   # a dispatch from 80
    assert periodic._far_ties(nums, np.array([True, True, True])).tolist() == [50, 70, 80]
    assert periodic._far_ties(nums, np.array([False, True, False])).tolist() == [0, 70, 0]
    recv = np.array([[4, -1, 100, 100, -1, -1]])
    with pytest.raises(periodic.NotPeriodic, match="more than two neighbouring periods"):
        periodic._far_ties(np.concatenate([nums, recv]), np.array([True] * 4))


def test_the_far_tie_rule_is_checked_on_the_copies():
    """kbframe.run.periodic._ties_as_scheduled: a copy whose tied records are in the order
    their last waits were scheduled (PE_SCHEDULER's and zero-length ones aside) supports the
    rule; one with a later-scheduled record logged first does not."""
    from kbframe.records import RecordTable

    def table(rows):
        t = RecordTable()
        for unit, t0, t1, td in rows:
            t.append(t.code(0, unit, "x"), 1, -1, t0, t1, td, 0, -1, -1, -1)
        return t
    holds = [("math", 50, 100, -1), ("dma_read", 10, 100, 70), ("scheduler", 5, 100, -1),
             ("ipcq_recv", 100, 100, -1), ("cpu", 80, 100, -1), ("gemm", 0, 120, -1)]
    assert periodic._ties_as_scheduled(table(holds))
    assert not periodic._ties_as_scheduled(table([holds[4], *holds[:4]]))


@pytest.mark.usefixtures("copies")
def test_a_rule_a_short_copy_breaks_leaves_the_run_to_the_full_simulation(monkeypatch):
    """With run.check each short copy is checked (kbframe.run.fastforward._Copies); a rule
    broken there leaves the run to the full simulation, whose sanitizer reports it as it
    would, and the note names the copy's error."""
    from kbframe.sim import sanitizer

    def broken(engine, records):
        raise SanitizerError(f"sanitizer: unit_capacity: planted, {len(records)} records", "unit_capacity")

    monkeypatch.setattr(sanitizer, "check", broken)
    cfg = compose_cfg("bench.S_kv=8192", "bench.data=false", "run.progress=false", bench="decode_opt3")
    out = fastforward.run(cfg, validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), True)
    assert out.sim is None
    assert out.note == "simulated in full: a short copy failed (sanitizer: unit_capacity: planted, 645 records)"


@pytest.mark.usefixtures("copies")
def test_a_rule_broken_in_a_copy_of_a_candidate_ruled_out_still_counts(monkeypatch):
    """decode_opt2's first copies (16 and 17 KV tiles) are ruled out (PE_CPU still
    settling); the sanitizer's verdict on them is taken all the same before the run is
    fast-forwarded: a rule broken only in the first sends the run to the full simulation."""
    from kbframe.sim import sanitizer
    real = sanitizer.check

    def broken_at_16_tiles(engine, records):
        if len(records) == 306:  # the 16-tile copy
            raise SanitizerError("sanitizer: rule unit_capacity violated: planted", "unit_capacity")
        return real(engine, records)

    monkeypatch.setattr(sanitizer, "check", broken_at_16_tiles)
    cfg = compose_cfg("bench.S_kv=8960", "bench.data=false", "run.progress=false", bench="decode_opt2")
    out = fastforward.run(cfg, validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), True)
    assert out.sim is None
    assert out.note == "simulated in full: a short copy failed (sanitizer: rule unit_capacity violated: planted)"
    monkeypatch.setattr(sanitizer, "check", real)
    out = fastforward.run(cfg, validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), True)
    assert out.note == "fast-forwarded 73 of 76 periods of 1 step(s) along S_kv (1314 of 2538 records by shifting)"


@pytest.mark.usefixtures("copies")
def test_the_last_copys_verdict_taken_after_the_full_records_still_counts(monkeypatch):
    """The fourth copy of the candidate that verifies is checked after the full run's
    records are made (kbframe.run.fastforward._run); a rule broken only there still sends
    the run to the full simulation, and sanitizer counts other than predicted rule the
    candidate out (the next period, 2 steps, is tried)."""
    from kbframe.sim import sanitizer
    real = sanitizer.check

    def broken_at_67_tiles(engine, records):
        if len(records) == 1224:  # the fourth copy of period 1 (64 + 3 KV tiles)
            raise SanitizerError("sanitizer: rule unit_capacity violated: planted", "unit_capacity")
        return real(engine, records)

    def one_access_more_at_67_tiles(engine, records):
        counts = real(engine, records)
        return {**counts, "accesses": counts["accesses"] + 1} if len(records) == 1224 else counts

    cfg = compose_cfg("bench.S_kv=8960", "bench.data=false", "run.progress=false", bench="decode_opt2")
    args = (validate(cfg), resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes), True)
    monkeypatch.setattr(sanitizer, "check", broken_at_67_tiles)
    assert fastforward.run(cfg, *args).note == \
        "simulated in full: a short copy failed (sanitizer: rule unit_capacity violated: planted)"
    monkeypatch.setattr(sanitizer, "check", one_access_more_at_67_tiles)
    out = fastforward.run(cfg, *args)
    assert out.note == "fast-forwarded 35 of 38 periods of 2 step(s) along S_kv (1260 of 2538 records by shifting)"
    assert out.sim.sanitizer["accesses"] == real(*_checked_full_run(cfg, *args[:3]))["accesses"]


def _checked_full_run(cfg, wl, kernel, recipes) -> tuple:
    """The engine and op_log text of ``cfg``'s full simulation with the sanitizer on."""
    import io
    from kbframe.run.simulate import simulate
    text = io.StringIO()
    sim = simulate(cfg, wl, kernel, recipes, None, text, True, False, check_later=True)
    return sim.engine, text
