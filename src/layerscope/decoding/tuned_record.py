"""What layerscope records beside a tuned lens it trained (``lens.json``), and the recipe it trained it with.

``TrainSettings`` is the recipe (the paper's and tuned-lens 0.2's defaults: 250 steps of 2^18 tokens, SGD with
Nesterov momentum 0.9, learning rate 1.0 scaled by 1 - momentum, weight decay 1e-3, no warmup then a linear decay
to zero, gradients clipped to norm 1). ``TrainRecord`` is ``lens.json``: the model and store the lens was trained
from, the recipe, how far it got and its loss, and the sha256 of ``params.pt`` (a lens whose translators changed
since is refused, not silently read as trained). ``TrainRecord.from_disk`` checks every field and says in one
line which is missing or of the wrong type.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

RECORD = "lens.json"
RECORD_FORMAT = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class TrainSettings:
    """The training recipe (see the module docstring); every field is part of a checkpoint's identity."""

    steps: int = 250
    tokens_per_step: int = 2**18
    lr_scale: float = 1.0  # SGD's learning rate is lr_scale * (1 - momentum), as tuned-lens sets it
    momentum: float = 0.9
    weight_decay: float = 1e-3
    warmup_steps: int = 0
    clip_grad_norm: float = 1.0
    seed: int = 0

    def check(self) -> None:
        """One line for a setting that cannot train."""
        for name in ("steps", "tokens_per_step"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise InputError(f"--warmup-steps must be at least 0 and below --steps ({self.steps}), not "
                             f"{self.warmup_steps}")
        if not 0 <= self.momentum < 1:
            raise InputError(f"--momentum must be in [0, 1), not {self.momentum}")
        for name in ("lr_scale", "clip_grad_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"--{name.replace('_', '-')} must be a positive number, not {value}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise InputError(f"--weight-decay must be 0 or more, not {self.weight_decay}")

    @property
    def lr(self) -> float:
        """SGD's base learning rate: PyTorch's momentum scales steps by 1 / (1 - momentum), undone here."""
        return self.lr_scale * (1 - self.momentum)

    def lr_factor(self, step: int) -> float:
        """The learning rate's factor at ``step`` (0-based): transformers' linear schedule with warmup, given the
        arguments tuned-lens gives it (``num_training_steps = steps - warmup_steps``)."""
        warm, total = self.warmup_steps, self.steps - self.warmup_steps
        if step < warm:
            return step / max(1, warm)
        return max(0.0, (total - step) / max(1, total - warm))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def read(cls, doc: Any, where: str) -> TrainSettings:
        if not isinstance(doc, dict):
            raise _bad(where, "settings is not an object")
        values = {}
        for f in fields(cls):
            kind = int if f.type in ("int", int) else float
            value = doc.get(f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not
                                                                                  isinstance(value, int)):
                raise _bad(where, f"settings.{f.name} is {value!r}, not a number")
            values[f.name] = kind(value)
        return cls(**values)


@dataclass(frozen=True)
class TrainRecord:
    """``lens.json``: what a tuned lens layerscope trained was trained from, with what recipe, how far it got."""

    model: str  # the model as named
    model_key: str  # its weights identity (Manifest.key)
    family: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    head: str  # the decoding head's kind
    store: str  # the store's path when trained
    store_id: str | None
    corpus_sha256: str | None
    texts: int
    tokens: int  # token rows the store holds
    settings: TrainSettings
    steps_done: int
    tokens_seen: int
    seconds: float
    loss_first: tuple[float, ...]  # mean KL (nats) per layer at the first step
    loss_last: tuple[float, ...]  # ... at the last step
    loss_by_step: tuple[float, ...]  # mean KL over layers, per step
    params_sha256: str
    precision: str = "float32"
    format: int = RECORD_FORMAT
    safetensors_sha256: str | None = None  # params.safetensors, which layerscope reads its own lens from

    @property
    def tokens_per_second(self) -> float | None:
        return self.tokens_seen / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["settings"] = self.settings.to_dict()
        for key in ("loss_first", "loss_last", "loss_by_step"):
            out[key] = list(out[key])
        return out

    def to_disk(self, folder: str | Path) -> Path:
        from layerscope.jsonfile import write_json_atomic

        path = Path(folder) / RECORD
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def from_disk(cls, path: str | Path) -> TrainRecord:
        path = Path(path)
        where = str(path)
        from layerscope.jsonfile import read_json

        try:
            doc = read_json(path, limit=1 << 26, what="lens record")
        except (OSError, InputError) as exc:
            raise InputError(f"{where} cannot be read ({str(exc)[:160]}); train the lens again") from None
        if not isinstance(doc, dict):
            raise _bad(where, f"it holds a JSON {type(doc).__name__}, not an object")
        if doc.get("format") != RECORD_FORMAT:
            raise _bad(where, f"format {doc.get('format')!r} is not {RECORD_FORMAT}")

        def need(key, kind, optional=False):
            value = doc.get(key)
            if value is None and optional:
                return None
            if value is None or (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
                raise _bad(where, f"{key} is {'missing' if value is None else type(value).__name__}")
            return value

        def floats(key):
            value = need(key, list)
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                raise _bad(where, f"{key} is not a list of numbers")
            return tuple(float(v) for v in value)

        sha = need("params_sha256", str)
        if not _SHA256.fullmatch(sha):
            raise _bad(where, "params_sha256 is not a sha256")
        own = need("safetensors_sha256", str, True)
        if own is not None and not _SHA256.fullmatch(own):
            raise _bad(where, "safetensors_sha256 is not a sha256")
        return cls(model=need("model", str), model_key=need("model_key", str), family=need("family", str),
                   num_layers=need("num_layers", int), hidden_size=need("hidden_size", int),
                   vocab_size=need("vocab_size", int), head=need("head", str), store=need("store", str),
                   store_id=need("store_id", str, True), corpus_sha256=need("corpus_sha256", str, True),
                   texts=need("texts", int), tokens=need("tokens", int),
                   settings=TrainSettings.read(doc.get("settings"), where), steps_done=need("steps_done", int),
                   tokens_seen=need("tokens_seen", int), seconds=float(need("seconds", (int, float))),
                   loss_first=floats("loss_first"), loss_last=floats("loss_last"),
                   loss_by_step=floats("loss_by_step"), params_sha256=sha, precision=need("precision", str),
                   safetensors_sha256=own)


def _bad(where: str, why: str) -> InputError:
    return InputError(f"{where}: {why}; this lens record was edited or written by another version: train the "
                      "lens again (layerscope train-lens ... --force)")
