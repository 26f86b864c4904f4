"""Extracting a vision tower's per-layer vectors of an image corpus into a LayerStore.

The images are decoded and put through the export's own image processor on worker processes (spawned, each
loading the processor once), several batches ahead of the engine, so the engine never waits for the
preprocessing; ``workers=0`` does it in this process.  The store is the text stores' layout: ``texts.jsonl``
holds each image's ``id`` and ``file`` (``text`` is the file, or the id where the image came as bytes), and
the arrays hold ``[images, hidden]`` per pooling (``cls``, ``mean`` over the patches) and layer.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from layerscope.errors import InputError

_PROCESSOR: list = []  # the worker's image processor, loaded once by _start_worker


def _start_worker(folder: str) -> None:
    from layerscope.model.vision import load_image_processor

    _PROCESSOR.append(load_image_processor(folder))


def _start_child(folder: str) -> None:
    from layerscope.signals import child_start

    child_start()  # Ctrl-C is the parent's to answer: it stops the workers
    _start_worker(folder)


def _pixels(items: list) -> np.ndarray:
    """A batch of images (``(name, payload)``: a path or encoded bytes) as ``pixel_values``: what each worker
    computes; an image past the processor's bounds or one that cannot be decoded is one line naming it."""
    from layerscope.data.images import ImageBound, decode
    from layerscope.model.vision import pixel_values

    bound = ImageBound.of(_PROCESSOR[0])
    return pixel_values(_PROCESSOR[0], [decode(p, name=name, bound=bound) for name, p in items])


@dataclass(frozen=True)
class ImageReport:
    out: Path
    images: int
    computed: int  # images run through the model by this call (fewer when it resumed a store)
    layers: tuple[str, ...]
    poolings: tuple[str, ...]
    seconds: float


def _batches(rows: np.ndarray, batch_size: int):
    for start in range(0, len(rows), batch_size):
        yield rows[start:start + batch_size]


def _pixel_stream(records, rows: np.ndarray, export_dir: Path, batch_size: int, workers: int):
    """``(index, pixel_values)`` per batch of ``rows``, in their order; with workers, ``2 * workers`` batches
    in flight."""
    batches = _batches(rows, batch_size)
    if workers <= 0:
        _start_worker(str(export_dir))
        try:
            for index in batches:
                yield index, _pixels([(records[i].name, records[i].payload) for i in index])
        finally:
            _PROCESSOR.clear()
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding an engine's threads
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_child,
                             initargs=(str(export_dir),)) as pool:
        pending: deque = deque()
        try:
            for index in batches:
                pending.append((index, pool.submit(_pixels, [(records[i].name, records[i].payload) for i in index])))
                if len(pending) >= 2 * workers:
                    index_done, future = pending.popleft()
                    yield index_done, future.result()
            while pending:
                index_done, future = pending.popleft()
                yield index_done, future.result()
        except BaseException:  # Ctrl-C or an error: the batches not begun are dropped, not computed first
            for _, future in pending:
                future.cancel()
            raise


def _vision_handle(model, tower: str | None = None):
    """The export of ``model``: itself, or a vision checkpoint's export from the export cache (made on
    first use, export/cache.py)."""
    from layerscope.model.handle import ModelHandle

    handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
    if not handle.is_export and (tower is not None or handle.manifest.modality == "image"):
        from layerscope.export.cache import cached_export

        handle = cached_export(handle, {"tower": tower} if tower else {})
    if handle.manifest.modality != "image" or not handle.is_export:
        raise InputError(f"{handle.spec} is not a vision export; export the vision tower first "
                         "(layerscope export MODEL --out DIR, with --tower vision for CLIP/SigLIP)")
    return handle


def _open_to_resume(out: Path, spec, records) -> "LayerStore | None":
    """The store at ``out`` to continue (``--resume``), or None when there is none yet; refused in one line
    when it was made with other settings or from other images."""
    from layerscope.data.images import images_sha256
    from layerscope.errors import StoreError
    from layerscope.ownership import rewriting
    from layerscope.store.store import STORE_JSON, LayerStore

    if not (out / STORE_JSON).exists():
        return None
    store = LayerStore.open(out, allow_incomplete=True)
    if store.manifest.modality != "image":
        raise StoreError(f"{out} holds a text store; --resume continues an image store made by extract-images")
    for candidate in (lambda: spec, lambda: spec.replace(corpus_sha256=images_sha256(records))):
        diff = candidate().mismatch(store.spec)  # the images are hashed only once the rest matches
        if diff is not None:
            key, was, now = diff
            if key == "corpus_sha256":
                raise StoreError(f"{out} was made from other images than {spec.input} has now (files, ids or "
                                 "order changed); drop --resume and use --force, or choose another --out")
            was, now = ((t.to_json() if hasattr(t, "to_json") else t) for t in (was, now))
            raise StoreError(f"{out} was made with {key}={was!r}, this run asks for {now!r}; use another --out "
                             "or drop --resume (and use --force)")
    if not store.complete:
        rewriting(out, "store")  # its files are written again: a run killed now leaves them known as ours
    store.mode = "r+"
    return store


def _new_store(out: Path, claimed, spec, records, handle):
    from layerscope.data.images import images_sha256
    from layerscope.ownership import note, remove, write_marker
    from layerscope.store.store import TEXTS, LayerStore

    if claimed.replace:
        remove(out, "store")
    out.mkdir(parents=True, exist_ok=True)
    write_marker(out, "store")
    note(out, files=[TEXTS])
    with open(out / TEXTS, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps({"id": r.id, "text": r.file or r.id, "file": r.file}, ensure_ascii=False) + "\n")
    spec = spec.replace(corpus_sha256=images_sha256(records))
    return LayerStore.create(out, n=len(records), spec=spec, hidden_size=handle.manifest.hidden_size,
                             manifest=handle.manifest)


def extract_images(model, source, out: str | Path, *, engine: str = "ort", layers="all",
                   poolings=None, batch_size: int = 32, workers: int = 2, column: str = "image",
                   id_column: str | None = None, force: bool = False, resume: bool = False,
                   tokens: bool = False, store_dtype: str = "float32", tower: str | None = None,
                   engine_options: dict[str, Any] | None = None) -> ImageReport:
    """Per-layer pooled vectors of every image in ``source`` (data/images.py) into a LayerStore at ``out``.

    ``model``: a vision export, or a vision checkpoint (``tower="vision"`` for a two-tower CLIP/SigLIP) that
    is exported into the export cache on first use.  ``tokens``: every token of every image is kept too
    (extraction/image_tokens.py), in ``store_dtype``.  ``resume``: an interrupted run into ``out`` continues
    where it stopped (same settings and images), computing only the rows not done."""
    import layerscope
    from layerscope.data.images import read_images
    from layerscope.engines.base import create_engine
    from layerscope.ownership import claim
    from layerscope.store.store_lock import store_writer
    from layerscope.store.store_spec import StoreSpec, TokensSpec
    from layerscope.store.token_write import tokens_dtype
    from layerscope.vocab.image_pooling import check_image_poolings, image_poolings
    from layerscope.vocab.layers import resolve_layers

    if int(batch_size) < 1 or int(workers) < 0:
        raise InputError("--batch-size must be 1 or more and --workers 0 or more")
    if resume and force:
        raise InputError("--resume continues a store and --force replaces it: give one of them")
    token_dtype = tokens_dtype(tokens, store_dtype)
    records = read_images(source, column=column, id_column=id_column)
    if len({r.id for r in records}) != len(records):
        raise InputError(f"{source}: two images have the same id")
    handle = _vision_handle(model, tower=tower)
    from layerscope.data.images import ImageBound, check_images
    from layerscope.jsonfile import read_json
    from layerscope.model.vision import PROCESSOR_FILE

    # every image within what the processor reads, told by its header: one line before anything is made
    check_images(records, ImageBound.of(read_json(handle.export_dir / PROCESSOR_FILE)))
    manifest = handle.manifest
    prefix = manifest.image.prefix_tokens
    modes = check_image_poolings(poolings or image_poolings(prefix), prefix, manifest.family)
    chosen = list(resolve_layers(layers, manifest.num_layers, with_raw=False))
    out = Path(out)
    spec = StoreSpec(model=str(model), model_key=handle.key, engine=str(engine), variant=None,
                     layers=tuple(map(str, chosen)), poolings=tuple(modes), prompt=None, max_length=0,
                     max_batch=int(batch_size), batch_tokens=None, dtype="float32",
                     tokens=TokensSpec(token_dtype) if token_dtype else None, input=str(source),
                     corpus_sha256=None, layerscope_version=layerscope.__version__)
    t0 = time.perf_counter()
    with store_writer(out):
        claimed = claim(out, "store", force=force, keep=resume, inputs=[handle.export_dir])
        store = _open_to_resume(out, spec, records) if resume else None
        if store is not None and store.complete:
            return ImageReport(out, len(records), 0, tuple(chosen), tuple(modes), 0.0)
        eng = create_engine(engine, handle, **(engine_options or {}))
        made = store is None
        if made:
            store = _new_store(out, claimed, spec, records, handle)
        try:
            computed = _fill(store, eng, records, handle, chosen, modes, int(batch_size), int(workers))
        except InputError:  # an image only decoding tells is bad: resuming would meet it again
            if made:
                _discard(out, store)
            raise
        seconds = time.perf_counter() - t0
        store.finish(engine=eng.info.to_dict(), extra={"images": len(records), "seconds": round(seconds, 3)})
    return ImageReport(out, len(records), computed, tuple(chosen), tuple(modes), seconds)


def _discard(out: Path, store) -> None:
    """Remove a store this run made (what its record lists; the folder where nothing else is left)."""
    from layerscope.ownership import clear_own, remove_if_empty

    try:
        store.close()
    except Exception:  # noqa: BLE001 - a store half made: its files are removed all the same
        pass
    clear_own(out, "store")
    remove_if_empty(out)


def _fill(store, eng, records, handle, chosen, modes, batch_size: int, workers: int) -> int:
    """Run every image the store has not done yet through ``eng`` into it; returns how many it ran."""
    from layerscope.extraction.image_tokens import start_image_tokens

    token_run = start_image_tokens(store, handle.manifest.image, chosen)
    todo = np.nonzero(np.asarray(store.done_mask()) == 0)[0]
    encoder = eng.image_encoder()
    for index, pixels in _pixel_stream(records, todo, handle.export_dir, batch_size, workers):
        batch = encoder.batch(encoder.checked(pixels), index)
        if token_run is None:
            store.write(index, eng.run(batch, chosen, modes), chosen)
            store.commit(index)
        else:
            store.write(index, token_run.run(eng, batch, chosen, modes), chosen)
            token_run.commit(store, index)
    if token_run is not None:
        token_run.finish(None)
    return len(todo)
