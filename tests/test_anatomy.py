"""The model's anatomy (model/anatomy.py): found on a loaded model, held to a forward pass, recorded in the
manifest, read back, and derived on load for an export made before it was recorded.

The expected values are read by hand from transformers' own classes and configs (the module paths its
modeling files name, the numbers its config holds) and from a plain Hugging Face forward pass, never from
layerscope's resolver.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from layerscope.errors import ExportError, ManifestError
from layerscope.model.anatomy import Anatomy, check_anatomy, resolve_anatomy
from tiny_zoo import build_zoo_model

# model type: (blocks, attention module in a block, final norm) as transformers' modeling files name them
PATHS = {
    "bert": ("encoder.layer", "attention.self", None),
    "albert": (None, "encoder.albert_layer_groups.0.albert_layers.0.attention", None),  # one block, shared
    "modernbert": ("layers", "attn", "final_norm"),
    "t5": ("encoder.block", "layer.0.SelfAttention", "encoder.final_layer_norm"),
    "clip_text_model": ("text_model.encoder.layers", "self_attn", "text_model.final_layer_norm"),
    "bloom": ("h", "self_attention", "ln_f"),
    "mistral": ("layers", "self_attn", "norm"),
    "qwen3": ("layers", "self_attn", "norm"),
    "olmo2": ("layers", "self_attn", "norm"),
    "granite": ("layers", "self_attn", "norm"),
    "gemma": ("layers", "self_attn", "norm"),
}
# model type: (positions, q/k norm) as the architecture has them
KINDS = {"bert": ("learned", "none"), "albert": ("learned", "none"), "modernbert": ("rotary", "none"),
         "t5": ("relative", "none"), "clip_text_model": ("learned", "none"),
         "bloom": ("alibi", "none"), "mistral": ("rotary", "none"), "qwen3": ("rotary", "per_head"),
         "olmo2": ("rotary", "flat"), "granite": ("rotary", "none"), "gemma": ("rotary", "none")}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """model type -> (family, base model as layerscope loads it, Hugging Face's own reference output)."""
    made: dict[str, tuple] = {}

    def get(model_type: str):
        if model_type not in made:
            import torch

            from layerscope.model.families import family_for
            from layerscope.model.source import load_torch_model, resolve_source

            ckpt = build_zoo_model(model_type, tmp_path_factory.mktemp(f"anatomy-{model_type}"))
            family = family_for(model_type)
            net = load_torch_model(resolve_source(str(ckpt)), family)
            ids = torch.arange(1, 9).unsqueeze(0)
            with torch.no_grad():
                out = net(input_ids=ids, output_hidden_states=True)
            made[model_type] = (family, net, out, ids)
        return made[model_type]

    return get


@pytest.mark.parametrize("model_type", list(PATHS))
def test_every_field_is_what_transformers_says(model_type, zoo):
    """Catches: a block list, attention module or final norm found in the wrong place; heads, key/value heads,
    head size, window or scale read from the wrong attribute; the final norm said to be in layer L or not
    against what Hugging Face's forward returns; the model's own last hidden state misread (ModernBERT's and
    CLIP's are the final norm of layer L)."""
    import torch

    family, net, out, ids = zoo(model_type)
    config = net.config
    num = len(out.hidden_states) - 1
    a = resolve_anatomy(net, family, num)
    blocks, attention, norm = PATHS[model_type]
    assert (a.blocks, a.attention.module, a.final_norm) == (blocks, attention, norm)
    assert a.tower == "text" and a.num_blocks == num == 2 and a.check_max_abs == 0.0 and not a.derived_on_load
    assert net.get_submodule(a.embeddings) is net.get_input_embeddings()
    heads = next(getattr(config, k) for k in ("num_attention_heads", "num_heads", "n_head") if hasattr(config, k))
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or getattr(config, "d_kv", None) or config.hidden_size // heads
    assert (a.attention.heads, a.attention.kv_heads, a.attention.head_dim) == (heads, kv, head_dim)
    assert (a.attention.positions, a.attention.qk_norm) == KINDS[model_type]
    assert a.attention.scale == (config.attention_multiplier if model_type == "granite" else None)
    if model_type == "mistral":
        assert (a.attention.window, a.attention.layer_windows) == (config.sliding_window, None)
    elif model_type == "modernbert":  # global, then local: local_attention keys each side halved, plus itself
        assert a.attention.window is None and a.attention.layer_windows == (None, config.local_attention + 1)
    else:
        assert (a.attention.window, a.attention.layer_windows) == (None, None)
    if a.attention.positions == "rotary":
        assert "Rotary" in type(net.get_submodule(a.attention.rotary)).__name__
    # the final norm, and the model's own last hidden state, from Hugging Face's forward
    last, own = out.hidden_states[-1], out.last_hidden_state
    if norm is None:
        assert not a.final_norm_in_hidden_states and a.last_hidden_state == "layer"
    else:
        with torch.no_grad():
            block_out = net.get_submodule(blocks)[-1]
            # layer L has the norm when it is not the last block's own output
            seen = []
            hook = block_out.register_forward_hook(lambda _m, _a, o: seen.append(o[0] if isinstance(o, tuple) else o))
            net(input_ids=ids)
            hook.remove()
        has_norm = not torch.equal(seen[0], last)
        assert a.final_norm_in_hidden_states == has_norm
        assert a.last_hidden_state == ("layer" if torch.equal(own, last) else "final_norm")
    assert a.last_hidden_state == {"modernbert": "final_norm", "clip_text_model": "final_norm"}.get(model_type, "layer")
    # layer 0 as a multiple of the embedding rows: Gemma sqrt(hidden), Granite its multiplier, Qwen and T5 1 (no
    # position embeddings, no norm), else none
    want = {"gemma": lambda: math.sqrt(config.hidden_size), "granite": lambda: config.embedding_multiplier,
            "qwen3": lambda: 1.0, "mistral": lambda: 1.0, "olmo2": lambda: 1.0, "t5": lambda: 1.0}.get(
                model_type, lambda: None)()
    assert a.embedding_scale == (pytest.approx(want, rel=1e-6) if want is not None else None)
    assert Anatomy.from_dict(json.loads(json.dumps(a.to_dict()))) == a


def test_the_forward_check_refuses_a_wrong_path(zoo):
    """Catches: a check that accepts any path (T5's first block keeps a list of two layers too: right length,
    wrong modules), a final norm that is not the one the model applies, or a recorded fact the forward pass
    contradicts."""
    family, net, out, _ = zoo("t5")
    a = resolve_anatomy(net, family, 2)
    assert check_anatomy(net, a) == 0.0
    with pytest.raises(ExportError, match=r"blocks \(encoder.block.0.layer\)"):
        check_anatomy(net, replace(a, blocks="encoder.block.0.layer"))
    with pytest.raises(ExportError, match="final norm"):
        check_anatomy(net, replace(a, final_norm="encoder.block.0.layer.1.layer_norm"))
    with pytest.raises(ExportError, match="not a module"):
        check_anatomy(net, replace(a, final_norm="encoder.final_norm"))
    family, net, out, _ = zoo("modernbert")
    a = resolve_anatomy(net, family, 2)
    with pytest.raises(ExportError, match="last_hidden_state"):
        check_anatomy(net, replace(a, last_hidden_state="layer"))
    with pytest.raises(ExportError, match="final norm"):  # the embeddings' own norm: not the final one
        check_anatomy(net, replace(a, final_norm="embeddings.norm"))


def test_a_recorded_anatomy_with_a_bad_field_is_one_line():
    """Catches: a manifest's anatomy read without checking its fields (a path a reader would resolve anywhere,
    a count of the wrong type, a value outside its choices)."""
    good = {"tower": "text", "embeddings": "embed_tokens", "embedding_scale": None, "blocks": "layers",
            "num_blocks": 2, "attention": None, "final_norm": "norm", "final_norm_in_hidden_states": True,
            "last_hidden_state": "layer", "head": ["lm_head"], "head_reads": "layer", "check_max_abs": 0.0}
    assert Anatomy.from_dict(good).head == ("lm_head",)
    for key, value, named in (("blocks", "../layers", "blocks"), ("num_blocks", "2", "num_blocks"),
                              ("last_hidden_state", "normed", "last_hidden_state"), ("head", "lm_head", "head"),
                              ("final_norm_in_hidden_states", 1, "final_norm_in_hidden_states")):
        with pytest.raises(ManifestError, match=named) as err:
            Anatomy.from_dict({**good, key: value})
        assert "\n" not in str(err.value)


def test_an_export_records_its_anatomy_and_an_older_one_derives_it_on_load(tiny_export):
    """Catches: an export that writes no anatomy (or an unchecked one), and an export made before the anatomy
    existed that no longer opens, or opens with another anatomy than a new export records (its structure
    derived from its own files; what only a forward pass measures taken from what it recorded)."""
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest import read_manifest

    export = tiny_export("qwen3")
    new = read_manifest(export)
    assert new.format_version == 2 and new.anatomy is not None and not new.anatomy.derived_on_load
    assert new.anatomy.check_max_abs == 0.0 and new.final_norm_in_last_layer is True
    assert new.raw["last_layer_note"].startswith("layer 2 is the last block's output after the final norm (norm)")
    path = export / "manifest.json"
    old = json.loads(path.read_text())
    del old["anatomy"]
    old["format_version"] = 1
    path.write_text(json.dumps(old))
    handle = ModelHandle.resolve(export)  # verified and opened as before
    derived = handle.manifest.anatomy
    assert derived.derived_on_load and "derived when its export was opened" in derived.note
    assert math.isnan(derived.check_max_abs) and derived.embedding_scale is None
    same = ("blocks", "num_blocks", "attention", "final_norm", "final_norm_in_hidden_states", "last_hidden_state",
            "embeddings", "base_prefix", "head", "head_reads", "tower")
    assert {k: getattr(derived, k) for k in same} == {k: getattr(new.anatomy, k) for k in same}
    assert handle.manifest.anatomy is derived  # once per manifest read


def test_one_export_reads_the_config_once_and_derives_the_family_once(tiny_model, tmp_path, monkeypatch):
    """Catches: an export step that reads config.json or derives the family again instead of being handed what
    the export resolved (one export read the config 8 times and derived the family 5 times). The one other
    read is Optimum's own, inside its exporter."""
    import transformers

    import layerscope.model.families as families
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    counts = {"config": 0, "family": 0}
    read, derive = transformers.AutoConfig.from_pretrained, families.derive_family

    def counted_read(*args, **kwargs):
        counts["config"] += 1
        return read(*args, **kwargs)

    def counted_derive(*args, **kwargs):
        counts["family"] += 1
        return derive(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", counted_read)
    monkeypatch.setattr(families, "derive_family", counted_derive)
    export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "onnx")
    assert counts == {"config": 2, "family": 1}


def test_a_cached_export_made_before_the_anatomy_is_made_again(tiny_model, tmp_path, monkeypatch):
    """Catches: layerscope's own export cache serving an entry whose anatomy was never checked by a forward pass
    (a user's own older export opens with a derived one; a cached entry is layerscope's to make again)."""
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    first = ensure_export(ModelHandle.resolve(str(tiny_model("bert"))))
    path = first.export_dir / "manifest.json"
    old = json.loads(path.read_text())
    del old["anatomy"]
    old["format_version"] = 1
    path.write_text(json.dumps(old))
    again = ensure_export(ModelHandle.resolve(str(tiny_model("bert"))))
    assert again.export_dir == first.export_dir
    assert again.manifest.format_version == 2 and not again.manifest.anatomy.derived_on_load
