"""The record of the decoding head's logits graph, ``head-logits.json`` beside ``head-logits.onnx``, typed.

decoding/head_graph.py writes it once per export; the analyses that write states read it back before they run
the graph, and ``layerscope verify`` checks it. Its claims follow the rule of model/derived.py: the graph's
sha256 and the content of the weights it reads (``content_sha256``: the graph and every external data file it
names, the export's stored head among them) as recorded, made for this ``model.onnx``, written by this format.
Where any of it differs the graph is made again (``read_head_record`` returns None); ``head_problem`` says why in
one line for ``verify``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HEAD_FILE = "head-logits.onnx"
RECORD_FILE = "head-logits.json"
HEAD_FORMAT = 2  # format 1 recorded no hash of the weights its graph reads: made again


@dataclass(frozen=True)
class HeadRecord:
    """``head-logits.json``: the graph's file and sha256, the content it reads, the head, the ``model.onnx`` it
    was made for and its check against the torch head."""

    format: int
    file: str
    sha256: str
    content_sha256: str
    model_onnx_sha256: str
    kind: str
    description: str
    final_norm_below_last: bool
    vocab: int
    max_abs: float  # largest |graph - torch| of the logits on the check's states
    scale: float  # largest |logit| there

    @classmethod
    def read(cls, doc: Any) -> HeadRecord | None:
        """The record, or None where it is not one this version writes (the graph is then made again)."""
        if not isinstance(doc, dict) or doc.get("format") != HEAD_FORMAT:
            return None
        kinds = {"format": int, "file": str, "sha256": str, "content_sha256": str, "model_onnx_sha256": str,
                 "kind": str, "description": str, "final_norm_below_last": bool, "vocab": int,
                 "max_abs": (int, float), "scale": (int, float)}
        for key, kind in kinds.items():
            value = doc.get(key)
            if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
                return None
        if doc["file"] != HEAD_FILE:
            return None
        return cls(**{k: doc[k] for k in kinds})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _load(export_dir: Path) -> Any:
    from layerscope.jsonfile import JsonFileError, read_json
    from layerscope.model.derived import RECORD_BYTES

    try:
        return read_json(Path(export_dir) / RECORD_FILE, limit=RECORD_BYTES, what="head graph's record")
    except (FileNotFoundError, JsonFileError):
        return None


def head_problem(export_dir: Path, manifest, record: HeadRecord | None = None) -> str | None:
    """Why the export's head graph cannot be used as its record says, or None. ``record``: already read."""
    from layerscope.jsonfile import NotRegularFile, check_regular
    from layerscope.model.derived import graph_sha256, source_sha256

    export_dir = Path(export_dir)
    if record is None:
        record = HeadRecord.read(_load(export_dir))
    if record is None:
        return f"{RECORD_FILE} is not a record this version writes (damaged or older); its graph is made again"
    graph = export_dir / record.file
    try:
        check_regular(graph)
    except FileNotFoundError:
        return f"{record.file} is missing"
    except NotRegularFile as exc:
        return str(exc)
    if record.model_onnx_sha256 != manifest.onnx_sha256:
        return f"{record.file} was made for another {manifest.onnx_file}"
    if graph_sha256(graph) != record.sha256:
        return f"{record.file} is not the graph {RECORD_FILE} records (sha256 differs): damaged or replaced"
    if source_sha256(graph) != record.content_sha256:
        return f"the weights {record.file} reads are not those {RECORD_FILE} records"
    return None


def read_head_record(export_dir: Path, manifest) -> HeadRecord | None:
    """The export's head graph record where every claim holds (``head_problem``), else None: make it again."""
    from layerscope.errors import ManifestError

    record = HeadRecord.read(_load(export_dir))
    if record is None:
        return None
    try:
        return None if head_problem(export_dir, manifest, record) else record
    except ManifestError:  # its graph names weights outside the export
        return None
