"""Damaged model directories are one clear error line (exit 2), not an internal error with a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from layerscope.cli import main


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _one_error_line(args, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error:") or "Error" in line
             or "Traceback" in line]
    assert exc.value.code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


def _copy(tiny_model, tmp_path, name) -> Path:
    return Path(shutil.copytree(tiny_model("bert"), tmp_path / name))


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.parametrize("command", ["export", "torch"])
def test_damaged_safetensors(tiny_model, tmp_path, capsys, damage, command):
    model = _copy(tiny_model, tmp_path, "m")
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x07not safetensors" * 64)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat\na dog\n")
    args = (["export", str(model), "--out", str(tmp_path / "exp")] if command == "export" else
            ["extract", "--model", str(model), "--engine", "torch", "--input", str(corpus), "--out", str(tmp_path / "s")])
    line = _one_error_line(args, capsys)
    assert "model.safetensors" in line and "damaged or truncated" in line and "again" in line


@pytest.mark.parametrize("command", ["export", "torch"])
def test_model_dir_without_tokenizer(tiny_model, tmp_path, capsys, command):
    model = _copy(tiny_model, tmp_path, "m")
    for f in model.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat\n")
    args = (["export", str(model), "--out", str(tmp_path / "exp")] if command == "export" else
            ["extract", "--model", str(model), "--engine", "torch", "--input", str(corpus), "--out", str(tmp_path / "s")])
    line = _one_error_line(args, capsys)
    assert "no tokenizer files" in line and "save_pretrained" in line
