"""``extract-images``: a vision export's per-layer vectors of an image corpus into a LayerStore."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from layerscope.cli.common import console, split_list
from layerscope.cli.root import app


@app.command("extract-images")
def extract_images_cmd(
    model: str = typer.Argument(..., help="A vision export, or a vision checkpoint (exported into the cache)."),
    source: str = typer.Argument(..., help="A folder of images, a .txt/.lst list of image paths, or a folder "
                                           "written by datasets' save_to_disk."),
    out: Path = typer.Option(..., "--out", "-o", help="The store folder."),
    engine: str = typer.Option("ort", "--engine", help="ort, ov or torch."),
    layers: str = typer.Option("all", "--layers", help="all, last, 0,3,-1 or 2:5."),
    pooling: Optional[str] = typer.Option(None, "--pooling", help="cls, mean (over the patches): default both "
                                                                  "(mean alone where the tower has no CLS)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Images per batch."),
    workers: int = typer.Option(2, "--workers", help="Processes running the image processor (0: this one)."),
    image_column: str = typer.Option("image", "--image-column", help="A dataset's image column."),
    id_column: Optional[str] = typer.Option(None, "--id-column", help="A dataset's id column (default: row number)."),
    force: bool = typer.Option(False, "--force", help="Replace a store layerscope made at --out."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run into --out (same settings "
                                                        "and images): only the images not done are run."),
    tokens: bool = typer.Option(False, "--tokens", help="Keep every token of every image (CLS, registers, "
                                                        "patches with their grid row and column)."),
    store_dtype: str = typer.Option("float32", "--store-dtype", help="The token vectors on disk: float32, "
                                                                     "float16 or bfloat16."),
    tower: Optional[str] = typer.Option(None, "--tower", help="vision: a two-tower CLIP/SigLIP checkpoint's "
                                                              "image tower (exported into the cache)."),
):
    """Extract every layer's pooled vectors of an image corpus (ids and files kept in the store)."""
    from rich.markup import escape

    from layerscope.extraction.image_extract import extract_images

    report = extract_images(model, source, out, engine=engine, layers=layers, poolings=split_list(pooling),
                            batch_size=batch_size, workers=workers, column=image_column, id_column=id_column,
                            force=force, resume=resume, tokens=tokens, store_dtype=store_dtype, tower=tower)
    ran = f" ({report.computed:,} run now)" if report.computed != report.images else ""
    console().print(f"stored {report.images:,} images{ran}, layers {','.join(report.layers)}, poolings "
                    f"{','.join(report.poolings)} in {escape(str(report.out))} ({report.seconds:.1f} s)")
