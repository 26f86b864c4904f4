"""The ``inspect`` / ``layerscope`` command: parse, call the library, print.

This is the only place that turns errors into exit codes: a LayerscopeError
becomes one red line and exit code 2; a traceback is shown only under --debug.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from layerscope.engines.registry import bench_rows, names_text

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="layerscope: look inside embedding models layer by layer, fast. "
                       "(`inspect` is the same command, kept as an alias; it collides with inspect-ai's CLI.)")
index_app = typer.Typer(no_args_is_help=True, help="FAISS indexes over a layer store.")
app.add_typer(index_app, name="index")
cache_app = typer.Typer(no_args_is_help=True, help="What layerscope keeps in its cache ($LAYERSCOPE_HOME or ~/.cache/layerscope).")
app.add_typer(cache_app, name="cache")

STATE = {"debug": False}


def console():
    import shutil

    from rich.console import Console

    # Wide enough for the per-layer tables when the output goes to a pipe or a log file.
    width = None if sys.stdout.isatty() else max(120, shutil.get_terminal_size((120, 24)).columns)
    return Console(stderr=False, highlight=False, width=width)


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="Only print results and errors.")):
    STATE["debug"] = debug
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
    logging.basicConfig(level=level, format="%(message)s")
    for noisy in ("transformers", "optimum", "torch", "urllib3", "huggingface_hub", "matplotlib", "faiss"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.ERROR)
    if not debug:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_VERBOSITY", "error")  # no retry warnings before our one error line
        import warnings

        warnings.filterwarnings("ignore")


def split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


# ---------------------------------------------------------------- export

@app.command()
def export(
    model: str = typer.Argument(..., help="Hub id, local model dir, or 'minilm' (bundled all-MiniLM-L6-v2)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Export dir (default exports/<name>)."),
    pooled: str = typer.Option("default", help="In-graph pooled outputs, e.g. mean,cls,last ('none' for none)."),
    opset: int = typer.Option(18, help="ONNX opset."),
    atol: float = typer.Option(1e-4, help="Max absolute difference to PyTorch allowed for any output."),
    revision: Optional[str] = typer.Option(None, help="Hub revision (branch, tag or commit)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow code from the model repo to run (off by default)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing export dir."),
    dtype: str = typer.Option("fp32", "--dtype", help="Weights: fp32, or fp16 (half the size; LayerNorm/"
                              "Softmax kept fp32; held to a depth-scaled cosine against torch fp32)."),
    lens_k: Optional[int] = typer.Option(None, "--lens-k",
                                         help="Also write lens-k{K}.onnx: per-layer rank and top-K ids (logit lens)."),
):
    """Export a model to ONNX with every hidden state as an output, checked against PyTorch."""
    from layerscope.export.exporter import export_model

    name = model.rstrip("/").split("/")[-1]
    out = out or Path("exports") / name
    modes = None if pooled == "default" else ([] if pooled == "none" else split_list(pooled))
    c = console()
    manifest = export_model(model, out, pooled=modes, opset=opset, atol=atol, revision=revision,
                            trust_remote_code=trust_remote_code, force=force, dtype=dtype,
                            progress=lambda msg: c.print(f"[dim]- {msg}[/dim]"))
    from layerscope.report.console import print_export_summary

    print_export_summary(c, out, manifest)
    if lens_k is not None:
        from layerscope.decoding.lens_onnx import export_lens

        meta = export_lens(out, lens_k)
        c.print(f"[bold green]lens graph[/bold green] {out / meta['file']} (head {meta['head']['kind']}; parity "
                f"vs torch: rank mismatches {meta['parity']['rank_mismatch_fraction']:.4f}, max prob diff "
                f"{meta['parity']['max_prob_diff']:.1e})")


# ---------------------------------------------------------------- engines

@app.command()
def engines(model: Optional[str] = typer.Option(None, "--model", help="Also try each engine on this export.")):
    """Which engines really work on this machine, and why not."""
    from layerscope.engines.probe import probe_all
    from layerscope.report.console import print_engines

    from layerscope.engines.ort_packages import ort_packages

    c = console()
    from layerscope.export.open import ensure_export

    print_engines(c, probe_all(ensure_export(model) if model else None))
    packages = ort_packages()
    c.print(f"ONNX Runtime: {packages.line()}")
    for w in packages.warnings:
        c.print(f"[yellow]warning:[/yellow] {w}")


# ---------------------------------------------------------------- extract

@app.command()
def extract(
    model: str = typer.Option("minilm", "--model", "-m", help="Export dir, model dir, hub id or 'minilm'."),
    input: Optional[str] = typer.Option(None, "--input", "-i",
                                        help="Corpus: .txt, .jsonl, .csv, .tsv, .parquet, or - for stdin."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Hugging Face dataset instead of --input: a hub "
                                          "name, a save_to_disk directory or .arrow file(s) (text in --column)."),
    config: Optional[str] = typer.Option(None, "--config", help="Dataset configuration (with --dataset)."),
    split: Optional[str] = typer.Option(None, "--split", help="Dataset split, e.g. train or test (with --dataset)."),
    out: Path = typer.Option(..., "--out", "-o", help="Store directory."),
    engine: str = typer.Option("auto", "--engine", "-e", help=f"{names_text()}."),
    layers: str = typer.Option("all", help="all, or e.g. raw,0,3,-1 or 2:5."),
    pooling: Optional[str] = typer.Option(None, help="Comma list: mean, cls, last, max, eos, mean-nobos, st "
                                          "(default: st for a sentence-transformers checkpoint, else the family's)."),
    prompt_name: Optional[str] = typer.Option(None, "--prompt-name", help="One of the checkpoint's prompts "
                                              "(default: its default_prompt_name, if any)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Text put before every input (overrides --prompt-name)."),
    dtype: str = typer.Option("float32", help="Store dtype: float32 or float16."),
    batch_tokens: Optional[int] = typer.Option(None, help="Token budget per batch (padded tokens; default: "
                                                          "the engine's, 2048 on CPU, 16384 on GPU)."),
    max_batch: int = typer.Option(256, help="Most texts per batch."),
    max_length: Optional[int] = typer.Option(None, help="Truncate texts to this many tokens."),
    text_field: Optional[str] = typer.Option(None, "--text-field", help="JSONL field with the text."),
    column: Optional[str] = typer.Option(None, "--column", help="CSV/TSV/Parquet column with the text."),
    id_column: Optional[str] = typer.Option(None, "--id-column", "--id-field", help="Field or column with row ids."),
    fmt: Optional[str] = typer.Option(None, "--format", help="Override the format detected from the name."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted extraction."),
    force: bool = typer.Option(False, "--force", help="Replace an existing store."),
    threads: Optional[int] = typer.Option(None, help="Engine threads (default: all cores)."),
    variant: Optional[str] = typer.Option(None, "--variant", help="ONNX variant of the export: opt, int8, fp16 "
                                                                  "(with --engine ov: fp32, bf16, int8)."),
    min_cosine: Optional[float] = typer.Option(None, "--min-cosine", help="With --engine auto: the fastest engine "
                                               "whose recorded cosine to torch fp32 is at least this (0.9999)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow code from the model repo to run (off by default)."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Run on a Ray cluster: 'local', 'auto' or an address "
                                                          "(needs layerscope[ray]; --out on shared storage)."),
    ray_workers: Optional[int] = typer.Option(None, "--ray-workers", help="Actors (engine sessions) for --ray "
                                                                          "(default 2)."),
):
    """Extract pooled per-layer vectors of a corpus into a LayerStore."""
    from layerscope.report.console import print_extract_summary
    from layerscope.runtime.pipeline import extract as run_extract

    source = _data_source(input, dataset, config, split, "--input")
    c = console()
    if trust_remote_code:
        from layerscope.model.handle import ModelHandle

        model = ModelHandle.resolve(model, trust_remote_code=True)
    if ray is None and ray_workers is not None:
        from layerscope.errors import InputError

        raise InputError("--ray-workers needs --ray (local, auto or a cluster address)")
    if ray is not None:
        from layerscope.runtime.ray_extract import extract_ray

        if prompt_name or prompt:
            from layerscope.errors import InputError

            raise InputError("--prompt and --prompt-name are not supported with --ray yet; run without --ray")

        report = extract_ray(model, source, out, address=ray, workers=2 if ray_workers is None else ray_workers,
                             engine=engine, layers=layers,
                             poolings=split_list(pooling), dtype=dtype, batch_tokens=batch_tokens,
                             max_batch=max_batch, max_length=max_length, resume=resume, force=force,
                             text_field=text_field, column=column, id_field=id_column, fmt=fmt, progress=True,
                             engine_options=_engine_options(threads=threads, variant=variant, min_cosine=min_cosine))
        print_extract_summary(c, report)
        return
    report = run_extract(model, source, out, engine=engine, layers=layers, poolings=split_list(pooling),
                         dtype=dtype, batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length,
                         resume=resume, force=force, text_field=text_field, column=column,
                         id_field=id_column, fmt=fmt, progress=True,
                         engine_options=_engine_options(threads=threads, variant=variant, min_cosine=min_cosine),
                         prompt_name=prompt_name, prompt=prompt)
    print_extract_summary(c, report)


@app.command()
def verify(path: Path = typer.Argument(..., help="A store (inspect extract) or an export dir (inspect export).")):
    """Re-hash every file of a store or an export against its recorded checksums."""
    from rich.markup import escape

    from layerscope.integrity import verify_path

    checked, problems = verify_path(path)
    for line in problems:
        err_console().print(f"[bold red]problem:[/bold red] {escape(line)}", soft_wrap=True)
    if problems:
        sys.exit(2)  # not typer.Exit: with standalone_mode=False its code would be returned, not used
    console().print(f"ok: {checked} files verified")


def _data_source(path: str | None, dataset: str | None, config: str | None, split: str | None,
                 flag: str, required: bool = True) -> str | None:
    """A file path, or the one-string form of --dataset/--config/--split."""
    from layerscope.errors import InputError

    if dataset is None:
        if config or split:
            raise InputError("--config and --split go with --dataset")
        if path is None and required:
            raise InputError(f"give {flag} FILE or --dataset NAME")
        return path
    if path is not None:
        raise InputError(f"give {flag} or --dataset, not both")
    from layerscope.runtime.hf_dataset import dataset_spec

    return dataset_spec(dataset, config, split)


@app.command("export-store")
def export_store(
    store: Path = typer.Argument(..., help="A LayerStore made by inspect extract."),
    fmt: str = typer.Option(..., "--format", "-f", help="parquet or safetensors."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default <store>.<format>)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
):
    """Write a store as one Parquet or safetensors file (ids, texts, one vector column per layer x pooling)."""
    from layerscope.runtime.store_export import export_store as run_export

    path = run_export(store, fmt, out, force=force)
    console().print(f"[bold green]wrote[/bold green] {path}")


# ---------------------------------------------------------------- analyses

@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    analysis: str = typer.Argument(..., help="Analysis name (see: inspect analyses)."),
    model: list[str] = typer.Option(["minilm"], "--model", "-m", help="Model(s); repeat for side by side."),
    engine: str = typer.Option("auto", "--engine", "-e", help=f"{names_text()}."),
    layers: str = typer.Option("all", help="all, or e.g. raw,0,3,-1."),
    pooling: Optional[str] = typer.Option(None, help="Comma list of poolings (default: the analysis's)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Data file (default: the analysis's own)."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Hugging Face dataset instead of --data: a hub "
                                          "name, a save_to_disk directory or .arrow file(s)."),
    config: Optional[str] = typer.Option(None, "--config", help="Dataset configuration (with --dataset)."),
    split: Optional[str] = typer.Option(None, "--split", help="Dataset split (with --dataset)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o",
                                       help="Result directory (default results/<model>/<revision>/<analysis>)."),
    seed: int = typer.Option(0, help="Seed for every random choice."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not reuse or write cached vectors."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow code from the model repo to run (off by default)."),
    recompute: bool = typer.Option(False, "--recompute", help="Run again even if this result is already there."),
    force: bool = typer.Option(False, "--force", help="Replace a result dir that holds a different run."),
    max_length: Optional[int] = typer.Option(None, "--max-length", min=1,
                                             help="Tokens per text (default: the model's; longer texts are truncated)."),
    batch_tokens: Optional[int] = typer.Option(None, "--batch-tokens", min=1,
                                               help="Padded tokens per batch (default: the engine's)."),
):
    """Run an analysis over one or more models; write results.json, tables, plots and report.md.

    Analysis-specific options follow, e.g. `inspect run sts --probe`.
    """
    from layerscope.analyses.base import Context, get_analysis, parse_options, run_analysis

    cls = get_analysis(analysis)
    options = parse_options(cls.metadata, list(ctx.args))
    data = _data_source(data, dataset, config, split, "--data", required=False)
    c = console()
    context = Context(models=model, engine=engine, layers=layers,
                      poolings=split_list(pooling) or list(cls.metadata.default_poolings), data=data,
                      out=out, seed=seed, options=options, cache=not no_cache, console=c, recompute=recompute,
                      force=force, trust_remote_code=trust_remote_code, max_length=max_length,
                      batch_tokens=batch_tokens)
    result_dir, results = run_analysis(analysis, context)
    cls().console_summary(results, c)
    if context.reused:
        c.print(f"[bold green]reused[/bold green] {result_dir}/ (same models, data and options; "
                "--recompute runs it again)")
    else:
        c.print(f"[bold green]wrote[/bold green] {result_dir}/ (results.json, report.md, tables, plots)")


@app.command()
def report(result_dir: Path = typer.Argument(..., help="A directory written by inspect run.")):
    """Re-render the plots, tables and report.md of a result directory from results.json alone."""
    from layerscope.analyses.base import rerender

    plots = rerender(result_dir)
    console().print(f"[bold green]re-rendered[/bold green] {result_dir}/report.md and {len(plots)} plot(s)")


@app.command()
def analyses(name: Optional[str] = typer.Argument(None, help="Show one analysis's options in full.")):
    """List the analyses (or one analysis's options)."""
    from rich.table import Table

    from layerscope.analyses.base import get_analysis, registry

    if name:
        meta = get_analysis(name).metadata
        table = Table(title=f"inspect run {name}: {meta.description}")
        for col in ("option", "type", "default", "what it does"):
            table.add_column(col)
        for o in meta.options:
            table.add_row(o.flag, o.type.__name__, str(o.default), o.help)
        console().print(table)
        console().print(f"main score: {meta.main_score}; default poolings: {', '.join(meta.default_poolings)}")
        return
    table = Table(title="analyses: inspect run NAME ... (inspect analyses NAME for its options)")
    table.add_column("name")
    table.add_column("what it does")
    table.add_column("its own options")
    for key, cls in sorted(registry().items()):
        meta = cls.metadata
        table.add_row(key, meta.description, " ".join(o.flag for o in meta.options) or "-")
    console().print(table)


# ---------------------------------------------------------------- indexes

@index_app.command("build")
def index_build(
    store: Path = typer.Option(..., "--store", "-s", help="A LayerStore made by inspect extract."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Index directory (default <store>/index-<kind>-<pooling>-<layer>)."),
    layer: str = typer.Option("-1", "--layer", help="Layer: raw, 0..L or a negative index."),
    pooling: str = typer.Option("mean", "--pooling", help="Pooling held in the store."),
    kind: str = typer.Option("flat", "--kind", help="flat (exact), ivf, hnsw or binary."),
    nlist: Optional[int] = typer.Option(None, "--nlist", help="IVF cells (default about sqrt(n))."),
    nprobe: Optional[int] = typer.Option(None, "--nprobe", help="IVF cells searched per query."),
    hnsw_m: int = typer.Option(32, "--hnsw-m", help="HNSW links per node."),
    ef_search: int = typer.Option(128, "--ef-search", help="HNSW search breadth."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or gpu."),
    seed: int = typer.Option(0, "--seed", help="Seed for IVF training samples and the recall check."),
    force: bool = typer.Option(False, "--force", help="Replace an existing index."),
):
    """Build a FAISS index over one layer and pooling of a store."""
    from layerscope.runtime.faiss_index import build_store_index

    out = out or Path(store) / f"index-{kind}-{pooling}-{layer.replace('-', 'm')}"
    meta = build_store_index(store, out, layer=layer, pooling=pooling, kind=kind, nlist=nlist, nprobe=nprobe,
                             hnsw_m=hnsw_m, ef_search=ef_search, seed=seed, device=device, force=force)
    c = console()
    c.print(f"[bold green]index[/bold green] {out}: {meta['kind']} over {meta['n']:,} vectors of dim {meta['dim']} "
            f"(layer {meta['layer']}, {meta['pooling']} pooling) in {meta['seconds']['build']:.2f} s; "
            f"{meta['backend_detail']}")
    if meta.get("params"):
        c.print(f"parameters: {meta['params']}")
    rec = meta.get("recall_vs_exact")
    if rec:
        c.print(f"recall@{rec['k']} against exact search on {rec['queries']:,} stored vectors: {rec['recall@k']:.4f}")


@app.command()
def search(
    query: list[str] = typer.Argument(..., help="Query text(s)."),
    index: Path = typer.Option(..., "--index", "-i", help="Index directory made by inspect index build."),
    k: int = typer.Option(10, "-k", "--top", help="How many results per query."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Embed with this model (must be the index's)."),
    engine: str = typer.Option("auto", "--engine", "-e", help=f"{names_text()}."),
    device: str = typer.Option("auto", "--device", help="Where FAISS runs: auto, cpu or gpu."),
):
    """Embed query texts with the index's model, layer and pooling; print the top-k stored texts."""
    from rich.table import Table

    from layerscope.runtime.faiss_index import search_index

    meta, results = search_index(index, list(query), k=k, model=model, engine=engine, device=device)
    c = console()
    for q, hits in zip(query, results):
        t = Table(title=f"{q!r} - top {len(hits)} of {meta['n']:,} ({meta['kind']}, layer {meta['layer']}, "
                        f"{meta['pooling']})")
        t.add_column("#", justify="right")
        t.add_column("score", justify="right")
        t.add_column("id")
        t.add_column("text")
        for h in hits:
            t.add_row(str(h.rank), f"{h.score:.4f}", h.id, h.text)
        c.print(t)
    c.print(f"[dim]{meta['backend_used']}[/dim]")


def _engine_options(**options) -> dict | None:
    kept = {k: v for k, v in options.items() if v is not None}  # an explicit --threads 0 is refused, not dropped
    return kept or None


# ---------------------------------------------------------------- variants and bench

@app.command()
def optimize(
    export_dir: Path = typer.Argument(..., help="An export dir made by inspect export."),
    variant: str = typer.Option(..., "--variant", help="Comma list: opt, int8, fp16 (bf16 is refused on CPU); "
                                                       "ov-fp32, ov-bf16, ov-int8 (OpenVINO precisions)."),
    force: bool = typer.Option(False, "--force", help="Re-make a variant that already exists."),
):
    """Make optimized / reduced-precision variants of an export, each checked against PyTorch fp32."""
    from layerscope.export.variants import make_variant
    from layerscope.model.variants import check_kind
    from layerscope.report.console import print_variant

    kinds = [check_kind(k) for k in split_list(variant) or []]
    c = console()
    for kind in kinds:
        entry = make_variant(export_dir, kind, force=force, progress=lambda msg: c.print(f"[dim]- {msg}[/dim]"))
        print_variant(c, kind, entry)


@app.command()
def bench(
    model: str = typer.Option("minilm", "--model", "-m", help="Export dir (or a model, exported on first use)."),
    engines: str = typer.Option("ort,ort-int8,ov", "--engines", "-e",
                                help=f"Comma list: {', '.join(bench_rows())} (hf-eager always runs)."),
    peers: str = typer.Option("all", "--peers", help="sentence-transformers rows: all, none, or a comma list of "
                                                     "st-torch, st-onnx, st-onnx-O3, st-onnx-qint8, st-openvino."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Corpus file (.txt, .jsonl, .csv, ...)."),
    sts_texts: bool = typer.Option(False, "--sts-texts", help="The corpus is every sentence of the --sts file, "
                                                               "both sides of each pair (2,758 for sts-test)."),
    synthetic: Optional[int] = typer.Option(None, "--synthetic", help="Use N seeded synthetic texts instead."),
    profile: str = typer.Option("mixed", help="Synthetic length profile: mixed, short, long."),
    seed: int = typer.Option(0, help="Synthetic corpus seed."),
    rounds: int = typer.Option(2, help="Rounds; each starts a fresh process per row, odd rounds in reverse."),
    passes: int = typer.Option(3, help="Warm passes per process (best and median are reported)."),
    batch_tokens: Optional[int] = typer.Option(None, help="Token budget per batch for layerscope engines "
                                                          "(default: each engine's own, 2048 on CPU)."),
    max_batch: int = typer.Option(256, help="Most texts per batch for layerscope engines."),
    pooling: str = typer.Option("mean", help="Pooling applied to every layer."),
    layers: str = typer.Option("all-hidden", help="all-hidden (0..L), or e.g. 0,3,-1."),
    sts: Optional[str] = typer.Option(None, "--sts", help="STS Benchmark file: Spearman per layer per engine."),
    threads: Optional[int] = typer.Option(None, help="Threads for every engine (default: each engine's own)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Results dir (default benchmarks/results/<time>)."),
    in_process: bool = typer.Option(False, "--in-process", help="The older one-process bench (engines share "
                                                                "thread pools; kept for comparison)."),
    no_plot: bool = typer.Option(False, "--no-plot", help="Skip the PNG bar plot."),
):
    """Every engine and peer over the same texts, each in its own process: speed, accuracy, peak, time split."""
    import shlex
    import time as _time

    from layerscope.bench.report import markdown_table, write_results
    from layerscope.bench.runner import parse_engines
    from layerscope.errors import InputError
    from layerscope.limits import check_limits
    from layerscope.ownership import check_output_path

    check_limits(batch_tokens=batch_tokens, max_batch=max_batch, threads=threads)
    if out is not None:
        check_output_path(out)
    if (corpus is not None) + (synthetic is not None) + sts_texts != 1:
        raise InputError("give exactly one of --corpus FILE, --synthetic N or --sts-texts (with --sts FILE)")
    names = parse_engines(engines)
    if synthetic is not None:
        from layerscope.bench.corpus import synthetic_texts

        texts = synthetic_texts(synthetic, seed=seed, profile=profile)
        corpus_name = f"synthetic-{profile} (seed {seed})"
    elif sts_texts:
        from layerscope.bench.runner import read_sts

        if not sts:
            raise InputError("--sts-texts reads the sentences of --sts FILE: give --sts too")
        s1, s2, _ = read_sts(sts)
        texts = [t for pair in zip(s1, s2) for t in pair]
        corpus_name = f"{Path(sts).name} sentences (both sides of each pair)"
    else:
        from layerscope.runtime.corpus import iter_corpus

        texts = [r.text for r in iter_corpus(corpus)]
        corpus_name = Path(corpus).name
    c = console()
    say = lambda msg: c.print(f"[dim]- {msg}[/dim]")  # noqa: E731
    if in_process:
        from layerscope.bench.runner import BenchConfig, run_bench

        result = run_bench(BenchConfig(model=model, engines=names, texts=texts, corpus=corpus_name, layers=layers,
                                       pooling=pooling, batch_tokens=batch_tokens, max_batch=max_batch, sts=sts,
                                       include_st=peers != "none", threads=threads, progress=say))
    else:
        from layerscope.bench.isolated import IsolatedConfig, parse_peers, run_isolated

        result = run_isolated(IsolatedConfig(model=model, engines=names, texts=texts, corpus=corpus_name,
                                             peers=parse_peers(peers), layers=layers, pooling=pooling,
                                             rounds=rounds, passes=passes, batch_tokens=batch_tokens,
                                             max_batch=max_batch, sts=sts, threads=threads, progress=say))
    result["command"] = "inspect " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = out or Path("benchmarks") / "results" / _time.strftime("%Y%m%d-%H%M%S")
    paths = write_results(result, out, plot=not no_plot)
    c.print(paths["markdown"].read_text(encoding="utf-8") if not in_process else markdown_table(result),
            soft_wrap=True)
    c.print(f"saved {', '.join(str(p) for p in paths.values())}")


# ---------------------------------------------------------------- cache

@cache_app.command("list")
def cache_list():
    """Exports and vector stores in the cache: kind, model, size, age, the layerscope version that made it."""
    from layerscope.cachedir import scan
    from layerscope.model.manifest import cache_root
    from layerscope.report.console import print_cache

    print_cache(console(), cache_root(), *scan())


@cache_app.command("clear")
def cache_clear(
    exports: bool = typer.Option(False, "--exports", help="Only the ONNX exports."),
    stores: bool = typer.Option(False, "--stores", help="Only the cached vector stores."),
    older_than: Optional[float] = typer.Option(None, "--older-than", help="Only entries older than DAYS."),
):
    """Delete what layerscope made in its cache (never anything else, never through a symlink)."""
    from layerscope.cachedir import MARKERS, clear, human_size

    kinds = tuple(k for k, on in (("exports", exports), ("stores", stores)) if on) or tuple(MARKERS)
    removed, skipped = clear(kinds, older_than)
    c = console()
    c.print(f"removed {len(removed)} cache entr{'y' if len(removed) == 1 else 'ies'} "
            f"({human_size(sum(e.size for e in removed))})")
    for s in skipped:
        c.print(f"[yellow]left alone[/yellow] {s.path}: {s.reason}", soft_wrap=True)


# ---------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> None:
    from rich.markup import escape

    from layerscope.errors import LayerscopeError

    from layerscope.errors import Interrupted

    try:
        # With standalone_mode=False typer turns Ctrl-C into Exit(130) and *returns* that code instead of
        # exiting, so the code must be passed on here (dropping it made Ctrl-C exit 0).
        code = app(args=argv, standalone_mode=False, prog_name="layerscope")
    except Interrupted as exc:  # the library's own Ctrl-C message: how much was kept, how to continue
        err_console().print(f"[yellow]{exc}[/yellow]", soft_wrap=True)
        sys.exit(exc.exit_code)
    except LayerscopeError as exc:
        if STATE["debug"]:
            raise
        # escaped: "pip install 'layerscope[ray]'" must not lose "[ray]" to rich's markup
        err_console().print(f"[bold red]error:[/bold red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:  # outside typer's own handling (e.g. while it starts)
        err_console().print("[yellow]interrupted[/yellow]")
        sys.exit(130)
    except Exception as exc:  # usage errors and the unexpected
        # typer >= 0.29 carries its own click; older typer uses the click package
        exit_cls, abort_cls = getattr(typer, "Exit", None), getattr(typer, "Abort", None)
        try:
            from typer._click import ClickException
        except ImportError:  # typer < 0.29
            from click import ClickException

        if exit_cls is not None and isinstance(exc, exit_cls):
            sys.exit(getattr(exc, "exit_code", 0))
        if isinstance(exc, ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if abort_cls is not None and isinstance(exc, abort_cls):
            sys.exit(130)
        if STATE["debug"]:
            raise
        err_console().print(f"[bold red]internal error:[/bold red] {type(exc).__name__}: {escape(str(exc))} "
                            "(re-run with --debug for the traceback, and please report it)", soft_wrap=True)
        sys.exit(1)
    if isinstance(code, int) and not isinstance(code, bool) and code != 0:
        if code == 130:
            err_console().print("[yellow]interrupted[/yellow]")
        sys.exit(code)
