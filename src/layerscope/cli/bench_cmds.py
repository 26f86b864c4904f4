"""``optimize`` and ``bench``: variants of an export, and every engine and peer over the same texts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from layerscope.cli.common import console, progress_printer, split_list
from layerscope.cli.root import app
from layerscope.engines.registry import bench_rows


@app.command()
def optimize(
    export_dir: Path = typer.Argument(..., help="An export dir made by layerscope export."),
    variant: str = typer.Option(..., "--variant", help="Comma list: opt, gqa (Qwen decoders), int8, int8-block, fp16 (bf16 is refused on CPU); "
                                                       "ov-fp32, ov-bf16, ov-int8 (OpenVINO precisions); attn (attention "
                                                       "probabilities and summaries per layer and head)."),
    force: bool = typer.Option(False, "--force", help="Re-make a variant that already exists."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow the model's own code to run as the torch reference of the "
                                                "variants' check (needed for an export of such a model)."),
):
    """Make optimized / reduced-precision variants of an export, each checked against PyTorch fp32."""
    from layerscope.export.variants import make_variant
    from layerscope.model.variants import check_kind
    from layerscope.report.console import print_variant

    kinds = [check_kind(k) for k in split_list(variant) or []]
    c = console()
    for kind in kinds:
        print_variant(c, kind, make_variant(export_dir, kind, force=force, progress=progress_printer(c),
                                            trust_remote_code=trust_remote_code))


@app.command()
def bench(
    model: str = typer.Option("minilm", "--model", "-m", help="Export dir (or a model, exported on first use)."),
    engines: str = typer.Option("default", "--engines", "-e",
                                help=f"Comma list: {', '.join(bench_rows())} (hf-eager always runs); default: "
                                     "ort, ort-int8, ov and ov-x2 (two batches in flight), and ov-bf16, "
                                     "ov-bf16-x2 where this CPU computes in bf16."),
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
    reference_texts: Optional[int] = typer.Option(None, "--reference-texts",
                                                  help="Run hf-eager (the CPU fp32 reference) over the first N "
                                                       "texts only, and measure accuracy on them: for a GPU bench "
                                                       "of more texts than the CPU loop gets through in minutes."),
    rows_dir: Optional[Path] = typer.Option(None, "--rows-dir", help="Write each row's result to this folder as "
                                                                      "it finishes: a bench cut short keeps the "
                                                                      "rows it ran."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Results dir (default benchmarks/results/<time>)."),
    in_process: bool = typer.Option(False, "--in-process", help="The older one-process bench (engines share "
                                                                "thread pools; kept for comparison)."),
    no_plot: bool = typer.Option(False, "--no-plot", help="Skip the PNG bar plot."),
    depths: Optional[str] = typer.Option(None, "--depths", help="Sweep the deepest layer, e.g. 0,1,3,all: the "
                                                                "engine rows at layers 0..d for each d (early "
                                                                "exit), time per text against depth; no peers."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code",
                                           help="Allow the model's own code to run in every row that loads the "
                                                "model (hf-eager, torch, sentence-transformers; needed for an "
                                                "export of such a model)."),
):
    """Every engine and peer over the same texts, each in its own process: speed, accuracy, peak, time split."""
    import shlex
    import time as _time

    from layerscope.bench.report import markdown_table, write_results
    from layerscope.bench.runner import parse_engines
    from layerscope.bench.texts import bench_texts
    from layerscope.limits import check_limits
    from layerscope.ownership import check_output_path

    check_limits(batch_tokens=batch_tokens, max_batch=max_batch, threads=threads)
    for folder, option in ((out, "--out"), (rows_dir, "--rows-dir")):
        if folder is not None:
            check_output_path(folder, option)
    names = parse_engines(engines)
    texts, corpus_name = bench_texts(corpus=corpus, synthetic=synthetic, sts_texts=sts_texts, sts=sts, seed=seed,
                                     profile=profile)
    c = console()
    shared = dict(model=model, engines=names, texts=texts, corpus=corpus_name, layers=layers, pooling=pooling,
                  batch_tokens=batch_tokens, max_batch=max_batch, sts=sts, threads=threads,
                  trust_remote_code=trust_remote_code, progress=progress_printer(c))
    if depths is not None:
        from layerscope.bench.isolated import IsolatedConfig
        from layerscope.bench.sweep import run_sweep, write_sweep

        sweep = run_sweep(IsolatedConfig(rounds=rounds, passes=passes, **shared), depths)
        sweep["command"] = "layerscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        paths = write_sweep(sweep, out or Path("benchmarks") / "results" / _time.strftime("%Y%m%d-%H%M%S-depths"))
        c.print(paths["markdown"].read_text(encoding="utf-8"), soft_wrap=True, markup=False)
        c.print(f"saved {', '.join(str(p) for p in paths.values())}", markup=False)
        return
    if in_process:
        from layerscope.bench.config import BenchConfig
        from layerscope.bench.runner import run_bench

        result = run_bench(BenchConfig(include_st=peers != "none", **shared))
    else:
        from layerscope.bench.isolated import IsolatedConfig, parse_peers, run_isolated

        result = run_isolated(IsolatedConfig(peers=parse_peers(peers), rounds=rounds, passes=passes,
                                             reference_texts=reference_texts, rows_dir=rows_dir, **shared))
    result["command"] = "layerscope " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = out or Path("benchmarks") / "results" / _time.strftime("%Y%m%d-%H%M%S")
    paths = write_results(result, out, plot=not no_plot)
    from layerscope.engines.speed_order import record

    if record(result, paths["json"]):
        c.print("[dim]- engine speeds recorded for this CPU: --engine auto now ranks by them[/dim]")
    c.print(paths["markdown"].read_text(encoding="utf-8") if not in_process else markdown_table(result),
            soft_wrap=True, markup=False)
    c.print(f"saved {', '.join(str(p) for p in paths.values())}", markup=False)
