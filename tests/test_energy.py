"""Energy and power (kbframe.run.energy, conf/energy/; DESIGN.md decision 15): a run's
energy recomputed from its op_log and the table, each table entry moving exactly its own
component, static power apart from dynamic, PE_CPU's energy following the dispatch cost,
fast-forward and many PEs, and the energy group's bad inputs."""
from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from conftest import compose_cfg, read_oplog, run
from kbframe.errors import ConfigError
from kbframe.hw.pe_math import ENERGY_CLASS
from kbframe.ir.micro_ops import MICRO_OPS
from kbframe.run.bench import run_bench

TABLE = OmegaConf.load("conf/energy/default.yaml")
UNITS = ("cpu", "scheduler", "tcm", "dma_read", "dma_write", "gemm", "math")  # conf/hardware/default.yaml's order


def _opt3_math(G: int, d: int, tiles: list) -> dict:
    """opt3's MATH element-ops by class (kbframe.kernels.attention.partial_opt3 and finish):
    per tile of ``n`` keys rmax, rsum (G·n), maximum, copy (G), add (G·d) are ``add``;
    exp_diff of the state (G) and of the scores (G·n) ``exp``; fma (G) ``fma``; mul_bcast
    (G·d) ``mul``; once: fills of m, l (G each) and O (G·d), scale of q (G·d), O / l (G·d)."""
    add = sum(2 * G * n + 2 * G + G * d for n in tiles) + 2 * G + G * d
    return {"add_ops": add, "mul_ops": len(tiles) * G * d + G * d, "fma_ops": len(tiles) * G,
            "exp_ops": sum(G + G * n for n in tiles), "div_ops": G * d}


def test_energy_recomputed_from_the_op_log(tmp_path):
    """Counts of each action from op_log.jsonl (and the MACs and MATH element-ops the
    kernel's shape gives) times conf/energy/default.yaml: the same pJ, exactly."""
    G, d, S, T = 8, 128, 1000, 64
    m = run(tmp_path, f"bench.S_kv={S}", f"bench.tile={T}", "bench.data=false", "run.fast_forward=off",
            bench="decode_opt3")
    log = read_oplog(tmp_path / "op_log.jsonl")
    by = {u: [r for r in log if r["unit"] == u] for u in UNITS}
    cycles = 0.0
    for r in by["cpu"]:  # PE_CPU adds each command's FIXED + R × logical_bytes in dispatch order
        cycles += 40.0 + 0.0625 * r["bytes"]
    tiles = [T] * (S // T) + [S % T]
    math_ops = _opt3_math(G, d, tiles)
    elements = sum(math_ops.values())
    nbytes = {u: sum(r["bytes"] for r in by[u]) for u in UNITS}
    t = {k: dict(v) for k, v in TABLE.items() if isinstance(v, dict) or OmegaConf.is_dict(v)}
    actions = {
        "cpu": [("cycles", cycles * t["dispatch"]["pj_per_cycle"])],
        "scheduler": [("admissions", len(by["scheduler"]) * t["admission"]["pj_per_admission"])],
        "tcm": [("read_bytes", (nbytes["dma_write"] + nbytes["gemm"] + nbytes["math"]) * t["tcm"]["read_pj_per_byte"]),
                ("write_bytes", (nbytes["dma_read"] + 2 * elements) * t["tcm"]["write_pj_per_byte"])],
        "dma_read": [("hbm_bits", 8 * nbytes["dma_read"] * t["dma_read"]["hbm_pj_per_bit"]),
                     ("transfers", len(by["dma_read"]) * t["dma_read"]["setup_pj_per_transfer"])],
        "dma_write": [("hbm_bits", 8 * nbytes["dma_write"] * t["dma_write"]["hbm_pj_per_bit"]),
                      ("transfers", len(by["dma_write"]) * t["dma_write"]["setup_pj_per_transfer"])],
        "gemm": [("macs", 2 * G * d * S * t["gemm"]["float16_pj_per_mac"])],
        "math": [(a, n * t["math"][a[:-4] + "_pj_per_op"]) for a, n in math_ops.items()],
    }
    total = 0.0
    for u in UNITS:
        dyn = 0.0
        for _, pj in actions[u]:
            dyn += pj
        total += dyn + 0.0  # static 0 mW by default
    e = m["energy"]
    assert e["total_pj"] == total and e["dynamic_pj"] == total and e["static_pj"] == 0.0
    units = e["by_unit"][0]["units"]
    for u in UNITS:
        assert units[u]["pj_by_action"] == dict(actions[u]), u
    assert units["math"]["actions"] == math_ops
    assert units["gemm"]["actions"] == {"macs": 2 * G * d * S}
    assert e["per_unit_pj"] == total / len(tiles) and e["unit"] == "KV tile"
    assert e["avg_power_w"] == total / m["sim"]["latency_ns"] * 1e-3
    assert e["edp"] == total * m["sim"]["latency_ns"] and e["node"] == "45nm"


#: one entry per role and key of the default table, with the action it charges
ENTRIES = [("dispatch", "pj_per_cycle", "cycles"), ("admission", "pj_per_admission", "admissions"),
           ("tcm", "read_pj_per_byte", "read_bytes"), ("tcm", "write_pj_per_byte", "write_bytes"),
           ("dma_read", "hbm_pj_per_bit", "hbm_bits"), ("dma_read", "setup_pj_per_transfer", "transfers"),
           ("dma_write", "hbm_pj_per_bit", "hbm_bits"), ("dma_write", "setup_pj_per_transfer", "transfers"),
           ("gemm", "float16_pj_per_mac", "macs"), ("math", "add_pj_per_op", "add_ops"),
           ("math", "mul_pj_per_op", "mul_ops"), ("math", "fma_pj_per_op", "fma_ops"),
           ("math", "exp_pj_per_op", "exp_ops"), ("math", "div_pj_per_op", "div_ops")]
SMALL = ("bench.S_kv=300", "bench.tile=64", "bench.data=false")


def _components(e: dict) -> dict:
    return {(pe["pe"], name, a): pj for pe in e["by_unit"] for name, u in pe["units"].items()
            for a, pj in u["pj_by_action"].items()}


@pytest.fixture(scope="module")
def base_opt3(tmp_path_factory):
    return run(tmp_path_factory.mktemp("base"), *SMALL, bench="decode_opt3")["energy"]


@pytest.mark.parametrize("role,key,action", ENTRIES)
def test_doubling_one_entry_moves_only_its_component(tmp_path, base_opt3, role, key, action):
    e = run(tmp_path, *SMALL, f"energy.{role}.{key}={2 * TABLE[role][key]}", bench="decode_opt3")["energy"]
    a, b = _components(base_opt3), _components(e)
    unit = {"dispatch": "cpu", "admission": "scheduler"}.get(role, role)
    moved = {k for k in a if a[k] != b[k]}
    assert moved == {(0, unit, action)}
    assert b[(0, unit, action)] == 2 * a[(0, unit, action)] > 0


CUBE = ("hardware=cube", "bench.S_kv=2048", "bench.data=false", "bench.merge=tree")


@pytest.mark.parametrize("hardware,key", [("cube", "intra_pj_per_bit"), ("cube_mesh", "d2d_pj_per_bit")])
def test_doubling_a_link_entry_moves_only_the_senders(tmp_path, hardware, key):
    """IPCQ: the senders' link bits (a mesh's merge crosses cubes: d2d bits), nothing else."""
    ov = (f"hardware={hardware}", "bench.S_kv=4096", "bench.data=false", "bench.merge=tree")
    a = run(tmp_path / "a", *ov, bench="decode_splitk")
    b = run(tmp_path / "b", *ov, f"energy.ipcq_send.{key}={2 * TABLE.ipcq_send[key]}", bench="decode_splitk")
    ca, cb = _components(a["energy"]), _components(b["energy"])
    action = key.split("_pj")[0] + "_bits"
    moved = {k for k in ca if ca[k] != cb[k]}
    assert moved and all(u == "ipcq_send" and act == action for _, u, act in moved)
    assert all(cb[k] == 2 * ca[k] for k in moved)
    # the bits are the links' bytes × 8 (× cubes crossed for d2d), as metrics.json ipcq lists them
    bits = sum(ca.get((p, "ipcq_send", action), 0.0) for p in range(64)) / TABLE.ipcq_send[key]
    hops = (lambda s, t: abs(s // 8 % 2 - t // 8 % 2) + abs(s // 16 - t // 16)) if key.startswith("d2d") \
        else (lambda s, t: 1)
    assert math.isclose(bits, sum(8 * ln["bytes"] * hops(ln["src"], ln["dst"]) for ln in a["ipcq"]["links"]))
    assert bits > 0


def test_static_power_is_apart_from_dynamic(tmp_path, base_opt3):
    """Static power × latency per unit; dynamic energy unchanged by it."""
    ov = ("energy.gemm.static_mw=50", "energy.tcm.static_mw=20", "energy.dispatch.static_mw=5")
    m = run(tmp_path, *SMALL, *ov, bench="decode_opt3")
    e, lat = m["energy"], m["sim"]["latency_ns"]
    assert e["dynamic_pj"] == base_opt3["dynamic_pj"] and _components(e) == _components(base_opt3)
    units = e["by_unit"][0]["units"]
    assert (units["gemm"]["static_pj"], units["tcm"]["static_pj"], units["cpu"]["static_pj"]) == \
        (50.0 * lat, 20.0 * lat, 5.0 * lat)
    assert units["math"]["static_pj"] == 0.0
    assert e["static_pj"] == 5.0 * lat + 0.0 + 20.0 * lat + 0.0 + 0.0 + 50.0 * lat + 0.0
    assert e["total_pj"] == e["dynamic_pj"] + e["static_pj"] and e["by_role"]["static"] == e["static_pj"]


def test_pe_cpu_energy_follows_the_dispatch_cost(tmp_path, base_opt3):
    """Doubling FIXED doubles nothing but PE_CPU's cycles, and its energy is cycles × the
    table's pJ per cycle; the other units' actions are the same (the schedule's work is)."""
    m = run(tmp_path, *SMALL, "calibration.FIXED=80", bench="decode_opt3")
    e = m["energy"]
    assert e["by_unit"][0]["units"]["cpu"]["pj"] == m["dispatch"]["cycles"] * 70.0
    assert e["by_unit"][0]["units"]["cpu"]["actions"]["cycles"] == m["dispatch"]["cycles"]
    a, b = _components(base_opt3), _components(e)
    assert {k for k in a if a[k] != b[k]} == {(0, "cpu", "cycles")}
    assert b[(0, "cpu", "cycles")] > a[(0, "cpu", "cycles")]


def test_fast_forward_keeps_the_energy(tmp_path):
    """A fast-forwarded run's energy is the full simulation's, figure for figure."""
    ov = ("bench.S_kv=65536", "bench.data=false", "run.check=false", "run.trace=false")
    on = run(tmp_path / "on", *ov, "run.fast_forward=verify", bench="decode_opt3")
    off = run(tmp_path / "off", *ov, "run.fast_forward=off", bench="decode_opt3")
    assert on["fast_forward"]["applied"] and not off["fast_forward"]["applied"]
    assert on["energy"] == off["energy"] and on["energy"]["total_pj"] > 0


def test_fast_forward_verify_covers_the_energy_of_many_pes(tmp_path):
    """run.fast_forward=verify compares every total the energy is made of (stages and
    elements per op kind, bytes, FLOPs, link bytes, dispatch cycles) with the full
    simulation's; on a cube's 8 PEs with IPCQ merges it passes, and the energy has links."""
    m = run(tmp_path, "hardware=cube", "bench.S_kv=1048576", "bench.inner=opt3", "bench.data=false",
            "run.check=false", "run.trace=false", "run.fast_forward=verify", bench="decode_splitk")
    assert m["fast_forward"]["applied"] and "verified" in m["fast_forward"]["note"]
    e = m["energy"]
    assert len(e["by_unit"]) == 8 and e["by_role"]["ipcq_send"] > 0
    assert e["by_action"]["ipcq_send.intra_bits"]["count"] == 8 * m["ipcq"]["bytes"]


def test_many_pes_sum_their_energy(tmp_path):
    m = run(tmp_path, *CUBE, bench="decode_splitk")
    e = m["energy"]
    assert len(e["by_unit"]) == 8 and [p["pe"] for p in e["by_unit"]] == list(range(8))
    total = 0.0
    for p in e["by_unit"]:
        total += p["dynamic_pj"]
    assert e["dynamic_pj"] == total
    assert sum(a["count"] for k, a in e["by_action"].items() if k == "dma_read.hbm_bits") == \
        8 * sum(p["units"]["dma_read"]["bytes"] for p in m["pes"])


def test_every_micro_op_has_an_energy_class():
    assert set(ENERGY_CLASS) == set(MICRO_OPS)
    assert {f"{c}_pj_per_op" for c in ENERGY_CLASS.values()} <= set(TABLE.math)


def test_summary_has_one_energy_line(tmp_path):
    from kbframe.run.metrics import summary
    m = run(tmp_path, *SMALL, bench="decode_opt3")
    lines = [ln for ln in summary(m, tmp_path).splitlines() if ln.strip().startswith("energy")]
    assert len(lines) == 1
    assert "per KV tile" in lines[0] and "largest: DMA read" in lines[0] and " W;" in lines[0]


@pytest.mark.parametrize("override,msg", [
    ("energy.gemm.float16_pj_per_mac=-1", "energy.gemm.float16_pj_per_mac must be a finite number ≥ 0, got -1.0"),
    ("energy.math.exp_pj_per_op=inf", "energy.math.exp_pj_per_op must be a finite number ≥ 0, got inf"),
    ("+energy.gemm.typo_pj_per_mac=1", "unknown key 'energy.gemm.typo_pj_per_mac' (known for hardware.units.gemm, "
                                        "GEMM: float16_pj_per_mac, bfloat16_pj_per_mac, float32_pj_per_mac, "
                                        "float64_pj_per_mac, static_mw)"),
    ("~energy.math.div_pj_per_op", "energy.math.div_pj_per_op is missing (hardware.units.math, MATH, is charged by "
                                   "add_pj_per_op, mul_pj_per_op, fma_pj_per_op, exp_pj_per_op, div_pj_per_op, "
                                   "static_mw)"),
    (None, "energy.tcm: no table for role 'tcm', which hardware.units.tcm (TCM) serves (it needs "
           "read_pj_per_byte, write_pj_per_byte, static_mw)"),
])
def test_bad_energy_tables_are_refused_before_the_run(tmp_path, monkeypatch, override, msg):
    from kbframe.sim.engine import Engine
    monkeypatch.setattr(Engine, "run", lambda *a, **k: pytest.fail("the simulation started"))
    cfg = compose_cfg(*SMALL, *([override] if override else []), "run.progress=false", bench="decode_opt3")
    if override is None:  # an energy group of the user's without a table for the TCM
        cfg.energy.tcm = {}
    with pytest.raises(ConfigError) as e:
        run_bench(cfg, tmp_path / "r")
    assert str(e.value) == msg


def test_a_unit_without_an_energy_rule_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^hardware\.units\.vec: NoEnergyVector \(no energy\) serves role 'math' "
                                          r"but declares no energy rule for its actions"):
        run_bench(compose_cfg(*SMALL, "~hardware.units.math", "hardware.allow_external_targets=true",
                              "+hardware.units.vec={_target_: test_energy.NoEnergyVector}", "run.progress=false",
                              bench="decode_opt3"), tmp_path / "r")


def test_a_micro_op_without_an_energy_class_is_named(tmp_path, monkeypatch):
    monkeypatch.delitem(ENERGY_CLASS, "exp_diff")
    with pytest.raises(ConfigError, match=r"^hardware\.units\.math: MATH performs micro-op 'exp_diff' but has no "
                                          r"energy rule for it"):
        run(tmp_path, *SMALL, bench="decode_opt3")


from kbframe.hw.unit import Unit  # noqa: E402


class NoEnergyVector(Unit):
    """A vector unit that declares no energy rule (1 ns per stage)."""

    roles = ("math",)
    label = "no energy"

    def __init__(self, description: str = "", roles=None, label=None):
        super().__init__(description, roles, label)

    def duration_ps(self, stage) -> int:
        return 1000


def test_sweep_csv_has_the_energy_columns():
    """energy.* columns when a job has an energy section: the totals, then each role's pJ."""
    from types import SimpleNamespace
    from kbframe.report.sweep import ENERGY_COLUMNS, energy_columns
    jobs = [SimpleNamespace(metrics={"energy": {"total_pj": 1.0, "by_role": {"dispatch": 1.0, "static": 0.0}}}),
            SimpleNamespace(metrics=None)]
    assert energy_columns(jobs) == ENERGY_COLUMNS + ["energy.by_role.dispatch", "energy.by_role.static"]
    assert energy_columns([SimpleNamespace(metrics={"sim": {}})]) == []


def test_energy_metrics_are_search_objectives():
    from kbframe.report.search import _check_name
    for name in ("energy.total_pj", "energy.per_unit_pj", "energy.edp"):
        assert _check_name(name, "search.objectives[0]") == name
    with pytest.raises(ConfigError, match="'energy.totl_pj' is not a metric"):
        _check_name("energy.totl_pj", "search.objectives[0]")


@pytest.mark.parametrize("bench,ov", [("decode_opt3", ("energy.gemm.static_mw=30",)),
                                      ("decode_splitk", ("hardware=cube", "bench.S_kv=1024"))])
def test_power_track_integrates_to_the_energy(tmp_path, bench, ov):
    """run.power_track: a power counter per PE whose area is the PE's energy; without it the
    trace has no counter."""
    import json
    m = run(tmp_path / "a", "bench.data=false", "bench.S_kv=512", *ov, "run.power_track=true", bench=bench)
    events = json.loads((tmp_path / "a" / "trace.json").read_text())["traceEvents"]
    lat_us = m["sim"]["latency_ns"] / 1000
    for pe in m["energy"]["by_unit"]:
        c = [e for e in events if e.get("ph") == "C" and e["pid"] == pe["pe"]]
        assert c and all(e["name"] == "power W" for e in c) and c[0]["ts"] == 0
        assert [e["ts"] for e in c] == sorted(e["ts"] for e in c) and c[-1]["ts"] <= lat_us
        area_pj = sum(a["args"]["W"] * (b["ts"] - a["ts"]) * 1e6 for a, b in zip(c, c[1:]))
        area_pj += c[-1]["args"]["W"] * (lat_us - c[-1]["ts"]) * 1e6
        assert math.isclose(area_pj, pe["pj"], rel_tol=1e-9)
    run(tmp_path / "b", "bench.data=false", "bench.S_kv=512", *ov, bench=bench)
    assert not any(e.get("ph") == "C" for e in json.loads((tmp_path / "b" / "trace.json").read_text())["traceEvents"])


@pytest.mark.parametrize("table", sorted(p.stem for p in __import__("pathlib").Path("conf/energy").glob("*.yaml")))
@pytest.mark.parametrize("hardware", sorted(p.stem for p in __import__("pathlib").Path("conf/hardware").glob("*.yaml")))
def test_every_energy_table_fits_every_hardware(table, hardware):
    from kbframe.run.energy import check
    from kbframe.sim.engine import build_units
    cfg = compose_cfg(f"energy={table}", f"hardware={hardware}")
    check(cfg.energy, build_units(cfg.hardware))


def test_every_default_figure_quotes_its_source():
    """Each figure of conf/energy/default.yaml carries a source tag ([H], [O], [U], [N], [D],
    defined in its header) in its comment; static power is 0 with the header's reason."""
    import re
    text = open("conf/energy/default.yaml").read()
    tags = set(re.findall(r"^#\s+\[([A-Z])\]", text, re.M))
    assert tags == {"H", "O", "U", "N", "D"}
    for line in text.splitlines():
        m = re.match(r"^\s+(\w+_pj_per_\w+):\s*([0-9.]+)\s*#\s*(.*)$", line)
        if re.match(r"^\s+\w+_pj_per_\w+:", line):
            assert m and re.match(r"\[([A-Z])\]", m[3]) and m[3][1] in tags, line
        if re.match(r"^\s+static_mw:", line):
            assert float(line.split(":")[1]) == 0.0
    assert "no public per-unit leakage figure" in text


def test_power_track_rebuilt_from_the_run_dir(tmp_path):
    """python -m kbframe.report.trace --power RUN_DIR draws the same power track as the run."""
    from kbframe.report.trace import main
    run(tmp_path, "bench.data=false", "bench.S_kv=300", "run.power_track=true", bench="decode_opt3")
    def power_lines(p):
        return [ln for ln in p.read_text().splitlines() if '"power W"' in ln]
    assert main(["--power", str(tmp_path), str(tmp_path / "again.json")]) == 0
    assert power_lines(tmp_path / "again.json") == power_lines(tmp_path / "trace.json")
    assert len(power_lines(tmp_path / "trace.json")) > 2


def test_energy_is_the_same_in_data_mode(tmp_path):
    """Numerics change no record, so no energy: data mode and timing only agree exactly."""
    a = run(tmp_path / "a", "bench.S_kv=300", "bench.data=true", bench="decode_opt2")["energy"]
    b = run(tmp_path / "b", "bench.S_kv=300", "bench.data=false", "run.fast_forward=off", bench="decode_opt2")["energy"]
    assert a == b and a["total_pj"] > 0
