"""IPCQ (PE↔PE queues): send and receive as commands, link timing, credits, FIFO matching,
the data they move, the deadlock error and the sanitizer's IPCQ rules."""
import numpy as np
import pytest

from kbframe.errors import DeadlockError, SanitizerError, ValidationError
from kbframe.sim import sanitizer
from kbframe.sim.engine import Engine
from kbframe.sim.numerics import NumpyNumerics
from kbframe.sim.oplog import OpLog
from kbframe.tl.context import TL

from conftest import compose_cfg, read_oplog


class Cube:
    """An engine on hardware=cube (or cube_mesh) with one HBM tensor ``x`` (4, 64)."""

    def __init__(self, tmp_path, *overrides, hardware="cube"):
        cfg = compose_cfg(f"hardware={hardware}", *overrides, bench=None)
        self.x = np.arange(256, dtype=np.float32).reshape(4, 64) / 100
        self.log = tmp_path / "op_log.jsonl"
        self.oplog = OpLog(self.log)
        self.engine = Engine(cfg.hardware, NumpyNumerics("float32"), self.oplog)
        self.engine.add_hbm_tensor("x", (4, 64), "float16", self.x)
        self.engine.add_hbm_tensor("y", (4, 64), "float16")
        sanitizer.enable(self.engine)
        self.tls = [TL(pe, self.engine.hbm, {}, "float16") for pe in self.engine.pes]

    def run(self, programs):
        try:
            self.engine.run({i: (lambda f=f, i=i: f(self.tls[i])) for i, f in programs.items()})
        finally:
            self.oplog.close()
        return read_oplog(self.log)


def test_send_and_receive_move_the_data_with_link_timing(tmp_path):
    c = Cube(tmp_path)

    def pe0(tl):
        tl.send(tl.load(tl.ref("x")), 3)

    def pe3(tl):
        got = tl.recv((4, 64), 0)
        tl.store(tl.ref("y"), tl.scale(got, 2.0))

    log = c.run({0: pe0, 3: pe3})
    np.testing.assert_array_equal(c.engine.numerics.read(c.engine.hbm["y"]), c.x * 2)
    send = next(r for r in log if r["unit"] == "ipcq_send")
    recv = next(r for r in log if r["unit"] == "ipcq_recv")
    assert (send["pe"], send["peer"], recv["pe"], recv["peer"]) == (0, 3, 3, 0)
    # 512 B at 256 GB/s = 2 ns on the link, then 16 ns of NoC latency
    assert send["t_end_ns"] - send["t_start_ns"] == 2.0
    assert recv["t_end_ns"] == send["t_end_ns"] + 16.0
    assert sanitizer.check(c.engine, c.log)["rules"][-4:] == ["ipcq_matched", "ipcq_arrival", "ipcq_credits",
                                                              "hbm_writes_disjoint"]


def test_a_link_across_cubes_uses_the_die_to_die_figures(tmp_path):
    """PE0 (cube 0) → PE31 (cube 3 of a 2×2 mesh): 2 cube crossings, 128 GB/s."""
    c = Cube(tmp_path, hardware="cube_mesh")
    log = c.run({0: lambda tl: tl.send(tl.load(tl.ref("x")), 31), 31: lambda tl: tl.recv((4, 64), 0)})
    send = next(r for r in log if r["unit"] == "ipcq_send")
    recv = next(r for r in log if r["unit"] == "ipcq_recv")
    assert send["t_end_ns"] - send["t_start_ns"] == 4.0  # 512 B / 128 GB/s
    assert recv["t_end_ns"] == send["t_end_ns"] + 16.0 + 2 * 16.0


def test_a_full_queue_blocks_the_sender_until_a_receive(tmp_path):
    """credits=2: the third send waits for the first receive, which PE5 posts late."""
    c = Cube(tmp_path, "hardware.units.ipcq_send.credits=2")

    def pe0(tl):
        x = tl.load(tl.ref("x"))
        for _ in range(3):
            tl.send(x, 5)

    def pe5(tl):
        tl.wait(tl.full((256, 256), 0.0, "busy"))  # PE5 posts its receives after this
        for i in range(3):
            tl.recv((4, 64), 0, f"r{i}")

    log = c.run({0: pe0, 5: pe5})
    sends = sorted((r for r in log if r["unit"] == "ipcq_send"), key=lambda r: r["t_start_ns"])
    recvs = sorted((r for r in log if r["unit"] == "ipcq_recv"), key=lambda r: r["t_end_ns"])
    assert sends[2]["t_start_ns"] == recvs[0]["t_end_ns"]
    assert sends[1]["t_end_ns"] < recvs[0]["t_end_ns"]
    sanitizer.check(c.engine, c.log)


def test_a_receive_nothing_matches_is_a_deadlock_naming_both_pes(tmp_path):
    c = Cube(tmp_path)
    with pytest.raises(DeadlockError, match=r"PE2 waits to receive from PE6, which sends it nothing more "
                                            r"\(0 message\(s\) sent, 0 received\)"):
        c.run({2: lambda tl: tl.recv((4, 64), 6), 6: lambda tl: None})


@pytest.mark.parametrize("peer, msg", [
    (8, "tl.send: PE8 is not another PE of this hardware (PEs 0..7, this is PE0)"),
    (0, "tl.send: PE0 is not another PE of this hardware (PEs 0..7, this is PE0)"),
])
def test_a_send_to_a_pe_that_does_not_exist_is_refused(tmp_path, peer, msg):
    c = Cube(tmp_path)
    with pytest.raises(ValidationError) as e:
        c.run({0: lambda tl: tl.send(tl.load(tl.ref("x")), peer)})
    assert str(e.value) == msg


def test_ipcq_needs_a_hardware_with_ipcq_units(tmp_path):
    cfg = compose_cfg("hardware.n_pes=2", bench=None)
    eng = Engine(cfg.hardware, NumpyNumerics("float32"), OpLog(None))
    eng.add_hbm_tensor("x", (4, 64), "float16", np.zeros((4, 64)))
    tl = TL(eng.pes[0], eng.hbm, {}, "float16")
    with pytest.raises(ValidationError, match=r"^tl.send: PE0 has no unit serving role 'ipcq_send'"):
        eng.run({0: lambda: tl.send(tl.load(tl.ref("x")), 1)})


def test_the_sanitizer_catches_a_receive_of_the_wrong_size(tmp_path):
    c = Cube(tmp_path)
    log = c.run({0: lambda tl: tl.send(tl.load(tl.ref("x")), 1), 1: lambda tl: tl.recv((4, 64), 0)})
    for r in log:
        if r["unit"] == "ipcq_recv":
            r["bytes"] = 256
    with pytest.raises(SanitizerError, match=r"ipcq_matched violated: link PE0→PE1 message 0: PE0 command 2 sent "
                                             r"512 B, PE1 command 1 received 256 B"):
        sanitizer.check(c.engine, log)


def test_the_sanitizer_catches_an_early_receive_and_an_overfull_link(tmp_path):
    c = Cube(tmp_path, "hardware.units.ipcq_send.credits=1")
    log = c.run({0: lambda tl: [tl.send(tl.load(tl.ref("x")), 1) for _ in range(2)],
                 1: lambda tl: [tl.recv((4, 64), 0, f"r{i}") for i in range(2)]})
    early = [dict(r) for r in log]
    next(r for r in early if r["unit"] == "ipcq_recv")["t_end_ns"] -= 1.0
    with pytest.raises(SanitizerError, match=r"ipcq_arrival violated: link PE0→PE1 message 0"):
        sanitizer.check(c.engine, early)
    late = [dict(r) for r in log]
    for r in late:
        if r["unit"] == "ipcq_recv":
            r["t_start_ns"] = r["t_end_ns"] = r["t_end_ns"] + 1000.0
    with pytest.raises(SanitizerError, match=r"ipcq_credits violated: link PE0→PE1 held 2 messages"):
        sanitizer.check(c.engine, late)


def test_hbm_writes_of_two_pes_to_the_same_bytes_are_caught(tmp_path):
    c = Cube(tmp_path)
    c.run({0: lambda tl: tl.store(tl.ref("y"), tl.load(tl.ref("x"))),
           1: lambda tl: tl.store(tl.ref("y"), tl.load(tl.ref("x")))})
    with pytest.raises(SanitizerError, match=r"hbm_writes_disjoint violated: PE1 .* writes HBM bytes \[\d+, \d+\) "
                                             r"that PE0 .* also writes"):
        sanitizer.check(c.engine, c.log)


def test_shared_hbm_makes_two_pes_contend(tmp_path):
    """Two PEs load 512 B each at once: partitioned, both finish together; shared at 204.8
    GB/s for the cube, the second waits for the first's data phase."""
    ends = {}
    for mode in ("partitioned", "shared"):
        (tmp_path / mode).mkdir()
        c = Cube(tmp_path / mode, f"hardware.hbm_mode={mode}", "hardware.cube_hbm_gbps=204.8")
        log = c.run({0: lambda tl: tl.load(tl.ref("x")), 1: lambda tl: tl.load(tl.ref("x"))})
        ends[mode] = sorted(r["t_end_ns"] for r in log if r["unit"] == "dma_read")
    assert ends["partitioned"][0] == ends["partitioned"][1]
    assert ends["shared"][1] - ends["shared"][0] == pytest.approx(512 / 204.8)
