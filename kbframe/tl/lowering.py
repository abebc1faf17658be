"""Lowering a composite's entries into flat OpSpecs (ADR-0065 D6, DDD-0065 §6 steps 3–7):
a prologue entry ``{"op": recipe, <operand>: handle, ...}`` becomes its recipe's
engine_seq steps bound to handles, an epilogue entry ``{"op": kind, ...}`` one OpSpec on
the GEMM accumulator (or on ``out``, scope kernel).

Kernels pass the same entries every KV tile, so what does not change from call to call
is resolved once: a recipe's names, steps and scratch shapes (:class:`RecipePlan`), the
ops of a recipe bound to the very same handles, a validated epilogue op. Every call still
checks its inputs; a failing one gets the full message.
"""
from __future__ import annotations

from ..ir import micro_ops
from ..ir.commands import OpSpec, Scope
from ..errors import RecipeError, ValidationError, need
from ..ir.handles import TensorHandle
from .recipe import Recipe, infer_shapes


class Lowering:
    """The lowering state of one tl context.

    Args:
        recipes: validated recipes by name.
        scratch: ``scratch(name, arena_key, shape) -> handle``, the TCM for a recipe's
            scratch slot (:meth:`kbframe.tl.context.TL._scratch`).
    """

    def __init__(self, recipes: dict, scratch):
        self.recipes = recipes
        self.scratch = scratch
        self._plans: dict = {}  # recipe name -> RecipePlan
        self._prologue_ops: dict = {}  # (recipe plan, bound handles) -> ops; see expand_recipe
        self._epilogue_cache: dict = {}  # see epilogue

    def expand_recipe(self, item: dict):
        """A prologue entry ``{"op": recipe, <operand>: handle, ...}`` (not modified) as
        ``(ops, RW operand handles, primary_out handle or None, number of GEMM ops)``.

        The checks are one key-set comparison and a type/space test per handle (the recipe's
        names and shapes are resolved once, in its :class:`RecipePlan`); only a failing
        entry goes through :meth:`recipe_item_error` for the message."""
        name = item.get("op")
        recipe: Recipe | None = self.recipes.get(name)
        plan = self._plans.get(name)
        if plan is None or plan.recipe is not recipe:
            if recipe is None:
                raise ValidationError(f"unknown recipe '{name}' "
                                      f"(known: {', '.join(sorted(self.recipes)) or 'none'})")
            plan = self._plans[name] = RecipePlan(recipe)
        handles = [item.get(k) for k in plan.operands]
        if item.keys() != plan.item_keys or not all(
                [isinstance(h, TensorHandle) and h.space == "tcm" for h in handles]):
            self.recipe_item_error(name, recipe, item)
        shape_key = tuple([tuple(h.shape) for h in handles])
        scratch = plan.scratch.get(shape_key)
        if scratch is None:  # the same recipe on the same shapes every KV tile: infer once
            try:
                shapes = infer_shapes(recipe, dict(zip(plan.operands, [h.shape for h in handles])))
            except RecipeError as e:
                raise ValidationError(str(e)) from None
            scratch = plan.scratch[shape_key] = tuple(
                (slot, label, (recipe.name, slot, tuple(shapes[slot])), tuple(map(int, shapes[slot])))
                for slot, label in plan.scratch_slots)
        slots = dict(zip(plan.operands, handles))
        for slot, label, arena_key, shape in scratch:
            slots[slot] = self.scratch(label, arena_key, shape)
        # the same recipe on the very same handles (state, scratch, the S buffers) repeats
        # every few tiles; OpSpecs are frozen, so those ops are built once (the key holds
        # the handles, which hash by identity)
        key = (plan, *slots.values())
        ops = self._prologue_ops.get(key)
        if ops is None:
            ops = [OpSpec(kind, Scope.KERNEL, {k: slots[v] for k, v in operands}, dict(extra), slots[dst])
                   for kind, operands, extra, dst in plan.steps]
            if len(self._prologue_ops) >= 256:
                self._prologue_ops.clear()
            self._prologue_ops[key] = ops
        po = recipe.primary_out
        return ops, [slots[k] for k in plan.rw], (slots[po.name] if po is not None else None), plan.n_gemm

    @staticmethod
    def recipe_item_error(name: str, recipe: Recipe, item: dict) -> None:
        """Raise the ValidationError for a prologue entry that failed the quick checks."""
        item = {k: v for k, v in item.items() if k != "op"}
        if item.keys() != recipe.operands.keys():
            missing = [k for k in recipe.operands if k not in item]
            if missing:
                raise ValidationError(f"recipe '{name}': missing operand(s) {missing}")
            extra = [k for k in item if k not in recipe.operands]
            raise ValidationError(f"recipe '{name}': unknown operand(s) {extra} (takes {list(recipe.operands)})")
        for k, h in item.items():
            if not isinstance(h, TensorHandle):
                raise ValidationError(f"recipe '{name}': operand '{k}' must be a handle, got {type(h).__name__}")
            if h.space != "tcm":
                raise ValidationError(f"MATH operand must be TCM: recipe '{name}' operand '{k}' is {h} "
                                      f"(ADR-0065 D6.7; tl.load it first)")

    def epilogue(self, item: dict, out: TensorHandle) -> tuple[OpSpec, bool]:
        """:meth:`epilogue_op` of a composite's epilogue entry (not modified), and whether
        the op reads ``out`` (then ``out`` is an rw_handle).

        Kernels pass the same entry every KV tile, so a validated result is reused when
        every key and value of the entry and ``out`` are the very objects of an earlier call
        (the cache holds them, so their ids cannot be reused): the inputs are then identical
        (handles never change shape or space), and the OpSpec is frozen. Any other entry is
        validated afresh."""
        key = (out, *map(id, item), *map(id, item.values()))
        hit = self._epilogue_cache.get(key)
        if hit is not None:
            return hit[0], hit[1]
        e_op = self.epilogue_op(dict(item), out)
        accumulates = any(h is out for h in e_op.operands.values())
        if len(self._epilogue_cache) >= 64:
            self._epilogue_cache.clear()
        self._epilogue_cache[key] = (e_op, accumulates, tuple(item.items()))
        return e_op, accumulates

    @staticmethod
    def epilogue_op(item: dict, out: TensorHandle) -> OpSpec:
        """An epilogue entry as an OpSpec. K_TILE / OUTPUT_TILE ops act on the GEMM
        accumulator (``out=None``); a KERNEL-scope op runs once after the tile loop, so it
        is lowered to a MATH op on ``out`` itself (first slot ``out``, written in place)."""
        kind = item.pop("op", None)
        scope_name = item.pop("scope", micro_ops.EPILOGUE_DEFAULT_SCOPE.get(kind, "output_tile"))
        try:
            scope = Scope(scope_name)
        except ValueError:
            raise ValidationError(f"epilogue '{kind}': scope must be one of "
                                  f"{[s.value for s in Scope]}, got '{scope_name}'") from None
        if kind not in micro_ops.EPILOGUE_OPERANDS:
            raise ValidationError(f"unknown epilogue op '{kind}' "
                                  f"(known: {', '.join(sorted(micro_ops.EPILOGUE_OPERANDS))})")
        names = micro_ops.EPILOGUE_OPERANDS[kind]
        missing = [n for n in names if n not in item]
        if missing:
            raise ValidationError(f"epilogue '{kind}': missing operand(s) {missing}")
        operands = {n: item.pop(n) for n in names}
        for n in micro_ops.MICRO_OPS[kind].extras:
            if n not in item:
                raise ValidationError(f"epilogue '{kind}': missing scalar '{n}'")
        for n, h in operands.items():
            need(isinstance(h, TensorHandle), f"epilogue '{kind}': operand '{n}' must be a handle, "
                                               f"got {type(h).__name__}")
        try:
            shape = micro_ops.MICRO_OPS[kind].shape(out.shape, *[h.shape for h in operands.values()])
        except ValueError as e:
            raise ValidationError(f"epilogue '{kind}': {e} (out {out})") from None
        if tuple(shape) != tuple(out.shape):
            raise ValidationError(f"epilogue '{kind}': result shape {tuple(shape)} differs from out {out}")
        if scope is Scope.KERNEL:
            need(out.space == "tcm", f"epilogue '{kind}' with scope kernel runs on out after the tile "
                                      f"loop; MATH output must be TCM, got {out}")
            slots = micro_ops.MICRO_OPS[kind].slots
            return OpSpec(kind, scope, dict(zip(slots, [out, *operands.values()])), item, out)
        return OpSpec(kind, scope, operands, item, None)


class RecipePlan:
    """What expanding a recipe needs that does not change from call to call: its operand
    names, the scratch slots (scratch, then primary_out) with their allocation names, and
    each engine_seq step as ``(kind, ((operand key, slot name), ...), extra, dst slot)``
    (a GEMM step's slots renamed ``a``, ``b``). ``scratch`` caches, per tuple of operand
    shapes, each scratch slot's ``(slot, name, arena key, shape)``."""

    __slots__ = ("recipe", "operands", "item_keys", "rw", "scratch_slots", "steps", "n_gemm", "scratch")

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.operands = tuple(recipe.operands)
        self.item_keys = {"op", *recipe.operands}
        self.rw = tuple(k for k, tag in recipe.operands.items() if tag == "RW")
        po = recipe.primary_out
        self.scratch_slots = tuple((s, f"{recipe.name}.{s}")
                                   for s in (*recipe.scratch, *([po.name] if po is not None else [])))
        self.steps = tuple((st.op, tuple(zip(("a", "b"), st.slots.values()) if st.op == "gemm"
                                         else st.slots.items()), st.extra, st.dst)
                           for st in recipe.steps)
        self.n_gemm = sum(st.op == "gemm" for st in recipe.steps)
        self.scratch: dict = {}
