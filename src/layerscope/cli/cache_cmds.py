"""``cache list`` and ``cache clear``: what layerscope keeps in its cache directory."""

from __future__ import annotations

from typing import Optional

import typer

from layerscope.cli.common import console
from layerscope.cli.root import cache_app


@cache_app.command("list")
def cache_list():
    """Exports and vector stores in the cache: kind, model, size, age, the layerscope version that made it."""
    from layerscope.cachedir import scan
    from layerscope.model.home import cache_root
    from layerscope.report.console import print_cache

    print_cache(console(), cache_root(), *scan())


@cache_app.command("clear")
def cache_clear(
    exports: bool = typer.Option(False, "--exports", help="Only the ONNX exports."),
    stores: bool = typer.Option(False, "--stores", help="Only the cached vector stores."),
    older_than: Optional[float] = typer.Option(None, "--older-than", help="Only entries older than DAYS."),
):
    """Delete what layerscope made in its cache (never anything else, never through a symlink)."""
    from rich.markup import escape

    from layerscope.cachedir import MARKERS, clear, human_size

    kinds = tuple(k for k, on in (("exports", exports), ("stores", stores)) if on) or tuple(MARKERS)
    removed, skipped = clear(kinds, older_than)
    c = console()
    c.print(f"removed {len(removed)} cache entr{'y' if len(removed) == 1 else 'ies'} "
            f"({human_size(sum(e.size for e in removed))})")
    for s in skipped:
        c.print(f"[yellow]left alone[/yellow] {escape(str(s.path))}: {escape(s.reason)}", soft_wrap=True)
