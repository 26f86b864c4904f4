"""The model's anatomy: where a loaded model keeps its blocks, attention, final norm and head, found once
from the model itself, checked by a forward pass, recorded in the manifest and read by every floor.

``Anatomy`` (frozen; ``manifest.anatomy``) is the record; :func:`resolve_anatomy` finds it on a loaded base
model and :func:`check_anatomy` holds it to a forward pass (each path must produce what the record says it
does, or the export stops with one line naming the field); :func:`derive_anatomy` rebuilds the structural
part for an export made before the record existed (``derived_on_load``).  Paths are module paths relative to
the base model (what the family's loader loads; a vision tower: the module that records its hidden states),
except ``head``, which is on the with-head model, whose ``base_prefix`` attribute holds the base model.

* the blocks: the outermost ``ModuleList`` of as many modules as the model has layers; the check: block 0
  reads ``hidden_states[0]`` and block i hands over ``hidden_states[i + 1]`` (the last one, or the final norm
  of it: ``final_norm_in_hidden_states``).  ALBERT, which calls one shared block at every layer, has none.
* the attention: the deepest module of block 0 whose class name ends in ``Attention``; heads, key/value heads
  and head size from the module where it declares them, else the config; q/k norms by their modules' width;
  the softmax scale where the module declares one (``scaling``) other than 1/sqrt(head size); the sliding
  window of each layer (the module's own, else the config's per-layer types); positions by what the model
  holds (a rotary module or rotary config, ALiBi, a relative bias, learned position embeddings).
* the final norm: the last module of the base model named like a final norm (``norm``, ``ln_f``,
  ``final_layer_norm``, ...) outside the numbered blocks, or the family's (vision towers); the check says
  whether ``hidden_states[L]`` already has it and what the model returns as ``last_hidden_state``.
* the head: where the with-head model keeps it and the check that it reads layer L or its final norm
  (``model/anatomy_head.py``, found where export/lm_head.py keeps it), added by :func:`with_head`; a vision
  tower's way into the joint space by :func:`vision_head`.

The record and its JSON form: ``model/anatomy_record.py``; the rules and the forward pass that measures:
``model/anatomy_rules.py``.  Field by field: docs/ARCHITECTURE.md ("The model anatomy").  torch is imported inside the functions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from layerscope.errors import ExportError
from layerscope.model.anatomy_head import base_attribute, hidden_projection, module_name
from layerscope.model.anatomy_record import HEAD_READS, Anatomy, AttentionAnatomy
from layerscope.model.anatomy_rules import (embeddings_path, find_attention, find_blocks, find_final_norm, keep_first,
                                            measure, probe_inputs)

__all__ = ["Anatomy", "AttentionAnatomy", "check_anatomy", "derive_anatomy", "meta_base", "resolve_anatomy",
           "vision_head", "with_head"]


def resolve_anatomy(base, family, num_blocks: int, *, inputs: dict[str, Any] | None = None,
                    config=None) -> Anatomy:
    """The anatomy of the loaded base model ``base`` (its head part left empty: :func:`with_head` adds it),
    every path found by rule and held to one forward pass on ``inputs`` (by default
    :func:`probe_inputs`): a path that does not behave is left out, never recorded."""
    config = config if config is not None else base.config
    inputs = inputs if inputs is not None else probe_inputs(base, config)
    blocks = find_blocks(base, num_blocks)
    norm = find_final_norm(base, family)
    emb = embeddings_path(base)
    projection = hidden_projection(base, family)
    projection = module_name(base, projection) if projection is not None else None
    for candidate_blocks, candidate_norm in ((blocks, norm), (blocks, None), (None, norm), (None, None)):
        try:
            got = measure(base, blocks=candidate_blocks, num_blocks=num_blocks, final_norm=candidate_norm,
                          embeddings=emb, projection=projection, inputs=inputs)
        except ExportError:
            if candidate_blocks is None and candidate_norm is None:
                raise
            continue  # the next candidate leaves out what did not behave
        blocks, norm = candidate_blocks, candidate_norm
        break
    attention = find_attention(base, blocks, num_blocks, config)
    return Anatomy(tower="vision" if family.modality == "image" else "text", embeddings=emb,
                   embedding_scale=got["embedding_scale"], blocks=blocks, num_blocks=num_blocks, attention=attention,
                   final_norm=norm, final_norm_in_hidden_states=got["final_norm_in_hidden_states"],
                   last_hidden_state=got["last_hidden_state"], hidden_projection=projection,
                   check_max_abs=got["max_abs"])


def check_anatomy(base, anatomy: Anatomy, inputs: dict[str, Any] | None = None) -> float:
    """Hold ``anatomy`` to one forward pass of ``base``: every path must produce what the record says (the
    blocks each layer, the final norm where it claims, the model's own last hidden state, the embedding
    scale); returns the largest difference, or raises one ExportError naming the field that does not hold."""
    inputs = inputs if inputs is not None else probe_inputs(base)
    for field, path in (("blocks", anatomy.blocks), ("final_norm", anatomy.final_norm),
                        ("embeddings", anatomy.embeddings or None), ("hidden_projection", anatomy.hidden_projection)):
        if path is not None:
            try:
                base.get_submodule(path)
            except AttributeError:
                raise ExportError(f"the anatomy's {field} ({path}) is not a module of the model") from None
    got = measure(base, blocks=anatomy.blocks, num_blocks=anatomy.num_blocks, final_norm=anatomy.final_norm,
                  embeddings=anatomy.embeddings, projection=anatomy.hidden_projection, inputs=inputs)
    for field in ("final_norm_in_hidden_states", "last_hidden_state"):
        if got[field] != getattr(anatomy, field):
            raise ExportError(f"the anatomy says {field} is {getattr(anatomy, field)!r}, the forward pass {got[field]!r}")
    if (got["embedding_scale"] is None) != (anatomy.embedding_scale is None) or (
            anatomy.embedding_scale is not None
            and abs(got["embedding_scale"] - anatomy.embedding_scale) > 1e-6 * abs(anatomy.embedding_scale)):
        raise ExportError(f"the anatomy says embedding_scale is {anatomy.embedding_scale}, the forward pass "
                          f"{got['embedding_scale']}")
    return got["max_abs"]


def with_head(anatomy: Anatomy, *, base_prefix: str, head: tuple[str, ...], head_reads: str,
              max_abs: float = 0.0) -> Anatomy:
    """``anatomy`` with the head part found on the with-head model (export/lm_head.py checks it)."""
    if head_reads not in HEAD_READS:
        raise ExportError(f"unknown head input {head_reads!r}")
    return replace(anatomy, base_prefix=base_prefix, head=tuple(head), head_reads=head_reads,
                   check_max_abs=max(anatomy.check_max_abs, float(max_abs)))


def vision_head(tower, anatomy: Anatomy, inputs: dict[str, Any]) -> Anatomy:
    """``anatomy`` (of ``tower.tower``, a ``VisionTower``'s recording tower: model/vision.py) with the way into
    the joint space as its head: CLIP's projection of the normed CLS, SigLIP's attention-pooling head over the
    normed tokens; checked by one forward pass of the tower (the head reads the final norm's output, or the
    last layer as it is)."""
    import torch

    head = getattr(tower, "projection", None) if tower.joint == "projection" else None
    if tower.joint == "pooler":
        head = getattr(getattr(tower.tower, "vision_model", tower.tower), "head", None)
    if head is None:
        return replace(anatomy, base_prefix="tower")
    path = module_name(tower, head)
    seen: dict[str, Any] = {}
    hooks = [head.register_forward_pre_hook(lambda _m, args: keep_first(seen, "head", args[0] if args else None))]
    if anatomy.final_norm:
        hooks.append(tower.tower.get_submodule(anatomy.final_norm).register_forward_hook(
            lambda _m, _a, out: seen.__setitem__("norm", out)))
    try:
        with torch.inference_mode():
            hidden, _ = tower(**inputs)
    finally:
        for hook in hooks:
            hook.remove()
    got = seen.get("head")
    for reads, want in (("final_norm", seen.get("norm")), ("layer", hidden[-1])):
        if got is not None and want is not None and tuple(got.shape) == tuple(want.shape):
            diff = float((got.double() - want.double()).abs().max())
            if diff <= 1e-5 * max(1.0, float(want.double().abs().max())):
                return with_head(anatomy, base_prefix="tower", head=(path,), head_reads=reads, max_abs=diff)
    raise ExportError(f"the vision tower's head ({path}) reads neither its final norm's output nor the last layer")


def derive_anatomy(export_dir, manifest) -> Anatomy | None:
    """The anatomy of an export made before layerscope recorded one, derived from the export's own config.json
    with the model built on the meta device (no weight is read, nothing runs): the paths by the same rules,
    the facts only a forward pass measures from what that manifest recorded (the final norm in layer L, the
    head's modules and input); ``embedding_scale`` is left unknown (None), and ``last_hidden_state`` is taken
    to be the final norm wherever a final norm sits outside layer L (true of every text tower; CLIP's image
    tower, which norms its pooled CLS only, is recorded as ``layer`` when exported again). None where the
    model cannot be built here (a model type only its own code defines)."""
    from pathlib import Path

    from layerscope.model.families import family_of

    if manifest.family_from_code or not (Path(export_dir) / "config.json").is_file():
        return None
    try:
        import torch
        from transformers import AutoConfig

        family = family_of(manifest)
        config = AutoConfig.from_pretrained(str(export_dir))
        with torch.device("meta"):
            base, vision = meta_base(config, family)
    except Exception:  # noqa: BLE001 - transformers raises many kinds; an underivable anatomy reads as None
        return None
    num = manifest.num_layers
    blocks = find_blocks(base, num)
    norm = find_final_norm(base, family)
    projection = hidden_projection(base, family)
    projection = module_name(base, projection) if projection is not None else None
    recorded = manifest.final_norm_in_last_layer
    in_hidden = norm is not None and (recorded if isinstance(recorded, bool) else bool(family.final_norm_in_last_hidden_state))
    last = "projection" if projection else "final_norm" if norm and not in_hidden else "layer"
    anatomy = Anatomy(tower="vision" if family.modality == "image" else "text", embeddings=embeddings_path(base),
                      embedding_scale=None, blocks=blocks, num_blocks=num,
                      attention=find_attention(base, blocks, num, base.config), final_norm=norm,
                      final_norm_in_hidden_states=in_hidden, last_hidden_state=last, hidden_projection=projection,
                      check_max_abs=float("nan"), derived_on_load=True)
    if vision is not None:
        head = vision.projection if vision.joint == "projection" else \
            getattr(getattr(vision.tower, "vision_model", vision.tower), "head", None) if vision.joint else None
        return replace(anatomy, base_prefix="tower", head=(module_name(vision, head),) if head is not None else (),
                       head_reads="final_norm" if head is not None and norm else "layer")
    entry = manifest.lm_head or {}
    paths = tuple(entry.get("head_modules") or ())
    if not paths or not entry.get("loader"):
        return anatomy
    try:
        from layerscope.model.source import _loader_class

        with torch.device("meta"):
            net = _loader_class(entry["loader"]).from_config(config, attn_implementation="eager")
    except Exception:  # noqa: BLE001 - as above
        return anatomy
    return replace(anatomy, base_prefix=base_attribute(net), head=paths,
                   head_reads="final_norm" if entry.get("final_norm_on_last") else "layer")


def meta_base(config, family):
    """(the base model as the family's loader builds it from ``config``, the ``VisionTower`` or None); built
    on whatever device is current (callers build on ``torch.device("meta")``: no weight is made)."""
    from layerscope.model.source import _loader_class

    if family.modality == "image":
        import transformers

        from layerscope.model.vision import _tower_class

        loader = "CLIPVisionModelWithProjection" if "CLIPVisionModelWithProjection" in (
            getattr(config, "architectures", None) or []) else "AutoModel"
        model = getattr(transformers, loader).from_config(config, attn_implementation="eager")
        tower = _tower_class()(model, family)
        return tower.tower, tower
    name = family.loader.format(arch=type(config).__name__.removesuffix("Config"))
    return _loader_class(name).from_config(family.text_model_config(config), attn_implementation="eager"), None
