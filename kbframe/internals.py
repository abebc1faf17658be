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
    "hydra._internal.config_loader_impl.ConfigLoaderImpl.load_configuration":
        "kbframe.cli.hydra_guard.install: every composed config (the run's, a sweep's, each job's) is "
        "checked after composition and before Hydra builds anything from it; Hydra has no public "
        "hook between the two (a callback runs after the logging and the callbacks are built)",
    "hydra._internal.config_repository.ConfigRepository.initialize_sources":
        "kbframe.cli.hydra_guard.install: each entry of the config search path is checked before "
        "Hydra makes a config source of it (a pkg:// or structured:// source imports its module); "
        "the search path is built and read within Hydra, with no public hook between",
    "hydra._internal.config_repository.ConfigRepository.load_config":
        "kbframe.cli.hydra_guard.install: each config file's defaults list is checked as Hydra reads "
        "the file (every group and choice a name in the config tree), before any entry is loaded; "
        "the composed config does not keep the defaults lists",
    "hydra._internal.config_loader_impl.ConfigLoaderImpl._parse_overrides_and_create_caching_repo, "
    "hydra._internal.defaults_list.create_defaults_list":
        "kbframe.cli.hydra_guard.source_of: the file a refused key was set in, found in the defaults "
        "list with the repository Hydra composed from (hydra.searchpath included); the public "
        "compute_defaults_list gives no repository to read the files back",
    "omegaconf.base.Container._resolve_node_interpolation, omegaconf.base.Container._evaluate_custom_resolver, "
    "omegaconf.base.Container.resolve_parse_tree":
        "kbframe.yaml_values.check_resolves: a config's interpolations are resolved once within a budget "
        "(each ${key}, resolver call and parsed string counted) before anything resolves them unchecked; "
        "a key or a resolver's argument may be computed as it resolves, and OmegaConf has no hook or limit",
    "hydra._internal.config_loader_impl.ConfigLoaderImpl._apply_overrides_to_config":
        "kbframe.cli.hydra_guard.install: the overrides applied one at a time, so one that adds a key "
        "below a null value (OmegaConf's AssertionError) is refused in one line naming it",
    "hydra._internal.config_loader_impl.ConfigLoaderImpl._load_single_config":
        "kbframe.cli.hydra_guard.install: each config counted as it is merged, each time a defaults list "
        "names it (Hydra's repository reads a file once and merges it per entry), before the next merge",
    "hydra._internal.hydra.run_job, hydra._internal.core_plugins.basic_launcher.run_job":
        "kbframe.cli.job_dirs.install: a run's directory is checked (links, another program's files) "
        "before Hydra writes into it; run_job is public, but the modules that call it imported it "
        "by name, so the wrapper is set where they hold it too; Hydra has no hook before run_job "
        "makes the directory",
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


def config_loader_class():
    """Hydra's ``ConfigLoaderImpl`` (its ``load_configuration``: :data:`KEPT`)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    return ConfigLoaderImpl


def config_repository_class():
    """Hydra's ``ConfigRepository`` (its ``load_config``, whose result holds the file's parsed
    ``defaults_list``: :data:`KEPT`)."""
    from hydra._internal.config_repository import ConfigRepository
    return ConfigRepository


def defaults_list(loader, config_name, overrides, run_mode):
    """``(defaults list, repository)`` of a composition: the configs in the order Hydra merged
    them (``.defaults``: each with ``config_path`` and ``package``) and the caching repository
    that read them (its ``load_config(path)``: the file's ConfigResult) (:data:`KEPT`)."""
    from hydra._internal.defaults_list import create_defaults_list
    from hydra.types import RunMode
    parsed, repo = loader._parse_overrides_and_create_caching_repo(config_name, list(overrides))
    dl = create_defaults_list(repo=repo, config_name=config_name, overrides_list=parsed, prepend_hydra=True,
                              skip_missing=run_mode == RunMode.MULTIRUN)
    return dl, repo


def omegaconf_container_class():
    """OmegaConf's ``Container`` (its resolution methods: :data:`KEPT`)."""
    from omegaconf.base import Container
    return Container
