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

from layerscope.export.lm_head import CAUSAL, MLM, TIED, describe  # noqa: F401 (re-used names)


@dataclass(frozen=True)
class HeadInfo:
    kind: str  # mlm-head, causal-lm-head, tied-word-embeddings
    description: str  # one plain sentence for results.json and the report
    final_norm: bool  # a final norm is applied below the last layer
    missing_head_weights: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "description": self.description, "final_norm_below_last": self.final_norm,
                "missing_head_weights": list(self.missing_head_weights)}


def _decoding_module(kind: str, head, norm, word_embeddings, num_layers: int, deberta_new: bool,
                     norm_on_last: bool = False):
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
            self.norm_on_last = norm_on_last  # the last hidden state lacks the final norm the head reads

        def forward(self, h, layer: int):
            if self.kind == TIED:
                return h @ self.word_embeddings.weight.t()
            if self.norm is not None and (layer < self.num_layers or self.norm_on_last):
                h = self.norm(h)
            if self.deberta_new:
                return self.head(h, self.word_embeddings)
            return self.head(h)

    return DecodingHead().eval()


class DecodingModel:
    """The base model that makes hidden states, and the head that decodes them.

    ``base`` (and the base model's ``word_embeddings``, which gradients flow through) is loaded from
    the source checkpoint on first use only: a head kept in the export decodes without it.
    """

    def __init__(self, base, head, info: HeadInfo, family, num_layers: int, *, load_base=None,
                 word_embeddings=None):
        self._base = base
        self._load_base = load_base
        self._word_embeddings = word_embeddings
        self.head = head
        self.info = info
        self.family = family
        self.num_layers = num_layers

    @property
    def has_base(self) -> bool:
        return self._base is not None or self._load_base is not None

    @property
    def base(self):
        if self._base is None:
            if self._load_base is None:
                from layerscope.errors import InputError

                raise InputError("this step runs the model in PyTorch and needs the checkpoint the export was "
                                 "made from, which is no longer there; put it back, or use an ONNX engine "
                                 "(--engine ort): the export keeps the decoding head")
            self._base = self._load_base().eval()
        return self._base

    @property
    def word_embeddings(self):
        if self._word_embeddings is None:
            self._word_embeddings = _word_embeddings(self.base, self.family)
        return self._word_embeddings

    def logits(self, h, layer: int):
        return self.head(h, layer)


def load_decoding_model(handle, *, device: str = "cpu") -> DecodingModel:
    """Load the model with the best head it really has (see the module docstring).

    An export that keeps its head (``lm_head.safetensors``, see ``export/lm_head.py``) decodes from
    it; the base model is then read from the source checkpoint only if a step runs it in torch.
    """
    from layerscope.model.source import load_torch_model

    family = handle.family()
    num_layers = handle.manifest.num_layers
    source = handle.source()
    trc = getattr(handle, "trust_remote_code", False)
    stored = None
    if getattr(handle, "export_dir", None) is not None:
        from layerscope.export.lm_head import load_stored_head

        stored = load_stored_head(handle.export_dir, handle.manifest)
    if stored is not None:
        entry = handle.manifest.lm_head
        anatomy = handle.manifest.anatomy
        derived = f" ({anatomy.note})" if anatomy is not None and anatomy.derived_on_load and stored["head"] is not None \
            else ""
        info = HeadInfo(entry["kind"], entry["description"] + derived, bool(entry["final_norm_below_last"]),
                        tuple(entry.get("missing_head_weights") or ()))
        head = _decoding_module(stored["kind"], stored["head"], stored["norm"], stored["word_embeddings"],
                                num_layers, stored["deberta_new"], stored.get("norm_on_last", False)).to(device)
        gone = source.is_local and not Path(source.path_or_id).is_dir()
        load_base = None if gone else (lambda: load_torch_model(source, family, trust_remote_code=trc).to(device))
        return DecodingModel(None, head, info, family, num_layers, load_base=load_base)
    if source.is_local and not Path(source.path_or_id).is_dir():
        from layerscope.errors import InputError

        raise InputError(
            f"the decoding head is read from the checkpoint this export was made from, {source.path_or_id}, "
            "which is no longer there (this export predates heads kept in the export); put it back, or "
            "export again")
    if family.lm_head_loader:  # where the head lives: found on the model (model/anatomy.py)
        net, info = load_torch_model(source, family, trust_remote_code=trc, with_head=True,
                                     output_loading_info=True)
        prefix = net.base_model_prefix
        missing = tuple(k for k in info.get("missing_keys", []) if not k.startswith(prefix + "."))
        if not missing:
            from layerscope.export.lm_head import head_parts

            net = net.to(device)
            base = net.base_model
            p = head_parts(net, family, num_layers, anatomy=_recorded_head(handle))
            head = _decoding_module(p["kind"], p["head"], p["norm"], p["word_embeddings"], num_layers,
                                    p["deberta_new"], p["norm_on_last"]).to(device)
            said = describe(p["kind"], family, num_layers, parts=p)
            return DecodingModel(base.eval(), head, HeadInfo(p["kind"], said, p["norm"] is not None), family,
                                 num_layers)
        del net
        reason = (f"the checkpoint has no LM-head weights ({len(missing)} missing, e.g. {missing[0]}); "
                  "transformers would have initialized them at random")
    else:
        missing = ()
        reason = f"the {family.name} family has no LM head layerscope can load"
    base = load_torch_model(source, family, trust_remote_code=trc).to(device)
    word_emb = _word_embeddings(base, family)
    head = _decoding_module(TIED, None, None, word_emb, num_layers, False).to(device)
    return DecodingModel(base.eval(), head, HeadInfo(TIED, describe(TIED, family, num_layers, reason), False, missing),
                         family, num_layers)


def _recorded_head(handle):
    """The anatomy the export recorded where it names the head (its paths then need no forward pass), else None
    (a plain model: found and checked on the loaded model)."""
    anatomy = handle.manifest.anatomy
    return anatomy if anatomy is not None and anatomy.head else None


def _word_embeddings(base, family):
    # the Hugging Face accessor: the family table's attribute path is relative to the inner text
    # model and does not resolve on CLIPTextModel (text_model.embeddings.token_embedding)
    return base.get_input_embeddings()


def model_inputs(handle, tokenizer, texts: list[str], max_length: int | None = None) -> dict[str, Any]:
    """Tokenized torch inputs for ``texts`` (right-padded, the model's own input names)."""
    import torch

    from layerscope.model.tokenize import Encoder

    enc = Encoder(tokenizer, list(handle.manifest.inputs), max_length or handle.manifest.max_length)(texts)
    return {k: torch.from_numpy(v) for k, v in enc.inputs.items()}
