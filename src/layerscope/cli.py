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

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="layerscope: look inside embedding models layer by layer, fast.")
index_app = typer.Typer(no_args_is_help=True, help="FAISS indexes over a layer store.")
app.add_typer(index_app, name="index")

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

    print_engines(console(), probe_all(model))


# ---------------------------------------------------------------- extract

@app.command()
def extract(
    model: str = typer.Option("minilm", "--model", "-m", help="Export dir, model dir, hub id or 'minilm'."),
    input: str = typer.Option(..., "--input", "-i", help="Corpus: .txt, .jsonl, .csv, .tsv, .parquet, or - for stdin."),
    out: Path = typer.Option(..., "--out", "-o", help="Store directory."),
    engine: str = typer.Option("auto", "--engine", "-e", help="torch, ort, cuda, trt or auto."),
    layers: str = typer.Option("all", help="all, or e.g. raw,0,3,-1 or 2:5."),
    pooling: str = typer.Option("mean", help="Comma list: mean, cls, last, max, eos, mean-nobos."),
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
    variant: Optional[str] = typer.Option(None, "--variant", help="ONNX variant of the export: opt, int8, fp16."),
):
    """Extract pooled per-layer vectors of a corpus into a LayerStore."""
    from layerscope.report.console import print_extract_summary
    from layerscope.runtime.pipeline import extract as run_extract

    c = console()
    report = run_extract(model, input, out, engine=engine, layers=layers, poolings=split_list(pooling),
                         dtype=dtype, batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length,
                         resume=resume, force=force, text_field=text_field, column=column,
                         id_field=id_column, fmt=fmt, progress=True,
                         engine_options=_engine_options(threads=threads, variant=variant))
    print_extract_summary(c, report)


# ---------------------------------------------------------------- analyses

@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    analysis: str = typer.Argument(..., help="Analysis name (see: inspect analyses)."),
    model: list[str] = typer.Option(["minilm"], "--model", "-m", help="Model(s); repeat for side by side."),
    engine: str = typer.Option("auto", "--engine", "-e", help="torch, ort, cuda, trt or auto."),
    layers: str = typer.Option("all", help="all, or e.g. raw,0,3,-1."),
    pooling: Optional[str] = typer.Option(None, help="Comma list of poolings (default: the analysis's)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Data file (default: the analysis's own)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Result directory (default results/<analysis>)."),
    seed: int = typer.Option(0, help="Seed for every random choice."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not reuse or write cached vectors."),
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
    c = console()
    context = Context(models=model, engine=engine, layers=layers,
                      poolings=split_list(pooling) or list(cls.metadata.default_poolings), data=data,
                      out=out or Path("results") / analysis, seed=seed, options=options, cache=not no_cache,
                      console=c, max_length=max_length, batch_tokens=batch_tokens)
    result_dir, results = run_analysis(analysis, context)
    cls().console_summary(results, c)
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
    engine: str = typer.Option("auto", "--engine", "-e", help="torch, ort, cuda, trt or auto."),
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
    kept = {k: v for k, v in options.items() if v}
    return kept or None


# ---------------------------------------------------------------- variants and bench

@app.command()
def optimize(
    export_dir: Path = typer.Argument(..., help="An export dir made by inspect export."),
    variant: str = typer.Option(..., "--variant", help="Comma list: opt, int8, fp16 (bf16 is refused on CPU)."),
    force: bool = typer.Option(False, "--force", help="Re-make a variant that already exists."),
):
    """Make optimized / reduced-precision variants of an export, each checked against PyTorch fp32."""
    from layerscope.export.variants import check_kind, make_variant
    from layerscope.report.console import print_variant

    kinds = [check_kind(k) for k in split_list(variant) or []]
    c = console()
    for kind in kinds:
        entry = make_variant(export_dir, kind, force=force, progress=lambda msg: c.print(f"[dim]- {msg}[/dim]"))
        print_variant(c, kind, entry)


@app.command()
def bench(
    model: str = typer.Option("minilm", "--model", "-m", help="Export dir (or a model, exported on first use)."),
    engines: str = typer.Option("torch,ort,ort-int8", "--engines", "-e",
                                help="Comma list: torch, ort, ort-tokens, ort-noopt, ort-opt, ort-int8, ort-fp16, "
                                     "ort-bf16, cuda, cuda-fp16, trt, trt-fp16 (hf-eager and "
                                     "sentence-transformers always run)."),
    corpus: Optional[str] = typer.Option(None, "--corpus", help="Corpus file (.txt, .jsonl, .csv, ...)."),
    synthetic: Optional[int] = typer.Option(None, "--synthetic", help="Use N seeded synthetic texts instead."),
    profile: str = typer.Option("mixed", help="Synthetic length profile: mixed, short, long."),
    seed: int = typer.Option(0, help="Synthetic corpus seed."),
    batch_tokens: Optional[int] = typer.Option(None, help="Token budget per batch for layerscope engines "
                                                          "(default: each engine's own, 2048 on CPU)."),
    max_batch: int = typer.Option(256, help="Most texts per batch for layerscope engines."),
    pooling: str = typer.Option("mean", help="Pooling applied to every layer."),
    layers: str = typer.Option("all-hidden", help="all-hidden (0..L), all (with raw), or e.g. 0,3,-1."),
    sts: Optional[str] = typer.Option(None, "--sts", help="STS Benchmark file: Spearman per layer per engine."),
    threads: Optional[int] = typer.Option(None, help="Threads for every engine (default: each engine's own)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Results dir (default benchmarks/results/<time>)."),
    no_st: bool = typer.Option(False, "--no-sentence-transformers", help="Skip the sentence-transformers baseline."),
    no_plot: bool = typer.Option(False, "--no-plot", help="Skip the PNG bar plot."),
):
    """Every engine over the same texts: texts/s, latency, memory, speed-ups and per-layer accuracy."""
    import shlex
    import time as _time

    from layerscope.bench.report import markdown_table, write_results
    from layerscope.bench.runner import BenchConfig, parse_engines, run_bench
    from layerscope.errors import InputError

    if (corpus is None) == (synthetic is None):
        raise InputError("give exactly one of --corpus FILE or --synthetic N")
    names = parse_engines(engines)
    if synthetic is not None:
        from layerscope.bench.corpus import synthetic_texts

        texts = synthetic_texts(synthetic, seed=seed, profile=profile)
        corpus_name = f"synthetic-{profile} (seed {seed})"
    else:
        from layerscope.runtime.corpus import iter_corpus

        texts = [r.text for r in iter_corpus(corpus)]
        corpus_name = Path(corpus).name
    c = console()
    cfg = BenchConfig(model=model, engines=names, texts=texts, corpus=corpus_name, layers=layers, pooling=pooling,
                      batch_tokens=batch_tokens, max_batch=max_batch, sts=sts, include_st=not no_st,
                      threads=threads, progress=lambda msg: c.print(f"[dim]- {msg}[/dim]"))
    result = run_bench(cfg)
    result["command"] = "inspect " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = out or Path("benchmarks") / "results" / _time.strftime("%Y%m%d-%H%M%S")
    paths = write_results(result, out, plot=not no_plot)
    c.print(markdown_table(result))
    c.print(f"saved {', '.join(str(p) for p in paths.values())}")


# ---------------------------------------------------------------- entry point

def main(argv: list[str] | None = None) -> None:
    from layerscope.errors import LayerscopeError

    try:
        app(args=argv, standalone_mode=False)
    except LayerscopeError as exc:
        if STATE["debug"]:
            raise
        err_console().print(f"[bold red]error:[/bold red] {exc}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console().print("[yellow]interrupted[/yellow]: work written so far is kept; "
                            "re-run with --resume to continue")
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
        err_console().print(f"[bold red]internal error:[/bold red] {type(exc).__name__}: {exc} "
                            "(re-run with --debug for the traceback, and please report it)", soft_wrap=True)
        sys.exit(1)
