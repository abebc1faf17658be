"""Traceability: each ADR-0065 Test Requirement (1–11) and each DDD-0065 §10 verification
item is a named test somewhere in this suite (DESIGN.md conventions)."""
import ast

import pytest

from conftest import REPO

ADR0065_TR = {
    1: "CompositeCmd flat-ops refactor preserves semantics (legacy lowering)",
    2: "softmax_merge lowers to 10 ops, rw_handles == (m, l, O)",
    3: "K-before-V: no V DMA during #2's MATH prologue",
    4: "strict-FIFO RW serialization",
    5: "DMA inserted from the operand's space (DMA_READ for HBM, none for TCM; DMA_WRITE for HBM out)",
    6: "opt2 matches opt3 numerically",
    7: "dispatch ratio opt3 > 2 × opt2",
    8: "two GEMMs rejected at emit",
    9: "composite within the 1024-byte cap",
    10: "auto-bind conflict",
    11: "MATH operand must be TCM",
}
DDD0065_S10 = ["refactor_safety", "recipe_lowering", "plan", "rw_hazard", "numeric_parity", "k_before_v",
               "dispatch_ratio", "dispatch_sensitivity_sweep", "repeated_handle", "determinism"]


def _test_names():
    names = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(node.name)
    return names


NAMES = _test_names()


@pytest.mark.parametrize("n", sorted(ADR0065_TR))
def test_every_adr0065_test_requirement_is_a_named_test(n):
    assert any(x.startswith(f"test_adr0065_tr{n}_") for x in NAMES), ADR0065_TR[n]


@pytest.mark.parametrize("item", DDD0065_S10)
def test_every_ddd0065_s10_item_is_a_named_test(item):
    aliases = {"k_before_v": "test_adr0065_tr3_k_before_v", "dispatch_ratio": "test_adr0065_tr7_"}
    hit = [x for x in NAMES if x.startswith("test_ddd0065_s10_") and item in x]
    if item in aliases:
        hit += [x for x in NAMES if x.startswith(aliases[item])]
    if item == "refactor_safety":
        hit += [x for x in NAMES if "ddd0065_s10_refactor_safety" in x]
    assert hit, item
