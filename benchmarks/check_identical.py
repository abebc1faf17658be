"""Check that engine changes leave every result unchanged (a script, not a test).

``--capture`` runs a fixed set of configs with the current code into ``BASE``
(``/tmp/speed_baseline/<case>``); the default mode runs them again into ``NEW``
(``/tmp/speed_check/<case>``) and compares, case by case:

* ``op_log.jsonl`` and ``trace.json`` byte for byte;
* ``metrics.json`` value for value, apart from ``sim.wall_s`` and ``fast_forward`` (how the
  run was made, not a result; keys that only the new run
  has, e.g. ones another feature adds, are listed but do not fail the check);
* ``tensors.npz`` array for array, bit for bit.

Each case is one ``python -m kbframe`` run in a subprocess (two at a time).

    python benchmarks/check_identical.py --capture     # once, before changing anything
    python benchmarks/check_identical.py               # after each change; exit 1 on a diff

When other changes that do alter results land meanwhile, capture the baseline from a
copy of the tree without the changes under test (``--tree DIR --base DIR2 --capture``)
and compare against it (``--base DIR2``).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASE = Path("/tmp/speed_baseline")
NEW = Path("/tmp/speed_check")
#: not results: wall time, and how a timing-only run was made (whether fast-forward applied
#: and why; the files it made are compared like any other)
IGNORED = {("sim", "wall_s"), ("fast_forward", "mode"), ("fast_forward", "applied"), ("fast_forward", "note")}


def cases() -> dict[str, list[str]]:
    """Case name → CLI overrides."""
    out = {}
    for kernel, s_kv, data, tile, d in itertools.product(
            ("opt2", "opt3"), (1, 65, 4096), (True, False), (64, 32), (128, 256, 80)):
        name = f"{kernel}_s{s_kv}_{'data' if data else 'nodata'}_t{tile}_d{d}"
        out[name] = [f"+bench=decode_{kernel}", f"bench.S_kv={s_kv}", f"bench.data={str(data).lower()}",
                     f"bench.tile={tile}", f"bench.d={d}"]
    for kernel, s_kv, data in itertools.product(("opt2", "opt3"), (1, 65, 4096), (True, False)):
        name = f"{kernel}_s{s_kv}_{'data' if data else 'nodata'}_R0.25"
        out[name] = [f"+bench=decode_{kernel}", f"bench.S_kv={s_kv}", f"bench.data={str(data).lower()}",
                     "calibration.R=0.25"]
    for kernel in ("opt2", "opt3"):  # a longer ragged run, timing only
        out[f"{kernel}_s20000_nodata"] = [f"+bench=decode_{kernel}", "bench.S_kv=20000", "bench.data=false"]
    # long enough to fast-forward (kbframe.run.fastforward): a tree without it, or with it
    # off, simulates them in full (ragged last tiles)
    for kernel, s_kv in (("opt2", 131100), ("opt3", 131100)):
        out[f"{kernel}_s{s_kv}_nodata"] = [f"+bench=decode_{kernel}", f"bench.S_kv={s_kv}", "bench.data=false"]
    out["heads_s65600_nodata"] = ["+bench=decode_heads", "+model=llama3_70b", "hardware=cube", "bench.S_kv=65600",
                                  "bench.data=false"]
    # several items on one PE: every item's KV loop grows with the axis
    out["heads_2items_s65536_nodata"] = ["+bench=decode_heads", "bench.H_q=4", "bench.H_kv=2", "bench.S_kv=65536",
                                         "bench.data=false"]
    out["heads_b2_cube_s131072_nodata"] = ["+bench=decode_heads", "+model=llama3_70b", "hardware=cube", "bench.batch=2",
                                           "bench.S_kv=131072", "bench.data=false"]
    # a model step's layers: one PE and a cube's 8, unfused and fused
    small = ["+bench=decoder_layer", "bench.H=32", "bench.H_q=8", "bench.H_kv=8", "bench.d=16", "bench.F=64",
             "bench.S_kv=40", "bench.layers=60", "bench.data=false"]
    out["layer_tp1_60_nodata"] = [*small, "bench.tp=1"]
    out["layer_tp8_none_60_nodata"] = [*small, "hardware=cube", "bench.tp=8", "bench.fusion=none"]
    out["layer_tp8_fused_48_nodata"] = ["+bench=decoder_layer", "hardware=cube", "bench.tp=8", "bench.H=256",
                                        "bench.H_q=8", "bench.H_kv=8", "bench.d=128", "bench.F=256",
                                        "bench.S_kv=512", "bench.layers=48", "bench.data=false"]
    # weight GEMMs wide enough to leave output tiles out, in layers that jump, over 2×2 cubes
    out["layer_wide_tp8_mesh_24_nodata"] = ["+bench=decoder_layer", "hardware=cube_mesh", "bench.tp=8",
                                            "bench.placement=spread", "bench.H=1280", "bench.H_q=8", "bench.H_kv=8",
                                            "bench.d=128", "bench.F=24576", "bench.S_kv=8192", "bench.layers=24",
                                            "bench.data=false"]
    out["layer_llama3_70b_mesh_1_nodata"] = ["+bench=decoder_layer", "+model=llama3_70b", "hardware=cube_mesh",
                                             "bench.tp=8", "bench.placement=spread", "bench.S_kv=4096",
                                             "bench.layers=1", "bench.data=false"]
    return out


def run_case(name: str, overrides: list[str], root: Path, tree: Path = ROOT) -> tuple[str, int, str]:
    cmd = [sys.executable, "-m", "kbframe", *overrides, "run.check=false", "run.progress=false",
           f"hydra.run.dir={root / name}"]
    env = dict(os.environ, PYTHONPATH=str(tree)) if tree != ROOT else None
    p = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    return name, p.returncode, p.stderr[-2000:]


def _flatten(d: dict, prefix=()) -> dict:
    flat = {}
    for k, v in d.items():
        if isinstance(v, dict):
            flat.update(_flatten(v, prefix + (k,)))
        else:
            flat[prefix + (k,)] = v
    return flat


NEW_KEYS: set = set()


def compare(name: str) -> list[str]:
    """Differences between ``BASE/name`` and ``NEW/name`` (empty if identical)."""
    a, b = BASE / name, NEW / name
    diffs = []
    if (a / "op_log.jsonl").read_bytes() != (b / "op_log.jsonl").read_bytes():
        diffs.append("op_log.jsonl differs")
    ta, tb = (a / "trace.json").exists(), (b / "trace.json").exists()
    if ta != tb:
        diffs.append(f"trace.json {'only in the baseline' if ta else 'only in the new run'}")
    elif ta and (a / "trace.json").read_bytes() != (b / "trace.json").read_bytes():
        diffs.append("trace.json differs")
    ma = _flatten(json.loads((a / "metrics.json").read_text()))
    mb = _flatten(json.loads((b / "metrics.json").read_text()))
    for key in ma:
        if key in IGNORED:
            continue
        if key not in mb:
            diffs.append(f"metrics {'.'.join(key)} missing")
        elif ma[key] != mb[key]:
            diffs.append(f"metrics {'.'.join(key)}: {ma[key]!r} -> {mb[key]!r}")
    NEW_KEYS.update(".".join(k) for k in mb.keys() - ma.keys())
    ta, tb = (a / "tensors.npz").exists(), (b / "tensors.npz").exists()
    if ta != tb:
        diffs.append(f"tensors.npz {'only in the baseline' if ta else 'only in the new run'}")
    if not (ta and tb):
        return diffs
    with np.load(a / "tensors.npz") as za, np.load(b / "tensors.npz") as zb:
        if sorted(za.files) != sorted(zb.files):
            diffs.append(f"tensors.npz arrays {sorted(za.files)} -> {sorted(zb.files)}")
        for k in set(za.files) & set(zb.files):
            x, y = za[k], zb[k]
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                diffs.append(f"tensors.npz[{k}] differs")
    return diffs


def main() -> int:
    global BASE, NEW
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", action="store_true", help=f"write the baselines into {BASE}")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("-k", "--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--tree", type=Path, default=ROOT, help="source tree to run (default: this one)")
    ap.add_argument("--base", type=Path, default=BASE, help=f"baseline directory (default {BASE})")
    ap.add_argument("--new", type=Path, default=NEW,
                    help=f"where the new runs go (default {NEW}; one per concurrent checker)")
    args = ap.parse_args()
    BASE, NEW = args.base, args.new
    todo = {n: o for n, o in cases().items() if args.filter in n}
    root = BASE if args.capture else NEW
    if args.capture and BASE.exists() and any(BASE.iterdir()):
        print(f"{BASE} already holds baselines; remove it first to recapture", file=sys.stderr)
        return 2
    missing = [n for n in todo if not (BASE / n / "metrics.json").is_file()]
    if not args.capture and missing:
        print(f"{BASE} holds no baseline for {len(missing)} of the {len(todo)} cases (first: {missing[0]}); capture "
              f"them first from the tree to compare against: --capture [--tree DIR] [--base {BASE}]", file=sys.stderr)
        return 2
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda kv: run_case(kv[0], kv[1], root, args.tree.resolve()), todo.items()))
    failed = [(n, err) for n, rc, err in results if rc != 0]
    for n, err in failed:
        print(f"FAIL {n}: exit status non-zero\n{err}")
    if args.capture:
        print(f"captured {len(results) - len(failed)} of {len(results)} cases into {BASE}")
        return 1 if failed else 0
    n_bad = len(failed)
    for name in todo:
        if any(n == name for n, _ in failed):
            continue
        diffs = compare(name)
        if diffs:
            n_bad += 1
            print(f"DIFF {name}: " + "; ".join(diffs[:5]))
    if NEW_KEYS:
        print(f"metrics keys only in the new runs (not compared): {', '.join(sorted(NEW_KEYS))}")
    print(f"{len(todo) - n_bad} of {len(todo)} cases identical"
          f" (op_log.jsonl and trace.json bytes, metrics.json except sim.wall_s and fast_forward, tensors.npz)")
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main())
