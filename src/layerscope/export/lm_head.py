"""The decoding head kept inside an export (``lm_head.safetensors``), so a lens needs no source checkpoint.

At export time the model is loaded with its LM head once more (fp32, like the lens always loaded
it) and the tensors the head needs are written to ``lm_head.safetensors``:

* ``mlm-head`` / ``causal-lm-head``: the head module, the final norm (decoders) and the word
  embeddings (tied heads read them), under their names in the ``*-with-head`` model;
* ``tied-word-embeddings`` (no trained head): the word-embedding matrix only.

Tensors that share storage in the model (GPT-2's and Qwen's tied unembedding, BERT's decoder bias)
are written once and recorded as aliases.  Where each piece lives is the families table's
(``lm_head``, ``lm_head_new``, ``final_norm``).  The manifest's ``lm_head`` entry names the file, its
sha256 and the head; ``load_stored_head`` rebuilds the same modules from the export's own
``config.json`` (every other weight stays on the meta device) and refuses a file that changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerscope.errors import ExportError, ManifestError
from layerscope.model.manifest_type import Manifest

HEAD_FILE = "lm_head.safetensors"

MLM = "mlm-head"
CAUSAL = "causal-lm-head"
TIED = "tied-word-embeddings"

def describe(kind: str, family, num_layers: int, reason: str = "", parts: dict[str, Any] | None = None) -> str:
    """One sentence on how tokens are decoded; ``parts`` (``head_parts``) names the norm and head modules."""
    if kind == CAUSAL:
        paths = tuple(parts["paths"]) if parts else ()
        norm = (f"final norm on layers 0..{num_layers - 1} (layer {num_layers} already has it)"
                if parts is None or parts["norm"] is not None else "no final norm (every layer is read as it is)")
        head = f"{', '.join(paths[:-1])}, then the unembedding" if len(paths) > 1 else "the unembedding"
        return f"the model's own causal-LM head ({family.lm_head_loader}): {norm}, then {head}"
    if kind == MLM:
        return (f"the model's own masked-LM head ({family.lm_head_loader}, with its trained transform), "
                "applied to every layer's hidden states as they are")
    return (f"no trained LM head: {reason}, so tokens are decoded with the tied word-embedding matrix "
            "(logits = h @ E^T, no bias, no extra norm); ranks are meaningful, probabilities are uncalibrated")


def head_parts(net, family, num_layers: int, *, anatomy=None) -> dict[str, Any]:
    """The modules of a loaded ``*-with-head`` model that decode: kind, head, norm, word embeddings.

    ``anatomy``: where they are, as the export recorded it (``manifest.anatomy``: the head's modules, the final
    norm and what the head reads); None: found on the model here (model/anatomy.py, or the families table where
    it names them) and held to a forward pass (only on a model with real weights), which also puts the head's
    modules in the order the model calls them."""
    import torch

    from layerscope.model.anatomy_head import base_attribute, check_head_input, final_norm_path, head_paths

    if anatomy is not None and anatomy.head:
        paths, norm_path, reads = tuple(anatomy.head), anatomy.head_norm, anatomy.head_reads
        below, on_last, max_abs, prefix = anatomy.norm_below_last, anatomy.norm_on_last, None, anatomy.base_prefix
    else:
        paths = head_paths(net, family, deberta_new=_new_head(net, family))
        if not paths:
            raise ManifestError(f"the {family.name} model has no LM head module (get_output_embeddings() is None)")
        norm_path = final_norm_path(net, family)
        vocab = int(getattr(net.config.get_text_config(), "vocab_size", 2) or 2)
        ids = torch.arange(1, 9).clamp(max=vocab - 1).unsqueeze(0)
        checked = check_head_input(net, paths, norm_path, ids)
        on_last, paths, max_abs = bool(checked["final_norm_on_last"]), checked["paths"], checked["max_abs"]
        reads = "final_norm" if on_last else "layer"
        # the head reads normed states: below L through the final norm, where layer L has it (decoders) or
        # where the head's own input is the norm of layer L (ModernBERT); post-LayerNorm encoders read every
        # layer as it is
        below = norm_path is not None and (family.kind == "decoder" or on_last)
        prefix = base_attribute(net)
    mods = [net.get_submodule(p) for p in paths]
    head = mods[0] if len(mods) == 1 else torch.nn.Sequential(*mods)
    norm = net.get_submodule(norm_path) if norm_path and below else None
    kind = CAUSAL if family.kind == "decoder" else MLM
    return {"kind": kind, "head": head, "norm": norm, "word_embeddings": net.get_input_embeddings(),
            "deberta_new": takes_embeddings(mods[0]), "prefixes": [p for p in (*paths, norm_path) if p],
            "norm_below_last": norm is not None, "norm_on_last": norm is not None and on_last,
            "paths": paths, "norm_path": norm_path if norm is not None else None, "reads": reads,
            "max_abs": max_abs, "base_prefix": prefix}


def _new_head(net, family) -> bool:
    """Whether ``net`` keeps the family's other head (``lm_head_new``: DeBERTa-v2 without ``legacy``): the
    table's usual head is not a module of this checkpoint's class and the other one is."""
    def present(paths) -> bool:
        if not paths:
            return False
        try:
            for path in paths:
                net.get_submodule(path)
        except AttributeError:
            return False
        return True

    return not present(family.lm_head) and present(family.lm_head_new)


def takes_embeddings(head) -> bool:
    """Whether a head module is called with the word embeddings beside the states (DeBERTa-v2's new head)."""
    import inspect

    params = [p for p in inspect.signature(head.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) >= 2


def _module_name(net, module) -> str:
    for name, mod in net.named_modules():
        if mod is module:
            return name
    raise ManifestError("the word-embedding module is not part of the model")  # pragma: no cover


def _collect(net, prefixes: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """State-dict entries under ``prefixes``: (tensors written once, {alias: the name written})."""
    state = net.state_dict()
    tensors: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[int, tuple[int, ...]], str] = {}
    for name, tensor in state.items():
        if not any(name == p or name.startswith(p + ".") for p in prefixes):
            continue
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        t = tensor.detach()
        # the head is kept in fp32 whatever the checkpoint's dtype (bf16 and fp16 widen exactly)
        tensors[name] = (t.float() if t.is_floating_point() else t).contiguous()
    return tensors, aliases


def save_head(source, family, num_layers: int, out_dir: Path, *, trust_remote_code: bool = False,
              config=None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Write ``lm_head.safetensors`` into ``out_dir``; return the manifest's ``lm_head`` entry and the head's
    part of the anatomy (``model/anatomy.py`` ``with_head``'s arguments; None where the model has no trained
    head: the tied word embeddings decode)."""
    import gc

    from safetensors.torch import save_file

    from layerscope.hashing import file_sha256
    from layerscope.model.source import load_torch_model

    missing: tuple[str, ...] = ()
    net = None
    facts = None
    if family.lm_head_loader:
        # in the checkpoint's own dtype: only the head is kept (widened to fp32), so a bf16 3B model costs
        # 6 GB here instead of 12 (its fp32 load next to the export's leftovers ran a 24 GiB machine out of memory)
        net, info = load_torch_model(source, family, trust_remote_code=trust_remote_code, with_head=True,
                                     output_loading_info=True, dtype="auto", config=config)
        prefix = net.base_model_prefix
        missing = tuple(k for k in info.get("missing_keys", []) if not k.startswith(prefix + "."))
        if not missing:
            try:
                parts = head_parts(net, family, num_layers)
            except (ExportError, ManifestError) as exc:  # the head cannot be located or does not read the layers
                missing, reason = (), f"its LM head cannot be used ({exc})"
                parts = None
            if parts is not None:
                prefixes = parts["prefixes"] + [_module_name(net, parts["word_embeddings"])]
                kind, loader = parts["kind"], family.lm_head_loader
                desc = describe(kind, family, num_layers, parts=parts)
                norm_on_last, norm_below = parts["norm_on_last"], parts["norm_below_last"]
                head_modules = parts["paths"]
                facts = {"base_prefix": parts["base_prefix"], "head": tuple(parts["paths"]),
                         "head_reads": parts["reads"], "max_abs": parts["max_abs"]}
            else:
                net = None
        else:
            reason = (f"the checkpoint has no LM-head weights ({len(missing)} missing, e.g. {missing[0]}); "
                      "transformers would have initialized them at random")
    else:
        reason = f"the {family.name} family has no LM head layerscope can load"
        net = None
    if net is None or missing:
        norm_on_last = norm_below = False
        head_modules = ()
        del net
        gc.collect()
        net = load_torch_model(source, family, trust_remote_code=trust_remote_code, dtype="auto", config=config)
        prefixes = [_module_name(net, net.get_input_embeddings())]
        kind, loader, desc = TIED, None, describe(TIED, family, num_layers, reason)
    tensors, aliases = _collect(net, prefixes)
    path = Path(out_dir) / HEAD_FILE
    save_file(tensors, str(path))
    from layerscope.atomic import as_umask_allows

    as_umask_allows(path)  # safetensors writes 0600; the export is shared like every other file
    entry = {"file": HEAD_FILE, "sha256": file_sha256(path), "bytes": path.stat().st_size, "kind": kind,
             "description": desc, "final_norm_below_last": bool(norm_below),
             "final_norm_on_last": bool(norm_on_last), "head_modules": list(head_modules),
             "missing_head_weights": list(missing), "loader": loader, "tensors": sorted(tensors),
             "aliases": aliases, "embedding": prefixes[-1] + ".weight"}
    del net, tensors
    gc.collect()
    return entry, facts


def _head_anatomy(net, family, manifest: Manifest):
    """Where the head's modules, the final norm and the head's input are: the manifest's anatomy; an export
    whose record names no head modules (made before it named them) finds them on ``net`` by the same rule."""
    from dataclasses import replace

    from layerscope.model.anatomy_head import base_attribute, head_paths

    anatomy = manifest.anatomy
    if anatomy is None:
        raise ManifestError(f"the manifest of {manifest.source.label} records no anatomy and none can be derived "
                            "from its files; export it again into a new folder")
    if anatomy.head:
        return anatomy
    paths = head_paths(net, family, deberta_new=_new_head(net, family))
    if not paths:
        raise ManifestError(f"the {family.name} model has no LM head module (get_output_embeddings() is None)")
    reads = "final_norm" if (manifest.lm_head or {}).get("final_norm_on_last") else "layer"
    return replace(anatomy, base_prefix=base_attribute(net), head=tuple(paths), head_reads=reads)


def load_stored_head(export_dir: Path, manifest: Manifest) -> dict[str, Any] | None:
    """The head parts rebuilt from the export alone, or None when the export keeps no head."""
    entry = manifest.lm_head
    if not entry:
        return None
    import torch
    from safetensors.torch import load_file

    from layerscope.hashing import file_sha256
    from layerscope.model.families import family_of
    from layerscope.model.manifest_check import member
    from layerscope.model.source import _loader_class

    path = member(Path(export_dir), entry.get("file"), "lm_head file")
    if not path.is_file() or file_sha256(path) != entry.get("sha256"):
        raise ManifestError(f"{path} is missing or does not match its sha256 in the manifest (changed after "
                            "export); export it again into a new folder (--force replaces only files layerscope recorded, unchanged)")
    tensors = load_file(str(path))
    family = family_of(manifest)
    num_layers = manifest.num_layers
    if entry["kind"] == TIED:
        weight = tensors[entry["embedding"]]
        emb = torch.nn.Embedding(weight.shape[0], weight.shape[1], _weight=weight)
        return {"kind": TIED, "head": None, "norm": None, "word_embeddings": emb, "deberta_new": False}
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(export_dir))
    with torch.device("meta"):
        net = _loader_class(entry["loader"]).from_config(config, attn_implementation="eager")
    net.load_state_dict(tensors, strict=False, assign=True)
    params = dict(net.named_parameters(remove_duplicate=False))
    for alias, name in entry.get("aliases", {}).items():
        owner, _, attr = alias.rpartition(".")
        target = params.get(name)
        if target is None:
            raise ManifestError(f"{path.name} names an alias {alias} of {name}, which it does not hold")
        setattr(net.get_submodule(owner), attr, target)
    net.eval()
    parts = head_parts(net, family, num_layers, anatomy=_head_anatomy(net, family, manifest))
    for what in ("head", "norm", "word_embeddings"):
        mod = parts[what]
        # its weights and persistent buffers (Gemma's embed_scale is a non-persistent buffer the lens never reads)
        if mod is not None and any(t.is_meta for t in mod.state_dict(keep_vars=True).values()):
            raise ManifestError(f"{path.name} lacks some weights of the head's {what}; export it again into a new folder (--force replaces only files layerscope recorded, unchanged)")
    # decoding reads only the embedding matrix: a plain Embedding of it, so no buffer left on the meta device
    # (Gemma's scale) goes with it
    parts["word_embeddings"] = torch.nn.Embedding.from_pretrained(parts["word_embeddings"].weight, freeze=True)
    return parts
