"""Where an analysis writes its results, and whether an earlier result there is reused or replaced.

Default layout, as MTEB keeps runs apart: ``results/<model>/<revision>/<analysis>/``, where
``<model>`` is the model's alias or name (a hub id ``org/name`` becomes ``org__name``) and
``<revision>`` is the hub revision asked for, else the first 12 hex digits of the weights'
sha256 (so a retrained local model gets a new folder instead of overwriting the old figures).
Several models in one run (side-by-side figures): their names and revisions joined with ``+``,
in the order given, e.g. ``results/minilm+bert-tiny/1a2b3c4d5e6f+77aa88bb99cc/sts/``.

A result directory records the identity of its run (analysis, each model's weights identity,
the settings, and the sha256 of the data file). Running the same identity again reuses the
saved result (``--recompute`` runs it again). A different identity (other options, data or
weights behind an explicit ``--out``) is refused rather than overwritten: keep both with another
``--out``, or replace with ``--force``.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

RESULTS_ROOT = Path("results")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-.") or "model"


def model_name(spec: str, manifest: dict) -> str:
    """A folder name for a model: its alias, its hub id with ``/`` as ``__``, or its directory's name."""
    src = manifest.get("source", {}) or {}
    if src.get("alias"):
        return _slug(str(src["alias"]).replace("/", "__"))
    if src.get("is_local") is False and src.get("path_or_id"):
        return _slug(str(src["path_or_id"]).replace("/", "__"))
    path = src.get("path_or_id") or spec
    return _slug(Path(str(path)).name)


def model_revision(manifest: dict, key: str) -> str:
    """The revision asked for, else a short weights hash, else a short hash of the model's identity."""
    src = manifest.get("source", {}) or {}
    if src.get("revision"):
        return _slug(str(src["revision"]))
    if src.get("weights_sha256"):
        return str(src["weights_sha256"])[:12]
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def default_result_dir(analysis: str, sources: list[tuple[str, dict, str]], root: Path = RESULTS_ROOT) -> Path:
    """``results/<model>/<revision>/<analysis>``; several models joined with ``+``."""
    names = "+".join(model_name(spec, man) for spec, man, _ in sources) or "no-model"
    revs = "+".join(model_revision(man, key) for _, man, key in sources) or "none"
    return Path(root) / names / revs / analysis


def _file_sha256(path: str | None) -> str | None:
    if not path:
        return None
    p = Path(path)
    if not p.is_file():
        return None
    from layerscope.hashing import file_sha256

    return file_sha256(p)


def result_identity(analysis: str, settings: dict[str, Any], sources: list[tuple[str, dict, str]],
                    data: str | None) -> dict[str, Any]:
    """What makes two runs the same: analysis, each model's identity, the settings, the data's content.

    A data file counts by its content (the same file named by another relative path is the same data).
    """
    settings = json.loads(json.dumps(settings, sort_keys=True, default=str))
    digest = _file_sha256(data)
    if digest is not None and "data" in settings:
        settings["data"] = Path(str(data)).name
    return {"analysis": analysis, "models": [key for _, _, key in sources], "settings": settings,
            "data_sha256": digest}


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    diffs = []
    if old.get("analysis") != new.get("analysis"):
        diffs.append(f"analysis {old.get('analysis')}")
    if old.get("models") != new.get("models"):
        diffs.append("model weights")
    if old.get("data_sha256") != new.get("data_sha256"):
        diffs.append("data")
    o, n = old.get("settings", {}), new.get("settings", {})
    for key in sorted(set(o) | set(n)):
        if key == "models":
            continue
        if o.get(key) != n.get(key):
            diffs.append(f"{key}={o.get(key)!r}")
    return diffs


def claim_result_dir(out: Path, identity: dict[str, Any], *, recompute: bool = False, force: bool = False,
                     inputs=()) -> tuple[str, dict[str, Any] | None]:
    """``("new", None)``, ``("reuse", earlier results)`` or ``("replace", None)`` for result dir ``out``.

    Refuses (InputError): a file, a folder layerscope did not make, user files in a result dir
    that would be replaced, a folder holding an input, and a result of another identity without --force.
    """
    from layerscope.ownership import claim

    where = claim(out, "result", keep=True, inputs=inputs)
    if where.kind is None:
        return "new", None
    try:
        earlier = json.loads((out / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # RecursionError: nested deeper than the JSON reader goes
        earlier = None
    complete = isinstance(earlier, dict) and "per_model" in earlier
    same = complete and earlier.get("identity") == identity
    if same and not (recompute or force):
        return "reuse", earlier
    if not (same or force or (recompute and complete and "identity" not in earlier)):
        if complete and "identity" in earlier:
            why = "a result that differs in " + ", ".join(_differences(earlier["identity"], identity))
        else:
            why = ("a result whose settings were not recorded (use --recompute)" if complete
                   else "an unreadable results.json")
        raise InputError(f"{out} holds {why}; keep both with another --out, or replace it with --force")
    claim(out, "result", force=True, inputs=inputs)  # user files or an input inside: refused, never deleted
    return "replace", None
