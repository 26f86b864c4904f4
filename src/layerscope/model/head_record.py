"""The record of the decoding head's logits graph, ``head-logits.json`` beside ``head-logits.onnx``, typed.

decoding/head_graph.py writes it once per export; the analyses that write states read it back before they run
the graph, and ``layerscope verify`` checks it. Its claims follow the rule of model/derived.py: the graph's
sha256 and the content of the weights it reads (``content_sha256``: the graph and every external data file it
names, the export's stored head among them) as recorded, made for this ``model.onnx``, written by this format.
Where any of it differs the graph is made again; model/derived.py ``head_problem`` says why in one line, for the
reader (decoding/head_graph.py) and for ``verify``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HEAD_FILE = "head-logits.onnx"
RECORD_FILE = "head-logits.json"
HEAD_FORMAT = 2  # format 1 recorded no hash of the weights its graph reads: made again
RECORD_BYTES = 2**20  # the record is a few hundred bytes


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


def load_head_record(export_dir: Path) -> HeadRecord | None:
    """The record beside an export's head graph as written, or None where it is missing, damaged or of another
    format (a record that is not a regular file is one line: jsonfile.py). Its claims are checked by
    model/derived.py ``head_problem`` before the graph is used."""
    from layerscope.jsonfile import JsonFileError, read_json

    try:
        doc = read_json(Path(export_dir) / RECORD_FILE, limit=RECORD_BYTES, what="head graph's record")
    except (FileNotFoundError, JsonFileError):
        return None
    return HeadRecord.read(doc)
