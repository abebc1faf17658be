"""Where split-K starts to pay (a script, not a test): tables from the sweeps
``+sweep=splitk_crossover`` and ``+sweep=splitk_merge``.

Reads every ok job's ``metrics.json`` under the sweep directories given (the ``dir`` column of
``sweep.csv``) and prints markdown:

* per HBM mode, for each S_kv, the latency of one KV head on 1 PE (splits = 1: the same commands as
  decode_heads' one head per PE) and split over 2, 4, 8 PEs, with the speed-up over 1 PE,
  and for each P the *crossover*: the smallest S_kv from which P splits are faster than one
  PE at every longer S_kv of the sweep;
* for each P and S_kv, the latency of the three merge topologies, and chain and gather
  relative to tree.

    python -m kbframe -m +sweep=splitk_crossover
    python -m kbframe -m +sweep=splitk_merge
    python benchmarks/splitk_sweep.py outputs/sweeps/<crossover> outputs/sweeps/<merge>
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def jobs(sweep_dirs: list[Path]) -> list[dict]:
    """``{"splits", "merge", "S_kv", "pes", "hbm_mode", "latency_ns"}`` of every ok decode_splitk
    job (``hbm_mode`` from the sweep's ``hardware.hbm_mode`` column, else the cube's default)."""
    out = []
    for sd in sweep_dirs:
        with open(sd / "sweep.csv", newline="") as f:
            for row in csv.DictReader(f):
                if row["status"] != "ok" or not row["dir"]:
                    continue
                m = json.loads((Path(row["dir"]) / "metrics.json").read_text())
                s = m["shape"]
                if m["workload"] != "DecodeSplitk":
                    continue
                out.append({"splits": s["splits"], "merge": s["merge"], "S_kv": s["S_kv"], "pes": s["pes"],
                            "hbm_mode": row.get("hardware.hbm_mode") or "partitioned",
                            "latency_ns": m["sim"]["latency_ns"]})
    return out


def crossover_table(rows: list[dict], merge: str = "tree") -> str:
    rows = [r for r in rows if r["merge"] == merge or r["splits"] == 1]
    lat = {(r["S_kv"], r["splits"]): r["latency_ns"] for r in rows}
    s_kvs = sorted({s for s, p in lat if p == 1})
    # the splits measured at every S_kv of the one-PE runs (a merge sweep's P = 32 is not)
    ps = sorted(p for p in {p for _, p in lat} if all((s, p) in lat for s in s_kvs))
    if 1 not in ps:
        return ""
    lines = ["| S_kv | " + " | ".join(f"{p} PE{'s' if p > 1 else ''} µs" for p in ps) + " | "
             + " | ".join(f"×{p}" for p in ps if p > 1) + " | fastest |",
             "|---:|" + "---:|" * (2 * len(ps) - 1) + "---:|"]
    for s in s_kvs:
        base = lat[(s, 1)]
        cells = [f"{lat[(s, p)] / 1000:.2f}" for p in ps]
        ups = [f"{base / lat[(s, p)]:.2f}" for p in ps if p > 1]
        best = min(ps, key=lambda p: lat[(s, p)])
        lines.append(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(ups) + f" | {best} PE{'s' if best > 1 else ''} |")
    lines.append("")
    for p in ps:
        if p == 1:
            continue
        wins = [s for s in s_kvs if (s, p) in lat and (s, 1) in lat and lat[(s, p)] < lat[(s, 1)]]
        cross = next((s for s in s_kvs if all(t in wins for t in s_kvs if t >= s)), None)
        at = ("never" if cross is None else
              f"at every S_kv measured (from {cross} on)" if cross == s_kvs[0] else f"from S_kv = {cross} on")
        lines.append(f"- {p} splits ({merge} merge) beat 1 PE {at}")
    return "\n".join(lines)


def merge_table(rows: list[dict]) -> str:
    lat = {(r["pes"], r["S_kv"], r["merge"]): r["latency_ns"] for r in rows if r["splits"] > 1}
    keys = sorted({(p, s) for p, s, _ in lat})
    lines = ["| P | S_kv | tree µs | chain µs | gather µs | chain / tree | gather / tree |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for p, s in keys:
        t, c, g = (lat.get((p, s, m)) for m in ("tree", "chain", "gather"))
        if None in (t, c, g):
            continue
        lines.append(f"| {p} | {s} | {t / 1000:.2f} | {c / 1000:.2f} | {g / 1000:.2f} | {c / t:.3f} | {g / t:.3f} |")
    return "\n".join(lines)


def main() -> int:
    dirs = [Path(a) for a in sys.argv[1:]]
    if not dirs:
        print(__doc__)
        return 2
    rows = jobs(dirs)
    for mode in sorted({r["hbm_mode"] for r in rows}, reverse=True):
        sub = [r for r in rows if r["hbm_mode"] == mode]
        table = crossover_table(sub)
        if table:
            print(f"HBM {mode}:\n\n{table}\n")
        table = merge_table(sub)
        if table.count("\n") > 1:
            print(f"HBM {mode}, merge topologies:\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
