"""--trust-remote-code reaches every loader (no interactive prompt ever), and ignored custom code is said once."""

from __future__ import annotations

import builtins
import json
import logging
import shutil
from pathlib import Path

import pytest

from layerscope.cli import main

CUSTOM_TOKENIZER = '''from transformers import BertTokenizerFast


class CustomTokenizerFast(BertTokenizerFast):
    """A test tokenizer 'shipped with the model': plain BERT under another class name."""
'''


@pytest.fixture(autouse=True)
def _no_prompt(tmp_path, monkeypatch):
    """Any interactive [y/N] question fails the test (and is recorded), as with a closed stdin."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))  # copies of custom code land here
    asked = []

    def no_input(prompt=""):
        asked.append(prompt)
        raise EOFError("stdin is closed")

    monkeypatch.setattr(builtins, "input", no_input)
    yield asked
    assert not asked, f"an interactive prompt appeared: {asked[0][:200]}"


def _custom_tokenizer_model(tiny_model, tmp_path) -> Path:
    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / "custom-tok"))
    (model / "tokenization_custom.py").write_text(CUSTOM_TOKENIZER)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "CustomTokenizerFast"
    cfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizerFast"]}
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    return model


def test_the_flag_reaches_export_validation_and_the_export_tokenizer(tiny_model, tmp_path):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source
    from layerscope.model.handle import ModelHandle

    model = _custom_tokenizer_model(tiny_model, tmp_path)
    out = tmp_path / "exp"
    manifest = export_model(resolve_source(str(model)), out, trust_remote_code=True)  # validation re-loads the saved tokenizer
    assert manifest.parity.outputs
    tok = ModelHandle.resolve(out, trust_remote_code=True).tokenizer()
    assert type(tok).__name__ == "CustomTokenizerFast"


def test_without_the_flag_custom_tokenizer_code_is_one_line(tiny_model, tmp_path, capsys):
    model = _custom_tokenizer_model(tiny_model, tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["export", str(model), "--out", str(tmp_path / "exp")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1
    assert "tokenization_custom.CustomTokenizerFast" in err[0] and "--trust-remote-code" in err[0]
    assert not (tmp_path / "exp").exists()


def test_extract_and_run_take_the_flag(tiny_model, tmp_path, capsys):
    model = _custom_tokenizer_model(tiny_model, tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat sat\nthe dog ran\n")
    main(["extract", "--model", str(model), "--engine", "torch", "--input", str(corpus), "--out",
          str(tmp_path / "store"), "--layers", "-1", "--trust-remote-code"])
    assert json.loads((tmp_path / "store" / "store.json").read_text())["complete"]
    main(["run", "compositionality", "--model", str(model), "--engine", "torch", "--layers", "-1",
          "--out", str(tmp_path / "res"), "--no-cache", "--trust-remote-code"])
    assert (tmp_path / "res" / "results.json").exists()


def test_config_auto_map_without_the_flag_warns_once(tiny_model, tmp_path, caplog):
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    model = Path(shutil.copytree(tiny_model("bert"), tmp_path / "custom-model"))
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_custom.CustomConfig", "AutoModel": "modeling_custom.CustomModel"}
    (model / "config.json").write_text(json.dumps(cfg))  # the code files are absent: they must not be needed
    with caplog.at_level(logging.WARNING, logger="layerscope"):
        handle = ModelHandle.resolve(model)
        exported = ensure_export(handle)  # describe, config, weights, tokenizer, validation: all loaders
    warnings = [r.getMessage() for r in caplog.records if "own code" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "AutoModel" in warnings[0] and "ignored" in warnings[0] and "--trust-remote-code" in warnings[0]
    assert exported.manifest.family == "bert"


def test_extract_takes_trust_remote_code_as_an_argument(tiny_model, tmp_path):
    from layerscope.errors import LayerscopeError
    from layerscope.runtime.pipeline import extract

    model = _custom_tokenizer_model(tiny_model, tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a cat sat\nthe dog ran\n")
    with pytest.raises(LayerscopeError, match="--trust-remote-code"):
        extract(str(model), str(corpus), tmp_path / "refused", engine="torch", layers="-1")
    assert not (tmp_path / "refused").exists()  # refused before anything was written
    report = extract(str(model), str(corpus), tmp_path / "store", engine="torch", layers="-1",
                     trust_remote_code=True)
    assert report.n == 2 and report.store.complete
