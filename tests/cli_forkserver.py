"""Run many ``python -m kbframe ARGS`` command lines cheaply: a fork server for tests.

Interpreter start-up and the imports (hydra, omegaconf, numpy) cost ~0.6 s of CPU per
``python -m kbframe``, Hydra's plugin discovery ~0.15 s more; the bad-input table has over
200 rows. This server imports kbframe and finds Hydra's plugins once, then forks one child
process per command line. The child changes to the requested directory, points file
descriptors 1 and 2 at files, sets ``sys.argv`` and runs the ``kbframe`` package as
``__main__`` (exactly what ``python -m kbframe`` runs), and exits with the status the CLI
chose. ``tests/test_bad_inputs.py`` checks that a few rows give byte-identical results
through a real ``sys.executable -m kbframe``.

Protocol: JSON lines on stdin ``{"id", "argv", "cwd"}`` until EOF; JSON lines on stdout
``{"id", "rc", "stdout", "stderr"}`` as children finish (at most ``--jobs`` at once).
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import traceback


def _child(req: dict, out_path: str, err_path: str) -> None:
    code = 1
    try:
        os.chdir(req["cwd"])
        for fd, path in ((1, out_path), (2, err_path)):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(f, fd)
            os.close(f)
        sys.argv = ["kbframe", *req["argv"]]
        try:
            runpy.run_module("kbframe", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:  # as the interpreter does at exit
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _warm(search: bool) -> None:
    """Do once what every child would do first: import kbframe's CLI and the modules a run
    imports as it needs them; let Hydra discover its plugins (which imports each one); and
    import optuna if a command line searches (the Optuna sweeper imports it as it runs).
    Then ``gc.freeze()``: the children's collections skip the objects they share with it."""
    import gc
    import importlib
    import pkgutil

    import kbframe
    import kbframe.cli.main  # noqa: F401
    from hydra.core.plugins import Plugins

    for m in pkgutil.walk_packages(kbframe.__path__, "kbframe."):
        if not m.name.endswith("__main__"):  # running a __main__ would run a command
            importlib.import_module(m.name)
    Plugins.instance()
    if search:
        importlib.import_module("hydra_plugins.hydra_optuna_sweeper._impl")
    gc.freeze()


def serve(jobs: int) -> None:
    reqs = [json.loads(line) for line in sys.stdin if line.strip()]
    _warm(any(a.startswith("+search=") for r in reqs for a in r["argv"]))
    tmp = tempfile.mkdtemp(prefix="kbframe-forkserver-")
    running: dict[int, tuple] = {}
    todo = list(reversed(reqs))
    while todo or running:
        while todo and len(running) < jobs:
            req = todo.pop()
            out_p, err_p = os.path.join(tmp, f"{req['id']}.out"), os.path.join(tmp, f"{req['id']}.err")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req, out_p, err_p)
            running[pid] = (req, out_p, err_p)
        pid, status = os.waitpid(-1, 0)
        req, out_p, err_p = running.pop(pid)
        rc = os.waitstatus_to_exitcode(status)
        res = {"id": req["id"], "rc": rc}
        for key, p in (("stdout", out_p), ("stderr", err_p)):
            with open(p, encoding="utf-8", errors="replace") as f:
                res[key] = f.read()
            os.unlink(p)
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()
    os.rmdir(tmp)


def run_many(requests: list[dict], jobs: int = 2, timeout: float = 600) -> dict:
    """Run ``[{"id", "argv", "cwd"}]`` through a fork server; ``{id: result}``."""
    import subprocess
    p = subprocess.run([sys.executable, __file__, str(jobs)], input="".join(json.dumps(r) + "\n" for r in requests),
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"fork server failed ({p.returncode}):\n{p.stderr}")
    out = {}
    for line in p.stdout.splitlines():
        r = json.loads(line)
        out[r["id"]] = r
    return out


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
