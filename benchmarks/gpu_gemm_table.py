"""The prediction table of docs/gpu.md: the four projection GEMMs of a Llama-3-70B and a
Llama-3-8B layer (QKV, O, gate+up fused, down; K and N from conf/model/, split over TP) at
TP 1, 2, 4, 8 and M (tokens) 1 .. 2048, bf16, timing only, on ``hardware=h100_sxm`` and
``hardware=a100_sxm_80g``, every SM used (``bench.pes=all``, ``bench.split=mn``: CTA-like
output tiles round-robin over the SMs).

    .venv/bin/python benchmarks/gpu_gemm_table.py              # all 384 runs, 2 at a time
    .venv/bin/python benchmarks/gpu_gemm_table.py --jobs 1 --m 1,8   # fewer
    .venv/bin/python benchmarks/gpu_gemm_table.py --summary OUT.md   # the summary of an earlier output

Per run: kbframe's predicted time (``sim.latency_ns``, launch included), the roofline time
``max(unique bytes / achievable HBM bandwidth, FLOPs / achievable tensor rate) + launch``
(unique bytes: A, B and C once each, ``2·(M·K + K·N + M·N)``), which side of it binds, the
HBM bytes the simulation moved over the unique bytes (operands re-read per output tile:
the model has no L2), and the achieved fraction of the binding side's achievable rate.
Each case runs in-process into a temporary directory; the table goes to stdout as Markdown,
then the wall time.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

MODELS = {"llama3_70b": "Llama-3-70B", "llama3_8b": "Llama-3-8B"}
PRESETS = ("h100_sxm", "a100_sxm_80g")
TPS = (1, 2, 4, 8)
MS = (1, 8, 32, 128, 512, 2048)
GEMMS = ("qkv", "o", "gate_up", "down")


def shapes(model: str, tp: int) -> dict:
    """``{gemm: (K, N)}`` of one layer's projections at tensor parallelism ``tp``: QKV
    K = H, N = (H_q + 2·H_kv)·d / tp; O K = H_q·d / tp, N = H; gate+up K = H, N = 2·F / tp;
    down K = F / tp, N = H (dimensions from ``conf/model/<model>.yaml``)."""
    c = OmegaConf.load(ROOT / "conf" / "model" / f"{model}.yaml")
    H, hq, hkv, d, F = int(c.H), int(c.H_q), int(c.H_kv), int(c.d), int(c.F)
    return {"qkv": (H, (hq + 2 * hkv) * d // tp), "o": (hq * d // tp, H), "gate_up": (H, 2 * F // tp),
            "down": (F // tp, H)}


def one(preset: str, model: str, tp: int, gemm: str, M: int) -> dict:
    """One run's row (module doc)."""
    from conftest import compose_cfg
    from kbframe.run.bench import run_bench
    K, N = shapes(model, tp)[gemm]
    with tempfile.TemporaryDirectory() as d:
        cfg = compose_cfg(f"hardware={preset}", "bench.pes=all", "bench.split=mn", f"bench.M={M}", f"bench.K={K}",
                          f"bench.N={N}", "bench.dtype=bfloat16", "bench.data=false", "run.progress=false",
                          "run.trace=false", "run.check=false", bench="gemm_ref_ref")
        hw = cfg.hardware
        bw = float(hw.cube_hbm_gbps)  # achievable, GB/s = bytes/ns
        rate = float(hw.units.gemm.peak_tflops) * int(hw.n_pes) * 1000.0  # achievable, flop/ns
        launch = float(hw.units.cpu.launch_ns)
        m = run_bench(cfg, Path(d) / "run")
    unique = 2 * (M * K + K * N + M * N)
    flops = 2 * M * N * K
    hbm_ns, compute_ns = unique / bw, flops / rate
    lat = m["sim"]["latency_ns"]
    binds = "hbm" if hbm_ns >= compute_ns else "compute"
    achieved = (m["hbm"]["achieved_gbps"] / bw) if binds == "hbm" else (flops / lat / rate)
    return {"preset": preset, "model": model, "tp": tp, "gemm": gemm, "M": M, "K": K, "N": N,
            "predicted_us": lat / 1000, "roofline_us": (max(hbm_ns, compute_ns) + launch) / 1000, "binds": binds,
            "reread": m["hbm"]["bytes"] / unique, "achieved": achieved,
            "model_binding": m["roofline"]["largest_bound"]}


def cases(ms=MS) -> list:
    return [(p, mo, tp, g, M) for p in PRESETS for mo in MODELS for tp in TPS for g in GEMMS for M in ms]


HEADER = ("| GPU | model | TP | GEMM | M | K | N | predicted µs | roofline µs | binds | predicted / roofline "
          "| HBM bytes / unique | achieved of binding side |")


def row_text(r: dict) -> str:
    return (f"| {r['preset']} | {MODELS[r['model']]} | {r['tp']} | {r['gemm']} | {r['M']} | {r['K']} | {r['N']} | "
            f"{r['predicted_us']:.1f} | {r['roofline_us']:.1f} | {r['binds']} | "
            f"{r['predicted_us'] / r['roofline_us']:.2f} | {r['reread']:.2f} | {r['achieved']:.1%} |")


def parse(text: str) -> list:
    """The rows of an earlier output (:func:`row_text`), as :func:`one` returns them."""
    names = {v: k for k, v in MODELS.items()}
    rows = []
    for line in text.splitlines():
        p = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(p) == 13 and p[0] in PRESETS:
            rows.append({"preset": p[0], "model": names[p[1]], "tp": int(p[2]), "gemm": p[3], "M": int(p[4]),
                         "K": int(p[5]), "N": int(p[6]), "predicted_us": float(p[7]), "roofline_us": float(p[8]),
                         "binds": p[9], "reread": float(p[11]), "achieved": float(p[12].rstrip("%")) / 100})
    return rows


def summary(rows: list) -> list[str]:
    """Per GPU and M: the runs, which side binds, the geometric mean and range of predicted /
    roofline, and the range of HBM bytes moved / unique bytes."""
    out = ["| GPU | M | runs | binds (roofline) | predicted / roofline: geomean (min – max) | HBM bytes / unique |",
           "|---|---:|---:|---|---|---|"]
    for preset in PRESETS:
        for M in sorted({r["M"] for r in rows}):
            g = [r for r in rows if r["preset"] == preset and r["M"] == M]
            if not g:
                continue
            ratio = [r["predicted_us"] / r["roofline_us"] for r in g]
            geo = math.exp(sum(math.log(x) for x in ratio) / len(ratio))
            sides = ", ".join(f"{s} {sum(r['binds'] == s for r in g)}" for s in ("hbm", "compute")
                              if any(r["binds"] == s for r in g))
            out.append(f"| {preset} | {M} | {len(g)} | {sides} | {geo:.2f} ({min(ratio):.2f} – {max(ratio):.2f}) | "
                       f"{min(r['reread'] for r in g):.2f} – {max(r['reread'] for r in g):.2f} |")
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (joblib; default 2)")
    ap.add_argument("--m", default=",".join(map(str, MS)), help="token counts M, comma-separated")
    ap.add_argument("--summary", metavar="OUT", help="print the summary of an earlier output file and stop")
    args = ap.parse_args(argv)
    if args.summary:
        print("\n".join(summary(parse(Path(args.summary).read_text(encoding="utf-8")))))
        return
    ms = tuple(int(x) for x in args.m.split(","))
    t0 = time.perf_counter()
    todo = cases(ms)
    if args.jobs > 1:
        from joblib import Parallel, delayed
        rows = Parallel(n_jobs=args.jobs)(delayed(one)(*c) for c in todo)
    else:
        rows = [one(*c) for c in todo]
    wall = time.perf_counter() - t0
    print("\n".join(summary(rows)))
    print()
    print(HEADER)
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(row_text(r))
    print(f"\n{len(rows)} runs in {wall:.0f} s wall ({args.jobs} worker(s)).")


if __name__ == "__main__":
    main(sys.argv[1:])
