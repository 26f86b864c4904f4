"""Model families: how an architecture is loaded, exported and read, derived from the model wherever it can be.

A :class:`Family` is the one typed description every floor reads.  For most architectures it is derived
from transformers itself (``derive_family``): the kind (encoder or decoder) from which auto classes know the
model type, the graph's inputs from the config, the word embeddings from ``get_input_embeddings()``, the LM
head from ``get_output_embeddings()`` and the final norm by a rule (``model/anatomy.py``, checked on the
model at export: the head's input must equal the last hidden state).  ``EXCEPTIONS`` holds only what cannot
be derived: a non-default pooling or loader, a pooled output, graph inputs, a head in another place,
embedding scaling notes.  Adding a plain architecture needs no row; an odd one needs one.
The fields are documented in docs/ARCHITECTURE.md ("The family description").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from layerscope.errors import InputError

Kind = Literal["encoder", "decoder"]
ExportPath = Literal["optimum", "torch"]
Modality = Literal["text", "image"]
JointEmbedding = Literal["projection", "pooler"]


@dataclass(frozen=True)
class Family:
    """How one architecture family is handled end to end (see docs/ARCHITECTURE.md for every field)."""

    name: str
    model_types: tuple[str, ...]  # config.model_type values that map here
    kind: Kind
    default_pooling: str = "mean"
    # Optimum OnnxConfig class name in optimum.exporters.onnx.model_configs; None: the one Optimum registers
    # for the model type (export/onnx_config.py), and the plain torch.onnx path where it registers none
    onnx_config: str | None = None
    export_path: ExportPath | None = None  # None: "optimum" where Optimum has a config, else "torch"
    # transformers class that loads the base model (no head); "{arch}" is the config class's name less "Config"
    # (T5Config -> T5EncoderModel, UMT5Config -> UMT5EncoderModel: each T5 variant's own layers)
    loader: str = "AutoModel"
    lm_head_loader: str | None = None  # class that loads the model with its LM head (lens); derived when None
    # Hugging Face's last hidden state has the final norm applied (decoders), or not (CLIP)
    final_norm_in_last_hidden_state: bool | None = None
    pooled_output: str | None = None  # the model's own pooled output, exported when present
    export_dtype_notes: str = ""
    # The graph's inputs in order; None: derived (``input_names``): input_ids, attention_mask, then
    # token_type_ids for encoders whose config has two or more token types, position_ids for decoders
    inputs: tuple[str, ...] | None = None
    type_ids_from_config: bool = False  # drop token_type_ids where config.type_vocab_size == 0 (DeBERTa)
    text_config: str | None = None  # attribute holding the text model's config (CLIP: text_config)
    optimizer_model_type: str = "bert"  # onnxruntime.transformers optimizer model_type for the ``opt`` variant
    # Where the LM head pieces live on the with-head model, as module paths applied in order; None: derived
    # (model/anatomy.py).  ``lm_head_new``: DeBERTa-v2 without ``legacy``. ``final_norm``: decoders.
    lm_head: tuple[str, ...] | None = None
    lm_head_new: tuple[str, ...] | None = None
    final_norm: str | None = None
    # hidden_states[0] is the word embeddings themselves (no position embeddings, no norm, no scaling)
    raw_is_layer0: bool = False
    positions_after_pad: bool = False  # positions numbered from pad_token_id + 1 (RoBERTa, MPNet)
    # what ``raw_embeddings`` and layer 0 are where they differ in a way a reader must know (manifest)
    embedding_note: str = ""
    # what the model reads: ``text`` (token ids) or ``image`` (``pixel_values``, a vision tower)
    modality: Modality = "text"
    # a vision tower's way into the joint image-text space: ``projection`` (CLIP: the ``visual_projection``
    # of the pooled CLS, where the checkpoint has one), ``pooler`` (SigLIP: its attention-pooling head's output)
    joint_embedding: JointEmbedding | None = None
    # a module of the base model that maps the last layer to another width after the final norm (OPT's
    # ``decoder.project_out`` to word_embed_proj_dim, where the checkpoint has one): layer L is its input, at
    # hidden_size like every layer, and the LM head reads it through that module (model/anatomy.py)
    hidden_projection: str | None = None

    def input_names(self, config) -> list[str]:
        """The model inputs the export takes, for this checkpoint's (text) config."""
        if self.inputs is not None:
            names = list(self.inputs)
            if self.type_ids_from_config and getattr(config, "type_vocab_size", 1) == 0:
                names.remove("token_type_ids")
            return names
        if self.kind == "decoder":
            return list(DECODER_INPUTS)
        types = getattr(config, "type_vocab_size", 0)
        return list(BERT_INPUTS if isinstance(types, int) and types >= 2 else BASE_INPUTS)

    def text_model_config(self, config):
        """The config of the text model (CLIP keeps it under ``text_config``), else the config itself."""
        return getattr(config, self.text_config, None) or config if self.text_config else config

    def tower_config(self, config):
        """The config of the tower this family reads: a two-tower checkpoint's ``vision_config`` for a vision
        family, its text config for a text one, else the config itself."""
        if self.modality == "image":
            return getattr(config, "vision_config", None) or config
        return self.text_model_config(config)


BASE_INPUTS = ("input_ids", "attention_mask")
IMAGE_INPUTS = ("pixel_values",)
BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DECODER_INPUTS = ("input_ids", "attention_mask", "position_ids")
_GEMMA_NOTE = ("'raw' is the rows of the word-embedding matrix; layer 0 is those rows times sqrt(hidden_size) "
               "(Gemma scales its embeddings), so the two differ by that factor")

# Only what cannot be derived from transformers.  Rows named after a family keep their historical names
# (exports and stores record them).
EXCEPTIONS: dict[str, Family] = {
    f.name: f
    for f in (
        Family("bert", ("bert",), "encoder", lm_head_loader="AutoModelForMaskedLM", inputs=BERT_INPUTS,
               onnx_config="BertOnnxConfig", lm_head=("cls",)),
        Family("roberta", ("roberta", "xlm-roberta"), "encoder", onnx_config="RobertaOnnxConfig",
               lm_head_loader="AutoModelForMaskedLM", inputs=BASE_INPUTS, lm_head=("lm_head",),
               positions_after_pad=True),
        Family("deberta-v2", ("deberta-v2",), "encoder", onnx_config="DebertaV2OnnxConfig",
               lm_head_loader="AutoModelForMaskedLM",
               export_dtype_notes="plain fp16 overflows in attention; keep softmax/LayerNorm in fp32",
               inputs=BERT_INPUTS, type_ids_from_config=True, lm_head=("cls",), lm_head_new=("lm_predictions",)),
        Family("clip-text", ("clip", "clip_text_model"), "encoder", "eos", onnx_config="CLIPTextOnnxConfig",
               loader="CLIPTextModel", final_norm_in_last_hidden_state=False, pooled_output="pooler_output",
               text_config="text_config", optimizer_model_type="clip", inputs=BASE_INPUTS),
        Family("t5-encoder", ("t5", "mt5", "umt5"), "encoder", onnx_config="T5Encoder", loader="{arch}EncoderModel",
               final_norm_in_last_hidden_state=True, inputs=BASE_INPUTS,
               export_dtype_notes="T5 activations overflow in fp16; keep fp32 or bf16", optimizer_model_type="t5"),
        Family("gpt2", ("gpt2",), "decoder", "last", onnx_config="GPT2OnnxConfig",
               final_norm_in_last_hidden_state=True, inputs=DECODER_INPUTS, optimizer_model_type="gpt2",
               lm_head=("lm_head",), final_norm="transformer.ln_f"),
        Family("qwen2", ("qwen2",), "decoder", "last", onnx_config="Qwen2OnnxConfig",
               final_norm_in_last_hidden_state=True, inputs=DECODER_INPUTS, lm_head=("lm_head",),
               final_norm="model.norm", raw_is_layer0=True),
        Family("qwen3", ("qwen3",), "decoder", "last", onnx_config="Qwen3OnnxConfig",
               final_norm_in_last_hidden_state=True, inputs=DECODER_INPUTS, lm_head=("lm_head",),
               final_norm="model.norm", raw_is_layer0=True),
        # positions start after the padding index, as RoBERTa's
        Family("camembert", ("camembert",), "encoder", positions_after_pad=True, inputs=BASE_INPUTS),
        Family("mpnet", ("mpnet",), "encoder", positions_after_pad=True),
        # ALiBi: positions live in the attention bias, the graph takes no position ids
        Family("bloom", ("bloom",), "decoder", "last", inputs=BASE_INPUTS),
        # word embeddings at word_embed_proj_dim where it differs from hidden_size: project_in after them,
        # project_out after the last layer
        Family("opt", ("opt",), "decoder", "last", hidden_projection="decoder.project_out"),
        # Optimum registers no ONNX config for these mixture-of-experts decoders
        Family("mixtral", ("mixtral",), "decoder", "last", export_path="torch", raw_is_layer0=True),
        Family("qwen2_moe", ("qwen2_moe",), "decoder", "last", export_path="torch", raw_is_layer0=True),
        Family("gemma", ("gemma",), "decoder", "last", embedding_note=_GEMMA_NOTE),
        Family("gemma2", ("gemma2",), "decoder", "last", embedding_note=_GEMMA_NOTE),
        Family("gemma3_text", ("gemma3_text",), "decoder", "last", embedding_note=_GEMMA_NOTE),
        # vision towers: pixel values in, every hidden state out (export/vision_export.py); layer 0 is the
        # patch embeddings with the position embeddings (and CLS, register tokens) added; final_norm is the
        # norm the model applies after its last layer (not in hidden_states[L])
        Family("vit", ("vit",), "encoder", "cls", export_path="torch", inputs=IMAGE_INPUTS, modality="image",
               final_norm_in_last_hidden_state=False, final_norm="layernorm"),
        Family("dinov2", ("dinov2", "dinov2_with_registers"), "encoder", "cls", export_path="torch",
               inputs=IMAGE_INPUTS, modality="image", final_norm_in_last_hidden_state=False, final_norm="layernorm"),
        Family("clip-vision", ("clip_vision_model",), "encoder", "cls", export_path="torch", inputs=IMAGE_INPUTS,
               modality="image", final_norm_in_last_hidden_state=False, final_norm="post_layernorm",
               joint_embedding="projection", optimizer_model_type="clip"),
        # SigLIP has no CLS token: its own pooling is the attention-pooling head
        Family("siglip-vision", ("siglip_vision_model",), "encoder", "mean", export_path="torch",
               inputs=IMAGE_INPUTS, modality="image", final_norm_in_last_hidden_state=False,
               final_norm="post_layernorm", joint_embedding="pooler"),
    )
}

_BY_TYPE = {t: f for f in EXCEPTIONS.values() for t in f.model_types}
# the vision tower of a two-tower (image-text) checkpoint, read with ``tower="vision"``
VISION_TOWERS = {"clip": "clip-vision", "siglip": "siglip-vision"}
TOWERS = ("text", "vision")

# The model types whose tiny random checkpoints the tests export and hold to Hugging Face on every layer
# (tests/export/test_export_zoo.py; docs/FAMILIES.md is generated from the same checks).
CHECKED_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "deberta-v2", "mpnet", "distilbert", "albert",
                 "electra", "modernbert", "t5", "mt5", "umt5", "clip_text_model", "gpt2", "gpt_neox", "gptj",
                 "gpt_neo", "opt", "bloom", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
                 "gemma2", "gemma3_text", "phi", "phi3", "olmo2", "falcon", "stablelm", "granite", "smollm3")


def _auto_names():
    from transformers.models.auto import modeling_auto as ma

    return ma.MODEL_MAPPING_NAMES, ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES


def derive_family(model_type: str) -> Family:
    """The family of a model type from the table's exceptions and transformers' auto classes, or one line
    saying what is missing (nothing is loaded)."""
    base, causal, masked = _auto_names()
    row = _BY_TYPE.get(model_type)
    if row is not None and row.lm_head_loader is None and row.kind == "decoder" and model_type in causal:
        return replace(row, lm_head_loader="AutoModelForCausalLM", final_norm_in_last_hidden_state=True)
    if row is not None and row.lm_head_loader is None and row.kind == "encoder" and model_type in masked:
        return replace(row, lm_head_loader="AutoModelForMaskedLM")
    if row is not None:
        return row
    if model_type not in base:
        raise InputError(
            f"model type '{model_type}' is not supported: this transformers has no model class for it (no AutoModel "
            "entry), so its hidden states cannot be read (a newer transformers may know it; `layerscope families` "
            "lists the supported types)")
    if model_type in masked:
        return Family(model_type, (model_type,), "encoder", lm_head_loader="AutoModelForMaskedLM")
    if model_type in causal:
        return Family(model_type, (model_type,), "decoder", "last", lm_head_loader="AutoModelForCausalLM",
                      final_norm_in_last_hidden_state=True)
    raise InputError(
        f"model type '{model_type}' is not supported: transformers knows it neither as a masked-LM encoder nor "
        "as a causal-LM decoder (AutoModelForMaskedLM / AutoModelForCausalLM), and it is not one of the vision "
        "towers (vit, dinov2, clip, siglip), so layerscope cannot read it (`layerscope families` lists the "
        "supported types)")


def check_config(config, family: Family) -> None:
    """One line for a checkpoint whose config alone shows layerscope cannot serve it (before any weights)."""
    if family.modality == "image":
        return
    cfg = family.text_model_config(config)
    if getattr(cfg, "is_encoder_decoder", False) and family.loader == "AutoModel":
        raise InputError(f"model type '{config.model_type}' is an encoder-decoder model; layerscope reads one "
                         "stack's hidden states and knows which one only for T5-style models (t5, mt5, umt5)")
    if not isinstance(getattr(cfg, "vocab_size", None), int):
        raise InputError(f"model type '{config.model_type}' has no vocab_size in its config: it is not a text model "
                         "(layerscope reads text models' hidden states)")


def projected_widths(config, family: Family) -> tuple[int, int] | None:
    """(word-embedding width, hidden size) of a checkpoint whose words are projected in and out (OPT with
    word_embed_proj_dim != hidden_size), else None."""
    cfg = family.text_model_config(config)
    proj, hidden = getattr(cfg, "word_embed_proj_dim", None), getattr(cfg, "hidden_size", None)
    if not family.hidden_projection or not isinstance(proj, int) or proj == hidden:
        return None
    return proj, hidden


def layer_facts(config, family: Family, num_layers: int) -> dict[str, Any]:
    """What ``raw`` and the last layer are, where a reader must know (the manifest's ``embedding_note``,
    ``last_layer_note`` and ``final_norm_in_last_layer``): Gemma's scaling; OPT's projection in and out of
    the hidden size, and OPT's blocks that end with their own norm (``do_layer_norm_before`` false)."""
    cfg = family.text_model_config(config)
    final_norm = family.final_norm_in_last_hidden_state if family.kind == "decoder" or \
        family.final_norm_in_last_hidden_state is not None else None
    post_norm = family.hidden_projection is not None and getattr(cfg, "do_layer_norm_before", True) is False
    normed = ("(each block ends with its own norm: do_layer_norm_before is false, so there is no final norm)"
              if post_norm else "after the final norm")
    facts = {"embedding_note": family.embedding_note or None, "final_norm_in_last_layer": final_norm and not post_norm,
             "last_layer_note": f"layer {num_layers} is the last block's output {normed}" if post_norm else None}
    widths = projected_widths(config, family)
    if widths is not None:
        proj, hidden = widths
        facts["embedding_note"] = (f"'raw' is the rows of the word-embedding matrix, word_embed_proj_dim={proj} "
                                   f"wide, before project_in; layer 0 is project_in of them ({hidden} wide) plus "
                                   "the position embeddings")
        facts["last_layer_note"] = (f"layer {num_layers} is the last block's output {normed}, before project_out: "
                                    f"hidden_size={hidden} wide like every layer (Hugging Face's last hidden state "
                                    f"is project_out of it, {proj} wide); the lens applies project_out, then the "
                                    "LM head")
    return facts


def family_notes(family: Family) -> str:
    """What the families table says about a family beyond the derived defaults, in a few words."""
    notes = []
    if family.embedding_note:
        notes.append("raw = unscaled embedding rows, layer 0 scaled by sqrt(hidden_size)")
    if family.pooled_output:
        notes.append(f"own pooled output ({family.pooled_output})")
    if family.positions_after_pad:
        notes.append("positions numbered after the pad id")
    if family.inputs is not None and family.kind == "decoder" and "position_ids" not in family.inputs:
        notes.append("no position input (ALiBi)")
    if family.hidden_projection:
        notes.append("where word_embed_proj_dim != hidden_size (OPT-350m): raw at that width, layer L before project_out")
    if family.export_dtype_notes:
        notes.append(family.export_dtype_notes)
    return "; ".join(notes)


def supported_types() -> list[str]:
    """Every model type transformers knows as a masked-LM encoder or a causal-LM decoder, plus the table's."""
    _, causal, masked = _auto_names()
    return sorted(set(causal) | set(masked) | set(_BY_TYPE))


def family_for(model_type: str, tower: str | None = None) -> Family:
    """The family of ``model_type``; ``tower="vision"`` picks the vision tower of a two-tower checkpoint
    (CLIP, SigLIP), ``"text"`` or None the model as it reads text (a vision model's own family stays)."""
    if tower not in (None, *TOWERS):
        raise InputError(f"unknown tower '{tower}'; choose from {', '.join(TOWERS)}")
    if tower == "vision":
        if model_type in VISION_TOWERS:
            return EXCEPTIONS[VISION_TOWERS[model_type]]
        family = derive_family(model_type)
        if family.modality != "image":
            raise InputError(f"model type '{model_type}' has no vision tower layerscope reads; vision towers: "
                             f"{', '.join(sorted(VISION_TOWERS))} (two-tower) and "
                             f"{', '.join(t for f in EXCEPTIONS.values() if f.modality == 'image' for t in f.model_types)}")
        return family
    if model_type == "siglip":
        raise InputError("a SigLIP checkpoint has two towers: read its images with tower 'vision' "
                         "(--tower vision); its text tower is not supported yet")
    return derive_family(model_type)


def check_family(model_type: str, auto_map, trust_remote_code: bool = False):
    """The family of ``model_type`` (``family_for``); for a type only the model's own code (``auto_map``)
    defines, the family derived from that code with --trust-remote-code (``code_family``), one line without."""
    try:
        return family_for(model_type)
    except InputError:
        if not auto_map or not isinstance(auto_map, dict):
            raise
        if trust_remote_code:
            return code_family(model_type, code_kind(model_type, auto_map))
        code = ", ".join(f"{k} = {v}" for k, v in sorted(auto_map.items()) if k.startswith("AutoModel"))
        raise InputError(f"model type '{model_type}' exists only in the model's own code ({code or 'auto_map'}), "
                         "which runs only with --trust-remote-code: pass it if you trust that code (none of it "
                         "ran)") from None


def family_of_config(config, tower: str | None = None, trust_remote_code: bool = False):
    """The family a checkpoint's config (already read) is exported and run as: ``family_for`` its model type
    and ``tower``, or, for a type only the model's own code defines, ``check_family``'s (one line without
    --trust-remote-code).  Derived once per export and handed down (export/exporter.py)."""
    try:
        return family_for(config.model_type, tower)
    except InputError:
        family = check_family(config.model_type, getattr(config, "auto_map", None), trust_remote_code)
        if tower == "vision":
            raise
        return family


def code_family(model_type: str, kind: str) -> Family:
    """The family of a model type only the model's own code defines (``auto_map``, read with
    --trust-remote-code): its base class through ``AutoModel``, every layer through ``output_hidden_states``,
    the word embeddings through ``get_input_embeddings()``, the plain torch.onnx export (Optimum has no config
    for it), and the tied word embeddings for the lens (the head of the model's own code is not read)."""
    if kind not in ("encoder", "decoder"):
        raise InputError(f"model type '{model_type}': unknown kind '{kind}' (encoder or decoder)")
    decoder = kind == "decoder"
    family = Family(model_type, (model_type,), kind, "last" if decoder else "mean", export_path="torch",
                    final_norm_in_last_hidden_state=True if decoder else None)
    _FROM_CODE[model_type] = family  # so FAMILIES[name] finds it for the rest of this process
    return family


_FROM_CODE: dict[str, Family] = {}


def code_kind(model_type: str, auto_map) -> str:
    """Whether the model's own code (``auto_map``) makes an encoder or a decoder, or one line where it
    registers no base model class (``AutoModel``) layerscope could read every layer of."""
    classes = auto_map if isinstance(auto_map, dict) else {}
    if "AutoModel" not in classes:
        named = ", ".join(sorted(classes)) or "none"
        raise InputError(f"model type '{model_type}' exists only in the model's own code, which registers no "
                         f"AutoModel class (auto_map names {named}), so layerscope cannot load its base model")
    return "decoder" if "AutoModelForCausalLM" in classes and "AutoModelForMaskedLM" not in classes else "encoder"


def is_code_family(family: Family) -> bool:
    """Whether ``family`` was derived from a model's own code (``code_family``)."""
    return _FROM_CODE.get(family.name) == family


def family_of(manifest) -> Family:
    """The family a manifest (or a model's description) records: by name, or derived again from its kind for
    a model type only the model's own code defines."""
    if getattr(manifest, "family_from_code", False):
        return code_family(manifest.family, manifest.kind)
    return FAMILIES[manifest.family]


class _Families(Mapping):
    """The table's rows by name; any other name is read as a model type and derived (``derive_family``)."""

    def __getitem__(self, name: str) -> Family:
        if name in EXCEPTIONS:
            return derive_family(EXCEPTIONS[name].model_types[0])
        try:
            return derive_family(name)
        except InputError:
            if name in _FROM_CODE:
                return _FROM_CODE[name]
            raise KeyError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(EXCEPTIONS)

    def __len__(self) -> int:
        return len(EXCEPTIONS)


FAMILIES: Mapping[str, Family] = _Families()


def get_submodule(model, dotted: str):
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def model_dims(config, family: Family) -> tuple[int, int, int]:
    """(num_layers, hidden_size, max_length) of the text model: through Optimum's normalized config of the
    model type where it has one, else the usual attribute names."""
    cfg = family.tower_config(config)
    layers = hidden = None
    try:
        from optimum.utils import NormalizedConfigManager

        normalized = NormalizedConfigManager.get_normalized_config_class(cfg.model_type)(cfg)
        layers, hidden = normalized.num_layers, normalized.hidden_size
    except (KeyError, AttributeError, ImportError):
        pass
    layers = layers or _first(cfg, "num_hidden_layers", "num_layers", "n_layer", "n_layers")
    hidden = hidden or _first(cfg, "hidden_size", "d_model", "n_embd", "dim")
    if family.modality == "image":  # every patch and the prefix tokens, at the checkpoint's image size
        return int(layers), int(hidden), image_tokens(cfg, family)
    max_len = _first(cfg, "max_position_embeddings", "n_positions") or 512
    if family.positions_after_pad:
        max_len -= int(getattr(cfg, "pad_token_id", None) or 0) + 1  # positions start after the padding index
    return int(layers), int(hidden), int(max_len)


def _first(cfg, *names):
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def prefix_tokens(vision_config, family: Family) -> int:
    """The tokens a vision tower puts before its patches: CLS (none in SigLIP) and DINOv2's register tokens."""
    cls = 0 if family.name == "siglip-vision" else 1
    return cls + int(getattr(vision_config, "num_register_tokens", 0) or 0)


def image_tokens(vision_config, family: Family) -> int:
    """Tokens per image at the config's image size: the patch grid plus the prefix tokens."""
    size, patch = vision_config.image_size, vision_config.patch_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    ph, pw = (patch, patch) if isinstance(patch, int) else tuple(patch)
    return (height // ph) * (width // pw) + prefix_tokens(vision_config, family)
