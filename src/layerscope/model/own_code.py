"""A model's own code (``auto_map``) that an export ran, and the flag every later load of that model needs.

An export made with ``--trust-remote-code`` records the classes of the model's own code it ran
(``source.own_code`` in its manifest; a type only that code defines is ``family_from_code`` as well), whatever the
model type: a jina-bert-style 'bert' with its own ``modeling_*.py`` is as much the code's as nomic-bert's own type.
Loading that model again in PyTorch without the user's flag would load transformers' built-in class instead and
compute other vectors under the export's identity, so every such load is refused in one line naming the flag:
``require_code`` in the loaders themselves (a ``ModelSource`` made from a manifest carries ``own_code``), and
``require_code_flag`` at the doors, before any work (a PyTorch engine, an extraction in process, ``--shard`` or
Ray, a variant's reference, the bench). ONNX Runtime and OpenVINO run the exported graph: no code of the model's.
"""

from __future__ import annotations

def own_code(auto_map, tokenizer: str | None, trust_remote_code: bool) -> list[str]:
    """The classes of the model's own code that loading it with ``trust_remote_code`` runs, as
    ``"AutoModel = modeling_x.Cls"``: config.json's ``auto_map`` and the tokenizer class tokenizer_config.json
    names (``tokenizer``); [] without the flag."""
    if not trust_remote_code:
        return []
    found = [f"{k} = {v}" for k, v in sorted(auto_map.items())] if isinstance(auto_map, dict) else []
    return found + ([f"AutoTokenizer = {tokenizer}"] if tokenizer else [])


def code_line(spec: str, classes, doing: str = "loading the model in PyTorch") -> str:
    """The one line that says a model's own code is needed and the user did not pass --trust-remote-code."""
    shown = ", ".join(classes) if classes else "auto_map"
    return (f"{spec} was exported with the model's own code ({shown}); {doing} runs that code, which runs only with "
            "--trust-remote-code: pass it if you trust that code (none of it ran)")


def require_code(source, trust_remote_code: bool, doing: str = "loading the model in PyTorch") -> None:
    """One line where ``source`` (a ``ModelSource``) is the model of an export that ran the model's own code and
    the user did not pass --trust-remote-code: its built-in transformers class would compute other vectors under
    its identity."""
    if source.own_code and not trust_remote_code:
        from layerscope.errors import InputError

        raise InputError(code_line(source.spec, source.own_code, doing))


def require_code_flag(manifest, spec: str, trust_remote_code: bool, doing: str) -> None:
    """``require_code`` of a manifest (``Manifest.needs_code``), before any work of a command that will load the
    model in PyTorch (a PyTorch engine, a variant's reference, the bench's rows)."""
    if manifest.needs_code and not trust_remote_code:
        from layerscope.errors import InputError

        raise InputError(code_line(spec, manifest.needs_code, doing))
