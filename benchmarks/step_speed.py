"""What a model's decode step costs to simulate, against one of its layers (a script, not a test).

Runs, each as the whole ``python -m kbframe`` command in a fresh process (start-up, checks,
the sanitizer, the report and every file included), paired and ``--repeat`` times:

* **step**: Llama-3-70B's 80 layers on ``hardware=cube_mesh`` (tp 8, ranks spread over the
  cubes), timing only, at ``--s-kv`` cached tokens and ``--batch`` sequences, and the same
  command with ``bench.layers=1``: wall seconds and peak memory of each, the wall ratio, and the bytes of
  ``op_log.jsonl`` plus ``trace.json`` of each and their ratio (a step refused before it
  simulates, over ``run.max_records``, prints its one line instead);
* **layer**: one Llama-3-70B layer on one cube (tp 8) at 32768 cached tokens, timing only.

    python benchmarks/step_speed.py                          # S_kv 32768, batch 8
    python benchmarks/step_speed.py --s-kv 8192 --batch 1    # 16 of its 80 layers simulated
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["+bench=decoder_layer", "+model=llama3_70b", "bench.data=false", "run.progress=false"]
STEP = [*MODEL, "hardware=cube_mesh", "bench.tp=8", "bench.placement=spread"]
LAYER = [*MODEL, "hardware=cube", "bench.tp=8", "bench.layers=1", "bench.S_kv=32768"]


def whole(overrides: list[str]) -> dict:
    """One command in a fresh process: its wall seconds, exit status, peak resident memory
    (the operating system's account of that process), last stderr line and the bytes of its
    op_log and trace."""
    d = Path(tempfile.mkdtemp(prefix="kbframe_step_"))
    try:
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "kbframe", *overrides, f"hydra.run.dir={d / 'run'}"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = p.stderr.read()  # to its end: the process has exited, or is about to
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        rc = os.waitstatus_to_exitcode(status)
        p.returncode = rc  # reaped here, not by Popen
        files = sum((d / "run" / f).stat().st_size for f in ("op_log.jsonl", "trace.json") if (d / "run" / f).exists())
        err = stderr.strip().splitlines()[-1] if rc else ""
        return {"wall_s": wall, "rc": rc, "error": err, "bytes": files, "peak_gib": usage.ru_maxrss / 2 ** 20}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s-kv", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="pairs to run (the fastest of each is kept)")
    args = ap.parse_args()
    shape = [f"bench.S_kv={args.s_kv}", f"bench.batch={args.batch}"]
    best: dict = {}
    for rep in range(max(1, args.repeat)):
        for name, cmd in (("step", [*STEP, *shape]), ("step, 1 layer", [*STEP, *shape, "bench.layers=1"]),
                          ("layer on a cube", LAYER)):
            r = whole(cmd)
            print(f"  [{rep + 1}] {name}: {r['wall_s']:.2f} s, rc {r['rc']}", file=sys.stderr)
            if name not in best or r["wall_s"] < best[name]["wall_s"]:
                best[name] = r
    print(f"Llama-3-70B decode step, hardware=cube_mesh tp 8 spread, S_kv {args.s_kv}, batch {args.batch}, "
          f"timing only (whole command, fastest of {max(1, args.repeat)}):")
    for name, r in best.items():
        what = (f"refused: {r['error']}" if r["rc"] else
                f"peak {r['peak_gib']:.1f} GiB   op_log + trace {r['bytes'] / 1e6:.1f} MB")
        print(f"  {name:<16} {r['wall_s']:8.2f} s   {what}")
    s, one = best["step"], best["step, 1 layer"]
    if not s["rc"] and not one["rc"]:
        print(f"  step / 1 layer: wall {s['wall_s'] / one['wall_s']:.1f}x, files {s['bytes'] / max(one['bytes'], 1):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
