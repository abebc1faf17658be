"""A run's directory is checked before Hydra writes into it.

Hydra's ``run_job`` creates a run's (or a sweep job's) directory and writes ``.hydra/``
there before kbframe's task function runs. :func:`install` wraps it (in every launcher: the
basic one, kbframe's joblib launcher, submitit) so that first, with the directory resolved:

* a symbolic link inside the run or sweep directory where the run would write (a job
  folder, ``.hydra/``, Hydra's and kbframe's files) is refused
  (:func:`kbframe.run.rundir.check_links`); the directory the user named may be a link;
* a directory that holds what is not kbframe's (a user's ``trace.json`` and no kbframe
  ``status.json``) is refused (:func:`kbframe.run.rundir.check_foreign`).

A refused run writes nothing: Hydra is not called; the task function runs with the refusal
pending, which kbframe.run.jobstatus reports as its one line (a single run exits 1; a job
of a sweep fails, recorded in its ``status.json`` when its folder is a real, kbframe
directory, and the sweep goes on). The sweep directory itself is checked once, before
Hydra writes ``multirun.yaml`` (kbframe.cli.callbacks).
"""
from __future__ import annotations

import copy
import os
import sys

from ..errors import OutputError
from ..run import rundir


def refusal(config, job_dir_key: str, job_subdir_key) -> tuple[str, OutputError] | tuple[None, None]:
    """``(the run's directory, why it is refused)`` for the job ``config`` describes, as
    Hydra's ``run_job`` resolves it, else ``(None, None)`` (also when it does not resolve:
    Hydra then reports that as before)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf
    inst = HydraConfig.instance()
    before = inst.cfg
    try:
        inst.set_config(config)
        root = str(OmegaConf.select(config, job_dir_key))
        out = os.path.join(root, str(OmegaConf.select(config, job_subdir_key))) if job_subdir_key else root
        sub = config.hydra.output_subdir
    except Exception:  # noqa: BLE001 (an unresolvable directory is Hydra's to report)
        return None, None
    finally:
        inst.cfg = before
    multirun = job_subdir_key is not None
    try:
        rundir.check_links(root, out, None if sub is None else str(sub))
        rundir.check_foreign(out, key="hydra.sweep.dir" if multirun else "hydra.run.dir")
    except rundir.LinkRefused as e:
        # recorded in the job's status.json where that writes through no link
        e.recordable = multirun and _real_dir(root, out)
        return out, e
    except OutputError as e:
        return out, e
    return None, None


def _real_dir(root: str, out: str) -> bool:
    """Whether ``out`` is a directory reached from ``root`` through no link, whose
    ``status.json`` is no link and which holds nothing foreign."""
    try:
        rundir.check_links(root, out, None)
    except OutputError:
        return False
    return os.path.isdir(out) and not rundir.foreign_entries(out, skip_links=True)


def _refused_job(task_function, config, out_dir: str, err: OutputError):
    """What Hydra's ``run_job`` returns, without creating or writing anything: the task
    function runs with ``err`` pending (kbframe.run.jobstatus reports it)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.utils import JobReturn, JobRuntime, JobStatus
    from omegaconf import OmegaConf, open_dict, read_write
    inst = HydraConfig.instance()
    before = inst.cfg
    try:
        with read_write(config.hydra.runtime):
            with open_dict(config.hydra.runtime):
                config.hydra.runtime.output_dir = os.path.abspath(out_dir)
        inst.set_config(config)
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg):
            with open_dict(task_cfg):
                del task_cfg["hydra"]
        ret = JobReturn()
        ret.cfg, ret.hydra_cfg = task_cfg, copy.deepcopy(inst.cfg)
        ret.overrides = OmegaConf.to_container(config.hydra.overrides.task)
        ret.working_dir = os.getcwd()
        rundir.refuse(out_dir, err)
        try:
            ret.return_value = task_function(task_cfg)
            ret.status = JobStatus.COMPLETED
        except Exception as e:  # noqa: BLE001 (as run_job records it)
            ret.return_value = e
            ret.status = JobStatus.FAILED
        finally:
            rundir.take_refusal(out_dir)
        try:
            ret.task_name = JobRuntime.instance().get("name")
        except Exception:  # noqa: BLE001
            ret.task_name = str(config.hydra.job.name)
        return ret
    finally:
        inst.cfg = before


def install() -> None:
    """Wrap Hydra's ``run_job`` (idempotent), also where a launcher imported it already."""
    import hydra.core.utils as hu
    original = hu.run_job
    if getattr(original, "__kbframe_dirs__", False):
        return

    def run_job(task_function, config, job_dir_key, job_subdir_key, hydra_context, configure_logging=True):
        out_dir, err = refusal(config, job_dir_key, job_subdir_key)
        if err is None:
            return original(task_function=task_function, config=config, job_dir_key=job_dir_key,
                            job_subdir_key=job_subdir_key, hydra_context=hydra_context,
                            configure_logging=configure_logging)
        return _refused_job(task_function, config, out_dir, err)
    run_job.__kbframe_dirs__ = True
    run_job.__wrapped__ = original
    for name, mod in list(sys.modules.items()):
        if (name.startswith(("hydra", "kbframe")) and mod is not None
                and getattr(mod, "run_job", None) is original):
            mod.run_job = run_job
