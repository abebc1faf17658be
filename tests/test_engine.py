"""The generic engine: import boundaries (ADR-0065 D5/D7, DDD §1 criterion 3), multi-PE
construction, deadlock and TCM-overflow errors."""
import ast
import json
import subprocess
import sys

import numpy as np
import pytest

from kbframe.sim.engine import Engine
from kbframe.errors import DeadlockError, TcmOverflowError
from kbframe.ir.handles import Completion
from kbframe.sim.numerics import Numerics
from kbframe.records import RecordTable
from kbframe.sim.oplog import OpLog
from kbframe.tl.context import TL

from conftest import REPO, Sim, compose_cfg

# the engine and every hardware module (found on disk, so a new unit is covered too)
BOUNDARY_MODULES = ["kbframe.sim.engine"] + sorted(
    f"kbframe.hw.{p.stem}" for p in (REPO / "kbframe" / "hw").glob("*.py") if p.stem != "__init__")
RECIPE_MODULES = ("kbframe.tl.recipe", "kbframe.tl.context", "kbframe.recipes", "recipes")


def test_adr0065_scheduler_and_engines_import_nothing_recipe_related():
    """In a fresh interpreter, importing the engine, the scheduler, tiling and every unit
    loads no recipe-related module."""
    assert {"kbframe.hw.pe_scheduler", "kbframe.hw.tiling", "kbframe.hw.pe_math"} <= set(BOUNDARY_MODULES)
    code = ("import sys\n"
            f"for m in {BOUNDARY_MODULES!r}: __import__(m)\n"
            f"bad = sorted(m for m in sys.modules if m in {RECIPE_MODULES!r} or m.startswith('recipes.')"
            " or m.startswith('kbframe.recipes.'))\n"
            "print(repr(bad))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("mod", BOUNDARY_MODULES)
def test_boundary_module_source_has_no_recipe_imports(mod):
    """Static check (catches lazy imports inside functions too)."""
    path = REPO / (mod.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text())
    imported = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            imported += [base] + [f"{base}.{a.name}" for a in node.names]
    assert not [m for m in imported if "recipe" in m or m.endswith(".tl") or m == "tl"], imported
    assert "softmax_merge" not in path.read_text()


@pytest.mark.parametrize("mod", ["kbframe/hw/pe_dma.py", "kbframe/hw/pe_gemm.py", "kbframe/hw/pe_math.py"])
def test_engine_latency_models_never_read_op_kind(mod):
    """Engines are op_kind-opaque (ADR-0065 D7): no attribute access to ``op_kind``."""
    tree = ast.parse((REPO / mod).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "op_kind"]


def test_engine_builds_every_pe_and_they_run_concurrently(tmp_path):
    """n_pes=2: two PEs with their own units; the same load on each takes the same time."""
    cfg = compose_cfg("hardware.n_pes=2", bench=None)
    log = OpLog(tmp_path / "op_log.jsonl")
    eng = Engine(cfg.hardware, Numerics(), log)
    assert len(eng.pes) == 2 and eng.pes[0].cpu is not eng.pes[1].cpu
    assert eng.pes[0].stage_units["dma_read"] is not eng.pes[1].stage_units["dma_read"]
    eng.add_hbm_tensor("k", (64, 128), "float16")
    tls = [TL(pe, eng.hbm) for pe in eng.pes]
    latency = eng.run({i: (lambda t=t: t.load(t.ref("k"))) for i, t in enumerate(tls)})
    log.close()
    # dispatch 41.5 ns, then 77 ns setup + 80 ns data on each PE's own read channel
    assert latency == 41_500 + 157_000
    assert [pe.cpu.n_commands for pe in eng.pes] == [1, 1]


def test_deadlock_names_pe_and_wait(tmp_path):
    sim = Sim(tmp_path, {}, data=False)

    def kern(tl):
        h = tl.zeros((8, 1), "x")
        h.pending = Completion(99, "never")  # a completion no command will fire
        tl.wait(h)

    with pytest.raises(DeadlockError) as e:
        sim.run(kern)
    # the fill dispatches 0 → 41.25 ns (40 + 20/16), its MATH stage runs 1 cycle → last event 42.25 ns
    assert str(e.value) == "deadlock at 42.25 ns: PE0 PE_CPU waits for Completion(cmd 99 never, done=False)"


def test_tcm_overflow_names_request_free_and_capacity(tmp_path):
    sim = Sim(tmp_path, {}, data=False, overrides=["hardware.tcm_bytes=4096"])

    def kern(tl):
        tl.empty((8, 128), "O")        # 2048 B
        tl.empty((8, 64), "S")         # 1024 B → 3072 used, 1024 free
        tl.empty((8, 65), "P")         # 1040 B → 1088 with 64 B alignment

    with pytest.raises(TcmOverflowError) as e:
        sim.run(kern)
    assert str(e.value) == ("TCM overflow on PE0: request 'P' needs 1088 B, 1024 B free of 4096 B capacity "
                            "(hardware.tcm_bytes)")


def test_scratch_scope_frees_tcm(tmp_path):
    sim = Sim(tmp_path, {}, data=False)
    tops = []

    def kern(tl):
        tl.empty((8, 128), "arena")
        tops.append(tl.pe.tcm.top)
        with tl.scratch_scope():
            tl.empty((8, 64), "tmp")
            tops.append(tl.pe.tcm.top)
        tops.append(tl.pe.tcm.top)

    sim.run(kern)
    assert tops == [2048, 3072, 2048]


@pytest.mark.parametrize("times", [(0, 41_500, -1), (999_999, 1_000_001, 1_000_000),
                                   (12_345_678_901, 12_345_679_000, -1), (10 ** 15, 10 ** 15 + 1, -1),
                                   (41_500, 157_001, 42_000)])
def test_op_log_time_text_is_the_ns_float(times):
    """op_log ns fields read back as exactly ps / 1000 (and print as Python prints it), in
    the formatter's integer fast path and in its general path (huge times)."""
    t0, t1, t_data = times
    table = RecordTable()
    c = table.code(0, "dma_read", "dma_read")
    table.append(c, 7, 3, t0, t1, t_data, 2048, -1, -1, -1)
    table.append(c, 8, -1, 0, 1, -1, 64, -1, -1, -1)
    lines = table.text().splitlines()
    rec = json.loads(lines[0])
    assert (rec["t_start_ns"], rec["t_end_ns"]) == (t0 / 1000, t1 / 1000)
    assert f'"t_start_ns": {t0 / 1000!r}, "t_end_ns": {t1 / 1000!r}, "bytes": 2048' in lines[0]
    assert rec.get("t_data_ns") == (t_data / 1000 if t_data >= 0 else None)
    assert lines[1] == ('{"pe": 0, "unit": "dma_read", "op_kind": "dma_read", "cmd": 8, "tile": -1, '
                        '"t_start_ns": 0.0, "t_end_ns": 0.001, "bytes": 64}')
    back = RecordTable.parse(table.text())
    assert back.names == table.names and back.text() == table.text()


def test_op_log_batch_mixing_fast_and_general_times(tmp_path):
    """Every record of one batch gets its own text: a negative start and a time past the
    fast path's range, among ordinary ones, are printed as ps / 1000 like the rest; the
    file OpLog streams in batches is the table's text."""
    rows = [(0, 2000, -1), (1500, 10 ** 15 + 700, -1), (0, 3000, 2500), (-1500, 4000, -1), (4000, 5000, 4500)]
    log = OpLog(tmp_path / "op_log.jsonl", batch=2)
    c = log.table.code(0, "dma_read", "dma_read")
    for i, (t0, t1, t_data) in enumerate(rows):
        log.table.append(c, i, -1, t0, t1, t_data, 64, -1, -1, -1)
        log.n_records += 1
    log.close()
    text = (tmp_path / "op_log.jsonl").read_text()
    assert text == log.table.text()
    lines = text.splitlines()
    assert [json.loads(line)["t_start_ns"] for line in lines] == [0.0, 1.5, 0.0, -1.5, 4.0]
    assert json.loads(lines[1])["t_end_ns"] == (10 ** 15 + 700) / 1000
    assert [json.loads(line).get("t_data_ns") for line in lines] == [None, None, 2.5, None, 4.5]
    assert lines[3].endswith('"t_start_ns": -1.5, "t_end_ns": 4.0, "bytes": 64}')


def test_op_log_streamed_in_batches_is_the_table_text(tmp_path, monkeypatch):
    """A run streamed in batches of 3 records writes exactly its record table's text, and
    RecordTable.parse reads that back to the same records (why and ref aside)."""
    monkeypatch.setattr(OpLog.__init__, "__defaults__", (None, 3))  # OpLog(path): batches of 3
    sim = Sim(tmp_path, {"a": np.ones((8, 64)), "b": np.ones((8, 64))})
    assert sim.oplog._batch == 3
    sim.run(lambda tl: tl.store(tl.ref("b"), tl.add(tl.load(tl.ref("a")), tl.load(tl.ref("b")))))
    table = sim.oplog.table
    text = sim.log_path.read_text()
    assert len(table) == sim.oplog.n_records > 6 and text == table.text()
    back = RecordTable.parse(sim.log_path)
    assert back.names == table.names
    assert (back.array()[:, :8] == table.array()[:, :8]).all() and (back.array()[:, 8:] == -1).all()


def test_run_leaves_the_collector_as_it_found_it(tmp_path):
    """No full (generation 2) collections during the simulation, young ones as usual;
    the caller's thresholds are back afterwards, also when the kernel raises."""
    import gc
    before = gc.get_threshold()
    seen = []

    def kern(tl):
        seen.append(gc.get_threshold())
        tl.load(tl.ref("k"))
    Sim(tmp_path, {"k": np.ones((64, 128))}, data=False).run(kern)
    assert seen == [(before[0], before[1], 1 << 30)] and gc.get_threshold() == before
    (tmp_path / "b").mkdir()
    with pytest.raises(ZeroDivisionError):
        Sim(tmp_path / "b", {}, data=False).run(lambda tl: 1 / 0)
    assert gc.get_threshold() == before


def test_pes_get_copies_of_one_instantiation_sharing_no_state():
    """Units are instantiated once and copied per PE: equal parameters, no shared objects."""
    cfg = compose_cfg("hardware.n_pes=3", "hardware.units.dma_read.max_outstanding=2", bench=None)
    eng = Engine(cfg.hardware, Numerics(), OpLog(None))
    reads = [pe.stage_units["dma_read"] for pe in eng.pes]
    assert [(u.max_outstanding, u.setup_ps, u.bandwidth_gbps) for u in reads] == [(2, 77_000, 204.8)] * 3
    assert len({id(u) for u in reads}) == 3 and len({id(u._ends) for u in reads}) == 3
    assert len({id(u._transfer_cache) for u in reads}) == 3
    assert [u.pe for u in reads] == list(eng.pes) and [pe.tcm.pe_index for pe in eng.pes] == [0, 1, 2]
    assert len({id(pe.scheduler.queue) for pe in eng.pes}) == 3
