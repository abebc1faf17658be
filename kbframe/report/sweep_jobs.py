"""The jobs of a sweep directory: what was planned, what ran, and each job's status,
overrides and metrics (see :mod:`kbframe.report.sweep`, which tabulates them).

Jobs come from two places: the sweep plan (the job list Hydra's basic sweeper expands from
``multirun.yaml``) and the job directories found under the sweep (any folder with
``.hydra/overrides.yaml``). A job's ``status`` comes from its ``status.json``; metrics from
``metrics.json``; for a job without metrics, bench and calibration from its
``.hydra/config.yaml``.
"""
from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from pathlib import Path

from ..files import dir_locked, read_small, read_status
from ..yaml_values import check_resolves, checked_values

#: columns every job has, as metrics.json paths; the workload's own ``shape.<key>`` columns
#: (whatever its metrics.json ``shape`` holds) come between HEAD_COLUMNS and RESULT_COLUMNS
HEAD_COLUMNS = ["bench", "calibration.R", "calibration.FIXED"]
RESULT_COLUMNS = [
    "sim.latency_ns", "dispatch.unit", "dispatch.n_units", "dispatch.commands", "dispatch.cycles",
    "dispatch.commands_per_tile", "dispatch.cycles_per_tile", "numerics.max_abs_err", "numerics.max_rel_err",
    "roofline.binding", "roofline.largest_bound", "roofline.bound_ns", "roofline.fraction", "roofline.hbm_bytes",
    "roofline.flops", "critical_path.ns_per_unit", "tcm.high_water_bytes", "sim.events", "sim.wall_s",
]
#: result columns that hold text; every other one is a number (or absent)
TEXT_COLUMNS = ("bench", "dispatch.unit", "roofline.binding", "roofline.largest_bound")
#: where a head column comes from in a job's config when it has no metrics.json
#: (a ``shape.<key>`` column comes from ``bench.<key>``)
CONFIG_FALLBACK = {"bench": "bench.name", "calibration.R": "calibration.R",
                   "calibration.FIXED": "calibration.FIXED"}
#: override keys that select the bench (its pairing partner differs only in these)
BENCH_KEYS = ("bench", "+bench", "++bench")


@dataclass
class Job:
    """One job of a sweep as found on disk."""

    num: int | None
    overrides: list
    status: str = "missing"
    dir: Path | None = None
    error: str | None = None
    metrics: dict | None = None
    values: dict = field(default_factory=dict)  # column → value
    config: object = None  # its .hydra/config.yaml when it has no metrics.json

    def get(self, col: str):
        return self.values.get(col)

    @property
    def setting(self) -> tuple:
        """The job's overrides other than the bench choice (its pairing key)."""
        return tuple(o for o in self.overrides if _key(o) not in BENCH_KEYS)


@dataclass
class Report:
    sweep_dir: Path
    jobs: list
    text: str
    #: a search whose trials all ran but none is feasible: what to say (the command exits 1)
    problem: str = ""

    @property
    def not_ok(self) -> list:
        return [j for j in self.jobs if j.status != "ok"]


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def dig(d: dict, path: str):
    """The value at a dotted ``metrics.json`` path (``sim.latency_ns``), None when absent."""
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


# ---------------------------------------------------------------- discovery

def sweep_plan(sweep_dir: Path) -> list[list[str]] | None:
    """The jobs' override lists in job-number order, expanded from ``multirun.yaml`` the
    way Hydra's basic sweeper does; None if there is no multirun.yaml or another sweeper
    ran the sweep (then only the job directories found count)."""
    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None
    try:
        from ..internals import basic_sweeper
        plan = load_yaml(path)
        overrides = sweep_overrides(plan.hydra) if plan is not None else None
        if overrides is None:
            return None
        return [list(job) for batch in basic_sweeper().split_arguments(overrides, None) for job in batch]
    except Exception:  # an unusual sweep (e.g. glob() choices); fall back to the directories
        return None


def sweep_overrides(hydra_cfg) -> list | None:
    """The overrides Hydra's basic sweeper expands into jobs (parsed ``Override`` s): the
    sweep config's ``hydra.sweeper.params``, then the command line's; None when another
    sweeper runs the sweep. Raises what Hydra's override parser raises."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    sweeper = OmegaConf.to_container(hydra_cfg.sweeper, resolve=False)
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    task = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)]
    return OverridesParser.create().parse_overrides(params + task)


def twice_set(overrides: list) -> tuple | None:
    """``(first, second)``: two of a sweep's overrides (:func:`sweep_overrides`) that would
    both be in every job's override list and set the same key, the later one winning (the
    basic sweeper keeps one override per key *as written*: ``bench.tp=2,4`` from the sweep
    config and ``++bench.tp=8`` from the command line are two, and the jobs labelled
    ``bench.tp=2`` and ``bench.tp=4`` would both run 8); None if there are none (one value
    set twice is none: every job runs it, as labelled)."""
    kept: dict = {}
    for o in overrides:
        kept[o.get_key_element()] = o
    seen: dict = {}
    for o in kept.values():
        if o.is_delete():
            continue
        key = o.key_or_group if o.package is None else f"{o.key_or_group}@{o.package}"
        first = seen.get(key)
        if first is not None and (first.is_sweep_override() or o.is_sweep_override()
                                  or first.get_value_element_as_str() != o.get_value_element_as_str()):
            return first, o  # (one value set twice, e.g. ++bench.data=false on a timing-only sweep: as labelled)
        seen[key] = o
    return None


def _job_dirs(sweep_dir: Path) -> list[Path]:
    dirs = []
    for ov in sweep_dir.rglob(".hydra/overrides.yaml"):
        d = ov.parent.parent
        if d != sweep_dir and ".submitit" not in d.parts and not _through_link(sweep_dir, ov):
            dirs.append(d)
    return sorted(dirs)


def is_sweep_dir(d: Path) -> bool:
    """Whether ``d`` is a sweep's directory: it holds the sweep's ``multirun.yaml`` (a grid
    sweep), or job folders a sweep made (``.hydra/hydra.yaml`` with ``mode: MULTIRUN``: a
    search's trials) none of which lies in a sweep of its own below ``d``. A folder of
    single runs (``outputs/runs``) or of several sweeps (``outputs``) is not one."""
    if (d / "multirun.yaml").is_file():
        return True
    jobs = _job_dirs(d)
    return bool(jobs) and all(_made_by_sweep(j) and not _in_sweep_below(d, j) for j in jobs)


def _made_by_sweep(job: Path) -> bool:
    try:
        text = read_small(job / ".hydra" / "hydra.yaml", 1 << 20)
    except (OSError, ValueError):
        return False
    return any(line.strip() == "mode: MULTIRUN" for line in text.splitlines())


def _in_sweep_below(d: Path, job: Path) -> bool:
    return any((p / "multirun.yaml").is_file() for p in job.parents if p != d and d in p.parents)


def _through_link(sweep_dir: Path, path: Path) -> bool:
    """Whether ``path`` below ``sweep_dir`` is reached through a symbolic link (a job folder
    or ``.hydra/`` no kbframe run made: not read; kbframe.run.rundir.check_links)."""
    p = sweep_dir
    for part in path.relative_to(sweep_dir).parts:
        p = p / part
        if p.is_symlink():
            return True
    return False


def load_yaml(path: Path):
    """A sweep's or a job's YAML file (``multirun.yaml``, ``.hydra/*.yaml``) as OmegaConf
    reads it; None if it cannot be read, is over 1 MiB or not a regular file
    (:func:`kbframe.files.read_small`), or stands for too many values with its aliases
    expanded or its interpolations resolved (kbframe.yaml_values: a directory handed to a
    report tool may be anyone's)."""
    from omegaconf import OmegaConf
    try:
        text = read_small(path, 1 << 20)
        checked_values(text, path)
        cfg = OmegaConf.create(text)
        check_resolves(cfg)
        return cfg
    except Exception:  # noqa: BLE001 (unreadable, refused, or text OmegaConf cannot take: none)
        return None


def _read_job(d: Path) -> Job:
    from omegaconf import OmegaConf
    ov = load_yaml(d / ".hydra" / "overrides.yaml")
    overrides = [str(o) for o in OmegaConf.to_container(ov)] if ov is not None else []
    st = read_status(d)
    num = st.get("num") if st else None
    if num is None:
        hy = load_yaml(d / ".hydra" / "hydra.yaml")
        num = OmegaConf.select(hy, "hydra.job.num", default=None) if hy is not None else None
    if num is None and d.name.isdigit():
        num = int(d.name)
    job = Job(num=num, overrides=overrides, dir=d)
    metrics, unreadable = None, None
    try:
        metrics = json.loads(read_small(d / "metrics.json"))
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:  # a truncated file, a FIFO, a link to a device
        unreadable = f"metrics.json cannot be read: {getattr(e, 'strerror', None) or e}"
    if st is not None:
        job.status = str(st.get("status", "missing"))
        job.error = st.get("error")
    elif metrics is not None:  # a run from before status.json existed
        job.status = "ok"
    if job.status == "running" and not job.error:
        job.error = "started, never finished (killed, or still running)"
        if st.get("host") == socket.gethostname() and not dir_locked(d):
            # a live run holds its directory's lock until it ends: this one's process died
            # without a word (SIGKILL, the OOM killer)
            job.status = "failed"
            job.error = "started, never finished: its process ended without a word (killed by a signal?)"
    if job.status == "ok" and metrics is None:
        job.status, job.error = "failed", unreadable or "status ok but no metrics.json"
    if metrics is not None and not isinstance(metrics, dict):
        job.status, job.error, metrics = "failed", "metrics.json is not a JSON object", None
    job.metrics = metrics
    if metrics is not None:
        job.values = {c: dig(metrics, c) for c in HEAD_COLUMNS + RESULT_COLUMNS}
        shape = metrics.get("shape")
        for k, v in (shape.items() if isinstance(shape, dict) else ()):
            job.values[f"shape.{k}"] = v if isinstance(v, (int, float, str)) or v is None else json.dumps(v)
        bad = [c for c in HEAD_COLUMNS + RESULT_COLUMNS if c not in TEXT_COLUMNS and job.values[c] is not None
               and (isinstance(job.values[c], bool) or not isinstance(job.values[c], (int, float)))]
        if bad:  # a corrupt or hand-edited file: the job is not ok, the report goes on
            job.status = "failed"
            job.error = "; ".join(f"metrics.json {c} is {job.values[c]!r}, not a number" for c in bad)
            for c in bad:
                job.values[c] = None
    else:
        cfg = job.config = load_yaml(d / ".hydra" / "config.yaml")
        for col, path in CONFIG_FALLBACK.items():
            try:
                job.values[col] = OmegaConf.select(cfg, path, default=None) if cfg is not None else None
            except Exception:
                job.values[col] = None
    return job


def shape_columns(jobs: list[Job]) -> list[str]:
    """The ``shape.<key>`` columns the jobs' metrics.json hold, first-seen order."""
    return list(dict.fromkeys(c for j in jobs for c in j.values if c.startswith("shape.")))


def _fill_shapes(jobs: list[Job]) -> list[Job]:
    """A job without metrics takes its shape columns from its config (``bench.<key>``) or,
    never run, from its overrides."""
    from omegaconf import OmegaConf
    cols = shape_columns(jobs)
    for j in jobs:
        if j.metrics is not None:
            continue
        ovs = _override_values(j)
        for c in cols:
            key = "bench." + c[len("shape."):]
            v = None
            if j.config is not None:
                try:
                    v = OmegaConf.select(j.config, key, default=None)
                except Exception:
                    v = None
            else:
                v = ovs.get(key)
            j.values[c] = v if isinstance(v, (int, float, str)) or v is None else str(v)
    return jobs


def _override_values(job: Job) -> dict:
    """The job's overrides as key (``+``/``~`` stripped) → value (numbers parsed)."""
    return {_key(o).lstrip("+~"): _num(o.split("=", 1)[1]) if "=" in o else "" for o in job.overrides}


def swept_keys(jobs: list[Job]) -> dict[str, list]:
    """Override keys whose value differs between jobs (``+``/``~`` stripped; ``bench`` for
    the bench choice; ``hydra.*`` left out) → their values in first-seen order, numbers
    parsed (so that 128 sorts before 1024)."""
    per_job = [_override_values(j) for j in jobs]
    keys = list(dict.fromkeys(k for seen in per_job for k in seen))
    out = {}
    for k in keys:
        vals = list(dict.fromkeys(seen.get(k) for seen in per_job))
        if len(vals) > 1 and not k.startswith("hydra."):
            out[k] = vals
    return out


def setting_of(job: Job, keys) -> dict:
    """The job's value of each of ``keys`` (override keys as :func:`swept_keys` names them)."""
    ovs = _override_values(job)
    return {k: ovs.get(k) for k in keys}


def sort_key(value, order: list | None = None):
    """Numbers before text, numbers by value (128 < 1024); text in ``order`` (a swept key's
    values as the sweep lists them) when given, else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value, "")
    if order is not None and value in order:
        return (1, order.index(value), "")
    return (2, 0, "" if value is None else str(value))


def collect(sweep_dir: Path) -> list[Job]:
    """Every job of the sweep, planned or found, in job-number order."""
    sweep_dir = Path(sweep_dir)
    found = [_read_job(d) for d in _job_dirs(sweep_dir)]
    plan = sweep_plan(sweep_dir)
    if plan is None:
        jobs = found + _never_ran(found)
        return _fill_shapes(sorted(jobs, key=lambda j: (j.num is None, j.num or 0, str(j.dir or ""))))
    by_ov = {}
    for j in found:
        by_ov.setdefault(tuple(j.overrides), []).append(j)
    jobs, used = [], set()
    for num, ov in enumerate(plan):
        cands = by_ov.get(tuple(ov), [])
        match = next((j for j in cands if j.num == num), None) or next(
            (j for j in cands if id(j) not in used), None)
        if match is None:
            job = Job(num=num, overrides=list(ov), error="never ran (no job directory or status)")
            d = sweep_dir / str(num)  # a job refused before Hydra wrote its .hydra/ (kbframe.cli.job_dirs)
            st = None if d.is_symlink() else read_status(d)
            if d.is_symlink():
                job.status = "failed"
                job.error = f"refused: its job directory '{d}' is a symbolic link (not followed)"
            elif st is not None and st.get("num") == num and list(st.get("overrides") or []) == list(ov):
                job.status, job.error, job.dir = str(st.get("status", "missing")), st.get("error"), d
            for o in ov:  # what the overrides say about the bench and R
                k, v = _key(o), o.split("=", 1)[1]
                if k in BENCH_KEYS:
                    job.values["bench"] = v
                elif k in CONFIG_FALLBACK.values():
                    col = next(c for c, p in CONFIG_FALLBACK.items() if p == k)
                    job.values[col] = _num(v)
            jobs.append(job)
        else:
            used.add(id(match))
            match.num = num
            if match.status == "missing" and match.error is None:
                match.error = "started, but wrote no status.json"
            jobs.append(match)
    # a directory the plan does not account for is another sweep's (one run into a sweep
    # directory reused with hydra.callbacks.sweep_report.reuse_dir=true): not this sweep's job
    return _fill_shapes(jobs)


def _never_ran(jobs: list[Job]) -> list[Job]:
    """A sweeper that writes no plan (Hydra's Optuna sweeper) still names how many jobs it
    meant to run (``hydra.sweeper.n_trials`` in a job's ``.hydra/hydra.yaml``): the job
    numbers below it that have no directory never ran."""
    from omegaconf import OmegaConf
    n = None
    for j in jobs:
        hy = load_yaml(j.dir / ".hydra" / "hydra.yaml") if j.dir is not None else None
        if hy is not None:
            n = OmegaConf.select(hy, "hydra.sweeper.n_trials", default=None)
            break
    if not isinstance(n, int):
        return []
    have = {j.num for j in jobs}
    return [Job(num=i, overrides=[], error="never ran (the sweep ended before this trial)")
            for i in range(n) if i not in have]


def _num(v: str):
    try:
        f = float(v)
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f
    except ValueError:
        return v


# ---------------------------------------------------------------- outputs
