"""Roofline and utilisation: metrics.json's three bounds, HBM bytes, FLOPs and
per-unit busy/utilisation against hand computation at the default shape, and the table in
the console summary."""
import pytest

from kbframe.run.metrics import summary

from conftest import run

G, D, S_KV, TILE = 8, 128, 4096, 64
FP16 = 2
HBM_GBPS, PEAK_TFLOPS, TCM_GBPS = 204.8, 8.0, 512.0


@pytest.fixture(scope="module", params=["decode_opt2", "decode_opt3"])
def metrics(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    return run(d, "bench.data=false", bench=request.param), d


def test_hbm_bytes_and_flops_by_hand(metrics):
    m, _ = metrics
    r = m["roofline"]
    # DMA reads q (G, d) + K + V (S_kv, d) each once; DMA writes out (G, d)
    hbm_bytes = (G * D + 2 * S_KV * D + G * D) * FP16
    assert r["hbm_bytes"] == hbm_bytes == 2_101_248
    # two GEMMs per key: q·Kᵀ (G×d by d×S_kv) and P·V (G×S_kv by S_kv×d), 2 flop per MAC
    assert r["flops"] == 2 * (2 * G * S_KV * D) == 16_777_216
    # read and write channels overlap: the bound is the busier channel's bytes / bandwidth
    read_bytes = (G * D + 2 * S_KV * D) * FP16
    assert r["hbm_ns"] == pytest.approx(read_bytes / HBM_GBPS) == 10_250.0
    assert r["compute_ns"] == pytest.approx(r["flops"] / (PEAK_TFLOPS * 1000))  # 2 097.152 ns
    assert r["dispatch_ns"] == pytest.approx(m["dispatch"]["cycles"] / 1.0)     # 1 GHz
    bounds = {k: r[f"{k}_ns"] for k in ("hbm", "compute", "dispatch")}
    assert r["largest_bound"] == max(bounds, key=bounds.get)
    assert r["bound_ns"] == bounds[r["largest_bound"]]
    # what binds is the critical path's kind, not the largest bound
    assert r["binding"] == m["critical_path"]["binding"]
    assert r["fraction"] == pytest.approx(r["bound_ns"] / m["sim"]["latency_ns"])


def test_dispatch_cycles_are_fixed_plus_r_times_bytes(metrics):
    m, _ = metrics
    cpu = m["units"]["cpu"]
    assert cpu["count"] == m["dispatch"]["commands"]
    assert m["dispatch"]["cycles"] == pytest.approx(40.0 * cpu["count"] + 0.0625 * cpu["bytes"])
    assert cpu["busy_ns"] == pytest.approx(m["dispatch"]["cycles"])


def test_unit_busy_time_and_utilisation_by_hand(metrics):
    m, _ = metrics
    u, lat = m["units"], m["sim"]["latency_ns"]
    # DMA busy = data phases only: bytes / bandwidth (setup latency overlaps)
    assert u["dma_read"]["bytes"] == (G * D + 2 * S_KV * D) * FP16
    assert u["dma_read"]["busy_ns"] == pytest.approx(u["dma_read"]["bytes"] / HBM_GBPS)
    assert u["dma_write"]["busy_ns"] == pytest.approx(G * D * FP16 / HBM_GBPS)
    # GEMM per tile: max(flops / peak, operand bytes / TCM read); operand reads bind here:
    # q·Kᵀ reads q (G·d) + K_j (TILE·d), P·V reads P (G·TILE) + V_j (TILE·d)
    n_tiles = S_KV // TILE
    qk = max(2 * G * TILE * D / (PEAK_TFLOPS * 1000), (G * D + TILE * D) * FP16 / TCM_GBPS)
    pv = max(2 * G * TILE * D / (PEAK_TFLOPS * 1000), (G * TILE + TILE * D) * FP16 / TCM_GBPS)
    assert u["gemm"]["count"] == 2 * n_tiles
    assert u["gemm"]["busy_ns"] == pytest.approx(n_tiles * (qk + pv))  # 4 480 ns
    for name, unit in u.items():
        assert unit["utilisation"] == pytest.approx(unit["busy_ns"] / lat)
        assert 0 <= unit["utilisation"] <= 1


def test_console_summary_shows_the_roofline_table(metrics):
    m, d = metrics
    text = summary(m, d)
    lines = text.splitlines()
    head = next(i for i, l in enumerate(lines) if l.split()[:3] == ["bound", "ns", "of"])
    rows = {l.split()[0]: l for l in lines[head + 1:head + 4]}
    assert set(rows) == {"hbm", "compute", "dispatch"}
    r = m["roofline"]
    if r["binding"] in rows:
        assert "← binding" in rows[r["binding"]]
    else:  # a chain binds: the largest bound is marked as such
        assert "← largest" in rows[r["largest_bound"]] and "← binding" not in text
    assert f"{m['roofline']['hbm_ns']:.1f}" in rows["hbm"] and "2,101,248 B" in rows["hbm"]
    assert "16,777,216 FLOP" in rows["compute"]
    unit_head = next(i for i, l in enumerate(lines) if l.split()[:2] == ["unit", "busy"])
    units = {l.split()[0] for l in lines[unit_head + 1:unit_head + 6]}
    assert units == {"PE_CPU", "DMA", "GEMM", "MATH"}  # DMA read, DMA write
    assert f"{m['units']['gemm']['utilisation']:.1%}" in text


def test_bound_follows_a_faster_dma_channel(tmp_path):
    # a DMA read channel at 1000 GB/s with no setup: the HBM bound is its bytes / 1000 GB/s,
    # so the achieved fraction stays ≤ 1 (hardware.hbm_gbps alone would claim 10 250 ns)
    m = run(tmp_path, "bench.data=false", "hardware.units.dma_read.bandwidth_gbps=1000",
            "hardware.units.dma_read.setup_latency_ns=0", "calibration.FIXED=0", "calibration.R=0")
    r = m["roofline"]
    assert r["hbm_ns"] == pytest.approx((G * D + 2 * S_KV * D) * FP16 / 1000) == 2099.2
    assert 0 < r["fraction"] <= 1
