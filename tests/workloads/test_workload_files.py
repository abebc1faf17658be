"""A workload is its own files (DESIGN.md decision 7): no module outside a workload's module
and its kernels names it, and the run shell, pre-flight, reports and CLI never name a
workload's tensors."""
import ast
from pathlib import Path

import pytest

from kbframe.run.schema import workload_classes

PKG = Path(__file__).resolve().parents[2] / "kbframe"


WORKLOADS = sorted(workload_classes().items())


def test_the_workloads_are_found():
    """Every workload module, and only those: the shared decode helpers (workloads/attention.py,
    a mixin and functions, no Workload subclass) are not one."""
    assert [(n, c.__name__) for n, c in WORKLOADS] == [("decode_heads", "DecodeHeads"),
                                                      ("decode_splitk", "DecodeSplitk"),
                                                      ("decoder_layer", "DecoderLayer"), ("gemm", "Gemm"),
                                                      ("gqa_decode", "GqaDecode"),
                                                      ("rmsnorm_linear", "RmsnormLinear")]


def _imports_and_strings(path: Path) -> set[str]:
    """Dotted module names imported, identifiers, and string constants (whole) of a module."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
    return out


@pytest.mark.parametrize("name, cls", WORKLOADS)
def test_only_a_workloads_own_files_name_it(name, cls):
    """Its class, its module and its kernel module are named only in its own files (the
    registry finds workloads by walking the package)."""
    own = {PKG / "workloads" / f"{name}.py", PKG / "kernels" / f"{name}.py"}
    marks = {cls.__name__, f"workloads.{name}", f"kernels.{name}", f"kbframe.workloads.{name}",
             f"kbframe.kernels.{name}"}
    naming = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                    if p not in own and any(w in marks or w.endswith(tuple("." + m for m in marks))
                                            for w in _imports_and_strings(p)))
    assert naming == []


@pytest.mark.parametrize("folder", ["run", "report", "cli"])
def test_the_run_shell_reports_and_cli_name_no_workload_tensor(folder):
    """No string in the generic layers is a workload's tensor name (q, k, v, A, B, C, ...)."""
    tensors = {"q", "k", "v", "A", "B", "C", "x", "gamma", "W", "y", "bias"}
    def strings(path):
        return {n.value for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    naming = sorted(f"{p.relative_to(PKG)}: {sorted(tensors & strings(p))}"
                    for p in (PKG / folder).rglob("*.py") if tensors & strings(p))
    assert naming == []


def test_no_module_outside_workloads_and_kernels_names_s_kv_or_g():
    """DESIGN decision 7: the decode shape names (S_kv, G) live in the workloads and their
    kernels only, docstrings and messages included."""
    import re
    word = re.compile(r"\b(S_kv|G)\b")
    naming = sorted(f"{p.relative_to(PKG)}:{i}" for p in PKG.rglob("*.py")
                    if p.relative_to(PKG).parts[0] not in ("workloads", "kernels")
                    for i, line in enumerate(p.read_text().splitlines(), 1) if word.search(line))
    assert naming == []
