"""``python -m kbframe +bench=NAME [overrides]``: run a bench and report it.

A user mistake is printed as one line ``kbframe: error: ...`` and exits with status 1; no
traceback (DESIGN.md decision 6). Every run writes ``status.json``; in a ``-m`` sweep a
failed job is recorded and the others go on, and the sweep exits non-zero at the end
(kbframe.run.jobstatus, kbframe.cli.callbacks). Hydra's own composition errors (wrong types, unknown
keys, unknown bench) are Hydra's messages, which name the key and list the options.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import callbacks, checks, hydra_errors, hydra_guard, job_dirs, speed, stop

from ..run import schema
from ..run.bench import run_bench
from ..run.metrics import summary
from ..errors import ConfigError
from ..run.jobstatus import JobStatus
from ..report.search import Search

schema.register()
hydra_guard.install()
job_dirs.install()


def _available_benches() -> list[str]:
    conf = Path(__file__).resolve().parents[1] / "conf" / "bench"
    return sorted(p.stem for p in conf.glob("*.yaml"))


def _explicit_keys(overrides) -> set:
    """Config keys the user set on the command line (``bench.tile=128``, ``++bench.tile=128``)."""
    keys = set()
    for ov in overrides:
        key = str(ov).split("=", 1)[0].lstrip("+~")
        if "=" in str(ov) and not key.startswith("hydra"):
            keys.add(key)
    return keys


def presets_after_bench(argv: list[str]) -> list[str]:
    """``argv`` with every ``+model=...`` moved after the last ``+bench=...``.

    Hydra merges appended config groups in command-line order, so a model preset (``# @package
    bench``, ``conf/model/``) given before the bench would be overwritten by the bench's own
    defaults without a word; a preset applies whatever the order."""
    is_bench = [a.startswith("+bench=") for a in argv]
    if True not in is_bench:
        return list(argv)
    last = len(argv) - 1 - is_bench[::-1].index(True)
    early = [a for a in argv[:last] if a.startswith("+model=")]
    if not early:
        return list(argv)
    rest = [a for a in argv[:last + 1] if not a.startswith("+model=")]
    return rest + early + list(argv[last + 1:])


@hydra.main(version_base="1.3", config_path="pkg://kbframe.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> dict:
    hydra_errors.release()  # Hydra composed the config: stderr is ours again
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    # status.json in out_dir; a job of a -m sweep that fails is recorded and the sweep goes
    # on (kbframe.run.jobstatus); a single run exits 1 with one line
    search = outcome = None
    with JobStatus.from_hydra() as job:
        job.proceed()  # a locked or unwritable run directory: one line, nothing touched
        stop.raise_if_stopped()  # a signal whose interrupt a library swallowed while Hydra composed
        search = Search.from_config(cfg.get("search"))
        checks.check_composed_recipes()
        if "bench" not in cfg:
            raise ConfigError(f"no bench selected; add +bench=NAME "
                              f"(available: {', '.join(_available_benches())})")
        checks.check_config(cfg)
        # the override text as typed: resolving it here (outside the config) could fail
        typed = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
        metrics = run_bench(cfg, out_dir, _explicit_keys(typed))
        if search is not None:
            outcome = search.evaluate(metrics)
    if job.ok:
        try:  # the run is done and recorded ok; a closed pipe (`| head`) must not fail it
            print(summary(metrics, out_dir), flush=True)
            if outcome is not None:
                print(f"  search      {', '.join(f'{o} {v:.10g}' for o, v in zip(search.objectives, outcome.values))}: "
                      + ("feasible" if outcome.feasible else "infeasible: " + "; ".join(outcome.violations)),
                      flush=True)
        except BrokenPipeError:
            sys.stdout = open(os.devnull, "w")
    # a design-space search gets its objectives back; a failed or infeasible
    # trial gets the worst values, so the search goes on
    return search.sweeper_value(outcome if job.ok else None) if search is not None else job.status


def _use_kbframe_joblib_launcher() -> None:
    """``hydra/launcher=joblib`` selects kbframe's joblib launcher (kbframe.cli.launcher: a
    killed job fails alone). Hydra registers the plugin's config when it scans its plugins,
    so the scan is done first and the entry then replaced."""
    try:
        from hydra.core.config_store import ConfigStore
        from hydra.core.plugins import Plugins
        from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
    except ImportError:  # the joblib extra is not installed
        return
    Plugins.instance()
    node = dataclasses.make_dataclass("KbframeJoblibLauncherConf", [
        ("_target_", str, dataclasses.field(default="hydra_plugins.kbframe_launcher.KbframeJoblibLauncher"))],
        bases=(JobLibLauncherConf,))
    ConfigStore.instance().store(group="hydra/launcher", name="joblib", node=node, provider="kbframe")


def _quiet_alembic() -> None:
    """The Optuna sweeper's imports log at INFO through Hydra's handler (alembic's "setup
    plugin ..." lines, on every command, when Hydra scans its plugins); warnings still show.
    Optuna's own logger is quieted where a search starts (kbframe.cli.search_space)."""
    import logging
    logging.getLogger("alembic").setLevel(logging.WARNING)


def main() -> None:
    """``python -m kbframe`` / the ``kbframe`` script: Hydra's main, with Hydra's own
    composition errors (unknown bench, wrong type ...) folded into one line
    (kbframe.cli.hydra_errors). ``--help`` / ``-h`` prints kbframe's own help (kbframe.cli.help)."""
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        from .help import text
        print(text())
        return
    stop.reset()
    _quiet_alembic()
    _use_kbframe_joblib_launcher()
    sys.argv[1:] = presets_after_bench(sys.argv[1:])
    try:
        with speed.one_compose(sys.argv[1:]):
            hydra_errors.run(_hydra_main)
    except BaseException as e:  # Ctrl-C outside a run, or what unwinding from one raised (kbframe.cli.stop)
        if isinstance(e, KeyboardInterrupt):
            stop.interrupted(e)
        if not stop.stopped():
            raise
        raise SystemExit(_stopped()) from None
    finally:
        checks.remove_unused_run_dir()
    if stop.stopped():  # the signal came as the command ended
        raise SystemExit(_stopped())


def _stopped() -> int:
    """kbframe.cli.stop.finish for this command: its sweep, and the job Hydra started last
    (or, before Hydra got that far, the run directory the command line names)."""
    job_dir, started = callbacks.last_job()
    key, named = checks.run_dir_arg(sys.argv[1:])
    if job_dir is None and key == "hydra.run.dir" and named and "${" not in named and stop.hydra_began(named):
        job_dir, started = named, stop.started_at
    return stop.finish(callbacks.running_sweep(), job_dir, started)


def entry() -> None:
    """:func:`main` with Ctrl-C and SIGTERM handled, then a fast exit (kbframe.cli.stop,
    kbframe.cli.speed)."""
    stop.install()
    speed.main_then_exit(main)


if __name__ == "__main__":
    main()
