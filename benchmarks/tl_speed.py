"""Speed of the tl layer alone (a script, not a test): the preflight dry run
(:func:`kbframe.run.preflight.dry_run`: the kernel runs through the tl layer, commands are
built and dropped, nothing is simulated) of decode_opt2 and decode_opt3, best of N.

    python benchmarks/tl_speed.py                       # S_kv=131072, G=8, d=128, tile=64, best of 5
    python benchmarks/tl_speed.py --s-kv 32768 -n 3 --kernels opt2
"""
from __future__ import annotations

import argparse
import math
import time

from hydra import compose, initialize_config_module
from hydra.utils import get_method

from kbframe.run import schema
from kbframe.run.preflight import dry_run
from kbframe.tl.recipe import load_recipes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--s-kv", type=int, default=131072)
    ap.add_argument("-G", type=int, default=8)
    ap.add_argument("-d", type=int, default=128)
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("-n", type=int, default=5, help="repeats (best is reported)")
    ap.add_argument("--kernels", nargs="+", default=["opt2", "opt3"])
    a = ap.parse_args()
    schema.register()
    for kname in a.kernels:
        with initialize_config_module(config_module="kbframe.conf", version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"+bench=decode_{kname}"])
        b = cfg.bench
        kernel = get_method(b.kernel)
        recipes = load_recipes(cfg.get("recipes"))
        shapes = {"q": (a.G, a.d), "k": (a.s_kv, a.d), "v": (a.s_kv, a.d), "out": (a.G, a.d)}
        kw = dict(G=a.G, d=a.d, S_kv=a.s_kv, tile=a.tile, scale=1.0 / math.sqrt(a.d))
        times, cpu, fig = [], [], None
        for _ in range(a.n):
            t0, c0 = time.perf_counter(), time.thread_time()
            fig = dry_run(cfg.hardware, int(b.pe), kernel, recipes, b.dtype, shapes, kw)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        print(f"decode_{kname} S_kv={a.s_kv} G={a.G} d={a.d} tile={a.tile}: best {min(times):.3f} s wall, "
              f"{min(cpu):.3f} s CPU (wall: {' '.join(f'{t:.3f}' for t in times)}), {fig['commands']} commands, "
              f"{1e6 * min(cpu) / fig['commands']:.2f} µs CPU/command")


if __name__ == "__main__":
    main()
