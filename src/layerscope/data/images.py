"""Image corpora: a folder of images, a list file of image paths, or a Hugging Face dataset with an image column.

``read_images(source)`` returns the corpus as ``ImageRecord``s (id, file, and what to decode: a path or the
encoded bytes), every path checked before any model runs.  Nothing is decoded here but each file's header:
the pixels are made by the model's image processor on worker processes (extraction/image_extract.py).

* a folder: every image file under it (``.png``, ``.jpg``, ...), sorted by relative path, which is its id;
* a list file (``.txt``/``.lst``): one image path per line, relative to the list file's folder; the id is the
  path as written;
* a ``datasets.Dataset`` (or a folder written by ``save_to_disk``): ``column`` holds the images (an ``Image``
  feature), ``id_column`` the ids (default: the row number); the file is the image's own path where the
  dataset kept one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.errors import InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
LIST_SUFFIXES = (".txt", ".lst")


@dataclass(frozen=True)
class ImageRecord:
    """One image of a corpus: its id, its file (None for an image a dataset holds as bytes alone) and
    ``payload``: a path to open or the encoded bytes."""

    id: str
    file: str | None
    payload: str | bytes


def decode(payload: str | bytes):
    """The PIL image of a payload (a path or encoded bytes), fully loaded."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(payload) if isinstance(payload, bytes) else payload) as im:
        im.load()
        return im.copy()


def _check_header(path: Path, where: str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):
            pass
    except (UnidentifiedImageError, OSError) as exc:
        raise InputError(f"{where}: {path} is not an image PIL can read ({exc.__class__.__name__})") from None


def _from_folder(folder: Path) -> list[ImageRecord]:
    files = sorted((p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                   key=lambda p: p.relative_to(folder).as_posix())
    if not files:
        raise InputError(f"{folder} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    records = []
    for p in files:
        _check_header(p, str(folder))
        records.append(ImageRecord(p.relative_to(folder).as_posix(), str(p), str(p)))
    return records


def _from_list(listing: Path) -> list[ImageRecord]:
    records = []
    for number, line in enumerate(listing.read_text(encoding="utf-8").splitlines(), 1):
        name = line.strip()
        if not name:
            continue
        path = Path(name) if Path(name).is_absolute() else listing.parent / name
        if not path.is_file():
            raise InputError(f"{listing} line {number}: {name} is not a file")
        _check_header(path, f"{listing} line {number}")
        records.append(ImageRecord(name, str(path), str(path)))
    if not records:
        raise InputError(f"{listing} lists no images (one path per line)")
    return records


def _from_dataset(dataset, column: str, id_column: str | None, where: str) -> list[ImageRecord]:
    import datasets

    features = dataset.features
    if column not in features:
        raise InputError(f"{where} has no column '{column}' (it has {', '.join(features)}); name the image "
                         "column with --image-column")
    if not isinstance(features[column], datasets.Image):
        raise InputError(f"{where}: column '{column}' holds {type(features[column]).__name__}, not images")
    if id_column is not None and id_column not in features:
        raise InputError(f"{where} has no id column '{id_column}' (it has {', '.join(features)})")
    raw = dataset.cast_column(column, datasets.Image(decode=False))
    ids = [str(x) for x in raw[id_column]] if id_column else [str(i) for i in range(len(raw))]
    if len(set(ids)) != len(ids):
        raise InputError(f"{where}: the ids in '{id_column}' repeat; give a column whose values are unique")
    records = []
    for i, item in enumerate(raw[column]):
        if item is None or (item.get("bytes") is None and not item.get("path")):
            raise InputError(f"{where}: row {i} has no image")
        payload = item["bytes"] if item.get("bytes") is not None else item["path"]
        records.append(ImageRecord(ids[i], item.get("path") or None, payload))
    if not records:
        raise InputError(f"{where} has no rows")
    return records


def read_images(source: Any, *, column: str = "image", id_column: str | None = None) -> list[ImageRecord]:
    """The image corpus ``source`` names (see the module doc), or one line saying what is wrong with it."""
    if type(source).__name__ == "Dataset" and hasattr(source, "features"):
        return _from_dataset(source, column, id_column, "the dataset")
    path = Path(str(source)).expanduser()
    if path.is_dir() and (path / "dataset_info.json").exists() and (path / "state.json").exists():
        import datasets

        return _from_dataset(datasets.load_from_disk(str(path)), column, id_column, str(path))
    if path.is_dir():
        return _from_folder(path)
    if path.is_file() and path.suffix.lower() in LIST_SUFFIXES:
        return _from_list(path)
    if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
        _check_header(path, str(path))
        return [ImageRecord(path.name, str(path), str(path))]
    if not path.exists():
        raise InputError(f"{source}: no such folder or file")
    raise InputError(f"{source}: give a folder of images, a list file ({', '.join(LIST_SUFFIXES)}) of image paths, "
                     "or a dataset saved with save_to_disk")


def images_sha256(records: list[ImageRecord]) -> str:
    """One hash of the corpus: every image's id, file and encoded bytes, in order (a resumed store is
    continued only from the same images)."""
    import hashlib

    total = hashlib.sha256()
    for r in records:
        one = hashlib.sha256()
        if isinstance(r.payload, bytes):
            one.update(r.payload)
        else:
            with open(r.payload, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    one.update(block)
        total.update(f"{len(r.id)}:{r.id}\0{r.file or ''}\0{one.hexdigest()}\n".encode())
    return total.hexdigest()


THUMBNAIL_PIXELS = 48


def thumbnail_png(payload: str | bytes, size: int = THUMBNAIL_PIXELS) -> str:
    """A downscaled copy (at most ``size`` pixels a side, RGB) of the image ``payload`` names, as base64 PNG:
    what a report shows beside an image's figures (report/image_html.py checks and re-encodes it)."""
    import base64
    import io

    im = decode(payload).convert("RGB")
    im.thumbnail((size, size))
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode("ascii")
