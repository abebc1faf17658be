"""Shared helpers for the kbframe test suite.

* :func:`compose_cfg` composes the real Hydra config in-process (much faster than a
  subprocess), exactly as ``python -m kbframe`` would.
* :func:`run` runs a bench in-process with :func:`kbframe.run.bench.run_bench`.
* :class:`Sim` builds an :class:`~kbframe.sim.engine.Engine` from the default hardware with
  chosen HBM tensors, so a test can run a tiny hand-written kernel through the real tl
  layer, PE_CPU, PE_SCHEDULER and units.
* :func:`emit` runs a kernel only as far as the tl layer: it collects the commands the
  kernel dispatches without simulating them (for lowering and validation tests).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from kbframe.ir.protocol import Dispatch, requests
from kbframe.run import schema
from kbframe.run.bench import run_bench
from kbframe.sim.engine import Engine
from kbframe.sim.numerics import Numerics, NumpyNumerics
from kbframe.sim.oplog import OpLog
from kbframe.tl.recipe import load_recipes
from kbframe.tl.context import TL

schema.register()

REPO = Path(__file__).resolve().parents[1]


def compose_cfg(*overrides, bench: str | None = "decode_opt2"):
    """The composed root config with ``+bench=<bench>`` and ``overrides``."""
    ov = ([f"+bench={bench}"] if bench else []) + list(overrides)
    GlobalHydra.instance().clear()  # robust to a test elsewhere that left Hydra initialised
    with initialize_config_module(config_module="kbframe.conf", version_base="1.3"):
        return compose(config_name="config", overrides=ov)


def run(out_dir: Path, *overrides, bench: str = "decode_opt2") -> dict:
    """Run ``bench`` in-process into ``out_dir``; returns the metrics dict."""
    return run_bench(compose_cfg("run.progress=false", *overrides, bench=bench), Path(out_dir))


def copies_only(monkeypatch) -> None:
    """Fast-forward from short copies only: in one simulation (tried first,
    kbframe.run.skipped) is not tried."""
    from kbframe.run import fastforward
    monkeypatch.setattr(fastforward, "_in_one", lambda *a, **k: fastforward.Outcome(None, ""))


def read_oplog(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def load_out(out_dir: Path) -> dict:
    with np.load(Path(out_dir) / "tensors.npz") as z:
        return {k: z[k] for k in z.files}


def ref64(q, k, v, scale) -> np.ndarray:
    """Independent float64 reference: softmax(q·kᵀ·scale)·v (not kbframe.run.bench.reference)."""
    s = np.einsum("gd,sd->gs", q.astype(np.float64), k.astype(np.float64)) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v.astype(np.float64)) / p.sum(axis=1, keepdims=True)


class Sim:
    """One default-hardware Engine with named HBM tensors, a TL and an op_log file.

    Args:
        tmp_path: where ``op_log.jsonl`` goes.
        tensors: ``{name: ndarray}`` placed in HBM (float16 timing dtype).
        data: data mode (numpy numerics) or timing only.
        overrides: extra config overrides (``calibration.R=0.25`` ...).
        recipes: ``{name: raw dict}`` of extra recipes besides the configured ones.
        cfg: a composed root config to use instead of composing one from ``overrides``.
    """

    def __init__(self, tmp_path, tensors: dict, data: bool = True, overrides=(), recipes=None, cfg=None):
        self.cfg = cfg if cfg is not None else compose_cfg(*overrides, bench=None)
        raw = OmegaConf.to_container(self.cfg.recipes)
        raw.update(recipes or {})
        self.recipes = load_recipes(OmegaConf.create(raw))
        self.numerics = NumpyNumerics("float32") if data else Numerics()
        self.log_path = Path(tmp_path) / "op_log.jsonl"
        self.oplog = OpLog(self.log_path)
        self.engine = Engine(self.cfg.hardware, self.numerics, self.oplog)
        for name, arr in tensors.items():
            self.engine.add_hbm_tensor(name, np.shape(arr), "float16", arr)
        self.pe = self.engine.pes[0]
        self.tl = TL(self.pe, self.engine.hbm, self.recipes, "float16")

    def run(self, kernel) -> list[dict]:
        """Run ``kernel(tl)`` to completion; returns the op_log records."""
        try:
            self.engine.run({0: lambda: kernel(self.tl)})
        finally:
            self.oplog.close()
        return read_oplog(self.log_path)

    def read(self, h) -> np.ndarray:
        return np.array(self.numerics.read(h), dtype=np.float64)


def emit(kernel, tmp_path, tensors=None, **kw) -> tuple[list, Sim]:
    """Run ``kernel(tl)`` through the tl layer only; return the dispatched commands.

    PE_CPU and the scheduler are not involved: each ``dispatch`` switch is collected and
    the kernel resumed at once (``wait`` requests are ignored).
    """
    sim = Sim(tmp_path, tensors or {}, data=False, **kw)
    cmds = []
    for req in requests(lambda: kernel(sim.tl)):
        if type(req) is Dispatch:
            cmds.append(req.cmd)
    sim.oplog.close()
    return cmds, sim


def cli(*args, cwd=None, timeout=120):
    """``python -m kbframe ARGS`` in a subprocess (returns the CompletedProcess)."""
    import subprocess
    return subprocess.run([sys.executable, "-m", "kbframe", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, timeout=timeout)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which adds each test's group to its id
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test``: ``-n auto --dist loadgroup``): the tests marked
    ``serial`` share one xdist group, so one worker runs them one after another and no two
    of them signal or wait on processes of their own at the same time. A test that uses a
    module-scoped fixture (and has no group of its own) is grouped with its module, so one
    worker builds that fixture once instead of each worker building its own."""
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group("serial"))
        elif item.get_closest_marker("xdist_group") is None and _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` each grouped test's id carries its group (pytest-xdist adds
    ``@GROUP``): a pytest that drops it would spread the serial tests over the workers, and
    their signals and timings over one another, without a word."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if lost:
            raise pytest.UsageError(f"--dist loadgroup: {len(lost)} grouped test(s) lost their group, e.g. "
                                    f"{lost[0]}: pytest-xdist does not work with this pytest (pyproject.toml)")


@contextmanager
def tmpfs(d: Path, options: str):
    """A tmpfs mounted on the new folder ``d`` with mount ``options`` (``size=300k``,
    ``nr_inodes=8``): a disk that fills. Root only; the test is skipped otherwise."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)])


def fill_disk(d: Path) -> None:
    """Take every block left on the file system of folder ``d`` (a file ``filler``)."""
    with open(d / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass
