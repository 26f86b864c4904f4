"""A decoder reads up to its positions, not up to what a borrowed tokenizer says.

A tiny random Llama with 8,192 positions whose tokenizer's ``model_max_length`` says 512 (a tokenizer borrowed from
a smaller sibling): its limit is 8,192 (and what the memory check allows); the tokenizer's smaller limit is said as
such at export and can be chosen at export and at extract. A text of 1,500 tokens is read whole, its last token's
state equal to transformers' own forward of the whole text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_zoo import build_zoo_model  # noqa: E402

POSITIONS, TOKENIZER_SAYS = 8192, 512


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    where = build_zoo_model("llama", tmp_path_factory.mktemp("llama-8k") / "model")
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, "max_position_embeddings": POSITIONS}))
    tok = json.loads((where / "tokenizer_config.json").read_text())
    (where / "tokenizer_config.json").write_text(json.dumps({**tok, "model_max_length": TOKENIZER_SAYS}))
    return where


@pytest.fixture(scope="module")
def llama_export(llama, tmp_path_factory):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    said: list[str] = []
    out = tmp_path_factory.mktemp("llama-8k-export") / "e"
    export_model(resolve_source(str(llama)), out, progress=said.append)
    return out, said


def _long_text(llama: Path, tokens: int) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(llama))
    words = "the quick brown fox jumps over the lazy dog and keeps running "
    text = words * (tokens // 8)
    ids = tok(text)["input_ids"]
    assert len(ids) > tokens > TOKENIZER_SAYS, len(ids)
    return tok.decode(ids[1:tokens], skip_special_tokens=True)  # BOS added again by the tokenizer


def test_the_limit_is_the_positions_and_the_tokenizer_limit_is_said(llama, llama_export):
    from layerscope.model.handle import ModelHandle

    described = ModelHandle.resolve(str(llama)).manifest
    assert (described.positions, described.max_length, described.tokenizer_max_length) == (POSITIONS, POSITIONS,
                                                                                           TOKENIZER_SAYS)
    out, said = llama_export
    manifest = ModelHandle.resolve(str(out)).manifest
    assert (manifest.length_limit, manifest.max_length) == (POSITIONS, POSITIONS)
    assert any(f"model_max_length is {TOKENIZER_SAYS}, below the model's 8,192 positions" in line
               and "--max-length 512 keeps the tokenizer's" in line for line in said), said


def test_a_long_text_is_read_whole_and_equals_transformers(llama, llama_export, tmp_path):
    """Catches: a 1,500-token text cut to the tokenizer's 512 (and called the model's position limit)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from layerscope.extraction.pipeline import extract

    out, _ = llama_export
    text = _long_text(llama, 1500)
    store = extract(str(out), [text, "a short one"], tmp_path / "s", engine="ort", layers="-1",
                    poolings=["last"]).store
    assert store.meta.get("truncated_texts", 0) == 0
    tok = AutoTokenizer.from_pretrained(str(llama))
    ids = tok(text, return_tensors="pt")
    assert ids["input_ids"].shape[1] > 1000
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(str(llama)).eval()(**ids, output_hidden_states=True)
    np.testing.assert_allclose(store["last", -1][0], hf.hidden_states[-1][0, -1].numpy(), rtol=1e-4, atol=1e-4)


def test_max_length_chooses_up_to_the_positions_at_extract_and_at_export(llama, llama_export, tmp_path):
    from layerscope.errors import InputError
    from layerscope.export.exporter import export_model
    from layerscope.extraction.pipeline import extract
    from layerscope.model.source import resolve_source

    out, _ = llama_export
    text = _long_text(llama, 700)
    store = extract(str(out), [text], tmp_path / "600", engine="ort", layers="-1", poolings=["last"],
                    max_length=600).store
    assert store.meta["truncated_texts"] == 1  # 600 > the tokenizer's 512: allowed, and it cut the 700
    with pytest.raises(InputError, match="above what .* can read \\(8192 tokens, its position limit\\)"):
        extract(str(out), [text], tmp_path / "9000", engine="ort", max_length=9000)
    with pytest.raises(InputError, match="above what .* can read"):
        export_model(resolve_source(str(llama)), tmp_path / "too-long", max_length=POSITIONS + 1)
    assert not (tmp_path / "too-long").exists()
    # the tokenizer's own limit, chosen at export: the default of every run of that export
    kept = export_model(resolve_source(str(llama)), tmp_path / "512", max_length=TOKENIZER_SAYS)
    assert (kept.max_length, kept.length_limit) == (TOKENIZER_SAYS, POSITIONS)
    store = extract(str(tmp_path / "512"), [text], tmp_path / "s512", engine="ort", layers="-1",
                    poolings=["last"]).store
    assert store.meta["truncated_texts"] == 1 and store.spec.max_length == TOKENIZER_SAYS
