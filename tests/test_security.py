"""A config can never run code or write outside the run directory (DESIGN.md decision 1,
docs/errors.md): each security class tried by kind, through an override, a file on
``hydra.searchpath`` and a config group choice, as one-line refusals that leave a victim
file outside the run directory untouched and write nothing there.

The command lines run through the fork server (tests/cli_forkserver.py), all at once.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from cli_forkserver import run_many
from conftest import REPO

VICTIM = b"the user's file, outside any run directory\n"


def _files(tmp):
    """A search path folder ``more/`` with hostile configs, and the victims they aim at."""
    (tmp / "elsewhere").mkdir()
    victim = tmp / "elsewhere" / "victim"
    victim.write_bytes(VICTIM)
    more = tmp / "more"
    for d in ("bench", "sweep", "hydra/hydra_logging", "hydra/callbacks", "hardware"):
        (more / d).mkdir(parents=True)
    cb = f"_target_: numpy.save\n      file: {tmp}/elsewhere/x.npy\n      arr: [1]\n"
    fh = f"class: logging.FileHandler\n        filename: {victim}\n        mode: w\n"
    fac = f"(): builtins.open\n        file: {victim}\n        mode: w\n"
    bench = "# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - _self_\n"
    (more / "bench" / "evil_callback.yaml").write_text(f"{bench}hydra:\n  callbacks:\n    x:\n      {cb}")
    (more / "bench" / "evil_handler.yaml").write_text(f"{bench}hydra:\n  hydra_logging:\n    handlers:\n      f:\n        {fh}")
    (more / "bench" / "evil_factory.yaml").write_text(f"{bench}hydra:\n  job_logging:\n    handlers:\n      f:\n        {fac}")
    (more / "bench" / "evil_target.yaml").write_text(
        f"{bench}hydra:\n  job:\n    env_set:\n      X:\n        _target_: os.system\n        command: touch {victim}\n")
    (more / "bench" / "evil_choice.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - override /hardware: ../../../../../../../"
        f"{str(tmp).lstrip('/')}/elsewhere/hw\n  - _self_\n")
    (tmp / "elsewhere" / "hw.yaml").write_text("n_pes: 1\n")
    up = "/.." * 12 + str(tmp)  # from any folder of the search path to tmp
    (more / "bench" / "evil_out.yaml").write_text(f"{bench}hydra:\n  output_subdir: {tmp}/elsewhere/hyd\n")
    (more / "bench" / "evil_sub.yaml").write_text(f"{bench}hydra:\n  sweep:\n    subdir: ../../elsewhere/sub${{hydra.job.num}}\n")
    (more / "bench" / "evil_dot.yaml").write_text(
        f"{bench}hydra:\n  hydra_logging:\n    handlers:\n      console:\n        .:\n          stream: null\n")
    (more / "bench" / "evil_dl_config.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - {up}/elsewhere/hw@hardware\n  - _self_\n")
    (more / "bench" / "evil_dl_group.yaml").write_text(
        f"# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n  - {up}/elsewhere@hardware: hw\n  - _self_\n")
    (more / "sweep" / "evil_out.yaml").write_text("# @package _global_\nhydra:\n  output_subdir: ../../elsewhere/hyd\n")
    (more / "sweep" / "evil_sub.yaml").write_text(f"# @package _global_\nhydra:\n  sweep:\n    subdir: {tmp}/elsewhere/sub\n")
    (more / "sweep" / "evil_dl.yaml").write_text(f"defaults:\n  - {up}/elsewhere@/hardware: hw\n")
    (more / "hydra" / "hydra_logging" / "evil_dot.yaml").write_text(
        "version: 1\nhandlers:\n  console:\n    class: logging.StreamHandler\n    .:\n      stream: null\n"
        "root:\n  handlers: [console]\n")
    (more / "sweep" / "evil.yaml").write_text(f"# @package _global_\nhydra:\n  mode: MULTIRUN\n  callbacks:\n    x:\n      {cb}")
    (more / "hydra" / "hydra_logging" / "evil.yaml").write_text(
        f"version: 1\nhandlers:\n  f:\n    class: logging.FileHandler\n    filename: {victim}\n    mode: w\n"
        f"root:\n  handlers: [f]\n")
    (more / "hydra" / "callbacks" / "evil.yaml").write_text(f"x:\n  {cb.replace('      ', '  ')}")
    return victim


SP = "hydra.searchpath=[pkg://kbframe,file://<tmp>/more]"
#: (id, argv, start of the one line after "kbframe: error: ", how it was set)
CASES = [
    # 1. Hydra objects: callbacks, logging handlers and factories, any other _target_
    ("cb_override", ["+bench=decode_opt2", "+hydra.callbacks.x._target_=numpy.save"], "hydra.callbacks.x._target_: kbframe does not take this override"),
    ("cb_file", ["+bench=evil_callback", SP], "hydra.callbacks.x._target_: 'numpy.save' is not a Hydra callback class defined in kbframe (kbframe.cli.callbacks.SweepReport) (set in <tmp>/more/bench/evil_callback.yaml)"),
    ("cb_group_sweep", ["+bench=decode_opt2", "+sweep=evil", SP], "hydra.callbacks.x._target_: 'numpy.save' is not a Hydra callback class defined in kbframe (kbframe.cli.callbacks.SweepReport) (set in <tmp>/more/sweep/evil.yaml)"),
    ("handler_override", ["+bench=decode_opt2", "+hydra.hydra_logging.handlers.f.class=logging.FileHandler"], "hydra.hydra_logging.handlers.f.class: kbframe does not take this override"),
    ("handler_file", ["+bench=evil_handler", SP], "hydra.hydra_logging.handlers.f.filename: '<tmp>/elsewhere/victim': a log file is a NAME.log in the run directory, ${hydra.runtime.output_dir}/NAME.log (set in <tmp>/more/bench/evil_handler.yaml)"),
    ("handler_group", ["+bench=decode_opt2", "hydra/hydra_logging=evil", SP], "hydra.hydra_logging.handlers.f.filename: '<tmp>/elsewhere/victim': a log file is a NAME.log in the run directory, ${hydra.runtime.output_dir}/NAME.log (set in <tmp>/more/hydra/hydra_logging/evil.yaml)"),
    ("factory_file", ["+bench=evil_factory", SP], "hydra.job_logging.handlers.f.(): 'builtins.open' is a logging factory, which runs any callable; kbframe takes none (set in <tmp>/more/bench/evil_factory.yaml)"),
    ("target_file", ["+bench=evil_target", SP], "hydra.job.env_set.X._target_: 'os.system' is an object Hydra would build before any check; in hydra a config may set _target_ only for hydra.callbacks, the launcher, the sweeper and its sampler (set in <tmp>/more/bench/evil_target.yaml)"),
    ("cb_group_callbacks", ["+bench=decode_opt2", "hydra/callbacks=evil", SP], "hydra/callbacks: kbframe does not take this override"),
    # 2. config group choices are names, never paths
    ("choice_override", ["+bench=../../../../<tmp>/more/bench/evil_callback"], "bench '../../../../<tmp>/more/bench/evil_callback': a config group choice is a name (of a file in bench/ on the config search path), never a path"),
    ("choice_sweep_list", ["-m", "+bench=decode_opt2,../x", "hydra.sweep.dir=<tmp>/sweeps/choice"], "bench '../x': a config group choice is a name (of a file in bench/ on the config search path), never a path"),
    ("choice_hydra_group", ["+bench=decode_opt2", "hydra/hydra_logging=../../../../<tmp>/more/hydra/hydra_logging/evil"], "hydra/hydra_logging '../../../../<tmp>/more/hydra/hydra_logging/evil': a config group choice is a name (of a file in hydra/hydra_logging/ on the config search path), never a path"),
    # 3. the folders Hydra places under the run or sweep directory (hydra.run.dir and
    # hydra.sweep.dir are where the user chose to write)
    ("out_subdir_override", ["+bench=decode_opt2", "hydra.output_subdir=<tmp>/elsewhere/hyd"], "hydra.output_subdir: '<tmp>/elsewhere/hyd' would write outside the run directory; give a relative path without '..' (it may interpolate ${hydra.job.num}, ${hydra.job.id} or ${hydra.job.name}) (set in the command line (hydra.output_subdir=<tmp>/elsewhere/hyd))"),
    ("out_subdir_file", ["+bench=evil_out", SP], "hydra.output_subdir: '<tmp>/elsewhere/hyd' would write outside the run directory; give a relative path without '..' (it may interpolate ${hydra.job.num}, ${hydra.job.id} or ${hydra.job.name}) (set in <tmp>/more/bench/evil_out.yaml)"),
    ("out_subdir_group", ["+bench=decode_opt2", "+sweep=evil_out", SP], "hydra.output_subdir: '../../elsewhere/hyd' would write outside the run directory; give a relative path without '..' (it may interpolate ${hydra.job.num}, ${hydra.job.id} or ${hydra.job.name}) (set in <tmp>/more/sweep/evil_out.yaml)"),
    ("sweep_subdir_override", ["-m", "+bench=decode_opt2", "bench.S_kv=64,128", "hydra.sweep.subdir=../../elsewhere/sub", "hydra.sweep.dir=<tmp>/sweeps/sub_ov"], "hydra.sweep.subdir: '../../elsewhere/sub' would write outside the sweep directory; give a relative path without '..' (it may interpolate ${hydra.job.num}, ${hydra.job.id} or ${hydra.job.name}) (set in the command line (hydra.sweep.subdir=../../elsewhere/sub))"),
    ("sweep_subdir_file", ["-m", "+bench=evil_sub", "bench.S_kv=64,128", SP, "hydra.sweep.dir=<tmp>/sweeps/sub_file"], "hydra.sweep.subdir: '../../elsewhere/sub${hydra.job.num}' would write outside the sweep directory; give a relative path without '..' (it may interpolate ${hydra.job.num}, ${hydra.job.id} or ${hydra.job.name}) (set in <tmp>/more/bench/evil_sub.yaml)"),
    ("sweep_subdir_group", ["-m", "+bench=decode_opt2", "+sweep=evil_sub", "bench.S_kv=64,128", SP, "hydra.sweep.dir=<tmp>/sweeps/sub_group"], "hydra.sweep.subdir: '<tmp>/elsewhere/sub' would write outside the sweep directory; give a relative path without '..' (it may interpolate ${hydra.job.num}, ${hydra.job.id} or ${hydra.job.name}) (set in <tmp>/more/sweep/evil_sub.yaml)"),
    ("job_name_override", ["+bench=decode_opt2", "hydra.job.name=../../elsewhere/x"], "hydra.job.name: '../../elsewhere/x' is not a name; Hydra puts it in the log file's path (${hydra.runtime.output_dir}/${hydra.job.name}.log) (set in the command line (hydra.job.name=../../elsewhere/x))"),
    # 4. logging's '.' key (attributes set on a handler)
    ("dot_override", ["+bench=decode_opt2", "hydra.hydra_logging.handlers.console.stream=null"], "hydra.hydra_logging.handlers.console.stream: kbframe does not take this override"),
    ("dot_file", ["+bench=evil_dot", SP], "hydra.hydra_logging.handlers.console.'.': {'stream': None} sets attributes on the object logging builds (its '.' key); kbframe takes none (set in <tmp>/more/bench/evil_dot.yaml)"),
    ("dot_group", ["+bench=decode_opt2", "hydra/hydra_logging=evil_dot", SP], "hydra.hydra_logging.handlers.console.'.': {'stream': None} sets attributes on the object logging builds (its '.' key); kbframe takes none (set in <tmp>/more/hydra/hydra_logging/evil_dot.yaml)"),
    # 5. a defaults list names configs in the config tree, never a path out of it
    ("dl_override", ["+bench=decode_opt2", "hardware=<up>/elsewhere/hw"], "hardware '<up>/elsewhere/hw': a config group choice is a name (of a file in hardware/ on the config search path), never a path"),
    ("dl_config_file", ["+bench=evil_dl_config", SP], "defaults entry '<up>/elsewhere/hw@hardware': a defaults list names a config group and a config in the config tree (names joined by '/', as /bench/decode_opt2), never a path out of it ('..') (set in <tmp>/more/bench/evil_dl_config.yaml)"),
    ("dl_group_file", ["+bench=evil_dl_group", SP], "defaults entry '<up>/elsewhere@hardware: hw': a defaults list names a config group and a config in the config tree (names joined by '/', as /bench/decode_opt2), never a path out of it ('..') (set in <tmp>/more/bench/evil_dl_group.yaml)"),
    ("dl_group_choice", ["+bench=decode_opt2", "+sweep=evil_dl", SP], "defaults entry '<up>/elsewhere@/hardware: hw': a defaults list names a config group and a config in the config tree (names joined by '/', as /bench/decode_opt2), never a path out of it ('..') (set in <tmp>/more/sweep/evil_dl.yaml)"),
    ("choice_in_file", ["+bench=evil_choice", SP], "hardware '../../../../../../../<tmpnoslash>/elsewhere/hw': a config group choice is a name (of a file in hardware/ on the config search path), never a path (set in <tmp>/more/bench/evil_choice.yaml)"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("security")
    victim = _files(tmp)
    reqs = []
    for cid, argv, _ in CASES:
        argv = [a.replace("<up>", "/.." * 12 + str(tmp)).replace("<tmp>", str(tmp)) for a in argv]
        if "-m" not in argv:
            argv.append(f"hydra.run.dir={tmp}/runs/{cid}")
        reqs.append({"id": cid, "argv": [*argv, "run.progress=false"], "cwd": str(REPO)})
    return tmp, victim, run_many(reqs, jobs=2)


@pytest.mark.parametrize("cid", [c[0] for c in CASES])
def test_a_config_cannot_run_code_or_write_outside(results, cid):
    tmp, victim, out = results
    want = next(c[2] for c in CASES if c[0] == cid).replace("<tmpnoslash>", str(tmp).lstrip("/"))
    want = want.replace("<up>", "/.." * 12 + str(tmp))
    r, want = out[cid], want.replace("<tmp>", str(tmp))
    err = r["stderr"].strip()
    assert r["rc"] == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("kbframe: error: " + want), err
    assert victim.read_bytes() == VICTIM
    assert sorted(os.listdir(tmp / "elsewhere")) == ["hw.yaml", "victim"]
    run_dir = tmp / "runs" / cid
    assert not run_dir.exists() or not (run_dir / "metrics.json").exists()


def test_kbframes_own_hydra_configs_pass_the_guard():
    """Every Hydra set-up kbframe ships composes through the guard: the default run, each
    sweep and search config, each launcher."""
    import kbframe.cli.main  # noqa: F401 (installs the guard in this process)
    from conftest import compose_cfg
    for ov in ([], ["+sweep=r_sweep"], ["+search=decode_tile"], ["hydra/launcher=joblib"],
               ["hydra/launcher=submitit_local"], ["hydra/job_logging=default"]):
        compose_cfg(*ov)
