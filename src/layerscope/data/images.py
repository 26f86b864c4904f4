"""Image corpora: a folder of images, a list file of image paths, or a Hugging Face dataset with an image column.

``read_images(source)`` returns the corpus as ``ImageRecord``s (id, file, and what to decode: a path or the
encoded bytes), every path checked before any model runs.  Nothing is decoded here but each file's header:
the pixels are made by the model's image processor on worker processes (extraction/image_extract.py).

Images are untrusted input: a header that cannot be read, or one whose size passes ``MAX_IMAGE_PIXELS`` (a
decompression bomb) is one line naming the file as the corpus is read; ``ImageBound`` tells from the header how
many pixels an image reaches inside the model's image processor (a 1 x 1,000,000 strip becomes 224 x 224,000,000
under a shortest-edge resize) and ``check_images`` refuses one past ``MAX_PROCESSOR_PIXELS`` before anything is
made; ``decode`` checks the same before decoding and turns a file that fails to decode (a truncated JPEG, a
zTXt bomb) into one line naming it.

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


# Pixels an image may decode to: Pillow's own decompression-bomb threshold, refused here rather than warned about
MAX_IMAGE_PIXELS = 89_478_485
# Pixels an image may reach inside the model's image processor, after its resize and before its crop (a float32 RGB
# copy of 2^25 pixels is 400 MB, and the processor holds several)
MAX_PROCESSOR_PIXELS = 2**25


@dataclass(frozen=True)
class ImageRecord:
    """One image of a corpus: its id, its file (None for an image a dataset holds as bytes alone),
    ``payload``: a path to open or the encoded bytes, and its size in pixels (width, height) as its header says."""

    id: str
    file: str | None
    payload: str | bytes
    size: tuple[int, int] | None = None

    @property
    def name(self) -> str:
        """How a line names the image: its file, else its id."""
        return self.file or f"image {self.id!r}"


@dataclass(frozen=True)
class ImageBound:
    """The resize of a model's image processor (``do_resize`` and ``size`` of its preprocessor_config.json), to
    tell from an image's header how many pixels it reaches inside the processor before any pixel is decoded."""

    do_resize: bool = True
    size: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, processor) -> ImageBound:
        """The bound of an image processor, or of its config as a dict (``to_dict()``)."""
        cfg = processor if isinstance(processor, dict) else processor.to_dict()
        size = cfg.get("size")
        if isinstance(size, int) and not isinstance(size, bool):
            size = {"shortest_edge": size}  # an old config's one number: read as the short side (the larger case)
        size = {k: int(v) for k, v in (size or {}).items()
                if k in ("height", "width", "shortest_edge", "longest_edge") and isinstance(v, int) and v > 0}
        return cls(bool(cfg.get("do_resize", True)), tuple(sorted(size.items())))

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) an image of this size is resized to (its own where the processor does not resize or
        its rule is unknown here: the larger case)."""
        size = dict(self.size)
        if not self.do_resize:
            return width, height
        if "height" in size and "width" in size:
            return size["width"], size["height"]
        short, long = max(1, min(width, height)), max(1, width, height)
        if "shortest_edge" in size:
            scale = size["shortest_edge"] / short
            if "longest_edge" in size:
                scale = min(scale, size["longest_edge"] / long)
        elif "longest_edge" in size:
            scale = size["longest_edge"] / long
        else:
            return width, height
        return max(1, round(width * scale)), max(1, round(height * scale))

    def problem(self, width: int, height: int) -> str | None:
        """What is wrong with an image of ``width`` x ``height`` pixels, or None."""
        if width * height > MAX_IMAGE_PIXELS:
            return (f"{width:,}x{height:,} pixels, more than {MAX_IMAGE_PIXELS:,} (a decompression bomb, or far larger "
                    "than a model reads)")
        w, h = self.resized(width, height)
        if w * h > MAX_PROCESSOR_PIXELS:
            return (f"{width:,}x{height:,} pixels (aspect ratio {max(width, height) / max(1, min(width, height)):,.0f}:1)"
                    f" becomes {w:,}x{h:,} inside the model's image processor, more than {MAX_PROCESSOR_PIXELS:,} "
                    "pixels: crop it nearer to the model's input shape")
        return None


NO_PROCESSOR = ImageBound(do_resize=False)  # the decoded size alone bounds an image no processor reads


def _unreadable(name: str, exc: BaseException) -> InputError:
    why = str(exc).splitlines()[0][:160] if str(exc) else ""
    if "DecompressionBomb" in type(exc).__name__:  # Pillow's own check, on the size the header gives
        return InputError(f"{name} says it is larger than {MAX_IMAGE_PIXELS:,} pixels ({why}): a decompression bomb, "
                          "or far larger than a model reads; remove it or make it smaller")
    return InputError(f"{name} is not an image PIL can read whole ({type(exc).__name__}"
                      f"{': ' + why if why else ''}); remove it or replace it with an intact copy")


def _open(payload: str | bytes):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(payload) if isinstance(payload, bytes) else payload)


# what Pillow raises for a file it cannot read (a truncated JPEG, a zTXt bomb, a header of nonsense)
def _pil_errors() -> tuple[type[BaseException], ...]:
    import struct
    import zlib

    from PIL import Image

    return (OSError, ValueError, SyntaxError, EOFError, struct.error, zlib.error, MemoryError,
            Image.DecompressionBombError, Image.DecompressionBombWarning)


def image_size(payload: str | bytes, name: str, bound: ImageBound = NO_PROCESSOR) -> tuple[int, int]:
    """(width, height) from the image's header, nothing decoded; one line naming the image where the header
    cannot be read or says the image is too large (``bound``: the processor that will read it)."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with _open(payload) as im:
                width, height = im.size
    except _pil_errors() as exc:
        raise _unreadable(name, exc) from None
    why = bound.problem(width, height)
    if why:
        raise InputError(f"{name}: {why}")
    return width, height


def check_images(records: list[ImageRecord], bound: ImageBound) -> None:
    """Each image of a corpus within what the processor ``bound`` reads, from the sizes its header gave: one line
    naming the first that is not, before anything is made."""
    for r in records:
        why = bound.problem(*r.size) if r.size is not None else None
        if why:
            raise InputError(f"{r.name}: {why}")


def decode(payload: str | bytes, *, name: str | None = None, bound: ImageBound = NO_PROCESSOR):
    """The PIL image of a payload (a path or encoded bytes), fully loaded; one line naming the image (``name``,
    else its path) where it is too large for ``bound`` by its header (checked before decoding), or where decoding
    fails (a truncated file, a decompression or text-chunk bomb)."""
    import warnings

    from PIL import Image

    name = name or (payload if isinstance(payload, str) else "an image given as bytes")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with _open(payload) as im:
                why = bound.problem(*im.size)
                if why:
                    raise InputError(f"{name}: {why}")
                im.load()
                return im.copy()
    except _pil_errors() as exc:
        raise _unreadable(name, exc) from None


def _check_header(path: Path, where: str | None = None) -> tuple[int, int]:
    return image_size(str(path), f"{where}: {path}" if where else str(path))


def _from_folder(folder: Path) -> list[ImageRecord]:
    files = sorted((p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                   key=lambda p: p.relative_to(folder).as_posix())
    if not files:
        raise InputError(f"{folder} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    records = []
    for p in files:
        records.append(ImageRecord(p.relative_to(folder).as_posix(), str(p), str(p), _check_header(p)))
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
        records.append(ImageRecord(name, str(path), str(path), _check_header(path, f"{listing} line {number}")))
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
        size = image_size(payload, f"{where}: row {i} ({item.get('path') or ids[i]})")
        records.append(ImageRecord(ids[i], item.get("path") or None, payload, size))
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
        return [ImageRecord(path.name, str(path), str(path), _check_header(path))]
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

    im = decode(payload).convert("RGB")  # an image past the bounds, or one that cannot be decoded: one line
    im.thumbnail((size, size))
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=True)
    return base64.b64encode(buf.getvalue()).decode("ascii")
