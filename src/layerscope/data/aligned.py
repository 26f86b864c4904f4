"""Readers for paired texts (source, target, optional category).

Two ways in:

* one file with named columns: ``.tsv`` (header row, tab-separated, no quoting),
  ``.csv`` (header row, standard quoting) or ``.jsonl`` (one object per line);
  columns ``source`` and ``target`` by default, ``category`` when present;
* two line-aligned text files (``--source-file``/``--target-file``), line i
  of one paired with line i of the other; their lengths must match.

Bad input is one clear error naming the file and line: a missing column, an
empty side of a pair, files of different lengths, fewer than two pairs.
Duplicate pairs are kept and counted (``PairSet.duplicates``).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from layerscope.errors import InputError

__all__ = ["PairSet", "read_pairs", "read_line_pairs", "pairs_from_records", "MIN_PAIRS"]

MIN_PAIRS = 2


@dataclass
class PairSet:
    sources: list[str]
    targets: list[str]
    categories: list[str] | None
    ids: list[str]
    origin: str
    answers: list[int] | None = None
    duplicates: int = 0  # pairs equal (source and target) to an earlier pair, kept
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sources)


def pairs_from_records(rows: list[tuple[int, str | None, str | None, str | None, str | None]], origin: str,
                       *, where: str = "line") -> PairSet:
    """Check ``(line, source, target, category, id)`` rows and make a PairSet."""
    empty = [(ln, "source" if not (s or "").strip() else "target") for ln, s, t, _, _ in rows
             if not (s or "").strip() or not (t or "").strip()]
    if empty:
        ln, side = empty[0]
        more = f" (and {len(empty) - 1:,} more)" if len(empty) > 1 else ""
        raise InputError(f"{origin}: {where} {ln} has an empty {side} text{more}; every pair needs both sides "
                         "(remove or fill those rows)")
    if len(rows) < MIN_PAIRS:
        raise InputError(f"{origin}: {len(rows)} pair(s) found; alignment compares matched against scrambled "
                         f"pairs and needs at least {MIN_PAIRS}")
    sources = [s for _, s, _, _, _ in rows]
    targets = [t for _, _, t, _, _ in rows]
    cats = [c for _, _, _, c, _ in rows]
    has_cat = any(c not in (None, "") for c in cats)
    ids = [str(i) if i not in (None, "") else str(k) for k, (_, _, _, _, i) in enumerate(rows)]
    counts = Counter(zip(sources, targets))
    dup = sum(c - 1 for c in counts.values())
    notes = []
    if dup:
        notes.append(f"{dup:,} of {len(rows):,} pairs repeat an earlier pair exactly (kept; they count once each "
                     "in every figure)")
    dup_ids = len(ids) - len(set(ids))
    if dup_ids:
        raise InputError(f"{origin}: {dup_ids:,} duplicate pair id(s), e.g. '{Counter(ids).most_common(1)[0][0]}'; "
                         "ids must be unique")
    return PairSet(sources, targets, [c or "" for c in cats] if has_cat else None, ids, origin,
                   duplicates=dup, notes=notes)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path} is a directory; give a file")


def _read_text(path: Path) -> str:
    _check_file(path)
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}: line {line} is not valid UTF-8; re-save the file as UTF-8") from None


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _column(header: list[str], name: str, path: Path, required: bool, flag: str) -> int | None:
    if name in header:
        return header.index(name)
    if required:
        raise InputError(f"{path}: no column '{name}' (columns: {', '.join(header) or 'none'}); "
                         f"name the right one with {flag}")
    return None


def read_pairs(path: str | Path, *, source: str = "source", target: str = "target",
               category: str = "category", id_column: str = "id") -> PairSet:
    """Pairs from a TSV, CSV or JSONL file with named columns."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".tsv", ".csv", ".jsonl", ".ndjson"):
        raise InputError(f"{path}: pairs are read from .tsv, .csv or .jsonl files with '{source}' and '{target}' "
                         "columns, or from two line-aligned files via --source-file/--target-file")
    rows: list[tuple[int, str | None, str | None, str | None, str | None]] = []
    if suffix in (".jsonl", ".ndjson"):
        from layerscope.data.jsonl import iter_json_objects

        _check_file(path)

        for ln, obj in iter_json_objects(path, f"with '{source}' and '{target}' fields"):
            for key, flag in ((source, "--source-column"), (target, "--target-column")):
                if key not in obj:
                    raise InputError(f"{path}: line {ln} has no field '{key}' (fields: {', '.join(obj)}); "
                                     f"name the right one with {flag}")
                if not isinstance(obj[key], str):
                    raise InputError(f"{path}: line {ln} field '{key}' is {type(obj[key]).__name__}, not text")
            cat = obj.get(category)
            rows.append((ln, obj[source], obj[target], None if cat is None else str(cat),
                         None if obj.get(id_column) is None else str(obj.get(id_column))))
    else:
        text = _read_text(path)
        if suffix == ".tsv":
            table = [(ln, line.split("\t")) for ln, line in enumerate(_lines(text), start=1)]
        else:
            import io

            reader = csv.reader(io.StringIO(text, newline=""))
            table = []
            try:
                for rec in reader:
                    table.append((reader.line_num, rec))
            except csv.Error as exc:
                raise InputError(f"{path}: line {reader.line_num}: {exc}") from None
        if not table:
            raise InputError(f"{path} is empty; it needs a header row with '{source}' and '{target}'")
        header = [h.strip() for h in table[0][1]]
        si = _column(header, source, path, True, "--source-column")
        ti = _column(header, target, path, True, "--target-column")
        ci = _column(header, category, path, False, "")
        ii = _column(header, id_column, path, False, "")
        for ln, rec in table[1:]:
            if not any(c.strip() for c in rec):
                continue
            if len(rec) != len(header):
                raise InputError(f"{path}: line {ln} has {len(rec)} fields, the header has {len(header)}"
                                 + ("; a tab inside a text?" if suffix == ".tsv" else ""))
            rows.append((ln, rec[si], rec[ti], rec[ci] if ci is not None else None,
                         rec[ii] if ii is not None else None))
    return pairs_from_records(rows, str(path))


def read_line_pairs(source_file: str | Path, target_file: str | Path) -> PairSet:
    """Line i of ``source_file`` paired with line i of ``target_file``."""
    sp, tp = Path(source_file), Path(target_file)
    src = _lines(_read_text(sp))
    tgt = _lines(_read_text(tp))
    if len(src) != len(tgt):
        raise InputError(f"--source-file {sp} has {len(src):,} lines but --target-file {tp} has {len(tgt):,}; "
                         "line-aligned files must have the same number of lines")
    rows = [(i + 1, s, t, None, None) for i, (s, t) in enumerate(zip(src, tgt))]
    return pairs_from_records(rows, f"{sp} + {tp}")
