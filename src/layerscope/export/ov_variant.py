"""OpenVINO precisions of an export, checked against PyTorch fp32 and recorded like the other variants.

``ov-fp32`` and ``ov-bf16`` run the fp32 export itself (bf16 is OpenVINO's
inference precision, not a file); ``ov-int8`` runs the ``int8`` variant's file.
No new file is written: the entry names the file OpenVINO reads, its sha256,
the precision OpenVINO actually compiled to, the per-output parity on the
export's validation batches and the tolerance it was held to.  A precision
outside its tolerance is not recorded (and ``auto`` never picks it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from layerscope.errors import ExportError
from layerscope.hashing import file_sha256
from layerscope.model.manifest import read_manifest

OV_TOLERANCES: dict[str, dict[str, float | None]] = {
    "ov-fp32": {"max_abs": 1e-4, "min_cos": 0.99999},
    "ov-bf16": {"max_abs": None, "min_cos": 0.999},
    # the bar for an int8 engine: every layer at cosine >= 0.99 to fp32
    "ov-int8": {"max_abs": None, "min_cos": 0.99},
}


def make_ov_variant(export_dir: str | Path, kind: str, *, force: bool = False,
                    tolerance: dict[str, float | None] | None = None, progress=None,
                    trust_remote_code: bool = False) -> dict[str, Any]:
    """Make and record an OpenVINO variant; what it writes joins the export's record of layerscope's files.
    ``trust_remote_code``: the torch reference of its parity runs the model's own code (as the export did)."""
    from layerscope.ownership import writing

    with writing(export_dir, "export") as wrote:
        wrote.add("manifest.json")  # the only file it writes (the int8 file it reads is made before)
        return _make_ov_variant(export_dir, kind, force=force, tolerance=tolerance, progress=progress,
                                trust_remote_code=trust_remote_code)


def _make_ov_variant(export_dir: str | Path, kind: str, *, force: bool = False,
                     tolerance: dict[str, float | None] | None = None, progress=None,
                     trust_remote_code: bool = False) -> dict[str, Any]:
    from layerscope.engines.ov import OvSession, check_precision
    from layerscope.model.manifest import verify_export
    from layerscope.export.variant_files import record_variant, variant_parity, worst_output

    say = progress or (lambda msg: None)
    export_dir = Path(export_dir)
    manifest = read_manifest(export_dir)
    verify_export(export_dir, manifest)
    precision = kind[3:]
    check_precision(precision)
    if precision == "int8":
        int8 = manifest.variant("int8")
        if int8 is None:
            raise ExportError("ov-int8 reads the int8 variant, and this export has none: make 'int8' first "
                              "(make_variant makes it on the way to 'ov-int8')")
        file = int8.file
    else:
        file = manifest.onnx_file
    path = export_dir / file
    existing = manifest.variant(kind)
    if existing and not force and existing.file == file and existing.sha256 == file_sha256(path):
        return existing.to_dict()
    t0 = time.perf_counter()
    say(f"compiling {file} with OpenVINO ({precision})")
    session = OvSession(path, precision)
    build_s = time.perf_counter() - t0
    say("checking every output against PyTorch fp32")
    parity = variant_parity(export_dir, manifest, path, session=session, trust_remote_code=trust_remote_code)
    tol = dict(OV_TOLERANCES[kind], **(tolerance or {}))
    worst = worst_output(parity["outputs"], tol)
    if worst:
        raise ExportError(f"variant '{kind}' is outside its tolerance: {worst}; nothing was recorded")
    entry = {
        "file": file, "sha256": file_sha256(path), "bytes": path.stat().st_size, "engine": "ov",
        "precision": precision, "compiled_precision": session.precision, "openvino": session.version,
        "build_seconds": round(build_s, 2), "fusions": None, "details": {"reads": file},
        "tolerance": tol, "parity": parity,
    }
    record_variant(export_dir, kind, entry)
    return entry
