""""Did you mean" is written once (errors.did_you_mean / errors.unknown_name) and every name check uses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from layerscope.errors import InputError, did_you_mean, unknown_name

SRC = Path(__file__).resolve().parents[1] / "src" / "layerscope"


def test_helper_names_the_closest_choice_or_nothing():
    assert did_you_mean("mena", ["mean", "cls", "max"]) == " (did you mean 'mean'?)"
    assert did_you_mean("zzzz", ["mean", "cls"]) == ""
    assert did_you_mean("st-onx", {"st-onnx": {"backend": "onnx"}}) == " (did you mean 'st-onnx'?)"  # a dict's keys
    # flags compared without their dashes: "--bogus" is not taken for "--out"
    assert did_you_mean("--bogus", ["--out", "--probe"], key=lambda f: f.lstrip("-")) == ""
    assert did_you_mean("--prob", ["--out", "--probe"], key=lambda f: f.lstrip("-")) == " (did you mean '--probe'?)"
    err = unknown_name("pooling", "mena", ["mean", "cls"])
    assert isinstance(err, InputError)
    assert str(err) == "unknown pooling 'mena' (did you mean 'mean'?); choose from mean, cls"
    # what is offered can differ from what is matched (aliases, hidden kinds)
    assert str(unknown_name("peer", "nono", ["st-onnx"], listed=["all", "none", "st-onnx"])).endswith(
        "choose from all, none, st-onnx")


def test_difflib_is_used_in_one_place_only():
    users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                   if "get_close_matches" in p.read_text(encoding="utf-8"))
    assert users == ["errors.py"], users


@pytest.mark.parametrize("call, needle", [
    (lambda: __import__("layerscope.engines.base", fromlist=["x"]).check_engine_name("tourch"), "did you mean 'torch'"),
    (lambda: __import__("layerscope.analyses.base", fromlist=["x"]).get_analysis("stss"), "did you mean 'sts'"),
    (lambda: __import__("layerscope.bench.isolated", fromlist=["x"]).parse_peers("st-onx"), "did you mean 'st-onnx'"),
])
def test_each_name_check_suggests(call, needle):
    with pytest.raises(InputError, match=needle):
        call()
