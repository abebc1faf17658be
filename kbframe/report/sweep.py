"""Aggregate a sweep directory into ``sweep.csv``, a summary table and ``sweep.png``.

Runs at the end of every ``python -m kbframe -m ...`` sweep (from :mod:`kbframe.cli.callbacks`)
and by hand on any sweep directory, also an interrupted one::

    python -m kbframe.report outputs/sweeps/2025-01-01_12-00-00_123456
    python -m kbframe.report            # the newest sweep under outputs/sweeps/
    python -m kbframe.report DIR --x bench.tile   # sweep.png against this swept key

Jobs are collected by :mod:`kbframe.report.sweep_jobs`. Each job's ``status`` is read from its ``status.json``:
``ok``, ``failed`` (with the error), ``interrupted`` (Ctrl-C), ``running`` (started, never
finished: the process was killed or is still going) or ``missing`` (planned, but no
directory or no status: it never ran). Metrics come from ``metrics.json``; for a job
without metrics, bench and calibration come from its ``.hydra/config.yaml``.

Files written at the sweep root (each atomically: a temporary file, then rename):

- ``sweep.csv``: one row per job: job number, status, bench, calibration, the workload's
  shape keys (``shape.<key>``, whatever its metrics.json ``shape`` holds), the key metrics
  (column names are ``metrics.json`` paths, e.g. ``dispatch.cycles_per_tile``), a column
  per swept key (an override whose value differs between jobs) that no metric column
  already holds, the overrides, the error, the job directory;
- ``summary.md``: the table printed on the console: every job; when the sweep varies the
  bench, each other bench against the first one of the sweep (the baseline) at every
  setting of the other swept keys (numbers in numeric order, 128 before 1024; text in the
  sweep's order), with the
  dispatch-cost ratio (``dispatch.cycles_per_tile`` bench / baseline) and latency ratio
  (``sim.latency_ns``); then the jobs that did not finish ok;
- ``sweep.png``: dispatch cycles per unit of progress (KV tile, output block ...) and latency
  against a swept key (``--x KEY``; by default the numeric swept key with the most values,
  e.g. ``calibration.R`` or ``bench.tile``, else a text one such as ``gemm_shape``), one
  line per setting of the other swept keys.

Exit status of the command: 0 when every job is ok, 1 when any failed, was interrupted or
is missing (a job whose metrics.json holds a value of the wrong type counts as failed), 2
when no report can be made: DIR is not a sweep directory, ``--x`` names a key the sweep
does not vary, or a report file cannot be
written (a read-only sweep, a directory in the place of ``sweep.csv``); one line each.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from ..files import atomic_write
from .sweep_jobs import (CONFIG_FALLBACK, HEAD_COLUMNS, RESULT_COLUMNS, Job, Report, collect, dig, is_sweep_dir,
                         setting_of, shape_columns, sort_key, swept_keys)
from . import search_report
from .markdown import fmt as _fmt, table as _md_table
from .sweep_plot import plot_sweep

def _columns(jobs: list[Job]) -> tuple[list[str], list[str]]:
    """The metric columns (head, the workload's shape keys, results) and the swept keys no
    metric column already holds."""
    shapes = shape_columns(jobs)
    covered = {"bench"} | set(CONFIG_FALLBACK.values()) | {"bench." + c[len("shape."):] for c in shapes}
    extra = [k for k in swept_keys(jobs) if k not in covered]
    steps = STEP_COLUMNS if any(dig(j.metrics or {}, "step.latency_ns") is not None for j in jobs) else []
    return HEAD_COLUMNS + shapes + RESULT_COLUMNS + steps + energy_columns(jobs), extra


#: a model step's columns, when a job of the sweep has ``metrics.json`` ``step``
STEP_COLUMNS = ["step.latency_ns", "step.tokens_per_s", "step.layer_ns", "step.binding", "step.analytic_ns",
                "step.model.latency_ns", "step.model.tokens_per_s"]


#: a run's energy (kbframe.run.energy), when a job of the sweep has ``metrics.json`` ``energy``;
#: then each role's dynamic pJ (``energy.by_role.<role>``, and ``static``) in the order found
ENERGY_COLUMNS = ["energy.total_pj", "energy.dynamic_pj", "energy.static_pj", "energy.per_unit_pj",
                  "energy.avg_power_w", "energy.edp"]


def energy_columns(jobs: list[Job]) -> list[str]:
    """:data:`ENERGY_COLUMNS` and the roles' columns, if any job has an energy section."""
    roles: dict = {}
    for j in jobs:
        by_role = dig(j.metrics or {}, "energy.by_role")
        if isinstance(by_role, dict):
            roles.update(dict.fromkeys(by_role))
    if not roles:
        return []
    return ENERGY_COLUMNS + [f"energy.by_role.{r}" for r in roles]


def csv_rows(jobs: list[Job]) -> tuple[list[str], list[dict]]:
    """Header and rows of sweep.csv (a search adds its objectives and each trial's verdict)."""
    metric, extra = _columns(jobs)
    search = search_report.search_of(jobs)
    found = {}
    if search is not None:
        names = list(search.objectives) + [c.metric for c in search.constraints]
        metric += [n for n in dict.fromkeys(names) if n not in metric]
        extra += search_report.COLUMNS
        found = {id(t.job): search_report.row(t) for t in search_report.trials(search, jobs)}
    header = ["job", "status"] + metric + extra + ["overrides", "error", "dir"]
    rows = []
    for j in jobs:
        row = {"job": j.num, "status": j.status,
               **{c: j.get(c) if c in j.values else _scalar(dig(j.metrics or {}, c)) for c in metric}}
        row.update(setting_of(j, extra))
        row.update(found.get(id(j), {}))
        row.update(overrides=" ".join(j.overrides), error=j.error or "", dir=str(j.dir or ""))
        rows.append({k: ("" if v is None else v) for k, v in row.items()})
    return header, rows


def comparisons(jobs: list[Job]) -> list[dict]:
    """When the sweep varies the bench: each other bench against the first (the baseline,
    first in the sweep's order) at every setting of the other swept keys, numbers in
    numeric order. Each item: ``bench``, ``base`` (bench names), ``job``, ``base_job``,
    ``setting`` (other swept key → value), ``dispatch_ratio`` (bench / base
    ``dispatch.cycles_per_tile``) and ``latency_ratio`` (``sim.latency_ns``); a ratio is
    None unless both jobs are ok."""
    swept = swept_keys(jobs)
    benches = [str(b) for b in swept.get("bench", [])]
    if len(benches) < 2:
        return []
    base = benches[0]
    others = [k for k in swept if k != "bench"]
    by = {}
    for j in jobs:
        by.setdefault((str(setting_of(j, ["bench"])["bench"]), j.setting), j)
    out = []
    for (b, setting), j in by.items():
        j0 = by.get((base, setting))
        if b == base or j0 is None:
            continue
        def ratio(col, j=j, j0=j0):
            if j.status != "ok" or j0.status != "ok" or not j0.get(col) or j.get(col) is None:
                return None
            return j.get(col) / j0.get(col)
        out.append({"bench": b, "base": base, "job": j, "base_job": j0, "setting": setting_of(j, others),
                    "dispatch_ratio": ratio("dispatch.cycles_per_tile"),
                    "latency_ratio": ratio("sim.latency_ns")})
    out.sort(key=lambda c: (benches.index(c["bench"]), [sort_key(v, swept[k]) for k, v in c["setting"].items()]))
    return out


def _scalar(v):
    return v if isinstance(v, (int, float, str)) else None


def _unit(jobs: list[Job]) -> str:
    """The workloads' unit of progress ("KV tile", "output block"), or "unit" when they differ."""
    units = {j.get("dispatch.unit") for j in jobs if j.get("dispatch.unit")}
    return units.pop() if len(units) == 1 else "unit"


def summary_text(jobs: list[Job], sweep_dir: Path) -> str:
    """The summary printed at the end of a sweep and saved as summary.md."""
    counts = {}
    for j in jobs:
        counts[j.status] = counts.get(j.status, 0) + 1
    lines = [f"## kbframe sweep {sweep_dir}", "",
             f"{len(jobs)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), ""]
    common = [o for o in jobs[0].overrides if all(o in j.overrides for j in jobs[1:])] \
        if len(jobs) > 1 else []
    if common:
        lines += [f"common overrides: {' '.join(common)}", ""]
    unit = _unit(jobs)
    rows = []
    for j in jobs:
        ok = j.status == "ok"
        rows.append([str(j.num), j.status, " ".join(o for o in j.overrides if o not in common) or "-",
                     _fmt(j.get("sim.latency_ns"), ".1f") if ok else "-",
                     _fmt(j.get("dispatch.cycles_per_tile"), ".1f") if ok else "-",
                     _fmt(j.get("dispatch.commands_per_tile"), ".2f") if ok else "-",
                     # the largest bound and latency's share of it; what binds (critical path)
                     (f"{j.get('roofline.largest_bound') or j.get('roofline.binding')} "
                      f"{_fmt(j.get('roofline.fraction'), '.1%')}") if ok else "-",
                     str(j.get("roofline.binding")) if ok else "-",
                     _fmt(j.get("numerics.max_abs_err"), ".2g", "off") if ok else "-"])
    lines += _md_table(["job", "status", "overrides", "latency ns", f"cycles/{unit}", f"cmds/{unit}",
                        "largest bound (of it)", "binding", "max abs err"], rows, "rllrrrllr")
    comps = comparisons(jobs)
    for b in dict.fromkeys(c["bench"] for c in comps):
        mine = [c for c in comps if c["bench"] == b]
        base = mine[0]["base"]
        keys = list(mine[0]["setting"])
        lines += ["", f"### {b} vs {base} (ratio = {b} / {base})", ""]
        prow = []
        for c in mine:
            j, j0 = c["job"], c["base_job"]
            def v(j, col, spec):
                return _fmt(j.get(col), spec) if j.status == "ok" else j.status
            prow.append([_fmt(c["setting"][k], "g") for k in keys] + [
                v(j, "dispatch.cycles_per_tile", ".1f"), v(j0, "dispatch.cycles_per_tile", ".1f"),
                _fmt(c["dispatch_ratio"], ".2f") + ("×" if c["dispatch_ratio"] else ""),
                v(j, "sim.latency_ns", ".1f"), v(j0, "sim.latency_ns", ".1f"),
                _fmt(c["latency_ratio"], ".2f") + ("×" if c["latency_ratio"] else "")])
        head = keys + [f"{b} cycles/{unit}", f"{base} cycles/{unit}", "dispatch ratio",
                       f"{b} latency ns", f"{base} latency ns", "latency ratio"]
        lines += _md_table(head, prow, "r" * len(head))
    search = search_report.search_of(jobs)
    if search is not None:
        lines += search_report.section(search, search_report.trials(search, jobs), common)
    bad = [j for j in jobs if j.status != "ok"]
    if bad:
        lines += ["", f"### not ok: {len(bad)} of {len(jobs)} jobs", ""]
        for j in bad:
            lines.append(f"- job {j.num} [{' '.join(j.overrides)}]: {j.status}"
                         + (f": {j.error}" if j.error else "") + (f" ({j.dir})" if j.dir else ""))
    return "\n".join(lines) + "\n"


def write_csv(jobs: list[Job], path: Path) -> None:
    header, rows = csv_rows(jobs)
    def w(tmp):
        with open(tmp, "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=header)
            wr.writeheader()
            wr.writerows(rows)
    atomic_write(path, w)


def x_key(jobs: list[Job], x: str | None = None) -> str | None:
    """The swept key sweep.png puts on its x-axis: ``x`` when given (a ValueError naming the
    swept keys when it is not one), else the swept numeric key with the most values, else
    the swept text key with the most, else the bench; None when nothing is swept."""
    swept = swept_keys(jobs)
    if x is not None:
        k = x.lstrip("+~")
        if k not in swept:
            raise ValueError(f"x={x} is not a swept key; the sweep varies: {', '.join(swept) or 'nothing'}")
        return k
    def numeric(vals):
        return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
    cands = [k for k in swept if k != "bench"]
    for pool in ([k for k in cands if numeric(swept[k])], cands, list(swept)):
        if pool:
            return max(pool, key=lambda k: len(swept[k]))  # first of the longest on a tie
    return None


#: sweep.png's second panel: the first of these metrics whose section a job has (the metric,
#: that section, its title and axis label): a model step's estimate (null for a model that
#: does not fit: the point is left out), else the run's tokens/s, else its latency
SECOND_PANEL = (("step.model.tokens_per_s", "step.model", ("tokens/s, the model's whole step (estimated)", "tokens/s")),
                ("step.tokens_per_s", "step.tokens_per_s", ("tokens/s", "tokens/s")),
                ("sim.latency_ns", "sim.latency_ns", ("simulated latency", "latency (ns)")))


def write_plot(jobs: list[Job], path: Path, x: str | None = None) -> None:
    """sweep.png: dispatch cycles per unit of progress and latency (a model's steps:
    tokens/s) against the swept key
    :func:`x_key` picks, one line per setting of the other swept keys (bench first); ok
    jobs only (drawn by kbframe.report.sweep_plot)."""
    key = x_key(jobs, x)
    swept = swept_keys(jobs)
    others = [k for k in swept if k != key]
    series, rank = {}, {}
    # a model's decode steps: tokens/s (the model's whole step when the jobs estimate it) beside
    # the dispatch cost, instead of the latency
    ok = [j for j in jobs if j.status == "ok"]
    second = next(c for c in SECOND_PANEL if c[0] == "sim.latency_ns"
                  or any(dig(j.metrics or {}, c[1]) is not None for j in ok))
    for j in jobs:
        if j.status != "ok" or key is None:
            continue
        s = setting_of(j, [key] + others)
        # a key a job does not set (opt3 has no s_buffers) is left out of its label
        label = " ".join((str(s[k]) if k == "bench" else f"{k}={s[k]}") for k in others
                         if s[k] is not None) or str(j.get("bench"))
        # lines in the sweep's bench order, then by the other keys' values (numbers as numbers)
        rank[label] = [sort_key(s[k], swept[k]) for k in others]
        series.setdefault(label, []).append(
            (s[key], j.get("dispatch.cycles_per_tile"), dig(j.metrics or {}, second[0])))
    series = {label: series[label] for label in sorted(series, key=lambda lb: rank[lb])}
    n_bad = sum(j.status != "ok" for j in jobs)
    title = f"kbframe sweep: {len(jobs) - n_bad} ok" + (f", {n_bad} not ok" if n_bad else "")
    refused = sum(dig(j.metrics or {}, "step.model.refused") is not None for j in ok)
    if second[0] == "step.model.tokens_per_s" and refused:
        title += f"; {refused} whole model(s) would not fit (step.model.refused)"
    xs = sorted(swept.get(key, []), key=lambda v: sort_key(v, swept[key])) if key else []
    plot_sweep(series, key or "", xs, _unit(jobs), title, path, second[2])


def write_report(sweep_dir: Path | str, echo: bool = True, x: str | None = None) -> Report:
    """Collect the sweep's jobs and write sweep.csv, summary.md and sweep.png at its root.

    Args:
        echo: print the summary to stdout.
        x: the swept key for sweep.png's x-axis (default: :func:`x_key`'s choice).
    Raises:
        ValueError: ``x`` is not a swept key (before anything is written).
        NotADirectoryError: ``sweep_dir`` is not a directory.
        OSError: a report file cannot be written (checked for all three before any is:
            something that is not a file in the place of one raises IsADirectoryError).
    """
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise NotADirectoryError(f"no such sweep directory '{sweep_dir}'")
    for name in REPORT_FILES:
        p = sweep_dir / name
        if p.exists() and not p.is_file():
            raise IsADirectoryError(21, "something that is not a file is in its place", str(p))
    jobs = collect(sweep_dir)
    x_key(jobs, x)
    text = summary_text(jobs, sweep_dir)
    write_csv(jobs, sweep_dir / "sweep.csv")
    atomic_write(sweep_dir / "summary.md", lambda tmp: tmp.write_text(text))
    write_plot(jobs, sweep_dir / "sweep.png", x)
    search = search_report.search_of(jobs)
    if search is not None:
        n_ok = sum(j.status == "ok" for j in jobs)
        search_report.plot(search, search_report.trials(search, jobs), sweep_dir / "pareto.png",
                           f"kbframe search: {search.describe()} ({n_ok} of {len(jobs)} trials ran)")
    if echo:
        print(text, end="")
        print(f"files: {sweep_dir}/{{sweep.csv, summary.md, sweep.png{', pareto.png' if search else ''}}}")
    problem = ""
    if search is not None and not any(j.status != "ok" for j in jobs):
        ts = search_report.trials(search, jobs)
        if search_report.no_feasible(search, ts):
            problem = f"no feasible trial in {len(ts)}: every trial violates a constraint"
    return Report(sweep_dir, jobs, text, problem)


#: the files a report writes at the sweep root (and pareto.png for a search)
REPORT_FILES = ("sweep.csv", "summary.md", "sweep.png", "pareto.png")


def _newest_sweep(root: Path = Path("outputs/sweeps")) -> Path | None:
    """The sweep under ``root`` that started last: by its ``multirun.yaml``, written as it
    starts (a report written into an older sweep leaves that alone), else by the folder."""
    dirs = [d for d in root.glob("*") if d.is_dir()] if root.is_dir() else []

    def started(d: Path) -> float:
        plan = d / "multirun.yaml"
        return (plan if plan.is_file() else d).stat().st_mtime
    return max(dirs, key=started) if dirs else None


def main(argv=None) -> int:
    """``python -m kbframe.report [DIR ...]``: see the module doc."""
    args = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip())
        return 0
    x, dirs = None, []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--x" or a.startswith("--x="):
            x = a.partition("=")[2] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in a else 2
            if not x:
                print("kbframe: error: --x needs a swept key, e.g. --x bench.tile", file=sys.stderr)
                return 2
            continue
        if a.startswith("-"):
            print(f"kbframe: error: unknown option '{a}' (python -m kbframe.report [DIR ...] [--x KEY])",
                  file=sys.stderr)
            return 2
        dirs.append(a)
        i += 1
    args = dirs
    if not args:
        newest = _newest_sweep()
        if newest is None:
            print("kbframe: error: no sweep directory given and none under outputs/sweeps/",
                  file=sys.stderr)
            return 2
        args = [str(newest)]
    for a in args:  # every directory checked before any report is rewritten
        d = Path(a)
        try:
            found = d.is_dir()
        except OSError as e:  # a name the file system refuses (one too long)
            print(f"kbframe: error: cannot read '{d}': {e.strerror or e}", file=sys.stderr)
            return 2
        if not found:
            print(f"kbframe: error: no such sweep directory '{d}'", file=sys.stderr)
            return 2
        if not is_sweep_dir(d):
            print(f"kbframe: error: '{d}' is not a sweep directory (no multirun.yaml, and no job folders a sweep "
                  f"made in it: .hydra/hydra.yaml with mode MULTIRUN); give one sweep's directory", file=sys.stderr)
            return 2
    rc = 0
    for a in args:
        d = Path(a)
        try:
            rep = write_report(d, x=x)
        except ValueError as e:  # --x names a key the sweep does not vary
            print(f"kbframe: error: '{d}': --{e}", file=sys.stderr)
            return 2
        except OSError as e:  # a read-only sweep, a directory where sweep.csv goes ...
            where = f"'{e.filename}'" if e.filename else f"the report in '{d}'"
            print(f"kbframe: error: cannot write {where}: {e.strerror or e}", file=sys.stderr)
            return 2
        except Exception as e:  # noqa: BLE001 (a report that cannot be made is exit 2, never 1)
            print(f"kbframe: error: cannot report '{d}': {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        if rep.not_ok:
            rc = 1
            print(f"kbframe: {len(rep.not_ok)} of {len(rep.jobs)} jobs not ok", file=sys.stderr)
        elif rep.problem:
            rc = 1
            print(f"kbframe: {rep.problem}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
