"""Recipes as data (DESIGN.md decision 5): validation at load naming the file and
step, and a second recipe added with nothing but a YAML file."""
import textwrap

import numpy as np
import pytest
from omegaconf import OmegaConf

from kbframe.ir import micro_ops
from kbframe.run.bench import run_bench
from kbframe.errors import RecipeError
from kbframe.tl.recipe import infer_shapes, load_recipes

from conftest import Sim, compose_cfg, emit

KNOWN = ", ".join(sorted(micro_ops.MICRO_OPS))


def _load(**recipes):
    return load_recipes(OmegaConf.create(recipes))


def _err(raw, name="bad"):
    with pytest.raises(RecipeError) as e:
        _load(**{name: raw})
    return str(e.value)


def test_softmax_merge_yaml_validates():
    cfg = compose_cfg()
    r = load_recipes(cfg.recipes)["softmax_merge"]
    assert r.file == "recipes/softmax_merge.yaml"
    assert r.operands == {"s": "R", "m": "RW", "l": "RW", "O": "RW"}
    assert (r.primary_out.name, r.primary_out.from_shape, r.primary_out.from_dtype, r.primary_out.transform) == (
        "P", "s", "s", "identity")
    assert r.tile_alignment == "single_shot"
    assert r.scratch == ("m_loc", "m_new", "corr", "l_loc")
    assert [(s.op, s.slots, s.dst, s.extra) for s in r.steps] == [
        ("rmax", {"src": "s"}, "m_loc", {"reduce_axis": -1}),
        ("max_elem", {"src_a": "m", "src_b": "m_loc"}, "m_new", {}),
        ("exp_diff", {"src_a": "m", "src_b": "m_new"}, "corr", {}),
        ("exp_diff", {"src_a": "s", "src_b": "m_new"}, "P", {"bcast_axis": 0}),
        ("rsum", {"src": "P"}, "l_loc", {"reduce_axis": -1}),
        ("fma", {"src_a": "l", "src_b": "corr", "src_c": "l_loc"}, "l", {}),
        ("mul_bcast", {"src_a": "O", "src_b": "corr"}, "O", {"bcast_axis": 1}),
        ("copy", {"src": "m_new"}, "m", {}),
    ]


def test_softmax_merge_shapes_inferred_from_operands():
    r = load_recipes(compose_cfg().recipes)["softmax_merge"]
    shapes = infer_shapes(r, {"s": (8, 64), "m": (8, 1), "l": (8, 1), "O": (8, 128)})
    assert {k: shapes[k] for k in ("m_loc", "m_new", "corr", "P", "l_loc")} == {
        "m_loc": (8, 1), "m_new": (8, 1), "corr": (8, 1), "P": (8, 64), "l_loc": (8, 1)}


def test_recipe_unknown_micro_op_names_file_and_step():
    msg = _err({"operands": {"x": "R", "y": "RW"},
                "engine_seq": [{"op": "copy", "src": "x", "dst": "y"}, {"op": "softmax", "src": "x", "dst": "y"}]})
    assert msg == f"recipe 'bad' (recipes/bad.yaml) step 2: unknown micro-op 'softmax' (known: {KNOWN})"


def test_recipe_slot_resolving_to_nothing():
    msg = _err({"operands": {"x": "R", "y": "RW"}, "scratch": ["t"],
                "engine_seq": [{"op": "rmax", "src": "zz", "dst": "t"}, {"op": "copy", "src": "t", "dst": "y"}]})
    assert msg == ("recipe 'bad' (recipes/bad.yaml) step 1 (rmax): slot 'zz' resolves to nothing "
                   "(operands ['x', 'y'], scratch ['t'])")


def test_recipe_dst_resolving_to_nothing():
    msg = _err({"operands": {"x": "R"}, "engine_seq": [{"op": "copy", "src": "x", "dst": "nowhere"}]})
    assert msg == "recipe 'bad' (recipes/bad.yaml) step 1 (copy): dst 'nowhere' resolves to nothing"


def test_recipe_write_to_r_operand():
    msg = _err({"operands": {"x": "R", "y": "RW"},
                "engine_seq": [{"op": "copy", "src": "y", "dst": "y"}, {"op": "copy", "src": "y", "dst": "x"}]})
    assert msg == "recipe 'bad' (recipes/bad.yaml) step 2 (copy): writes 'x', an R (read-only) operand"


def test_recipe_shape_not_inferable_read_before_write():
    msg = _err({"operands": {"x": "R", "y": "RW"}, "scratch": ["t"],
                "engine_seq": [{"op": "add", "src_a": "x", "src_b": "t", "dst": "y"},
                               {"op": "copy", "src": "x", "dst": "t"}]})
    assert msg == ("recipe 'bad' (recipes/bad.yaml) step 1 (add): 't' is read before any step writes it, "
                   "so its shape cannot be inferred")


def test_recipe_shape_not_inferable_never_written():
    msg = _err({"operands": {"x": "R", "y": "RW"}, "scratch": ["u"],
                "engine_seq": [{"op": "copy", "src": "x", "dst": "y"}]})
    assert msg == "recipe 'bad' (recipes/bad.yaml): scratch slot 'u' is never written, so its shape cannot be inferred"


@pytest.mark.parametrize("raw, msg", [
    ({"operands": {"x": "R", "y": "RW"}, "engine_seq": [{"op": "rmax", "src_a": "x", "dst": "y"}]},
     "recipe 'bad' (recipes/bad.yaml) step 1 (rmax): needs slots ['src'], got ['src_a']"),
    ({"operands": {"x": "R", "y": "RW"}, "engine_seq": [{"op": "copy", "src": "x"}]},
     "recipe 'bad' (recipes/bad.yaml) step 1 (copy): no dst"),
    ({"operands": {"x": "W"}, "engine_seq": [{"op": "copy", "src": "x", "dst": "x"}]},
     "recipe 'bad' (recipes/bad.yaml): operand 'x' tag must be R or RW, got 'W'"),
    ({"operands": {"x": "R"}, "engine_seq": []},
     "recipe 'bad' (recipes/bad.yaml): engine_seq is empty"),
    ({"operands": {"x": "R"}, "engine_seq": [{"op": "copy", "src": "x", "dst": "x", "axis": 1}]},
     "recipe 'bad' (recipes/bad.yaml) step 1: unknown key(s) ['axis']"),
    ({"operands": {"x": "R"}, "steps": []},
     "recipe 'bad' (recipes/bad.yaml): unknown key(s) ['steps']"),
    ({"operands": {"x": "R", "y": "RW"}, "primary_out": {"name": "P", "from_shape": "x", "transform": "trans"},
      "engine_seq": [{"op": "copy", "src": "x", "dst": "P"}]},
     "recipe 'bad' (recipes/bad.yaml): primary_out.transform 'trans' unsupported (only identity, DDD-0065 §12)"),
    ({"operands": {"x": "R", "P": "RW"}, "primary_out": {"name": "P", "from_shape": "x"},
      "engine_seq": [{"op": "copy", "src": "x", "dst": "P"}]},
     "recipe 'bad' (recipes/bad.yaml): slot(s) ['P'] are both operand and scratch"),
])
def test_recipe_other_validation_errors(raw, msg):
    assert _err(raw) == msg


def test_bad_recipe_fails_before_the_simulation(tmp_path):
    cfg = compose_cfg("+recipes.bad.operands.x=R", "+recipes.bad.engine_seq=[{op: nope, src: x, dst: x}]",
                      "bench.S_kv=64")
    with pytest.raises(RecipeError) as e:
        run_bench(cfg, tmp_path / "run")
    assert str(e.value) == f"recipe 'bad' (recipes/bad.yaml) step 1: unknown micro-op 'nope' (known: {KNOWN})"
    assert not (tmp_path / "run" / "op_log.jsonl").exists()


EXP_ROWS = textwrap.dedent("""\
    # @package recipes.exp_rows
    # Unnormalised row softmax of x: E = exp(x - rowmax(x)), acc = rowsum(E); E binds to the GEMM's a.
    operands: {x: R, acc: RW}
    primary_out: {name: E, from_shape: x, from_dtype: x, transform: identity}
    tile_alignment: single_shot
    scratch: [mx]
    engine_seq:
      - {engine: MATH, op: rmax,     src: x,              dst: mx, reduce_axis: -1}
      - {engine: MATH, op: exp_diff, src_a: x, src_b: mx, dst: E,  bcast_axis: 0}
      - {engine: MATH, op: rsum,     src: E,              dst: acc, reduce_axis: -1}
    """)


def test_second_recipe_from_a_yaml_file_works_end_to_end(tmp_path):
    """Adding a recipe that uses existing micro-ops needs one YAML file (in any config folder
    on Hydra's search path) and no code."""
    (tmp_path / "conf" / "recipes").mkdir(parents=True)
    (tmp_path / "conf" / "recipes" / "exp_rows.yaml").write_text(EXP_ROWS)
    cfg = compose_cfg(f"hydra.searchpath=[pkg://kbframe,file://{tmp_path / 'conf'}]",
                      "recipes=[softmax_merge,exp_rows]", bench=None)
    assert set(cfg.recipes) == {"softmax_merge", "exp_rows"}
    rng = np.random.default_rng(7)
    x, v = rng.standard_normal((8, 64)) * 4, rng.standard_normal((64, 128))
    sim = Sim(tmp_path, {"x": x, "v": v}, cfg=cfg)
    hs = {}

    def kern(tl):
        xs = tl.load(tl.ref("x"))
        acc = tl.zeros((8, 1), "acc")
        hs["o"] = tl.composite(prologue=[{"op": "exp_rows", "x": xs, "acc": acc}], op="gemm", b=tl.ref("v"))
        hs["acc"] = acc

    log = sim.run(kern)
    comp = [r for r in log if r["unit"] == "cpu" and r["op_kind"] == "composite"]
    # ops: rmax 24, exp_diff 32 (bcast_axis), rsum 24, gemm 40 → 120; 4 + 1 + 120 + 1 + 8 (acc) = 134
    assert [r["bytes"] for r in comp] == [134]
    assert [r["op_kind"] for r in log if r["unit"] == "math" and r["tile"] == -1][-3:] == ["rmax", "exp_diff", "rsum"]
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sim.read(hs["acc"]), e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(sim.read(hs["o"]), e @ v, rtol=1e-4, atol=1e-4)


def test_second_recipe_lowering(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "exp_rows.yaml").write_text(EXP_ROWS)
    hs = {}

    def kern(tl):
        xs, acc = tl.zeros((8, 64), "x"), tl.zeros((8, 1), "acc")
        hs["acc"] = acc
        tl.composite(prologue=[{"op": "exp_rows", "x": xs, "acc": acc}], op="gemm", b=tl.zeros((64, 16), "v"))

    cmds, sim = emit(kern, tmp_path, {}, overrides=[f"hydra.searchpath=[pkg://kbframe,file://{tmp_path}]",
                                                    "recipes=[exp_rows]"])
    assert set(sim.recipes) == {"exp_rows"}
    comp = cmds[-1]
    assert [o.kind for o in comp.ops] == ["rmax", "exp_diff", "rsum", "gemm"]
    assert comp.ops[3].operands["a"] is comp.ops[1].out  # E auto-bound to the GEMM's a
    assert comp.rw_handles == (hs["acc"],)


def test_recipe_added_from_the_command_line(tmp_path):
    """A recipe given entirely as an override validates and lowers (no file, no code)."""
    ov = ["+recipes.twice={operands: {x: R, y: RW}, engine_seq: [{op: add, src_a: x, src_b: x, dst: y}]}"]
    hs = {}

    def kern(tl):
        x, y = tl.load(tl.ref("x")), tl.zeros((8, 4), "y")
        tl.composite(op=None, prologue=[{"op": "twice", "x": x, "y": y}])
        hs["y"] = y

    x = np.arange(32.0).reshape(8, 4)
    sim = Sim(tmp_path, {"x": x}, overrides=ov)
    sim.run(kern)
    np.testing.assert_array_equal(sim.read(hs["y"]), 2 * x)


# ---------------------------------------------------------------- names and packages

@pytest.mark.parametrize("text", [
    "# @package recipes.a\nx: 1\n",
    "\n\n  # @package _global_\nx: 1\n",
    "# a comment first\n# @package _global_\nx: 1\n",  # Hydra stops at the first plain comment
    "# @package recipes.a extra\nx: 1\n",
    "x: 1\n# @package _global_\n",
    "# @other thing\n# @package recipes.b\n",
])
def test_header_package_reads_as_hydra_does(text):
    from hydra.plugins.config_source import ConfigSource
    from kbframe.tl.recipe import header_package
    try:
        hydra_pkg = ConfigSource._get_header_dict(text)["package"]
    except ValueError:  # Hydra refuses a malformed header line; kbframe reads no package from it
        hydra_pkg = None
    assert header_package(text) == hydra_pkg


def test_shipped_recipes_set_only_their_own_package():
    from conftest import REPO
    from kbframe.tl.recipe import check_file
    files = sorted((REPO / "recipes").glob("*.yaml"))
    assert files
    for f in files:
        check_file(f.stem, f)


@pytest.mark.parametrize("name", ["../x", "a/b", "a.b", "", "a-b", "é"])
def test_recipe_names_are_plain(name):
    from kbframe.tl.recipe import check_name
    with pytest.raises(RecipeError, match="is not a recipe name"):
        check_name(name)
    with pytest.raises(RecipeError, match=f"recipes.{name}: '.*' is not a recipe name"):
        _load(**{name: {"operands": {"x": "R"}}})
