"""A model type layerscope cannot serve is refused from its config.json alone, in one line, before any
weights or tokenizer are read (the folders here hold nothing else)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import run_cli


def _config_only(tmp_path, model_type: str, **overrides):
    from transformers import AutoConfig

    folder = tmp_path / model_type
    if model_type.startswith("layerscope-"):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    else:
        AutoConfig.for_model(model_type, **overrides).save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    return folder


@pytest.mark.parametrize("model_type,overrides,says", [
    ("layerscope-no-such-arch", {}, "has no model class for it"),
    ("resnet", {}, "neither as a masked-LM encoder nor as a causal-LM decoder"),
    ("bart", {}, "is an encoder-decoder model"),
])
def test_unservable_model_type_is_refused_from_its_config(model_type, overrides, says, tmp_path, capsys):
    """Catches: a type refused only once its weights or tokenizer are read (these folders have none, so
    the message would name the missing files instead), a traceback, or a type let through to the exporter."""
    folder = _config_only(tmp_path, model_type, **overrides)
    code, text = run_cli(["export", folder, "--out", tmp_path / "out"], capsys)
    assert code == 2, text
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], text
    assert "Traceback" not in text and not (tmp_path / "out" / "model.onnx").exists()


def test_a_derivable_type_passes_the_config_check_and_stops_at_the_missing_tokenizer(tmp_path, capsys):
    """Catches: the refusal above firing for a type layerscope serves (the check runs on the config alone,
    so a plain Llama config passes it and the next missing thing, the tokenizer, is what is reported)."""
    folder = _config_only(tmp_path, "llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64)
    code, text = run_cli(["export", folder, "--out", tmp_path / "out"], capsys)
    assert code == 2 and "tokenizer" in text and "not supported" not in text, text
