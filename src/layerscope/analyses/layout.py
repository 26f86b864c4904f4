"""Where an analysis writes its results, and whether an earlier result there is reused or replaced.

Default layout, as MTEB keeps runs apart: ``results/<model>/<revision>/<analysis>/<spec hash>/``, where
``<model>`` is the model's alias or name (a hub id ``org/name`` becomes ``org__name``),
``<revision>`` is the hub revision asked for, else the first 12 hex digits of the weights'
sha256 (so a retrained local model gets a new folder instead of overwriting the old figures), and
``<spec hash>`` is 12 hex digits of the run's ``RunSpec`` identity (analyses/spec.py): another engine,
max length, pooling or option is another run in its own folder beside the others. ``runs.md`` under
the analysis folder lists them (rebuilt from the runs' results.json after every run).
Several models in one run (side-by-side figures): their names and revisions joined with ``+``,
in the order given, e.g. ``results/minilm+bert-tiny/1a2b3c4d5e6f+77aa88bb99cc/sts/0a1b2c3d4e5f/``.

Running the same spec again reuses the saved result (``--recompute`` runs it again). Behind an
explicit ``--out``, a result of another spec is refused rather than overwritten, with one line naming
each key that differs, old and new: keep both with another ``--out``, or replace with ``--force``.
A result written before results carried a spec is never reused; it still opens with ``layerscope report``.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from layerscope.errors import InputError
from layerscope.model.manifest_type import SourceInfo

RESULTS_ROOT = Path("results")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-.") or "model"


def model_name(spec: str, src: SourceInfo) -> str:
    """A folder name for a model: its alias, its hub id with ``/`` as ``__``, or its directory's name."""
    if src.alias:
        return _slug(str(src.alias).replace("/", "__"))
    if src.is_local is False and src.path_or_id:
        return _slug(str(src.path_or_id).replace("/", "__"))
    path = src.path_or_id or spec
    return _slug(Path(str(path)).name)


def model_revision(src: SourceInfo, key: str) -> str:
    """The revision asked for, else a short weights hash, else a short hash of the model's identity."""
    if src.revision:
        return _slug(str(src.revision))
    if src.weights_sha256:
        from layerscope.ownership import hex_part

        return hex_part(src.weights_sha256, "the model's source.weights_sha256")
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


def default_result_dir(spec, root: Path = RESULTS_ROOT) -> Path:
    """``results/<model>/<revision>/<analysis>/<spec hash>``; several models joined with ``+``.

    The one place the default folder of a run is built (``spec``: its RunSpec). Every part read from a file
    is slugged (names, revisions) or must be hex (a weights hash, see ``model_revision``), and the folder
    must lie under ``root`` once resolved.
    """
    from layerscope.ownership import check_under

    names = "+".join(m.folder for m in spec.models) or "no-model"
    revs = "+".join(m.revision for m in spec.models) or "none"
    return check_under(Path(root) / names / revs / spec.analysis / spec.hash, root)


def _older_layout(analysis_dir: Path) -> InputError:
    return InputError(f"{analysis_dir} holds a result written before results kept one folder per run spec; it "
                      f"still opens with `layerscope report {analysis_dir}`; to upgrade, move it aside "
                      f"(mv {analysis_dir} {analysis_dir}-old) and run again, or give --out")


def _not_as_written(out: Path) -> str | None:
    """Why ``out/results.json`` is not the file layerscope wrote (its sha256 against the folder's record of
    layerscope's files), or None when it is."""
    from layerscope.hashing import file_sha256
    from layerscope.ownership import owned

    rec = (owned(out) or {}).get("results.json")
    if not isinstance(rec, dict) or not rec.get("sha256"):
        return "has no recorded sha256 in the folder's record of layerscope's files"
    path = Path(out) / "results.json"
    if path.is_symlink() or not path.is_file() or file_sha256(path) != rec["sha256"]:
        return "was changed since layerscope wrote it (its sha256 no longer matches the folder's record)"
    return None


def claim_result_dir(out: Path, spec, *, recompute: bool = False, force: bool = False, inputs=(),
                     default_layout: bool = False) -> tuple[str, Any]:
    """``("new", None)``, ``("reuse", earlier Results)`` or ``("replace", None)`` for result dir ``out``.

    Refuses (InputError): a file, a folder layerscope did not make, user files in a result dir
    that would be replaced, a folder holding an input, and a result of another spec without --force.
    """
    from layerscope.analyses.rendering import load_results
    from layerscope.ownership import claim
    from layerscope.report.results import GarbledResults

    if default_layout and (out.parent / "results.json").is_file():
        raise _older_layout(out.parent)
    where = claim(out, "result", keep=True, inputs=inputs)
    if where.kind is None:
        return "new", None
    garbled = None
    try:
        earlier = load_results(out)
    except GarbledResults as exc:
        earlier, garbled = None, exc.reason
    except InputError:
        earlier = None
    complete = earlier is not None and earlier.complete
    older = complete and (earlier.older or earlier.spec_hash is None or earlier.identity is None)
    same = complete and not older and earlier.spec_hash == spec.hash and earlier.identity == spec.identity()
    if same and not (recompute or force):
        changed = _not_as_written(out)
        if changed:
            raise InputError(f"{out}/results.json {changed}, so its figures are not reused; move {out} aside "
                             f"(mv {out} {out}-edited) or give another --out, and run again")
        return "reuse", earlier
    if not (same or force or (recompute and older)):
        if older:
            why = ("a result written by an older layerscope, without a run spec; it still opens with "
                   f"`layerscope report {out}`; keep it and give another --out, or move it aside (mv {out} {out}-old)")
            raise InputError(f"{out} holds {why}")
        if complete:
            why = "a run that differs in " + ", ".join(spec.differences(earlier.identity))
        elif garbled:
            why = f"a results.json that garbles its figures ({garbled})"
        else:
            why = "an unreadable results.json"
        raise InputError(f"{out} holds {why}; keep both with another --out, or replace it with --force")
    claim(out, "result", force=True, inputs=inputs)  # user files or an input inside: refused, never deleted
    return "replace", None


def write_runs_index(analysis_dir: Path) -> Path | None:
    """Rebuild ``runs.md``: one row per run folder under ``analysis_dir``, read from its results.json.

    The index is derived, never read back: two runs finishing together at worst leave it one run
    behind, and the next run rewrites it.
    """
    import os

    from layerscope.analyses.rendering import load_results

    rows = []
    for path in sorted(Path(analysis_dir).glob("*/results.json")):
        try:
            saved = load_results(path)
        except InputError:
            continue
        try:
            rows.append(_runs_row(path, saved))
        except (TypeError, ValueError, AttributeError):  # a garbled results.json: left out of the index
            continue
    if not rows:
        return None
    head = ["run", "created", "engine (asked -> ran)", "layers", "poolings", "max length", "data", "options"]
    lines = [f"# Runs of {Path(analysis_dir).name}", "",
             "One folder per run spec; `layerscope report RUN` re-renders one.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    from layerscope.report.writer import md_data

    lines += ["| " + " | ".join(md_data(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |"
              for row in rows]
    index = check_runs_index(analysis_dir)
    tmp = index.with_name(f"{index.name}.tmp{os.getpid()}")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    try:
        os.replace(tmp, index)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {index} ({exc.strerror}); move it aside: layerscope keeps its index of "
                         "runs there") from None
    return index


def check_runs_index(analysis_dir: Path) -> Path:
    """``runs.md`` of ``analysis_dir``; one line when something other than a file is in its place."""
    index = Path(analysis_dir) / "runs.md"
    if index.is_symlink() or (index.exists() and not index.is_file()):
        raise InputError(f"{index} is not a file (a folder or a link); layerscope writes its index of runs there: "
                         "move it aside")
    return index


def _runs_row(path: Path, saved) -> list[str]:
    settings = saved.settings
    opts = ", ".join(f"{k}={v}" for k, v in sorted(settings.options.items()) if v not in (None, False))
    engines = ",".join(settings.engines_resolved)
    return [path.parent.name, str(saved.created or ""), f"{settings.engine} -> {engines or '-'}",
            str(settings.layers), ",".join(settings.poolings) or "default", str(settings.max_length or "model's"),
            str(settings.data or "-"), opts or "-"]


def check_summary(out: Path, results, analysis) -> None:
    """Print a reused result's summary (typed ``results``) to nowhere first: a results.json whose figures are
    garbled is one line."""
    import io

    from rich.console import Console

    from layerscope.analyses.rendering import print_summary
    from layerscope.report.compare import print_comparison

    quiet = Console(file=io.StringIO(), width=120)
    try:
        print_summary(analysis, results, quiet)
        print_comparison(results, quiet)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise InputError(f"{out}/results.json lacks or garbles a field its summary needs ({type(exc).__name__}: "
                         f"{str(exc)[:120]}); it was edited since it was written: run again with --recompute "
                         "(or --force)") from None
