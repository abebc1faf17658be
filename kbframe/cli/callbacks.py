"""Hydra callback that turns a finished ``-m`` sweep into its report.

Registered in ``conf/config.yaml`` under ``hydra.callbacks``. ``on_multirun_end`` runs in
the launching process once every job has returned (with the joblib or submitit launchers
the jobs ran elsewhere; everything is read back from the job directories), writes
``sweep.csv``, ``summary.md`` and ``sweep.png`` at the sweep root
(:mod:`kbframe.report.sweep`), prints the summary, lists every job that is not ok on stderr and
then raises ``SystemExit(1)`` so the command exits non-zero. Hydra's callback runner turns
an ``Exception`` from a callback into a warning, but lets ``SystemExit`` through.

A sweep stopped by Ctrl-C never reaches ``on_multirun_end``; summarise what it left with
``python -m kbframe.report DIR``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ..errors import KbframeError
from . import stop


def _release_stderr() -> None:
    """kbframe.cli.hydra_errors holds stderr back until a task function starts in this process;
    with the joblib or submitit launchers none does, so hand stderr back before reporting
    (else the list of failed jobs would be folded into one line)."""
    try:
        from .hydra_errors import release
    except ImportError:
        return
    release()


def _remove_submitit_placeholder(sweep_dir: Path) -> None:
    """submitit creates its folder pattern ``.submitit/%j`` literally (empty) besides the
    per-job folders it fills; remove such empty placeholders."""
    sub = sweep_dir / ".submitit"
    if sub.is_dir():
        for d in sub.iterdir():
            if "%" in d.name and d.is_dir() and not any(d.iterdir()):
                d.rmdir()


_SWEEP_LOCKS: dict = {}  # sweep dir -> its held lock, for this launching process


def running_sweep() -> str | None:
    """The directory of the sweep this process launches, from its start on (also once it
    ended: a signal during its report still names it), else None: what a Ctrl-C or
    SIGTERM names (kbframe.cli.main)."""
    return next(iter(_SWEEP_LOCKS), None) or stop.launched_sweep()


_LAST_JOB: list = [None, None]  # [directory, start time] of the job Hydra started last here


def last_job() -> tuple:
    """``(directory, start time)`` of the job Hydra started last in this process (its
    ``.hydra/`` written), else ``(None, None)``: what an interrupt before the job recorded
    itself marks ``interrupted`` (kbframe.cli.stop)."""
    return tuple(_LAST_JOB)


def _fail(msg: str) -> None:
    _release_stderr()
    print(f"kbframe: error: {msg}", file=sys.stderr)
    raise SystemExit(1)


def _check_twice_set(config: DictConfig) -> None:
    """Refuse a grid sweep whose jobs would each set one key twice (kbframe.report.sweep_jobs.
    twice_set): every job would run the later value under a label naming the earlier."""
    from ..report.sweep_jobs import sweep_overrides, twice_set
    try:
        both = twice_set(sweep_overrides(config.hydra) or [])
        if both is None:
            return
        first, second = (o.input_line or o.get_key_element() for o in both)
        key = both[1].key_or_group
    except Exception:  # noqa: BLE001 (an override Hydra cannot parse: its sweeper says why)
        return
    _fail(f"{first} and {second} both set {key} in every job: each would run the second under a label naming the "
          f"first; to narrow a sweep config's values give {key}=VALUES as it writes them (no + or ++; a key of a "
          f"group the sweep adds needs that group on the command line too, e.g. +bench=NAME)")


def _check_empty(config: DictConfig) -> None:
    """Refuse a grid sweep one of whose swept keys has no value (``range(64,0)``): it would
    run no job and report an empty sweep as a success."""
    from ..report.sweep_jobs import sweep_overrides
    try:
        empty = [o for o in sweep_overrides(config.hydra) or []
                 if o.is_discrete_sweep() and not list(o.sweep_string_iterator())]
    except Exception:  # noqa: BLE001 (an override Hydra cannot parse: its sweeper says why)
        return
    if empty:
        _fail(f"{empty[0].input_line or empty[0].get_key_element()} sweeps no value: the sweep would run no job; "
              f"give it at least one")


class SweepReport(Callback):
    """Aggregate the sweep at its end; exit 1 if any job is not ok.

    Args:
        enabled: set ``hydra.callbacks.sweep_report.enabled=false`` to skip the report.
        reuse_dir: allow a ``hydra.sweep.dir`` that holds an earlier sweep's jobs (the
            report lists the jobs of this sweep's plan only); refused by default.
        x: the swept key on sweep.png's x-axis (``hydra.callbacks.sweep_report.x=bench.tile``);
            default: :func:`kbframe.report.sweep.x_key`'s choice.
    """

    def __init__(self, enabled: bool = True, reuse_dir: bool = False, x: str | None = None) -> None:
        self.enabled = enabled
        self.reuse_dir = reuse_dir
        self.x = x

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """:meth:`_start`, where an error that is not a refusal stops the sweep too: Hydra
        would only warn of it and run the sweep with the checks after it skipped."""
        try:
            self._start(config)
        except (KbframeError, SystemExit, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 (one line, whatever raised it)
            key = getattr(e, "full_key", None)
            why = (str(getattr(e, "msg", None) or e).strip().splitlines() or [type(e).__name__])[0]
            if key and type(e).__module__ == "omegaconf.errors":
                _fail(f"{key}: cannot resolve: {why}")
            _fail(f"{key}: {why}" if key else f"the sweep cannot start: {type(e).__name__}: {why}")

    def _start(self, config: DictConfig) -> None:
        """Before Hydra writes the sweep's ``multirun.yaml``: check a design-space search
        whole (kbframe.cli.search_space.check_sweep), lock the sweep directory for the
        sweep, and refuse one that holds another sweep's jobs (its report would mix them
        in) unless ``hydra.callbacks.sweep_report.reuse_dir=true`` (a grid sweep only), one
        with a symbolic link where the sweep writes a file (``multirun.yaml``) and one
        holding files no kbframe run made (kbframe.run.rundir.check_foreign); a link
        inside a job's folder fails that job (kbframe.cli.job_dirs)."""
        from ..report.sweep_jobs import _job_dirs
        from ..run import rundir
        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:  # a search's objectives and constraints, before any trial runs or file is written
            from .search_space import check_sweep
            check_sweep(config)
        except KbframeError as e:
            _fail(str(e))
        _check_twice_set(config)
        _check_empty(config)
        if self.reuse_dir and "optuna" in str(config.hydra.sweeper.get("_target_", "")).lower():
            _fail("hydra.callbacks.sweep_report.reuse_dir=true is for grid sweeps: a search writes no job plan, "
                  "so its report could not tell its trials from an earlier sweep's; choose a new hydra.sweep.dir")
        try:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            lk = rundir.lock(sweep_dir)
            lk.__enter__()
            _SWEEP_LOCKS[str(sweep_dir)] = lk  # not on self: launchers pickle the callbacks
            stop.note_sweep(str(sweep_dir))
        except Exception as e:  # another sweep holds it, or it cannot be opened
            _fail(str(e).replace("run directory", "sweep directory").replace("hydra.run.dir", "hydra.sweep.dir"))
        try:  # a link where the sweep writes a file, another program's files (kbframe.run.rundir)
            rundir.check_sweep_links(sweep_dir)
            rundir.check_foreign(sweep_dir, sweep=True, key="hydra.sweep.dir")
        except KbframeError as e:
            _fail(str(e))
        # a multirun.yaml alone is a sweep Hydra refused before any job (a bad override):
        # no jobs to mix in, so the directory may be used again
        if not self.reuse_dir and _job_dirs(sweep_dir):
            if "optuna" in str(config.hydra.sweeper.get("_target_", "")).lower():
                _fail(f"the sweep directory '{sweep_dir}' holds another sweep's jobs (its job directories); a "
                      f"search always starts in a new directory: give a hydra.sweep.dir that does not exist yet "
                      f"(or leave it out for a new dated one)")
            _fail(f"the sweep directory '{sweep_dir}' holds another sweep's jobs (its job "
                  f"directories); choose a new hydra.sweep.dir, or reuse it with "
                  f"hydra.callbacks.sweep_report.reuse_dir=true (the report then lists this sweep's jobs only)")

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra wrote the job's ``.hydra/``: note the job (:func:`last_job`)."""
        from ..run.jobstatus import now
        _LAST_JOB[:] = [str(config.hydra.runtime.output_dir), now()]

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        _remove_submitit_placeholder(Path(str(config.hydra.sweep.dir)))
        try:
            self._report(config)
        finally:
            lk = _SWEEP_LOCKS.pop(str(config.hydra.sweep.dir), None)
            if lk is not None:
                lk.__exit__(None, None, None)

    def _report(self, config: DictConfig) -> None:
        if not self.enabled:
            return
        _release_stderr()
        from ..report.sweep import write_report
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            try:
                rep = write_report(sweep_dir, x=self.x)
            except ValueError as e:  # x is not a swept key: the report on the default axis, then the error
                rep = write_report(sweep_dir)
                print(f"kbframe: error: hydra.callbacks.sweep_report.{e} (sweep.png drawn on the default axis; "
                      f"python -m kbframe.report {sweep_dir} --x KEY redraws it)", file=sys.stderr)
                raise SystemExit(1) from None
        except Exception as e:  # a report bug must not pass for a green sweep
            print(f"kbframe: error: sweep report for {sweep_dir} failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
            raise SystemExit(1) from None
        sys.stdout.flush()
        if rep.not_ok:
            print(f"kbframe: {len(rep.not_ok)} of {len(rep.jobs)} jobs not ok:", file=sys.stderr)
            for j in rep.not_ok:
                print(f"  job {j.num} [{' '.join(j.overrides)}]: {j.status}"
                      + (f": {j.error}" if j.error else ""), file=sys.stderr)
            raise SystemExit(1)
        if rep.problem:
            print(f"kbframe: {rep.problem}", file=sys.stderr)
            raise SystemExit(1)
