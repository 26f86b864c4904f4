"""The files and the record of one variant: saving its graph (weights beside it when large), removing a failed
one, its parity against PyTorch fp32 on the export's own validation batches, and its manifest entry.

Shared by the ONNX variants (``variants.py``, ``gqa.py``) and the OpenVINO precisions (``ov_variant.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from layerscope.model.manifest import MANIFEST, read_manifest_dict
from layerscope.model.manifest_type import Manifest


def save_variant(model, dst: Path, *, external: bool = False) -> None:
    """Save a variant graph; its weights go to ``<file>_data`` when the export's do, or when over 1.8 GB."""
    from layerscope.export import external as ext

    big = external or ext.uses_external_data(model) or model.ByteSize() >= ext.EXTERNAL_DATA_BYTES
    (dst.parent / ext.data_file(dst.name)).unlink(missing_ok=True)
    ext.save_graph(model, dst, external=big)


def variant_data_files(dst: Path) -> list[Path]:
    from layerscope.export import external as ext

    return ext.data_files(dst) if dst.exists() else []


def remove_variant(dst: Path) -> None:
    """A variant that failed leaves nothing behind: its graph and its external data."""
    from layerscope.export import external as ext

    for path in (dst.parent / ext.data_file(dst.name), dst.with_name(dst.name + ".data")):
        path.unlink(missing_ok=True)
    dst.unlink(missing_ok=True)


class quiet:
    """Silence the optimizer's and quantizer's logging and warnings while they run."""

    def __enter__(self):
        import logging
        import warnings

        self._warn = warnings.catch_warnings()
        self._warn.__enter__()
        warnings.simplefilter("ignore")
        self._levels = {}
        for name in ("onnxruntime", "root", "fusion_base", "onnx_model", "optimizer"):
            lg = logging.getLogger(None if name == "root" else name)
            self._levels[name] = lg.level
            lg.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        import logging

        for name, level in self._levels.items():
            logging.getLogger(None if name == "root" else name).setLevel(level)
        self._warn.__exit__(*exc)
        return False


def variant_parity(export_dir: Path, manifest: Manifest, onnx_path: Path, *, session=None,
                   trust_remote_code: bool = False) -> dict[str, Any]:
    """The export's own parity check (same texts, same batches) run on a variant file (``trust_remote_code``:
    its torch reference is the model's own code, which is never run unasked)."""
    from layerscope.export.validate import VALIDATION_TEXTS, compare_outputs
    from layerscope.model.families import family_of
    from layerscope.model.source import load_torch_model

    family = family_of(manifest)
    net = load_torch_model(manifest.source.model_source(), family, trust_remote_code=trust_remote_code)
    return compare_outputs(net, family, onnx_path, manifest, VALIDATION_TEXTS, list(manifest.pooled_modes),
                           list(manifest.pooled_layers), session=session)


def worst_output(outputs: dict[str, dict[str, float]], tol: dict[str, float | None]) -> str | None:
    """A description of the first output outside ``tol``, or None."""
    import math

    for name, s in outputs.items():
        if tol.get("max_abs") is not None and not s["max_abs"] <= tol["max_abs"]:
            return f"{name} max |diff| {s['max_abs']:.3g} > {tol['max_abs']:g}"
        if tol.get("min_cos") is not None and not (s["min_cos"] >= tol["min_cos"] and not math.isnan(s["min_cos"])):
            return f"{name} min cosine {s['min_cos']:.6f} < {tol['min_cos']:g}"
    return None


def discard_variant(export_dir: Path, kind: str, dst: Path) -> None:
    """A variant that failed leaves nothing: its files, and the entry of the variant a forced remake wrote
    over (its files are gone, so layerscope verify would refuse the export)."""
    from layerscope.atomic import write_json_atomic

    remove_variant(dst)
    manifest = read_manifest_dict(export_dir)  # edited and written back
    if kind in (manifest.get("variants") or {}):
        del manifest["variants"][kind]
        write_json_atomic(export_dir / MANIFEST, manifest)
        logging.getLogger("layerscope").warning("the earlier '%s' variant of %s was replaced and is gone; "
                                                "make it again without the failing option", kind, export_dir)


def record_variant(export_dir: Path, kind: str, entry: dict[str, Any]) -> None:
    from layerscope.atomic import write_json_atomic

    manifest = read_manifest_dict(export_dir)  # edited and written back
    # the export's graph it was made for: a variant is used only while it is still that graph (model/derived.py)
    entry.setdefault("source_sha256", manifest.get("onnx_sha256"))
    manifest.setdefault("variants", {})[kind] = entry
    write_json_atomic(export_dir / MANIFEST, manifest)


def variant_names(dst: Path) -> list[str]:
    """Every file making the variant ``dst`` may write beside it: the graph, its external data (ONNX
    Runtime's ``<file>.data`` before it is gathered into ``<file>_data``) and their temporary siblings."""
    from layerscope.export import external as ext

    data = ext.data_file(dst.name)
    return [dst.name, dst.name + ".tmp", data, data + ".tmp", dst.name + ".data"]
