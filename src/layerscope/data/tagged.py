"""Words with a label each, for token probes: CoNLL-U files and JSON lines.

* CoNLL-U (``.conllu``): sentences separated by blank lines, ``#`` comments, one word per line with ten
  tab-separated columns; the label is one column (``upos`` by default: ``xpos``, ``deprel``, ``feats``,
  ``lemma`` too). Multiword-token lines (``1-2``) and empty nodes (``1.1``) are left out: the words are the
  syntactic words.
* JSON lines (``.jsonl``): one object per sentence with a list of words and a list of labels of the same
  length (fields ``words`` and ``labels`` unless named).

A sentence's text is its words joined by single spaces, so each word's character span in the text is known
exactly (``Sentence.spans``); probes align the model's tokens to those spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from layerscope.errors import InputError

CONLLU_COLUMNS = {"form": 1, "lemma": 2, "upos": 3, "xpos": 4, "feats": 5, "head": 6, "deprel": 7}


@dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    labels: tuple[str, ...]
    where: str  # file:line of its first word, for messages

    @property
    def text(self) -> str:
        return " ".join(self.words)

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Each word's ``[start, end)`` in ``text``."""
        out, at = [], 0
        for w in self.words:
            out.append((at, at + len(w)))
            at += len(w) + 1
        return out


def _word(word, where: str) -> str:
    if not isinstance(word, str) or not word or any(c.isspace() for c in word):
        raise InputError(f"{where}: the word {word!r} is empty or holds white space; a word of a tagged "
                         "sentence is one token of text")
    return word


def read_conllu(path, column: str = "upos") -> list[Sentence]:
    """The sentences of a CoNLL-U file, labelled by ``column``."""
    if column not in CONLLU_COLUMNS or column == "form":
        raise InputError(f"--label-column {column}: a CoNLL-U label is one of "
                         f"{', '.join(c for c in CONLLU_COLUMNS if c != 'form')}")
    path = Path(path)
    sentences: list[Sentence] = []
    words: list[str] = []
    labels: list[str] = []
    first = ""

    def close():
        nonlocal words, labels
        if words:
            sentences.append(Sentence(tuple(words), tuple(labels), first))
        words, labels = [], []

    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            close()
            continue
        if line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise InputError(f"{path}:{lineno}: a CoNLL-U word line has 10 tab-separated columns, this one "
                             f"{len(cols)}")
        if "-" in cols[0] or "." in cols[0]:  # a multiword token or an empty node
            continue
        if not words:
            first = f"{path}:{lineno}"
        words.append(_word(cols[1], f"{path}:{lineno}"))
        labels.append(cols[CONLLU_COLUMNS[column]])
    close()
    return sentences


def read_tagged_jsonl(path, words: str = "words", labels: str = "labels") -> list[Sentence]:
    """The sentences of a JSON-lines file: ``{"words": [...], "labels": [...]}`` per line."""
    from layerscope.data.jsonl import iter_json_objects

    path = Path(path)
    out = []
    for lineno, obj in iter_json_objects(path, f"with '{words}' and '{labels}' lists"):
        w, lab = obj.get(words), obj.get(labels)
        where = f"{path}:{lineno}"
        if not isinstance(w, list) or not isinstance(lab, list):
            raise InputError(f"{where}: needs lists '{words}' and '{labels}' (name them with --words-field and "
                             "--labels-field)")
        if len(w) != len(lab):
            raise InputError(f"{where}: {len(w)} words but {len(lab)} labels; each word needs one label")
        if not w:
            continue
        out.append(Sentence(tuple(_word(x, where) for x in w), tuple(str(x) for x in lab), where))
    return out


def read_tagged(path, *, column: str = "upos", words: str = "words", labels: str = "labels") -> list[Sentence]:
    """CoNLL-U (``.conllu``) or JSON lines (``.jsonl``), by the file's suffix."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if path.suffix.lower() == ".conllu":
        sentences = read_conllu(path, column)
    elif path.suffix.lower() in (".jsonl", ".json"):
        sentences = read_tagged_jsonl(path, words, labels)
    else:
        raise InputError(f"{path}: token probes read a .conllu file or a .jsonl file (words and labels per line)")
    if not sentences:
        raise InputError(f"{path}: no sentences")
    return sentences
