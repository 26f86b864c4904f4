"""``extract``, ``verify`` and ``export-store``: make a LayerStore, check it, write it as one file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from layerscope.cli.common import console, data_source, engine_options, err_console, split_list
from layerscope.cli.root import app
from layerscope.engines.registry import names_text
from layerscope.vocab.pooling import POOLINGS


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
    pooling: Optional[str] = typer.Option(None, help=f"Comma list: {', '.join(POOLINGS)} "
                                          "(default: st for a sentence-transformers checkpoint, else the family's)."),
    prompt_name: Optional[str] = typer.Option(None, "--prompt-name", help="One of the checkpoint's prompts "
                                              "(default: its default_prompt_name, if any)."),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Text put before every input (overrides --prompt-name)."),
    store_dtype: str = typer.Option("float32", "--store-dtype", "--dtype",
                                    help="How vectors are stored (pooled and, with --tokens, token vectors): "
                                         "float32, float16 or bfloat16 (half the disk; readers get float32; the "
                                         "loss per layer is recorded and bounded)."),
    tokens: bool = typer.Option(False, "--tokens", help="Also store every token's vector of --layers, with token "
                                "ids, strings, character spans and the special-token mask (a ragged store)."),
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
                                                          "(needs layerscope\\[ray]; --out on shared storage)."),
    ray_workers: Optional[int] = typer.Option(None, "--ray-workers", help="Actors (engine sessions) for --ray "
                                                                          "(default 2)."),
    shard: Optional[str] = typer.Option(None, "--shard", help="i/N: write shard i of N into --out (one process per "
                                        "GPU, machine or Slurm array task; --out on shared storage); 'status': "
                                        "ranges done, being written, missing; 'finish': check and complete."),
):
    """Extract pooled per-layer vectors of a corpus into a LayerStore."""
    from layerscope.errors import InputError
    from layerscope.report.console import print_extract_summary

    from layerscope.progress import mode as progress_mode  # a bar on a terminal, lines in a log, none if quiet

    if shard in ("status", "finish"):
        return _shard_admin(shard, out)
    source = data_source(input, dataset, config, split, "--input")
    if ray is None and ray_workers is not None:
        raise InputError("--ray-workers needs --ray (local, auto or a cluster address)")
    if tokens and (ray is not None or shard is not None):
        raise InputError(f"--tokens is not supported with {'--ray' if ray is not None else '--shard'} yet; "
                         "run without it")
    if ray is not None and shard is not None:
        raise InputError("--shard and --ray are two ways to run one store: choose one")
    from layerscope.extraction.request import ExtractionRequest

    req = ExtractionRequest.of(
        model, source, out, engine=engine, layers=layers, poolings=split_list(pooling), store_dtype=store_dtype,
        batch_tokens=batch_tokens, max_batch=max_batch, max_length=max_length, resume=resume, force=force,
        text_field=text_field, column=column, id_field=id_column, fmt=fmt, progress=progress_mode(),
        engine_options=engine_options(threads=threads, variant=variant, min_cosine=min_cosine),
        prompt_name=prompt_name, prompt=prompt, trust_remote_code=trust_remote_code, tokens=tokens)
    if shard is not None:
        from layerscope.extraction.range_run import parse_shard
        from layerscope.extraction.shard_extract import Shard

        _, index, count = parse_shard(shard)
        rep = Shard(index, count).run(req)
        work = rep.ranges
        done = "the store is complete" if rep.complete else "other shards still run (--shard status)"
        console().print(f"shard {index}/{count}: {work.computed} of {work.ranges} ranges written ({rep.rows:,} rows, "
                        f"{rep.texts_per_s:,.0f} texts/s), {work.done_before} done before, {work.held_elsewhere} "
                        f"held by another process; {done}", soft_wrap=True)
        return
    if ray is not None:
        from layerscope.extraction.ray_extract import RayExecutor

        executor = RayExecutor(address=ray, workers=2 if ray_workers is None else ray_workers)
    else:
        from layerscope.extraction.pipeline import InProcess

        executor = InProcess()
    report = executor.run(req)
    from layerscope.cli.common import STATE

    print_extract_summary(console(), report, verbose=STATE["verbose"])


def _shard_admin(what: str, out: Path) -> None:
    """``--shard status`` and ``--shard finish``."""
    from layerscope.extraction.shard_extract import shard_finish, shard_status

    if what == "finish":
        rec = shard_finish(out)
        console().print(f"{out}: already complete" if rec is None else f"{out}: complete; checksums written")
        return
    st, total, complete = shard_status(out)
    if complete:
        console().print(f"{out}: complete ({total} ranges)")
        return
    def ks(v):
        return ", ".join(map(str, v[:20])) + (" ..." if len(v) > 20 else "")
    console().print(f"{out}: {len(st.done)} of {total} ranges done, {len(st.claimed)} being written, "
                    f"{len(st.stale)} left by a worker that died, {len(st.missing)} not started", soft_wrap=True)
    for name, v in (("being written", st.claimed), ("left by a dead worker", st.stale), ("not started", st.missing)):
        if v:
            console().print(f"  {name}: {ks(v)}", soft_wrap=True)


@app.command()
def verify(path: Path = typer.Argument(..., help="A store (layerscope extract) or an export dir (layerscope export).")):
    """Re-hash every file of a store or an export against its recorded checksums."""
    from rich.markup import escape

    from layerscope.integrity import verify_path

    checked, problems = verify_path(path)
    for line in problems:
        err_console().print(f"[bold red]problem:[/bold red] {escape(line)}", soft_wrap=True)
    if problems:
        sys.exit(2)  # not typer.Exit: with standalone_mode=False its code would be returned, not used
    console().print(f"ok: {checked} files verified")


@app.command("export-store")
def export_store(
    store: Path = typer.Argument(..., help="A LayerStore made by layerscope extract."),
    fmt: str = typer.Option(..., "--format", "-f", help="parquet or safetensors."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output file (default <store>.<format>)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
    tokens: bool = typer.Option(False, "--tokens", help="Write the token-level vectors (a store made with "
                                "extract --tokens): one row per token (default <store>.tokens.<format>)."),
):
    """Write a store as one Parquet or safetensors file (ids, texts, one vector column per layer x pooling)."""
    from rich.markup import escape

    from layerscope.store.store_export import export_store as run_export

    path = run_export(store, fmt, out, force=force, tokens=tokens)
    console().print(f"[bold green]wrote[/bold green] {escape(str(path))}")
