"""``python -m kbframe +bench=NAME [overrides]``: run a bench and report it.

A user mistake is printed as one line ``kbframe: error: ...`` and exits with status 1; no
traceback (DESIGN.md decision 6). Hydra's own composition errors (wrong types, unknown
keys, unknown bench) are Hydra's messages, which name the key and list the options.
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import schema
from .bench import run_bench, summary
from .errors import KbframeError

schema.register()


def _available_benches() -> list[str]:
    conf = Path(__file__).resolve().parent / "conf" / "bench"
    return sorted(p.stem for p in conf.glob("*.yaml"))


@hydra.main(version_base="1.3", config_path="pkg://kbframe.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    if "bench" not in cfg:
        print(f"kbframe: error: no bench selected; add +bench=NAME "
              f"(available: {', '.join(_available_benches())})", file=sys.stderr)
        sys.exit(1)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        metrics = run_bench(cfg, out_dir)
    except KbframeError as e:
        print(f"kbframe: error: {e}", file=sys.stderr)
        sys.exit(1)
    print(summary(metrics, out_dir))


if __name__ == "__main__":
    main()
