"""The tuned lens (Belrose et al. 2023, arXiv 2303.08112): one affine translator per layer, in tuned-lens's own files.

Translator ``i`` maps layer ``i``'s hidden state ``h`` to ``h + W_i h + b_i`` (the residual form tuned-lens uses, so
that zero weights are the identity and weight decay pulls towards it); the model's own head then decodes it (the
final norm first, on the layers below the last, exactly as the logit lens does: decoding/heads.py). Layer ``L`` is
the model's output itself and has no translator, so a lens of an ``L``-layer model holds ``L`` translators, for
layers ``0..L-1``.

A lens is a folder in the layout tuned-lens 0.2 saves (``TunedLens.save``) and loads
(``TunedLens.from_model_and_pretrained(model, folder)``)::

    config.json   tuned-lens's TunedLensConfig: base_model_name_or_path, d_model, num_hidden_layers, bias,
                  base_model_revision, unembed_hash, lens_type ("linear_tuned_lens")
    params.pt     torch.save of the translators' state dict: "{i}.weight" [d, d] and "{i}.bias" [d], i < L
    lens.json     (layerscope's, where it trained the lens) what it was trained from and how:
                  decoding/tuned_record.py
    params.safetensors  (layerscope's, beside lens.json) the same tensors as safetensors

A lens layerscope trained is read back from ``params.safetensors`` (its sha256 and params.pt's held to
lens.json's), so reading our own lenses never touches a pickle; ``params.pt`` is written for tuned-lens, and
read only from a folder tuned-lens saved (no lens.json).

``params.pt`` is a torch zip archive whose ``data.pkl`` is a pickle. It is never unpickled with pickle's full
power: :func:`read_params` first lists the pickle's opcodes with ``pickletools.genops`` (which decodes, never
executes) and refuses any global beyond the handful a state dict of tensors names (``collections.OrderedDict``,
``torch._utils._rebuild_tensor_v2`` and ``_rebuild_parameter``, the float storages) and any opcode that builds
other objects; only then does ``torch.load(weights_only=True)`` read it. That flag is passed explicitly, so
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn it off (torch 2.13 honours that variable only where the caller
left the flag out), and torch's restricted unpickler (torch/_weights_only_unpickler.py) builds only tensors,
storages, dtypes and the allow-listed containers, never calling a constructor the file names; our own list is the
narrower of the two, so a global a process added with ``torch.serialization.add_safe_globals`` is still refused.
"""

from __future__ import annotations

import math
import pickletools
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import InputError

LENS_TYPE = "linear_tuned_lens"
CONFIG, PARAMS, OWN_PARAMS = "config.json", "params.pt", "params.safetensors"
PICKLE_BYTES = 1 << 24  # data.pkl of a state dict is a few KB per layer; a larger one is not a lens's
_GLOBALS = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
            ("torch._utils", "_rebuild_parameter"), ("torch", "FloatStorage"), ("torch", "HalfStorage"),
            ("torch", "BFloat16Storage"), ("torch", "DoubleStorage")}
_OBJECT_OPS = {"STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4", "PERSID"}


@dataclass(frozen=True)
class LensConfig:
    """tuned-lens's ``config.json`` (its ``TunedLensConfig``), typed; keys it does not know are left out on read,
    as tuned-lens itself does."""

    base_model_name_or_path: str
    d_model: int
    num_hidden_layers: int
    bias: bool = True
    base_model_revision: str | None = None
    unembed_hash: str | None = None
    lens_type: str = LENS_TYPE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def read(cls, doc: Any, where: str) -> LensConfig:
        if not isinstance(doc, dict):
            raise InputError(f"{where} holds a JSON {type(doc).__name__}, not tuned-lens's config object")

        def need(key: str, kind, optional: bool = False):
            value = doc.get(key)
            if value is None and optional:
                return None
            if value is None or (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
                raise InputError(f"{where}: {key} is {'missing' if value is None else repr(value)}, not a "
                                 f"{kind.__name__}; this is not a tuned-lens config.json")
            return value

        made = cls(base_model_name_or_path=need("base_model_name_or_path", str), d_model=need("d_model", int),
                   num_hidden_layers=need("num_hidden_layers", int),
                   bias=True if doc.get("bias") is None else need("bias", bool),
                   base_model_revision=need("base_model_revision", str, True),
                   unembed_hash=need("unembed_hash", str, True),
                   lens_type=LENS_TYPE if doc.get("lens_type") is None else need("lens_type", str))
        if made.lens_type != LENS_TYPE:
            raise InputError(f"{where}: lens_type {made.lens_type!r} is not {LENS_TYPE!r}, the only lens this "
                             "reads (one affine translator per layer)")
        if made.d_model < 1 or made.num_hidden_layers < 1:
            raise InputError(f"{where}: d_model {made.d_model} and num_hidden_layers {made.num_hidden_layers} "
                             "must both be at least 1")
        return made


@dataclass(frozen=True)
class Translators:
    """Every layer's translator as ``torch.nn.Linear`` holds it: ``weight`` float32 ``[L, d, d]`` (out, in) and
    ``bias`` float32 ``[L, d]`` (None: a lens made without biases)."""

    weight: np.ndarray
    bias: np.ndarray | None

    @property
    def layers(self) -> int:
        return int(self.weight.shape[0])

    @property
    def width(self) -> int:
        return int(self.weight.shape[-1])

    @classmethod
    def identity(cls, layers: int, width: int, bias: bool = True) -> Translators:
        """Zero weights and biases: every translator the identity (tuned-lens's initialisation)."""
        return cls(np.zeros((layers, width, width), np.float32), np.zeros((layers, width), np.float32) if bias else None)

    def apply(self, h: np.ndarray, layer: int) -> np.ndarray:
        """``h + h W^T + b`` of layer ``layer`` (< L) in numpy, float64 (the reference the tests read)."""
        h = np.asarray(h, dtype=np.float64)
        out = h + h @ self.weight[layer].astype(np.float64).T
        return out + self.bias[layer] if self.bias is not None else out

    def state_dict(self):
        """The translators as tuned-lens's ``layer_translators.state_dict()`` names them."""
        from collections import OrderedDict

        import torch

        out = OrderedDict()
        for i in range(self.layers):
            out[f"{i}.weight"] = torch.from_numpy(np.ascontiguousarray(self.weight[i], dtype=np.float32)).clone()
            if self.bias is not None:
                out[f"{i}.bias"] = torch.from_numpy(np.ascontiguousarray(self.bias[i], dtype=np.float32)).clone()
        return out


@dataclass(frozen=True)
class TunedLens:
    """A lens folder, read: its config, its translators, ``params_sha256`` (the translators' identity: graphs and
    results made from them key on it) and, where layerscope trained it, its training record."""

    path: Path
    config: LensConfig
    translators: Translators
    params_sha256: str
    record: Any = None  # decoding/tuned_record.py TrainRecord, or None (a lens tuned-lens saved)

    def check_fits(self, manifest, *, unembedding_hash: str | None = None) -> None:
        """One line where this lens cannot decode the model of ``manifest`` (:func:`check_fits`)."""
        check_fits(self.path, self.config, self.record, manifest, unembedding_hash=unembedding_hash)


def check_fits(path, config: LensConfig, record, manifest, *, unembedding_hash: str | None = None) -> None:
    """One line where the lens at ``path`` (its ``config`` and, where layerscope trained it, its ``record``)
    cannot decode the model of ``manifest``: another width or layer count, a lens trained for another
    unembedding (tuned-lens's ``unembed_hash``, where ``unembedding_hash`` is known) or for other weights."""
    fits_model(config, manifest, f"the tuned lens {path}")
    if unembedding_hash and config.unembed_hash and unembedding_hash != config.unembed_hash:
        raise InputError(f"the tuned lens {path} was trained for another unembedding (its config.json's "
                         f"unembed_hash differs from this model's): it decodes another model; train one for "
                         "this model (layerscope train-lens)")
    if record is not None and record.model_key and record.model_key != manifest.key:
        raise InputError(f"the tuned lens {path} was trained on {record.model} (other weights than "
                         f"{manifest.source.spec or manifest.source.path_or_id}); train one for this model")


def read_header(path: str | Path) -> tuple[LensConfig, Any]:
    """A lens folder's ``config.json`` and, where there is one, layerscope's ``lens.json``, without its
    translators: what says whether the lens fits a model."""
    from layerscope.decoding.tuned_record import RECORD, TrainRecord

    path = Path(path)
    if not (path / CONFIG).is_file():
        raise InputError(f"{path} has no {CONFIG}; a tuned lens folder holds {CONFIG} and {PARAMS}")
    config = LensConfig.read(_json(path / CONFIG), str(path / CONFIG))
    return config, TrainRecord.from_disk(path / RECORD) if (path / RECORD).is_file() else None


def fits_model(config: LensConfig, manifest, what: str) -> None:
    """One line where a lens of ``config`` is of another width or layer count than ``manifest``'s model."""
    if config.d_model != int(manifest.hidden_size):
        raise InputError(f"{what} is {config.d_model} wide, the model's layers are {manifest.hidden_size}: it was "
                         "made for another model")
    if config.num_hidden_layers != int(manifest.num_layers):
        raise InputError(f"{what} has translators for {config.num_hidden_layers} layers, the model has "
                         f"{manifest.num_layers}: it was made for another model")


def unembedding_hash(weight: np.ndarray) -> str:
    """tuned-lens's ``unembed_hash`` of an unembedding matrix (its ``utils.tensor_hash``: the sha256 of numpy's
    one-decimal printout of the float32 matrix), under numpy's default print options, which tuned-lens runs
    under unless a user changed them."""
    import hashlib

    defaults = dict(precision=8, threshold=1000, edgeitems=3, linewidth=75, suppress=False, nanstr="nan",
                    infstr="inf", sign="-", floatmode="maxprec", legacy=False)
    with np.printoptions(**defaults):
        text = np.array_str(np.asarray(weight, dtype=np.float32), precision=1)
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------- reading

def read_lens(path: str | Path) -> TunedLens:
    """The lens folder at ``path`` (tuned-lens's layout, or layerscope's, which adds ``lens.json``), every file
    checked: one line naming what is wrong, before anything is decoded."""
    from layerscope.decoding.tuned_record import RECORD, TrainRecord
    from layerscope.hashing import file_sha256

    path = Path(path)
    if not path.is_dir():
        raise InputError(f"--tuned {path} is not a folder; give the folder a tuned lens was saved in "
                         f"({CONFIG} and {PARAMS}: layerscope train-lens, or tuned-lens's TunedLens.save)")
    for name in (CONFIG, PARAMS):
        if not (path / name).is_file():
            raise InputError(f"{path} has no {name}; a tuned lens folder holds {CONFIG} and {PARAMS}")
    config = LensConfig.read(_json(path / CONFIG), str(path / CONFIG))
    sha = file_sha256(path / PARAMS)
    record = TrainRecord.from_disk(path / RECORD) if (path / RECORD).is_file() else None
    if record is not None and record.params_sha256 != sha:
        raise InputError(f"{path / PARAMS} changed since layerscope trained it (its sha256 is not the one "
                         f"{RECORD} records); train it again, or delete {RECORD} to read it as a plain tuned-lens "
                         "lens")
    if record is not None and record.safetensors_sha256 is not None:
        own = path / OWN_PARAMS
        if not own.is_file() or file_sha256(own) != record.safetensors_sha256:
            raise InputError(f"{own} is missing or changed since layerscope trained the lens (its sha256 is not the "
                             f"one {RECORD} records); train it again, or delete {RECORD} and {OWN_PARAMS} to read "
                             "it as a plain tuned-lens lens")
        translators = read_own_params(own, config)
    else:
        translators = read_params(path / PARAMS, config)
    return TunedLens(path, config, translators, sha, record)


def _json(path: Path) -> Any:
    """The JSON in a lens's config: a regular file within the bound, read as such (jsonfile.py); one line else."""
    from layerscope.jsonfile import read_json

    try:
        return read_json(path, limit=PICKLE_BYTES, what="tuned lens config")
    except OSError as exc:
        raise InputError(f"{path} cannot be read as JSON ({str(exc)[:160]})") from None


def check_pickle(path: Path) -> None:
    """Refuse (one line) a ``params.pt`` that is not a torch zip archive whose pickle names only what a state
    dict of float tensors needs; nothing of it is executed here."""
    where = f"{path}"
    if not zipfile.is_zipfile(path):
        raise InputError(f"{where} is not a torch zip archive (torch.save's format since torch 1.6); save the "
                         "lens again with a recent torch")
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [i for i in archive.infolist() if i.filename.rsplit("/", 1)[-1] == "data.pkl"]
            if len(pickles) != 1:
                raise InputError(f"{where} holds {len(pickles)} data.pkl records, not one: not a torch.save file")
            if pickles[0].file_size > PICKLE_BYTES:
                raise InputError(f"{where}'s data.pkl is {pickles[0].file_size:,} bytes, more than a state dict "
                                 "of translators holds")
            data = archive.read(pickles[0])
    except (zipfile.BadZipFile, OSError) as exc:
        raise InputError(f"{where} cannot be read as a zip archive ({str(exc)[:160]})") from None
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                if (module, name) not in _GLOBALS:
                    raise InputError(f"{where} names {module}.{name}, which a state dict of tensors never does; "
                                     "refused unread (a lens holds translators' weights and biases only)")
            elif op.name in _OBJECT_OPS:
                raise InputError(f"{where} builds objects through the pickle opcode {op.name}, which a plain "
                                 "torch.save of tensors never uses; refused unread")
    except ValueError as exc:  # pickletools' word for a malformed pickle
        raise InputError(f"{where}'s data.pkl is not a well-formed pickle ({str(exc)[:160]})") from None


def read_params(path: Path, config: LensConfig) -> Translators:
    """The translators of ``params.pt`` (checked by :func:`check_pickle`, then read by
    ``torch.load(weights_only=True)``): exactly ``{i}.weight`` ``[d, d]`` (and ``{i}.bias`` ``[d]`` where
    ``config.bias``) for ``i < num_hidden_layers``, finite floats; float32 whatever they were saved in."""
    import torch

    check_pickle(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many untyped errors for a damaged archive
        raise InputError(f"{path} cannot be read as a state dict ({str(exc).splitlines()[0][:200]})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise InputError(f"{path} does not hold a state dict (names to tensors)")
    arrays = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise InputError(f"{path}: {name} is {type(t).__name__ if not isinstance(t, torch.Tensor) else t.dtype}, "
                             "not a float tensor")
        arrays[name] = t.detach().to(torch.float32).numpy()
    return _translators(path, arrays, config)


def read_own_params(path: Path, config: LensConfig) -> Translators:
    """The translators of the ``params.safetensors`` layerscope wrote beside params.pt, checked as
    :func:`read_params` checks tuned-lens's file."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{path} cannot be read as safetensors ({str(exc).splitlines()[0][:200]})") from None
    for name, a in arrays.items():
        if not np.issubdtype(a.dtype, np.floating):
            raise InputError(f"{path}: {name} is {a.dtype}, not a float tensor")
    return _translators(path, {k: np.asarray(v, np.float32) for k, v in arrays.items()}, config)


def _translators(path: Path, state: dict[str, np.ndarray], config: LensConfig) -> Translators:
    """Exactly ``{i}.weight`` ``[d, d]`` (and ``{i}.bias`` ``[d]`` where ``config.bias``) for ``i <
    num_hidden_layers``, finite float32; one line naming what differs."""
    layers, d = config.num_hidden_layers, config.d_model
    wanted = {f"{i}.weight": (d, d) for i in range(layers)}
    if config.bias:
        wanted.update({f"{i}.bias": (d,) for i in range(layers)})
    missing = sorted(set(wanted) - set(state), key=_layer_order)
    extra = sorted(set(state) - set(wanted), key=_layer_order)
    if missing or extra:
        said = (f"lacks {', '.join(missing[:3])}" if missing else "") + (" and " if missing and extra else "") + \
               (f"holds {', '.join(extra[:3])}" if extra else "")
        raise InputError(f"{path} {said}: config.json says {layers} translators of width {d}"
                         f"{' with biases' if config.bias else ' without biases'}; the files do not belong together")
    weight = np.zeros((layers, d, d), np.float32)
    bias = np.zeros((layers, d), np.float32) if config.bias else None
    for name, shape in wanted.items():
        values = state[name]
        if tuple(values.shape) != shape:
            raise InputError(f"{path}: {name} is {tuple(values.shape)}, not a float tensor of shape {shape} "
                             f"(width {d})")
        if not np.isfinite(values).all():
            raise InputError(f"{path}: {name} holds NaN or inf; the lens is damaged")
        i, kind = name.split(".")
        (weight if kind == "weight" else bias)[int(i)] = values
    return Translators(weight, bias)


def _layer_order(name: str) -> tuple[int, str]:
    head, _, tail = name.partition(".")
    return (int(head) if head.isdigit() else math.inf, tail)  # type: ignore[return-value]


# ---------------------------------------------------------------- writing

def write_lens(path: str | Path, translators: Translators, config: LensConfig, wrote=None) -> tuple[str, str]:
    """Write ``config.json`` and ``params.pt`` into ``path`` as tuned-lens's ``TunedLens.save`` does, and the same
    tensors as ``params.safetensors`` (each to a temporary sibling, then renamed); returns the sha256 of
    params.pt and of params.safetensors. ``wrote``: the ownership ``Recorder`` told each name before it is
    written."""
    import os

    import torch
    from safetensors.torch import save_file

    from layerscope.hashing import file_sha256
    from layerscope.jsonfile import write_json_atomic

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp, own_tmp = path / (PARAMS + ".tmp"), path / (OWN_PARAMS + ".tmp")
    if wrote is not None:
        wrote.add(CONFIG, PARAMS, tmp.name, OWN_PARAMS, own_tmp.name)
    state = translators.state_dict()
    torch.save(state, tmp)
    os.replace(tmp, path / PARAMS)
    save_file(dict(state), str(own_tmp))
    os.replace(own_tmp, path / OWN_PARAMS)
    write_json_atomic(path / CONFIG, config.to_dict())
    return file_sha256(path / PARAMS), file_sha256(path / OWN_PARAMS)


# ---------------------------------------------------------------- torch

def translated_head(head, translators: Translators, *, trainable: bool = False):
    """A module ``forward(h, layer) -> logits`` that runs layer ``layer``'s translator (for ``layer`` below the
    number of translators), then ``head`` (a ``DecodingHead``: ``head(h, layer)``). ``trainable``: the
    translators are parameters to train (the head stays frozen)."""
    import torch

    n, d = translators.layers, translators.width
    bias = translators.bias is not None

    class TranslatedHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = head
            self.translators = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=bias) for _ in range(n))
            with torch.no_grad():
                for i, t in enumerate(self.translators):
                    t.weight.copy_(torch.from_numpy(translators.weight[i]))
                    if bias:
                        t.bias.copy_(torch.from_numpy(translators.bias[i]))
            for p in self.head.parameters():
                p.requires_grad_(False)
            self.translators.requires_grad_(trainable)

        def forward(self, h, layer: int):
            if layer < n:
                h = h + self.translators[layer](h)
            return self.head(h, layer)

        def translators_now(self) -> Translators:
            w = np.stack([t.weight.detach().cpu().numpy() for t in self.translators]).astype(np.float32)
            b = (np.stack([t.bias.detach().cpu().numpy() for t in self.translators]).astype(np.float32)
                 if bias else None)
            return Translators(w, b)

    return TranslatedHead().eval()


def head_unembedding(model) -> np.ndarray | None:
    """The unembedding matrix of a ``DecodingModel``'s head (the last linear layer onto the vocabulary, as
    ``get_output_embeddings()`` names it), float32, for tuned-lens's ``unembed_hash``; None where it has none."""
    import torch

    found = None
    vocab = None
    module = getattr(model.head, "head", None)
    if module is None:
        return None
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            if vocab is None or m.out_features >= vocab:
                found, vocab = m, m.out_features
    return None if found is None else found.weight.detach().to(torch.float32).cpu().numpy()
