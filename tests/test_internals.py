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
    assert len(internals.KEPT) == 13


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


def _tree(tmp_path):
    """A config tree: config.yaml whose defaults list has a group entry, a config entry and
    _self_; g/x.yaml."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "x.yaml").write_text("a: 1\n")
    (tmp_path / "config.yaml").write_text("defaults:\n  - /g@p: x\n  - g/x@q\n  - _self_\nb: 2\n")
    return tmp_path


def _spy(monkeypatch, cls, name, seen):
    original = getattr(cls, name)

    def spy(self, *args, **kwargs):
        seen.append((name, args[0] if args else kwargs.get("config_path", kwargs.get("config_name"))))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(cls, name, spy)


def test_hydra_composes_through_load_configuration_and_reads_every_file_through_load_config(tmp_path, monkeypatch):
    """kbframe.cli.hydra_guard.install wraps both: each composition passes the first, and
    every config file (the primary one and each of its defaults) the second, whose result
    holds the file's parsed defaults list."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.default_element import ConfigDefault, GroupDefault
    seen = []
    loader_cls, repo_cls = internals.config_loader_class(), internals.config_repository_class()
    assert list(inspect.signature(loader_cls.load_configuration).parameters)[:4] == [
        "self", "config_name", "overrides", "run_mode"]
    _spy(monkeypatch, loader_cls, "load_configuration", seen)
    _spy(monkeypatch, repo_cls, "load_config", seen)
    results = []
    original = repo_cls.load_config
    monkeypatch.setattr(repo_cls, "load_config",
                        lambda self, config_path: results.append(original(self, config_path)) or results[-1])
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(_tree(tmp_path)), version_base="1.3"):
        cfg = compose(config_name="config")
    assert cfg == {"p": {"a": 1}, "q": {"a": 1}, "b": 2}
    assert ("load_configuration", "config") in seen
    assert {"config", "g/x"} <= {n for k, n in seen if k == "load_config"}
    res = next(r for r in results if r is not None and r.path == f"file://{tmp_path}" and r.defaults_list
               and any(isinstance(d, GroupDefault) for d in r.defaults_list))
    group, config = res.defaults_list[0], res.defaults_list[1]
    assert isinstance(group, GroupDefault) and (group.group, group.package, group.value) == ("/g", "p", "x")
    assert isinstance(config, ConfigDefault) and (config.path, config.package) == ("g/x", "q")


def test_hydra_makes_its_config_sources_through_initialize_sources(tmp_path):
    """kbframe.cli.hydra_guard.install wraps it: every search path entry passes through it,
    a ConfigSearchPath whose get_path() holds them, before any source is made of them
    (hydra.searchpath's entries too: tests/test_security.py)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    repo_cls = internals.config_repository_class()
    seen = []
    original = repo_cls.initialize_sources

    def spy(self, config_search_path):
        seen.append([str(sp.path) for sp in config_search_path.get_path()])
        return original(self, config_search_path)
    repo_cls.initialize_sources = spy
    try:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(_tree(tmp_path)), version_base="1.3"):
            compose(config_name="config")
    finally:
        repo_cls.initialize_sources = original
    assert sorted(seen[-1]) == sorted([str(tmp_path), "pkg://hydra.conf", "structured://"])


def test_defaults_list_gives_the_configs_and_the_repository_that_read_them(tmp_path):
    """kbframe.cli.hydra_guard.source_of: the defaults list in merge order, each with its
    config_path and package, and the repository that reads each file back."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(_tree(tmp_path)), version_base="1.3"):
        dl, repo = internals.defaults_list(GlobalHydra.instance().config_loader(), "config", [], RunMode.RUN)
    mine = [(d.config_path, d.package) for d in dl.defaults if d.config_path in ("g/x", "config")]
    assert mine == [("g/x", "p"), ("g/x", "q"), ("config", "")]
    res = repo.load_config("g/x")
    assert res.path == f"file://{tmp_path}" and OmegaConf.to_container(res.config) == {"a": 1}


def test_hydras_single_run_and_basic_launcher_call_the_run_job_they_imported():
    """kbframe.cli.job_dirs.install wraps hydra.core.utils.run_job where these modules hold
    it: each still imports it by that name, and after install calls the wrapper."""
    code = ("import hydra.core.utils as hu, hydra._internal.hydra as h, "
            "hydra._internal.core_plugins.basic_launcher as b\n"
            "assert h.run_job is hu.run_job and b.run_job is hu.run_job\n"
            "import inspect\noriginal = hu.run_job\nprint(list(inspect.signature(original).parameters))\n"
            "from kbframe.cli import job_dirs\njob_dirs.install()\n"
            "assert h.run_job.__kbframe_dirs__ and b.run_job is h.run_job is hu.run_job\n"
            "assert h.run_job.__wrapped__ is original\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[0] == str(["task_function", "config", "job_dir_key", "job_subdir_key",
                                          "hydra_context", "configure_logging"])


def test_omegaconf_resolves_through_the_three_container_methods():
    """Each ${key}, resolver call and parsed string goes through the methods
    kbframe.yaml_values counts (kbframe.internals.omegaconf_container_class)."""
    container = internals.omegaconf_container_class()
    names = ("_resolve_node_interpolation", "_evaluate_custom_resolver", "resolve_parse_tree")
    seen = []
    saved = {n: getattr(container, n) for n in names}

    def spy(name):
        def f(self, *a, **k):
            seen.append(name)
            return saved[name](self, *a, **k)
        return f
    try:
        for n in names:
            setattr(container, n, spy(n))
        cfg = OmegaConf.create({"a": 1, "b": "${a}", "c": "x${oc.decode:'2'}"})
        assert (cfg.b, cfg.c) == (1, "x2")
    finally:
        for n in names:
            setattr(container, n, saved[n])
    assert seen == ["resolve_parse_tree", "_resolve_node_interpolation", "resolve_parse_tree",
                    "_evaluate_custom_resolver", "resolve_parse_tree"]


def test_hydra_applies_overrides_and_loads_configs_through_the_wrapped_methods():
    loader = internals.config_loader_class()
    for name in ("_apply_overrides_to_config", "_load_single_config"):
        assert callable(getattr(loader, name))
    assert list(inspect.signature(loader._load_single_config).parameters) == ["self", "default", "repo"]
    assert list(inspect.signature(loader._apply_overrides_to_config).parameters)[:2] == ["overrides", "cfg"]
