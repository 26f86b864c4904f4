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


def _pixels(payloads: list) -> np.ndarray:
    """A batch of images (paths or encoded bytes) as ``pixel_values``: what each worker computes."""
    from layerscope.data.images import decode
    from layerscope.model.vision import pixel_values

    return pixel_values(_PROCESSOR[0], [decode(p) for p in payloads])


@dataclass(frozen=True)
class ImageReport:
    out: Path
    images: int
    layers: tuple[str, ...]
    poolings: tuple[str, ...]
    seconds: float


def _batches(records, batch_size: int):
    for start in range(0, len(records), batch_size):
        yield np.arange(start, min(start + batch_size, len(records)))


def _pixel_stream(records, export_dir: Path, batch_size: int, workers: int):
    """``(index, pixel_values)`` per batch, in corpus order; with workers, ``2 * workers`` batches in flight."""
    batches = _batches(records, batch_size)
    if workers <= 0:
        _start_worker(str(export_dir))
        try:
            for index in batches:
                yield index, _pixels([records[i].payload for i in index])
        finally:
            _PROCESSOR.clear()
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding an engine's threads
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                             initargs=(str(export_dir),)) as pool:
        pending: deque = deque()
        for index in batches:
            pending.append((index, pool.submit(_pixels, [records[i].payload for i in index])))
            if len(pending) >= 2 * workers:
                index_done, future = pending.popleft()
                yield index_done, future.result()
        while pending:
            index_done, future = pending.popleft()
            yield index_done, future.result()


def _vision_handle(model):
    from layerscope.model.handle import ModelHandle

    handle = model if isinstance(model, ModelHandle) else ModelHandle.resolve(model)
    if handle.manifest.modality != "image" or not handle.is_export:
        raise InputError(f"{handle.spec} is not a vision export; export the vision tower first "
                         "(layerscope export MODEL --out DIR, with --tower vision for CLIP/SigLIP)")
    return handle


def extract_images(model, source, out: str | Path, *, engine: str = "ort", layers="all",
                   poolings=None, batch_size: int = 32, workers: int = 2, column: str = "image",
                   id_column: str | None = None, force: bool = False,
                   engine_options: dict[str, Any] | None = None) -> ImageReport:
    """Per-layer pooled vectors of every image in ``source`` (data/images.py) into a LayerStore at ``out``."""
    from layerscope.data.images import read_images
    from layerscope.engines.base import create_engine
    from layerscope.ownership import claim, note, remove, write_marker
    from layerscope.store.store import TEXTS, LayerStore
    from layerscope.store.store_lock import store_writer
    from layerscope.vocab.image_pooling import check_image_poolings, image_poolings
    from layerscope.vocab.layers import resolve_layers

    if int(batch_size) < 1 or int(workers) < 0:
        raise InputError("--batch-size must be 1 or more and --workers 0 or more")
    handle = _vision_handle(model)
    manifest = handle.manifest
    prefix = manifest.image.prefix_tokens
    modes = check_image_poolings(poolings or image_poolings(prefix), prefix, manifest.family)
    chosen = list(resolve_layers(layers, manifest.num_layers, with_raw=False))
    records = read_images(source, column=column, id_column=id_column)
    if len({r.id for r in records}) != len(records):
        raise InputError(f"{source}: two images have the same id")
    out = Path(out)
    t0 = time.perf_counter()
    with store_writer(out):
        owned = claim(out, "store", force=force, inputs=[handle.export_dir])
        if owned.replace:
            remove(out, "store")
        out.mkdir(parents=True, exist_ok=True)
        write_marker(out, "store")
        eng = create_engine(engine, handle, **(engine_options or {}))
        note(out, files=[TEXTS])
        with open(out / TEXTS, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps({"id": r.id, "text": r.file or r.id, "file": r.file}, ensure_ascii=False) + "\n")
        import layerscope
        from layerscope.store.store_spec import StoreSpec

        spec = StoreSpec(model=str(model), model_key=handle.key, engine=str(engine), variant=None,
                         layers=tuple(map(str, chosen)), poolings=tuple(modes), prompt=None, max_length=0,
                         max_batch=int(batch_size), batch_tokens=None, dtype="float32", tokens=None,
                         input=str(source), corpus_sha256=None, layerscope_version=layerscope.__version__)
        store = LayerStore.create(out, n=len(records), spec=spec, hidden_size=manifest.hidden_size,
                                  manifest=manifest)
        encoder = eng.image_encoder()
        for index, pixels in _pixel_stream(records, handle.export_dir, int(batch_size), int(workers)):
            batch = encoder.batch(encoder.checked(pixels), index)
            store.write(index, eng.run(batch, chosen, modes), chosen)
            store.commit(index)
        seconds = time.perf_counter() - t0
        store.finish({"engine": eng.info.to_dict(), "images": len(records), "seconds": round(seconds, 3)})
    return ImageReport(out, len(records), tuple(chosen), tuple(modes), seconds)
