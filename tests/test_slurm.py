"""Sweeps on a real Slurm cluster: a 4-job kbframe sweep through
``hydra/launcher=submitit_slurm`` gives the basic launcher's sweep.csv apart from
wall-clock columns, with no sacct noise. Runs whenever Slurm is reachable (.ci/run starts a
one-node cluster with scripts/slurm_local.sh); skipped with a one-line reason otherwise."""
import csv
import shutil
import subprocess

import pytest

from conftest import cli

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the [submitit] extra is not installed")


def _slurm_reachable() -> str | None:
    """None when a Slurm node is up, else why not."""
    if shutil.which("sinfo") is None:
        return "Slurm is not installed here; start a one-node cluster with: sudo scripts/slurm_local.sh start"
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 10 s (is slurmctld running? sudo scripts/slurm_local.sh start)"
    states = p.stdout.split()
    if p.returncode != 0 or not any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states):
        return f"no Slurm node is up (sinfo: {(p.stdout + p.stderr).strip()[:120] or 'nothing'}); sudo scripts/slurm_local.sh start"
    return None


WHY = _slurm_reachable()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

SWEEP = ("-m", "+bench=decode_opt2,decode_opt3", "calibration.R=0.25,0.0625", "++bench.S_kv=256", "++bench.data=false")
WALL_CLOCK = ("sim.wall_s", "dir")  # how long a job took and where it ran differ by launcher


def _rows(d):
    with open(d / "sweep.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in csv.DictReader(f)]


def test_a_sweep_on_slurm_gives_the_basic_launchers_csv(tmp_path):
    basic = cli(*SWEEP, f"hydra.sweep.dir={tmp_path / 'basic'}", timeout=300)
    assert basic.returncode == 0, basic.stderr[-2000:]
    slurm = cli(*SWEEP, "hydra/launcher=submitit_slurm", "hydra.launcher.timeout_min=5",
                f"hydra.sweep.dir={tmp_path / 'slurm'}", timeout=600)
    assert slurm.returncode == 0, slurm.stderr[-3000:]
    rows = _rows(tmp_path / "slurm")
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert rows == _rows(tmp_path / "basic")
    # the jobs ran as Slurm jobs (submitit's folder holds their logs), with no sacct noise
    assert list((tmp_path / "slurm" / ".submitit").glob("*/*_log.out"))
    out = slurm.stdout + slurm.stderr
    assert "sacct" not in out and "accounting storage is disabled" not in out
