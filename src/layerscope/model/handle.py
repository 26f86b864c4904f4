"""``ModelHandle``: one object for "the model the user named", resolved once.

A handle is either an export dir (``model.onnx`` + ``manifest.json`` + tokenizer)
or a plain model (hub id, local checkpoint, alias) that the torch engine can run
directly.  A handle never exports: ``layerscope.export.open`` turns a plain model into
its cached export when an engine needs one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.errors import ManifestError
from layerscope.model.manifest import MANIFEST, ONNX_FILE, read_manifest, verify_export
from layerscope.model.manifest_type import Manifest, as_manifest


@dataclass
class ModelHandle:
    """The model a user named, resolved once."""

    spec: str
    export_dir: Path | None = None
    manifest: Manifest = None  # type: ignore[assignment]  # read once by resolve (a dict given here is read too)
    trust_remote_code: bool = False
    _tokenizer: Any = None
    _fast: Any = None

    def __post_init__(self) -> None:
        if self.manifest is None:
            raise ManifestError(f"{self.spec}: a model handle needs its manifest")
        if not isinstance(self.manifest, Manifest):
            self.manifest = as_manifest(self.manifest, where=f"the manifest of {self.spec}")

    @property
    def is_export(self) -> bool:
        return self.export_dir is not None

    @property
    def onnx_path(self) -> Path:
        if self.export_dir is None:
            raise ManifestError(f"{self.spec} is not an export dir")
        return self.export_dir / (self.manifest.onnx_file or ONNX_FILE)

    @classmethod
    def resolve(cls, spec: str | Path, *, trust_remote_code: bool = False, verify: bool = True,
                tower: str | None = None) -> "ModelHandle":
        """The handle of ``spec``: an export dir, or a plain model described from its config (``tower="vision"``:
        a two-tower checkpoint's image tower, which its cached export then holds)."""
        path = Path(str(spec)).expanduser()
        if path.is_dir() and (path / MANIFEST).exists():
            from layerscope.jsonfile import check_folder_files

            check_folder_files(path, where="an export")  # what the runtimes open there: regular files only
            manifest = read_manifest(path)
            if verify:
                verify_export(path, manifest)
            return cls(str(spec), path.resolve(), manifest, trust_remote_code)
        if path.is_dir() and (path / ONNX_FILE).exists() and not (path / "config.json").exists():
            raise ManifestError(f"{spec} has a model.onnx but no {MANIFEST}; export it with layerscope export")
        from layerscope.model.describe import describe_model

        return cls(str(spec), None, Manifest.from_dict(describe_model(str(spec), trust_remote_code=trust_remote_code,
                                                                      tower=tower),
                                                       where=f"the description of {spec}"), trust_remote_code)

    # -- pieces engines need -------------------------------------------------
    def source(self):
        return self.manifest.source.model_source()

    def family(self):
        from layerscope.model.families import family_of

        return family_of(self.manifest)

    def tokenizer(self):
        if self._tokenizer is None:
            from layerscope.model.source import ModelSource, load_tokenizer

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
        info = self.manifest.tokenizer
        if self.export_dir is not None and info and info.fast and (self.export_dir / "tokenizer.json").exists():
            if self._fast is None:
                from layerscope.model.fast_tokenizer import FastTokenizer

                self._fast = FastTokenizer(self.export_dir / "tokenizer.json", dict(info.special_ids))
            return self._fast
        return self.tokenizer()

    @property
    def key(self) -> str:
        """A stable identity for caching: the weights hash where known, else the source id."""
        return self.manifest.key
