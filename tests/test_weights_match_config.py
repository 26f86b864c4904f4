"""Weights that do not match config.json (layers the weights lack or hold beyond it, shapes that differ) are
one clear line at export and in every engine, never random weights filled in by transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_helpers import run_cli

TEXTS = "a cat sits on the mat\nthe dog runs in the park\n"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _edited(tiny_model, tmp_path: Path, **edit) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny_model("bert"), out)
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    cfg.update(edit)
    (out / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return out


def _one_line(args, capsys) -> str:
    code, text = run_cli(args, capsys)
    assert code == 2, text
    assert "internal error" not in text and "Traceback" not in text, text
    return " ".join(text.split())


@pytest.mark.parametrize("command", ["export", "torch", "ort", "ov"])
@pytest.mark.parametrize("edit, said", [({"num_hidden_layers": 12}, "missing from the checkpoint"),
                                        ({"num_hidden_layers": 1}, "layers the config does not have"),
                                        ({"intermediate_size": 48}, "size mismatch")])
def test_weights_that_disagree_with_config_are_one_line(command, edit, said, tiny_model, tmp_path, capsys):
    model = _edited(tiny_model, tmp_path, **edit)
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXTS, encoding="utf-8")
    if command == "export":
        args = ["export", model, "--out", tmp_path / "onnx"]
    else:
        args = ["extract", "--model", model, "--input", corpus, "--out", tmp_path / "store", "--engine", command]
    line = _one_line(args, capsys)
    assert "do not match its config.json" in line and said in line, line
    assert not (tmp_path / "store" / "store.json").exists() and not (tmp_path / "onnx" / "model.onnx").exists()


def test_a_head_checkpoint_loaded_as_its_base_model_still_loads(tiny_model):
    """The MLM head's weights are unexpected for the base model and harmless: no refusal."""
    from layerscope.model.families import family_for
    from layerscope.model.source import load_torch_model, resolve_source

    source = resolve_source(str(tiny_model("bert")))
    net, info = load_torch_model(source, family_for("bert"), output_loading_info=True)
    assert info["unexpected_keys"] and all(k.startswith("cls.") for k in info["unexpected_keys"])
    assert not info["missing_keys"]


def test_a_checkpoint_without_a_pooler_loads_and_exports(tiny_model, tmp_path, capsys):
    """A pooler is no part of the hidden states; checkpoints saved from a masked-LM model lack it (roberta-base
    does), and they load, export and extract with every other weight read."""
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(tiny_model("bert"), model)
    weights = load_file(str(model / "model.safetensors"))
    pooler = [k for k in weights if "pooler" in k.split(".")]
    assert pooler, sorted(weights)  # the case is what it claims
    save_file({k: v for k, v in weights.items() if k not in pooler}, str(model / "model.safetensors"),
              metadata={"format": "pt"})
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXTS, encoding="utf-8")
    code, text = run_cli(["extract", "--model", model, "--input", corpus, "--out", tmp_path / "store",
                          "--engine", "torch"], capsys)
    assert code == 0, text
    # a weight of a block is still one the model needs
    del weights[next(k for k in weights if ".layer.0." in k)]
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    line = _one_line(["extract", "--model", model, "--input", corpus, "--out", tmp_path / "s2", "--engine", "torch"],
                     capsys)
    assert "missing from the checkpoint" in line, line
