"""Where a loaded model keeps its decoding pieces: the LM head's modules, the final norm by name, the module
that projects the last layer to another width, the with-head model's base; and the check that the head reads
what the lens will feed it.

* the LM head: ``get_output_embeddings()`` names the unembedding.  A decoder's head is that module; a
  masked-LM encoder's head is every module the with-head model adds to its base model, in the order they
  are registered (BERT's ``cls``; DistilBERT's transform, activation, norm and projector; ModernBERT's
  ``head`` and ``decoder``), loss modules left out.  The families table may name the paths instead.
* the final norm: the last module of the base model named like a final norm (``norm``, ``ln_f``,
  ``final_layer_norm``, ...) that is not inside a numbered block.
* the check (:func:`check_head_input`): the head's input, captured on a forward pass, must equal the last
  hidden state (the final norm is then applied below the last layer only) or the final norm of it (then at
  every layer: ModernBERT keeps its final norm out of its hidden states).  Anything else is an error, never
  a lens that silently decodes the wrong vectors.
"""

from __future__ import annotations

from typing import Any

from layerscope.errors import ExportError

FINAL_NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm", "ln_final")


def module_name(net, module) -> str | None:
    for name, mod in net.named_modules():
        if mod is module:
            return name
    return None


def head_paths(net, family, *, deberta_new: bool = False) -> tuple[str, ...]:
    """The module paths (on the with-head model) that map a hidden state to logits, applied in order."""
    import torch

    given = family.lm_head_new if deberta_new else family.lm_head
    if given:
        return tuple(given)
    out = net.get_output_embeddings()
    name = module_name(net, out) if out is not None else None
    if not name:
        return ()
    if family.kind == "decoder":
        projection = hidden_projection(net, family)
        return (module_name(net, projection), name) if projection is not None else (name,)
    prefix = net.base_model_prefix
    paths = tuple(n for n, m in net.named_children()
                  if n != prefix and not isinstance(m, torch.nn.modules.loss._Loss))
    if name.split(".")[0] not in paths:
        return ()
    return paths


def hidden_projection(net, family):
    """The module of a loaded model (base or with head) that projects the last layer to another width
    (the family's ``hidden_projection``), or None where this checkpoint has none (OPT of equal widths)."""
    if not family.hidden_projection:
        return None
    base = getattr(net, "base_model", net)
    try:
        return base.get_submodule(family.hidden_projection)
    except AttributeError:  # the path holds None: no projection in this checkpoint
        return None


def keep_layer_width(net, family) -> bool:
    """Make the last of ``net``'s hidden states the input of its ``hidden_projection`` (in place, by hooks
    that also run while tracing), so every layer has the hidden size; the model's other outputs stay as
    they are (the head still reads the projected state). False where there is no projection."""
    projection = hidden_projection(net, family)
    if projection is None:
        return False
    owner = net.get_submodule(module_name(net, projection).rpartition(".")[0])  # the stack that calls it
    seen: list = []

    def remember(module, args):
        seen[:] = [args[0]]

    def swap(module, args, output):
        states = getattr(output, "hidden_states", None)
        if states is not None and seen:
            output["hidden_states"] = (*states[:-1], seen[0])
        seen.clear()
        return output

    projection.register_forward_pre_hook(remember)
    owner.register_forward_hook(swap)
    return True


def final_norm_path(net, family) -> str | None:
    """The final norm of the base model by the naming rule (the table's ``final_norm`` first), or None."""
    if family.final_norm:
        return family.final_norm
    prefix = base_attribute(net)  # Gemma-3 names a base prefix it does not use
    base = getattr(net, prefix, None) if prefix else None
    if base is None:
        return None
    found = None
    for name, _ in base.named_modules():
        parts = name.split(".")
        if name and parts[-1] in FINAL_NORM_NAMES and not any(p.isdigit() for p in parts):
            found = name
    return f"{prefix}.{found}" if found else None


def check_head_input(net, paths: tuple[str, ...], norm_path: str | None, input_ids) -> dict[str, Any]:
    """Run ``net`` once; put the head modules in the order the forward pass calls them (``paths``: the ones
    it calls) and compare what the first receives with the last hidden state.

    Returns ``{"paths": tuple, "final_norm_on_last": bool, "max_abs": float}``: False when the last hidden
    state is the head's input as it is, True when the final norm of it is.  Raises ExportError otherwise."""
    import torch

    seen: list[tuple[str, Any]] = []
    hooks = [net.get_submodule(p).register_forward_pre_hook(
        lambda mod, args, p=p: seen.append((p, args[0].detach() if args else None))) for p in paths]
    try:
        with torch.inference_mode():
            out = net(input_ids=input_ids, output_hidden_states=True, return_dict=True)
    finally:
        for hook in hooks:
            hook.remove()
    order = tuple(dict.fromkeys(p for p, _ in seen))
    if not seen or seen[0][1] is None:
        raise ExportError(f"the LM head ({', '.join(paths)}) was not called by the model's forward pass")
    head_in = seen[0][1].float()
    last = out.hidden_states[-1].float()
    if head_in.shape != last.shape:
        raise ExportError(f"the LM head's input has shape {tuple(head_in.shape)} but the last hidden state "
                          f"{tuple(last.shape)}; this model's head cannot decode its layers")
    diff = float((head_in - last).abs().max())
    scale = 1e-4 * max(1.0, float(last.abs().max()))
    if diff <= scale:
        return {"paths": order, "final_norm_on_last": False, "max_abs": diff}
    if norm_path:
        with torch.inference_mode():
            normed = net.get_submodule(norm_path)(out.hidden_states[-1]).float()
        diff_norm = float((head_in - normed).abs().max())
        if diff_norm <= scale:
            return {"paths": order, "final_norm_on_last": True, "max_abs": diff_norm}
    raise ExportError(f"the LM head's input differs from the last hidden state by {diff:.3g}"
                      f"{' and from its final norm (' + norm_path + ')' if norm_path else ' and no final norm was found'}"
                      "; the lens cannot tell which vectors the head reads")



def base_attribute(net) -> str:
    """The attribute of a with-head model that holds its base model: ``base_model_prefix`` where it names
    one, else the child that has input embeddings of its own (Gemma-3 names a prefix it does not use)."""
    prefix = getattr(net, "base_model_prefix", "") or ""
    if prefix and hasattr(net, prefix) and getattr(net, prefix) is not net:
        return prefix
    for name, child in net.named_children():
        if callable(getattr(child, "get_input_embeddings", None)):
            return name
    return ""
