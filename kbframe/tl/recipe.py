"""Recipes as data (DESIGN.md decision 5, ADR-0065 D5): a named fused op that the tl layer
expands into flat KERNEL-scope OpSpecs. Only the tl layer imports this module.

A recipe is a Hydra config under ``recipes/`` (package ``recipes.<name>``)::

    operands: {s: R, m: RW, l: RW, O: RW}        # R operands are never written
    primary_out: {name: P, from_shape: s, from_dtype: s, transform: identity}
    tile_alignment: single_shot
    scratch: [m_loc, m_new, corr, l_loc]         # internal slots; shapes are inferred
    engine_seq:                                  # ordered micro-ops from kbframe.ir.micro_ops
      - {engine: MATH, op: rmax, src: s, dst: m_loc, reduce_axis: -1}

:func:`load_recipes` validates every recipe when the run starts; a bad one raises
:class:`~kbframe.errors.RecipeError` naming the file and the step.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import micro_ops
from ..errors import RecipeError

SLOT_KEYS = ("src", "src_a", "src_b", "src_c")
STEP_EXTRAS = ("reduce_axis", "bcast_axis")
_STEP_KEYS = {"engine", "op", "dst", *SLOT_KEYS, *STEP_EXTRAS}


@dataclass(frozen=True)
class Step:
    """One engine_seq entry: ``op`` reads ``slots`` (slot key → recipe name), writes ``dst``."""

    index: int
    engine: str
    op: str
    slots: dict
    dst: str
    extra: dict


@dataclass(frozen=True)
class PrimaryOut:
    name: str
    from_shape: str
    from_dtype: str
    transform: str


@dataclass(frozen=True)
class Recipe:
    """A validated recipe descriptor (ADR-0065 D5 ``RecipeDescriptor``)."""

    name: str
    file: str
    operands: dict
    primary_out: PrimaryOut | None
    tile_alignment: str
    scratch: tuple
    steps: tuple

    def where(self, step: Step | None = None) -> str:
        at = f" step {step.index} ({step.op})" if step is not None else ""
        return f"recipe '{self.name}' ({self.file}){at}"


def _parse(name: str, raw: dict) -> Recipe:
    file = f"recipes/{name}.yaml"
    where = f"recipe '{name}' ({file})"
    unknown = set(raw) - {"operands", "primary_out", "tile_alignment", "scratch", "engine_seq"}
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {sorted(unknown)}")
    operands = dict(raw.get("operands") or {})
    for op_name, tag in operands.items():
        if tag not in ("R", "RW"):
            raise RecipeError(f"{where}: operand '{op_name}' tag must be R or RW, got '{tag}'")
    po = raw.get("primary_out")
    primary = None
    if po:
        primary = PrimaryOut(po.get("name", "P"), po["from_shape"], po.get("from_dtype", po["from_shape"]),
                             po.get("transform", "identity"))
        if primary.transform != "identity":
            raise RecipeError(f"{where}: primary_out.transform '{primary.transform}' unsupported "
                              f"(only identity, DDD-0065 §12)")
        for key in ("from_shape", "from_dtype"):  # P takes that operand's shape and dtype
            if getattr(primary, key) not in operands:
                raise RecipeError(f"{where}: primary_out.{key} '{getattr(primary, key)}' is not an operand")
    tile_alignment = raw.get("tile_alignment", "single_shot")
    if tile_alignment != "single_shot":  # a prologue runs once per composite (ADR-0065 D4)
        raise RecipeError(f"{where}: tile_alignment must be single_shot (the only alignment kbframe "
                          f"implements: a prologue runs once per composite), got '{tile_alignment}'")
    scratch = tuple(raw.get("scratch") or ())
    steps = []
    for i, s in enumerate(raw.get("engine_seq") or (), start=1):
        s = dict(s)
        bad = set(s) - _STEP_KEYS
        if bad:
            raise RecipeError(f"{where} step {i}: unknown key(s) {sorted(bad)}")
        op = s.get("op")
        if op not in micro_ops.MICRO_OPS and op != "gemm":
            raise RecipeError(f"{where} step {i}: unknown micro-op '{op}' "
                              f"(known: {', '.join(sorted(micro_ops.MICRO_OPS))})")
        slots = {k: s[k] for k in SLOT_KEYS if s.get(k) is not None}
        if op != "gemm":
            want = micro_ops.MICRO_OPS[op].slots
            if tuple(sorted(slots)) != tuple(sorted(want)):
                raise RecipeError(f"{where} step {i} ({op}): needs slots {list(want)}, got {sorted(slots)}")
        engine = "GEMM" if op == "gemm" else "MATH"  # the planner runs micro-ops on PE_MATH
        if s.get("engine", engine) != engine:
            raise RecipeError(f"{where} step {i} ({op}): engine must be {engine}, got '{s.get('engine')}'")
        if not s.get("dst"):
            raise RecipeError(f"{where} step {i} ({op}): no dst")
        steps.append(Step(i, s.get("engine", "MATH"), op, slots, s["dst"],
                          {k: s[k] for k in STEP_EXTRAS if s.get(k) is not None}))
    if not steps:
        raise RecipeError(f"{where}: engine_seq is empty")
    recipe = Recipe(name, file, operands, primary, tile_alignment, scratch, tuple(steps))
    _check_dataflow(recipe)
    return recipe


def _check_dataflow(r: Recipe) -> None:
    """Every slot resolves; R operands are never written; scratch is written before read."""
    internal = set(r.scratch) | ({r.primary_out.name} if r.primary_out else set())
    clash = internal & set(r.operands)
    if clash:
        raise RecipeError(f"{r.where()}: slot(s) {sorted(clash)} are both operand and scratch")
    written = set()
    for st in r.steps:
        for slot in st.slots.values():
            if slot not in r.operands and slot not in internal:
                raise RecipeError(f"{r.where(st)}: slot '{slot}' resolves to nothing "
                                  f"(operands {sorted(r.operands)}, scratch {sorted(internal)})")
            if slot in internal and slot not in written:
                raise RecipeError(f"{r.where(st)}: '{slot}' is read before any step writes it, "
                                  f"so its shape cannot be inferred")
        if st.dst not in r.operands and st.dst not in internal:
            raise RecipeError(f"{r.where(st)}: dst '{st.dst}' resolves to nothing")
        if r.operands.get(st.dst) == "R":
            raise RecipeError(f"{r.where(st)}: writes '{st.dst}', an R (read-only) operand")
        written.add(st.dst)
    for slot in internal - written:
        raise RecipeError(f"{r.where()}: scratch slot '{slot}' is never written, "
                          f"so its shape cannot be inferred")


def load_recipes(cfg_recipes) -> dict[str, Recipe]:
    """Validate the ``recipes`` config node into :class:`Recipe` objects by name.

    Raises:
        RecipeError: the first problem found, naming the recipe file and step.
    """
    from omegaconf import OmegaConf
    out = {}
    raw_all = OmegaConf.to_container(cfg_recipes, resolve=True) if cfg_recipes is not None else {}
    for name, raw in sorted((raw_all or {}).items()):
        if not isinstance(raw, dict):
            raise RecipeError(f"recipe '{name}' (recipes/{name}.yaml): expected a mapping")
        out[name] = _parse(name, raw)
    return out


def infer_shapes(recipe: Recipe, operand_shapes: dict) -> dict:
    """Shapes of every slot given the operands' shapes, walking the engine_seq.

    Raises:
        RecipeError: a step's inputs do not fit its shape rule, or a write changes the
            shape of an operand or of the primary_out (names the file and step).
    """
    shapes = dict(operand_shapes)
    po = recipe.primary_out
    for st in recipe.steps:
        ins = [shapes[s] for s in st.slots.values()]
        try:
            if st.op == "gemm":
                a, b = ins
                if a[1] != b[0]:
                    raise ValueError(f"gemm shapes {a} @ {b} do not match")
                shape = (a[0], b[1])
            else:
                shape = micro_ops.MICRO_OPS[st.op].shape(*ins)
        except ValueError as e:
            raise RecipeError(f"{recipe.where(st)}: {e}") from None
        want = shapes.get(st.dst)
        if po is not None and st.dst == po.name and want is None:
            want = shapes[po.from_shape]
        if want is not None and tuple(want) != tuple(shape):
            raise RecipeError(f"{recipe.where(st)}: writes '{st.dst}' with shape {shape}, "
                              f"but '{st.dst}' has shape {tuple(want)}")
        shapes[st.dst] = shape
    return shapes
