"""The roofline and unit-utilisation table of the console summary.

Reads only ``metrics.json`` fields (``roofline.*``, ``units.*``, ``sim.latency_ns``):

- the lower bounds on latency: ``hbm`` = the busiest DMA channel's bytes / its
  bandwidth (read and write channels overlap),
  ``compute`` = GEMM FLOPs / GEMM peak, ``dispatch`` = PE_CPU dispatch cycles / clock;
  on many PEs, each the largest PE's (they work in parallel), and with shared HBM at least
  each cube's bytes / the cube's bandwidth (kbframe.run.metrics);
  with collectives (a decoder layer), ``link`` = the busiest PE's IPCQ send time
  (``phases.link_bound_ns``), printed under them;
  ``largest_bound`` names the largest of the three, ``bound_ns`` is it and ``fraction`` = bound /
  simulated latency. A bound is only a bound: ``binding`` is the critical path's kind
  (:mod:`kbframe.report.critical_path`: ``hbm``, ``compute``, ``dispatch`` or ``chain``),
  which says what really sets the latency (before it, ``binding`` named the
  largest bound and said "hbm" for a run whose DMA was idle 45 % of the time);
- per unit (by the ``label`` it declares): busy time (a DMA channel counts its data phases, when it moves bytes), busy /
  latency, stages (dispatches for ``cpu``), bytes (moved for DMA, read for GEMM/MATH,
  logical bytes dispatched for ``cpu``).
"""
from __future__ import annotations

def table_lines(metrics: dict, indent: str = "  ") -> list[str]:
    """Lines of the roofline/utilisation table for ``metrics``."""
    r = metrics["roofline"]
    lat = metrics["sim"]["latency_ns"] or 0.0
    d = metrics.get("dispatch", {})
    work = {"hbm": f"{r['hbm_bytes']:,} B",
            "compute": f"{r['flops']:,} FLOP",
            "dispatch": f"{d.get('cycles', 0):,.1f} cycles, {d.get('commands', 0):,} commands"}
    n_pes = len(metrics.get("pes") or [])
    if n_pes > 1:  # the work of every PE; each bound is the largest PE's
        work = {k: f"{v} on {n_pes} PEs" for k, v in work.items()}
    lines = [f"{indent}{'bound':<10}{'ns':>12}{'of latency':>12}  work"]
    for name in ("hbm", "compute", "dispatch"):
        ns = r[f"{name}_ns"]
        mark = "  ← binding" if name == r["binding"] else "  ← largest" if name == r.get("largest_bound") else ""
        share = f"{ns / lat:.1%}" if lat else "-"
        lines.append(f"{indent}{name:<10}{ns:>12.1f}{share:>12}  {work[name]}{mark}")
    link_ns = (metrics.get("phases") or {}).get("link_bound_ns")
    if link_ns:  # a decoder layer's collectives: the busiest PE's IPCQ send time (kbframe.run.phases)
        moved = sum(c["bytes"] for c in metrics.get("collectives", []))
        share = f"{link_ns / lat:.1%}" if lat else "-"
        lines.append(f"{indent}{'link':<10}{link_ns:>12.1f}{share:>12}  "
                     f"{moved:,} B all-reduced ({len(metrics.get('collectives', []))} all-reduces)")
    pes = metrics.get("pes") or []
    # many PEs: the table is the first PE's (metrics.json pes[] has every PE's)
    head = "unit" if len(pes) < 2 else f"PE{pes[0]['pe']} unit"
    lines.append(f"{indent}{head:<10}"
                 f"{'busy ns':>12}{'util':>12}{'count':>11}{'bytes':>18}")
    for name, u in metrics.get("units", {}).items():
        if name == "scheduler":
            continue
        lines.append(f"{indent}{u.get('label', name):<10}{u['busy_ns']:>12.1f}"
                     f"{u['utilisation']:>12.1%}{u['count']:>11,}{u['bytes']:>18,}")
    return lines
