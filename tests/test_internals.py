"""The libraries' private names kbframe keeps (kbframe.internals.KEPT): each still exists
and behaves as kbframe relies on; a library release that changes one fails here."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
from omegaconf import ListConfig, Node, OmegaConf

from kbframe import internals


def test_every_kept_name_has_a_test_here():
    assert len(internals.KEPT) == 5


def test_hydra_get_mode_takes_the_config_name_and_overrides():
    params = list(inspect.signature(internals.hydra_class().get_mode).parameters)
    assert params[:3] == ["self", "config_name", "overrides"]


def test_run_exitfuncs_runs_the_handlers_once():
    code = ("import atexit; from kbframe.internals import run_exitfuncs\n"
            "atexit.register(print, 'ran')\nrun_exitfuncs()\nprint('after')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (0, "ran\nafter\n", "")


def test_omegaconf_nodes_come_unresolved():
    cfg = OmegaConf.create({"u": {"_target_": "${nope}", "sub": {"x": 1}}, "l": ["${nope}", {"y": 2}]})
    n = internals.node(cfg.u, "_target_")
    assert isinstance(n, Node) and OmegaConf.is_interpolation(cfg.u, "_target_")
    assert OmegaConf.is_dict(internals.node(cfg.u, "sub"))
    kids = list(internals.list_nodes(cfg.l))  # no resolution: ${nope} does not raise
    assert kids[0] == "${nope}" and OmegaConf.is_dict(kids[1])
    assert isinstance(cfg.l, ListConfig)


def test_basic_sweeper_splits_a_sweep_as_hydra_does():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    overrides = OverridesParser.create().parse_overrides(["a=1,2", "b=x"])
    assert internals.basic_sweeper().split_arguments(overrides, None) == [[["a=1", "b=x"], ["a=2", "b=x"]]]


PARAMS = ["f=interval(0.5, 1)", "g=tag(log, interval(1, 8))", "i=range(1, 9, step=2)", "c=choice(16, 32)", "z=3"]


def test_optuna_sweeper_parses_its_params():
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from optuna.distributions import CategoricalDistribution
    dists, fixed = internals.optuna_params_from_overrides()(PARAMS)
    assert sorted(dists) == ["c", "f", "g", "i"] and fixed == {"z": "3"}
    assert (dists["f"].low, dists["f"].high, dists["g"].low, dists["g"].high) == (0.5, 1.0, 1.0, 8.0)
    assert (dists["i"].low, dists["i"].step) == (1, 2)
    assert isinstance(dists["c"], CategoricalDistribution) and tuple(dists["c"].choices) == (16, 32)


def test_conditional_parameters_are_sampled_through_optunas_public_calls():
    """kbframe.cli.search_space._suggest: each parameter gets the distribution the sweeper
    parsed, sampled through the trial's public calls."""
    optuna = pytest.importorskip("optuna")
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from kbframe.cli.search_space import _suggest
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists, _ = internals.optuna_params_from_overrides()(PARAMS)
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1)).ask()
    for name, dist in dists.items():
        _suggest(trial, name, dist)
    assert trial.distributions == dists
