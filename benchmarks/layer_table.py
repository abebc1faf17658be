"""The decoder-layer tables of docs/decoder_layer.md: one decode step of one layer of
Llama-3-8B and Llama-3-70B at S_kv = 4096, batch 1, on ``hardware=cube`` with tp 8, timing
only: fused against unfused and the three all-reduce algorithms (latency, PE_CPU
dispatch, what binds), and the fused ring layer's phases.

    .venv/bin/python benchmarks/layer_table.py            # both models
    .venv/bin/python benchmarks/layer_table.py llama3_8b  # one

Each case runs in-process into a temporary directory; the tables go to stdout as Markdown.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import compose_cfg  # noqa: E402
from kbframe.run.bench import run_bench  # noqa: E402

MODELS = {"llama3_8b": "Llama-3-8B", "llama3_70b": "Llama-3-70B"}
COMMON = ("hardware=cube", "bench.tp=8", "bench.layers=1", "bench.S_kv=4096", "bench.batch=1", "bench.data=false",
          "run.progress=false", "run.trace=false")


def one(model: str, fusion: str, allreduce: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cfg = compose_cfg(f"+model={model}", *COMMON, f"bench.fusion={fusion}", f"bench.allreduce={allreduce}",
                          bench="decoder_layer")
        return run_bench(cfg, Path(d) / "run")


def main(argv: list[str]) -> None:
    models = argv or list(MODELS)
    for model in models:
        print(f"\n#### {MODELS[model]}: one layer, S_kv = 4096, batch 1, hardware=cube, tp 8\n")
        print("| fusion | all-reduce | layer µs | commands | dispatch cycles | binding | all-reduce ns (model ns) |")
        print("|---|---|---:|---:|---:|---|---|")
        keep = None
        for fusion in ("fused", "none"):
            for ar in ("ring", "tree", "direct"):
                m = one(model, fusion, ar)
                c = m["collectives"]
                ns = " / ".join(f"{x['ns']:.0f} ({x['model_ns']:.0f})" for x in c)
                print(f"| {fusion} | {ar} | {m['sim']['latency_ns'] / 1000:.2f} | {m['dispatch']['commands']} | "
                      f"{m['dispatch']['cycles']:.0f} | {m['roofline']['binding']} | {ns} |")
                if fusion == "fused" and ar == "ring":
                    keep = m
        print(f"\nPhases of the fused layer with the ring all-reduce (spans overlap; critical-path time adds up "
              f"to the layer's {keep['sim']['latency_ns'] / 1000:.2f} µs):\n")
        print("| phase | span µs | share | critical path µs | bound µs | binding | analytic µs |")
        print("|---|---:|---:|---:|---:|---|---:|")
        for e in keep["phases"]["by_phase"]:
            print(f"| {e['phase']} | {e['span_ns'] / 1000:.2f} | {e['share']:.1%} | {e['critical_path_ns'] / 1000:.2f} | "
                  f"{e['bound_ns'] / 1000:.2f} | {e['binding']} | {e['analytic_ns'] / 1000:.2f} |")
        st = keep["step"]
        print(f"\nStep: {st['latency_ns'] / 1000:.2f} µs, {st['tokens_per_s']:,.0f} tokens/s; the analytic roofline "
              f"sum {st['analytic_ns'] / 1000:.2f} µs.")
        r = keep["roofline"]
        print(f"\nRoofline of the layer: HBM {r['hbm_ns'] / 1000:.2f} µs ({r['hbm_bytes']:,} B of weights and KV "
              f"cache over 8 PEs), GEMM {r['compute_ns'] / 1000:.2f} µs, dispatch {r['dispatch_ns'] / 1000:.2f} µs.")


if __name__ == "__main__":
    main(sys.argv[1:])
