"""Conditional parameters of a design-space search, for Hydra's Optuna sweeper.

``hydra.sweeper.params`` holds the parameters every trial samples. Some only mean something
for one choice of another: decode_opt2's S-buffer count and V staging do not exist in
decode_opt3. ``search.when`` maps a condition ``KEY=VALUE`` (a parameter of
``hydra.sweeper.params`` and one of its values) to parameters sampled only in trials that
chose that value, written as in ``hydra.sweeper.params``::

    search:
      when:
        +bench=decode_opt2:
          ++bench.s_buffers: choice(2, 3, 4)

The sweeper calls :func:`conditional` once per trial (``hydra.sweeper.custom_search_space``);
:func:`check_sweep` checks a search before any trial runs (the sweep callback's
``on_multirun_start``).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..report.search import Search
from ..yaml_values import check_resolves


def _param(key: str, value: str, where: str):
    """A sweep override's Optuna distribution, or its fixed value; ConfigError naming
    ``where`` when Hydra cannot parse it."""
    from ..internals import optuna_params_from_overrides
    create_params_from_overrides = optuna_params_from_overrides()
    if key.lstrip("+~").startswith("hydra"):
        raise ConfigError(f"{where}: a search samples config keys, not Hydra's own ({key})")
    try:
        dists, fixed = create_params_from_overrides([f"{key}={value}"])
    except Exception as e:  # noqa: BLE001 (Hydra's parser errors are many kinds)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{where}: cannot parse '{value}' ({first})") from None
    return dists[key] if key in dists else fixed[key]


def _choices(dist) -> list | None:
    return list(dist.choices) if hasattr(dist, "choices") else None


def check_sweep(config) -> None:
    """Check a design-space search before any trial runs: the ``search`` section, that the
    Optuna sweeper has objectives to minimise, ``n_trials`` and ``n_jobs`` ≥ 1,
    ``hydra.sweeper.direction`` equal to ``search.directions``, sweep parameters that are
    config keys (a ``hydra.*`` parameter could move a trial out of the sweep directory) and
    a well-formed ``search.when``. A grid sweep only gets its ``search`` section checked.
    First, the config's interpolations must resolve within the budgets of
    :func:`kbframe.yaml_values.check_resolves`.

    Raises:
        ConfigError: one line naming the key.
    """
    from omegaconf import OmegaConf
    check_resolves(config, skip=("hydra.overrides",))  # the overrides Hydra records are text
    search = Search.from_config(OmegaConf.to_container(config.search, resolve=True)
                                if config.get("search") is not None else None)
    sweeper = config.hydra.sweeper
    if "optuna" not in str(sweeper.get("_target_", "")).lower():
        return
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line per search
    if search is None:
        raise ConfigError("search.objectives: a search (Hydra's Optuna sweeper) needs at least one objective, "
                          "a metrics.json name such as sim.latency_ns")
    for key in ("n_trials", "n_jobs"):
        v = sweeper.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"hydra.sweeper.{key} must be ≥ 1, got {v}")
    direction = OmegaConf.to_container(sweeper, resolve=True).get("direction")
    names = [getattr(d, "name", d) for d in (direction if isinstance(direction, list) else [direction])]
    if names != list(search.directions):
        raise ConfigError(f"hydra.sweeper.direction {names} differs from search.directions "
                          f"{list(search.directions)}; set search.directions (hydra.sweeper.direction follows it)")
    params = {str(k): str(v) for k, v in (sweeper.get("params") or {}).items()}
    for k, v in params.items():
        _param(k, v, f"hydra.sweeper.params.{k}")
    task = {o.partition("=")[0]: o.partition("=")[2] for o in map(str, config.hydra.overrides.task) if "=" in o}
    when = OmegaConf.to_container(config.search, resolve=True).get("when") if "when" in config.search else None
    if when is None:
        return
    if not isinstance(when, dict):
        raise ConfigError(f"search.when: a mapping from KEY=VALUE conditions to parameters, not {when!r}")
    seen: dict = {}  # a conditional parameter -> (its first branch, what it is sampled from, distribution)
    for cond, body in when.items():
        key, eq, want = str(cond).partition("=")
        where = f"search.when.{cond}"
        if not eq or not key.strip() or not want:
            raise ConfigError(f"search.when: cannot parse condition '{cond}'; write KEY=VALUE, e.g. +bench=decode_opt2")
        if key in params:
            choices = _choices(_param(key, params[key], f"hydra.sweeper.params.{key}"))
            if choices is not None and want not in map(str, choices):
                raise ConfigError(f"{where}: '{want}' is not one of the values of {key} "
                                  f"({', '.join(map(str, choices))})")
        elif key not in task:
            raise ConfigError(f"{where}: '{key}' is not a parameter of hydra.sweeper.params "
                              f"({', '.join(params) or 'none'}) nor set on the command line")
        if not isinstance(body, dict) or not body:
            raise ConfigError(f"{where}: parameters to sample when {cond}, as in hydra.sweeper.params, "
                              f"not {body!r}")
        for k, v in body.items():
            if str(k) in params:
                raise ConfigError(f"{where}.{k}: already a parameter of hydra.sweeper.params; "
                                  f"a conditional parameter must be a key of its own")
            dist = _as_distribution(_param(str(k), str(v), f"{where}.{k}"))
            if str(k) in seen:
                first, first_v, first_dist = seen[str(k)]
                if not _compatible(first_dist, dist):
                    raise ConfigError(f"search.when: {k} is sampled from {first_v} in branch {first} and from {v} "
                                      f"in branch {cond}; Optuna keeps one value space per parameter for the whole "
                                      f"search: give it the same values in both branches")
            else:
                seen[str(k)] = (str(cond), str(v), dist)


def _as_distribution(param):
    """A parameter as :func:`conditional` samples it: its distribution, a fixed value as a
    choice of one."""
    from optuna.distributions import BaseDistribution, CategoricalDistribution
    return param if isinstance(param, BaseDistribution) else CategoricalDistribution([param])


def _compatible(a, b) -> bool:
    """Whether Optuna lets one parameter take distributions ``a`` and ``b`` in one study: the
    same kind, and the same choices for a categorical one (a float or int range may differ)."""
    from optuna.distributions import CategoricalDistribution
    if type(a) is not type(b):
        return False
    return not isinstance(a, CategoricalDistribution) or tuple(a.choices) == tuple(b.choices)


def conditional(cfg, trial) -> None:
    """Sample the ``search.when`` parameters whose condition the trial meets.

    :func:`check_sweep` has checked ``search.when`` before the first trial.
    """
    from ..internals import optuna_params_from_overrides
    create_params_from_overrides = optuna_params_from_overrides()
    from optuna.distributions import CategoricalDistribution

    when = (cfg.get("search") or {}).get("when") or {}
    for cond, params in when.items():
        key, _, want = str(cond).partition("=")
        # a sampled parameter, or one the command line fixed (the sweeper keeps those as
        # the trial's user attributes)
        value = trial.params[key] if key in trial.params else trial.user_attrs.get(key)
        if str(value) != want:
            continue
        dists, fixed = create_params_from_overrides([f"{k}={v}" for k, v in (params or {}).items()])
        for name, value in fixed.items():  # a plain value: a choice of one
            dists[name] = CategoricalDistribution([value])
        for name, dist in dists.items():
            _suggest(trial, name, dist)


def _suggest(trial, name: str, dist) -> None:
    """Sample ``dist`` for parameter ``name`` through Optuna's public ``suggest_*`` calls
    (each makes the same distribution again, so the sampling is the sweeper's own); the
    distribution classes of Optuna 2 (Uniform, LogUniform, DiscreteUniform, IntUniform,
    IntLogUniform) and 3 (Float, Int) alike."""
    from optuna.distributions import CategoricalDistribution, DiscreteUniformDistribution
    kind = type(dist).__name__
    log = bool(getattr(dist, "log", False)) or "Log" in kind
    if isinstance(dist, CategoricalDistribution):
        trial.suggest_categorical(name, list(dist.choices))
    elif kind.startswith("Int"):
        trial.suggest_int(name, dist.low, dist.high, step=getattr(dist, "step", 1), log=log)
    else:
        step = dist.q if isinstance(dist, DiscreteUniformDistribution) else getattr(dist, "step", None)
        trial.suggest_float(name, dist.low, dist.high, step=step, log=log)
