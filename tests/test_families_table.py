"""The families table (model/families.py) holds every per-family fact; these tests hold it to the libraries.

The manifest's ``inputs`` now come from the table (no optimum import when a plain model is resolved),
while the exporter traces with Optimum's ``OnnxConfig``: the two must name the same inputs in the same
order, or the engines would feed a graph inputs it does not have.
"""

from __future__ import annotations

import pytest

from layerscope.model.families import FAMILIES

from tiny_zoo import MODEL_TYPES as ZOO_TYPES

MODEL_TYPES = sorted({(FAMILIES[name].name, mt) for name in FAMILIES for mt in FAMILIES[name].model_types}
                     | {(FAMILIES[mt].name, mt) for mt in ZOO_TYPES})
# inputs the family adds to what Optimum's own config declares: the padding mask pooling needs (CLIP's
# config has none) and decoders' explicit positions (Gemma's configs leave them to the model's arange)
ADDED = {"clip": ["attention_mask"], "clip_text_model": ["attention_mask"], "gemma": ["position_ids"],
         "gemma2": ["position_ids"], "gemma3_text": ["position_ids"]}


def _config(model_type: str, **overrides):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **overrides)


@pytest.mark.parametrize("family,model_type", MODEL_TYPES)
def test_family_inputs_equal_optimums_own_onnx_config(family, model_type):
    """Catches: a family's inputs (the table's or the derived rule's) that differ from what Optimum's own
    config for the architecture declares, beyond the inputs ``ADDED`` names (a decoder without
    ``position_ids``, RoBERTa given ``token_type_ids``, BLOOM given positions it has no input for); and the
    extended config traces the family's inputs in the family's order."""
    from layerscope.export.onnx_config import make_onnx_config, optimum_config_class

    fam = FAMILIES[family]
    config = _config(model_type)
    text = fam.text_model_config(config)
    base = optimum_config_class(fam, text.model_type)
    if fam.name == "t5-encoder" or base is None:
        pytest.skip(f"{model_type}: no Optimum config of its own (T5 encoder-only, or the torch.onnx path)")
    kwargs = {"use_past": False, "use_past_in_inputs": False} if fam.kind == "decoder" else {}
    own = list(base(text, task="feature-extraction", **kwargs).inputs)
    assert fam.input_names(text) == own + ADDED.get(model_type, [])
    assert list(make_onnx_config(config, fam, 2).inputs) == fam.input_names(text)


@pytest.mark.parametrize("type_vocab_size,expected", [(0, ["input_ids", "attention_mask"]),
                                                      (2, ["input_ids", "attention_mask", "token_type_ids"])])
def test_deberta_takes_token_type_ids_only_when_its_config_has_types(type_vocab_size, expected):
    """Catches: dropping ``type_ids_from_config`` (DeBERTa-v2 checkpoints differ on type_vocab_size)."""
    from layerscope.export.onnx_config import make_onnx_config

    fam = FAMILIES["deberta-v2"]
    config = _config("deberta-v2", type_vocab_size=type_vocab_size)
    assert fam.input_names(config) == expected == list(make_onnx_config(config, fam, 2).inputs)


@pytest.mark.parametrize("family", [f for f in FAMILIES.values() if f.lm_head_loader and f.lm_head])
def test_lm_head_and_final_norm_paths_exist_on_the_with_head_model(family):
    """Catches: a head or final-norm path in the table that the transformers class does not have
    (the lens would fail, or silently fall back to tied embeddings)."""
    import torch
    import transformers

    from layerscope.model.families import get_submodule

    model_type = family.model_types[0]
    small = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 vocab_size=64, max_position_embeddings=32)
    if model_type == "gpt2":
        small = dict(n_embd=16, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    if model_type.startswith("qwen"):
        small.update(num_key_value_heads=2, head_dim=8)
    config = _config(model_type, **small)
    torch.manual_seed(0)
    net = getattr(transformers, family.lm_head_loader).from_config(config)
    legacy = getattr(net.config, "legacy", True)
    head = family.lm_head_new if family.lm_head_new and not legacy else family.lm_head
    for path in head or ():
        assert isinstance(get_submodule(net, path), torch.nn.Module)
    if family.final_norm:
        assert isinstance(get_submodule(net, family.final_norm), torch.nn.Module)
    assert isinstance(net.get_input_embeddings(), torch.nn.Embedding)


@pytest.mark.parametrize("model_type, pad", [("roberta", 3), ("xlm-roberta", 1), ("camembert", 5), ("mpnet", 1)])
def test_the_room_for_positions_numbered_after_the_pad_id_is_the_longest_input_transformers_takes(model_type, pad):
    """RoBERTa-style models number their positions from the pad id + 1, so a table of 40 positions holds
    40 - pad - 1 tokens; the longest input is found here by running transformers' own model at each length.
    Catches: the room off by one either way, the pad id read as 0."""
    import torch
    import transformers

    from layerscope.model.families import family_for, model_dims

    config = transformers.AutoConfig.for_model(model_type, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                               intermediate_size=8, vocab_size=32, max_position_embeddings=40,
                                               pad_token_id=pad)
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config).eval()

    def takes(length: int) -> bool:
        ids = torch.full((1, length), 10)  # no pad id: every token gets its own position
        try:
            with torch.no_grad():
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
        except (IndexError, RuntimeError):  # a position past the table
            return False
        return True

    longest = max(n for n in range(30, 41) if takes(n))
    assert not takes(longest + 1) and 30 < longest < 40
    assert model_dims(config, family_for(model_type))[2] == longest
