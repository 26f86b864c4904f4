"""Model families: one table that says how each architecture is loaded, exported and read.

Everything that differs between BERT, GPT-2, CLIP and friends lives in the
``FAMILIES`` table below, not in if-chains spread over the code: the graph's
inputs, where the word embeddings, the LM head and the final norm live, the
default pooling, the optimizer's model type.  Loading a model is model/source.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from layerscope.errors import InputError

Kind = Literal["encoder", "decoder"]


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
    # The graph's inputs, in the order Optimum's OnnxConfig for the family declares them (plus the
    # attention mask pooling needs); "token_type_ids" is dropped where the config says
    # type_vocab_size == 0 and ``type_ids_from_config`` is set (DeBERTa).
    inputs: tuple[str, ...] = ("input_ids", "attention_mask")
    type_ids_from_config: bool = False
    text_config: str | None = None  # attribute holding the text model's config (CLIP: text_config)
    optimizer_model_type: str = "bert"  # onnxruntime.transformers optimizer model_type for the ``opt`` variant
    # Where the LM head pieces live on the with-head model (lens, decoded saliency): the head module,
    # its newer name where transformers renamed it (DeBERTa-v2 without ``legacy``), the final norm.
    lm_head: str | None = None
    lm_head_new: str | None = None
    final_norm: str | None = None
    # hidden_states[0] is the word embeddings themselves (no position embeddings, no norm added), so the
    # ``raw`` output and layer 0 are equal by construction
    raw_is_layer0: bool = False

    def input_names(self, config) -> list[str]:
        """The model inputs the export takes, for this checkpoint's config."""
        names = list(self.inputs)
        if self.type_ids_from_config and getattr(config, "type_vocab_size", 1) == 0:
            names.remove("token_type_ids")
        return names

    def text_model_config(self, config):
        """The config of the text model (CLIP keeps it under ``text_config``), else the config itself."""
        return getattr(config, self.text_config, None) or config if self.text_config else config


BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DECODER_INPUTS = ("input_ids", "attention_mask", "position_ids")

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("bert", ("bert",), "encoder", "BertOnnxConfig", "AutoModel",
               "embeddings.word_embeddings", "mean", lm_head_loader="AutoModelForMaskedLM",
               inputs=BERT_INPUTS, lm_head="cls"),
        Family("roberta", ("roberta", "xlm-roberta"), "encoder", "RobertaOnnxConfig", "AutoModel",
               "embeddings.word_embeddings", "mean", lm_head_loader="AutoModelForMaskedLM", lm_head="lm_head"),
        Family("deberta-v2", ("deberta-v2",), "encoder", "DebertaV2OnnxConfig", "AutoModel",
               "embeddings.word_embeddings", "mean", lm_head_loader="AutoModelForMaskedLM",
               export_dtype_notes="plain fp16 overflows in attention; keep softmax/LayerNorm in fp32",
               inputs=BERT_INPUTS, type_ids_from_config=True, lm_head="cls", lm_head_new="lm_predictions"),
        Family("clip-text", ("clip", "clip_text_model"), "encoder", "CLIPTextOnnxConfig",
               "CLIPTextModel", "text_model.embeddings.token_embedding", "eos",
               final_norm_in_last_hidden_state=False, pooled_output="pooler_output",
               text_config="text_config", optimizer_model_type="clip"),
        Family("t5-encoder", ("t5", "mt5", "umt5"), "encoder", "T5OnnxConfig", "T5EncoderModel",
               "shared", "mean", final_norm_in_last_hidden_state=True,
               export_dtype_notes="T5 activations overflow in fp16; keep fp32 or bf16", optimizer_model_type="t5"),
        Family("gpt2", ("gpt2",), "decoder", "GPT2OnnxConfig", "AutoModel", "wte", "last",
               final_norm_in_last_hidden_state=True, position_ids_input=True,
               lm_head_loader="AutoModelForCausalLM", inputs=DECODER_INPUTS, optimizer_model_type="gpt2",
               lm_head="lm_head", final_norm="transformer.ln_f"),
        Family("qwen2", ("qwen2",), "decoder", "Qwen2OnnxConfig", "AutoModel", "embed_tokens",
               "last", final_norm_in_last_hidden_state=True, position_ids_input=True,
               lm_head_loader="AutoModelForCausalLM", inputs=DECODER_INPUTS, lm_head="lm_head",
               final_norm="model.norm", raw_is_layer0=True),
        Family("qwen3", ("qwen3",), "decoder", "Qwen3OnnxConfig", "AutoModel", "embed_tokens",
               "last", final_norm_in_last_hidden_state=True, position_ids_input=True,
               lm_head_loader="AutoModelForCausalLM", inputs=DECODER_INPUTS, lm_head="lm_head",
               final_norm="model.norm", raw_is_layer0=True),
    )
}

def family_for(model_type: str) -> Family:
    for fam in FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    supported = ", ".join(sorted(t for f in FAMILIES.values() for t in f.model_types))
    raise InputError(
        f"model type '{model_type}' is not supported yet; supported model types: {supported}"
    )


def get_submodule(model, dotted: str):
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def model_dims(config, family: Family) -> tuple[int, int, int]:
    """(num_layers, hidden_size, max_length) of the text model."""
    cfg = family.text_model_config(config)
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "num_layers", None) or getattr(cfg, "n_layer")
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None) or getattr(cfg, "n_embd")
    max_len = (getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 512)
    if family.name == "roberta":
        max_len -= 2  # positions start after the padding index
    return int(layers), int(hidden), int(max_len)
