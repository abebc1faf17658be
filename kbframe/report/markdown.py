"""Numbers and tables for the Markdown a report prints and saves (summary.md)."""
from __future__ import annotations

import math


def fmt(v, spec: str, missing: str = "-") -> str:
    """``v`` formatted with ``spec``; ``missing`` for None, "" and NaN; text as it is."""
    if v is None or v == "" or (isinstance(v, float) and math.isnan(v)):
        return missing
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    """A Markdown table's lines; ``align`` has one letter per column: ``l`` or ``r``."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    def line(cells):
        return "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w)
                                 for c, w, a in zip(cells, widths, align)) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(widths, align)) + "|"
    return [line(header), sep] + [line(r) for r in rows]
