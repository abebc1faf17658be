"""The libraries' private names kbframe still uses, each in one place with the reason no
public one does; ``tests/test_internals.py`` fails when a library changes one of them.

Everything else kbframe calls of Hydra, Optuna, SimPy and OmegaConf is public (``Event.value``,
``Trial.suggest_*``, ``hydra.core.utils.run_job`` ...). Each name below is reached only
through this module, imported when called (nothing here costs a command's start).
"""
from __future__ import annotations

#: private name -> why kbframe uses it (the tests check each one still exists and behaves)
KEPT = {
    "hydra._internal.hydra.Hydra.get_mode":
        "kbframe.cli.speed.one_compose: Hydra composes the whole config once only to learn "
        "hydra.mode; no public switch skips it when the command line cannot set the mode",
    "atexit._run_exitfuncs":
        "kbframe.cli.speed.exit_now: the atexit handlers (launcher pools, logging) run before "
        "os._exit, which skips freeing a long run's arrays; atexit has no public call for it",
    "omegaconf.DictConfig._get_node, omegaconf.ListConfig._iter_ex":
        "kbframe.sim.engine.unit_classes: every _target_ under hardware.units is checked on the "
        "node as written, its interpolations unresolved (resolving one could run a resolver "
        "first); OmegaConf's public access resolves",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper":
        "kbframe.report.sweep_jobs.sweep_plan: a sweep's job plan expanded from multirun.yaml "
        "exactly as the basic sweeper expanded it (split_arguments)",
    "hydra_plugins.hydra_optuna_sweeper._impl.create_params_from_overrides":
        "kbframe.cli.search_space: search.when parameters parsed as the Optuna sweeper parses "
        "hydra.sweeper.params (interval(), choice(), range() ...), the same distributions",
}


def hydra_class():
    """Hydra's ``Hydra`` class (its ``get_mode``: :data:`KEPT`)."""
    from hydra._internal.hydra import Hydra
    return Hydra


def run_exitfuncs() -> None:
    """Run and clear the atexit handlers now (:data:`KEPT`)."""
    import atexit
    atexit._run_exitfuncs()


def node(cfg, key):
    """``cfg``'s child node ``key``, its interpolation unresolved (:data:`KEPT`)."""
    return cfg._get_node(key)


def list_nodes(cfg):
    """A ListConfig's child nodes, interpolations unresolved (:data:`KEPT`)."""
    return cfg._iter_ex(resolve=False)


def basic_sweeper():
    """Hydra's BasicSweeper class (its ``split_arguments``: :data:`KEPT`)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    return BasicSweeper


def optuna_params_from_overrides():
    """The Optuna sweeper's parser of its ``params`` (:data:`KEPT`)."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
    return create_params_from_overrides
