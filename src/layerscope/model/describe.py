"""What we know about a model before (or without) exporting it: the manifest's model half.

Read from the checkpoint's config and the families table alone (no optimum, no torch): the
exporter's Optimum config (export/onnx_config.py) declares the same inputs, which
tests/test_families_table.py holds equal for every family.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import layerscope
from layerscope.errors import InputError
from layerscope.model.families import check_config, check_family, is_code_family, layer_facts, model_dims
from layerscope.model.source import ModelSource, load_config, resolve_source, weights_hash
from layerscope.vocab.layers import layer_names


def max_length_for(source: ModelSource, tokenizer_max: int | None, positions: int,
                   kind: str = "encoder") -> tuple[int, str]:
    """The longest input read by default (``--max-length`` reads up to ``positions``, the model's own limit): the
    sentence-transformers setting where the model has one; an encoder's tokenizer's ``model_max_length`` where it
    is lower (the length it was trained at); else the positions. A decoder's tokenizer limit is not the model's
    (a tokenizer borrowed from a smaller sibling says 512 for an 8,192-position model): it reads its positions."""
    st_cfg = Path(source.path_or_id) / "sentence_bert_config.json" if source.is_local else None
    if st_cfg is not None and st_cfg.exists():
        try:
            value = int(json.loads(st_cfg.read_text())["max_seq_length"])
            return min(value, positions), "sentence_bert_config.json max_seq_length"
        except (KeyError, ValueError, TypeError):
            pass
    if kind == "encoder" and tokenizer_max and tokenizer_max < 1_000_000:
        return min(int(tokenizer_max), positions), "tokenizer model_max_length"
    return positions, "position embeddings"


def tokenizer_limit_below(tokenizer_max, positions: int) -> int | None:
    """The tokenizer's ``model_max_length`` where it is a real number below the model's positions, else None."""
    if isinstance(tokenizer_max, (int, float)) and 0 < tokenizer_max < min(positions, 1_000_000):
        return int(tokenizer_max)
    return None


def length_line(manifest) -> str | None:
    """What an export says about its length when the tokenizer's limit is not the model's: that a decoder reads
    its positions regardless, or where an encoder's default comes from and how to read more."""
    tok = manifest.tokenizer_max_length
    if tok is None or manifest.positions is None:
        return None
    if manifest.max_length is not None and manifest.max_length > tok:
        return (f"the tokenizer's model_max_length is {tok:,}, below the model's {manifest.positions:,} positions: "
                f"texts are read up to {manifest.max_length:,} tokens (--max-length {tok} keeps the tokenizer's)")
    note = manifest.default_length_note()
    return f"texts are cut at {note}" if note else None


def check_vocab_fits(spec: str, tokenizer, text_config) -> None:
    """One line when the tokenizer can give ids beyond the rows of the model's embedding matrix (a tokenizer
    that does not belong to these weights): every text with such a token would fail inside the engine."""
    rows = getattr(text_config, "vocab_size", None)
    try:
        size = len(tokenizer)
    except TypeError:
        return
    if isinstance(rows, int) and rows > 0 and size > rows:
        raise InputError(f"{spec}: its tokenizer has {size:,} tokens but the model's embedding matrix has "
                         f"{rows:,} rows (vocab_size in config.json), so ids {rows:,} and above have no vector; "
                         "the tokenizer does not belong to these weights: use the model's own tokenizer")


def describe_model(spec: str, *, trust_remote_code: bool = False, revision: str | None = None,
                   with_hash: bool = True, tower: str | None = None) -> dict[str, Any]:
    """What the model ``spec`` names is, before any export (the manifest's model half)."""
    return describe_source(resolve_source(spec, revision), trust_remote_code=trust_remote_code, with_hash=with_hash,
                           tower=tower)


def describe_source(source: ModelSource, *, trust_remote_code: bool = False, with_hash: bool = True,
                    config=None, family=None, tower: str | None = None) -> dict[str, Any]:
    """What the resolved model ``source`` is, before any export (the manifest's model half); ``config`` and
    ``family``: as the caller already read and derived them (an export does once); ``tower="vision"``: a two-tower
    checkpoint's image tower (one line where it has none)."""
    if tower is not None:
        from layerscope.model.vision import describe_vision

        vision = describe_vision(source, tower=tower, trust_remote_code=trust_remote_code, with_hash=with_hash)
        if vision is not None:
            return vision
    config = config if config is not None else load_config(source, trust_remote_code=trust_remote_code)
    # a type only the model's own code defines: its derived family with --trust-remote-code, one line without
    family = family if family is not None else \
        check_family(config.model_type, getattr(config, "auto_map", None), trust_remote_code)
    if family.modality == "image":  # a vision tower: no tokenizer (model/vision.py)
        from layerscope.model.vision import describe_vision

        return describe_vision(source, trust_remote_code=trust_remote_code, with_hash=with_hash, config=config,
                               family=family)
    check_config(config, family)
    num_layers, hidden, positions = model_dims(config, family)
    from layerscope.model.source import load_tokenizer

    tok = load_tokenizer(source, trust_remote_code=trust_remote_code)
    tokenizer_max = getattr(tok, "model_max_length", None)
    max_length, max_from = max_length_for(source, tokenizer_max, positions, family.kind)
    text_cfg = family.text_model_config(config)
    check_vocab_fits(source.spec, tok, text_cfg)
    src = source.to_dict()
    src["weights_sha256"] = weights_hash(source) if with_hash else None
    if with_hash and source.is_local:  # config and tokenizer files too: they change the vectors as well
        from layerscope.model.identity import local_identity

        src["files_sha256"] = local_identity(Path(source.path_or_id))["files_sha256"]
    src["model_type"] = config.model_type
    from layerscope.model.own_code import own_code
    from layerscope.model.source import _tokenizer_auto_map

    # what an export of it ran: loading it again needs the flag (model/own_code.py)
    src["own_code"] = own_code(getattr(config, "auto_map", None), _tokenizer_auto_map(source), trust_remote_code)
    return {
        "format_version": None,
        "layerscope_version": layerscope.__version__,
        "source": src,
        "family": family.name,
        "family_from_code": is_code_family(family),
        "kind": family.kind,
        "num_layers": num_layers,
        "hidden_size": hidden,
        "max_length": max_length,
        "max_length_from": max_from,
        "positions": positions,  # the model's own limit: --max-length reads up to it
        "tokenizer_max_length": tokenizer_limit_below(tokenizer_max, positions),
        "inputs": family.input_names(text_cfg),
        "layers": layer_names(num_layers),
        **layer_facts(config, family, num_layers),  # final_norm_in_last_layer, embedding_note, last_layer_note
        "default_pooling": family.default_pooling,
        "eos_token_id": getattr(text_cfg, "eos_token_id", None),
        "pooled_output": family.pooled_output,
        "embedding_size": _embedding_size(text_cfg, hidden),
        "vocab_size": int(getattr(text_cfg, "vocab_size")),
        "sentence_transformers": _st_config(source),
    }


def _embedding_size(config, hidden: int) -> int:
    """The width of the word-embedding rows (ALBERT and ELECTRA keep them narrower than the hidden states, OPT
    where its word_embed_proj_dim differs)."""
    value = getattr(config, "embedding_size", None) or getattr(config, "word_embed_proj_dim", None)
    return int(value) if isinstance(value, int) and value > 0 else hidden


def _st_config(source: ModelSource) -> dict[str, Any] | None:
    """The sentence-transformers recipe of a local checkpoint, or of a hub one already reachable."""
    from layerscope.model.stconfig import read_st_config

    if source.is_local:
        return read_st_config(source.path_or_id)
    try:
        from huggingface_hub import snapshot_download

        root = snapshot_download(source.path_or_id, revision=source.revision,
                                 allow_patterns=["modules.json", "config_sentence_transformers.json",
                                                 "*_Pooling/config.json"])
    except Exception:  # offline, gated or no such files: the model is then read as a plain one
        return None
    return read_st_config(root)


__all__ = ["describe_model", "describe_source"]
