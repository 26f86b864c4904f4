"""Sentence pairs with a human similarity score (STS-style data).

Sources, detected from what the file holds, not only from its name:

* the STS Benchmark's original files, as distributed: tab-separated, no header,
  no quoting (``"`` belongs to the sentence), CRLF or LF line endings, 7 columns
  (genre, file, year, id, score, sentence1, sentence2) or 9 (two source columns
  more);
* CSV (standard quoting), TSV (no quoting) or JSONL with named columns
  (``sentence1``/``sentence2``/``score`` by default, or the names given);
* a Hugging Face dataset id (``hf:owner/name`` or ``owner/name[:split]``), read with
  the ``datasets`` library when it is installed and the hub can be reached.

Every bad row is one ``InputError`` naming the file and line: a missing score, a
score that is not a number or is NaN/inf, an empty sentence, too few columns;
fewer than 3 pairs in all is an error too.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from layerscope.errors import InputError

__all__ = ["Pairs", "read_pairs", "read_sts", "sts_dir", "default_sts_file"]

MIN_PAIRS = 3
_S1_NAMES = ("sentence1", "sentence_1", "s1", "text1", "text_1", "sentence_a", "premise")
_S2_NAMES = ("sentence2", "sentence_2", "s2", "text2", "text_2", "sentence_b", "hypothesis")
_SCORE_NAMES = ("score", "similarity_score", "similarity", "label", "relatedness_score", "gold")


@dataclass
class Pairs:
    """Aligned lists: pair ``i`` is ``(s1[i], s2[i])`` with human score ``scores[i]``."""

    s1: list[str]
    s2: list[str]
    scores: np.ndarray  # float64 [n]
    source: str
    fmt: str
    ids: list[str] = field(default_factory=list)
    genres: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.s1)

    def unique_texts(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(distinct sentences, index of s1[i] in them, index of s2[i] in them)."""
        pos: dict[str, int] = {}
        for t in self.s1 + self.s2:
            if t not in pos:
                pos[t] = len(pos)
        i1 = np.fromiter((pos[t] for t in self.s1), dtype=np.int64, count=len(self.s1))
        i2 = np.fromiter((pos[t] for t in self.s2), dtype=np.int64, count=len(self.s2))
        return list(pos), i1, i2

    def describe(self) -> dict:
        return {"source": self.source, "format": self.fmt, "pairs": len(self),
                "score_min": float(self.scores.min()), "score_max": float(self.scores.max())}


# ---------------------------------------------------------------- defaults

def sts_dir() -> Path | None:
    """Where the STS Benchmark lives: $LAYERSCOPE_STS_DIR, else ../shared/data/stsbenchmark (if present)."""
    env = os.environ.get("LAYERSCOPE_STS_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path("../shared/data/stsbenchmark"), Path(__file__).resolve().parents[4] / "shared" / "data"
                   / "stsbenchmark"]
    for c in candidates:
        if (c / "sts-test.csv").exists():
            return c
    return None


def default_sts_file(split: str = "test") -> Path:
    d = sts_dir()
    if d is None:
        raise InputError("no STS data found (looked at $LAYERSCOPE_STS_DIR and ../shared/data/stsbenchmark); "
                         "give a pairs file with --data FILE")
    return d / f"sts-{split}.csv"


# ---------------------------------------------------------------- reading

def _score(raw, where: str) -> float:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise InputError(f"{where}: the score is missing; every pair needs a numeric similarity score")
    if isinstance(raw, bool):
        raise InputError(f"{where}: the score {raw!r} is not a number")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise InputError(f"{where}: the score {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise InputError(f"{where}: the score is {raw!r}; scores must be finite numbers")
    return value


def _sentence(raw, which: str, where: str) -> str:
    if raw is None:
        raise InputError(f"{where}: {which} is missing")
    if not isinstance(raw, str):
        raise InputError(f"{where}: {which} is {type(raw).__name__}, not text")
    if not raw.strip():
        raise InputError(f"{where}: {which} is empty; every pair needs two non-empty sentences")
    return raw


def _is_float(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _first_line(path: Path) -> str:
    with open(path, "r", encoding="utf-8-sig", newline="") as fh:
        for line in fh:
            if line.strip():
                return line.rstrip("\r\n")
    return ""


def _detect(path: Path, fmt: str | None) -> str:
    if fmt:
        fmt = fmt.lower()
        if fmt not in ("sts", "csv", "tsv", "jsonl"):
            raise InputError(f"unknown pairs format '{fmt}'; use sts, csv, tsv or jsonl")
        return fmt
    name = path.name.lower()
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    first = _first_line(path)
    cols = first.split("\t")
    if len(cols) >= 7 and _is_float(cols[4]) and not _is_float(cols[5]):
        return "sts"  # the original STS Benchmark layout (no header, score in column 5)
    if name.endswith(".tsv") or (len(cols) >= 3 and first.count("\t") >= 2):
        return "tsv"
    if name.endswith((".csv", ".txt")) or first.count(",") >= 2:
        return "csv"
    raise InputError(f"{path}: cannot tell the format of this pairs file; use .csv/.tsv/.jsonl with columns "
                     "sentence1, sentence2, score, or the STS Benchmark's original files")


def _pick(columns: list[str], given: str | None, names: tuple[str, ...], what: str, option: str,
          where: str) -> str:
    if given:
        if given not in columns:
            raise InputError(f"{where}: no column '{given}' (from {option}); columns: {', '.join(columns)}")
        return given
    lower = {c.lower().strip(): c for c in columns}
    for n in names:
        if n in lower:
            return lower[n]
    raise InputError(f"{where}: no {what} column (looked for {', '.join(names[:3])}, ...); name it with "
                     f"{option} (columns: {', '.join(columns)})")


def tab_rows(path: Path) -> Iterator[tuple[str, list[str]]]:
    """``(where, columns)`` for each non-blank line of a tab-separated file without quoting or header, in file
    order: ``where`` is ``path:line`` for messages, the columns are the line split at every tab."""
    with open(path, "r", encoding="utf-8-sig", newline="") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield f"{path}:{lineno}", line.split("\t")


def _read_sts(path: Path) -> tuple[list, list, list, list, list]:
    s1, s2, scores, ids, genres = [], [], [], [], []
    for where, cols in tab_rows(path):
        if len(cols) < 7:
            raise InputError(f"{where}: {len(cols)} tab-separated columns; the STS format "
                             "has 7 (genre, file, year, id, score, sentence1, sentence2) or 9")
        scores.append(_score(cols[4], where))
        s1.append(_sentence(cols[5], "sentence1 (column 6)", where))
        s2.append(_sentence(cols[6], "sentence2 (column 7)", where))
        ids.append(f"{cols[1]}-{cols[2]}-{cols[3]}")
        genres.append(cols[0])
    return s1, s2, scores, ids, genres


def _read_table(path: Path, fmt: str, sentence1, sentence2, score) -> tuple[list, list, list, list, list]:
    s1, s2, scores, ids = [], [], [], []
    with open(path, "r", encoding="utf-8-sig", newline="") as fh:
        if fmt == "csv":
            reader = csv.reader(fh)
        else:
            reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(f"{path} is empty") from None
        except csv.Error as exc:
            raise InputError(f"{path}:1: {exc}") from None
        c1 = _pick(header, sentence1, _S1_NAMES, "first-sentence", "--sentence1", str(path))
        c2 = _pick(header, sentence2, _S2_NAMES, "second-sentence", "--sentence2", str(path))
        cs = _pick(header, score, _SCORE_NAMES, "score", "--score", str(path))
        k1, k2, ks = header.index(c1), header.index(c2), header.index(cs)
        try:
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise InputError(f"{where}: {len(row)} columns, the header has {len(header)}"
                                     + (" (is a sentence quoted with an unescaped quote?)" if fmt == "csv" else ""))
                scores.append(_score(row[ks], where))
                s1.append(_sentence(row[k1], c1, where))
                s2.append(_sentence(row[k2], c2, where))
                ids.append(str(reader.line_num))
        except csv.Error as exc:
            raise InputError(f"{path}:{reader.line_num}: {exc}") from None
    return s1, s2, scores, ids, []


def _read_jsonl(path: Path, sentence1, sentence2, score) -> tuple[list, list, list, list, list]:
    s1, s2, scores, ids = [], [], [], []
    k1 = k2 = ks = None
    from layerscope.data.jsonl import iter_json_objects

    for lineno, obj in iter_json_objects(path, "with the two sentences and a score"):
        where = f"{path}:{lineno}"
        if k1 is None:
            keys = list(obj)
            k1 = _pick(keys, sentence1, _S1_NAMES, "first-sentence", "--sentence1", where)
            k2 = _pick(keys, sentence2, _S2_NAMES, "second-sentence", "--sentence2", where)
            ks = _pick(keys, score, _SCORE_NAMES, "score", "--score", where)
        scores.append(_score(obj.get(ks), where))
        s1.append(_sentence(obj.get(k1), k1, where))
        s2.append(_sentence(obj.get(k2), k2, where))
        ids.append(str(obj.get("id", lineno)))
    return s1, s2, scores, ids, []


def _looks_like_hub_id(spec: str) -> bool:
    if spec.startswith("hf:"):
        return True
    p = Path(spec.split(":")[0])
    return (not p.exists() and spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
            and not p.suffix)


def _read_hub(spec: str, sentence1, sentence2, score) -> tuple[list, list, list, list, list]:
    from layerscope.data.hf_dataset import DatasetSpec, load, parse_spec

    parsed = parse_spec(spec)
    parsed = parsed if parsed.split else DatasetSpec(parsed.name, "test", parsed.config)
    ds = load(parsed)  # hub name, save_to_disk directory or .arrow files; one clear error otherwise
    where = f"dataset {parsed}"
    cols = list(ds.column_names)
    c1 = _pick(cols, sentence1, _S1_NAMES, "first-sentence", "--sentence1", where)
    c2 = _pick(cols, sentence2, _S2_NAMES, "second-sentence", "--sentence2", where)
    cs = _pick(cols, score, _SCORE_NAMES, "score", "--score", where)
    s1, s2, scores, ids = [], [], [], []
    for i, row in enumerate(ds):
        w = f"{where} row {i}"
        scores.append(_score(row[cs], w))
        s1.append(_sentence(row[c1], c1, w))
        s2.append(_sentence(row[c2], c2, w))
        ids.append(str(i))
    return s1, s2, scores, ids, []


def read_pairs(source: str | os.PathLike, *, sentence1: str | None = None, sentence2: str | None = None,
               score: str | None = None, fmt: str | None = None) -> Pairs:
    """Read scored sentence pairs from a file (STS original, CSV, TSV, JSONL) or a hub dataset id."""
    spec = str(source)
    path = Path(spec).expanduser()
    if not path.exists() and _looks_like_hub_id(spec):
        s1, s2, scores, ids, genres = _read_hub(spec, sentence1, sentence2, score)
        kind = "hub"
    else:
        if not path.exists():
            raise InputError(f"pairs file {path} does not exist")
        if path.is_dir():
            raise InputError(f"{path} is a directory; give a pairs file (e.g. {path}/sts-test.csv)")
        kind = _detect(path, fmt)
        try:
            if kind == "sts":
                if sentence1 or sentence2 or score:
                    raise InputError(f"{path} is in the original STS format (no header); "
                                     "--sentence1/--sentence2/--score only apply to files with named columns")
                s1, s2, scores, ids, genres = _read_sts(path)
            elif kind == "jsonl":
                s1, s2, scores, ids, genres = _read_jsonl(path, sentence1, sentence2, score)
            else:
                s1, s2, scores, ids, genres = _read_table(path, kind, sentence1, sentence2, score)
        except UnicodeDecodeError as exc:
            raise InputError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if len(s1) < MIN_PAIRS:
        raise InputError(f"{spec} holds {len(s1)} pair(s); correlations need at least {MIN_PAIRS}")
    return Pairs(s1, s2, np.asarray(scores, dtype=np.float64), spec, kind, ids, genres)


def read_sts(path: str | os.PathLike) -> tuple[list[str], list[str], np.ndarray]:
    """(sentence1s, sentence2s, gold scores) of an STS Benchmark file in its original layout (bench ``--sts``)."""
    if not Path(path).expanduser().is_file():
        raise InputError(f"--sts {path}: no such file (give e.g. sts-test.csv of the STS Benchmark)")
    pairs = read_pairs(path, fmt="sts")
    return pairs.s1, pairs.s2, pairs.scores
