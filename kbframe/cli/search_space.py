"""Conditional parameters of a design-space search (issue 15), for Hydra's Optuna sweeper.

``hydra.sweeper.params`` holds the parameters every trial samples. Some only mean something
for one choice of another: decode_opt2's S-buffer count and V staging do not exist in
decode_opt3. ``search.when`` maps a condition ``KEY=VALUE`` (a parameter of
``hydra.sweeper.params`` and one of its values) to parameters sampled only in trials that
chose that value, written as in ``hydra.sweeper.params``::

    search:
      when:
        +bench=decode_opt2:
          ++bench.s_buffers: choice(2, 3, 4)

The sweeper calls :func:`conditional` once per trial (``hydra.sweeper.custom_search_space``).
"""
from __future__ import annotations

from ..errors import ConfigError


def conditional(cfg, trial) -> None:
    """Sample the ``search.when`` parameters whose condition the trial meets.

    Raises:
        ConfigError: a condition is not ``KEY=VALUE`` or names no parameter of the search.
    """
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
    from optuna.distributions import CategoricalDistribution

    when = (cfg.get("search") or {}).get("when") or {}
    for cond, params in when.items():
        key, eq, want = str(cond).partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"search.when: cannot parse condition '{cond}'; write KEY=VALUE, e.g. +bench=decode_opt2")
        if key not in trial.params:
            raise ConfigError(f"search.when: condition '{cond}' names '{key}', which is not a parameter of "
                              f"hydra.sweeper.params ({', '.join(trial.params) or 'none'})")
        if str(trial.params[key]) != want:
            continue
        dists, fixed = create_params_from_overrides([f"{k}={v}" for k, v in (params or {}).items()])
        for name, value in fixed.items():  # a plain value: a choice of one
            dists[name] = CategoricalDistribution([value])
        for name, dist in dists.items():
            trial._suggest(name, dist)  # how the sweeper samples hydra.sweeper.params itself
