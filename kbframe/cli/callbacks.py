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


def _release_stderr() -> None:
    """kbframe.cli.hydra_errors holds stderr back until a task function starts in this process;
    with the joblib or submitit launchers none does, so hand stderr back before reporting
    (else the list of failed jobs would be folded into one line)."""
    try:
        from .hydra_errors import release
    except ImportError:
        return
    release()


class SweepReport(Callback):
    """Aggregate the sweep at its end; exit 1 if any job is not ok.

    Args:
        enabled: set ``hydra.callbacks.sweep_report.enabled=false`` to skip the report.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        _release_stderr()
        from ..report.sweep import write_report
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            rep = write_report(sweep_dir)
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
