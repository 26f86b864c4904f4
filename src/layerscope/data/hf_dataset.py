"""Hugging Face datasets as corpora and pair files: a hub name, a ``save_to_disk`` directory, ``.arrow`` files.

A dataset is named by one string so it can travel through ``--data`` and be
recorded in a store's or a result's settings:

    hf:NAME:SPLIT            e.g. hf:mteb/stsbenchmark-sts:test
    hf:NAME:CONFIG:SPLIT     e.g. hf:glue:stsb:validation

NAME is a hub id (read with ``datasets.load_dataset``), a directory written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (``load_from_disk``), or
an ``.arrow`` file or a directory of them (the ``arrow`` builder). Rows stream
in order, so memory does not grow with the dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from layerscope.errors import InputError

PREFIX = "hf:"


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    split: str | None = None
    config: str | None = None

    def __str__(self) -> str:
        parts = [self.name] + ([self.config] if self.config else []) + ([self.split] if self.split else [])
        return PREFIX + ":".join(parts)


def is_dataset_spec(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def dataset_spec(name: str, config: str | None = None, split: str | None = None) -> str:
    """The one-string form of ``--dataset NAME --config C --split S``."""
    for what, value in (("--dataset", name), ("--config", config), ("--split", split)):
        if value is not None and (":" in value or not value.strip()):
            raise InputError(f"{what} {value!r}: names with ':' (or empty ones) cannot be read as a dataset")
    return str(DatasetSpec(name, split, config))


def parse_spec(text: str) -> DatasetSpec:
    body = text[len(PREFIX):] if text.startswith(PREFIX) else text
    parts = body.split(":")
    if not parts[0]:
        raise InputError(f"{text!r}: give a dataset as hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
    if len(parts) == 1:
        return DatasetSpec(parts[0])
    if len(parts) == 2:
        return DatasetSpec(parts[0], parts[1])
    if len(parts) == 3:
        return DatasetSpec(parts[0], parts[2], parts[1])
    raise InputError(f"{text!r}: too many ':'; give hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise InputError("reading a Hugging Face dataset needs the 'datasets' package: "
                         "pip install 'layerscope[datasets]'") from None
    return datasets


def _arrow_files(path: Path) -> list[str]:
    if path.is_file():
        return [str(path)]
    return sorted(str(p) for p in path.glob("*.arrow"))


def _pick_split(ds, spec: DatasetSpec):
    """A Dataset from what the loader returned (a DatasetDict needs a split)."""
    datasets = _datasets()
    if isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        splits = list(ds)
        if spec.split is None:
            if len(splits) == 1:
                return ds[splits[0]]
            raise InputError(f"dataset {spec.name} has splits {', '.join(splits)}: choose one with --split")
        if spec.split not in ds:
            raise InputError(f"dataset {spec.name} has no split '{spec.split}'; its splits: {', '.join(splits)}")
        return ds[spec.split]
    return ds


def load(spec: DatasetSpec | str):
    """The dataset (one split) a spec names, or one clear error."""
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    datasets = _datasets()
    path = Path(spec.name).expanduser()
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            if spec.config:
                raise InputError(f"{path} was saved with save_to_disk and has no configs; drop --config")
            ds = datasets.load_from_disk(str(path))
        elif path.exists():
            files = _arrow_files(path)
            if not files:
                raise InputError(f"{path} is neither a save_to_disk directory nor .arrow file(s); "
                                 "give one of those or a hub dataset name")
            ds = datasets.load_dataset("arrow", data_files={spec.split or "train": files},
                                       split=spec.split or "train")
        else:
            looks_local = spec.name.startswith((".", "/", "~")) or spec.name.endswith(".arrow")
            if looks_local:
                raise InputError(f"dataset path {spec.name} does not exist")
            ds = datasets.load_dataset(spec.name, spec.config, split=spec.split)
    except InputError:
        raise
    except Exception as exc:  # datasets raises many kinds (offline, unknown config or split, bad files)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError(f"could not load dataset {spec} ({first}); check the name, --config and --split, "
                         "or give a save_to_disk directory or .arrow files") from None
    return _pick_split(ds, spec)


def _check_column(ds, column: str, what: str, spec) -> None:
    cols = list(ds.column_names or [])
    if column not in cols:
        from layerscope.errors import did_you_mean

        raise InputError(f"dataset {spec} has no column '{column}'{did_you_mean(column, cols)}; "
                         f"its columns: {', '.join(cols)}; "
                         f"name the {what} with --column")


def dataset_rows(source: str, column: str | None, id_column: str | None
                 ) -> tuple[Iterator[tuple[str, str | None, int]], str]:
    """(rows of (text, id, row number), display name) for the corpus readers."""
    spec = parse_spec(source)
    ds = load(spec)
    column = column or "text"
    _check_column(ds, column, "text column", spec)
    if id_column:
        _check_column(ds, id_column, "id column", spec)
    name = str(spec)

    def rows():
        cols = [column] + ([id_column] if id_column else [])
        row = 0
        for chunk in ds.select_columns(cols).iter(batch_size=1024):
            texts = chunk[column]
            ids = chunk[id_column] if id_column else [None] * len(texts)
            for text, rid in zip(texts, ids):
                row += 1
                if not isinstance(text, str):
                    raise InputError(f"{name} row {row}: column '{column}' holds a "
                                     f"{type(text).__name__}, not text; choose a text column with --column")
                yield text, (None if rid is None else str(rid)), row

    return rows(), name
