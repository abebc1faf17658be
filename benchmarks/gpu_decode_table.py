"""The decode-attention table of docs/gpu.md: split-K GQA decode (flash-decoding, the
``decode_splitk`` workload) of Llama-3-70B's attention heads (64 query heads, 8 KV heads,
d = 128) on ``hardware=h100_sxm``, bf16, timing only, at S_kv 4K, 32K, 128K and batch 1
and 8, for every split count the 132 SMs allow ((batch · 8 KV heads) × splits ≤ 132):
predicted time, achieved HBM bandwidth (and its share of the achievable 2814 GB/s), and
the split count that minimises the time.

    .venv/bin/python benchmarks/gpu_decode_table.py            # 21 runs, 2 at a time

Each case runs in-process into a temporary directory; the table goes to stdout as Markdown.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

S_KVS = (4096, 32768, 131072)
BATCHES = (1, 8)
KV_HEADS = 8


def splits_for(batch: int, n_pes: int = 132) -> list[int]:
    """Powers of two s with (batch · KV heads) · s ≤ n_pes."""
    out, s = [], 1
    while batch * KV_HEADS * s <= n_pes:
        out.append(s)
        s *= 2
    return out


def one(S: int, batch: int, splits: int) -> dict:
    from conftest import compose_cfg
    from kbframe.run.bench import run_bench
    with tempfile.TemporaryDirectory() as d:
        cfg = compose_cfg("+model=llama3_70b", "hardware=h100_sxm", f"bench.S_kv={S}", f"bench.batch={batch}",
                          f"bench.splits={splits}", "bench.dtype=bfloat16", "bench.data=false", "run.progress=false",
                          "run.trace=false", "run.check=false", bench="decode_splitk")
        bw = float(cfg.hardware.cube_hbm_gbps)
        m = run_bench(cfg, Path(d) / "run")
    return {"S": S, "batch": batch, "splits": splits, "us": m["sim"]["latency_ns"] / 1000,
            "gbps": m["hbm"]["achieved_gbps"], "share": m["hbm"]["achieved_gbps"] / bw,
            "kv_bytes": 2 * 2 * batch * KV_HEADS * S * 128}


def main(argv: list[str]) -> None:
    from joblib import Parallel, delayed
    t0 = time.perf_counter()
    todo = [(S, b, s) for b in BATCHES for S in S_KVS for s in splits_for(b)]
    rows = Parallel(n_jobs=2)(delayed(one)(*c) for c in todo)
    wall = time.perf_counter() - t0
    print("| batch | S_kv | splits | predicted µs | HBM GB/s achieved | of achievable | KV bytes / 2814 GB/s µs |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['batch']} | {r['S']} | {r['splits']} | {r['us']:.1f} | {r['gbps']:.0f} | {r['share']:.1%} | "
              f"{r['kv_bytes'] / 2814 / 1000:.1f} |")
    print("\n| batch | S_kv | best splits | predicted µs |")
    print("|---:|---:|---:|---:|")
    for b in BATCHES:
        for S in S_KVS:
            best = min((r for r in rows if r["batch"] == b and r["S"] == S), key=lambda r: r["us"])
            print(f"| {b} | {S} | {best['splits']} | {best['us']:.1f} |")
    print(f"\n{len(rows)} runs in {wall:.0f} s wall (2 workers).")


if __name__ == "__main__":
    main(sys.argv[1:])
