"""The gemm workload over many PEs (``bench.pes``, ``bench.split``; kbframe/workloads/gemm.py):
numerics of every split against an independent float64 product, ragged shapes and PE
counts that divide nothing, the exact work each PE gets, one PE byte for byte the one-PE
GEMM, and a large uncontended GEMM on a GPU preset against its own roofline."""
import hashlib

import numpy as np
import pytest

from conftest import compose_cfg, load_out, read_oplog, run

# M, K, N divisible by none of the PE counts below, nor by the tiles
SHAPE = ("hardware=cube", "bench.M=70", "bench.K=200", "bench.N=150", "bench.block_m=32")
EPILOGUE = "bench.epilogue=[{op: bias}, {op: gelu}, {op: add}]"


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("pes", [2, 3, 5, 8])
@pytest.mark.parametrize("split, extra", [("n", ()), ("mn", ("bench.tile_m=48", "bench.tile_n=40")),
                                          ("mn", ("bench.tile_m=16", "bench.tile_n=64", "bench.assign=blocked")),
                                          ("k", ())])
def test_every_split_matches_float64(tmp_path, pes, split, extra):
    m = run(tmp_path, *SHAPE, f"bench.pes={pes}", f"bench.split={split}", *extra, bench="gemm_ref_ref")
    t = load_out(tmp_path)
    assert set(t) == {"A", "B", "C", "ref"}  # tensors.npz keeps the tensors whole
    want = t["A"].astype(np.float64) @ t["B"].astype(np.float64)
    np.testing.assert_allclose(t["C"], want, rtol=0, atol=2e-5)
    assert m["numerics"]["max_abs_err"] <= 2e-5
    assert m["shape"]["pes"] == pes and m["shape"]["split"] == split


@pytest.mark.parametrize("split", ["n", "mn"])
def test_epilogue_tensors_are_read_from_their_column_panels(tmp_path, split):
    run(tmp_path, *SHAPE, "bench.pes=5", f"bench.split={split}", EPILOGUE, bench="gemm_ref_ref")
    t = load_out(tmp_path)
    c = t["A"].astype(np.float64) @ t["B"].astype(np.float64)
    want = _gelu(c + t["bias"].astype(np.float64)) + t["other"].astype(np.float64)
    np.testing.assert_allclose(t["C"], want, rtol=0, atol=2e-5)


def test_each_pe_gets_exactly_its_share(tmp_path):
    """split n, 8 PEs, N = 150: columns 18 or 19 each, 3 blocks of rows each → 24 composites;
    split mn, 48 × 40 tiles of 70 × 150: 2 × 4 = 8 tiles round-robin → PE p gets tile p;
    split k, 8 PEs along merge_plan's tree: 7 sends per block of rows, 3 blocks, 3 stores."""
    run(tmp_path / "n", *SHAPE, "bench.pes=8", "bench.split=n", "bench.data=false", bench="gemm_ref_ref")
    log = read_oplog(tmp_path / "n" / "op_log.jsonl")
    comps = [r for r in log if r["unit"] == "cpu" and r["op_kind"] == "composite"]
    assert len(comps) == 24 and sorted({r["pe"] for r in comps}) == list(range(8))
    m = run(tmp_path / "mn", *SHAPE, "bench.pes=8", "bench.split=mn", "bench.tile_m=48", "bench.tile_n=40",
            "bench.data=false", bench="gemm_ref_ref")
    log = read_oplog(tmp_path / "mn" / "op_log.jsonl")
    assert sorted(r["pe"] for r in log if r["unit"] == "cpu" and r["op_kind"] == "composite") == list(range(8))
    assert m["dispatch"]["n_units"] == 8
    run(tmp_path / "k", *SHAPE, "bench.pes=8", "bench.split=k", "bench.data=false", bench="gemm_ref_ref")
    log = read_oplog(tmp_path / "k" / "op_log.jsonl")
    sends = [r for r in log if r["unit"] == "cpu" and r["op_kind"] == "send"]
    stores = [r for r in log if r["unit"] == "cpu" and r["op_kind"] == "store"]
    assert len(sends) == 7 * 3 and len(stores) == 3 and {r["pe"] for r in stores} == {0}


def test_mn_leaves_pes_without_a_tile_idle(tmp_path):
    """70 × 150 in the cube's 128 × 128 GEMM tiles: 1 × 2 tiles, so 2 of the 8 PEs work."""
    m = run(tmp_path, *SHAPE, "bench.pes=all", "bench.split=mn", "bench.data=false", bench="gemm_ref_ref")
    assert m["pe_spread"]["n_pes"] == 2 and m["shape"]["tile_m"] == 70 and m["shape"]["tile_n"] == 128


# sha256 of op_log.jsonl of the one-PE GEMM before bench.pes existed (the same command on
# the tree without it): one PE is that GEMM, byte for byte
ONE_PE = {"gemm_ref_ref": "541db6944de4399cc33f63d4b9bc1cb924802734933f74df31bb396426e489ae",
          "gemm_load_ref": "6da479c6dd734122bdb7160aab472cc50aa4f31fd4879a3b3acefa333e5f4eca"}


@pytest.mark.parametrize("bench", list(ONE_PE))
@pytest.mark.parametrize("pes", ["", "bench.pes=1", "bench.pes=1 bench.split=k"])
def test_one_pe_is_the_one_pe_gemm_byte_for_byte(tmp_path, bench, pes):
    m = run(tmp_path, *SHAPE, "bench.epilogue=[{op: bias}]", *pes.split(), bench=bench)
    assert hashlib.sha256((tmp_path / "op_log.jsonl").read_bytes()).hexdigest() == ONE_PE[bench]
    assert m["sim"]["latency_ns"] == {"gemm_ref_ref": 1519.25, "gemm_load_ref": 1651.6875}[bench] or \
        round(m["sim"]["latency_ns"], 1) == {"gemm_ref_ref": 1519.3, "gemm_load_ref": 1651.7}[bench]
    assert "pes" not in m["shape"] and m["sim"]["launch_ns"] == 0.0


@pytest.mark.parametrize("peak, M, N, K", [
    (None, 1, 10240, 8192),       # h100_sxm as it is: HBM binds
    (0.5, 1536, 1408, 1024),      # a slow tensor unit: 12 × 11 = 132 tiles, one per SM, compute binds
])
def test_uncontended_gemm_on_h100_is_its_roofline(tmp_path, peak, M, N, K):
    """latency = max(moved bytes / achievable HBM bandwidth, per-SM FLOPs / per-SM rate)
    + launch + ramp, within 1 %. The ramp: one read setup to fill the pipeline and one write
    setup to drain it; when compute binds, also the HBM time of the first K step of every
    SM's A and B tiles (no SM computes before its own arrive) and of every SM's output tile
    (written after its last GEMM stage)."""
    ov = (("hardware=h100_sxm", "bench.pes=all", "bench.split=mn", f"bench.M={M}", f"bench.K={K}", f"bench.N={N}",
           "bench.dtype=bfloat16", "bench.data=false", "run.trace=false", "run.check=false")
          + ((f"hardware.units.gemm.peak_tflops={peak}",) if peak else ()))
    m = run(tmp_path, *ov, bench="gemm_ref_ref")
    hw = compose_cfg(*ov, bench="gemm_ref_ref").hardware
    hbm_ns = m["hbm"]["bytes"] / hw.cube_hbm_gbps
    per_sm = max(p["units"]["gemm"]["busy_ns"] for p in m["pes"]) if peak else 0.0
    flops_ns = m["roofline"]["flops"] / len(m["pes"]) / (hw.units.gemm.peak_tflops * 1000.0)
    assert per_sm == pytest.approx(flops_ns, rel=1e-6) or not peak
    ramp = hw.units.dma_read.setup_latency_ns + hw.units.dma_write.setup_latency_ns
    if peak:
        tm, tn, tk = hw.units.gemm.tile_m, hw.units.gemm.tile_n, hw.units.gemm.tile_k
        ramp += len(m["pes"]) * 2 * (tm * tk + tk * tn + tm * tn) / hw.cube_hbm_gbps
    want = max(hbm_ns, flops_ns) + hw.units.cpu.launch_ns + ramp
    assert m["sim"]["launch_ns"] == 5000.0
    assert abs(m["sim"]["latency_ns"] - want) <= 0.01 * want, (m["sim"]["latency_ns"], want)
    assert m["sim"]["latency_ns"] == {None: 65679.941, 0.5: 75643.51}[peak]
    assert m["roofline"]["largest_bound"] == ("compute" if peak else "hbm")
