"""Console summaries for the core commands (Rich tables).

Every string that comes from data, a model, a path or a hint goes through ``esc`` (or ``markup=False``):
Rich reads ``[red]`` or ``[citation needed]`` as markup and would drop it.
"""

from __future__ import annotations

import re
from pathlib import Path


def esc(value) -> str:
    """``value`` as text Rich prints exactly (square brackets kept)."""
    from rich.markup import escape

    return escape(str(value))


def print_export_summary(console, out: Path, manifest) -> None:
    """``manifest``: the typed Manifest export_model returns (model/manifest_type.py)."""
    from rich.table import Table

    parity = {name: {k: v for k, v in vars(c).items() if v is not None}  # as recorded: absent figures left out
              for name, c in manifest.parity.outputs.items()}
    worst = max(parity.items(), key=lambda kv: kv[1]["max_abs"])
    console.print(f"[bold green]exported[/bold green] {esc(manifest.source.spec)} -> {esc(out)}  "
                  f"({manifest.family}, {manifest.num_layers} layers, hidden {manifest.hidden_size}, "
                  f"opset {manifest.opset}, {manifest.export_seconds} s)")
    table = Table(title="parity against PyTorch (max |diff| and min cosine over padded batches)")
    table.add_column("output")
    table.add_column("shape")
    table.add_column("max abs diff", justify="right")
    table.add_column("min cosine", justify="right")
    for name, dims in manifest.outputs.items():
        p = parity.get(name, {})
        short = {"batch_size": "batch", "sequence_length": "seq"}
        table.add_row(name, " x ".join(str(short.get(d, d)) for d in dims), f"{p.get('max_abs', float('nan')):.2e}",
                      f"{p.get('min_cos', float('nan')):.7f}")
    console.print(table)
    fp16 = manifest.parity.tolerance_fp16
    if fp16:  # an fp16 export is held to a depth-scaled cosine, not to an absolute difference
        worst = min(parity.items(), key=lambda kv: kv[1]["min_cos"])
        rule = f"min cosine {worst[1]['min_cos']:.7f}, tolerance {fp16['min_cos'].get(worst[0], float('nan')):.6f}"
    else:
        tol = worst[1].get("tolerance", manifest.parity.tolerance_abs)  # scaled by the output (fp32_worst)
        atol, rtol, scale = manifest.parity.tolerance_abs, manifest.parity.tolerance_rel, worst[1].get("ref_max_abs")
        how = (f" = {atol:g} + {rtol:g} x its largest |value| {scale:.3g}"
               if atol is not None and rtol is not None and scale is not None else "")
        rule = f"{worst[1]['max_abs']:.2e} (tolerance {tol:.2g}{how})"
    console.print(f"worst output {worst[0]}: {rule}; in-graph pooling: "
                  f"{', '.join(manifest.pooled_modes) or 'none'}")


def print_engines(console, statuses) -> None:
    from rich.table import Table

    table = Table(title="engines on this machine")
    table.add_column("engine")
    table.add_column("works")
    table.add_column("detail")
    for s in statuses:
        table.add_row(esc(s.name), "[green]yes[/green]" if s.works else "[red]no[/red]", esc(s.detail))
    console.print(table)


def print_families(console, rows, checked: set[str]) -> None:
    """``layerscope families``: one row per model type (``export/onnx_config.family_rows``)."""
    from rich.table import Table

    table = Table(title="supported model types")
    for col in ("model type", "family", "kind", "export", "checked", "notes"):
        table.add_column(col)
    for r in rows:
        table.add_row(esc(r["model_type"]), esc(r["family"]), r["kind"], r["export"],
                      "yes" if r["model_type"] in checked else "refused" if r["family"] == "-" else "derived",
                      esc(r["notes"]))
    console.print(table)
    console.print("checked: exported and held to Hugging Face on every layer by the tests (docs/FAMILIES.md); "
                  "derived: described from transformers the same way, not exported by the tests; refused: "
                  "what a checkpoint of that type is told")


def engine_note(note: str, verbose: bool = False) -> str:
    """An engine note as printed: auto's choice in one line, why it passed over the others only when verbose."""
    if verbose or not note.startswith("auto picked"):
        return note
    head, _, passed = note.partition("; passed over ")
    head, cut, _ = head.partition("; order from ")
    # the bar and "fastest such engine" come back with -v: with a measured speed the line must still fit
    head = re.sub(r" >= [0-9.e-]+, fastest such engine", "", head)
    return head + (")" if cut else "") + ("; others passed over (layerscope -v ... says why)" if passed else "")


def print_extract_summary(console, report, verbose: bool = False) -> None:
    import numpy as np
    from rich.table import Table

    store = report.store
    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {esc(w)}")
    eng = report.engine
    resumed = f", {report.resumed_rows:,} rows kept from the earlier run" if report.resumed_rows else ""
    console.print(f"[bold green]extracted[/bold green] {report.n:,} texts -> {esc(store.path)}  "
                  f"engine {esc(eng['engine'])} ({esc(eng['provider'])}); {report.seconds:.1f} s in all, "
                  f"{report.run_seconds:.1f} s extracting at {report.texts_per_s:,.1f} texts/s, "
                  f"{report.tokens_per_s:,.0f} tokens/s{resumed}")
    for note in eng.get("notes", []):
        console.print(f"[dim]{esc(engine_note(note, verbose))}[/dim]")
    from layerscope.data.corpus import CorpusStats

    console.print(esc(CorpusStats(id_field=store.record.id_field).ids_line()))
    table = Table(title="what the store holds: vector norms, and anisotropy = mean cosine of random pairs")
    table.add_column("pooling")
    table.add_column("layer")
    table.add_column("shape")
    table.add_column("mean norm", justify="right")
    table.add_column("anisotropy", justify="right")
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(store.n, size=min(store.n, 2000), replace=False))
    for pooling in store.poolings:
        for layer in store.layers:
            arr = np.asarray(store[pooling, layer][sample], dtype=np.float64)
            norms = np.linalg.norm(arr, axis=1)
            if len(arr) > 1:
                unit = arr / np.maximum(norms, 1e-12)[:, None]
                i = rng.integers(0, len(arr), size=4000)
                j = (i + rng.integers(1, len(arr), size=4000)) % len(arr)  # never i itself
                aniso = f"{float((unit[i] * unit[j]).sum(1).mean()):.4f}"
            else:
                aniso = "-"
            table.add_row(pooling, layer, f"{store.n}x{store.hidden_size}", f"{norms.mean():.3f}", aniso)
    console.print(table)
    console.print(f"open it with: from layerscope import LayerStore; "
                  f"LayerStore.open('{store.path}')['{store.poolings[0]}', -1]", markup=False)


def print_variant(console, kind: str, entry: dict) -> None:
    """One variant's file, fusions and per-output parity against PyTorch fp32."""
    from rich.table import Table

    tol = entry["tolerance"]
    console.print(f"variant [bold]{esc(kind)}[/bold] -> {esc(entry['file'])} ({entry['bytes'] / 2**20:.1f} MiB, "
                  f"{entry['precision']}, built in {entry['build_seconds']:.1f} s)")
    if entry.get("fusions") is not None:
        fused = ", ".join(f"{k} x{v}" for k, v in entry["fusions"].items()) or "none"
        console.print(f"fusions applied: {fused}")
    bars = [f"max abs {tol['max_abs']:g}" if tol.get("max_abs") is not None else "",
            f"min cosine {tol['min_cos']:g}" if tol.get("min_cos") is not None else ""]
    table = Table(title=f"parity against PyTorch fp32 (held to {', '.join(b for b in bars if b) or 'no bar'})")
    table.add_column("output")
    table.add_column("max abs diff", justify="right")
    table.add_column("min cosine", justify="right")
    for name, s in entry["parity"]["outputs"].items():
        table.add_row(name, f"{s['max_abs']:.2e}", f"{s['min_cos']:.6f}" if s.get("min_cos") is not None else "-")
    console.print(table)


def _natural_width(console, renderable) -> int:
    """The width ``renderable`` takes when nothing in it is wrapped or cut."""
    from rich.measure import Measurement

    return Measurement.get(console, console.options.update(max_width=10_000), renderable).maximum


def print_cache(console, root: Path, entries, skipped) -> None:
    """A table where it fits the terminal; else one short block per entry, its model and entry name each on
    a line of their own (never cut, never folded into a narrow column)."""
    from rich.table import Table

    from layerscope.cachedir import human_size

    table = Table(title=f"layerscope cache: {esc(root)}")
    for col, just in (("kind", "left"), ("model", "left"), ("size", "right"), ("age (days)", "right"),
                      ("made by layerscope", "left"), ("entry", "left")):
        table.add_column(col, justify=just, no_wrap=col in ("model", "entry"))
    for e in entries:
        table.add_row(e.kind, esc(e.model), human_size(e.size), f"{e.age_days:.1f}", esc(e.made_by or "?"),
                      esc(e.path.name))
    if _natural_width(console, table) <= console.width:
        console.print(table)
    else:
        console.print(f"layerscope cache: {esc(root)}", soft_wrap=True)
        for e in entries:
            console.print(f"\n[bold]{e.kind}[/bold]  {human_size(e.size)}  {e.age_days:.1f} days old  "
                          f"made by layerscope {esc(e.made_by or '?')}", soft_wrap=True)
            console.print(f"  model: {esc(e.model)}", soft_wrap=True)
            console.print(f"  entry: {esc(e.path.name)}", soft_wrap=True)
        if entries:
            console.print()
    console.print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, "
                  f"{human_size(sum(e.size for e in entries))}; clear with: layerscope cache clear "
                  "\\[--exports|--stores] \\[--older-than DAYS]")
    for s in skipped:
        console.print(f"[yellow]not layerscope's[/yellow] {esc(s.path)}: {esc(s.reason)}", soft_wrap=True)
