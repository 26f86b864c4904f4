"""``manifest.json`` of an export dir, and ``ModelHandle``: one object for "the model the user named".

A handle is either an export dir (``model.onnx`` + ``manifest.json`` + tokenizer)
or a plain model (hub id, local checkpoint, alias) that the torch engine can run
directly and the ONNX engines get exported on first use.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerscope.errors import ManifestError
from layerscope.hashing import file_sha256  # noqa: F401  (imported from here by older callers)

MANIFEST = "manifest.json"
ONNX_FILE = "model.onnx"
FORMAT_VERSION = 1


def read_manifest(export_dir: Path) -> dict[str, Any]:
    path = Path(export_dir) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"{export_dir} has no {MANIFEST}: it is not a layerscope export; run layerscope export") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON ({exc}); re-run layerscope export") from None


def verify_export(export_dir: Path, manifest: dict[str, Any], *, check_hash: bool = True) -> None:
    """Check that model.onnx is the graph the manifest describes (see manifest_check for what is checked)."""
    from layerscope.export.manifest_check import check_external_data, check_graph, check_paths

    onnx_path = check_paths(Path(export_dir), manifest)
    if not onnx_path.exists():
        raise ManifestError(f"{export_dir} has a manifest but no {onnx_path.name}; re-run layerscope export")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"{export_dir} was written by a different layerscope export format "
            f"({manifest.get('format_version')}, this version reads {FORMAT_VERSION}); re-run layerscope export")
    if not manifest.get("onnx_sha256"):
        raise ManifestError(f"{Path(export_dir) / MANIFEST} has no onnx_sha256, so {onnx_path.name} cannot be "
                            "checked; re-export with layerscope export --force")
    if check_hash and file_sha256(onnx_path) != manifest["onnx_sha256"]:
        raise ManifestError(
            f"{onnx_path} does not match its manifest (sha256 differs): the file was replaced or "
            "damaged after export; re-run layerscope export")
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    graph_outputs = [o.name for o in graph.output]
    listed = list(manifest.get("outputs", {}))
    if graph_outputs != listed:
        missing = sorted(set(listed) - set(graph_outputs))
        extra = sorted(set(graph_outputs) - set(listed))
        raise ManifestError(
            f"{onnx_path} does not match its manifest: outputs missing from the graph {missing or '-'}, "
            f"not in the manifest {extra or '-'}; re-run layerscope export")
    check_graph(Path(export_dir), manifest, graph)
    check_external_data(Path(export_dir), manifest, graph)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "--", text).strip("-") or "model"


def cache_root() -> Path:
    return Path(os.environ.get("LAYERSCOPE_HOME", Path.home() / ".cache" / "layerscope"))


@dataclass
class ModelHandle:
    """The model a user named, resolved once."""

    spec: str
    export_dir: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    _tokenizer: Any = None
    _fast: Any = None

    @property
    def is_export(self) -> bool:
        return self.export_dir is not None

    @property
    def can_export(self) -> bool:
        return True

    @property
    def onnx_path(self) -> Path:
        if self.export_dir is None:
            raise ManifestError(f"{self.spec} is not an export dir")
        return self.export_dir / self.manifest.get("onnx_file", ONNX_FILE)

    @classmethod
    def resolve(cls, spec: str | Path, *, trust_remote_code: bool = False, verify: bool = True) -> "ModelHandle":
        path = Path(str(spec)).expanduser()
        if path.is_dir() and (path / MANIFEST).exists():
            manifest = read_manifest(path)
            if verify:
                verify_export(path, manifest)
            return cls(str(spec), path.resolve(), manifest, trust_remote_code)
        if path.is_dir() and (path / ONNX_FILE).exists() and not (path / "config.json").exists():
            raise ManifestError(f"{spec} has a model.onnx but no {MANIFEST}; export it with layerscope export")
        from layerscope.export.describe import describe_model

        return cls(str(spec), None, describe_model(str(spec), trust_remote_code=trust_remote_code),
                   trust_remote_code)

    # -- pieces engines need -------------------------------------------------
    def source(self):
        from layerscope.models import ModelSource

        src = self.manifest["source"]
        return ModelSource(src["spec"], src["path_or_id"], src["is_local"], src.get("revision"), src.get("alias"))

    def family(self):
        from layerscope.models import FAMILIES

        return FAMILIES[self.manifest["family"]]

    def tokenizer(self):
        if self._tokenizer is None:
            from layerscope.models import ModelSource, load_tokenizer

            if self.export_dir is not None:
                where = str(self.export_dir)
                self._tokenizer = load_tokenizer(ModelSource(self.spec, where, True),
                                                 trust_remote_code=self.trust_remote_code)
            else:
                self._tokenizer = load_tokenizer(self.source(), trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    def encoding_tokenizer(self):
        """What the engines tokenize with: the ``tokenizers``-only path when the export verified it
        gives exactly Hugging Face's ids (no transformers import), else the Hugging Face tokenizer."""
        info = self.manifest.get("tokenizer") or {}
        if self.export_dir is not None and info.get("fast") and (self.export_dir / "tokenizer.json").exists():
            if self._fast is None:
                from layerscope.runtime.fast_tokenizer import FastTokenizer

                self._fast = FastTokenizer(self.export_dir / "tokenizer.json", info["special_ids"])
            return self._fast
        return self.tokenizer()

    def ensure_export(self, **export_options) -> "ModelHandle":
        """This handle if it is an export; else the cached export of the model, keyed by its content
        (see export/cache.py), made on first use."""
        if self.export_dir is not None:
            return self
        from layerscope.export.cache import cached_export

        return cached_export(self, export_options)

    @property
    def key(self) -> str:
        """A stable identity for caching: the weights hash where known, else the source id."""
        src = self.manifest.get("source", {})
        return src.get("weights_sha256") or f"{src.get('path_or_id')}@{src.get('revision')}"
