"""A --max-length that cannot keep a token of text (below the tokenizer's special tokens plus one) is refused
in one line before any work; every length that is accepted really truncates."""

from __future__ import annotations

import numpy as np
import pytest

from cli_helpers import run_cli as cli
from layerscope.errors import InputError
from layerscope.extraction.pipeline import embed, extract

LONG = "the cat sat on the mat near a river"


@pytest.mark.parametrize("value", ["1", "2"])
def test_extract_refuses_a_length_below_the_special_tokens(value, bert_export, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text(LONG + "\n", encoding="utf-8")
    out = tmp_path / "never"
    code, text = cli(["extract", "--model", bert_export, "--engine", "ort", "--input", corpus, "--out", out,
                      "--max-length", value], capsys)
    flat = " ".join(text.split())
    assert code == 2, text
    assert (f"--max-length {value} leaves no room for text: this model's tokenizer adds 2 tokens "
            "(its special tokens) to every text; use at least 3") in flat, text
    assert "Traceback" not in text and not out.exists()


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_embed_refuses_it_for_every_engine(engine, bert_export, tiny_model):
    model = bert_export if engine == "ort" else tiny_model("bert")
    with pytest.raises(InputError, match="use at least 3"):
        embed(model, [LONG], engine=engine, max_length=1)


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_the_smallest_accepted_length_truncates_for_real(engine, bert_export, tiny_model, tmp_path):
    model = bert_export if engine == "ort" else tiny_model("bert")
    short = extract(model, [LONG], tmp_path / "short", engine=engine, max_length=3, poolings=["mean"]).store
    full = extract(model, [LONG], tmp_path / "full", engine=engine, poolings=["mean"]).store
    # [CLS] the [SEP]: exactly the vectors of the first word alone, and not those of the whole text
    first = extract(model, ["the"], tmp_path / "first", engine=engine, poolings=["mean"]).store
    for layer in ("0", "2"):
        np.testing.assert_allclose(short["mean", layer], first["mean", layer], rtol=0, atol=1e-5)
        assert np.abs(short["mean", layer] - full["mean", layer]).max() > 1e-2


def test_a_tokenizer_without_special_tokens_keeps_one_token(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    model = tiny_model("gpt2")
    first_token = AutoTokenizer.from_pretrained(model).decode(AutoTokenizer.from_pretrained(model)(LONG)["input_ids"][:1])
    one = embed(model, [LONG], engine="torch", max_length=1, poolings=["mean"], layers="2")
    alone = embed(model, [first_token], engine="torch", poolings=["mean"], layers="2")
    full = embed(model, [LONG], engine="torch", poolings=["mean"], layers="2")
    assert np.abs(one["mean", "2"] - full["mean", "2"]).max() > 1e-2
    np.testing.assert_allclose(one["mean", "2"], alone["mean", "2"], rtol=0, atol=1e-5)
