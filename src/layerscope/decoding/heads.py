"""Decoding heads: map a layer's hidden states onto the vocabulary (the logit lens, decoded saliency).

Which head a model gets, in order:

* ``mlm-head`` (BERT, RoBERTa, DeBERTa-v2 checkpoints that ship their masked-LM head): the head
  as trained, including its own dense + activation + LayerNorm transform.  These encoders are
  post-LayerNorm, so every hidden state is already normalized the way the head expects; it is
  applied to ``hidden_states[l]`` as is, at every layer.
* ``causal-lm-head`` (GPT-2, Qwen2, Qwen3): the final norm, then the unembedding.  Hugging Face's
  last hidden state already has the final norm applied, so the norm is applied to layers
  ``0..L-1`` only, never twice.
* ``tied-word-embeddings`` (checkpoints without a head, e.g. sentence-transformers' all-MiniLM-L6-v2,
  which is a bare ``BertModel``; and families with no LM head at all: CLIP text, T5 encoder):
  ``logits = h_l @ E^T`` with ``E`` the model's own word-embedding matrix, no bias, no extra
  norm.  This is the MLM decoder without its trained transform; its probabilities are not
  calibrated (no trained temperature), ranks are what it is good for.

Missing head weights are detected from the loading info (``missing_keys``): transformers would
otherwise initialize the head at random and every decoded token would be noise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("layerscope")

MLM = "mlm-head"
CAUSAL = "causal-lm-head"
TIED = "tied-word-embeddings"

@dataclass(frozen=True)
class HeadInfo:
    kind: str  # mlm-head, causal-lm-head, tied-word-embeddings
    description: str  # one plain sentence for results.json and the report
    final_norm: bool  # a final norm is applied below the last layer
    missing_head_weights: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "description": self.description, "final_norm_below_last": self.final_norm,
                "missing_head_weights": list(self.missing_head_weights)}


def _decoding_module(kind: str, head, norm, word_embeddings, num_layers: int, deberta_new: bool):
    import torch

    class DecodingHead(torch.nn.Module):
        """``forward(h, layer) -> logits [..., vocab]`` for hidden states of layer ``layer`` (0..L)."""

        def __init__(self):
            super().__init__()
            self.kind = kind
            self.num_layers = num_layers
            self.head = head
            self.norm = norm
            self.word_embeddings = word_embeddings
            self.deberta_new = deberta_new

        def forward(self, h, layer: int):
            if self.kind == TIED:
                return h @ self.word_embeddings.weight.t()
            if self.norm is not None and layer < self.num_layers:
                h = self.norm(h)
            if self.deberta_new:
                return self.head(h, self.word_embeddings)
            return self.head(h)

    return DecodingHead().eval()


@dataclass
class DecodingModel:
    """The base model that makes hidden states, and the head that decodes them."""

    base: Any  # HF base model (hidden states via output_hidden_states)
    head: Any  # DecodingHead module
    word_embeddings: Any  # the embedding module (inputs_embeds for gradients)
    info: HeadInfo
    family: Any
    num_layers: int

    def logits(self, h, layer: int):
        return self.head(h, layer)


def load_decoding_model(handle, *, device: str = "cpu") -> DecodingModel:
    """Load the model with the best head it really has (see the module docstring)."""
    from layerscope.model.families import get_submodule
    from layerscope.model.source import load_torch_model

    family = handle.family()
    source = handle.source()
    if source.is_local and not Path(source.path_or_id).is_dir():
        from layerscope.errors import InputError

        raise InputError(
            f"the decoding head is read from the checkpoint this export was made from, {source.path_or_id}, "
            "which is no longer there; put it back, or export again with --lens-k K while it exists "
            "(the lens graph then carries the head)")
    num_layers = int(handle.manifest["num_layers"])
    trc = getattr(handle, "trust_remote_code", False)
    if family.lm_head_loader and family.lm_head:  # where the head lives: the families table
        net, info = load_torch_model(source, family, trust_remote_code=trc, with_head=True,
                                     output_loading_info=True)
        prefix = net.base_model_prefix
        missing = tuple(k for k in info.get("missing_keys", []) if not k.startswith(prefix + "."))
        if not missing:
            net = net.to(device)
            base = net.base_model
            word_emb = _word_embeddings(base, family)
            deberta_new = family.name == "deberta-v2" and not getattr(net.config, "legacy", True)
            head_mod = get_submodule(net, family.lm_head_new if deberta_new else family.lm_head)
            norm = get_submodule(net, family.final_norm) if family.final_norm else None
            if family.kind == "decoder":
                desc = (f"the model's own causal-LM head ({family.lm_head_loader}): final norm on layers "
                        f"0..{num_layers - 1} (layer {num_layers} already has it), then the unembedding")
                kind = CAUSAL
            else:
                desc = (f"the model's own masked-LM head ({family.lm_head_loader}, with its trained transform), "
                        "applied to every layer's hidden states as they are")
                kind = MLM
            head = _decoding_module(kind, head_mod, norm, word_emb, num_layers, deberta_new).to(device)
            return DecodingModel(base.eval(), head, word_emb, HeadInfo(kind, desc, norm is not None), family,
                                 num_layers)
        del net
        reason = (f"the checkpoint has no LM-head weights ({len(missing)} missing, e.g. {missing[0]}); "
                  "transformers would have initialized them at random")
    else:
        missing = ()
        reason = f"the {family.name} family has no LM head layerscope can load"
    base = load_torch_model(source, family, trust_remote_code=trc).to(device)
    word_emb = _word_embeddings(base, family)
    desc = (f"no trained LM head: {reason}, so tokens are decoded with the tied word-embedding matrix "
            "(logits = h @ E^T, no bias, no extra norm); ranks are meaningful, probabilities are uncalibrated")
    head = _decoding_module(TIED, None, None, word_emb, num_layers, False).to(device)
    return DecodingModel(base.eval(), head, word_emb, HeadInfo(TIED, desc, False, missing), family, num_layers)


def _word_embeddings(base, family):
    # the Hugging Face accessor: the family table's attribute path is relative to the inner text
    # model and does not resolve on CLIPTextModel (text_model.embeddings.token_embedding)
    return base.get_input_embeddings()


def model_inputs(handle, tokenizer, texts: list[str], max_length: int | None = None) -> dict[str, Any]:
    """Tokenized torch inputs for ``texts`` (right-padded, the model's own input names)."""
    import torch

    from layerscope.model.tokenize import Encoder

    enc = Encoder(tokenizer, handle.manifest["inputs"], max_length or handle.manifest["max_length"])(texts)
    return {k: torch.from_numpy(v) for k, v in enc.inputs.items()}
