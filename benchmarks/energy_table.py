"""The energy tables of docs/energy.md (metrics.json ``energy``, conf/energy/default.yaml),
timing only:

1. GQA decode at the default shape (G 8, d 128, S_kv 4096, tile 64): opt3, opt2 and opt2
   with V prefetched; energy per KV tile split into dispatch (PE_CPU and PE_SCHEDULER),
   DMA/HBM, TCM, GEMM, MATH and static;
2. the GEMM harness's 24 jobs (8 shapes × 3 stagings, conf/sweep/gemm_harness.yaml):
   energy per output block by staging;
3. split-K decode merges (G 8, d 128, S_kv 16384) on a cube and on the 2×2 mesh: the
   IPCQ link energy of each merge topology;
4. one decoder layer (Llama-3-8B's shape by default, ``hardware=cube``, tp 8): energy per
   token by phase, each unit's energy shared among the phases by its busy time in each
   (``phases.by_phase[].busy_ns``; the TCM's by the busy time of the units whose traffic it
   serves, static by span).

    .venv/bin/python benchmarks/energy_table.py              # every table
    .venv/bin/python benchmarks/energy_table.py decode gemm  # some: decode gemm splitk layer

Each case runs in-process into a temporary directory; the tables go to stdout as Markdown.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import compose_cfg  # noqa: E402
from kbframe.run.bench import run_bench  # noqa: E402

QUIET = ("bench.data=false", "run.progress=false", "run.trace=false", "run.check=false")
#: the columns of the split, and the roles each adds up
SPLIT = {"dispatch": ("dispatch", "admission"), "DMA/HBM": ("dma_read", "dma_write"), "TCM": ("tcm",),
         "GEMM": ("gemm",), "MATH": ("math",), "IPCQ": ("ipcq_send", "ipcq_recv"), "static": ("static",)}


def one(bench: str, *overrides: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        return run_bench(compose_cfg(*QUIET, *overrides, bench=bench), Path(d) / "run")


def split(e: dict) -> dict:
    """pJ per column of :data:`SPLIT`."""
    return {col: sum(e["by_role"].get(r, 0.0) for r in roles) for col, roles in SPLIT.items()}


def _nj(pj: float) -> str:
    return f"{pj / 1000:,.1f}"


def _uj(pj: float) -> str:
    return f"{pj / 1e6:,.2f}"


def decode() -> None:
    print("\n#### GQA decode, G 8, d 128, S_kv 4096, tile 64 (64 KV tiles), one PE: nJ per KV tile\n")
    print("| kernel | ns per tile | dispatch | DMA/HBM | TCM | GEMM | MATH | static | total | avg W | EDP of the run (µJ·µs) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, bench, ov in (("opt3", "decode_opt3", ()), ("opt2", "decode_opt2", ()),
                             ("opt2, V prefetched", "decode_opt2", ("bench.v_staging=prefetch", "bench.s_buffers=3"))):
        m = one(bench, *ov)
        e, n = m["energy"], m["dispatch"]["n_units"]
        s = split(e)
        cells = " | ".join(_nj(s[c] / n) for c in ("dispatch", "DMA/HBM", "TCM", "GEMM", "MATH", "static"))
        print(f"| {label} | {m['sim']['latency_ns'] / n:.1f} | {cells} | {_nj(e['per_unit_pj'])} | "
              f"{e['avg_power_w']:.2f} | {e['edp'] / 1e9:,.1f} |")


SHAPES = ("m128_k128_n128", "m512_k512_n512", "m1024_k1024_n1024", "m32_k3072_n32", "m4096_k128_n4096",
          "m1_k4096_n4096", "m4096_k4096_n1", "m2048_k8192_n512")
STAGINGS = ("gemm_ref_ref", "gemm_load_ref", "gemm_load_load")


def gemm() -> None:
    print("\n#### GEMM harness (conf/sweep/gemm_harness.yaml, TCM 64 MiB): nJ per output block "
          "(block_m rows of C), and the share of DMA/HBM\n")
    print("| shape | blocks | " + " | ".join(f"{s[5:]} nJ (HBM %)" for s in STAGINGS) + " |")
    print("|---|---:|" + "---:|" * len(STAGINGS))
    for shape in SHAPES:
        cells, blocks = [], None
        for bench in STAGINGS:
            m = one(bench, f"+gemm_shape={shape}", "hardware.tcm_bytes=67108864")
            e = m["energy"]
            blocks = m["dispatch"]["n_units"]
            cells.append(f"{_nj(e['per_unit_pj'])} ({split(e)['DMA/HBM'] / e['total_pj']:.0%})")
        print(f"| {shape} | {blocks} | " + " | ".join(cells) + " |")


def splitk() -> None:
    print("\n#### Split-K decode merges, G 8, d 128, S_kv 16384, inner opt2: the merge's link energy\n")
    print("| hardware | merge | PEs | µs | IPCQ bytes | link nJ (d2d share) | total nJ | link share |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for hw in ("cube", "cube_mesh"):
        for merge in ("tree", "chain", "gather"):
            m = one("decode_splitk", f"hardware={hw}", f"bench.merge={merge}", "bench.S_kv=16384")
            e = m["energy"]
            link = e["by_role"].get("ipcq_send", 0.0)
            d2d = e["by_action"].get("ipcq_send.d2d_bits", {"pj": 0.0})["pj"]
            print(f"| {hw} | {merge} | {len(e['by_unit'])} | {m['sim']['latency_ns'] / 1000:.2f} | "
                  f"{m['ipcq']['bytes']:,} | {_nj(link)} ({d2d / link if link else 0:.0%}) | {_nj(e['total_pj'])} | "
                  f"{link / e['total_pj']:.2%} |")


#: the phases' resources (metrics.json phases.by_phase[].busy_ns) and the roles they hold
RESOURCE_ROLES = {"dispatch": ("dispatch", "admission"), "hbm": ("dma_read", "dma_write"), "gemm": ("gemm",),
                  "math": ("math",), "link": ("ipcq_send", "ipcq_recv")}


def phase_energy(m: dict) -> list:
    """``[(phase, {column: pJ})]``: each resource's dynamic energy shared by its busy time in
    each phase, the TCM's by the busy-time shares of the units whose bytes it serves
    (weighted by their bytes), static by the phases' span."""
    e, by = m["energy"], m["phases"]["by_phase"]
    busy = {r: sum(p["busy_ns"].get(r, 0.0) for p in by) for r in RESOURCE_ROLES}
    role_bytes: dict = {}  # bytes each role's units moved or read (metrics.json pes[].units)
    for pe_m, pe_e in zip(m["pes"], e["by_unit"]):
        for name, u in pe_m["units"].items():
            if name in pe_e["units"]:
                role = pe_e["units"][name]["role"]
                role_bytes[role] = role_bytes.get(role, 0) + u["bytes"]
    tcm_bytes = {r: sum(role_bytes.get(x, 0) for x in roles) for r, roles in RESOURCE_ROLES.items() if r != "dispatch"}
    all_bytes = sum(tcm_bytes.values()) or 1
    span = sum(p["span_ns"] for p in by) or 1
    out = []
    for p in by:
        share = {r: p["busy_ns"].get(r, 0.0) / busy[r] if busy[r] else 0.0 for r in RESOURCE_ROLES}
        row = {col: 0.0 for col in SPLIT}
        for r, roles in RESOURCE_ROLES.items():
            col = {"dispatch": "dispatch", "hbm": "DMA/HBM", "gemm": "GEMM", "math": "MATH", "link": "IPCQ"}[r]
            row[col] += share[r] * sum(e["by_role"].get(x, 0.0) for x in roles)
        row["TCM"] = e["by_role"].get("tcm", 0.0) * sum(share[r] * b for r, b in tcm_bytes.items()) / all_bytes
        row["static"] = e["static_pj"] * p["span_ns"] / span
        out.append((p["phase"], row))
    return out


def layer(model: str = "llama3_8b") -> None:
    m = one("decoder_layer", f"+model={model}", "hardware=cube", "bench.tp=8", "bench.layers=1", "bench.S_kv=4096",
            "bench.batch=1")
    e = m["energy"]
    tokens = e["total_pj"] / e["per_token_pj"]
    print(f"\n#### Decoder layer ({model}, one layer, S_kv 4096, batch 1, hardware=cube, tp 8): "
          f"{_uj(e['per_token_pj'])} µJ per token, {m['sim']['latency_ns'] / 1000:.2f} µs, {e['avg_power_w']:.2f} W "
          f"over the cube's 8 PEs; µJ per token by phase\n")
    cols = ("dispatch", "DMA/HBM", "TCM", "GEMM", "MATH", "IPCQ", "static")
    print("| phase | " + " | ".join(cols) + " | total | share |")
    print("|---|" + "---:|" * (len(cols) + 2))
    for phase, row in phase_energy(m):
        tot = sum(row.values())
        print(f"| {phase} | " + " | ".join(_uj(row[c] / tokens) for c in cols) +
              f" | {_uj(tot / tokens)} | {tot / e['total_pj']:.1%} |")
    s = split(e)
    print("| **layer** | " + " | ".join(_uj(s[c] / tokens) for c in cols) + f" | {_uj(e['per_token_pj'])} | 100% |")


TABLES = {"decode": decode, "gemm": gemm, "splitk": splitk, "layer": layer}


def main(argv: list[str]) -> None:
    for name in argv or list(TABLES):
        TABLES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
