"""Dotted names from configs are resolved and checked by what they reach (DESIGN.md
decision 1): every ``_target_`` and kernel in ``conf/`` resolves, and each
kind check refuses an object of the wrong kind, also one reached through a re-export
(``kbframe.run.bench.np.save``) and also with ``hardware.allow_external_targets=true``,
which widens the module set, never the kind of object."""
from __future__ import annotations

import pytest
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

import kbframe.kernels
from conftest import REPO, compose_cfg
from kbframe.cli.callbacks import SweepReport
from kbframe.errors import ConfigError
from kbframe.hw.pe_math import MathUnit
from kbframe.hw.tcm import Tcm
from kbframe.hw.unit import Unit
from kbframe.kernels.gqa_decode import gqa_decode_opt2
from kbframe.run.bench import run_bench, validate
from kbframe.workloads.base import Workload
from kbframe.sim.engine import build_units
from kbframe.sim.targets import KERNEL_MARK, resolve_class, resolve_kernel, resolve_unit_class

KWARGS = ("G", "d", "S_kv", "tile", "scale")
UNIT_RULE = ("not a unit class (a concrete class defined in kbframe.hw that subclasses kbframe.hw.unit.Unit, "
             "or PeCpu, PeScheduler or Tcm)")
KERNEL_RULE = ("not a kernel (a public function defined in a kbframe.kernels module, or registered with "
               "@kbframe.kernels.kernel)")


class ToyUnit(MathUnit):
    """A unit class defined outside kbframe (here, in a test module)."""


@kbframe.kernels.kernel
def toy_kernel(tl, *, G, d, S_kv, tile, scale):
    """A registered kernel defined outside kbframe."""


def unregistered(tl, *, G, d, S_kv, tile, scale):
    """A function with a kernel's signature, neither in kbframe.kernels nor registered."""


def _targets(node, path=""):
    """(path, key, value) of every ``_target_`` and ``kernel`` in a raw config."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{path}.{k}" if path else str(k)
            if k in ("_target_", "kernel") and isinstance(v, str):
                yield p, k, v
            else:
                yield from _targets(v, p)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _targets(v, f"{path}[{i}]")


def test_every_target_and_kernel_in_conf_resolves():
    """Every ``_target_`` and kernel in conf/ resolves to what it must be; a new kind of
    target fails here until it has a kind check."""
    seen = []
    for f in sorted((REPO / "conf").rglob("*.yaml")):
        raw = OmegaConf.to_container(OmegaConf.load(f), resolve=False)
        for path, key, value in _targets(raw):
            where = f"{f.relative_to(REPO)}:{path}"
            if key == "kernel":
                assert f.parent.name == "bench", where
                wl = validate(compose_cfg(bench=f.stem))  # the kernel's arguments come from its workload
                obj = resolve_kernel(value, where, kwargs=tuple(wl.kernel_kwargs(None)))
                assert obj.__module__.startswith("kbframe.kernels.")
            elif ".units." in f".{path}":
                assert issubclass(resolve_unit_class(value, where), (Unit, Tcm)) or value.endswith(("PeCpu",
                                                                                                 "PeScheduler"))
            elif path.startswith("hydra.callbacks."):
                assert issubclass(resolve_class(value, Callback, where), Callback)
            elif path == "_target_" and f.parent.name == "bench":
                assert issubclass(resolve_class(value, Workload, where), Workload)
            else:
                pytest.fail(f"{where}: a _target_ of a kind this test does not know: {value}")
            seen.append(value)
    benches = len(list((REPO / "conf" / "bench").glob("*.yaml")))
    assert "kbframe.kernels.gqa_decode.gqa_decode_opt2" in seen and "kbframe.hw.pe_gemm.GemmUnit" in seen
    assert "kbframe.cli.callbacks.SweepReport" in seen and "kbframe.workloads.gemm.Gemm" in seen
    assert len(seen) >= 2 * benches + 1 + 7  # each bench: a workload and a kernel; a callback; 7 units


@pytest.mark.parametrize("dotted, what", [
    ("kbframe.run.bench.np.save", "a built-in function of numpy"),          # a re-exported numpy function
    ("kbframe.run.rundir.os.makedirs", "a function defined in os"),          # a re-exported os function
    ("kbframe.sim.engine.simpy.Environment", "a class defined in simpy.core"),  # a re-exported class
    ("kbframe.hw.unit.Unit", "the abstract base kbframe.hw.unit.Unit"),     # the base itself
    ("kbframe.hw.unit.Stage", "a class defined in kbframe.hw.unit"),       # a kbframe.hw class, not a unit
    ("kbframe.run.bench.validate", "a function defined in kbframe.run.bench"),
])
def test_unit_kind_check_refuses(dotted, what):
    with pytest.raises(ConfigError) as e:
        resolve_unit_class(dotted, "hardware.units.x._target_")
    assert str(e.value) == f"hardware.units.x._target_ '{dotted}' is {what}, {UNIT_RULE}"


@pytest.mark.parametrize("dotted, what", [
    ("kbframe.run.rundir.os.system", "a built-in function of posix"),
    ("kbframe.run.bench.np.save", "a built-in function of numpy"),
    ("kbframe.run.bench.validate", "a function defined in kbframe.run.bench"),  # kbframe, but not a kernel
    ("kbframe.kernels.kernel", "a function defined in kbframe.kernels"),        # the decorator itself
    ("kbframe.hw.pe_math.MathUnit", "a class defined in kbframe.hw.pe_math"),
    ("kbframe.kernels.gqa_decode", "the module kbframe.kernels.gqa_decode"),
])
def test_kernel_kind_check_refuses(dotted, what):
    with pytest.raises(ConfigError) as e:
        resolve_kernel(dotted)
    assert str(e.value) == f"bench.kernel '{dotted}' is {what}, {KERNEL_RULE}"


@pytest.mark.parametrize("dotted, what", [
    ("kbframe.cli.callbacks.Callback", "a class defined in hydra.experimental.callback"),  # the base, re-exported
    ("kbframe.run.bench.np.ndarray", "a class defined in numpy"),
    ("kbframe.cli.callbacks.sys.exit", "a built-in function of sys"),
])
def test_class_kind_check_refuses(dotted, what):
    with pytest.raises(ConfigError) as e:
        resolve_class(dotted, Callback, "hydra.callbacks.x._target_")
    assert str(e.value) == (f"hydra.callbacks.x._target_ '{dotted}' is {what}, not a concrete subclass of "
                            f"hydra.experimental.callback.Callback defined in kbframe")
    assert resolve_class("kbframe.cli.callbacks.SweepReport", Callback, "k") is SweepReport


@pytest.mark.parametrize("dotted, msg", [
    ("kbframe.__main__.x", "is not a dotted name of public parts"),       # importing it would run the CLI
    ("kbframe.kernels.gqa_decode._tiles", "is not a dotted name of public parts"),
    ("kbframe..x", "is not a dotted name of public parts"),
    ("os.system", "is outside the kbframe. namespace; set hardware.allow_external_targets=true to allow it"),
])
def test_names_checked_before_import(dotted, msg):
    for resolve in (resolve_kernel, lambda d, k: resolve_unit_class(d, k), lambda d, k: resolve_class(d, Unit, k)):
        with pytest.raises(ConfigError) as e:
            resolve(dotted, "k")
        assert str(e.value) == f"k '{dotted}' {msg}" + ("" if "namespace" in msg else
                                                       " (letters, digits and _, no part starting with _)")


def test_allow_external_widens_modules_not_kinds():
    assert resolve_unit_class("test_targets.ToyUnit", "k", allow_external=True) is ToyUnit
    assert resolve_kernel("test_targets.toy_kernel", "k", allow_external=True, kwargs=KWARGS) is toy_kernel
    with pytest.raises(ConfigError, match="is outside the kbframe. namespace"):
        resolve_unit_class("test_targets.ToyUnit", "k")
    for bad, resolve in (("builtins.dict", resolve_unit_class), ("os.system", resolve_kernel),
                         ("test_targets.unregistered", resolve_kernel), ("subprocess.Popen", resolve_unit_class)):
        with pytest.raises(ConfigError, match=r"^k '[\w.]+' is .*, not a (unit class|kernel) \("):
            resolve(bad, "k", allow_external=True)


def test_kernel_mark_and_signature():
    assert getattr(toy_kernel, KERNEL_MARK) is True and kbframe.kernels.KERNELS["test_targets.toy_kernel"] is toy_kernel
    assert resolve_kernel("kbframe.kernels.gqa_decode.gqa_decode_opt2", kwargs=KWARGS) is gqa_decode_opt2
    with pytest.raises(ConfigError) as e:
        resolve_kernel("kbframe.kernels.gqa_decode.gqa_decode_opt2", kwargs=("G", "rows"))
    assert str(e.value) == ("bench.kernel 'kbframe.kernels.gqa_decode.gqa_decode_opt2' cannot be called as "
                            "kernel(tl, G, rows): missing a required argument: 'd'")


def test_refused_target_runs_nothing(tmp_path):
    """A unit _target_ reaching np.save through a
    re-export must not write its file (it is refused before anything is instantiated)."""
    target = tmp_path / "x.npy"
    cfg = compose_cfg(f"+hardware.units.zz={{_target_:kbframe.run.bench.np.save,file:{target},arr:[1,2,3]}}",
                      "+hardware.units.yy={_target_:kbframe.run.rundir.os.makedirs,name:" + str(tmp_path / "d") + "}",
                      "run.progress=false", "bench.S_kv=64")
    with pytest.raises(ConfigError, match="is a built-in function of numpy, not a unit class"):
        run_bench(cfg, tmp_path / "run")
    assert not target.exists() and not (tmp_path / "d").exists() and not (tmp_path / "run").exists()


def test_partial_unit_refused():
    cfg = compose_cfg("+hardware.units.math._partial_=true")
    with pytest.raises(ConfigError) as e:
        build_units(cfg.hardware)
    assert str(e.value) == "hardware.units.math._partial_ is not supported: a unit is built, not a partial"
