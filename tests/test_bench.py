"""kbframe.run.bench: inputs, validation, metrics, determinism, an end-to-end timeline by hand."""
import json
import math

import numpy as np
import pytest

from kbframe.run.bench import read_inputs_file
from kbframe.workloads.gqa_decode import GqaDecode, reference
from kbframe.errors import ConfigError, InputsError, TcmOverflowError

from conftest import compose_cfg, load_out, read_oplog, ref64, run


def test_opt2_single_tile_timeline_by_hand(tmp_path):
    """decode_opt2, S_kv = TILE = 64, default hardware: every number below is hand-computed.

    dispatch (40 + bytes/16 cycles, 1 GHz): load q 41.5 | fill m, l, O 41.25 each | #1 (54 B)
    43.375 | #2 (306 B) 59.125 | div_bcast (32 B) 42 | store (24 B) 41.5 → 351.25 cycles.
    #1 is dispatched 165.25→208.625; K DMA 208.625 + 77 setup + 16384/204.8 = 80 → 365.625;
    GEMM max(16.384 compute, 18432 B / 512 = 36 feed) → 401.625; scale 512/64 = 8 → 409.625.
    #2 (reads S written by #1) admitted at 409.625; prologue 8+1+1+8+8+1+16+1 = 44 → 453.625;
    V DMA +157 → 610.625; GEMM 17408/512 = 34 → 644.625; add 1024/64 = 16 → 660.625.
    div_bcast 16 → 676.625; store 77 + 2048/204.8 = 10 → 763.625 ns."""
    m = run(tmp_path, "bench.S_kv=64", "bench.data=false")
    assert m["dispatch"]["cycles"] == 351.25
    assert m["sim"]["latency_ns"] == 763.625
    log = read_oplog(tmp_path / "op_log.jsonl")
    spans = {r["cmd"]: (r["t_start_ns"], r["t_end_ns"]) for r in log if r["unit"] == "scheduler"}
    assert spans[5] == (208.625, 409.625)
    assert spans[6] == (409.625, 660.625)
    assert spans[7] == (660.625, 676.625)
    assert spans[8] == (676.625, 763.625)
    v = [r for r in log if r["unit"] == "dma_read" and r["cmd"] == 6]
    assert [(r["t_start_ns"], r["t_data_ns"], r["t_end_ns"]) for r in v] == [(453.625, 530.625, 610.625)]
    # roofline: HBM bytes q 2048 + K 16384 + V 16384 + out 2048 = 36864 → 180 ns; flops 2·2·8·128·64
    # = 262144 → 32.768 ns; dispatch 351.25 ns → dispatch-bound, fraction 351.25 / 763.625
    r = m["roofline"]
    assert (r["bound_ns"], r["largest_bound"]) == (351.25, "dispatch")
    assert r["fraction"] == pytest.approx(351.25 / 763.625, rel=1e-12)


@pytest.mark.parametrize("bench, largest, bound, binding", [
    # opt2: DMA read channel K + V = 2·4096·128·2 B + q 2048 B = 2 099 200 B / 204.8 = 10 250 ns,
    # but a chain, not HBM, binds (tests/test_critical_path.py)
    ("decode_opt2", "hbm", 10250.0, "chain"),
    # opt3: dispatch 64·545.5 + 290.5 = 35 202.5 cycles (tests/kernels/test_gqa_decode.py)
    ("decode_opt3", "dispatch", 35202.5, "dispatch"),
])
def test_roofline_binding_at_default_shapes(tmp_path, bench, largest, bound, binding):
    m = run(tmp_path, "bench.data=false", bench=bench)
    r = m["roofline"]
    assert (r["largest_bound"], r["bound_ns"], r["binding"]) == (largest, bound, binding)
    assert r["fraction"] == pytest.approx(bound / m["sim"]["latency_ns"], rel=1e-12)
    assert 0 < r["fraction"] <= 1


def test_metrics_json_has_the_issue_keys(tmp_path):
    run(tmp_path, "bench.S_kv=100", bench="decode_opt3")
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["bench"], m["kernel"]) == ("decode_opt3", "kbframe.kernels.gqa_decode.gqa_decode_opt3")
    assert {k: m["shape"][k] for k in ("G", "d", "S_kv", "tile")} == {"G": 8, "d": 128, "S_kv": 100, "tile": 64}
    for sect, keys in {"sim": ("latency_ns", "events", "wall_s"),
                       "dispatch": ("commands", "cycles", "commands_per_tile", "cycles_per_tile"),
                       "numerics": ("enabled", "max_abs_err", "max_rel_err"),
                       "roofline": ("bound_ns", "binding", "fraction")}.items():
        for k in keys:
            assert k in m[sect], f"{sect}.{k}"
    assert m["roofline"]["binding"] in ("hbm", "compute", "dispatch", "chain")
    assert m["roofline"]["largest_bound"] in ("hbm", "compute", "dispatch")
    # 2 tiles: 2·13 + 7 = 33 commands
    assert (m["dispatch"]["commands"], m["dispatch"]["commands_per_tile"]) == (33, 16.5)
    assert m["sim"]["events"] == len(read_oplog(tmp_path / "op_log.jsonl"))
    t = load_out(tmp_path)
    assert set(t) >= {"q", "k", "v", "out", "ref"} and t["out"].shape == (8, 128)
    assert m["numerics"]["max_abs_err"] == pytest.approx(np.abs(t["out"] - t["ref"]).max(), rel=1e-12)
    assert m["numerics"]["max_rel_err"] == pytest.approx(
        np.abs(t["out"] - t["ref"]).max() / np.abs(t["ref"]).max(), rel=1e-12)


def test_op_log_records_have_the_issue_fields(tmp_path):
    run(tmp_path, "bench.S_kv=64")
    for r in read_oplog(tmp_path / "op_log.jsonl"):
        assert {"pe", "unit", "op_kind", "cmd", "t_start_ns", "t_end_ns", "bytes"} <= set(r)
        assert r["t_end_ns"] >= r["t_start_ns"] >= 0


@pytest.mark.parametrize("bench", ["decode_opt2", "decode_opt3"])
def test_ddd0065_s10_determinism_identical_runs_identical_op_log(tmp_path, bench):
    a, b = tmp_path / "a", tmp_path / "b"
    ma = run(a, "bench.S_kv=300", "bench.inputs.peak=10", bench=bench)
    mb = run(b, "bench.S_kv=300", "bench.inputs.peak=10", bench=bench)
    assert (a / "op_log.jsonl").read_bytes() == (b / "op_log.jsonl").read_bytes()
    assert len((a / "op_log.jsonl").read_bytes()) > 1000
    for m in (ma, mb):
        m["sim"].pop("wall_s")
    assert ma == mb
    ta, tb = load_out(a), load_out(b)
    np.testing.assert_array_equal(ta["out"], tb["out"])


def load_inputs(path, **keys):
    """An inputs file through the run shell's reader and GqaDecode (the default bench's shapes)."""
    wl = GqaDecode(compose_cfg(*[f"bench.{k}={v}" for k, v in keys.items()]).bench)
    arrays = read_inputs_file(path, wl)
    arrays.pop("__shape__")
    return wl.accept_file(arrays, path)


def make_inputs(b):
    return GqaDecode(b).generate(np.random.default_rng(b.seed))


def test_reference_matches_independent_float64():
    r = np.random.default_rng(2)
    q, k, v = r.standard_normal((8, 32)) * 30, r.standard_normal((50, 32)), r.standard_normal((50, 32))
    np.testing.assert_allclose(reference(q, k, v, 0.2), ref64(q, k, v, 0.2), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("peak", [0.01, 1.0, 20.0])
def test_generated_inputs_score_spread_is_peak(peak):
    cfg = compose_cfg("bench.S_kv=4096", f"bench.inputs.peak={peak}")
    inp = make_inputs(cfg.bench)
    assert inp["scale"] == 1 / math.sqrt(128)
    s = inp["q"] @ inp["k"].T * inp["scale"]
    assert s.std() == pytest.approx(peak, rel=0.1)


def test_load_inputs_refuses_unknown_arrays_and_reads_scale(tmp_path):
    p = tmp_path / "x.npz"
    np.savez(p, q=np.ones((2, 4), np.float32), k=np.ones((3, 4)), v=np.ones((3, 4)), scale=np.array(0.25), mask=1)
    with pytest.raises(InputsError) as e:
        load_inputs(str(p))
    assert str(e.value) == (f"bench.inputs.path: '{p}' has array(s) ['mask'] that workload GqaDecode does not "
                            f"read (it reads q, k, v, scale); remove them")
    np.savez(p, q=np.ones((2, 4), np.float32), k=np.ones((3, 4)), v=np.ones((3, 4)), scale=np.array(0.25))
    inp = load_inputs(str(p))
    assert set(inp) == {"q", "k", "v", "scale"} and inp["scale"] == 0.25
    assert inp["q"].dtype == np.float64 and inp["q"].shape == (2, 4)


@pytest.mark.parametrize("arrays, msg", [
    (dict(q=np.ones((2, 4)), k=np.ones((3, 4)), v=np.ones((3, 5))),
     "bench.inputs.path: inconsistent shapes in '{p}': q (2, 4), k (3, 4), v (3, 5) "
     "(need q (G, d), k and v (S_kv, d), all non-empty)"),
    (dict(q=np.ones((2, 5)), k=np.ones((3, 4)), v=np.ones((3, 4))),
     "bench.inputs.path: inconsistent shapes in '{p}': q (2, 5), k (3, 4), v (3, 4) "
     "(need q (G, d), k and v (S_kv, d), all non-empty)"),
    (dict(q=np.ones((2, 4)), k=np.ones((3, 4))),
     "bench.inputs.path: '{p}' has no array 'v' (needs q, k, v)"),
    (dict(q=np.ones((2, 4)), k=np.ones((3, 4)), v=np.ones((3, 4)), scale=np.ones(2)),
     "bench.inputs.path: '{p}' scale must be a 0-d finite number > 0, got array([1., 1.])"),
    (dict(q=np.full((2, 4), np.nan), k=np.ones((3, 4)), v=np.ones((3, 4))),
     "bench.inputs.path: '{p}' array 'q' must be finite numbers"),
])
def test_load_inputs_errors_name_the_file(tmp_path, arrays, msg):
    p = tmp_path / "bad.npz"
    np.savez(p, **arrays)
    with pytest.raises(InputsError) as e:
        load_inputs(str(p))
    assert str(e.value) == msg.format(p=p)


def test_missing_inputs_file(tmp_path):
    with pytest.raises(InputsError) as e:
        run(tmp_path, f"bench.inputs.path={tmp_path}/nope.npz")
    assert str(e.value) == f"bench.inputs.path: no such file '{tmp_path}/nope.npz'"


def test_not_an_npz(tmp_path):
    p = tmp_path / "x.npz"
    p.write_text("hello")
    with pytest.raises(InputsError) as e:
        load_inputs(str(p))
    assert str(e.value) == (f"bench.inputs.path: '{p}' is not an .npz file (not a zip archive; a truncated "
                            f"or plain .npy/text/pickle file?)")


@pytest.mark.parametrize("ov, msg", [
    ("bench.tile=0", "bench.tile must be ≥ 1, got 0"),
    ("bench.S_kv=0", "bench.S_kv must be ≥ 1, got 0"),
    ("bench.G=-1", "bench.G must be ≥ 1, got -1"),
    ("+calibration.typo=1", "unknown key 'calibration.typo' (known: FIXED, R, cap_bytes)"),
    ("+bench.inputs.typo=1", "unknown key 'bench.inputs.typo' (known: path, peak)"),
    ("calibration.R=-0.5", "calibration.R must be a finite number ≥ 0, got -0.5"),
    ("calibration.cap_bytes=0", "calibration.cap_bytes must be ≥ 1, got 0"),
    ("bench.kernel=os.system", "bench.kernel 'os.system' is outside the kbframe. namespace; "
                                "set hardware.allow_external_targets=true to allow it"),
    ("bench.pe=1", "bench.pe=1 but hardware.n_pes=1"),
])
def test_config_errors_name_the_key(tmp_path, ov, msg):
    with pytest.raises(ConfigError) as e:
        run(tmp_path, ov)
    assert str(e.value) == msg


def test_tcm_too_small(tmp_path):
    """The first request that does not fit, the free bytes, the capacity and the key; plus the
    kernel's whole need: opt2 at G=8, d=128, TILE=64 keeps q 2048 + m 64 + l 64 + O 2048 +
    S0 1024 + S1 1024 = 6272 B, and O/l (2048 B) at the end → 8320 B (64 B alignment)."""
    with pytest.raises(TcmOverflowError) as e:
        run(tmp_path, "hardware.tcm_bytes=1024")
    assert str(e.value) == ("TCM overflow on PE0: request 'q@tcm' needs 2048 B, 1024 B free of 1024 B capacity "
                            "(hardware.tcm_bytes); decode_opt2 needs 8320 B of TCM in all at G=8 d=128 S_kv=4096 "
                            "tile=64 (float16), found by a dry run before the simulation")
    assert not (tmp_path / "op_log.jsonl").exists()


def test_the_inputs_are_checked_before_the_dry_run(tmp_path):
    """In data mode the inputs' own checks come before the pre-flight dry run: inputs
    beyond float16 and a TCM too small give the inputs' error."""
    from kbframe.errors import NumericsError
    with pytest.raises(NumericsError) as e:
        run(tmp_path, "hardware.tcm_bytes=1024", "bench.S_kv=256", "bench.inputs.peak=1e6", "bench.data_dtype=float16")
    assert str(e.value).startswith("bench.data_dtype=float16: input 'q' has |x| up to ")
    with pytest.raises(TcmOverflowError) as e:
        run(tmp_path, "hardware.tcm_bytes=1024", "bench.S_kv=256")
    assert str(e.value).startswith("TCM overflow on PE0: request 'q@tcm' needs 2048 B, 1024 B free")
    assert not (tmp_path / "op_log.jsonl").exists()


def test_no_inputs_are_drawn_for_a_run_that_fails_before(tmp_path, monkeypatch):
    """The inputs are drawn only once nothing before the dry run can fail: a bad kernel
    name is refused without drawing them."""
    drawn = []
    monkeypatch.setattr(GqaDecode, "generate", lambda self, rng: drawn.append(rng))
    with pytest.raises(ConfigError, match="^bench.kernel: "):
        run(tmp_path, "bench.S_kv=256", "bench.kernel=kbframe.kernels.no_such_kernel")
    assert drawn == []


def test_explicit_scale_wins_over_the_files_and_is_recorded(tmp_path):
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((4, 16)), rng.standard_normal((40, 16)), rng.standard_normal((40, 16))
    path = tmp_path / "in.npz"
    np.savez(path, q=q, k=k, v=v, scale=np.array(0.5))
    for overrides, want in (((), 0.5), (("bench.scale=0.3",), 0.3)):
        d = tmp_path / str(want)
        m = run(d, f"bench.inputs.path={path}", *overrides)
        assert m["scale"] == want
        with np.load(d / "tensors.npz") as t:
            assert float(t["scale"]) == want
            np.testing.assert_allclose(t["out"], ref64(q, k, v, want), atol=1e-6)


def test_timing_only_run_makes_no_numbers(tmp_path):
    # bench.data=false: no inputs are generated, no reference computed, no tensors.npz
    # (a stale one from a data-mode run in the same directory is removed)
    run(tmp_path, "bench.S_kv=128")
    assert (tmp_path / "tensors.npz").exists()
    m = run(tmp_path, "bench.S_kv=128", "bench.data=false")
    assert m["numerics"] == {"enabled": False, "dtype": None, "max_abs_err": None, "max_rel_err": None}
    assert not (tmp_path / "tensors.npz").exists()
    assert m["shape"]["S_kv"] == 128 and m["scale"] == 1 / math.sqrt(128)


# ---- preflight.check_inputs_fit: input and score ranges ----------------------------------------
def test_inputs_fit_scores_checked_exactly_when_the_bound_does_not_fit():
    from kbframe.errors import NumericsError
    q = np.array([[1e19, 0.0]])
    k = np.array([[0.0, 1e20], [1e19, 0.0]])
    # Σ|q|·max|k| = 1e39 is over float32's 3.4e38, but |q|·|k|ᵀ peaks at 1e38: accepted
    wl = GqaDecode(compose_cfg().bench)
    wl.check_inputs("float32", {"q": q, "k": k, "v": k, "scale": 1.0})
    k[1, 0] = 1e20  # now a score reaches 1e39
    with pytest.raises(NumericsError, match=r"^scores q·kᵀ·scale reach \|s\| ≈ 1e\+39, beyond the accumulator's "
                                            r"largest value 3\.40282e\+38; use smaller inputs or bench\.scale$"):
        wl.check_inputs("float32", {"q": q, "k": k, "v": k, "scale": 1.0})


def test_inputs_fit_names_the_input_beyond_the_data_dtype():
    from kbframe.errors import NumericsError
    from kbframe.run.preflight import check_inputs_fit
    v = np.array([[1.0, -70000.0]])
    with pytest.raises(NumericsError, match=r"^bench\.data_dtype=float16: input 'v' has \|x\| up to 70000, beyond "
                                            r"float16's largest value 65504 "):
        check_inputs_fit("float16", {"q": np.ones((1, 2)), "k": np.ones((1, 2)), "v": v})


def test_make_inputs_draws_the_same_stream_in_chunks():
    """k and v are drawn chunk by chunk into one reused buffer: the values are those of one
    standard_normal draw per chunk, in order (q, then every k chunk, then every v chunk),
    kept as float32: here 8192 + 1 rows (a full chunk and a one-row tail)."""
    from types import SimpleNamespace as NS
    b = NS(seed=7, scale=None, d=5, G=3, S_kv=8193, inputs=NS(peak=2.0))
    got = make_inputs(b)
    rng = np.random.default_rng(7)
    scale = 1 / math.sqrt(5)
    q = (rng.standard_normal((3, 5)) * (2.0 / (scale * math.sqrt(5)))).astype(np.float32)
    k = np.concatenate([rng.standard_normal((8192, 5)), rng.standard_normal((1, 5))]).astype(np.float32)
    v = np.concatenate([rng.standard_normal((8192, 5)), rng.standard_normal((1, 5))]).astype(np.float32)
    for name, want in (("q", q), ("k", k), ("v", v)):
        assert got[name].dtype == np.float32 and got[name].tobytes() == want.tobytes(), name
    assert got["scale"] == scale
