"""The lens graph's sidecar ``lens-k{k}.json``, typed: what ``layerscope export --lens-k`` (decoding/lens_onnx.py)
records beside ``lens-k{k}.onnx`` and what the lens analysis and ``layerscope verify`` read back.

``LensSidecar.from_disk(path)`` checks every field and says in one line (``ManifestError``) which field of which
file is missing or of the wrong type; the files it names (the graph, the head file it shares weights with) must be
plain names inside the export dir, so no path from the sidecar leads out of it. A sidecar of another format is
not read as this one (``from_disk`` returns None: the caller makes the graph again); ``checksum`` reads only the
graph's name and sha256, which every format records, for ``verify``. What the sidecar says is held to the graph,
the weights it reads (``content_sha256``) and the export's ``model.onnx`` before the graph is used (the rule of
model/derived.py, ``lens_problem``), else the graph is made again.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from layerscope.errors import LayerscopeError, ManifestError

LENS_FORMAT = 3  # the head-alone graph over runs of positions, with KL and the target's log-probability
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TUNED_ID = re.compile(r"[0-9a-f]{12}")


def graph_stem(k: int, tuned_id: str | None = None) -> str:
    """The lens graph's name without its suffix: ``lens-k{k}``, or ``lens-tuned-{id}-k{k}`` for a tuned lens's
    (``id``: the first 12 hex digits of its translators' sha256)."""
    if tuned_id is not None and not _TUNED_ID.fullmatch(tuned_id):
        raise ValueError(f"a tuned lens id is 12 hex digits, not {tuned_id!r}")
    return f"lens-k{int(k)}" if tuned_id is None else f"lens-tuned-{tuned_id}-k{int(k)}"


def sidecar_name(k: int, tuned_id: str | None = None) -> str:
    """The sidecar's file name for top-``k`` (beside ``lens-k{k}.onnx``, or a tuned lens's graph)."""
    return graph_stem(k, tuned_id) + ".json"


class _Bad(Exception):
    """A field that is not what layerscope writes (turned into one ManifestError line naming the file)."""


def _need(doc: dict[str, Any], key: str, kind, where: str = "") -> Any:
    value = doc.get(key)
    name = f"{where}{key}"
    if value is None:
        raise _Bad(f"{name} is missing")
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _Bad(f"{name} is {type(value).__name__}, not {wanted}")
    return value


def _number(doc: dict[str, Any], key: str, where: str) -> float:
    value = float(_need(doc, key, (int, float), where))
    if not math.isfinite(value):
        raise _Bad(f"{where}{key} is {value}, not a finite number")
    return value


def _plain_name(doc: dict[str, Any], key: str) -> str:
    """A file named by the sidecar: a plain name inside the export dir (no folder, no ``..``, not absolute)."""
    name = _need(doc, key, str)
    if not name or "\\" in name or "/" in name or name in (".", ".."):
        raise _Bad(f"{key} names {name!r}, which is not a plain file name inside the export dir")
    return name


@dataclass(frozen=True)
class LensHead:
    """What decodes each layer: the head's kind, a sentence about it, whether a final norm is applied below the
    last layer, and head weights the checkpoint lacked (decoding/heads.py ``HeadInfo``)."""

    kind: str
    description: str
    final_norm_below_last: bool
    missing_head_weights: tuple[str, ...] = ()

    @classmethod
    def read(cls, doc: Any) -> LensHead:
        if not isinstance(doc, dict):
            raise _Bad(f"head is {type(doc).__name__}, not an object")
        missing = doc.get("missing_head_weights") or []
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise _Bad("head.missing_head_weights is not a list of names")
        return cls(_need(doc, "kind", str, "head."), _need(doc, "description", str, "head."),
                   _need(doc, "final_norm_below_last", bool, "head."), tuple(missing))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "missing_head_weights": list(self.missing_head_weights)}


@dataclass(frozen=True)
class LensParity:
    """The lens graph against the torch computation on a padded batch (decoding/lens_onnx.py ``lens_parity``)."""

    rank_mismatch_fraction: float
    rank_tie_rel_tol: float
    rank_exact_mismatch_fraction: float
    top1_mismatch_fraction: float
    max_prob_diff: float
    reference_hidden_states: str  # where the hidden states compared came from (torch, or model.onnx on ORT)
    max_kl_diff: float  # largest difference of KL(final || layer), nats
    max_logprob_diff: float  # largest difference of the target's log-probability

    @classmethod
    def read(cls, doc: Any) -> LensParity:
        if not isinstance(doc, dict):
            raise _Bad(f"parity is {type(doc).__name__}, not an object")
        numbers = {f.name: _number(doc, f.name, "parity.") for f in fields(cls) if f.name != "reference_hidden_states"}
        return cls(**numbers, reference_hidden_states=_need(doc, "reference_hidden_states", str, "parity."))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TunedSource:
    """The tuned lens whose translators a graph holds: its ``params.pt``'s sha256 (the graph's identity: other
    translators make another graph), its translator count and width, and the folder it was read from (for
    people: the graph does not read it again)."""

    params_sha256: str
    layers: int
    width: int
    folder: str

    @property
    def id(self) -> str:
        return self.params_sha256[:12]

    @classmethod
    def read(cls, doc: Any) -> TunedSource:
        if not isinstance(doc, dict):
            raise _Bad(f"tuned is {type(doc).__name__}, not an object")
        return cls(_digest(doc, "params_sha256", "tuned."), _need(doc, "layers", int, "tuned."),
                   _need(doc, "width", int, "tuned."), _need(doc, "folder", str, "tuned."))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LensSidecar:
    """``lens-k{k}.json``: the graph's file and sha256, its format, ``k``, the head, the graph's outputs, the
    precision of its probabilities, the ``model.onnx`` it was made for, the bytes it shares with the stored head
    (and that head's file), its parity against torch (None: made without the check) and, for a tuned lens's
    graph, the translators it holds (``tuned``)."""

    file: str
    k: int
    head: LensHead
    outputs: tuple[str, ...]
    probabilities: str | None  # None: not recorded (a graph made before it was; made again)
    sha256: str
    model_onnx_sha256: str
    shared_bytes: int
    shared_with: str | None = None
    parity: LensParity | None = None
    tuned: TunedSource | None = None
    format: int = LENS_FORMAT
    # the graph and the weights it reads (the stored head's bytes, or its own data file), hashed together
    # (model/derived.py ``source_sha256``); None: not recorded (a graph made before it was; made again)
    content_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"file": self.file, "format": self.format, "k": self.k, "head": self.head.to_dict(),
               "outputs": list(self.outputs), "probabilities": self.probabilities, "sha256": self.sha256,
               "model_onnx_sha256": self.model_onnx_sha256, "shared_bytes": self.shared_bytes,
               "shared_with": self.shared_with, "content_sha256": self.content_sha256}
        if self.parity is not None:
            out["parity"] = self.parity.to_dict()
        if self.tuned is not None:
            out["tuned"] = self.tuned.to_dict()
        return out

    def to_disk(self, export_dir: str | Path) -> Path:
        """Write the sidecar (``lens-k{k}.json``, or a tuned lens graph's) into ``export_dir``; returns its path."""
        from layerscope.jsonfile import write_json_atomic

        path = Path(export_dir) / sidecar_name(self.k, self.tuned.id if self.tuned is not None else None)
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def from_disk(cls, path: str | Path) -> LensSidecar | None:
        """The sidecar at ``path``, checked field by field (one ``ManifestError`` line naming the file and the
        field); None where it was written in another format (its graph is made again)."""
        path = Path(path)
        doc = _load(path)
        try:
            fmt = _need({"format": 1, **doc}, "format", int)  # the first sidecars named no format
            if fmt != LENS_FORMAT:
                return None
            k = _need(doc, "k", int)
            outputs = _need(doc, "outputs", list)
            if not all(isinstance(o, str) for o in outputs):
                raise _Bad("outputs is not a list of output names")
            shared = doc.get("shared_with")
            probabilities = None if doc.get("probabilities") is None else _need(doc, "probabilities", str)
            tuned = None if doc.get("tuned") is None else TunedSource.read(doc["tuned"])
            made = cls(file=_plain_name(doc, "file"), k=k, head=LensHead.read(doc.get("head")),
                       outputs=tuple(outputs), probabilities=probabilities,
                       sha256=_digest(doc, "sha256"), model_onnx_sha256=_need(doc, "model_onnx_sha256", str),
                       shared_bytes=_need(doc, "shared_bytes", int),
                       shared_with=None if shared is None else _plain_name(doc, "shared_with"),
                       parity=None if doc.get("parity") is None else LensParity.read(doc["parity"]),
                       tuned=tuned, format=fmt,
                       content_sha256=None if doc.get("content_sha256") is None else _digest(doc, "content_sha256"))
            graph = graph_stem(k, tuned.id if tuned is not None else None) + ".onnx"
            if made.file != graph:
                raise _Bad(f"file names {made.file!r}, not the graph of k = {k} ({graph})")
            if path.name != sidecar_name(k, tuned.id if tuned is not None else None):
                raise _Bad(f"it describes {graph}, not the graph its own name belongs to")
        except _Bad as exc:
            raise _garbled(path, exc) from None
        return made

    @staticmethod
    def checksum(path: str | Path) -> tuple[str, str]:
        """``(graph file, sha256)`` a sidecar of any format records, the file a plain name inside its folder."""
        path = Path(path)
        doc = _load(path)
        try:
            return _plain_name(doc, "file"), _digest(doc, "sha256")
        except _Bad as exc:
            raise _garbled(path, exc) from None


def _digest(doc: dict[str, Any], key: str, where: str = "") -> str:
    value = _need(doc, key, str, where)
    if not _SHA256.fullmatch(value):
        raise _Bad(f"{where}{key} is not a sha256 (64 hex digits)")
    return value


def _load(path: Path) -> dict[str, Any]:
    from layerscope.jsonfile import NotRegularFile, read_json

    try:
        doc = read_json(path, limit=4 * 2**20, what="lens sidecar")  # a FIFO or a device: one line, never waited on
    except NotRegularFile:
        raise
    except (OSError, ValueError, LayerscopeError) as exc:
        raise ManifestError(f"{path}: a lens graph's sidecar that cannot be read ({exc}); export the lens again "
                            "(layerscope export ... --lens-k K --force)") from None
    if not isinstance(doc, dict):
        raise _garbled(path, _Bad(f"it holds a JSON {type(doc).__name__}, not an object"))
    return doc


def _garbled(path: Path, exc: Exception) -> ManifestError:
    return ManifestError(f"{path}: {exc}; this lens graph's sidecar was edited or written by another version: "
                         "export the lens again (layerscope export ... --lens-k K --force)")
