"""GQA decode opt2 vs opt3 (issues 2 and 3; ADR-0065 Test Requirements 3, 6, 7; DDD-0065 §10
numeric parity, K-before-V, dispatch ratio).

Numerics: each kernel's output against an independent float64 reference (max abs err ≤ 1e-5)
and against the other kernel, for random, strongly peaked, near-uniform and ragged inputs,
every S_kv / d the issues list, and loaded .npz inputs."""
import math

import numpy as np
import pytest

from conftest import load_out, read_oplog, ref64, run

KERNELS = ("decode_opt3", "decode_opt2")
TOL = 1e-5


def _pair(tmp_path, *overrides, scale=None):
    """Run opt3 and opt2 with the same overrides; return their outputs and the inputs."""
    outs = {}
    for bench in KERNELS:
        d = tmp_path / bench
        m = run(d, *overrides, bench=bench)
        t = load_out(d)
        outs[bench] = (m, t)
    t = outs["decode_opt3"][1]
    for k in ("q", "k", "v"):  # same inputs for both kernels
        np.testing.assert_array_equal(outs["decode_opt2"][1][k], t[k])
    sc = scale if scale is not None else 1.0 / math.sqrt(t["q"].shape[1])
    return outs, t, sc


def _check_parity(outs, t, sc):
    ref = ref64(t["q"], t["k"], t["v"], sc)
    for bench, (m, tens) in outs.items():
        err = np.abs(tens["out"] - ref).max()
        assert err <= TOL, (bench, err)
        assert m["numerics"]["enabled"] is True
        assert m["numerics"]["max_abs_err"] <= TOL
        assert m["numerics"]["max_abs_err"] == pytest.approx(err, rel=1e-6, abs=1e-12)
        np.testing.assert_allclose(tens["ref"], ref, rtol=1e-12, atol=1e-12)
    d23 = np.abs(outs["decode_opt2"][1]["out"] - outs["decode_opt3"][1]["out"]).max()
    assert d23 <= TOL, d23
    return ref


def _score_range(t, sc):
    s = (t["q"] @ t["k"].T) * sc
    return (s.max(axis=1) - s.min(axis=1)).min(), (s.max(axis=1) - s.min(axis=1)).max()


@pytest.mark.parametrize("regime, peak", [("random", 1.0), ("peaked", 20.0), ("near_uniform", 0.01)])
def test_adr0065_tr6_opt2_matches_opt3_and_reference(tmp_path, regime, peak):
    outs, t, sc = _pair(tmp_path, "bench.S_kv=129", "bench.d=64", f"bench.inputs.peak={peak}", "bench.seed=3")
    lo, hi = _score_range(t, sc)
    if regime == "peaked":
        assert lo > 50  # every row's score range exceeds 50: softmax is nearly one-hot
    elif regime == "near_uniform":
        assert hi < 0.2
    ref = _check_parity(outs, t, sc)
    if regime == "peaked":  # a real check: the output is dominated by a few keys, far from the mean of v
        assert np.abs(ref - t["v"].mean(axis=0)).max() > 0.5


def test_ddd0065_s10_numeric_parity_g8_s64(tmp_path):
    """DDD §10 "Numeric parity": (G=8, T_q=1, S_kv=64) in data mode, O_opt2 ≈ O_opt3 (and both
    ≈ the float64 reference), with scores spread enough (peak 3) that the check is not trivial."""
    outs, t, sc = _pair(tmp_path, "bench.S_kv=64", "bench.G=8", "bench.inputs.peak=3")
    ref = _check_parity(outs, t, sc)
    assert np.abs(ref - t["v"].mean(axis=0)).max() > 0.1


@pytest.mark.parametrize("S_kv", [1, 63, 64, 65, 129, 4096])
def test_parity_over_s_kv_including_ragged(tmp_path, S_kv):
    outs, t, sc = _pair(tmp_path, f"bench.S_kv={S_kv}", "bench.inputs.peak=5")
    _check_parity(outs, t, sc)
    n_tiles = -(-S_kv // 64)
    for bench, (m, _) in outs.items():
        assert m["shape"] == {"G": 8, "d": 128, "S_kv": S_kv, "tile": 64, "n_tiles": n_tiles}


@pytest.mark.parametrize("d", [32, 64, 128])
def test_parity_over_head_dim(tmp_path, d):
    outs, t, sc = _pair(tmp_path, f"bench.d={d}", "bench.S_kv=200", "bench.inputs.peak=8")
    assert t["q"].shape == (8, d)
    _check_parity(outs, t, sc)


@pytest.mark.parametrize("with_scale", [False, True])
def test_parity_loaded_npz(tmp_path, with_scale):
    """A loaded .npz: its shapes (G=4, d=32, S_kv=70) replace the bench's defaults (none was
    set explicitly) and are recorded; a 0-d scale replaces 1/sqrt(d)."""
    r = np.random.default_rng(11)
    q, k, v = r.standard_normal((4, 32)) * 3, r.standard_normal((70, 32)), r.standard_normal((70, 32))
    arrays = {"q": q, "k": k, "v": v}
    if with_scale:
        arrays["scale"] = np.array(0.5)
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    outs, t, sc = _pair(tmp_path, f"bench.inputs.path={path}", scale=0.5 if with_scale else 1 / math.sqrt(32))
    np.testing.assert_array_equal(t["q"], q)
    ref = _check_parity(outs, t, sc)
    other = ref64(q, k, v, 1 / math.sqrt(32) if with_scale else 0.5)  # the scale really matters
    assert np.abs(ref - other).max() > 1e-2
    for _, (m, _) in outs.items():
        assert m["shape"] == {"G": 4, "d": 32, "S_kv": 70, "tile": 64, "n_tiles": 2}


def test_timing_is_independent_of_data_mode(tmp_path):
    """Timing and numerics are two paths behind one interface: the op_log is byte-identical
    with and without data mode."""
    for bench in KERNELS:
        a, b = tmp_path / f"{bench}_data", tmp_path / f"{bench}_timing"
        run(a, "bench.S_kv=200", bench=bench)
        m = run(b, "bench.S_kv=200", "bench.data=false", bench=bench)
        assert m["numerics"]["enabled"] is False and m["numerics"]["max_abs_err"] is None
        assert (a / "op_log.jsonl").read_bytes() == (b / "op_log.jsonl").read_bytes()


# ---- dispatch (ADR-0065 TR7, DDD §10/§11, ADR-0064 Test #9) ------------------------------
# logical bytes per tile, by hand (tests/test_tl.py, tests/hw/test_pe_cpu.py):
#   opt2: #1 composite [gemm 40, scale 8] = 54; #2 softmax_merge composite = 306 → 2 cmds, 360 B
#   opt3: 2 loads 24+24, 2 dots 44+44, rmax 24, max_elem 32, exp_diff 32+32, rsum 24, fma 40,
#         mul_bcast 32, add 32, copy 24 → 13 cmds, 408 B
# once per kernel:
#   opt2: load q 24, fill m/l/O 20·3, div_bcast 32, store 24 → 6 cmds, 140 B
#   opt3: load q 24, scale q 28, fill m/l/O 20·3, div_bcast 32, store 24 → 7 cmds, 168 B
PER_TILE = {"decode_opt2": (2, 360), "decode_opt3": (13, 408)}
ONCE = {"decode_opt2": (6, 140), "decode_opt3": (7, 168)}
R_VALUES = (0.25, 0.0625, 0.03125)


@pytest.fixture(scope="module")
def dispatch_runs(tmp_path_factory):
    """Both kernels at default shapes (G=8, d=128, S_kv=4096, TILE=64), timing only, at each R."""
    base = tmp_path_factory.mktemp("dispatch")
    res = {}
    for R in R_VALUES:
        for bench in KERNELS:
            d = base / f"{bench}_{R}"
            res[(bench, R)] = (run(d, f"calibration.R={R}", "bench.data=false", bench=bench), d)
    return res


@pytest.mark.parametrize("R", R_VALUES)
def test_dispatch_cycles_match_hand_computed(dispatch_runs, R):
    for bench in KERNELS:
        m, _ = dispatch_runs[(bench, R)]
        n, b = PER_TILE[bench]
        n1, b1 = ONCE[bench]
        assert m["dispatch"]["commands"] == 64 * n + n1
        assert m["dispatch"]["cycles"] == pytest.approx(64 * (40 * n + R * b) + 40 * n1 + R * b1, abs=1e-9)
        assert m["dispatch"]["cycles_per_tile"] == pytest.approx(m["dispatch"]["cycles"] / 64, abs=1e-12)


@pytest.mark.parametrize("R", R_VALUES)
def test_adr0065_tr7_dispatch_ratio_opt3_over_2x_opt2(dispatch_runs, R):
    c3 = dispatch_runs[("decode_opt3", R)][0]["dispatch"]["cycles_per_tile"]
    c2 = dispatch_runs[("decode_opt2", R)][0]["dispatch"]["cycles_per_tile"]
    assert c2 < c3
    assert c3 > 2 * c2
    # steady-state per tile (without the once-per-kernel commands): (520 + 408R) / (80 + 360R)
    assert (520 + 408 * R) / (80 + 360 * R) > 2


def test_ddd0065_s10_dispatch_sensitivity_sweep(dispatch_runs):
    """DDD §10 / ADR-0064 Test #9: opt2 < opt3 at R = 0.25, 0.0625, 0.03125, and the ratio grows
    monotonically as R falls (more FIXED-dominated). Expected per-tile ratios, amortised:
    (64·(520 + 408R) + 280 + 168R) / (64·(80 + 360R) + 240 + 140R) = 3.60, 5.17, 5.65."""
    ratios = []
    for R in R_VALUES:
        c3 = dispatch_runs[("decode_opt3", R)][0]["dispatch"]["cycles_per_tile"]
        c2 = dispatch_runs[("decode_opt2", R)][0]["dispatch"]["cycles_per_tile"]
        assert c2 < c3
        ratios.append(c3 / c2)
    assert ratios == sorted(ratios)
    want = [(64 * (520 + 408 * R) + 280 + 168 * R) / (64 * (80 + 360 * R) + 240 + 140 * R) for R in R_VALUES]
    assert ratios == pytest.approx(want, rel=1e-12)
    assert [round(r, 2) for r in ratios] == [3.60, 5.17, 5.65]


def test_ddd0065_s10_steady_state_per_tile_dispatch_from_op_log(dispatch_runs):
    """Per-tile dispatch read from the op_log: opt2 issues exactly 2 composites per tile
    (54 + 306 logical bytes) at 2·FIXED + R·360 cycles; opt3 13 primitives at 13·FIXED + R·408
    (R = 0.0625: 102.5 vs 545.5 cycles, 5.32×)."""
    from collections import Counter
    per_tile_cmds = {
        "decode_opt2": {("composite", 54): 1, ("composite", 306): 1},
        "decode_opt3": {("load", 24): 2, ("gemm", 44): 2, ("rmax", 24): 1, ("max_elem", 32): 1,
                        ("exp_diff", 32): 2, ("rsum", 24): 1, ("fma", 40): 1, ("mul_bcast", 32): 1,
                        ("add", 32): 1, ("copy", 24): 1}}
    per_tile = {}
    for bench, want in (("decode_opt2", 80 + 360 * 0.0625), ("decode_opt3", 520 + 408 * 0.0625)):
        _, d = dispatch_runs[(bench, 0.0625)]
        cpu = [r for r in read_oplog(d / "op_log.jsonl") if r["unit"] == "cpu"]
        n_pre = 4 if bench == "decode_opt2" else 5  # load q, [scale q], fill m, l, O
        body = cpu[n_pre:-2]                          # minus div_bcast and store at the end
        assert Counter((r["op_kind"], r["bytes"]) for r in body) == {
            k: 64 * v for k, v in per_tile_cmds[bench].items()}
        for r in body:  # each dispatch holds PE_CPU FIXED + R × bytes cycles (1 GHz)
            assert r["t_end_ns"] - r["t_start_ns"] == 40 + 0.0625 * r["bytes"]
        per_tile[bench] = sum(r["t_end_ns"] - r["t_start_ns"] for r in body) / 64
        assert per_tile[bench] == want
    assert per_tile["decode_opt3"] / per_tile["decode_opt2"] == pytest.approx(545.5 / 102.5)  # 5.32×
    _, d = dispatch_runs[("decode_opt2", 0.0625)]
    cpu = [r for r in read_oplog(d / "op_log.jsonl") if r["unit"] == "cpu"]
    assert [r["bytes"] for r in cpu[4:8]] == [54, 54, 306, 54]  # #1(0), #1(1), #2(0), #1(2): K ahead


def test_opt2_commands_per_tile(dispatch_runs):
    m, _ = dispatch_runs[("decode_opt2", 0.0625)]
    assert m["dispatch"]["commands_per_tile"] == 2 + 6 / 64  # 2 + once-per-kernel / n_tiles, exactly
    m3, _ = dispatch_runs[("decode_opt3", 0.0625)]
    assert m3["dispatch"]["commands_per_tile"] == 13 + 7 / 64


def test_opt2_latency_lower_than_opt3(dispatch_runs):
    for R in R_VALUES:
        l2 = dispatch_runs[("decode_opt2", R)][0]["sim"]["latency_ns"]
        l3 = dispatch_runs[("decode_opt3", R)][0]["sim"]["latency_ns"]
        assert l2 < l3, (R, l2, l3)


def _k_before_v(log):
    two = sorted({r["cmd"] for r in log if r["unit"] == "math" and r["op_kind"] == "rmax" and r["tile"] == -1})
    one = sorted({r["cmd"] for r in log if r["unit"] == "math" and r["op_kind"] == "scale" and r["tile"] >= 0})
    windows = {}
    for r in log:
        if r["cmd"] in two and r["unit"] == "math" and r["tile"] == -1:
            lo, hi = windows.get(r["cmd"], (math.inf, -math.inf))
            windows[r["cmd"]] = (min(lo, r["t_start_ns"]), max(hi, r["t_end_ns"]))
    v_dma = [r for r in log if r["unit"] == "dma_read" and r["cmd"] in two]
    k_dma = [r for r in log if r["unit"] == "dma_read" and r["cmd"] in one]
    return two, one, windows, v_dma, k_dma


def _overlaps(r, win):
    return r["t_start_ns"] < win[1] and r["t_end_ns"] > win[0]


@pytest.mark.parametrize("S_kv", [4096, 129])
def test_adr0065_tr3_k_before_v(dispatch_runs, tmp_path, S_kv):
    """No V DMA while any #2's prologue MATH stages run; each #2's V DMA starts after its own
    prologue; K tiles (#1) do stream during prologues (the check is not vacuous)."""
    if S_kv == 4096:
        d = dispatch_runs[("decode_opt2", 0.0625)][1]
    else:
        d = tmp_path / "r"
        run(d, f"bench.S_kv={S_kv}", "bench.data=false")
    log = read_oplog(d / "op_log.jsonl")
    two, one, windows, v_dma, k_dma = _k_before_v(log)
    n_tiles = -(-S_kv // 64)
    assert len(two) == len(one) == n_tiles
    assert len(v_dma) == len(k_dma) == n_tiles  # one V read per #2, one K read per #1
    for c in two:  # each #2 has exactly the 8 prologue MATH stages
        assert [r["op_kind"] for r in log if r["cmd"] == c and r["unit"] == "math" and r["tile"] == -1] == [
            "rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma", "mul_bcast", "copy"]
    assert not [(v["cmd"], c) for v in v_dma for c, w in windows.items() if _overlaps(v, w)]
    for v in v_dma:
        assert v["t_start_ns"] >= windows[v["cmd"]][1]
    # tile j's K read (#1, cmd order) ends before tile j's V read (#2) starts
    for k, v in zip(sorted(k_dma, key=lambda r: r["cmd"]), sorted(v_dma, key=lambda r: r["cmd"])):
        assert k["t_end_ns"] <= v["t_start_ns"]
    if n_tiles > 2:
        assert any(_overlaps(k, w) for k in k_dma for w in windows.values())


def test_opt3_per_tile_commands_in_op_log(dispatch_runs):
    """opt3 issues 13 primitives per tile: 2 loads, 2 GEMMs, 9 MATH — in this order."""
    _, d = dispatch_runs[("decode_opt3", 0.0625)]
    cpu = [r["op_kind"] for r in read_oplog(d / "op_log.jsonl") if r["unit"] == "cpu"]
    assert cpu[:5] == ["load", "scale", "fill", "fill", "fill"]
    assert cpu[5:7] == ["load", "load"]  # tile 0's K, V before the loop
    # in the loop: next tile's K, V first, then tile j's compute
    assert cpu[7:20] == ["load", "load", "gemm", "rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma",
                         "mul_bcast", "gemm", "add", "copy"]
    assert cpu[-2:] == ["div_bcast", "store"]


def test_tile_longer_than_sequence_needs_only_the_sequence(tmp_path):
    # S_kv=1 with tile=16384: buffers are sized by min(tile, S_kv), so both kernels fit a
    # TCM far smaller than 16384 keys of K/V (16384·128·2 B = 4 MiB per buffer) and are exact
    outs, t, sc = _pair(tmp_path, "bench.S_kv=1", "bench.tile=16384", "hardware.tcm_bytes=65536")
    _check_parity(outs, t, sc)
    np.testing.assert_allclose(outs["decode_opt3"][1]["out"], np.repeat(t["v"][:1], t["q"].shape[0], 0), atol=1e-6)
    for bench, (m, _) in outs.items():
        assert m["tcm"]["high_water_bytes"] < 65536, bench


# ---- opt2's design space --------------------------------------------------------
PREFETCH3 = ("bench.v_staging=prefetch", "bench.s_buffers=3", "bench.v_buffers=3", "bench.k_prefetch=2")


def test_opt2_v_prefetch_reaches_the_hbm_bound(tmp_path):
    """V loaded k tiles ahead into TCM (3 S and 3 V buffers, distance 2): no DMA inside #2,
    so the tile's chain no longer binds: ≥ 90 % of the HBM bound at S_kv=4096, tile 64,
    HBM binds, 3 commands per tile, and the numbers match float64 within 1e-5."""
    m = run(tmp_path, *PREFETCH3)
    r, cp = m["roofline"], m["critical_path"]
    assert r["largest_bound"] == "hbm" and r["fraction"] >= 0.90
    assert m["sim"]["latency_ns"] == 10722.625  # 95.6 % of 10 250 ns
    assert (cp["binding"], cp["period_ns"], cp["units_per_period"]) == ("hbm", 160.0, 1)
    assert m["dispatch"]["commands"] == 3 * 64 + 6
    t = load_out(tmp_path)
    err = np.abs(t["out"] - ref64(t["q"], t["k"], t["v"], 1.0 / math.sqrt(128))).max()
    assert err <= TOL and m["numerics"]["max_abs_err"] <= TOL


@pytest.mark.parametrize("overrides", [PREFETCH3, ("bench.v_staging=prefetch",),
                                       ("bench.s_buffers=4", "bench.k_prefetch=3")])
def test_opt2_variants_match_float64_on_a_ragged_run(tmp_path, overrides):
    m = run(tmp_path, "bench.G=4", "bench.d=64", "bench.S_kv=200", *overrides)
    t = load_out(tmp_path)
    assert np.abs(t["out"] - ref64(t["q"], t["k"], t["v"], 1.0 / math.sqrt(64))).max() <= TOL
    assert m["sanitizer"]["rules_checked"] == 6
