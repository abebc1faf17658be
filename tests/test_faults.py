"""Hostile inputs and faults that a row of docs/errors.md cannot express (issue 14): host
memory budgets, PEs a run never uses, and (below) the run directory's faults."""
from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import compose_cfg
from kbframe.errors import ConfigError, InputsError
from kbframe.run import preflight
from kbframe.run.bench import load_inputs, run_bench
from kbframe.sim.engine import Engine
from kbframe.sim.numerics import Numerics
from kbframe.sim.oplog import OpLog


# ---------------------------------------------------------------- class 7: host memory

def test_sanitizer_memory_is_checked_before_the_run(tmp_path, monkeypatch):
    """run.check keeps every stage and record: the dry run counts the records exactly (the
    run's sim.events), and a machine too small for them is refused before simulating."""
    m = run_bench(compose_cfg("bench.S_kv=1024", "bench.data=false", "run.progress=false"), tmp_path / "ok")
    cfg = compose_cfg("bench.S_kv=1024", "bench.data=false", "run.progress=false")
    from kbframe.sim.targets import resolve_kernel
    from kbframe.tl.recipe import load_recipes
    fig = preflight.dry_run(cfg.hardware, 0, resolve_kernel(cfg.bench.kernel), load_recipes(cfg.recipes),
                            "float16", {"q": (8, 128), "k": (1024, 128), "v": (1024, 128), "out": (8, 128)},
                            dict(G=8, d=128, S_kv=1024, tile=64, scale=0.088), count_stages=True)
    assert fig["records"] == m["sim"]["events"] == 2 * fig["commands"] + fig["stages"]
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: fig["records"] * 2048 - 1)
    with pytest.raises(ConfigError) as e:
        run_bench(cfg, tmp_path / "small")
    assert str(e.value) == (f"run.check=true keeps about {fig['records'] * 2048 / 2**30:.3g} GiB of host memory for "
                            f"the sanitizer ({fig['records']} op_log records × 2048 B); this machine has "
                            f"{(fig['records'] * 2048 - 1) / 2**30:.3g} GiB; use run.check=false or a shorter run")
    assert not (tmp_path / "small").exists()
    run_bench(compose_cfg("bench.S_kv=1024", "bench.data=false", "run.progress=false", "run.check=false"),
              tmp_path / "unchecked")  # without the sanitizer nothing is kept


def test_npz_expansion_checked_from_headers(tmp_path, monkeypatch):
    """A compressed .npz expands a thousandfold: 64 MiB of int8 zeros are a ~64 KiB file.
    Its headers are read (nothing decompressed) and refused beyond host memory."""
    k = np.zeros((1 << 19, 128), np.int8)
    np.savez_compressed(tmp_path / "z.npz", q=np.zeros((8, 128), np.int8), k=k, v=k)
    assert (tmp_path / "z.npz").stat().st_size < 1 << 20
    heads = preflight.npz_headers(tmp_path / "z.npz")
    assert heads["k"] == ((1 << 19, 128), np.dtype(np.int8))
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: 1 << 30)
    with pytest.raises(InputsError) as e:
        load_inputs(str(tmp_path / "z.npz"))
    assert str(e.value) == (f"bench.inputs.path: '{tmp_path / 'z.npz'}' needs about 1.13 GiB of host memory to "
                            f"load (array 'k' is (524288, 128) int8, 0.0625 GiB once expanded, then float64); this "
                            f"machine has 1 GiB")
    monkeypatch.setattr(preflight, "physical_memory_bytes", lambda: 2 << 30)
    assert load_inputs(str(tmp_path / "z.npz"))["k"].shape == (1 << 19, 128)


def test_unused_pes_are_not_built():
    """hardware.n_pes=100000 took 64 s and 0.94 GB building PEs a one-PE run never uses;
    PEs are now built when first used."""
    cfg = compose_cfg("hardware.n_pes=100000")
    t0 = time.perf_counter()
    eng = Engine(cfg.hardware, Numerics(), OpLog(None))
    pe = eng.pes[7]
    assert time.perf_counter() - t0 < 1.0
    assert len(eng.pes) == 100000 and eng.pes.built() == [pe] and pe.index == 7
    assert eng.pes[7] is pe and eng.pes[-1].index == 99999 and len(eng.pes.built()) == 2
    with pytest.raises(IndexError):
        eng.pes[100000]
