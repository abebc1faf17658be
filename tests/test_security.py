"""A config can never run code or write outside the run directory (DESIGN.md decision 1,
docs/errors.md): each security class tried by kind, through an override, a file on
``hydra.searchpath`` and a config group choice, as one-line refusals that leave a victim
file outside the run directory untouched and write nothing there.

The command lines run through the fork server (tests/cli_forkserver.py), all at once.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

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
    # a node Hydra builds from, set by interpolating a node the guard would refuse in place
    (more / "bench" / "evil_interp.yaml").write_text(
        f"{bench}evil:\n  {cb.replace('      ', '  ')}hydra:\n  callbacks:\n    sweep_report:\n      x: ${{evil}}\n")
    (more / "bench" / "evil_interp_log.yaml").write_text(
        f"{bench}evil:\n  version: 1\n  handlers:\n    f:\n      {fh.replace('        ', '      ')}"
        f"  root:\n    handlers: [f]\nhydra:\n  hydra_logging: ${{evil}}\n")
    (more / "bench" / "evil_interp_create.yaml").write_text(
        f"{bench}hydra:\n  callbacks:\n    sweep_report:\n      x: \"${{oc.create:'{{_target_: numpy.save, "
        f"file: {tmp}/elsewhere/x.npy, arr: [1]}}'}}\"\n")
    # "billion laughs": ten aliases of ten aliases of ..., a million values from six lines
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    (more / "bench" / "evil_laughs.yaml").write_text("# @package bench\n" + "\n".join(laughs) + "\n")
    (more / "bench" / "evil.yml.yaml").write_text("# @package bench\n" + "\n".join(laughs) + "\n")  # +bench=evil.yml
    # the same with interpolations: each of ten ${...} names the list before it
    interps = ["a0: [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: [" + ", ".join([f'"${{..a{i - 1}}}"'] * 10) + "]" for i in range(1, 6)]
    (more / "bench" / "evil_interps.yaml").write_text("# @package bench\n" + "\n".join(interps) + "\n")
    (more / "bench" / "evil_deep.yaml").write_text("x: " + "[" * 400 + "]" * 400 + "\n")
    (more / "bench" / "evil_utf8.yaml").write_bytes(b"x: \"\xff\xfe\"\n")
    # each file under the limit, together over it
    for i in range(3):
        (more / "bench" / f"part{i}.yaml").write_text("x: [" + ", ".join(["1"] * 9000) + "]\n")
    (more / "bench" / "evil_same_part.yaml").write_text(  # one file under the limit, merged three times
        "# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n" +
        "".join(f"  - /bench/part0@p{i}\n" for i in range(3)) + "  - _self_\n")
    (more / "bench" / "evil_parts.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /bench/decode_opt2@bench\n" +
        "".join(f"  - /bench/part{i}@p{i}\n" for i in range(3)) + "  - _self_\n")
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
    ("interp_callback", ["+bench=evil_interp", SP], "hydra.callbacks.sweep_report.x._target_: 'numpy.save' is an object Hydra would build before any check; in hydra a config may set _target_ only for hydra.callbacks, the launcher, the sweeper and its sampler (set in <tmp>/more/bench/evil_interp.yaml)"),
    ("interp_logging", ["+bench=evil_interp_log", SP], "hydra.hydra_logging.handlers.f.filename: '<tmp>/elsewhere/victim': a log file is a NAME.log in the run directory, ${hydra.runtime.output_dir}/NAME.log (set in <tmp>/more/bench/evil_interp_log.yaml)"),
    ("interp_resolver", ["+bench=evil_interp_create", SP], "hydra.callbacks.sweep_report.x: '${oc.create:'{_target_: numpy.save, file: <tmp>/elsewhere/x.npy, arr: [1]}'}': in hydra.callbacks, hydra.launcher, hydra.sweeper, hydra.hydra_logging, hydra.job_logging a value that is an interpolation must name a key by its full path (or be ${hydra:...} or ${now:...}): Hydra builds objects from these sections (set in <tmp>/more/bench/evil_interp_create.yaml)"),
    ("cb_group_callbacks", ["+bench=decode_opt2", "hydra/callbacks=evil", SP], "hydra/callbacks: kbframe does not take this override"),
    ("searchpath_pkg", ["+bench=decode_opt2", "hydra.searchpath=[pkg://kbframe,pkg://kbframe_evil_module]"], "hydra.searchpath entry 'pkg://kbframe_evil_module': Hydra would import that module to read configs from it, running its code; a search path entry names a folder (file://DIR) or kbframe's own configs (pkg://kbframe)"),
    ("searchpath_structured", ["+bench=decode_opt2", "hydra.searchpath=[structured://kbframe_evil_module]"], "hydra.searchpath entry 'structured://kbframe_evil_module': Hydra would import that module to read configs from it, running its code; a search path entry names a folder (file://DIR) or kbframe's own configs (pkg://kbframe)"),
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
    # 6. the config files of a config stand for at most 20,000 values, YAML aliases
    # expanded and interpolations resolved
    ("yaml_aliases", ["+bench=evil_laughs", SP], "config file '<tmp>/more/bench/evil_laughs.yaml': its YAML stands for more than 20,000 values with its aliases (*name) expanded; a config holds at most 20,000"),
    ("yaml_aliases_yml", ["+bench=evil.yml", SP], "config file '<tmp>/more/bench/evil.yml.yaml': its YAML stands for more than 20,000 values with its aliases (*name) expanded; a config holds at most 20,000"),
    ("yaml_parts", ["+bench=evil_parts", SP], "config file '<tmp>/more/bench/part0.yaml': with the config files read before it, the config stands for more than 20,000 values (aliases (*name) expanded); a config holds at most 20,000"),
    ("yaml_interps", ["+bench=evil_interps", SP], "bench.a4[0][6][5][8][1]: the config's interpolations (${...}) resolve to more than 20,000 values by here; a config holds at most 20,000"),
    ("yaml_interps_sweep", ["-m", "+bench=evil_interps", SP, "hydra.sweep.dir=<tmp>/sweeps/interps"], "bench.a4[0][6][4][8]: the config's interpolations (${...}) resolve to more than 20,000 values by here; a config holds at most 20,000"),
    ("interp_env_set", ["+bench=decode_opt2", "+hydra.job.env_set.S0=x"] + [
        f"+hydra.job.env_set.S{i}='" + f"${{.S{i - 1}}}" * 10 + "'" for i in range(1, 7)], "hydra.job.env_set.S5: resolving the config's interpolations (${...}) takes more than 20,000 steps by here; a config may take at most 20,000"),
    ("yaml_same_part", ["+bench=evil_same_part", SP], "config '<tmp>/more/bench/part0.yaml': merged with the configs before it (each as many times as a defaults list names it), the config holds more than 20,000 values; a config holds at most 20,000"),
    ("yaml_deep", ["+bench=evil_deep", SP], "config file '<tmp>/more/bench/evil_deep.yaml' nests its lists or mappings deeper than 64 levels"),
    ("yaml_utf8", ["+bench=evil_utf8", SP], "config file '<tmp>/more/bench/evil_utf8.yaml' is not UTF-8 text (byte 4: b'\\xff')"),
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


def test_a_yaml_files_values_are_counted_with_its_aliases_expanded():
    """Each value once per place it stands: a mapping, its keys, a sequence, its scalars;
    an alias counts its anchor's whole node again; a recursive alias is more than any
    limit; text PyYAML cannot compose is left to Hydra's own error (None)."""
    from kbframe.yaml_values import MAX_YAML_VALUES, yaml_values
    assert yaml_values("") == 0
    assert yaml_values("a: [1, 2]\n") == 5
    assert yaml_values("a: &x [1, 2]\nb: *x\n") == 9
    assert yaml_values("a: &x [1, 2]\nb: [*x, *x]\n") == 1 + 4 + 1 + 1 + 3 + 3
    assert yaml_values("a: &x [*x]\n") == MAX_YAML_VALUES + 1
    assert yaml_values("a: [1, 2\n") is None
    assert yaml_values("a: " + "[" * 63 + "]" * 63) == 2 + 63  # 64 levels: the mapping and 63 lists
    with pytest.raises(RecursionError):
        yaml_values("a: " + "[" * 64 + "]" * 64)


def test_a_configs_interpolations_resolve_within_their_budgets():
    """OmegaConf resolves every value once, counted: values (an interpolation of a list
    counts its values again), interpolations resolved (a computed key, a resolver's call and a
    parsed string each count) and a string's characters; a value that does not resolve is
    left to the caller; the count stops with the check."""
    from omegaconf import OmegaConf

    from kbframe.errors import ConfigError
    from kbframe.yaml_values import _Budget, check_resolves, container_values
    ok = OmegaConf.create({"a": [1, 2], "b": "${a}", "c": "${nope}", "d": "${oc.decode:'[${a}]'}", "e": "???"})
    check_resolves(ok)
    assert _Budget.active is None and container_values(OmegaConf.to_container(ok)) == 1 + 5 + 3 + 4  # the mapping, keys, list, strings

    def refused(cfg, skip=()):
        with pytest.raises(ConfigError) as e:
            check_resolves(OmegaConf.create(cfg), skip=skip)
        assert _Budget.active is None
        return str(e.value)
    bomb = {"a0": [1] * 10, **{f"a{i}": [f"${{a{i - 1}}}"] * 10 for i in range(1, 6)}}
    assert refused(bomb) == ("a4[0][6][8][8][9]: the config's interpolations (${...}) resolve to more than 20,000 "
                             "values by here; a config holds at most 20,000")
    check_resolves(OmegaConf.create(bomb), skip=("a4", "a5"))  # 11 + 10·12 + 10·122 + 10·1222 values
    # keys computed as they resolve: ${oc.select:x.${n1}}, ${x.${n2}} ... (n_i names x.a_{i-1})
    computed = {"n": {f"n{i}": f"a{i - 1}" for i in range(1, 6)}, "x": {"a0": [1] * 10, **{
        f"a{i}": [f"${{oc.select:x.${{n.n{i}}}}}" if i % 2 else f"${{x.${{n.n{i}}}}}"] * 10 for i in range(1, 6)}}}
    assert computed["x"]["a1"][0] == "${oc.select:x.${n.n1}}" and computed["x"]["a2"][0] == "${x.${n.n2}}"
    assert list(OmegaConf.create(computed).x.a2[3][0]) == [1] * 10  # a2 → a1 → a0
    assert refused(computed) == ("x.a4[0][3][8]: resolving the config's interpolations (${...}) takes more than "
                                 "20,000 steps by here; a config may take at most 20,000")  # oc.select's lists count
    doubling = {"s0": "x", **{f"s{i}": f"${{s{i - 1}}}${{s{i - 1}}}" for i in range(1, 40)}}
    assert refused(doubling) == ("s12: resolving the config's interpolations (${...}) takes more than 20,000 steps "
                                 "by here; a config may take at most 20,000")
    laughs = "[&a [x, x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcde", "bcdef")) + "]"
    assert refused({"j": f"${{oc.create:'{laughs}'}}"}) == (
        "j: resolving the config's interpolations (${...}) takes more than 20,000 steps by here; a config may take "
        "at most 20,000")  # oc.create's YAML, its aliases counted before it is built
    assert refused({"big": "x" * 600_000, "l": ["${big}"] * 20}) == (
        "l[12]: the config's strings resolve to more than 8,388,608 characters in all by here; a config's strings "
        "hold at most that many")
    wide = {"big": "x" * 20_000, "s": "${big}" * 60}
    assert refused(wide) == ("s: an interpolation (${...}) resolves to a string of more than 1,048,576 characters; "
                             "a config's strings hold at most that many")


@pytest.mark.parametrize("how", ["aliases", "interpolations"])
def test_a_report_does_not_expand_a_sweep_files_aliases(tmp_path, how):
    """A sweep directory handed to the report tools may be anyone's: its multirun.yaml and
    its jobs' .hydra files are read only within the limit, YAML aliases expanded and
    interpolations resolved (else as unreadable: the sweep's jobs are found from its
    folders, a job's overrides are unknown)."""
    from kbframe.report.sweep_jobs import collect, load_yaml, sweep_plan
    if how == "aliases":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    else:
        lines = ["a0: [x, x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: [" + ", ".join([f'"${{hydra.a{i - 1}}}"'] * 10) + "]" for i in range(1, 9)]
    laughs = "hydra:\n  " + "\n  ".join(lines) + "\n"
    (tmp_path / "multirun.yaml").write_text(laughs)
    assert load_yaml(tmp_path / "multirun.yaml") is None and sweep_plan(tmp_path) is None
    job = tmp_path / "0" / ".hydra"
    job.mkdir(parents=True)
    for name in ("overrides.yaml", "hydra.yaml", "config.yaml"):
        (job / name).write_text(laughs)
    [j] = collect(tmp_path)
    assert (j.num, j.overrides, j.status) == (0, [], "missing")


# ---------------------------------------------------------------- 3. symbolic links inside a run or sweep directory
# A run or sweep never writes through a link it did not make (kbframe.cli.job_dirs,
# kbframe.run.rundir.check_links): a link where it would write is refused with one line
# naming it, before Hydra writes; the directory the user named may itself be a link.

LINK = ("is a symbolic link: kbframe writes nothing through a link inside a run or sweep directory (only the "
        "directory hydra.run.dir or hydra.sweep.dir names may be one); remove the link or choose another directory")
SWEEP = ["-m", "+bench=decode_opt2", "bench.S_kv=64,128"]


def _link_cases(tmp):
    """``{id: (argv, the link's path)}``, with the links made (each aims at its own folder or
    victim file under ``tmp/out``)."""
    out = tmp / "out"
    out.mkdir()

    def aim(name, is_dir):
        p = out / name
        p.mkdir() if is_dir else p.write_bytes(VICTIM)
        return p
    cases = {}
    # a sweep's job folder, a job's .hydra/, a job's nested folder, multirun.yaml
    (tmp / "s_job").mkdir()
    (tmp / "s_job" / "0").symlink_to(aim("l1", True))
    cases["sweep_job_dir"] = (SWEEP + [f"hydra.sweep.dir={tmp}/s_job"], tmp / "s_job" / "0")
    (tmp / "s_hydra" / "0").mkdir(parents=True)
    (tmp / "s_hydra" / "0" / ".hydra").symlink_to(aim("l3", True))
    cases["sweep_job_hydra"] = (SWEEP + [f"hydra.sweep.dir={tmp}/s_hydra"], tmp / "s_hydra" / "0" / ".hydra")
    (tmp / "s_nested").mkdir()
    (tmp / "s_nested" / "a").symlink_to(aim("l4", True))
    cases["sweep_nested"] = (SWEEP + [f"hydra.sweep.dir={tmp}/s_nested", "hydra.sweep.subdir=a/${hydra.job.num}"],
                             tmp / "s_nested" / "a")
    (tmp / "s_multirun").mkdir()
    (tmp / "s_multirun" / "multirun.yaml").symlink_to(aim("v_multirun", False))
    cases["sweep_multirun"] = (SWEEP + [f"hydra.sweep.dir={tmp}/s_multirun"], tmp / "s_multirun" / "multirun.yaml")
    # a single run's .hydra/, its Hydra config file, its result files
    (tmp / "r_hydra").mkdir()
    (tmp / "r_hydra" / ".hydra").symlink_to(aim("lk", True))
    cases["run_hydra"] = (["+bench=decode_opt2", f"hydra.run.dir={tmp}/r_hydra"], tmp / "r_hydra" / ".hydra")
    (tmp / "r_cfg" / ".hydra").mkdir(parents=True)
    (tmp / "r_cfg" / ".hydra" / "config.yaml").symlink_to(aim("v_cfg", False))
    cases["run_hydra_file"] = (["+bench=decode_opt2", f"hydra.run.dir={tmp}/r_cfg"],
                               tmp / "r_cfg" / ".hydra" / "config.yaml")
    for name in ("metrics.json", "status.json", "op_log.jsonl.partial"):
        d = tmp / f"r_{name.split('.')[0]}"
        d.mkdir()
        (d / name).symlink_to(aim(f"v_{name}", False))
        cases[f"run_{name}"] = (["+bench=decode_opt2", f"hydra.run.dir={d}"], d / name)
    return cases


@pytest.fixture(scope="module")
def link_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("links")
    cases = _link_cases(tmp)
    big = tmp / "big"  # the user's own link as the run directory: taken
    big.mkdir()
    (tmp / "outputs").symlink_to(big)
    reqs = [{"id": cid, "argv": [*argv, "run.progress=false"], "cwd": str(REPO)} for cid, (argv, _) in cases.items()]
    reqs.append({"id": "named_link", "argv": ["+bench=decode_opt2", f"hydra.run.dir={tmp}/outputs", "bench.S_kv=64",
                                              "run.progress=false"], "cwd": str(REPO)})
    return tmp, cases, run_many(reqs, jobs=2)


def _out_untouched(tmp):
    """Nothing was written through any link: the folders they aim at are empty, the victim
    files as they were."""
    for p in sorted((tmp / "out").iterdir()):
        if p.is_dir():
            assert os.listdir(p) == [], f"written through a link into {p}: {os.listdir(p)}"
        else:
            assert p.read_bytes() == VICTIM, f"{p} was overwritten through a link"


@pytest.mark.parametrize("cid", ["run_hydra", "run_hydra_file", "run_metrics.json", "run_status.json",
                                 "run_op_log.jsonl.partial", "sweep_multirun"])
def test_a_link_inside_a_run_or_sweep_directory_is_refused(link_results, cid):
    """A single run, or a sweep whose multirun.yaml is a link: one line naming the link,
    exit 1, nothing written through it (and in a sweep, no job ran)."""
    tmp, cases, out = link_results
    r, (_, link) = out[cid], cases[cid]
    assert r["rc"] == 1 and r["stderr"] == f"kbframe: error: '{link}' {LINK}\n", r["stderr"]
    assert r["stdout"] == ""
    _out_untouched(tmp)
    if cid == "sweep_multirun":
        assert sorted(os.listdir(link.parent)) == ["multirun.yaml"]
    else:
        assert not (link.parent / "metrics.json").is_file() or link.name == "metrics.json"


@pytest.mark.parametrize("cid", ["sweep_job_dir", "sweep_job_hydra", "sweep_nested"])
def test_a_link_inside_a_sweep_fails_its_job_alone(link_results, cid):
    """A link in a job's path: that job fails with the line (recorded in its status.json when
    its folder is a real one, named by the report), the other job runs, the sweep exits 1."""
    tmp, cases, out = link_results
    r, (argv, link) = out[cid], cases[cid]
    sweep = Path(argv[3].split("=", 1)[1])
    assert r["rc"] == 1 and "Traceback" not in r["stderr"], r["stderr"]
    lines = r["stderr"].splitlines()
    assert lines[0] == f"kbframe: error (job 0 [+bench=decode_opt2 bench.S_kv=64 run.progress=False]): '{link}' {LINK}"
    _out_untouched(tmp)
    if cid == "sweep_nested":  # both jobs' folders are under the link: both refused
        assert lines[1] == (f"kbframe: error (job 1 [+bench=decode_opt2 bench.S_kv=128 run.progress=False]): "
                            f"'{link}' {LINK}")
        assert lines[2] == "kbframe: 2 of 2 jobs not ok:" and len(lines) == 5, r["stderr"]
        return
    assert lines[1] == "kbframe: 1 of 2 jobs not ok:" and len(lines) == 3, r["stderr"]
    assert json.loads((sweep / "1" / "status.json").read_text())["status"] == "ok"
    if cid == "sweep_job_hydra":
        st = json.loads((sweep / "0" / "status.json").read_text())
        assert st["status"] == "failed" and st["error"] == f"'{link}' {LINK}"
        assert lines[2].endswith(f"failed: '{link}' {LINK}")
    else:
        assert lines[2].endswith(f"failed: refused: its job directory '{link}' is a symbolic link (not followed)")


def test_the_run_directory_the_user_named_may_be_a_link(link_results):
    tmp, _, out = link_results
    r = out["named_link"]
    assert r["rc"] == 0, r["stderr"]
    assert json.loads((tmp / "big" / "status.json").read_text())["status"] == "ok"
    assert (tmp / "big" / "metrics.json").is_file() and (tmp / "outputs").is_symlink()


# ---------------------------------------------------------------- 4. another program's directory as run directory
# A directory that holds files no kbframe run made (no kbframe status.json) is refused with
# one line naming it and those files; nothing in it is touched (kbframe.run.rundir.check_foreign).
# A new, an empty and an earlier kbframe run's or sweep's directory work as before.

FOREIGN = {  # id: (files, a sweep?)
    "results_no_status": ({"trace.json": "mine", "metrics.json": "mine", "tensors.npz": "x"}, False),
    "own_status_json": ({"status.json": '{"status": "done", "by": "my script"}', "trace.json": "mine"}, False),
    "op_log_and_notes": ({"op_log.jsonl": "{}", "notes.txt": "n", "sub/data.bin": "d"}, False),
    "hydra_and_metrics": ({".hydra/config.yaml": "a: 1", "metrics.json": "mine"}, False),
    "sweep_job_results": ({"0/metrics.json": "mine", "data.csv": "a,b"}, True),
    "sweep_plain_files": ({"results.csv": "a,b", "0/.hydra/overrides.yaml": "[]", "0/trace.json": "mine"}, True),
}
_LISTED = {"results_no_status": "metrics.json, tensors.npz, trace.json", "own_status_json": "status.json, trace.json",
           "op_log_and_notes": "notes.txt, op_log.jsonl, sub", "hydra_and_metrics": "metrics.json",
           "sweep_job_results": "0/metrics.json, data.csv", "sweep_plain_files": "0/trace.json, results.csv"}


def _tree(d):
    """Every file (its bytes) and folder (None) under ``d``."""
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))}


@pytest.fixture(scope="module")
def foreign_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("foreign")
    reqs, before = [], {}
    for cid, (files, sweep) in FOREIGN.items():
        for name, body in files.items():
            (tmp / cid / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / cid / name).write_text(body + "\n")
        before[cid] = _tree(tmp / cid)
        argv = (SWEEP + [f"hydra.sweep.dir={tmp / cid}"]) if sweep else ["+bench=decode_opt2", f"hydra.run.dir={tmp / cid}"]
        reqs.append({"id": cid, "argv": [*argv, "bench.data=false", "run.progress=false"], "cwd": str(REPO)})
    (tmp / "empty").mkdir()
    for cid, argv in (("empty", ["+bench=decode_opt2", f"hydra.run.dir={tmp}/empty"]),
                      ("new", ["+bench=decode_opt2", f"hydra.run.dir={tmp}/new/run"]),
                      ("sweep_new", SWEEP + [f"hydra.sweep.dir={tmp}/sweep_new"])):
        reqs.append({"id": cid, "argv": [*argv, "run.progress=false"], "cwd": str(REPO)})
    out = run_many(reqs, jobs=2)
    # again into the directories kbframe made: a rerun, a reused sweep directory
    again = [{"id": "rerun", "argv": ["+bench=decode_opt2", f"hydra.run.dir={tmp}/empty", "bench.data=false",
                                      "run.progress=false"], "cwd": str(REPO)},
             {"id": "sweep_reuse", "argv": SWEEP + [f"hydra.sweep.dir={tmp}/sweep_new", "run.progress=false",
                                                    "hydra.callbacks.sweep_report.reuse_dir=true"], "cwd": str(REPO)}]
    out.update(run_many(again, jobs=2))
    return tmp, before, out


@pytest.mark.parametrize("cid", list(FOREIGN))
def test_a_directory_of_another_program_is_refused_untouched(foreign_results, cid):
    tmp, before, out = foreign_results
    r, sweep = out[cid], FOREIGN[cid][1]
    kind, key = ("sweep", "hydra.sweep.dir") if sweep else ("run", "hydra.run.dir")
    assert r["rc"] == 1 and r["stdout"] == "", r["stderr"]
    assert r["stderr"] == (f"kbframe: error: the {kind} directory '{tmp / cid}' holds files that are not a kbframe "
                           f"{kind}'s ({_LISTED[cid]}): kbframe runs only in a new or empty directory or one an earlier "
                           f"kbframe {kind} made, and never replaces or removes another program's files; choose "
                           f"another {key}\n")
    assert _tree(tmp / cid) == before[cid]  # nothing added, changed or removed


@pytest.mark.parametrize("cid", ["empty", "new", "sweep_new", "rerun", "sweep_reuse"])
def test_a_new_empty_or_kbframe_directory_still_works(foreign_results, cid):
    tmp, _, out = foreign_results
    r = out[cid]
    assert r["rc"] == 0, r["stderr"]
    d = tmp / {"rerun": "empty", "sweep_reuse": "sweep_new", "new": "new/run"}.get(cid, cid)
    if cid.startswith("sweep"):
        assert all(json.loads((d / j / "status.json").read_text())["status"] == "ok" for j in ("0", "1"))
    else:
        assert json.loads((d / "status.json").read_text())["status"] == "ok"
    if cid == "rerun":  # the rerun without data removed the earlier run's tensors.npz, its own file
        assert not (d / "tensors.npz").exists() and (d / "metrics.json").is_file()
