"""Simulation speed of kbframe beside a bare SimPy pipeline (a script, not a test).

Runs decode_opt2 and decode_opt3 (TILE=64, G=8, d=128) at S_kv ∈ {4096, 131072, 1048576}
with data mode off and on, and decode_heads for Llama-3-70B (8 KV heads on the 8 PEs of one
cube) at S_kv = 131072 and one Llama-3-70B decoder layer (tp 8 on a cube) at S_kv = 32768,
timing only, each case in a fresh subprocess (so peak RSS is per case). The
subprocess runs the CLI (``python -m kbframe ... run.check=false``, the same ``main``) and
then, in the same process, times a bare SimPy 4-stage pipeline of processes connected by
``simpy.Store`` over the same number of stages (one stage = one token through one
pipeline process: get, hold, put; a token through all four is four stages).

Per case it reports: sim wall s (``metrics.json`` ``sim.wall_s``), whole-process wall s
(the CLI run, start-up included, bare pipeline excluded), simulated stages and events, µs
per stage, the bare pipeline's µs per stage and the ratio, the whole process against the
bare pipeline over the same stages (``whole/bare``), events per second, peak RSS
(of the CLI run, before the bare pipeline); per kernel and mode the scaling ratio
t(131072)/t(32768) of sim wall (when both are measured). Writes ``outputs/bench/sim_speed.json``.

    python benchmarks/sim_speed.py             # all 14 cases
    python benchmarks/sim_speed.py --quick     # opt3 at 4096 and 32768, data off and on
    python benchmarks/sim_speed.py --kernels heads --s-kv 131072 --no-data   # the decode_heads case alone
    python benchmarks/sim_speed.py --kernels layer --no-data --repeat 1      # the decoder layer alone
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import simpy

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "bench" / "sim_speed.json"
TARGET_RATIO = 2.0
TARGET_SCALING = 4.4
TARGET_RSS_MB = 300.0
TARGET_WALL_S = {False: 1.5, True: 3.0}  # decode_opt2 at 131072, data off / on


def bare_pipeline_s(n_stages: int, n_pipe: int = 4) -> tuple[float, int]:
    """Wall seconds of a bare SimPy pipeline: ``n_pipe`` processes connected by Stores, each
    taking a token, holding it one time unit and passing it on, over ``n_stages`` stages.

    Returns (wall seconds, stages simulated = tokens × n_pipe).
    """
    n_tokens = max(1, -(-n_stages // n_pipe))
    env = simpy.Environment()
    stores = [simpy.Store(env) for _ in range(n_pipe + 1)]

    def source():
        for i in range(n_tokens):
            yield stores[0].put(i)

    def stage(i):
        get, put = stores[i].get, stores[i + 1].put
        while True:
            tok = yield get()
            yield env.timeout(1)
            yield put(tok)

    def sink():
        for _ in range(n_tokens):
            yield stores[-1].get()

    env.process(source())
    for i in range(n_pipe):
        env.process(stage(i))
    done = env.process(sink())
    t0 = time.perf_counter()
    env.run(until=done)
    return time.perf_counter() - t0, n_tokens * n_pipe


def worker(report: str, overrides: list[str]) -> int:
    """In a fresh process: the CLI run, then the bare pipeline over its number of stages.
    Writes ``{"rss_kib", "bare_s", "bare_stages", "bare_total_s"}`` as JSON to ``report``
    (``bare_s``: the fastest of three bare runs; ``bare_total_s``: all three)."""
    import resource

    from kbframe.cli import main as cli
    sys.argv = ["kbframe", *overrides]
    try:
        cli.main()
    except SystemExit as e:
        if e.code not in (None, 0):
            return int(e.code) if isinstance(e.code, int) else 1
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    run_dir = Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")))
    stages = json.loads((run_dir / "metrics.json").read_text())["sim"]["stages"]
    t0 = time.perf_counter()
    bare = min(bare_pipeline_s(stages) for _ in range(3))
    bare_total = time.perf_counter() - t0
    Path(report).write_text(json.dumps({"rss_kib": rss_kib, "bare_s": bare[0], "bare_stages": bare[1],
                                        "bare_total_s": bare_total}))
    try:  # end as the kbframe command does (no second spent freeing the run's arrays)
        from kbframe.cli.speed import exit_now
    except ImportError:  # a tree without kbframe.cli.speed
        return 0
    exit_now(0)


#: decode_heads of Llama-3-70B: its 8 KV heads, one per PE of one cube
HEADS = ["+bench=decode_heads", "+model=llama3_70b", "hardware=cube"]
#: one decoder layer of Llama-3-70B over the 8 PEs of one cube (tensor parallel)
LAYER = ["+bench=decoder_layer", "+model=llama3_70b", "hardware=cube", "bench.tp=8", "bench.layers=1"]
#: cases run at one context length, timing only: their kernel, S_kv
FIXED = {"heads": 131072, "layer": 32768}


def case_overrides(kernel: str, s_kv: int, data: bool) -> list[str]:
    """The kbframe overrides of a case: ``kernel`` is opt2 / opt3 (decode_opt2/3, G=8 d=128
    TILE=64) or heads (:data:`HEADS`)."""
    bench = {"heads": HEADS, "layer": LAYER}.get(kernel) or [f"+bench=decode_{kernel}", "bench.G=8", "bench.d=128"]
    return [*bench, f"bench.S_kv={s_kv}", f"bench.data={str(data).lower()}", "bench.tile=64"]


def label(kernel: str) -> str:
    return {"heads": "decode_heads", "layer": "decoder_layer"}.get(kernel, f"decode_{kernel}")


def run_case(kernel: str, s_kv: int, data: bool, extra: list[str], tree: Path = ROOT) -> dict:
    """One case in a fresh subprocess (:func:`worker`); figures from metrics.json and it.
    ``tree``: the kbframe source tree to import (another checkout, for before/after)."""
    run_dir = Path(tempfile.mkdtemp(prefix="kbframe_speed_"))
    report = run_dir / "worker.json"
    overrides = [*case_overrides(kernel, s_kv, data), "run.check=false", "run.progress=false",
                 f"hydra.run.dir={run_dir / 'run'}", *extra]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(report), *overrides]
    os.sync()  # the previous case's files (tensors.npz: 268 MB at 131072) are not written back during this one
    try:
        t0 = time.perf_counter()
        env = dict(os.environ, PYTHONPATH=str(tree)) if tree != ROOT else None
        p = subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        total = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n"
                               f"{p.stderr.decode(errors='replace')[-3000:]}")
        w = json.loads(report.read_text())
        m = json.loads((run_dir / "run" / "metrics.json").read_text())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"kernel": label(kernel), "S_kv": s_kv, "data": data,
            "wall_s": m["sim"]["wall_s"], "process_wall_s": total - w["bare_total_s"],
            "stages": m["sim"]["stages"], "events": m["sim"]["events"],
            "peak_rss_mb": w["rss_kib"] / 1024.0, "bare_wall_s": w["bare_s"], "bare_stages": w["bare_stages"]}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a quick subset: decode_opt3 at S_kv 4096 and 32768, data off and on")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per case, each in a fresh process; the fastest (by sim wall) is kept "
                         "(default 3: this is a shared 2-core machine)")
    ap.add_argument("--kernels", default="opt2,opt3,heads,layer",
                    help="comma list of opt2, opt3 (data off and on at every --s-kv), heads "
                         "(decode_heads, Llama-3-70B on 8 PEs, timing only, S_kv 131072 when listed) and "
                         "layer (one Llama-3-70B decoder layer, tp 8 on a cube, timing only, S_kv 32768)")
    ap.add_argument("--no-data", action="store_true", help="timing-only cases only")
    ap.add_argument("--s-kv", default="4096,131072,1048576", help="comma list of S_kv")
    ap.add_argument("--tree", type=Path, default=ROOT,
                    help="kbframe source tree to measure (default: this checkout)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"JSON output (default {OUT.relative_to(ROOT)})")
    ap.add_argument("extra", nargs="*", help="extra kbframe overrides for every case")
    args = ap.parse_args()
    kernels = ["opt3"] if args.quick else args.kernels.split(",")
    s_kvs = [4096, 32768] if args.quick else [int(s) for s in args.s_kv.split(",")]

    # round-robin repeats: a busy spell on this shared machine then slows one run of
    # several cases, not every run of one case (the fastest run of each case is kept)
    datas = (False,) if args.no_data else (False, True)
    cases = [(kernel, s_kv, data) for kernel in kernels if kernel not in FIXED for data in datas for s_kv in s_kvs]
    if "heads" in kernels and 131072 in s_kvs:  # Llama-3-70B's heads: timing only, the longest context
        cases.append(("heads", 131072, False))
    if "layer" in kernels:  # one Llama-3-70B layer on a cube at 32K: timing only
        cases.append(("layer", FIXED["layer"], False))
    runs: dict = {c: [] for c in cases}
    n_rep = max(1, args.repeat)
    # the tree's bytecode once, as `make` does: under PYTHONDONTWRITEBYTECODE every run
    # would compile kbframe again, and two trees would not be compared alike
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(args.tree.resolve() / "kbframe")], check=True)
    for rep in range(n_rep):
        for kernel, s_kv, data in cases:
            x = run_case(kernel, s_kv, data, args.extra, args.tree.resolve())
            runs[(kernel, s_kv, data)].append(x)
            print(f"  [{rep + 1}/{n_rep}] {label(kernel)} S_kv={s_kv} data={data}: {x['wall_s']:.3f} s",
                  file=sys.stderr)
    rows = []
    for case in cases:
        rr = runs[case]
        r = dict(min(rr, key=lambda x: x["wall_s"]))
        r["peak_rss_mb"] = max(x["peak_rss_mb"] for x in rr)
        r["process_wall_s"] = min(x["process_wall_s"] for x in rr)
        r["bare_wall_s"], r["bare_stages"] = min((x["bare_wall_s"], x["bare_stages"]) for x in rr)
        r["us_per_stage"] = r["wall_s"] / r["stages"] * 1e6
        r["bare_us_per_stage"] = r["bare_wall_s"] / r["bare_stages"] * 1e6
        r["bare_us_per_token"] = 4 * r["bare_us_per_stage"]
        r["ratio_to_bare"] = r["us_per_stage"] / r["bare_us_per_stage"]
        # the whole command against the bare pipeline over the same stages
        r["whole_over_bare"] = r["process_wall_s"] / (r["bare_us_per_stage"] * r["stages"] / 1e6)
        r["events_per_s"] = r["events"] / r["wall_s"]
        rows.append(r)

    scaling = {}
    for kernel in kernels:
        for data in (False, True):
            by_s = {r["S_kv"]: r["wall_s"] for r in rows if r["kernel"] == label(kernel) and r["data"] == data}
            if 131072 in by_s and 32768 in by_s:
                scaling[f"{label(kernel)}/{'data' if data else 'nodata'}"] = by_s[131072] / by_s[32768]
    for r in rows:
        key = f"{r['kernel']}/{'data' if r['data'] else 'nodata'}"
        r["t131072_over_t32768"] = scaling.get(key)

    hdr = (f"{'kernel':<12} {'S_kv':>7} {'data':>5} {'sim s':>7} {'proc s':>7} {'stages':>7} "
           f"{'µs/stage':>8} {'bare µs':>7} {'ratio':>6} {'whole/bare':>10} {'Mev/s':>6} {'RSS MB':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['kernel']:<12} {r['S_kv']:>7} {'on' if r['data'] else 'off':>5} {r['wall_s']:>7.3f} "
              f"{r['process_wall_s']:>7.2f} {r['stages']:>7} {r['us_per_stage']:>8.2f} "
              f"{r['bare_us_per_stage']:>7.2f} {r['ratio_to_bare']:>6.2f} {r['whole_over_bare']:>10.2f} "
              f"{r['events_per_s'] / 1e6:>6.3f} "
              f"{r['peak_rss_mb']:>7.0f}")
    for key, v in scaling.items():
        print(f"t(131072)/t(32768) {key}: {v:.2f}  (target ≤ {TARGET_SCALING})")

    verdict = {}
    for r in rows:
        if r["kernel"] == "decode_opt2" and r["S_kv"] == 131072:
            tag = "data" if r["data"] else "nodata"
            verdict[f"opt2_131072_{tag}_wall_s"] = [r["wall_s"], TARGET_WALL_S[r["data"]]]
            verdict[f"opt2_131072_{tag}_rss_mb"] = [r["peak_rss_mb"], TARGET_RSS_MB]
            verdict[f"opt2_131072_{tag}_ratio_to_bare"] = [r["ratio_to_bare"], TARGET_RATIO]
    if rows:
        verdict["worst_ratio_to_bare"] = [max(r["ratio_to_bare"] for r in rows), TARGET_RATIO]
    for key, v in scaling.items():
        verdict[f"scaling_{key}"] = [v, TARGET_SCALING]
    if verdict:
        print("targets (value / limit): " + "; ".join(
            f"{k} {v:.3g}/{lim:g} {'ok' if v <= lim else 'MISS'}" for k, (v, lim) in verdict.items()))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform(), "simpy": simpy.__version__},
           "bare_pipeline": "4 SimPy processes connected by simpy.Store, timed in each case's process "
                            "after the CLI run; stage = one token through one process (get + timeout(1) "
                            "+ put), token = 4 stages",
           "quick": args.quick, "repeat": args.repeat, "extra_overrides": args.extra,
           "cases": rows, "scaling_t131072_over_t32768": scaling,
           "targets": {k: {"value": v, "limit": lim, "ok": v <= lim} for k, (v, lim) in verdict.items()}}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
