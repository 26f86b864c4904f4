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
    from rich.console import Console

    return Console(stderr=False, highlight=False)


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
                            trust_remote_code=trust_remote_code, force=force,
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
    batch_tokens: int = typer.Option(16384, help="Token budget per batch (padded tokens)."),
    max_batch: int = typer.Option(256, help="Most texts per batch."),
    max_length: Optional[int] = typer.Option(None, help="Truncate texts to this many tokens."),
    text_field: Optional[str] = typer.Option(None, "--text-field", help="JSONL field with the text."),
    column: Optional[str] = typer.Option(None, "--column", help="CSV/TSV/Parquet column with the text."),
    id_column: Optional[str] = typer.Option(None, "--id-column", "--id-field", help="Field or column with row ids."),
    fmt: Optional[str] = typer.Option(None, "--format", help="Override the format detected from the name."),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted extraction."),
    force: bool = typer.Option(False, "--force", help="Replace an existing store."),
    threads: Optional[int] = typer.Option(None, help="Engine threads (default: all cores)."),
):
    """Extract pooled per-layer vectors of a corpus into a LayerStore."""
    from layerscope.report.console import print_extract_summary
    from layerscope.runtime.pipeline import extract as run_extract

    c = console()
    report = run_extract(model, input, out, engine=engine, layers=layers, poolings=split_list(pooling),
                         dtype=dtype, batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length,
                         resume=resume, force=force, text_field=text_field, column=column,
                         id_field=id_column, fmt=fmt, progress=True,
                         engine_options={"threads": threads} if threads else None)
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
                      console=c)
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
def analyses():
    """List the analyses and their options."""
    from rich.table import Table

    from layerscope.analyses.base import registry

    table = Table(title="analyses (inspect run NAME ...)")
    table.add_column("name")
    table.add_column("what it does")
    table.add_column("options")
    for name, cls in sorted(registry().items()):
        meta = cls.metadata
        opts = "\n".join(f"{o.flag} ({o.type.__name__}, default {o.default}): {o.help}" for o in meta.options)
        table.add_row(name, meta.description, opts or "-")
    console().print(table)


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
    except Exception as exc:  # click usage errors and the unexpected
        import click

        if isinstance(exc, click.exceptions.Exit):
            sys.exit(exc.exit_code)
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        if STATE["debug"]:
            raise
        err_console().print(f"[bold red]internal error:[/bold red] {type(exc).__name__}: {exc} "
                            "(re-run with --debug for the traceback, and please report it)", soft_wrap=True)
        sys.exit(1)
