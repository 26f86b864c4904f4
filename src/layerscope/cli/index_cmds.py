"""``index build`` and ``search``: FAISS indexes over a store, and queries against them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from layerscope.cli.common import console
from layerscope.cli.root import app, index_app
from layerscope.engines.registry import names_text


@index_app.command("build")
def index_build(
    store: Path = typer.Option(..., "--store", "-s", help="A LayerStore made by layerscope extract."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Index directory (default <store>/index-<kind>-<pooling>-<layer>)."),
    layer: str = typer.Option("-1", "--layer", help="Layer: raw, 0..L or a negative index."),
    pooling: Optional[str] = typer.Option(None, "--pooling", help="Pooling held in the store (default: the "
                                          "store's first, st for a sentence-transformers model's default store)."),
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
    from rich.markup import escape

    from layerscope.index.store_index import build_store_index

    if pooling is None and out is None:  # the default folder is named after the pooling
        from layerscope.store.store import LayerStore

        pooling = LayerStore.open(store).poolings[0]
    out = out or Path(store) / f"index-{kind}-{pooling}-{layer.replace('-', 'm')}"
    rec = build_store_index(store, out, layer=layer, pooling=pooling, kind=kind, nlist=nlist, nprobe=nprobe,
                            hnsw_m=hnsw_m, ef_search=ef_search, seed=seed, device=device, force=force)
    c = console()
    c.print(f"[bold green]index[/bold green] {escape(str(out))}: {rec.kind} over {rec.n:,} vectors of dim {rec.dim} "
            f"(layer {escape(str(rec.layer))}, {escape(str(rec.pooling))} pooling) in "
            f"{rec.seconds.build if rec.seconds else 0.0:.2f} s; {escape(str(rec.backend_detail))}")
    if rec.params:
        c.print(f"parameters: {escape(str(dict(rec.params)))}")
    recall = rec.recall_vs_exact
    if recall:
        c.print(f"recall@{recall.k} against exact search on {recall.queries:,} stored vectors: "
                f"{recall.recall_at_k:.4f}")


@index_app.command("search", hidden=True, add_help_option=False,
                   context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def index_search(ctx: typer.Context):
    """Searching is its own command: ``layerscope search``; said in one line with the arguments given."""
    import shlex

    from layerscope.errors import InputError

    given = " ".join(shlex.quote(a) for a in ctx.args) or '--index INDEX_DIR "a query"'
    raise InputError(f"search is its own command, not part of index: layerscope search {given}")


@app.command()
def search(
    query: list[str] = typer.Argument(..., help="Query text(s)."),
    index: Path = typer.Option(..., "--index", "-i", help="Index directory made by layerscope index build."),
    k: int = typer.Option(10, "-k", "--top", help="How many results per query."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Embed with this model (must be the index's)."),
    engine: str = typer.Option("auto", "--engine", "-e", help=f"{names_text()}."),
    device: str = typer.Option("auto", "--device", help="Where FAISS runs: auto, cpu or gpu."),
):
    """Embed query texts with the index's model, layer and pooling; print the top-k stored texts."""
    from rich.markup import escape
    from rich.table import Table

    from layerscope.index.store_index import search_index

    rec, results = search_index(index, list(query), k=k, model=model, engine=engine, device=device)
    c = console()
    for q, hits in zip(query, results):
        t = Table(title=f"{escape(repr(q))} - top {len(hits)} of {rec.n:,} ({rec.kind}, layer "
                        f"{escape(str(rec.layer))}, {escape(str(rec.pooling))})")
        t.add_column("#", justify="right")
        t.add_column("score", justify="right")
        t.add_column("id")
        t.add_column("text")
        for h in hits:
            t.add_row(str(h.rank), f"{h.score:.4f}", escape(str(h.id)), escape(h.text))
        c.print(t)
    c.print(f"[dim]{escape(str(rec.backend_used))}[/dim]")
