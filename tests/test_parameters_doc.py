"""``docs/parameters.md`` is generated from the parameters' declarations (kbframe.params) by
``python -m kbframe.cli.help --markdown``; the committed file must be that text, and
``--help`` lists every declared key."""
from __future__ import annotations

from conftest import REPO
from kbframe.cli import help as kb_help


def test_parameters_md_is_the_generated_text():
    committed = (REPO / "docs" / "parameters.md").read_text(encoding="utf-8")
    assert committed == kb_help.markdown() + "\n", (
        "docs/parameters.md is stale: python -m kbframe.cli.help --markdown > docs/parameters.md")


def test_help_lists_every_declared_key():
    text = kb_help.text()
    keys = [row[0] for _, _, rows in kb_help.sections() for row in rows]
    assert {"run.fast_forward", "calibration.R", "hardware.hbm_mode", "hardware.units.<unit>.peak_tflops",
            "bench.dtype", "bench.tile", "bench.v_staging"} <= set(keys)
    for key in keys:
        assert f"  {key}  [" in text


def test_help_gives_each_bench_its_configs_first_sentence_whole():
    lines = {line.split()[0]: line for line in kb_help.text().splitlines()
             if line.startswith("  ") and " [" in line and line.split()[0] in ("rmsnorm_linear", "decoder_layer")}
    assert lines["rmsnorm_linear"].endswith("the RMSNorm a YAML prologue recipe (recipes/rmsnorm.yaml) ahead of the "
                                            "GEMM head that streams W from HBM.")
    assert lines["decoder_layer"].endswith("(kbframe/workloads/decoder_layer.py): RMSNorm, QKV, RoPE, KV-cache append, "
                                           "GQA attention, o-projection, SwiGLU FFN, residuals, all-reduce over IPCQ.")
