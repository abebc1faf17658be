"""Aggregate a sweep directory into ``sweep.csv``, a summary table and ``sweep.png``.

Runs at the end of every ``python -m kbframe -m ...`` sweep (from :mod:`kbframe.cli.callbacks`)
and by hand on any sweep directory, also an interrupted one::

    python -m kbframe.report outputs/sweeps/2025-01-01_12-00-00_123456
    python -m kbframe.report            # the newest sweep under outputs/sweeps/

Jobs are collected by :mod:`kbframe.report.sweep_jobs`. Each job's ``status`` is read from its ``status.json``:
``ok``, ``failed`` (with the error), ``interrupted`` (Ctrl-C), ``running`` (started, never
finished: the process was killed or is still going) or ``missing`` (planned, but no
directory or no status: it never ran). Metrics come from ``metrics.json``; for a job
without metrics, bench and calibration come from its ``.hydra/config.yaml``.

Files written at the sweep root (each atomically: a temporary file, then rename):

- ``sweep.csv``: one row per job: job number, status, bench, calibration, shape, the key
  metrics (column names are ``metrics.json`` paths, e.g. ``dispatch.cycles_per_tile``), a
  column per swept key (an override whose value differs between jobs) that no metric
  column already holds, the overrides, the error, the job directory;
- ``summary.md``: the table printed on the console: every job, then opt3 and opt2 paired
  at each R (and each other swept setting) with their dispatch-cost ratio
  (``dispatch.cycles_per_tile`` opt3 / opt2) and latency ratio (``sim.latency_ns``
  opt3 / opt2), then the jobs that did not finish ok;
- ``sweep.png``: dispatch cycles per KV tile and latency against R, one line per bench.

Exit status of the command: 0 when every job is ok, 1 when any failed, was interrupted or
is missing (a job whose metrics.json holds a value of the wrong type counts as failed), 2
when no report can be made: DIR is not a sweep directory, or a report file cannot be
written (a read-only sweep, a directory in the place of ``sweep.csv``); one line each.
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from ..files import atomic_write
from .sweep_jobs import CONFIG_FALLBACK, METRIC_COLUMNS, Job, Report, _job_dirs, _key, collect
from .sweep_plot import plot_r_sweep

def _swept_columns(jobs: list[Job]) -> list[str]:
    """Override keys whose value differs between jobs (the swept ones), minus those a
    metric column already holds."""
    covered = {"bench"} | set(CONFIG_FALLBACK.values())
    per_job = [{_key(o).lstrip("+~"): o.split("=", 1)[1] if "=" in o else "" for o in j.overrides}
               for j in jobs]
    keys = list(dict.fromkeys(k for seen in per_job for k in seen))  # first-seen order
    values = {k: {seen.get(k) for seen in per_job} for k in keys}
    return [k for k, vs in values.items()
            if len(vs) > 1 and k not in covered and not k.startswith("hydra.")]


def csv_rows(jobs: list[Job]) -> tuple[list[str], list[dict]]:
    """Header and rows of sweep.csv."""
    extra = _swept_columns(jobs)
    header = ["job", "status"] + METRIC_COLUMNS + extra + ["overrides", "error", "dir"]
    rows = []
    for j in jobs:
        row = {"job": j.num, "status": j.status, **{c: j.get(c) for c in METRIC_COLUMNS}}
        ovs = {_key(o).lstrip("+~"): o.split("=", 1)[1] if "=" in o else "" for o in j.overrides}
        for k in extra:
            row[k] = ovs.get(k)
        row.update(overrides=" ".join(j.overrides), error=j.error or "", dir=str(j.dir or ""))
        rows.append({k: ("" if v is None else v) for k, v in row.items()})
    return header, rows


def _fmt(v, spec: str, missing: str = "-") -> str:
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return missing
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def _md_table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    def line(cells):
        return "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w)
                                 for c, w, a in zip(cells, widths, align)) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(widths, align)) + "|"
    return [line(header), sep] + [line(r) for r in rows]


def pairs(jobs: list[Job]) -> list[dict]:
    """opt3/opt2 pairs: for each bench named ``*opt3*`` with a ``*opt2*`` partner in the
    sweep, one pair per setting (overrides other than the bench), sorted by R descending."""
    common = set.intersection(*(set(j.overrides) for j in jobs)) if jobs else set()
    by = {}
    for j in jobs:
        b = j.get("bench")
        if b:
            by[(str(b), j.setting)] = j
    out = []
    for (b3, setting), j3 in by.items():
        if "opt3" not in b3:
            continue
        b2 = b3.replace("opt3", "opt2")
        j2 = by.get((b2, setting))
        if j2 is None:
            continue
        def ratio(col, j3=j3, j2=j2):
            if j3.status != "ok" or j2.status != "ok" or not j2.get(col):
                return None
            return j3.get(col) / j2.get(col)
        R = j3.get("calibration.R") if j3.get("calibration.R") is not None else j2.get("calibration.R")
        out.append({"opt3": j3, "opt2": j2, "R": R, "benches": (b3, b2),
                    "other": " ".join(o for o in setting if _key(o) != "calibration.R" and o not in common),
                    "dispatch_ratio": ratio("dispatch.cycles_per_tile"),
                    "latency_ratio": ratio("sim.latency_ns")})
    out.sort(key=lambda p: (p["other"], -(p["R"] if isinstance(p["R"], (int, float)) else 0)))
    return out


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
    lines += _md_table(["job", "status", "overrides", "latency ns", "cycles/tile", "cmds/tile",
                        "largest bound (of it)", "binding", "max abs err"], rows, "rllrrrllr")
    ps = pairs(jobs)
    if ps:
        lines += ["", "### opt3 vs opt2 (ratio = opt3 / opt2)", ""]
        with_other = any(p["other"] for p in ps)
        prow = []
        for p in ps:
            j3, j2 = p["opt3"], p["opt2"]
            def v(j, col, spec):
                return _fmt(j.get(col), spec) if j.status == "ok" else j.status
            r = [_fmt(p["R"], "g")] + ([p["other"] or "-"] if with_other else []) + [
                v(j3, "dispatch.cycles_per_tile", ".1f"), v(j2, "dispatch.cycles_per_tile", ".1f"),
                _fmt(p["dispatch_ratio"], ".2f") + ("×" if p["dispatch_ratio"] else ""),
                v(j3, "sim.latency_ns", ".1f"), v(j2, "sim.latency_ns", ".1f"),
                _fmt(p["latency_ratio"], ".2f") + ("×" if p["latency_ratio"] else "")]
            prow.append(r)
        head = ["R"] + (["other overrides"] if with_other else []) + [
            "opt3 cycles/tile", "opt2 cycles/tile", "dispatch ratio",
            "opt3 latency ns", "opt2 latency ns", "latency ratio"]
        lines += _md_table(head, prow, "r" + ("l" if with_other else "") + "rrrrrr")
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


def write_plot(jobs: list[Job], path: Path) -> None:
    """sweep.png: dispatch cycles per KV tile and latency against R, one line per bench
    (and per other swept setting); ok jobs only (drawn by kbframe.report.sweep_plot)."""
    common = set.intersection(*(set(j.overrides) for j in jobs)) if jobs else set()
    series = {}
    for j in jobs:
        if j.status != "ok" or j.get("calibration.R") is None:
            continue
        other = " ".join(o for o in j.setting if _key(o) != "calibration.R" and o not in common)
        label = str(j.get("bench")) + (f" {other}" if other else "")
        series.setdefault(label, []).append(
            (j.get("calibration.R"), j.get("dispatch.cycles_per_tile"), j.get("sim.latency_ns")))
    n_bad = sum(j.status != "ok" for j in jobs)
    title = f"kbframe sweep: {len(jobs) - n_bad} ok" + (f", {n_bad} not ok" if n_bad else "")
    plot_r_sweep(series, title, path)


def write_report(sweep_dir: Path | str, echo: bool = True) -> Report:
    """Collect the sweep's jobs and write sweep.csv, summary.md and sweep.png at its root.

    Args:
        echo: print the summary to stdout.
    Raises:
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
    text = summary_text(jobs, sweep_dir)
    write_csv(jobs, sweep_dir / "sweep.csv")
    atomic_write(sweep_dir / "summary.md", lambda tmp: tmp.write_text(text))
    write_plot(jobs, sweep_dir / "sweep.png")
    if echo:
        print(text, end="")
        print(f"files: {sweep_dir}/{{sweep.csv, summary.md, sweep.png}}")
    return Report(sweep_dir, jobs, text)


#: the files a report writes at the sweep root
REPORT_FILES = ("sweep.csv", "summary.md", "sweep.png")


def _newest_sweep(root: Path = Path("outputs/sweeps")) -> Path | None:
    dirs = [d for d in root.glob("*") if d.is_dir()] if root.is_dir() else []
    return max(dirs, key=lambda d: d.stat().st_mtime) if dirs else None


def main(argv=None) -> int:
    """``python -m kbframe.report [DIR ...]``: see the module doc."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if not args:
        newest = _newest_sweep()
        if newest is None:
            print("kbframe: error: no sweep directory given and none under outputs/sweeps/",
                  file=sys.stderr)
            return 2
        args = [str(newest)]
    rc = 0
    for a in args:
        d = Path(a)
        if not d.is_dir():
            print(f"kbframe: error: no such sweep directory '{d}'", file=sys.stderr)
            return 2
        if not (d / "multirun.yaml").is_file() and not _job_dirs(d):
            print(f"kbframe: error: '{d}' is not a sweep directory (no multirun.yaml, no job "
                  f"directories with .hydra/)", file=sys.stderr)
            return 2
        try:
            rep = write_report(d)
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
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
