"""``Manifest``: what a model is, typed, read once.

An export's ``manifest.json`` (written by export/exporter.py, extended by export/variants.py) and a
plain model's description (model/describe.py) both become one frozen ``Manifest``: callers read
``manifest.num_layers``, ``manifest.source.weights_sha256``, ``manifest.variant("int8").parity``
instead of string keys.  ``to_dict()`` gives back the JSON form (what stores and results embed) and
``from_dict()`` reads it again; keys this version does not type are kept and written back unchanged.

Format versions: an export's manifest.json carries ``format_version``; :func:`Manifest.read_export`
refuses a file without one or with one this version cannot read, in one line that says how to upgrade.
A manifest copied into a store or a results file before the field existed still opens.  Version 2 adds
the model's ``anatomy`` (model/anatomy.py); a version-1 export still opens, and its anatomy is derived
once, the first time ``manifest.anatomy`` is read (``derived_on_load``).

A ``Manifest`` has no mapping view: code reads its fields, and ``to_dict()`` where it needs the JSON.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from layerscope.errors import ManifestError
from layerscope.model.anatomy_record import Anatomy

FORMAT_VERSION = 2  # the manifest.json layout this version writes (2: the model's anatomy)
READABLE_VERSIONS = (1, 2)  # the layouts this version reads (1: its anatomy derived on load)
# --force replaces only a folder whose files layerscope recorded, which an older export's folder is not
UPGRADE = "export the model again into a new folder: layerscope export MODEL --out NEW_DIR"
ONNX_FILE = "model.onnx"


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _frozen(value: Any) -> Mapping:
    return MappingProxyType(dict(value or {}))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class SourceInfo:
    """Where the weights came from and what they were (``weights_sha256``: the identity results key on)."""

    spec: str
    path_or_id: str
    is_local: bool = False
    revision: str | None = None
    alias: str | None = None
    weights_sha256: str | None = None
    files_sha256: str | None = None
    model_type: str | None = None
    # the classes of the model's own code (auto_map) the export ran, "AutoModel = modeling_x.Cls": loading
    # the model again (PyTorch engines, variants' references, the bench) runs them only with --trust-remote-code
    own_code: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SourceInfo":
        for key in ("weights_sha256", "files_sha256"):  # result folders are named from them: hex digests only
            value = d.get(key)
            if value is not None and not (isinstance(value, str) and _SHA256.fullmatch(value)):
                raise ManifestError(f"the manifest's source.{key} {value!r} is not a sha256 hex digest; {UPGRADE}")
        code = d.get("own_code") or []
        if not isinstance(code, list) or not all(isinstance(c, str) for c in code):
            raise ManifestError(f"the manifest's source.own_code {code!r} is not a list of class names; {UPGRADE}")
        spec = d.get("spec") or d.get("path_or_id") or ""
        return cls(spec=str(spec), path_or_id=str(d.get("path_or_id") or spec), is_local=bool(d.get("is_local")),
                   revision=d.get("revision"), alias=d.get("alias"), weights_sha256=d.get("weights_sha256"),
                   files_sha256=d.get("files_sha256"), model_type=d.get("model_type"), own_code=tuple(code))

    @property
    def label(self) -> str:
        """The name people know the model by: its alias, else its path or hub id."""
        return self.alias or self.path_or_id

    def model_source(self):
        """The ``ModelSource`` to load these weights again."""
        from layerscope.model.source import ModelSource

        return ModelSource(self.spec, self.path_or_id, self.is_local, self.revision, self.alias, self.own_code)


@dataclass(frozen=True)
class TokenizerInfo:
    """What the export learned about its tokenizer: whether the ``tokenizers``-only path gives Hugging
    Face's ids exactly (``fast``), and the special token ids it needs."""

    fast: bool = False
    special_ids: Mapping[str, int | None] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "TokenizerInfo | None":
        if not d:
            return None
        return cls(fast=bool(d.get("fast")), special_ids=_frozen(d.get("special_ids")))


@dataclass(frozen=True)
class OutputCheck:
    """One output's difference to PyTorch fp32 on the validation texts, and the tolerance it was held to."""

    max_abs: float | None = None
    min_cos: float | None = None
    ref_max_abs: float | None = None
    tolerance: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OutputCheck":
        return cls(_opt_float(d.get("max_abs")), _opt_float(d.get("min_cos")), _opt_float(d.get("ref_max_abs")),
                   _opt_float(d.get("tolerance")))


@dataclass(frozen=True)
class Parity:
    """The recorded check of a graph (the export or one variant) against PyTorch fp32."""

    outputs: Mapping[str, OutputCheck] = field(default_factory=dict)
    tolerance_abs: float | None = None
    tolerance_rel: float | None = None
    tolerance_fp16: Mapping[str, Any] | None = None  # an fp16 export's per-output cosine floors

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Parity | None":
        if not d:
            return None
        outs = {str(k): OutputCheck.from_dict(v) for k, v in (d.get("outputs") or {}).items()}
        return cls(MappingProxyType(outs), _opt_float(d.get("tolerance_abs")), _opt_float(d.get("tolerance_rel")),
                   d.get("tolerance_fp16"))

    def min_cosine(self) -> float | None:
        """Worst cosine over every hidden-state and pooled output; None if none was recorded (or NaN)."""
        from layerscope.vocab.outputs import is_layer_or_pooled

        values = [c.min_cos for name, c in self.outputs.items() if is_layer_or_pooled(name) and c.min_cos is not None]
        if not values:
            return None
        worst = min(values)
        return None if worst != worst else worst


@dataclass(frozen=True)
class Variant:
    """A variant recorded in the manifest (``layerscope optimize``): its file and its parity."""

    kind: str
    file: str
    sha256: str | None = None
    precision: str = "fp32"
    engine: str | None = None  # set when one engine runs it (OpenVINO precisions)
    parity: Parity | None = None
    tolerance: Mapping[str, float | None] = field(default_factory=dict)
    external_data: Mapping[str, Any] | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the entry as recorded

    @classmethod
    def from_dict(cls, kind: str, d: Mapping[str, Any]) -> "Variant":
        return cls(kind=str(kind), file=d.get("file"),  # kept as written: check_paths refuses a bad one
                   sha256=d.get("sha256"),
                   precision=str(d.get("precision") or "fp32"), engine=d.get("engine"),
                   parity=Parity.from_dict(d.get("parity")), tolerance=_frozen(d.get("tolerance")),
                   external_data=_frozen(d["external_data"]) if d.get("external_data") else None,
                   raw=MappingProxyType(copy.deepcopy(dict(d))))

    def to_dict(self) -> dict[str, Any]:
        """The entry as ``layerscope optimize`` recorded it (a fresh copy)."""
        return copy.deepcopy(dict(self.raw))


@dataclass(frozen=True)
class ImageInfo:
    """A vision tower's input: the image size it was exported at and its token layout (``prefix_tokens``: CLS
    and register tokens before the patch grid; ``tokens``: all of them)."""

    height: int
    width: int
    patch_size: int
    channels: int = 3
    prefix_tokens: int = 1
    register_tokens: int = 0
    tokens: int = 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ImageInfo | None":
        if not d:
            return None
        patch = d["patch_size"]
        return cls(int(d["height"]), int(d["width"]), int(patch if isinstance(patch, int) else patch[0]),
                   int(d.get("channels", 3)), int(d.get("prefix_tokens", 1)), int(d.get("register_tokens", 0)),
                   int(d.get("tokens", 0)))


_REQUIRED = ("source", "family", "num_layers", "hidden_size")


@dataclass(frozen=True)
class Manifest:
    """One model's facts: an export's manifest.json, or a plain model's description."""

    format_version: int | None  # None: not an export (a plain model's description, or an old embedded copy)
    source: SourceInfo
    family: str
    num_layers: int
    hidden_size: int
    kind: str = "encoder"
    max_length: int | None = None  # the longest input read by default (``max_length_from`` says why)
    max_length_from: str | None = None
    positions: int | None = None  # the model's own limit: its positions (None: recorded before it was; max_length)
    tokenizer_max_length: int | None = None  # the tokenizer's model_max_length, where it is below ``positions``
    inputs: tuple[str, ...] = ()
    layers: tuple[str, ...] = ()
    default_pooling: str = "mean"
    pooled_output: str | None = None  # the model's own pooled output (e.g. BERT's pooler), if it has one
    eos_token_id: int | None = None
    vocab_size: int | None = None
    final_norm_in_last_layer: bool | None = None
    # a model type only the model's own code defines (read with --trust-remote-code): its family is derived
    # again from ``family`` and ``kind`` (model/families.py ``code_family``)
    family_from_code: bool = False
    sentence_transformers: Mapping[str, Any] | None = None
    layerscope_version: str | None = None
    # an export's half (absent for a plain model)
    onnx_file: str = ONNX_FILE  # as written: model/manifest_check.py refuses a name outside the dir
    onnx_sha256: str | None = None
    external_data: bool = False
    outputs: Mapping[str, tuple] = field(default_factory=dict)  # graph output name -> dims
    pooled_modes: tuple[str, ...] = ()
    pooled_layers: tuple[str, ...] = ()
    precision: str = "fp32"
    opset: int | None = None
    parity: Parity | None = None
    variants: Mapping[str, Variant] = field(default_factory=dict)
    tokenizer: TokenizerInfo | None = None
    lm_head: Mapping[str, Any] | None = None
    export_cache: Mapping[str, Any] | None = None
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    export_seconds: float | None = None
    modality: str = "text"  # "image": a vision tower reading pixel_values (``image`` says how)
    image: ImageInfo | None = None
    anatomy_record: Anatomy | None = None  # as manifest.json records it (``anatomy`` reads it, or derives it)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the JSON as read
    export_dir: Path | None = field(default=None, repr=False, compare=False)  # where read_export found it
    _derived: dict = field(default_factory=dict, repr=False, compare=False)  # an anatomy derived on load

    # -- reading -----------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "the manifest",
                  export_dir: Path | None = None) -> "Manifest":
        """The typed manifest of ``d`` (an export's JSON, a plain model's description or an embedded copy).

        A ``format_version`` this version cannot read is refused in one line; a copy without the key
        (stores and results written before it existed) opens."""
        if isinstance(d, Manifest):
            return d
        if not isinstance(d, Mapping):
            raise ManifestError(f"{where} is not a JSON object; {UPGRADE}")
        version = d.get("format_version")
        if version is not None and version not in READABLE_VERSIONS:
            raise ManifestError(f"{where} has format_version {version!r}, and this layerscope reads "
                                f"{', '.join(map(str, READABLE_VERSIONS))}: {UPGRADE}, or update layerscope")
        missing = [k for k in _REQUIRED if d.get(k) is None]
        if missing:
            raise ManifestError(f"{where} lacks {', '.join(missing)}; {UPGRADE}")
        raw = copy.deepcopy(dict(d))
        try:
            return cls(
                format_version=version, source=SourceInfo.from_dict(raw["source"]), family=str(raw["family"]),
                num_layers=int(raw["num_layers"]), hidden_size=int(raw["hidden_size"]),
                kind=str(raw.get("kind") or "encoder"), max_length=_opt_int(raw.get("max_length")),
                max_length_from=raw.get("max_length_from"), positions=_opt_int(raw.get("positions")),
                tokenizer_max_length=_opt_int(raw.get("tokenizer_max_length")),
                inputs=tuple(raw.get("inputs") or ()), layers=tuple(str(x) for x in raw.get("layers") or ()),
                default_pooling=str(raw.get("default_pooling") or "mean"), pooled_output=raw.get("pooled_output"),
                eos_token_id=_opt_int(raw.get("eos_token_id")), vocab_size=_opt_int(raw.get("vocab_size")),
                final_norm_in_last_layer=raw.get("final_norm_in_last_layer"),
                family_from_code=raw.get("family_from_code") is True,
                sentence_transformers=raw.get("sentence_transformers"),
                layerscope_version=raw.get("layerscope_version"),
                onnx_file=raw.get("onnx_file", ONNX_FILE), onnx_sha256=raw.get("onnx_sha256"),
                external_data=bool(raw.get("external_data")),
                outputs=MappingProxyType({str(k): tuple(v or ()) for k, v in (raw.get("outputs") or {}).items()}),
                pooled_modes=tuple(raw.get("pooled_modes") or ()),
                pooled_layers=tuple(str(x) for x in raw.get("pooled_layers") or ()),
                precision=str(raw.get("precision") or "fp32"), opset=_opt_int(raw.get("opset")),
                parity=Parity.from_dict(raw.get("parity")),
                variants=MappingProxyType({str(k): Variant.from_dict(k, v)
                                           for k, v in (raw.get("variants") or {}).items() if v}),
                tokenizer=TokenizerInfo.from_dict(raw.get("tokenizer")), lm_head=raw.get("lm_head"),
                export_cache=raw.get("export_cache"), files=_frozen(raw.get("files")),
                export_seconds=_opt_float(raw.get("export_seconds")), modality=str(raw.get("modality") or "text"),
                image=ImageInfo.from_dict(raw.get("image")),
                anatomy_record=None if raw.get("anatomy") is None else Anatomy.from_dict(
                    raw["anatomy"], where=f"{where}: anatomy"),
                raw=MappingProxyType(raw), export_dir=export_dir)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise ManifestError(f"{where} has a field of the wrong type ({exc}); {UPGRADE}") from None

    @classmethod
    def read_export(cls, export_dir: Path, name: str = "manifest.json") -> "Manifest":
        """The manifest of an export dir, read once; a missing or unknown ``format_version`` is one line."""
        from layerscope.jsonfile import JsonFileError, read_json

        path = Path(export_dir) / name
        try:
            data = read_json(path, what="manifest")  # bounded; a FIFO or a device is one line, never waited on
        except FileNotFoundError:
            raise ManifestError(f"{export_dir} has no {name}: it is not a layerscope export; "
                                "run layerscope export") from None
        except JsonFileError as exc:
            raise ManifestError(f"{exc}; re-run layerscope export") from None
        if not isinstance(data, dict) or data.get("format_version") is None:
            raise ManifestError(f"{path} has no format_version: it was written by an older layerscope; {UPGRADE}")
        return cls.from_dict(data, where=str(path), export_dir=Path(export_dir))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, as read (a fresh copy the caller may change)."""
        return copy.deepcopy(dict(self.raw))

    def source_dict(self) -> dict[str, Any]:
        """The source entry as recorded (what results and store exports name the model by)."""
        return copy.deepcopy(dict(self.raw.get("source") or {}))

    # -- what callers ask ----------------------------------------------------------
    @property
    def length_limit(self) -> int | None:
        """The longest input the model can read: its positions (a decoder's is not its tokenizer's
        ``model_max_length``); ``max_length`` for a manifest recorded before positions were."""
        return self.positions if self.positions is not None else self.max_length

    def default_length_note(self) -> str | None:
        """Where a default ``max_length`` below the model's positions comes from, said as such, with how to read
        more; None where the default is the positions themselves."""
        limit = self.length_limit
        if self.max_length is None or limit is None or self.max_length >= limit:
            return None
        why = {"tokenizer model_max_length": "the tokenizer's model_max_length",
               "sentence_bert_config.json max_seq_length": "the checkpoint's max_seq_length "
                                                           "(sentence_bert_config.json)"}.get(
            str(self.max_length_from), f"the export's default ({self.max_length_from or 'recorded'})")
        return f"{why}, {self.max_length:,} tokens; the model reads up to {limit:,} (--max-length {limit})"

    @property
    def raw_width(self) -> int:
        """The width of the raw word embeddings: the graph's output where exported, else the description's
        ``embedding_size`` (narrower than the hidden states in ALBERT and ELECTRA), else the hidden size."""
        dims = self.outputs.get("raw_embeddings")
        width = dims[-1] if dims else self.raw.get("embedding_size")
        return width if isinstance(width, int) and width > 0 else self.hidden_size

    def width_of(self, layers) -> int:
        """The width of the vectors of ``layers`` (one width: vocab/layers.py ``resolve_widths`` sees to it):
        the word embeddings' for ``raw`` alone, else the hidden size."""
        return self.raw_width if list(layers) == ["raw"] else self.hidden_size

    @property
    def anatomy(self) -> Anatomy | None:
        """Where the model keeps its blocks, attention, final norm and head (model/anatomy.py): as recorded at
        export; for an export made before it was recorded, derived once from the export's own files
        (``derived_on_load``); None for a plain model's description, an old copy embedded in a store or
        results file, or an old export whose model type only its own code defines."""
        if self.anatomy_record is not None:
            return self.anatomy_record
        if self.export_dir is None or not self.is_export:
            return None
        if "anatomy" not in self._derived:
            from layerscope.model.anatomy import derive_anatomy

            self._derived["anatomy"] = derive_anatomy(self.export_dir, self)
        return self._derived["anatomy"]

    @property
    def is_export(self) -> bool:
        return self.format_version is not None

    @property
    def needs_code(self) -> tuple[str, ...]:
        """The model's own code loading this model in PyTorch runs (what ``source.own_code`` records; a type only
        that code defines, ``family_from_code``, names its family): () where none. Those loads need the user's
        --trust-remote-code (model/source.py ``require_code``)."""
        return ((f"model type '{self.family}'",) if self.family_from_code else ()) + self.source.own_code

    @property
    def records_st(self) -> bool:
        """Whether the sentence-transformers recipe was looked for (exports made before it was: False)."""
        return "sentence_transformers" in self.raw or not self.is_export

    def variant(self, kind: str) -> Variant | None:
        return self.variants.get(kind)

    def min_cosine(self, key: str = "fp32") -> float | None:
        """Recorded worst cosine to torch fp32 of the export (``fp32``) or of variant ``key``."""
        parity = self.parity if key == "fp32" else (self.variants[key].parity if key in self.variants else None)
        return parity.min_cosine() if parity is not None else None

    @property
    def st_prompts(self) -> dict[str, str]:
        return dict((self.sentence_transformers or {}).get("prompts") or {})

    @property
    def similarity_fn_name(self) -> str:
        return (self.sentence_transformers or {}).get("similarity_fn_name") or "cosine"

    @property
    def key(self) -> str:
        """A stable identity for caching: the weights hash where known, else the source id."""
        return self.source.weights_sha256 or f"{self.source.path_or_id}@{self.source.revision}"


def as_manifest(value: "Manifest | Mapping[str, Any]", *, where: str = "the manifest") -> Manifest:
    """``value`` as a ``Manifest`` (a dict from a store or a results file is read here)."""
    return value if isinstance(value, Manifest) else Manifest.from_dict(value, where=where)


def manifest_dict(value: "Manifest | Mapping[str, Any] | None") -> dict[str, Any] | None:
    """The JSON form of a manifest, typed or not (what stores and results embed)."""
    if value is None:
        return None
    return value.to_dict() if isinstance(value, Manifest) else copy.deepcopy(dict(value))


__all__ = ["FORMAT_VERSION", "Manifest", "OutputCheck", "Parity", "SourceInfo", "TokenizerInfo", "Variant",
           "as_manifest", "manifest_dict"]
