"""Progress bar: tqdm by KV tiles on a terminal, silent when stdout is not a
terminal or run.progress=false; the hook is detached after the run."""
import io
import os
import sys
import time

import pytest

from kbframe.run import progress
from kbframe.run.bench import run_bench

from conftest import REPO, compose_cfg


class Tty(io.StringIO):
    def isatty(self):
        return True


def _run(tmp_path, monkeypatch, *ov, tty=True):
    out, err = (Tty(), Tty()) if tty else (io.StringIO(), io.StringIO())
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    cfg = compose_cfg("bench.S_kv=640", "bench.data=false", *ov, bench="decode_opt3")
    run_bench(cfg, tmp_path)
    return err.getvalue()


def test_bar_counts_kv_tiles_on_a_terminal(tmp_path, monkeypatch):
    seen = []
    orig = progress.TileProgress.__call__

    def spy(self, cmd):
        orig(self, cmd)
        seen.append(self.bar.n)
    monkeypatch.setattr(progress.TileProgress, "__call__", spy)
    err = _run(tmp_path, monkeypatch, "run.progress=true")
    assert "tile" in err and "/10" in err  # 640 keys / 64 = 10 tiles
    assert seen == sorted(seen) and set(seen) - {0} == set(range(1, 11))  # every tile, in order


def test_silent_when_not_a_terminal(tmp_path, monkeypatch):
    assert _run(tmp_path, monkeypatch, "run.progress=true", tty=False) == ""


def test_silent_when_run_progress_false(tmp_path, monkeypatch):
    assert _run(tmp_path, monkeypatch, "run.progress=false") == ""


def test_hook_is_off_unless_enabled_and_detached_after(tmp_path, monkeypatch):
    class Cpu:
        progress = None
    cpu = Cpu()
    k = type("H", (), {"buf": "hbm.k"})()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with progress.attach(cpu, True, k, 10, 64) as p:
        assert p is None and cpu.progress is None
    monkeypatch.setattr(sys, "stdout", Tty())
    with progress.attach(cpu, True, k, 10, 64, file=Tty()) as p:
        assert cpu.progress is p is not None
    assert cpu.progress is None and p.bar.n == p.total == 10


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_cli_shows_a_bar_in_a_terminal(tmp_path):
    """The real CLI in a pseudo-terminal (80 columns): the bar is drawn on the terminal."""
    import fcntl
    import pty
    import struct
    import subprocess
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "kbframe", "+bench=decode_opt3", "bench.S_kv=8192",
                          "bench.data=false", "run.check=false", "run.fast_forward=off",  # simulated tile by tile
                          f"hydra.run.dir={tmp_path}"],
                         stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=REPO)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.wait(timeout=60)
    os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    assert p.returncode == 0, text
    assert "simulating" in text and "/128" in text and "tile" in text  # 8192 / 64 tiles
    assert "kbframe decode_opt3" in text


def test_bar_counts_the_rows_every_pe_covered(tmp_path, monkeypatch):
    """Many PEs: each PE's PE_CPU reports; split-K over 8 PEs covers all 40 KV
    tiles (8 PEs × 5), reaching the total before the bar is closed."""
    seen = []
    orig = progress.TileProgress.__call__

    def spy(self, cmd, pe=0):
        orig(self, cmd, pe)
        seen.append((pe, self.bar.n))
    monkeypatch.setattr(progress.TileProgress, "__call__", spy)
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(sys, "stderr", Tty())
    cfg = compose_cfg("hardware=cube", "bench.splits=8", "bench.S_kv=2560", "bench.data=false", "run.progress=true",
                      bench="decode_splitk")
    run_bench(cfg, tmp_path)
    assert {pe for pe, _ in seen} == set(range(8))
    ns = [n for _, n in seen]
    assert ns == sorted(ns) and ns[-1] == 40 and len(set(ns)) > 8  # advanced by every PE's tiles
