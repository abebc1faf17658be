"""``hydra/launcher=joblib`` for kbframe: Hydra's joblib launcher, with each parallel slot
its own one-worker loky executor, so a job whose process is killed fails alone.

Hydra's launcher runs every job through one ``joblib.Parallel``: when the OOM killer (or
``kill -9``) ends one worker, loky marks the whole pool broken, kills the other workers,
and the sweep stops with a ``TerminatedWorkerError`` traceback: no further job runs, the
job running beside it stays ``running``, and no report is written. Here a killed worker
breaks only its slot: that job is recorded ``failed`` (killed by a signal) in its
``status.json``, the slot gets a fresh worker, the other jobs run, and the sweep ends with
its report and exit 1 (kbframe.cli.callbacks). Ctrl-C or SIGTERM (to the launching process
alone, or to the whole process group as a terminal or a batch system sends it) reaches the
running jobs, which record ``interrupted``; the workers are then stopped and the sweep
ends with one line (kbframe.cli.stop), not joblib's traceback.

Of the joblib settings only ``n_jobs`` is used (the jobs go one at a time to each slot).
Selected by ``conf/hydra/launcher/joblib.yaml`` (which takes the place of the plugin's
own config); the plugin class Hydra instantiates is
``hydra_plugins.kbframe_launcher.KbframeJoblibLauncher``, which calls :func:`launch`.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import (JobReturn, JobStatus as HydraJobStatus, configure_log, filter_overrides, run_job,
                              setup_globals)
from joblib import effective_n_jobs
from joblib.externals.loky.process_executor import BrokenProcessPool, ProcessPoolExecutor, ShutdownExecutorError
from omegaconf import OmegaConf, open_dict

from ..errors import KbframeError, Terminated
from ..files import read_status
from . import stop
from .hydra_errors import release
from ..run import rundir
from ..run.jobstatus import mark_killed

#: seconds the running jobs get to record their end after Ctrl-C or SIGTERM
STOP_WAIT_S = 10

log = logging.getLogger(__name__)


def launch(launcher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
    """Run the jobs on ``n_jobs`` one-worker executors (see the module doc).

    Args:
        launcher: the Hydra launcher (its ``config``, ``hydra_context``, ``task_function``
            and ``joblib`` settings).
    Returns:
        One JobReturn per job, in order; a killed job's carries its failed status.
    Raises:
        SystemExit(130): Ctrl-C (the workers are stopped).
    """
    setup_globals()
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    n = max(1, min(effective_n_jobs(launcher.joblib.get("n_jobs", -1)), len(job_overrides)))
    log.info(f"kbframe joblib launcher: {n} one-worker executors for {len(job_overrides)} jobs")
    log.info(f"Launching jobs, sweep output dir : {sweep_dir}")
    for idx, overrides in enumerate(job_overrides):
        log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
    state = Singleton.get_state()
    todo = deque(enumerate(job_overrides))
    executors: list = [None] * n
    running: dict = {}  # future -> (slot, idx, overrides)
    results: list = [None] * len(job_overrides)
    try:
        while todo or running:
            busy = {slot for slot, _, _ in running.values()}
            for slot in range(n):
                if todo and slot not in busy:
                    idx, ov = todo.popleft()
                    if executors[slot] is None:
                        executors[slot] = ProcessPoolExecutor(max_workers=1, initializer=_quiet_when_idle)
                    fut = executors[slot].submit(_job, initial_job_idx + idx, ov, launcher.hydra_context,
                                                 launcher.config, launcher.task_function, state)
                    running[fut] = (slot, idx, ov)
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                slot, idx, ov = running.pop(fut)
                try:
                    results[idx] = fut.result()
                except (BrokenProcessPool, ShutdownExecutorError) as e:  # its worker died
                    executors[slot].shutdown(wait=False, kill_workers=True)
                    executors[slot] = None
                    results[idx] = _killed(launcher, initial_job_idx + idx, ov, e)
    except KeyboardInterrupt as e:
        stop.interrupted(e)
        _stop_jobs(launcher, initial_job_idx, running, executors, e)
        release()  # stderr is the user's: the sweep's line is a message, not a Hydra error to fold
        raise SystemExit(stop.code()) from None
    for ex in executors:
        if ex is not None:
            ex.shutdown(wait=True)
    return results


def _stop_jobs(launcher, initial_job_idx: int, running: dict, executors: list, e: KeyboardInterrupt) -> None:
    """After Ctrl-C or SIGTERM in the launching process: the same signal to each running
    job's worker (its status.json names it; one that got it already takes no second), a
    moment for them to record their end, then every worker stopped and a job that did
    not record itself marked ``interrupted``."""
    sig = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
    dirs = {fut: _job_dir(launcher, initial_job_idx + idx, ov)[1] for fut, (_, idx, ov) in running.items()}
    for d in dirs.values():
        st = read_status(d)
        if st and st.get("status") == "running" and isinstance(st.get("pid"), int) and st["pid"] != os.getpid():
            try:
                os.kill(st["pid"], sig)
            except OSError:
                pass
    try:
        wait(list(running), timeout=STOP_WAIT_S)
        _shut_down(executors)
    except KeyboardInterrupt:
        pass
    what = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted (Ctrl-C)"
    for slot, idx, ov in running.values():
        _out_dir_status(launcher, initial_job_idx + idx, ov, f"{what}; its worker was stopped", "interrupted")


def _shut_down(executors: list) -> None:
    """Stop every worker (loky's ``shutdown(kill_workers=True)``), waiting at most
    :data:`STOP_WAIT_S`: the command ends after a stop even if loky's own thread does not
    (an interrupt can leave a lock of its futures held), and its process exit does not wait
    for that thread (kbframe.cli.speed)."""
    live = [ex for ex in executors if ex is not None]
    t = threading.Thread(target=lambda: [ex.shutdown(wait=True, kill_workers=True) for ex in live],
                         name="kbframe-stop-workers", daemon=True)
    t.start()
    t.join(STOP_WAIT_S)


def _quiet_when_idle() -> None:
    """A worker's start (loky ``initializer``): Ctrl-C or SIGTERM that finds it between
    jobs ends it quietly (the launcher stops the sweep and records what ran), not with a
    traceback from loky's own loop; during a job they are KeyboardInterrupt and
    Terminated, as in a single run, and one that Python loses is raised again
    (kbframe.cli.stop.keep_interrupts)."""
    signal.signal(signal.SIGINT, _end_idle_worker)
    signal.signal(signal.SIGTERM, _end_idle_worker)
    stop.keep_interrupts()


def _end_idle_worker(signum, frame) -> None:
    os._exit(128 + signum)


_stopping = False  # the running job's first Ctrl-C or SIGTERM was raised (a second is not)


def _stop_job(signum, frame) -> None:
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def execute_job(idx: int, overrides, hydra_context, config, task_function, singleton_state) -> JobReturn:
    """Job ``idx`` in a worker, as Hydra's joblib launcher runs it (its ``execute_job``,
    with Hydra's public calls): Hydra's state from the launching process, the job's config
    (its id and number), then ``run_job`` in the sweep's directory."""
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


def _job(*args):
    """:func:`execute_job` in a worker, with Ctrl-C a KeyboardInterrupt and SIGTERM a
    Terminated while it runs (once each job)."""
    global _stopping
    _stopping = False
    signal.signal(signal.SIGINT, _stop_job)
    signal.signal(signal.SIGTERM, _stop_job)
    try:
        return execute_job(*args)
    finally:
        signal.signal(signal.SIGINT, _end_idle_worker)
        signal.signal(signal.SIGTERM, _end_idle_worker)


def _job_dir(launcher, num: int, overrides) -> tuple:
    """``(job config, its directory)``."""
    cfg = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.num = num
    return cfg, Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)


def _out_dir_status(launcher, num: int, overrides, why: str, status: str = "failed"):
    """``(job config, its directory, its status)`` after recording a job whose process
    ended without recording it (killed, or stopped by the launcher) as ``status``; its
    temporaries are removed (its lock ended with it)."""
    cfg, out_dir = _job_dir(launcher, num, overrides)
    st = mark_killed(out_dir, {"num": num, "overrides": [str(o) for o in overrides]}, why, status)
    try:
        with rundir.lock(out_dir):
            rundir.RunDir(out_dir).remove_stale()
    except KbframeError:
        pass
    return cfg, out_dir, st


def _killed(launcher, num: int, overrides, exc) -> JobReturn:
    """Record a job whose worker process died (a signal: nothing in it could say so)."""
    codes = re.search(r"\{([^}]*)\}", str(exc))
    why = (f"killed by a signal: its worker process ended abruptly"
           f"{f' (exit code {codes.group(1)})' if codes else ''}, e.g. by the OOM killer or kill -9")
    cfg, out_dir, status = _out_dir_status(launcher, num, overrides, why)
    release()
    print(f"kbframe: error (job {num} [{' '.join(overrides)}]): {why}", file=sys.stderr)
    return JobReturn(overrides=list(overrides), cfg=OmegaConf.create({}), hydra_cfg=cfg,
                     working_dir=str(out_dir), task_name=str(cfg.hydra.job.name),
                     status=HydraJobStatus.COMPLETED, _return_value=status)
