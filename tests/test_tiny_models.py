"""The tiny checkpoints every other test builds on load and run like real ones."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tiny_models import FAMILIES, TRAINING_SENTENCES, build_tiny_model

TEXTS = [
    "The quick brown fox jumps over the lazy dog, 3 times in 2024.",
    "我喜欢学习自然语言处理。",
]

EXPECTED_SAVED_CLASS = {
    "bert": "BertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
    "deberta-v2": "DebertaV2ForMaskedLM",
    "clip-text": "CLIPModel",
    "t5-encoder": "T5ForConditionalGeneration",
    "gpt2": "GPT2LMHeadModel",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _load_base_model(family, path):
    import transformers

    cls = {
        "clip-text": transformers.CLIPTextModel,
        "t5-encoder": transformers.T5EncoderModel,
    }.get(family, transformers.AutoModel)
    model, info = cls.from_pretrained(path, output_loading_info=True)
    return model.eval(), info


def _num_layers(config):
    for name in ("num_hidden_layers", "num_layers", "n_layer"):
        if hasattr(config, name):
            return getattr(config, name)
    raise AssertionError(f"no layer count in {type(config).__name__}")


def test_training_sentences_are_varied():
    assert 35 <= len(TRAINING_SENTENCES) <= 60
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in s) for s in TRAINING_SENTENCES)
    assert any(any(ch.isdigit() for ch in s) for s in TRAINING_SENTENCES)


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_layout(tiny_model, family):
    from transformers import AutoConfig

    path = tiny_model(family)
    assert (path / "config.json").is_file()
    assert (path / "model.safetensors").is_file()
    assert not (path / "pytorch_model.bin").exists()
    assert (path / "tokenizer.json").is_file()
    assert (path / "tokenizer_config.json").is_file()

    saved = json.loads((path / "config.json").read_text())
    assert saved["architectures"] == [EXPECTED_SAVED_CLASS[family]]
    AutoConfig.from_pretrained(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_loads_offline(tiny_model, family):
    from transformers import AutoConfig, AutoTokenizer

    path = tiny_model(family)
    tok = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    text_config = config.text_config if family == "clip-text" else config

    assert tok.is_fast
    assert tok.padding_side == "right"
    assert tok.pad_token_id is not None
    assert 300 <= len(tok) <= 700
    assert text_config.vocab_size == len(tok)
    if getattr(text_config, "pad_token_id", None) is not None:
        assert text_config.pad_token_id == tok.pad_token_id

    for text in TEXTS:
        ids = tok(text)["input_ids"]
        content = [i for i in ids if i not in tok.all_special_ids]
        assert content, text
        # the trained vocabulary covers the text (bytes at worst), no [UNK] soup
        assert tok.unk_token_id is None or content.count(tok.unk_token_id) <= 1, tok.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_base_model_runs_padded_batch(tiny_model, family):
    from transformers import AutoTokenizer

    path = tiny_model(family)
    tok = AutoTokenizer.from_pretrained(path)
    model, info = _load_base_model(family, path)
    assert info["missing_keys"] == [], info["missing_keys"]
    config = model.config

    batch = tok(TEXTS, padding=True, truncation=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch should contain padding"
    assert (batch["attention_mask"][:, 0] == 1).all(), "padding must be on the right"
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)

    hidden = out.hidden_states
    assert len(hidden) == _num_layers(config) + 1
    mask = batch["attention_mask"].bool()
    for h in hidden:
        assert h.shape == (*batch["input_ids"].shape, 32)
        assert not torch.isnan(h[mask]).any()
        assert torch.isfinite(h[mask]).all()
    # random weights, but not degenerate: tokens differ from one another
    assert hidden[-1][mask].std(dim=0).mean() > 0


def test_clip_projection_head_and_eos_pooling(tiny_model):
    from transformers import AutoConfig, AutoTokenizer, CLIPTextModelWithProjection

    path = tiny_model("clip-text")
    tok = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    # real ids, not the legacy eos_token_id == 2 that triggers argmax pooling
    assert config.text_config.eos_token_id == tok.eos_token_id != 2
    assert config.text_config.bos_token_id == tok.bos_token_id
    assert tok.pad_token == tok.eos_token == "<|endoftext|>"
    assert config.text_config.max_position_embeddings == tok.model_max_length == 77

    model = CLIPTextModelWithProjection.from_pretrained(path).eval()
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch)
    assert out.text_embeds.shape == (2, 32)
    assert torch.isfinite(out.text_embeds).all()


def test_t5_tokenizer_appends_eos_only(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model("t5-encoder"))
    ids = tok("hello world")["input_ids"]
    assert ids[-1] == tok.eos_token_id
    assert tok.pad_token_id == 0
    assert tok.bos_token_id is None


@pytest.mark.parametrize("family", FAMILIES)
def test_build_is_reproducible(tmp_path, family):
    a = build_tiny_model(family, tmp_path / "a", seed=0)
    b = build_tiny_model(family, tmp_path / "b", seed=0)
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_seed_changes_weights(tmp_path):
    a = load_file(build_tiny_model("bert", tmp_path / "a", seed=0) / "model.safetensors")
    c = load_file(build_tiny_model("bert", tmp_path / "c", seed=1) / "model.safetensors")
    assert a.keys() == c.keys()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_unknown_family_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown family"):
        build_tiny_model("llama", tmp_path)
