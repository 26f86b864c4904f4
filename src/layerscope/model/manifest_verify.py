"""``layerscope verify`` of an export: every file the manifest recorded hashed again, after the checks of its paths,
graph and sizes (``manifest.verify_export``), then every derived graph against its record and its source
(model/derived.py ``verify_derived``)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from layerscope.errors import ManifestError
from layerscope.hashing import file_sha256
from layerscope.model.lens_record import LensSidecar
from layerscope.model.manifest import read_manifest, verify_export
from layerscope.model.manifest_check import member


def verify_export_files(export_dir: Path) -> tuple[int, list[str]]:
    """Re-hash every file the export recorded: (files verified, one line per problem)."""
    export_dir = Path(export_dir)
    try:
        manifest = read_manifest(export_dir)
    except ManifestError as exc:
        return 0, [str(exc)]
    problems: list[str] = []
    try:
        verify_export(export_dir, manifest, check_hash=False)  # paths, graph and sizes; hashes below
    except ManifestError as exc:
        problems.append(str(exc))
    from layerscope.ownership import MARKER

    expected: dict[str, str] = {}
    for rel, rec in manifest.files.items():
        if rel != MARKER:  # older exports recorded the ownership marker too; it changes as files are added
            expected[rel] = rec.get("sha256") if isinstance(rec, Mapping) else None  # an edited entry: no hash
    if not expected:
        problems.append("the manifest records no per-file checksums (exported by an older layerscope); "
                        "export it again into a new folder (--force replaces only files layerscope recorded, unchanged)")
    expected.setdefault(manifest.onnx_file, manifest.onnx_sha256)
    for kind, entry in manifest.variants.items():
        expected[entry.file] = entry.sha256
        for rel, rec in (entry.external_data or {}).items():  # a variant of a big export
            expected[rel] = rec.get("sha256") if isinstance(rec, Mapping) else None  # an edited entry: no hash
    for sidecar in sorted([*export_dir.glob("lens-k*.json"), *export_dir.glob("lens-tuned-*.json")]):
        try:
            graph, digest = LensSidecar.checksum(sidecar)
            expected[graph] = digest
        except ManifestError as exc:  # names the file and the field
            problems.append(str(exc))
    checked = 0
    for rel, digest in expected.items():
        try:
            path = member(export_dir, rel, "file")
        except ManifestError as exc:
            problems.append(str(exc))
            continue
        if any(f"/{rel} " in p or p.startswith(f"{rel} ") for p in problems):
            continue  # already reported by the load checks
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif not digest:
            problems.append(f"{rel} has no recorded sha256")
        elif file_sha256(path) != digest:
            problems.append(f"{rel} does not match its checksum (sha256 differs): damaged or changed after export")
        else:
            checked += 1
    from layerscope.model.derived import verify_derived

    derived, more = verify_derived(export_dir, manifest)  # every derived graph against its record and source
    return checked + derived, problems + more
