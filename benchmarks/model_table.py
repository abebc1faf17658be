"""The model decode table of README.md and docs/decoder_layer.md ("A model's decode step"):
Llama-3-8B and Llama-3-70B, one decode step (one token for each of the batch's sequences)
on ``hardware=cube`` (8 PEs, one 64 GiB HBM) and ``hardware=cube_mesh`` (2×2 cubes, 32 PEs,
tp 8 spread over the cubes), tp 8 (one KV head a rank), at 8192, 32768 and 131072 cached
tokens and batch 1, 8 and 32, timing only.

A whole step (32 or 80 layers) costs minutes of simulation a cell, so each cell simulates
one and two layers and takes the step as latency(L) = latency(1) + (L − 1)·(latency(2) −
latency(1)), L the preset's layer count (:func:`extrapolate`); the analytic estimate
(``step.analytic_ns``) and the HBM roofline (``roofline.hbm_ns``: weights and KV bytes over
the PE's HBM bandwidth) the same way. ``--check`` compares that with the real steps of a
few cells (:data:`CHECKS`). A cell whose weights and KV cache do not fit the hardware's
HBM is refused by kbframe's own checks (the workload's and pre-flight's, on the full layer
count) and shown as "does not fit" with the GiB it needs and has.

    .venv/bin/python benchmarks/model_table.py            # the table (9 min of CPU, 2.8 GB)
    .venv/bin/python benchmarks/model_table.py --quick    # 8192 cached tokens only
    .venv/bin/python benchmarks/model_table.py --check    # the extrapolation against real steps (CHECKS)

Each run is in-process into a temporary directory, one after another; the tables go to
stdout as Markdown, progress to stderr.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import compose_cfg  # noqa: E402
from kbframe.errors import HbmCapacityError  # noqa: E402
from kbframe.run import preflight  # noqa: E402
from kbframe.run.bench import run_bench, validate  # noqa: E402

MODELS = {"llama3_70b": "Llama-3-70B", "llama3_8b": "Llama-3-8B"}
HARDWARE = ("cube", "cube_mesh")
CONTEXTS = (8192, 32768, 131072)
BATCHES = (1, 8, 32)
RUN = ("bench.tp=8", "bench.data=false", "run.check=false", "run.trace=false", "run.progress=false")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def extrapolate(one: float, two: float, layers: int) -> float:
    """A step of ``layers`` layers from one of 1 layer and one of 2: every layer after the
    first costs what the second did."""
    return one + (layers - 1) * (two - one)


def config(model: str, hardware: str, context: int, batch: int, layers: int | None = None):
    """The composed config of one cell (``layers``: the preset's when None)."""
    ov = [f"+model={model}", f"hardware={hardware}", f"bench.S_kv={context}", f"bench.batch={batch}", *RUN]
    if hardware == "cube_mesh":
        ov.append("bench.placement=spread")
    if layers is not None:
        ov.append(f"bench.layers={layers}")
    return compose_cfg(*ov, bench="decoder_layer")


def run(cfg) -> dict:
    with tempfile.TemporaryDirectory() as d:
        return run_bench(cfg, Path(d) / "run")


def refusal(model: str, hardware: str, context: int, batch: int) -> str | None:
    """None if the whole step's weights and KV cache fit the hardware's HBM, else "does not
    fit: N GiB needed, M GiB available" from kbframe's refusal of a run of the full step
    (kbframe.run.preflight.model_refusal: the workload's per-cube check, then the HBM check)."""
    cfg = config(model, hardware, context, batch, 1)
    why = preflight.model_refusal(cfg, validate(cfg))
    if why is None:
        return None
    if not isinstance(why, HbmCapacityError):
        return f"does not fit: {why}"
    return f"does not fit: {why.need_bytes / 2 ** 30:.0f} GiB needed, {why.have_bytes / 2 ** 30:.0f} GiB available"


def cell(model: str, hardware: str, context: int, batch: int) -> dict:
    """One cell: the one- and two-layer runs and the step extrapolated from them."""
    layers = int(config(model, hardware, context, batch).bench.layers)
    no = refusal(model, hardware, context, batch)
    if no:
        return {"refused": no}
    m1 = run(config(model, hardware, context, batch, 1))
    m2 = run(config(model, hardware, context, batch, 2))
    lat = extrapolate(m1["step"]["latency_ns"], m2["step"]["latency_ns"], layers)
    analytic = extrapolate(m1["step"]["analytic_ns"], m2["step"]["analytic_ns"], layers)
    roof = extrapolate(m1["roofline"]["hbm_ns"], m2["roofline"]["hbm_ns"], layers)
    # the phase with the most critical-path time in the second layer (two-layer run less one-layer run)
    path1 = {e["phase"]: e["critical_path_ns"] for e in m1["phases"]["by_phase"]}
    per = [(e["critical_path_ns"] - path1.get(e["phase"], 0.0), e) for e in m2["phases"]["by_phase"]]
    top_ns, top = max(per, key=lambda x: x[0])
    layer_ns = m2["step"]["latency_ns"] - m1["step"]["latency_ns"]
    return {"layers": layers, "latency_ns": lat, "tokens_per_s": batch / lat * 1e9, "analytic_ns": analytic,
            "roofline_ns": roof, "binding": m2["step"]["binding"], "phase": top["phase"],
            "phase_binding": top["binding"], "phase_share": top_ns / layer_ns,
            "records": m1["sim"]["events"] + m2["sim"]["events"]}


def table(cells: dict, model: str) -> list[str]:
    head = ["| hardware | S_kv | batch | ms / token | tokens/s | binding (largest phase on the path: its share, "
            "binding) | analytic ms (DES / analytic) | HBM roofline ms (DES / roofline) |",
            "|---|---:|---:|---:|---:|---|---:|---:|"]
    rows = []
    for (mod, hw, ctx, b), c in cells.items():
        if mod != model:
            continue
        lead = f"| `{hw}` | {ctx} | {b} |"
        if "refused" in c:
            rows.append(f"{lead} {c['refused']} | | | | |")
            continue
        lat = c["latency_ns"]
        rows.append(f"{lead} {lat / 1e6:.2f} | {c['tokens_per_s']:,.0f} | {c['binding']} ({c['phase']}: "
                    f"{c['phase_share']:.0%}, {c['phase_binding']}) | {c['analytic_ns'] / 1e6:.2f} "
                    f"({lat / c['analytic_ns']:.3f}) | {c['roofline_ns'] / 1e6:.2f} ({lat / c['roofline_ns']:.3f}) |")
    return head + rows


#: the cells whose real step ``--check`` simulates: (model, hardware, cached tokens, batch)
CHECKS = (("llama3_8b", "cube", 8192, 1), ("llama3_8b", "cube", 8192, 8), ("llama3_70b", "cube_mesh", 8192, 1))


def check() -> None:
    """The extrapolation against real steps (every layer simulated or fast-forwarded,
    exactly): :data:`CHECKS`, with 1, 2, 3 and all the preset's layers."""
    print("\n| model | hardware | S_kv | batch | layers | simulated µs | from 1 and 2 layers µs | difference ns "
          "| relative | analytic, roofline: difference ns |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for model, hw, ctx, b in CHECKS:
        got = {}
        for layers in (1, 2, 3, int(config(model, hw, ctx, b).bench.layers)):
            t = time.process_time()
            got[layers] = m = run(config(model, hw, ctx, b, layers))
            log(f"  {model} {hw} {ctx} batch {b}, {layers} layer(s): {time.process_time() - t:.1f} s CPU, "
                f"{m['sim']['events']:,} records; {m['fast_forward']['note']}")
        for n in list(got)[2:]:
            real = got[n]["step"]["latency_ns"]
            pred = extrapolate(got[1]["step"]["latency_ns"], got[2]["step"]["latency_ns"], n)
            other = [round(extrapolate(f(got[1]), f(got[2]), n) - f(got[n]), 3) + 0.0  # no "-0.000"
                     for f in (lambda m: m["step"]["analytic_ns"], lambda m: m["roofline"]["hbm_ns"])]
            print(f"| {MODELS[model]} | `{hw}` | {ctx} | {b} | {n} | {real / 1000:.3f} | {pred / 1000:.3f} | "
                  f"{pred - real:+.3f} | {(pred - real) / real:+.2e} | {other[0]:+.3f}, {other[1]:+.3f} |", flush=True)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", metavar="MODEL",
                    help=f"models to tabulate ({', '.join(MODELS)}; default both)")
    ap.add_argument("--quick", action="store_true", help="the first context length only")
    ap.add_argument("--check", action="store_true", help="compare the extrapolation with whole simulated steps")
    args = ap.parse_args(argv)
    for m in args.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (known: {', '.join(MODELS)})")
    if args.check:
        check()
        return
    contexts = CONTEXTS[:1] if args.quick else CONTEXTS
    models = args.models or list(MODELS)
    cells, start = {}, time.process_time()
    todo = [(m, hw, ctx, b) for m in models for hw in HARDWARE for ctx in contexts for b in BATCHES]
    for i, key in enumerate(todo, 1):
        t = time.process_time()
        cells[key] = c = cell(*key)
        log(f"[{i}/{len(todo)}] {' '.join(map(str, key))}: "
            + (c["refused"] if "refused" in c else f"{c['latency_ns'] / 1e6:.2f} ms, {c['records']:,} records")
            + f"; {time.process_time() - t:.1f} s CPU ({time.process_time() - start:.0f} s so far)")
    for model in models:
        print(f"\n#### {MODELS[model]}: one decode step, tp 8, timing only\n")
        print("\n".join(table(cells, model)))
    log(f"done: {time.process_time() - start:.0f} s CPU")


if __name__ == "__main__":
    main(sys.argv[1:])
