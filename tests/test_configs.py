"""Every config in conf/ composes and its hardware units instantiate (lightning-hydra-template
style); ``_target_``s outside ``kbframe.`` are refused unless explicitly allowed, and by
kind always (tests/test_targets.py)."""
import itertools

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from kbframe.run.bench import validate
from kbframe.sim.engine import build_units
from kbframe.errors import ConfigError
from kbframe.hw.pe_cpu import PeCpu
from kbframe.hw.pe_dma import DmaChannel
from kbframe.hw.pe_gemm import GemmUnit
from kbframe.hw.pe_math import MathUnit
from kbframe.hw.pe_scheduler import PeScheduler
from kbframe.hw.tcm import Tcm

from conftest import REPO, compose_cfg

CONF = REPO / "conf"


def _names(group):
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


COMBOS = list(itertools.product(_names("bench"), _names("hardware"), _names("calibration")))


def test_conf_groups_are_not_empty():
    assert {"decode_opt2", "decode_opt3"} <= set(_names("bench"))
    assert _names("hardware") and _names("calibration")
    assert {p.stem for p in (REPO / "recipes").glob("*.yaml")} >= {"softmax_merge"}


@pytest.mark.parametrize("bench, hardware, calibration", COMBOS)
def test_every_config_composes_and_instantiates(bench, hardware, calibration):
    cfg = compose_cfg(f"hardware={hardware}", f"calibration={calibration}", bench=bench)
    validate(cfg)
    assert cfg.bench.name == bench
    assert str(cfg.bench.kernel).startswith("kbframe.")
    units = build_units(cfg.hardware)
    for name, ucfg in cfg.hardware.units.items():
        assert type(units[name]).__module__ + "." + type(units[name]).__name__ == ucfg._target_
        assert ucfg.get("description"), f"hardware.units.{name} has no description"
    assert units["cpu"].fixed_cycles == cfg.calibration.FIXED
    assert units["cpu"].r_cycles_per_byte == cfg.calibration.R
    assert units["cpu"].composite_cap_bytes == cfg.calibration.cap_bytes
    assert units["tcm"].capacity_bytes == cfg.hardware.tcm_bytes


def test_default_hardware_values():
    """The issue's published figures: 1 GHz, 204.8 GB/s, 77 ns setup, 8 TFLOP/s, 16 MiB TCM at
    512 GB/s, FIXED 40, R 0.0625, cap 1024."""
    cfg = compose_cfg()
    u = build_units(cfg.hardware)
    assert isinstance(u["cpu"], PeCpu) and (u["cpu"].fixed_cycles, u["cpu"].r_cycles_per_byte,
                                            u["cpu"].composite_cap_bytes, u["cpu"].clock_ghz) == (40, 0.0625, 1024, 1)
    assert isinstance(u["scheduler"], PeScheduler)
    for ch in ("dma_read", "dma_write"):
        assert isinstance(u[ch], DmaChannel)
        assert (u[ch].bandwidth_gbps, u[ch].setup_ps) == (204.8, 77_000)
    assert isinstance(u["gemm"], GemmUnit) and (u["gemm"].peak_tflops, u["gemm"].operand_read_gbps) == (8.0, 512.0)
    assert isinstance(u["tcm"], Tcm) and (u["tcm"].capacity_bytes, u["tcm"].read_gbps, u["tcm"].write_gbps) == (
        16 * 1024 * 1024, 512.0, 512.0)
    assert isinstance(u["math"], MathUnit) and u["math"].vector_width == 64


def test_overrides_reach_the_units():
    cfg = compose_cfg("calibration.R=0.25", "calibration.FIXED=10", "hardware.hbm_gbps=100",
                      "hardware.tcm_bytes=1048576")
    u = build_units(cfg.hardware)
    assert (u["cpu"].fixed_cycles, u["cpu"].r_cycles_per_byte) == (10.0, 0.25)
    assert u["dma_read"].bandwidth_gbps == 100.0 and u["tcm"].capacity_bytes == 1048576


def test_sweep_configs_compose():
    """Each sweep config composes, and every value of each swept key composes and validates
    (points of its grid that between them take every value of every key)."""
    for name in _names("sweep"):
        with initialize_config_module(config_module="kbframe.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"+sweep={name}"], return_hydra_config=True)
            params = OmegaConf.to_container(cfg.hydra.sweeper.params)
        assert params, f"sweep {name} has no sweeper params"
        keys = list(params)
        values = [str(params[k]).split(",") for k in keys]
        for i in range(max(len(v) for v in values)):
            ov = [f"{k}={v[i % len(v)]}" for k, v in zip(keys, values)]
            validate(compose_cfg(f"+sweep={name}", *ov, bench=None))


def test_external_target_refused():
    cfg = compose_cfg("hardware.units.math._target_=collections.OrderedDict")
    with pytest.raises(ConfigError) as e:
        build_units(cfg.hardware)
    assert str(e.value) == ("hardware.units.math._target_ 'collections.OrderedDict' is outside the kbframe. "
                            "namespace; set hardware.allow_external_targets=true to allow it")


@pytest.mark.parametrize("override, where", [
    ("+hardware.units.gemm.description={_target_:pathlib.Path.touch,self:/tmp/kbframe_nested}",
     "hardware.units.gemm.description"),
    ("hardware.units.gemm.description=[{_target_:builtins.print}]", "hardware.units.gemm.description[0]"),
])
def test_nested_external_target_refused(override, where, tmp_path):
    # Hydra instantiates nested _target_ nodes too, so the guard walks the whole unit node
    cfg = compose_cfg(override)
    with pytest.raises(ConfigError) as e:
        build_units(cfg.hardware)
    target = "pathlib.Path.touch" if "touch" in override else "builtins.print"
    assert str(e.value) == (f"{where}._target_ '{target}' is outside the kbframe. "
                            "namespace; set hardware.allow_external_targets=true to allow it")
    assert not __import__("os").path.exists("/tmp/kbframe_nested")


def test_external_target_allowed_when_opted_in():
    """The opt-in widens the module set (a unit class defined outside kbframe), never the
    kind: a class that is not a unit is still refused."""
    cfg = compose_cfg("hardware.units.math._target_=test_targets.ToyUnit", "hardware.allow_external_targets=true")
    units = build_units(cfg.hardware)
    assert type(units["math"]).__module__ == "test_targets" and units["math"].vector_width == 64
    cfg = compose_cfg("hardware.units.math._target_=collections.OrderedDict", "hardware.allow_external_targets=true")
    with pytest.raises(ConfigError) as e:
        build_units(cfg.hardware)
    assert str(e.value) == ("hardware.units.math._target_ 'collections.OrderedDict' is a class defined in "
                            "collections, not a unit class (a concrete class that subclasses kbframe.hw.unit.Unit, "
                            "or PeCpu, PeScheduler or Tcm)")


def test_bad_unit_parameter_names_the_unit():
    cfg = compose_cfg("hardware.units.math.vector_width=0")
    with pytest.raises(ConfigError) as e:
        build_units(cfg.hardware)
    assert str(e.value) == "hardware.units.math.vector_width must be ≥ 1, got 0"


def test_recipes_are_in_the_composed_config():
    cfg = compose_cfg()
    r = cfg.recipes.softmax_merge
    assert OmegaConf.to_container(r.operands) == {"s": "R", "m": "RW", "l": "RW", "O": "RW"}
    assert [s.op for s in r.engine_seq] == ["rmax", "max_elem", "exp_diff", "exp_diff", "rsum", "fma",
                                           "mul_bcast", "copy"]
