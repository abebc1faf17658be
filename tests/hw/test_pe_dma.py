"""PE_DMA latency: setup + bytes/bandwidth, setup overlapping across outstanding transfers
(DESIGN.md modelling notes; the default hardware: 77 ns setup, 204.8 GB/s)."""
import numpy as np
import pytest

from kbframe.hw.pe_dma import DmaChannel
from kbframe.hw.unit import Stage

from conftest import Sim


def _stage(ch, nbytes):
    return Stage(ch, "dma_read", None, nbytes=nbytes)


def test_dma_unloaded_latency_is_setup_plus_bytes_over_bw():
    ch = DmaChannel(bandwidth_gbps=204.8, setup_latency_ns=77.0, max_outstanding=4)
    st = _stage(ch, 16384)
    # 77 ns setup + 16384 B / 204.8 B/ns = 77 + 80 = 157 ns
    assert ch.duration_ps(st) == 157_000
    ch.reserve(0, st)
    assert (st.t_start, st.t_data, st.t_end) == (0, 77_000, 157_000)


def test_dma_setup_overlaps_across_outstanding_transfers():
    ch = DmaChannel(204.8, 77.0, max_outstanding=4)
    a, b, c = (_stage(ch, 16384) for _ in range(3))
    for st in (a, b, c):
        ch.reserve(0, st)
    # all three set up in parallel (0→77 ns); data phases serialize, 80 ns each:
    # a 77→157, b 157→237, c 237→317  (serial setup would end at 3×157 = 471 ns)
    assert [(s.t_start, s.t_data, s.t_end) for s in (a, b, c)] == [
        (0, 77_000, 157_000), (0, 157_000, 237_000), (0, 237_000, 317_000)]
    assert ch.busy_ps == 3 * 80_000  # only the data phase occupies the channel


def test_dma_outstanding_limit_delays_setup():
    ch = DmaChannel(204.8, 77.0, max_outstanding=1)
    a, b = _stage(ch, 16384), _stage(ch, 16384)
    ch.reserve(0, a)
    ch.reserve(0, b)
    # one outstanding: b's setup starts when a ends (157), data 234→314
    assert (b.t_start, b.t_data, b.t_end) == (157_000, 234_000, 314_000)


def test_dma_outstanding_window_of_two():
    ch = DmaChannel(204.8, 77.0, max_outstanding=2)
    sts = [_stage(ch, 2048) for _ in range(3)]  # 2048 B = 10 ns of data
    for st in sts:
        ch.reserve(0, st)
    # s0: 0, data 77→87; s1: 0, data 87→97; s2 waits for s0's end (87): setup 87→164, data 164→174
    assert [(s.t_start, s.t_data, s.t_end) for s in sts] == [
        (0, 77_000, 87_000), (0, 87_000, 97_000), (87_000, 164_000, 174_000)]


@pytest.mark.parametrize("kw, msg", [
    (dict(bandwidth_gbps=0, setup_latency_ns=77), "bandwidth_gbps must be > 0"),
    (dict(bandwidth_gbps=1, setup_latency_ns=-1), "setup_latency_ns must be ≥ 0"),
    (dict(bandwidth_gbps=1, setup_latency_ns=1, max_outstanding=0), "max_outstanding must be ≥ 1"),
])
def test_dma_rejects_bad_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        DmaChannel(**kw)


def test_dma_two_loads_in_simulation(tmp_path):
    """Two tl.load of 64×128 fp16 tiles through PE_CPU → scheduler → read channel."""
    k = np.ones((64, 128))
    sim = Sim(tmp_path, {"k": k, "v": 2 * k})
    hs = {}

    def kern(tl):
        hs["k"] = tl.load(tl.ref("k"))
        hs["v"] = tl.load(tl.ref("v"))

    log = sim.run(kern)
    dma = [r for r in log if r["unit"] == "dma_read"]
    # load dispatch = 40 + 0.0625 × 24 B = 41.5 cycles = 41.5 ns each (1 GHz)
    # #1: submitted 41.5, data 118.5→198.5; #2: submitted 83.0, setup ends 160, waits for data
    #     phase until 198.5, ends 278.5
    assert [(r["cmd"], r["t_start_ns"], r["t_data_ns"], r["t_end_ns"], r["bytes"]) for r in dma] == [
        (1, 41.5, 118.5, 198.5, 16384), (2, 83.0, 198.5, 278.5, 16384)]
    np.testing.assert_array_equal(sim.read(hs["v"]), 2 * k)


def test_dma_read_and_write_channels_overlap(tmp_path):
    """Reads and writes are separate channels: a store is not delayed by a load in flight."""
    sim = Sim(tmp_path, {"k": np.ones((64, 128)), "out": np.zeros((64, 128))})

    def kern(tl):
        z = tl.zeros((64, 128), "z")   # dispatch 0 → 41.25 (20 B); fill 8192 / 64 = 128 cycles → 169.25
        tl.load(tl.ref("k"))            # dispatch → 82.75 (24 B); read 82.75, data 159.75 → 239.75
        tl.store(tl.ref("out"), z)      # dispatch → 124.25; waits for the fill; write 169.25, data
                                        # 246.25 → 326.25 (77 + 16384 / 204.8 = 157 ns, undelayed)

    log = sim.run(kern)
    (rd,) = [r for r in log if r["unit"] == "dma_read"]
    (wr,) = [r for r in log if r["unit"] == "dma_write"]
    assert (rd["t_start_ns"], rd["t_data_ns"], rd["t_end_ns"]) == (82.75, 159.75, 239.75)
    assert (wr["t_start_ns"], wr["t_data_ns"], wr["t_end_ns"]) == (169.25, 246.25, 326.25)
    assert wr["t_start_ns"] < rd["t_end_ns"]  # they overlap in time
