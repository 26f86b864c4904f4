"""A sentence-transformers checkpoint's own embedding recipe, read from its files.

sentence-transformers describes a model as a list of modules (``modules.json``):
a Transformer, a Pooling (``1_Pooling/config.json``), often a Normalize, and in
``config_sentence_transformers.json`` the prompts and the similarity function.
``read_st_config`` turns those files into a small dict kept in the manifest;
the ``st`` pooling then means "this model's own embedding": one of the existing
poolings of the chosen layer, L2-normalized when the checkpoint says so.  A
checkpoint whose recipe layerscope cannot reproduce exactly (a Dense layer, a
concatenation of poolings, weighted mean ...) gets ``supported: false`` and the
reason, so asking for ``st`` is one clear error rather than a silently different
vector.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerscope.errors import InputError

if TYPE_CHECKING:
    from layerscope.model.manifest_type import Manifest

# sentence-transformers pooling mode -> our pooling name
ST_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last", "max": "max"}
_LEGACY = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
           "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
           "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def _read_json(root: Path, name: str) -> Any:
    from layerscope.jsonfile import JsonFileError, read_json

    path = root / name
    if not os.path.lexists(path):
        return None
    try:
        return read_json(path)  # bounded; a FIFO or a device is one line, never waited on
    except FileNotFoundError:
        return None  # a dangling link: as if absent
    except JsonFileError as exc:
        raise InputError(f"{exc}; fix or remove it") from None
    except OSError as exc:
        raise InputError(f"{path} cannot be read ({exc.strerror or exc}); fix or remove it") from None


def _inside(root: Path, sub: str) -> Path:
    """A module folder named in modules.json, refused if it points outside the checkpoint."""
    target = (root / sub).resolve()
    if target != root.resolve() and root.resolve() not in target.parents:
        raise InputError(f"modules.json of {root} names a module path outside the checkpoint: {sub!r}")
    return target


def _pooling_modes(cfg: dict[str, Any]) -> tuple[list[str], bool]:
    if "pooling_mode" in cfg:
        mode = cfg["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        modes = [m for key, m in _LEGACY.items() if cfg.get(key)] or ["mean"]
    return modes, bool(cfg.get("include_prompt", True))


def read_st_config(model_dir: str | Path) -> dict[str, Any] | None:
    """The checkpoint's embedding recipe, or None when ``model_dir`` is not a sentence-transformers model."""
    root = Path(model_dir)
    modules = _read_json(root, "modules.json")
    if not isinstance(modules, list):
        return None
    extra = _read_json(root, "config_sentence_transformers.json") or {}
    out: dict[str, Any] = {
        "modules": [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules],
        "pooling": None, "normalize": False, "include_prompt": True,
        "prompts": {str(k): str(v) for k, v in (extra.get("prompts") or {}).items()},
        "default_prompt_name": extra.get("default_prompt_name"),
        "similarity_fn_name": extra.get("similarity_fn_name") or "cosine",
        "supported": True, "reason": "",
    }
    problems = []
    for module, kind in zip(modules, out["modules"]):
        if kind == "Transformer":
            if module.get("path") not in ("", None, "."):
                problems.append("its Transformer module is not at the checkpoint root")
        elif kind == "Pooling":
            cfg = _read_json(_inside(root, str(module.get("path", ""))), "config.json") or {}
            modes, include_prompt = _pooling_modes(cfg)
            out["include_prompt"] = include_prompt
            if len(modes) != 1 or modes[0] not in ST_MODES:
                problems.append(f"its pooling {'+'.join(modes)} has no layerscope equivalent "
                                f"(supported: {', '.join(ST_MODES)})")
            else:
                out["pooling"] = ST_MODES[modes[0]]
        elif kind == "Normalize":
            out["normalize"] = True
        else:
            problems.append(f"its {kind or 'unnamed'} module is not reproduced by layerscope")
    if out["pooling"] is None and not problems:
        problems.append("it has no Pooling module")
    if not out["include_prompt"] and out["prompts"]:
        problems.append("its pooling excludes prompt tokens (include_prompt=false)")
    if problems:
        out["supported"], out["reason"] = False, "; ".join(problems)
    return out


def st_recipe(manifest: Manifest) -> dict[str, Any]:
    """The manifest's recipe for the ``st`` pooling, or a clear error when there is none."""
    if not manifest.records_st:
        raise InputError("pooling 'st' needs the export to record the checkpoint's sentence-transformers "
                         "modules, and this export was made before layerscope did: export it again into a new folder")
    st = manifest.sentence_transformers
    if not st:
        raise InputError("pooling 'st' needs a sentence-transformers checkpoint (modules.json with a Pooling "
                         "module); this model has none: use mean, cls or last")
    if not st.get("supported"):
        raise InputError(f"pooling 'st' cannot reproduce this checkpoint: {st.get('reason')}; "
                         "use mean, cls or last")
    return st


def st_layers(anatomy, num_layers: int, layers: list[str], poolings: list[str], *,
              carried: bool = True) -> tuple[list[str], int | None]:
    """(the layers an engine runs, the row of ``st`` that reads the model's own last hidden state or None).

    ``st`` is the checkpoint's own embedding: at the last layer it pools what the model returns as its token
    embeddings (what sentence-transformers pools), which for a model whose anatomy says that is not layer L
    (ModernBERT, CLIP's text tower: their final norm comes after it) is ``OWN_LAST``, run as one more layer,
    last.  ``carried``: whether the engine can give it (an export made before it was carried cannot: one line)."""
    from layerscope.vocab.outputs import OWN_LAST
    from layerscope.vocab.pooling import ST

    top = str(num_layers)
    if ST not in poolings or top not in layers or anatomy is None or not anatomy.own_last_differs:
        return list(layers), None
    if anatomy.last_hidden_state == "projection":
        raise InputError(f"pooling 'st' at layer {top}: this model's own embedding is {anatomy.hidden_projection} of "
                         f"layer {top}, at another width than the layers; use mean, cls or last")
    if not carried:
        raise InputError(f"pooling 'st' at layer {top} pools the model's own last hidden state (the final norm of "
                         f"layer {top}), which this export lacks (made before layerscope carried it): export the model "
                         "again into a new folder")
    return [*layers, OWN_LAST], list(layers).index(top)


def pooling_words(pooling: str, manifest: Manifest | None) -> str:
    """A pooling named for a reader: ``st`` says which recipe it is (``st: the checkpoint's own recipe, mean
    pooling + normalize``); the other poolings are their own description."""
    st = (manifest.sentence_transformers if manifest is not None else None) or {}
    if pooling != "st" or not st.get("pooling"):
        return pooling
    return (f"st: the checkpoint's own recipe, {st['pooling']} pooling"
            f"{' + normalize' if st.get('normalize') else ''}")


def resolve_prompt(manifest: Manifest, prompt_name: str | None = None, prompt: str | None = None) -> str:
    """The text put before every input, as sentence-transformers' ``encode`` chooses it.

    An explicit ``prompt`` wins; else ``prompt_name`` from the checkpoint's prompts; else the
    checkpoint's ``default_prompt_name``; else nothing.
    """
    if prompt is not None:
        return prompt
    prompts = manifest.st_prompts
    name = prompt_name if prompt_name is not None else (manifest.sentence_transformers or {}).get("default_prompt_name")
    if name is None:
        return ""
    if name not in prompts:
        have = ", ".join(prompts) or "none"
        raise InputError(f"prompt name '{name}' is not one of this model's prompts ({have}); "
                         "use --prompt TEXT for your own")
    return prompts[name]
