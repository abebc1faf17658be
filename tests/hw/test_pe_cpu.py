"""PE_CPU dispatch cost FIXED + R × logical_bytes for every command type (ADR-0064 Rev2)."""
import numpy as np
import pytest

from kbframe.errors import ValidationError
from kbframe.hw.pe_cpu import PeCpu

from conftest import Sim, emit


def _all_command_types(tl):
    k = tl.load(tl.ref("k"))                     # load
    z = tl.zeros((8, 64), "z")                   # fill
    s = tl.dot(tl.load(tl.ref("q")), k.T)         # load, gemm
    s2 = tl.add(s, z)                             # math (2 inputs)
    tl.scale(s2, 0.5, out=s2)                     # math (1 input + scalar)
    o = tl.composite(op="gemm", a=s2, b=tl.ref("v"), epilogue=[{"op": "scale", "factor": 2.0}])
    tl.store(tl.ref("out"), o)                    # store


TENSORS = {"q": np.ones((8, 128)), "k": np.ones((64, 128)), "v": np.ones((64, 128)),
           "out": np.zeros((8, 128))}

# logical bytes by hand (DDD §4; primitive = 4 framing + op):
#   load  : 4 + (3 + 8 src + 8 out + 1)              = 24
#   fill  : 4 + (3 + 0 + 8 out + 1 + 4 value)        = 20
#   gemm  : 4 + (3 + 16 a,b + 8 out + 1 + 12 m,k,n)  = 44
#   add   : 4 + (3 + 16 + 8 + 1)                     = 32
#   scale : 4 + (3 + 8 + 8 + 1 + 4 factor)           = 28
#   composite [gemm 40, scale epilogue 8]: 4 + 1 + 48 + 1 = 54
#   store : 4 + (3 + 8 src + 8 out + 1)              = 24
EXPECTED = [("load", 24), ("fill", 20), ("load", 24), ("gemm", 44), ("add", 32), ("scale", 28),
            ("composite", 54), ("store", 24)]


def test_logical_bytes_of_each_command_type(tmp_path):
    cmds, _ = emit(_all_command_types, tmp_path, TENSORS)
    from kbframe.ir.commands import command_kind
    assert [(command_kind(c), c.logical_bytes) for c in cmds] == EXPECTED


@pytest.mark.parametrize("R, FIXED", [(0.0625, 40.0), (0.25, 40.0), (0.03125, 10.0)])
def test_dispatch_cost_of_each_command_type(tmp_path, R, FIXED):
    cmds, sim = emit(_all_command_types, tmp_path, TENSORS,
                     overrides=[f"calibration.R={R}", f"calibration.FIXED={FIXED}"])
    cpu = sim.pe.cpu
    assert [cpu.cost_cycles(c) for c in cmds] == [FIXED + R * b for _, b in EXPECTED]


def test_dispatch_cost_default_values_by_hand(tmp_path):
    cmds, sim = emit(_all_command_types, tmp_path, TENSORS)
    # 40 + 24/16 = 41.5; 40 + 20/16 = 41.25; 40 + 44/16 = 42.75; 40 + 32/16 = 42;
    # 40 + 28/16 = 41.75; 40 + 54/16 = 43.375
    assert [sim.pe.cpu.cost_cycles(c) for c in cmds] == [41.5, 41.25, 41.5, 42.75, 42.0, 41.75, 43.375, 41.5]


def test_dispatch_records_in_simulation(tmp_path):
    """Each dispatch holds PE_CPU for its cost (1 GHz: cycles = ns), back to back."""
    sim = Sim(tmp_path, TENSORS, overrides=["calibration.R=0.25"])
    log = sim.run(_all_command_types)
    cpu = [r for r in log if r["unit"] == "cpu"]
    assert [(r["op_kind"], r["bytes"], r["t_end_ns"] - r["t_start_ns"]) for r in cpu] == [
        (k, b, 40 + 0.25 * b) for k, b in EXPECTED]
    for prev, nxt in zip(cpu, cpu[1:]):  # PE_CPU never blocks here: back to back
        assert nxt["t_start_ns"] == prev["t_end_ns"]
    assert sim.pe.cpu.n_commands == 8
    assert sim.pe.cpu.cycles == sum(40 + 0.25 * b for _, b in EXPECTED) == 320 + 0.25 * 250


def test_dispatch_clock_converts_cycles_to_time(tmp_path):
    sim = Sim(tmp_path, TENSORS, overrides=["hardware.clock_ghz=2.0"])
    log = sim.run(lambda tl: tl.load(tl.ref("k")))
    (rec,) = [r for r in log if r["unit"] == "cpu"]
    assert rec["t_end_ns"] - rec["t_start_ns"] == 41.5 / 2  # 41.5 cycles at 2 GHz


def test_pe_cpu_rejects_bad_parameters():
    with pytest.raises(ValueError, match="^fixed_cycles must be ≥ 0, got -1$"):
        PeCpu(-1, 0.1, 1024, 1.0)
    with pytest.raises(ValueError, match="^composite_cap_bytes must be ≥ 1, got 0$"):
        PeCpu(40, 0.1, 0, 1.0)
    with pytest.raises(ValueError, match="^r_cycles_per_byte must be a finite number, got nan$"):
        PeCpu(40, float("nan"), 1024, 1.0)


def test_check_cap_message_names_bytes_and_cap(tmp_path):
    cpu = PeCpu(40, 0.0625, 50, 1.0)
    cmds, _ = emit(lambda tl: tl.composite(op="gemm", a=tl.load(tl.ref("q")), b=tl.ref("k").T),
                   tmp_path, TENSORS)
    comp = cmds[-1]
    assert comp.logical_bytes == 4 + 1 + 40 + 1 == 46
    cpu.check_cap(comp)  # 46 ≤ 50
    cpu45 = PeCpu(40, 0.0625, 45, 1.0)
    with pytest.raises(ValidationError) as e:
        cpu45.check_cap(comp)
    assert str(e.value) == ("composite over the size cap: 46 logical bytes > cap 45 (calibration.cap_bytes); "
                            "ops [gemm]; split it (no silent segmentation, ADR-0064 D7)")
