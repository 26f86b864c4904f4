"""``export``, ``engines`` and ``families``: make an ONNX export; say which engines work here and which
architectures are supported."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from layerscope.cli.common import console, progress_printer, split_list
from layerscope.cli.root import app


@app.command()
def export(
    model: str = typer.Argument(..., help="Hub id, local model dir, or 'minilm' (bundled all-MiniLM-L6-v2)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Export dir (default exports/<name>)."),
    cache: bool = typer.Option(False, "--cache", help="Export into layerscope's cache instead of a folder: where "
                               "run, extract and bench --model MODEL find it (made again only when the model's "
                               "files, the settings or the versions change)."),
    pooled: str = typer.Option("default", help="In-graph pooled outputs, e.g. mean,cls,last ('none' for none)."),
    opset: int = typer.Option(18, help="ONNX opset."),
    atol: float = typer.Option(1e-4, help="fp32: max absolute difference to PyTorch allowed for any output, "
                                          "plus --rtol times that output's largest value."),
    rtol: float = typer.Option(1e-5, help="fp32: tolerance added per unit of an output's largest |value| (deep "
                                          "decoders' hidden states reach the hundreds); each output's is recorded."),
    revision: Optional[str] = typer.Option(None, help="Hub revision (branch, tag or commit)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow code from the model repo to run (off by default)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing export dir."),
    dtype: str = typer.Option("fp32", "--dtype", help="Weights: fp32, or fp16 (half the size; LayerNorm/"
                              "Softmax kept fp32; held to a depth-scaled cosine against torch fp32)."),
    lens_k: Optional[int] = typer.Option(None, "--lens-k",
                                         help="Also write lens-k{K}.onnx: per-layer rank and top-K ids (logit lens)."),
    attentions: bool = typer.Option(False, "--attentions",
                                    help="Also write model.attn.onnx: every layer's attention probabilities (eager "
                                         "attention) and per-head summaries, for layerscope run attention."),
    cpu_precisions: bool = typer.Option(True, "--cpu-precisions/--no-cpu-precisions",
                                        help="Also check and record OpenVINO bf16 where this CPU computes in bf16, "
                                             "so --engine auto can pick it (-v says what was found)."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="The longest input (tokens) runs of this "
                                             "export read by default, up to the model's positions (default: the "
                                             "checkpoint's sentence-transformers setting, an encoder's tokenizer "
                                             "limit, else the positions)."),
    tower: Optional[str] = typer.Option(None, "--tower", help="A two-tower checkpoint's tower: 'vision' exports "
                                        "CLIP's or SigLIP's image tower (vision models need none)."),
    image_size: Optional[str] = typer.Option(None, "--image-size", help="A vision tower's input size when not its "
                                             "checkpoint's: 448 or 448x336 (height x width), position "
                                             "embeddings resized, parity checked at that size."),
):
    """Export a model to ONNX with every hidden state as an output, checked against PyTorch."""
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source
    from layerscope.model.vision import parse_image_size

    size = parse_image_size(image_size)
    name = model.rstrip("/").split("/")[-1]
    modes = None if pooled == "default" else ([] if pooled == "none" else split_list(pooled))
    c = console()
    if cache:
        out, manifest = _export_to_cache(model, out=out, force=force, revision=revision, pooled=modes, opset=opset,
                                         atol=atol, rtol=rtol, dtype=dtype, tower=tower, image_size=size,
                                         max_length=max_length, trust_remote_code=trust_remote_code,
                                         progress=progress_printer(c))
    else:
        out = out or Path("exports") / name
        manifest = export_model(resolve_source(model, revision), out, pooled=modes, opset=opset, atol=atol,
                                rtol=rtol, trust_remote_code=trust_remote_code, force=force, dtype=dtype,
                                progress=progress_printer(c), tower=tower, image_size=size, max_length=max_length)
    from rich.markup import escape

    from layerscope.report.console import print_export_summary

    print_export_summary(c, out, manifest)
    if manifest.modality == "image":  # the precisions and the lens read text
        cpu_precisions = False
        if lens_k is not None:
            from layerscope.errors import InputError

            raise InputError("--lens-k reads a text model's LM head; a vision tower has none (the export is written)")
    if cpu_precisions and not cache:  # measured for --engine auto (the cache records them itself); what it found is said with -v (auto says what it picks)
        from layerscope.cli.common import STATE
        from layerscope.export.cpu_precision import record_cpu_precisions

        verbose = STATE["verbose"]
        for line in record_cpu_precisions(out, progress=progress_printer(c) if verbose else None,
                                          trust_remote_code=trust_remote_code):
            if verbose:
                c.print(line, markup=False, highlight=False)
    if attentions:
        from layerscope.export.variants import make_variant
        from layerscope.report.console import print_variant

        print_variant(c, "attn", make_variant(out, "attn", force=force, progress=progress_printer(c),
                                              trust_remote_code=trust_remote_code))
    if lens_k is not None:
        from layerscope.decoding.lens_onnx import export_lens

        meta = export_lens(out, lens_k)
        c.print(f"[bold green]lens graph[/bold green] {escape(str(out / meta.file))} (head {escape(meta.head.kind)}; "
                f"parity vs torch: rank mismatches {meta.parity.rank_mismatch_fraction:.4f}, max prob diff "
                f"{meta.parity.max_prob_diff:.1e})")


@app.command()
def engines(model: Optional[str] = typer.Option(None, "--model", help="Also try each engine on this export.")):
    """Which engines really work on this machine, and why not."""
    from rich.markup import escape

    from layerscope.engines.ort_packages import ort_packages
    from layerscope.engines.probe import probe_all
    from layerscope.report.console import print_engines

    from layerscope.export.open import ensure_export

    c = console()
    print_engines(c, probe_all(ensure_export(model) if model else None))
    packages = ort_packages()
    c.print(f"ONNX Runtime: {escape(packages.line())}")
    for w in packages.warnings:
        c.print(f"[yellow]warning:[/yellow] {escape(w)}")


@app.command()
def families(every: bool = typer.Option(False, "--all", help="Also list every other model type transformers "
                                                                 "knows as a masked-LM encoder or causal-LM decoder.")):
    """Which model types export with every hidden state, and how (docs/FAMILIES.md has parity per type)."""
    from layerscope.export.onnx_config import family_rows
    from layerscope.model.families import CHECKED_TYPES, supported_types
    from layerscope.report.console import print_families

    types = supported_types() if every else list(CHECKED_TYPES)
    print_families(console(), family_rows(types), checked=set(CHECKED_TYPES))


def _export_to_cache(model: str, *, out, force: bool, revision, pooled, opset: int, atol: float, rtol: float,
                     dtype: str, tower, image_size, max_length, trust_remote_code: bool, progress):
    """(folder, manifest) of ``model``'s entry in the export cache, the one a run on ``model`` with these settings
    reads: made now, or found made already. Settings at their defaults are left out of its key, as a run leaves
    them out."""
    from layerscope.errors import InputError
    from layerscope.export.cache import cached_export
    from layerscope.export.exporter import DEFAULT_OPSET, FP32_RTOL
    from layerscope.model.handle import ModelHandle

    if out is not None or force or revision is not None:
        flag = "--out" if out is not None else "--force" if force else "--revision"
        raise InputError(f"--cache and {flag} do not go together: the cache keeps one export per model and settings "
                         "(layerscope cache clear --exports empties it)")
    options = {k: v for k, v, default in (("pooled", pooled, None), ("opset", opset, DEFAULT_OPSET),
                                          ("atol", atol, 1e-4), ("rtol", rtol, FP32_RTOL), ("dtype", dtype, "fp32"),
                                          ("tower", tower, None), ("image_size", image_size, None),
                                          ("max_length", max_length, None)) if v != default}
    handle = cached_export(ModelHandle.resolve(model, trust_remote_code=trust_remote_code),
                           {**options, "progress": progress})
    return handle.export_dir, handle.manifest
