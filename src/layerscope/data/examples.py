"""Built-in example data and the labeled-file reader shared by ``lens`` and ``saliency``."""

from __future__ import annotations

from pathlib import Path

from layerscope.data.corpus import detect_format, read_corpus
from layerscope.errors import InputError

DATA_DIR = Path(__file__).resolve().parent
SENTIMENT = DATA_DIR / "sentiment_small.jsonl"  # 60 sentences written for layerscope, pos/neg
LENS_TEXTS = DATA_DIR / "lens_texts.jsonl"  # 20 plain sentences written for layerscope


def read_texts(path: str | Path) -> list[str]:
    """The texts of a corpus file (its default text field/column); empty texts are refused."""
    return read_texts_field(path, None)


def read_labeled(path: str | Path, text_field: str = "text", label_field: str = "label") -> tuple[list[str], list[str]]:
    """(texts, labels) of a .jsonl/.csv/.tsv file with a text and a label field/column."""
    if detect_format(path) in ("txt", "stdin"):
        raise InputError(f"{path}: a labeled file is needed (.jsonl with '{text_field}' and '{label_field}', "
                         f"or .csv/.tsv with those columns); a .txt file has no labels")
    texts = read_texts_field(path, text_field)
    labels_rec, _ = read_corpus(path, text_field=label_field)
    labels = [r.text.strip() for r in labels_rec]
    missing = [r.line for r in labels_rec if not r.text.strip()]
    if missing:
        raise InputError(f"{path}: {len(missing)} row(s) without a label, first on line {missing[0]}")
    return texts, labels


def read_texts_field(path: str | Path, field: str | None) -> list[str]:
    records, _ = read_corpus(path, text_field=field)
    empty = [r.line for r in records if not r.text.strip()]
    if empty:
        raise InputError(f"{path}: {len(empty)} empty text(s), first on line {empty[0]}; remove them")
    if not records:
        raise InputError(f"{path} holds no texts")
    return [r.text for r in records]
