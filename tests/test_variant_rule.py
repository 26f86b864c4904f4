"""One rule says which variant a run is: the export's own fp32 graph is no variant, whichever engine runs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from layerscope.errors import InputError
from layerscope.model.manifest_type import Manifest
from layerscope.model.variants import run_variant, variant_onnx_file

SRC = Path(__file__).resolve().parents[1] / "src" / "layerscope"
MINIMAL = {"source": {"spec": "x", "path_or_id": "x"}, "family": "bert", "num_layers": 2, "hidden_size": 8}


def test_fp32_asked_for_in_any_spelling_is_no_variant():
    """Catches: OpenVINO's fp32 recorded as a variant ('fp32' or 'ov-fp32'), so that a store or a result made
    with --engine ov differs from one made with no variant, and a resume refuses what is the same graph."""
    assert [run_variant(v) for v in (None, "", "fp32", "ov-fp32")] == [None, None, None, None]
    assert [run_variant(v) for v in ("int8", "gqa", "ov-int8", "ov-bf16", "bf16")] == \
        ["int8", "gqa", "ov-int8", "ov-bf16", "bf16"]


def test_an_openvino_precision_is_still_refused_as_an_onnx_runtime_file():
    """Catches: the fp32 rule swallowing 'ov-fp32' where an ONNX Runtime engine is asked for it (it would run
    the fp32 export silently instead of saying to use --engine ov)."""
    manifest = Manifest.from_dict(MINIMAL)
    with pytest.raises(InputError, match="--engine ov --variant fp32"):
        variant_onnx_file(manifest, "ov-fp32")
    assert variant_onnx_file(manifest, "fp32") is None and variant_onnx_file(manifest, None) is None


def test_no_module_keeps_its_own_fp32_rule():
    """Catches: a place that compares or records variants with a rule of its own (``v not in ("", "fp32")``),
    which is how stores, results and engines came to disagree about OpenVINO's fp32."""
    own_rule = re.compile(r"""in \((None, )?["']{2}, ["']fp32["']""")
    found = [f"{p.relative_to(SRC)}:{n}" for p in sorted(SRC.rglob("*.py")) if p.name != "variants.py"
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if own_rule.search(line)]
    assert found == []
