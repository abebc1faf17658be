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
