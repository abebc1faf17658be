"""The design-space search part of a sweep report: each trial's objectives and
verdict, the best trial or the Pareto front, and ``pareto.png``.

A sweep is a search when its jobs' config has a ``search`` section with objectives
(:mod:`kbframe.report.search`); the section is read from the first job's
``.hydra/config.yaml`` (Hydra's Optuna sweeper writes no ``multirun.yaml``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import KbframeError
from .markdown import fmt as _fmt, table as _md_table
from .search import Search
from .sweep_jobs import Job, load_yaml


@dataclass
class Trial:
    """One job of a search: ``verdict`` is ``feasible``, ``infeasible`` or the job's status
    (``failed`` ...); ``values`` the objectives, ``limits`` the constrained metrics (both
    None when the job has no metrics)."""

    job: Job
    verdict: str
    why: str = ""
    values: tuple | None = None
    limits: tuple | None = None


def search_of(jobs: list[Job]) -> Search | None:
    """The sweep's search, from the first job config that has one; None for a grid sweep
    (or a search section that does not parse: the jobs then failed on it, one line each)."""
    from omegaconf import OmegaConf
    for j in jobs:
        if j.dir is None or not (j.dir / ".hydra" / "config.yaml").is_file():
            continue
        try:
            cfg = load_yaml(j.dir / ".hydra" / "config.yaml")
            if cfg is None:  # unreadable: no search
                return None
            node = OmegaConf.select(cfg, "search", default=None)
            return Search.from_config(OmegaConf.to_container(node, resolve=True) if node is not None else None)
        except (KbframeError, Exception):  # noqa: BLE001 (an unreadable config is no search)
            return None
    return None


def trials(search: Search, jobs: list[Job]) -> list[Trial]:
    out = []
    for j in jobs:
        if j.status != "ok" or j.metrics is None:
            out.append(Trial(j, j.status, j.error or ""))
            continue
        try:
            o = search.evaluate(j.metrics)
        except KbframeError as e:
            out.append(Trial(j, "failed", str(e)))
            continue
        out.append(Trial(j, "feasible" if o.feasible else "infeasible", "; ".join(o.violations), o.values,
                         o.constrained))
    return out


def no_feasible(search: Search, ts: list[Trial]) -> bool:
    """No trial is feasible (the search found nothing; the command exits 1)."""
    return not any(t.verdict == "feasible" for t in ts)


def best(search: Search, ts: list[Trial]) -> list[Trial]:
    """The best feasible trial (one objective: every trial holding the best value, first
    one first) or the Pareto front of the feasible trials (several), in job order."""
    ok = [t for t in ts if t.verdict == "feasible"]
    return [ok[i] for i in search.front([t.values for t in ok])]


#: sweep.csv columns a search adds
COLUMNS = ["search.verdict", "search.violations"]


def row(t: Trial) -> dict:
    return {"search.verdict": t.verdict, "search.violations": t.why if t.verdict == "infeasible" else ""}


def section(search: Search, ts: list[Trial], common: list[str]) -> list[str]:
    """summary.md lines: the goal, the counts, the best trial or the Pareto front, and a
    table of every trial with its objectives, constrained metrics and verdict."""
    counts = {}
    for t in ts:
        counts[t.verdict] = counts.get(t.verdict, 0) + 1
    lines = ["", f"### search: {search.describe()}", "",
             f"{len(ts)} trials: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())), ""]
    top = best(search, ts)
    def params(t):
        return " ".join(o for o in t.job.overrides if o not in common) or "-"
    def vals(t):
        return ", ".join(f"{o} {v:.10g}" for o, v in zip(search.objectives, t.values))
    if not top and not any(t.values is not None for t in ts):
        lines.append("no feasible trial: no trial finished ok (see the jobs not ok below)")
    elif not top:
        lines.append("no feasible trial: every finished trial violates a constraint; "
                     "loosen the constraints or widen the search")
    elif len(search.objectives) == 1:
        t = top[0]
        lines.append(f"best trial: job {t.job.num} [{params(t)}]: {vals(t)}"
                     + "".join(f", {c.metric} {v:.10g}" for c, v in zip(search.constraints, t.limits)
                               if c.metric not in search.objectives))
    else:
        lines.append(f"Pareto front: {len(top)} of {counts.get('feasible', 0)} feasible trials")
        lines += [f"- job {t.job.num} [{params(t)}]: {vals(t)}" for t in top]
    marks = {id(t): ("best" if len(search.objectives) == 1 else "front") for t in top}
    cmetrics = list(dict.fromkeys(c.metric for c in search.constraints if c.metric not in search.objectives))
    rows = []
    for t in ts:
        cv = dict(zip((c.metric for c in search.constraints), t.limits or ()))
        rows.append([str(t.job.num), params(t)]
                    + [_fmt(v, ".10g") for v in (t.values or (None,) * len(search.objectives))]
                    + [_fmt(cv.get(m), ".10g") for m in cmetrics]
                    + [t.verdict + (f" ({marks[id(t)]})" if id(t) in marks else "")
                       + (f": {t.why}" if t.why and t.verdict != "feasible" else "")])
    lines += [""] + _md_table(["job", "parameters", *search.objectives, *cmetrics, "verdict"], rows,
                              "rl" + "r" * (len(search.objectives) + len(cmetrics)) + "l")
    return lines


def plot(search: Search, ts: list[Trial], path: Path, title: str) -> None:
    """pareto.png: the first objective (y) against the second, or else against the first
    constrained metric (with its limit drawn), or else against the trial number; the
    trials' front in that plane highlighted, infeasible trials grey, the best marked."""
    from .sweep_plot import plot_pareto
    done = [t for t in ts if t.values is not None]
    if len(search.objectives) >= 2:
        x_name, x_dir, limit = search.objectives[1], search.directions[1], None
        xs = [t.values[1] for t in done]
    elif search.constraints:
        c = search.constraints[0]
        x_name, x_dir, limit = c.metric, "maximize" if c.op in (">", ">=") else "minimize", c.limit
        xs = [t.limits[0] for t in done]
    else:
        x_name, x_dir, limit = "trial (job number)", None, None
        xs = [t.job.num for t in done]
    ys = [t.values[0] for t in done]
    plane = Search((search.objectives[0], x_name), (search.directions[0], x_dir or "minimize"), ())
    # the front among the feasible trials, in the plane drawn
    ok = [i for i, t in enumerate(done) if t.verdict == "feasible"]
    front = {ok[j] for j in plane.front([(ys[i], xs[i]) for i in ok])} if x_dir else set()
    top = {id(t) for t in best(search, ts)} if len(search.objectives) == 1 else set()
    points = [(x, y, t.verdict == "feasible", id(t) in top, i in front, t.job.num)
              for i, (t, x, y) in enumerate(zip(done, xs, ys))]
    plot_pareto(points, x_name, search.objectives[0], limit, title, path)
