"""sweep.png: how dispatch cost and latency move with a swept key."""
from __future__ import annotations

import math
from pathlib import Path

from ..files import atomic_write


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _power_of_two(v: float) -> bool:
    return v > 0 and math.log2(v).is_integer()


def plot_sweep(series: dict, x_label: str, xs: list, unit: str, title: str, path: Path,
               second: tuple = ("simulated latency", "latency (ns)")) -> None:
    """Two panels against the swept key: PE_CPU dispatch cycles per unit of progress and
    simulated latency (ns), or what ``second`` (its title, its axis label) names, one line
    per label.

    The x-axis is numeric when every swept value is a number (log₂ when they are all
    powers of two, e.g. R 0.03125..0.25 or a context length 64..131072; log₁₀ when positive and
    spanning ≥ 100×; else linear), ticks at the swept values; otherwise categorical, in the
    order of ``xs``.

    Args:
        series: label → ``[(x, cycles_per_unit, latency_ns or the second panel's value), ...]``,
            drawn in dict order.
        x_label: the swept key on the x-axis. xs: its values, sorted.
        unit: the workload's unit of progress ("KV tile", "output block").
        title: the figure title. path: where the PNG goes (written atomically).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = bool(xs) and all(_is_number(x) for x in xs)
    pos = (lambda x: x) if numeric else (lambda x: xs.index(x) if x in xs else len(xs))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for label, pts in series.items():
        pts = sorted(pts, key=lambda p: pos(p[0]))
        for ax, i in ((axes[0], 1), (axes[1], 2)):
            ax.plot([pos(p[0]) for p in pts], [p[i] for p in pts], "o-", label=label)
    for ax, name, ylab in ((axes[0], f"PE_CPU dispatch cost per {unit}", f"cycles per {unit}"),
                           (axes[1], *second)):
        ax.set_title(name)
        ax.set_xlabel(x_label)
        ax.set_ylabel(ylab)
        if numeric and xs[0] > 0 and all(_power_of_two(x) for x in xs) and len(xs) > 2:
            ax.set_xscale("log", base=2)
        elif numeric and xs[0] > 0 and xs[-1] / xs[0] >= 100:
            ax.set_xscale("log", base=10)
        if xs and len(xs) <= 16:
            ax.set_xticks([pos(x) for x in xs], [f"{x:g}" if numeric else str(x) for x in xs],
                          rotation=0 if numeric or max(len(str(x)) for x in xs) < 8 else 30,
                          ha="center" if numeric or max(len(str(x)) for x in xs) < 8 else "right")
            ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=7 if len(series) > 6 else 8)
        else:
            ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)


def plot_pareto(points: list, x_label: str, y_label: str, limit: float | None, title: str, path: Path) -> None:
    """pareto.png: a search's trials in the plane of two quantities.

    Args:
        points: ``[(x, y, feasible, best, on_front, job_number), ...]``: feasible trials as
            blue dots, infeasible ones as grey crosses; the front (``on_front``) joined by a
            red step line, each labelled with its job number; the best trial (one
            objective) as a star.
        x_label, y_label: the quantities (metrics.json names). limit: a constraint's limit
            on x, drawn as a dashed line (None: none).
        title: the figure title. path: where the PNG goes (written atomically).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    ok = [p for p in points if p[2]]
    bad = [p for p in points if not p[2]]
    if ok:
        ax.scatter([p[0] for p in ok], [p[1] for p in ok], c="tab:blue", s=28, label="feasible trial", zorder=2)
    if bad:
        ax.scatter([p[0] for p in bad], [p[1] for p in bad], c="0.6", marker="X", s=28,
                   label="infeasible trial", zorder=2)
    front = sorted((p for p in points if p[4]), key=lambda p: (p[0], p[1]))
    if front:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", c="tab:red", lw=1.2, zorder=3)
        ax.scatter([p[0] for p in front], [p[1] for p in front], facecolors="none", edgecolors="tab:red",
                   s=70, lw=1.4, label="front", zorder=3)
    for p in points:
        if p[3]:
            ax.scatter([p[0]], [p[1]], marker="*", c="gold", edgecolors="black", s=220, zorder=4)
            ax.annotate(f"best: job {p[5]}", (p[0], p[1]), textcoords="offset points", xytext=(8, 8), fontsize=9)
        elif p[4]:
            ax.annotate(f"job {p[5]}", (p[0], p[1]), textcoords="offset points", xytext=(6, 6), fontsize=8)
    if limit is not None:
        ax.axvline(limit, ls="--", c="0.3", lw=1, label=f"limit {limit:g}")
    xs = [p[0] for p in points]
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 30:  # bytes from KiB to MiB: a log axis
        ax.set_xscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no finished trials", ha="center", va="center", transform=ax.transAxes)
    import textwrap
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
