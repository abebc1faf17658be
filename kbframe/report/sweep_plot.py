"""sweep.png: how dispatch cost and latency move with the dispatch cost model's R."""
from __future__ import annotations

from pathlib import Path

from ..files import atomic_write


def plot_r_sweep(series: dict, title: str, path: Path) -> None:
    """Two panels against R (log₂ axis at the swept values): PE_CPU dispatch cycles per KV
    tile and simulated latency (ns), one line per label.

    Args:
        series: label → ``[(R, cycles_per_tile, latency_ns), ...]``.
        title: the figure title. path: where the PNG goes (written atomically).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, pts in sorted(series.items()):
        pts = sorted(pts)
        xs = [p[0] for p in pts]
        axes[0].plot(xs, [p[1] for p in pts], "o-", label=label)
        axes[1].plot(xs, [p[2] for p in pts], "o-", label=label)
    xs = sorted({p[0] for pts in series.values() for p in pts})
    for ax, name, ylab in ((axes[0], "PE_CPU dispatch cost per KV tile", "cycles per tile"),
                           (axes[1], "simulated latency", "latency (ns)")):
        ax.set_title(name)
        ax.set_xlabel("R (cycles per logical byte)")
        ax.set_ylabel(ylab)
        if xs and xs[0] > 0:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
