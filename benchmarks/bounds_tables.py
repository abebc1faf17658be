"""The simulated tables of docs/bounds.md, GQA decode at G 8, d 128, S_kv 4096 on one PE,
timing only (``bench.data=false``; dispatch and timing do not depend on the data):

1. ``dispatch``: PE_CPU dispatch cycles per KV tile of opt3 and opt2 (``dispatch.cycles_per_tile``)
   at three values of ``calibration.R``, with the steady-state per-tile cost in brackets
   (``13·FIXED + 408·R`` for opt3, ``2·FIXED + 360·R`` for opt2: the primitives and logical
   bytes of one tile, checked exactly in tests/kernels/test_gqa_decode.py); the last two
   columns are quoted from the DDD-0065 §11 model and the predecessor, not computed here;
2. ``critical``: the critical path's binding kind, period per KV tile and its terms
   (``critical_path.*``);
3. ``policy``: latency under ``hardware.units.scheduler.policy=strict_fifo`` (the default)
   and ``rw_aware``; overtakes are counted in op_log.jsonl: commands that PE_SCHEDULER
   admitted before an older command (admissions in order of time, then command id);
4. ``design``: opt2's design space (``bench.v_staging``, ``s_buffers``, ``v_buffers``,
   ``k_prefetch``) against opt3 at tile 64 and 256: latency, share of the HBM bound,
   dispatch cycles and commands per tile, TCM high water, binding kind, period per tile.

    .venv/bin/python benchmarks/bounds_tables.py                   # every table
    .venv/bin/python benchmarks/bounds_tables.py dispatch policy   # some: dispatch critical policy design

Each case runs in-process into a temporary directory (``run.trace=false``); a case used by
several tables runs once. The tables go to stdout as Markdown.
"""
from __future__ import annotations

import json
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import compose_cfg  # noqa: E402
from kbframe.run.bench import run_bench  # noqa: E402

QUIET = ("bench.data=false", "run.progress=false", "run.trace=false", "run.check=false")
FREE = ("calibration.FIXED=0", "calibration.R=0")
T256 = ("bench.tile=256",)


@lru_cache(maxsize=None)
def one(bench: str, *overrides: str) -> tuple[dict, int]:
    """``metrics.json`` of a run of ``bench`` with ``overrides``, and its overtakes."""
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        run_bench(compose_cfg(*QUIET, *overrides, bench=bench), run)
        metrics = json.loads((run / "metrics.json").read_text())
        with open(run / "op_log.jsonl") as f:
            admissions = [(r["pe"], r["t_start_ns"], r["cmd"]) for r in map(json.loads, f) if r["unit"] == "scheduler"]
    return metrics, overtakes(admissions)


def overtakes(admissions: list[tuple[int, float, int]]) -> int:
    """Commands admitted before an older command of their PE."""
    n, oldest_later = 0, {}
    for pe, _, cmd in sorted(admissions, reverse=True):
        if cmd > oldest_later.get(pe, cmd):
            n += 1
        oldest_later[pe] = min(cmd, oldest_later.get(pe, cmd))
    return n


def _table(head: list[str], align: list[str], rows: list[list[str]], pad: bool = False) -> None:
    """A Markdown table; ``pad``: cells left-justified to their column's width."""
    w = [max(len(c) for c in col) for col in zip(*rows)] if pad else [0] * len(head)
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(align) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(n) for c, n in zip(r, w)) + " |")


# ---------------------------------------------------------------------------- 1. dispatch

RS = ("0.25", "0.0625", "0.03125")
#: per R: DDD-0065 §11's modelled ratio and the predecessor's measured one (quoted)
QUOTED = {"0.25": ("≈ 2.6×", "4.20×"), "0.0625": ("≈ 4.0×", "5.22×"), "0.03125": ("≈ 4.4×", "5.45×")}
#: steady-state dispatch per KV tile: (commands, logical bytes) of one tile
STEADY = {"decode_opt3": (13, 408), "decode_opt2": (2, 360)}


def dispatch() -> None:
    rows = []
    for r in RS:
        got, steady = {}, {}
        for bench, (cmds, nbytes) in STEADY.items():
            m, _ = one(bench, f"calibration.R={r}")
            c = m["calibration"]
            got[bench], steady[bench] = m["dispatch"]["cycles_per_tile"], cmds * c["FIXED"] + nbytes * c["R"]
        o3, o2 = got["decode_opt3"], got["decode_opt2"]
        s3, s2 = steady["decode_opt3"], steady["decode_opt2"]
        rows.append([r, f"{o3:.1f} ({s3})", f"{o2:.1f} ({s2})", f"**{o3 / o2:.2f}×** ({s3 / s2:.2f}×)", *QUOTED[r]])
    _table(["R (cycles/byte)", "opt3 cycles/tile", "opt2 cycles/tile", "kbframe ratio", "DDD-0065 §11 model",
            "predecessor measured"], ["---:"] * 6, rows, pad=True)


# ---------------------------------------------------------------------------- 2. critical path

#: (label, bench, overrides)
CRITICAL = (("decode_opt2", "decode_opt2", ()),
            ("decode_opt3", "decode_opt3", ()),
            ("decode_opt3 `calibration.FIXED=0 calibration.R=0`", "decode_opt3", FREE),
            ("decode_opt2 `bench.tile=256`", "decode_opt2", T256),
            ("decode_opt3 `bench.tile=256`", "decode_opt3", T256))
#: a term's name in the table; the GEMM on opt2's chain is #2's P·V (it reads V)
TERM = {"dma_read setup": "DMA setup", "dma_read data": "data", "gemm": "P·V GEMM", "math add": "add"}


def terms(cp: dict) -> str:
    """The period's terms: a dispatch-bound period as its count of dispatches; else runs of
    equal names, two DMA data terms as K's and V's, a longer run of equal ones as ``n × data``."""
    ts = cp["terms"]
    if cp["binding"] == "dispatch":
        return f"{len(ts)} dispatches (PE_CPU busy {cp['busiest']['busy_fraction'] * 100:.0f} %)"
    runs: list[list[float]] = []
    names: list[str] = []
    for t in ts:
        if names and names[-1] == t["name"]:
            runs[-1].append(t["ns"])
        else:
            names.append(t["name"])
            runs.append([t["ns"]])
    out = []
    for name, ns in zip(names, runs):
        label = TERM.get(name, name)
        if name == "dma_read data" and len(ns) == 2:
            out += [f"K data {ns[0]:g}", f"V data {ns[1]:g}"]
        elif len(ns) > 1 and len(set(ns)) == 1:
            out.append(f"{len(ns)} × {label} {ns[0]:g}")
        else:
            out += [f"{label} {x:g}" for x in ns]
    return " + ".join(out)


def critical() -> None:
    rows = []
    for label, bench, ov in CRITICAL:
        cp = one(bench, *ov)[0]["critical_path"]
        rows.append([label, cp["binding"], f"{cp['ns_per_unit']:g} ns", terms(cp)])
    _table(["bench", "binding", "period per KV tile", "terms"], ["---"] * 4, rows)


# ---------------------------------------------------------------------------- 3. scheduler policy

POLICY = (("decode_opt2 (tile 64)", "decode_opt2", ()),
          ("decode_opt2 `bench.tile=256`", "decode_opt2", T256),
          ("decode_opt3 (tile 64)", "decode_opt3", ()),
          ("decode_opt3 `bench.tile=256`", "decode_opt3", T256),
          ("decode_opt3 `calibration.FIXED=0 calibration.R=0`", "decode_opt3", FREE))
RW = "hardware.units.scheduler.policy=rw_aware"


def policy() -> None:
    rows = []
    for label, bench, ov in POLICY:
        fifo = one(bench, *ov)[0]["sim"]["latency_ns"]
        m, n = one(bench, *ov, RW)
        rw = m["sim"]["latency_ns"]
        g = fifo - rw
        gain = "0" if g == 0 else f"{g:g} ns" + (f" ({g / fifo * 100:.1f} %)" if round(g / fifo * 100, 1) else "")
        rows.append([label, f"{fifo} ns", f"{rw} ns", gain, str(n)])
    _table(["bench", "strict_fifo", "rw_aware", "gain", "overtakes"], ["---"] * 5, rows)


# ---------------------------------------------------------------------------- 4. opt2's design space

ADR = "opt2 (ADR: S 2, K ahead 1, V composite)"
#: (label, bench, overrides)
DESIGN = (("opt3", "decode_opt3", ()),
          (ADR, "decode_opt2", ()),
          ("opt2 S 3, K ahead 2", "decode_opt2", ("bench.s_buffers=3", "bench.k_prefetch=2")),
          ("opt2 V prefetch, 2 buffers, ahead 1", "decode_opt2", ("bench.v_staging=prefetch",)),
          ("opt2 V prefetch, 3+3 buffers, ahead 2", "decode_opt2",
           ("bench.v_staging=prefetch", "bench.s_buffers=3", "bench.v_buffers=3", "bench.k_prefetch=2")),
          ("opt2 V prefetch, 4+4 buffers, ahead 3", "decode_opt2",
           ("bench.v_staging=prefetch", "bench.s_buffers=4", "bench.v_buffers=4", "bench.k_prefetch=3")))


def design() -> None:
    rows = []
    for tile in (64, 256):
        for label, bench, ov in DESIGN:
            m, _ = one(bench, *(T256 if tile == 256 else ()), *ov)
            lat, d, cp = m["sim"]["latency_ns"], m["dispatch"], m["critical_path"]
            rows.append([label, str(tile), f"{lat:.1f}", f"{m['roofline']['hbm_ns'] / lat:.1%}",
                         f"{d['cycles_per_tile']:.1f}", f"{d['commands_per_tile']:.2f}",
                         f"{m['tcm']['high_water_bytes']:,}", cp["binding"], f"{cp['ns_per_unit']:g}"])
    _table(["kernel", "tile", "latency ns", "of HBM bound", "dispatch cycles/tile", "commands/tile", "TCM bytes",
            "binding", "period per tile"], ["---"] * 9, rows)


TABLES = {"dispatch": dispatch, "critical": critical, "policy": policy, "design": design}


def main(argv: list[str]) -> None:
    for i, name in enumerate(argv or list(TABLES)):
        if name not in TABLES:
            raise SystemExit(f"unknown table {name!r}; one of {', '.join(TABLES)}")
        print(("\n" if i else "") + f"#### {name}\n")
        TABLES[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
