"""``python -m kbframe +bench=NAME [overrides]``: run a bench and report it.

A user mistake is printed as one line ``kbframe: error: ...`` and exits with status 1; no
traceback (DESIGN.md decision 6). Every run writes ``status.json``; in a ``-m`` sweep a
failed job is recorded and the others go on, and the sweep exits non-zero at the end
(kbframe.run.jobstatus, kbframe.cli.callbacks). Hydra's own composition errors (wrong types, unknown
keys, unknown bench) are Hydra's messages, which name the key and list the options.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import hydra_errors

from ..run import schema
from ..run.bench import run_bench, summary
from ..errors import ConfigError
from ..run.jobstatus import JobStatus

schema.register()


def _available_benches() -> list[str]:
    conf = Path(__file__).resolve().parents[1] / "conf" / "bench"
    return sorted(p.stem for p in conf.glob("*.yaml"))


def _explicit_keys(overrides) -> set:
    """Config keys the user set on the command line (``bench.G=8``, ``++bench.G=8``)."""
    keys = set()
    for ov in overrides:
        key = str(ov).split("=", 1)[0].lstrip("+~")
        if "=" in str(ov) and not key.startswith("hydra"):
            keys.add(key)
    return keys


@hydra.main(version_base="1.3", config_path="pkg://kbframe.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> dict:
    hydra_errors.release()  # Hydra composed the config: stderr is ours again
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    # status.json in out_dir; a job of a -m sweep that fails is recorded and the sweep goes
    # on (kbframe.run.jobstatus); a single run exits 1 with one line
    with JobStatus.from_hydra() as job:
        if "bench" not in cfg:
            raise ConfigError(f"no bench selected; add +bench=NAME "
                              f"(available: {', '.join(_available_benches())})")
        metrics = run_bench(cfg, out_dir, _explicit_keys(HydraConfig.get().overrides.task))
    if job.ok:
        try:  # the run is done and recorded ok; a closed pipe (`| head`) must not fail it
            print(summary(metrics, out_dir), flush=True)
        except BrokenPipeError:
            sys.stdout = open(os.devnull, "w")
    return job.status


def main() -> None:
    """``python -m kbframe`` / the ``kbframe`` script: Hydra's main, with Hydra's own
    composition errors (unknown bench, wrong type ...) folded into one line
    (kbframe.cli.hydra_errors). ``--help`` / ``-h`` prints kbframe's own help (kbframe.cli.help)."""
    if any(a in ("--help", "-h") for a in sys.argv[1:]):
        from .help import text
        print(text())
        return
    hydra_errors.run(_hydra_main)


if __name__ == "__main__":
    main()
